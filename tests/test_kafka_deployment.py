"""keyload over a real Kafka broker: ownership changes, broker restarts, producer retries, drills, truncation."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from keyload import Client
from keyload.credentials import Credential, contents
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.log.kafka_log import KafkaLog, ensure_topics
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.storage.datadir import DataDir, KafkaConfig
from keyload.storage.keyring import FILE as KEYRING_FILE

from .support import (
    ENQUEUE,
    assert_live_equals_replay,
    enqueue_body,
    keyload_command,
    run_keyload,
    signed_command,
    spread_domains,
    stop_service,
    wait_until,
)

pytestmark = pytest.mark.slow

PARTITIONS = 4
QUEUE = "work"
SESSION_TIMEOUT_MS = "6000"
CHECKPOINT_EVERY = "50"
SUBMIT_TIMEOUT_S = 120.0  # long enough to ride out a partition move or a broker restart without a resubmit


class Service:
    """A `keyload run` process whose output is collected line by line."""

    def __init__(self, data: Path, *args: str) -> None:
        self.data = data
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            keyload_command("run", "--data", str(data), *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_until(lambda: any(line.startswith("keyload: serving") for line in self.lines), 60, "the service")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self.lines.append(raw.decode().rstrip())

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for line in list(self.lines):
            if line.startswith("keyload: owns p"):
                owned.add(int(line.split()[2][1:]))
            elif line.startswith("keyload: released p"):
                owned.discard(int(line.split()[2][1:]))
        return owned

    def output(self) -> str:
        return "\n".join(self.lines)


def kafka_data(root: Path, bootstrap: str, prefix: str, objects: Path, keyring_from: Path | None = None) -> DataDir:
    return DataDir.create(
        root, PARTITIONS, kafka=KafkaConfig(bootstrap, prefix), object_store=objects, keyring_from=keyring_from
    )


def command_records(data: DataDir) -> list[dict[str, object]]:
    """Every command in the command topic, decoded (ticks included), signed or not."""
    log = KafkaLog.commands(data.kafka_settings())
    found = []
    try:
        for partition in range(PARTITIONS):
            offset, end = log.start_offset(partition), log.end_offset(partition)
            while offset < end:
                for record in log.read(partition, offset, 500):
                    found.append(REGISTRY.decode("keyload.Command", contents(record.value)))
                    offset = record.offset + 1
    finally:
        log.close()
    return found


def outcome_end(data: DataDir, partition: int) -> int:
    outcomes = KafkaLog.outcomes(data.kafka_settings())
    try:
        return outcomes.end_offset(partition)
    finally:
        outcomes.close()


def retried_outcomes(data: DataDir, partition: int, since: int, credential: Credential) -> list[bytes]:
    """The outcome records for command id "retried" in a reply partition from `since`, each sealed for `credential`."""
    outcomes = KafkaLog.outcomes(data.kafka_settings())
    found = []
    try:
        offset, end = since, outcomes.end_offset(partition)
        while offset < end:
            for record in outcomes.read(partition, offset, 500):
                offset = record.offset + 1
                if REGISTRY.decode("keyload.Outcome", contents(record.value))["command_id"] == "retried":
                    assert credential.seals(record.value)
                    found.append(record.value)
    finally:
        outcomes.close()
    return found


class Workload:
    """Enqueues from a thread until stopped; every submit must end in a committed outcome."""

    def __init__(self, root: Path, domains: list[str]) -> None:
        self.root = root
        self.domains = domains
        self.submitted: list[str] = []
        self.committed: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Workload:
        self._thread.start()
        return self

    def _run(self) -> None:
        with Client(self.root, timeout_s=SUBMIT_TIMEOUT_S) as client:
            n = 0
            while not self._stop.is_set():
                command_id = f"enqueue-{n}"
                domain = self.domain_of(command_id)
                self.submitted.append(command_id)
                try:
                    client.enqueue(domain, QUEUE, b"payload", message_id=f"m-{n}", command_id=command_id)
                    self.committed.append(command_id)
                except Exception as exc:
                    self.failures.append(f"{command_id}: {type(exc).__name__}: {exc}")
                    return
                n += 1

    def domain_of(self, command_id: str) -> str:
        return self.domains[int(command_id.split("-")[1]) % len(self.domains)]

    def wait_for(self, count: int, timeout_s: float = 120.0) -> None:
        wait_until(lambda: len(self.committed) >= count or bool(self.failures), timeout_s, f"{count} outcomes")
        assert self.failures == []

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(SUBMIT_TIMEOUT_S + 10)
        assert not self._thread.is_alive()


@pytest.fixture
def prefix() -> str:
    return f"kl-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def domains() -> list[str]:
    return spread_domains(PARTITIONS, PARTITIONS)


def create_queues(root: Path, domains: list[str]) -> None:
    with Client(root, timeout_s=60) as client:
        for domain in domains:
            client.create_queue(domain, QUEUE)


def test_ownership_moves_to_the_survivor_of_a_kill_9(
    kafka_bootstrap: str, prefix: str, domains: list[str], tmp_path: Path
) -> None:
    objects = tmp_path / "objects"
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    first_data = kafka_data(first_root, kafka_bootstrap, prefix, objects)
    kafka_data(second_root, kafka_bootstrap, prefix, objects, keyring_from=first_root / KEYRING_FILE)
    args = ["--session-timeout-ms", SESSION_TIMEOUT_MS, "--checkpoint-every", CHECKPOINT_EVERY]
    first = Service(first_root, *args)
    second: Service | None = None
    try:
        wait_until(lambda: first.owned() == set(range(PARTITIONS)), 60, "the first processor to own everything")
        create_queues(first_root, domains)
        with Workload(first_root, domains) as workload:
            workload.wait_for(100)
            second = Service(second_root, *args)
            wait_until(lambda: len(second.owned()) == PARTITIONS // 2, 60, "a cooperative rebalance")
            assert first.owned() == set(range(PARTITIONS)) - second.owned()
            moved = first.owned()
            checkpoints = first_data.checkpoints()
            wait_until(
                lambda: all(checkpoints.latest(p) is not None for p in moved),
                60,
                "checkpoints of the first's partitions",
            )
            workload.wait_for(len(workload.committed) + 100)
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            wait_until(lambda: second.owned() == set(range(PARTITIONS)), 60, "the survivor to own everything")
            workload.wait_for(len(workload.committed) + 200)
        assert workload.failures == []
        assert workload.committed == workload.submitted
        for partition in moved:
            assert f"keyload: p{partition}: restored the checkpoint at offset" in second.output()
        assert stop_service(second.process, 30) == 0
    finally:
        for service in (first, second):
            if service is not None and service.process.poll() is None:
                service.process.kill()
                service.process.wait()

    # No outcome was lost: each enqueue is stored once as committed on its partition.
    second_data = DataDir.open(second_root)
    stores = [Store(second_data.projection(p), read_only=True) for p in range(PARTITIONS)]
    try:
        for command_id in workload.committed:
            domain = workload.domain_of(command_id)
            store = stores[partition_for(domain, PARTITIONS)]
            assert store.get(keys.outcome(domain, command_id)) is not None, command_id
    finally:
        for store in stores:
            store.close()
    assert_live_equals_replay(second_data, tmp_path)


def test_broker_restart_mid_workload_loses_and_duplicates_nothing(
    native_broker: object, prefix: str, domains: list[str], tmp_path: Path
) -> None:
    from devtools.broker import NativeBroker

    assert isinstance(native_broker, NativeBroker)
    root = tmp_path / "data"
    data = kafka_data(root, native_broker.bootstrap, prefix, tmp_path / "objects")
    service = Service(root, "--checkpoint-every", CHECKPOINT_EVERY)
    try:
        wait_until(lambda: service.owned() == set(range(PARTITIONS)), 60, "ownership")
        create_queues(root, domains)
        with Workload(root, domains) as workload:
            workload.wait_for(150)
            native_broker.stop()
            time.sleep(2)
            native_broker.start()
            workload.wait_for(len(workload.committed) + 150)
        assert workload.failures == []
        assert workload.committed == workload.submitted
        with Client(root) as client:
            stored = sum(client.inspect_queue(domain, QUEUE).counters.stored_messages for domain in domains)
        assert stop_service(service.process, 30) == 0
    finally:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()

    # Exactly one record per enqueue in the command topic (the idempotent producer dropped its retries) ...
    enqueues = [c["command_id"] for c in command_records(data) if str(c["command_id"]).startswith("enqueue-")]
    assert sorted(enqueues) == sorted(workload.submitted)
    # ... each applied once: the queues hold exactly the committed messages.
    assert stored == len(workload.committed)
    assert_live_equals_replay(data, tmp_path)


def test_a_retry_after_a_lost_acknowledgement_has_one_effect(
    kafka_bootstrap: str, prefix: str, domains: list[str], tmp_path: Path
) -> None:
    root = tmp_path / "data"
    data = kafka_data(root, kafka_bootstrap, prefix, tmp_path / "objects")
    service = Service(root)
    try:
        create_queues(root, domains)
        domain = domains[0]
        with Client(root) as client:
            first = client.enqueue(domain, QUEUE, b"body", message_id="once", command_id="retried")
            # The producer's acknowledgement was lost: the same command is appended again, twice.
            log = KafkaLog.commands(data.kafka_settings())
            try:
                body = enqueue_body(QUEUE, "once", b"body")
                reply_to = client.reply_partition
                value = signed_command(client.credential, domain, ENQUEUE, body, "retried", reply_to)
                cursor = outcome_end(data, reply_to)
                log.append(partition_for(domain, PARTITIONS), [value, value])
            finally:
                log.close()
            again = client.enqueue(domain, QUEUE, b"body", message_id="once", command_id="retried")
            assert again == first
            # Each duplicate was answered as the retry it is: the first outcome again, sealed for the client.
            answers = retried_outcomes(data, reply_to, cursor, client.credential)
            assert len(answers) == 3 and len(set(answers)) == 1, answers
            counters = client.inspect_queue(domain, QUEUE).counters
            assert (counters.stored_messages, counters.enqueued_total) == (1, 1)
        assert stop_service(service.process, 30) == 0
    finally:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()
    assert_live_equals_replay(data, tmp_path)


def test_drill_from_a_checkpoint_and_truncation_stops_at_the_recovery_floor(
    kafka_bootstrap: str, prefix: str, domains: list[str], tmp_path: Path
) -> None:
    root = tmp_path / "data"
    kafka_data(root, kafka_bootstrap, prefix, tmp_path / "objects")
    domain = domains[0]
    partition = str(partition_for(domain, PARTITIONS))
    service = Service(root)
    try:
        create_queues(root, domains)
        with Client(root) as client:
            for n in range(20):
                client.enqueue(domain, QUEUE, b"x", message_id=f"before-{n}")
        checkpoint = run_keyload("checkpoint", "--data", str(root), "--domain", domain)
        assert checkpoint.returncode == 0, checkpoint.stderr
        offset = int(checkpoint.stdout.split("at offset ")[1].split(":")[0])
        with Client(root) as client:
            for n in range(20):
                client.enqueue(domain, QUEUE, b"x", message_id=f"after-{n}")

        drill = run_keyload(
            "drill", "--data", str(root), "--domain", domain, "--from-checkpoint", str(offset), "--quiet"
        )
        assert drill.returncode == 0, drill.stdout + drill.stderr
        assert "PASS" in drill.stdout

        refused = run_keyload(
            "log", "truncate", "--data", str(root), "--partition", partition, "--before", str(offset + 2)
        )
        assert refused.returncode == 1
        assert "would pass its recovery floor" in refused.stderr
        assert f"at offset {offset}" in refused.stderr
        allowed = run_keyload(
            "log", "truncate", "--data", str(root), "--partition", partition, "--before", str(offset + 1)
        )
        assert allowed.returncode == 0, allowed.stderr
        assert f"log now starts at offset {offset + 1}" in allowed.stdout

        from_zero = run_keyload("drill", "--data", str(root), "--domain", domain, "--quiet")
        assert from_zero.returncode == 1
        assert "truncated" in from_zero.stderr
        again = run_keyload("drill", "--data", str(root), "--domain", domain, "--from-checkpoint", "latest", "--quiet")
        assert again.returncode == 0 and "PASS" in again.stdout, again.stdout + again.stderr
        assert stop_service(service.process, 30) == 0
    finally:
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait()


def test_a_new_processor_without_the_deployments_keyring_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Its own new keyring would split the group quietly (each processor refusing the other's keys),
    so `keyload run` refuses to create it once the topics hold commands, and creates nothing."""
    prefix = f"keyring-{uuid.uuid4().hex[:10]}"
    first = DataDir.create(tmp_path / "first", PARTITIONS, kafka=KafkaConfig(kafka_bootstrap, prefix))
    ensure_topics(first.kafka_settings())
    with KafkaLog.commands(first.kafka_settings()) as log:
        log.append(0, [b"a record of the running deployment"])
    second = tmp_path / "second"
    joining = ("--data", str(second), "--kafka", kafka_bootstrap, "--topic-prefix", prefix, "--listen", "none")
    refused = run_keyload("run", *joining)
    assert refused.returncode == 2
    assert f"the topics {prefix}.* already hold a deployment's commands" in refused.stderr
    assert "--keyring-from" in refused.stderr and not second.exists()
    joined = Service(second, *joining[2:], "--keyring-from", str(first.root / KEYRING_FILE))
    assert stop_service(joined.process, 30) == 0
    assert (second / KEYRING_FILE).read_bytes() == (first.root / KEYRING_FILE).read_bytes()
