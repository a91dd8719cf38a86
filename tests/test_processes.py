"""`keyload run` as real processes: concurrent producers (file log and Kafka), and SIGKILL mid-workload."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from keyload.credentials import ADMIN_PRINCIPAL, Credential, contents
from keyload.log.base import CommandLog, partition_for
from keyload.log.codec import REGISTRY
from keyload.log.file_log import FileLog
from keyload.processors.apply import FINGERPRINT_BYTES, fingerprint
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.sdk.client import Client
from keyload.storage.datadir import DataDir, KafkaConfig
from keyload.storage.principals import system_credential

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    assert_live_equals_replay,
    command,
    create_principals,
    create_queue_body,
    enqueue_body,
    keyload_command,
    signed_command,
    spread_domains,
    start_service,
    stop_service,
    wait_until,
)

PARTITIONS = 2
CATCH_UP_TIMEOUT_S = 60.0

# Test 1: concurrent producers through the SDK.
PRODUCERS = 2
MESSAGES_PER_DOMAIN = 300
PRODUCER_TIMEOUT_S = 120.0
STOP_BACKLOG = 40_000  # records left in the log for a stop: seconds of applying on this machine
STOP_DOMAIN = "backlog"
QUEUE = "orders"
PRODUCER_SCRIPT = """\
import json
import sys

from keyload.sdk.client import Client

data, reply_partition, name, count, queue, *domains = sys.argv[1:]
with Client(data, principal=name, reply_partition=int(reply_partition)) as client:
    for i in range(int(count)):
        for domain in domains:
            command_id = f"{name}-{domain}-{i}"
            body = {
                "queue": queue,
                "message_id": command_id,
                "body": b"x",
                "headers": {},
                "ordering_key": None,
                "not_before_ms": None,
                "expires_at_ms": None,
            }
            outcome = client.submit(domain, "keyload.command.Enqueue", body, command_id)
            fields = ("command_id", "status", "partition", "offset")
            print(json.dumps({name: getattr(outcome, name) for name in fields}), flush=True)
"""

# Test 2: a workload appended while `keyload run` is SIGKILLed again and again.
WORKLOAD_COMMANDS = 10_000
DOMAINS = 3
KILLS = 40
CHUNK_RECORDS = (20, 100)
RUN_WINDOW_S = (0.02, 0.4)
SMALL_QUOTA = 400  # max_stored_messages of the first domain's queue
RETRY_SHARE = 0.05  # same command id, same command
CONFLICT_SHARE = 0.02  # same command id, different body
REUSED_MESSAGE_SHARE = 0.02  # new command id, a message id used before


@contextmanager
def running(root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`keyload run` over `root`, serving; SIGKILLed on the way out unless it has already exited."""
    process = start_service(root)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def published_outcomes(data: DataDir) -> list[tuple[int, bytes]]:
    """Every record of every outcome partition, as (reply partition, record): an encoded Outcome, or one
    sealed for the authenticated principal whose command it answers (`decode_outcome` reads either)."""
    log = data.outcome_log()
    found = []
    try:
        for partition in range(data.outcome_partitions):
            offset, end = log.start_offset(partition), log.end_offset(partition)
            while offset < end:
                for record in log.read(partition, offset, 10_000):
                    found.append((partition, record.value))
                    offset = record.offset + 1
        return found
    finally:
        log.close()


def stored_outcomes(data: DataDir) -> list[tuple[int, str, str, bytes]]:
    """Every key of the OUTCOME family of every partition, as (partition, domain, command id, fingerprint +
    Outcome)."""
    stored = []
    for partition in range(data.partitions):
        store = Store(data.projection(partition), read_only=True)
        try:
            for key, value in store.scan(keys.OUTCOME, keys.prefix_end(keys.OUTCOME)):
                domain_length = key[len(keys.OUTCOME)]
                domain = key[len(keys.OUTCOME) + 1 : len(keys.OUTCOME) + 1 + domain_length].decode()
                stored.append((partition, domain, key[len(keys.OUTCOME) + 1 + domain_length :].decode(), value))
        finally:
            store.close()
    return stored


def decode_outcome(value: bytes) -> dict[str, Any]:
    return REGISTRY.decode("keyload.Outcome", contents(value))


def lag(data: DataDir, log: CommandLog) -> list[int]:
    """Per partition: log records not yet applied by the live projection."""
    lags = []
    for partition in range(data.partitions):
        store = Store(data.projection(partition), read_only=True)
        try:
            lags.append(log.end_offset(partition) - 1 - store.applied_offset)
        finally:
            store.close()
    return lags


def queue_record(store: Store, domain: str, queue: str) -> dict[str, Any]:
    raw = store.get(keys.queue(domain, queue))
    assert raw is not None, f"queue {queue!r} does not exist"
    return REGISTRY.decode("keyload.QueueRecord", raw)


def message_ids(store: Store, queue_id: int) -> set[str]:
    prefix = keys.MESSAGE + keys.u64(queue_id)
    return {key[len(prefix) :].decode() for key, _ in store.scan(prefix, keys.prefix_end(prefix))}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "kafka"])
def test_several_processes_every_command_gets_one_outcome(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    kafka = None
    if backend == "kafka":
        kafka = KafkaConfig(request.getfixturevalue("kafka_bootstrap"), f"procs-{uuid.uuid4().hex[:10]}")
    data = DataDir.create(root, PARTITIONS, kafka=kafka)
    domains = spread_domains(PARTITIONS, PARTITIONS)
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER_SCRIPT)
    expected: dict[str, str] = {
        f"producer{k}-{domain}-{i}": domain
        for k in range(PRODUCERS)
        for domain in domains
        for i in range(MESSAGES_PER_DOMAIN)
    }

    with running(root) as service:
        create_principals(root, *(f"producer{k}" for k in range(PRODUCERS)))
        with Client(root) as client:
            for domain in domains:
                client.create_queue(domain, QUEUE)
        arguments = [str(MESSAGES_PER_DOMAIN), QUEUE, *domains]
        producers = [
            subprocess.Popen(
                [sys.executable, str(script), str(root), str(k), f"producer{k}", *arguments],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for k in range(PRODUCERS)
        ]
        try:
            outputs = [producer.communicate(timeout=PRODUCER_TIMEOUT_S) for producer in producers]
        finally:
            for producer in producers:
                if producer.poll() is None:
                    producer.kill()
                    producer.wait()
        with Client(root) as client:
            counters = [client.inspect_queue(domain, QUEUE).counters for domain in domains]
        assert stop_service(service) == 0

    # Every command id got exactly one outcome in its producer's output, committed on its domain's partition.
    printed: dict[str, dict[str, Any]] = {}
    for k, (producer, (stdout, stderr)) in enumerate(zip(producers, outputs, strict=True)):
        assert producer.returncode == 0, stderr.decode()
        lines = [json.loads(line) for line in stdout.decode().splitlines()]
        own = [command_id for command_id in expected if command_id.startswith(f"producer{k}-")]
        assert Counter(line["command_id"] for line in lines) == Counter(own)
        printed.update((line["command_id"], line) for line in lines)
    for command_id, line in printed.items():
        assert line["status"] == "committed", line
        assert line["partition"] == partition_for(expected[command_id], PARTITIONS), line

    # The outcome stream holds only identical copies of each command's outcome, matching what producers saw.
    # A command is its command id in its domain: the administrator's principal commands (partition-wide)
    # reuse one command id in each partition's domain.
    streamed: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    for _, value in published_outcomes(data):
        outcome = decode_outcome(value)
        streamed[(outcome["domain"], outcome["command_id"])].add(value)
    assert {command: len(values) for command, values in streamed.items() if len(values) > 1} == {}
    for command_id, line in printed.items():
        [value] = streamed[(expected[command_id], command_id)]
        outcome = decode_outcome(value)
        assert (outcome["status"], outcome["partition"], outcome["offset"]) == (
            line["status"],
            line["partition"],
            line["offset"],
        )

    # Each projection stores one outcome per command, the one that was published.
    stored = stored_outcomes(data)
    assert [command for command, n in Counter((d, c) for _, d, c, _ in stored).items() if n > 1] == []
    by_id = {(domain, command_id): (partition, value) for partition, domain, command_id, value in stored}
    for command_id, line in printed.items():
        partition, value = by_id[(expected[command_id], command_id)]
        assert partition == line["partition"]
        assert {value[FINGERPRINT_BYTES:]} == {contents(v) for v in streamed[(expected[command_id], command_id)]}

    enqueued = PRODUCERS * MESSAGES_PER_DOMAIN
    for queue_counters in counters:
        assert (queue_counters.stored_messages, queue_counters.enqueued_total) == (enqueued, enqueued)
    assert_live_equals_replay(data, tmp_path)


@dataclass(frozen=True, slots=True)
class Planned:
    """One Enqueue of the crash workload."""

    command_id: str
    domain: str
    message_id: str
    payload: bytes
    reply_to: int

    def same_command(self, other: Planned) -> bool:
        """Whether the two have the same fingerprint (reply_to is informational)."""
        return (self.domain, self.message_id, self.payload) == (other.domain, other.message_id, other.payload)

    def encode(self, credential: Credential) -> bytes:
        body = enqueue_body(queue_for(self.domain), self.message_id, self.payload)
        return signed_command(credential, self.domain, ENQUEUE, body, self.command_id, reply_to=self.reply_to)


def queue_for(domain: str) -> str:
    # The same name in every domain: with more domains than partitions, two domains share a partition and
    # must still get separate queues.
    return "jobs"


def plan_workload(rng: random.Random, domains: list[str], outcome_partitions: int) -> list[Planned]:
    originals: list[Planned] = []
    workload: list[Planned] = []
    while len(workload) < WORKLOAD_COMMANDS:
        n = len(workload)
        roll = rng.random()
        reply_to = rng.randrange(outcome_partitions)
        if originals and roll < RETRY_SHARE:
            planned = replace(rng.choice(originals), reply_to=reply_to)
        elif originals and roll < RETRY_SHARE + CONFLICT_SHARE:
            original = rng.choice(originals)
            planned = replace(original, payload=original.payload + b"!", reply_to=reply_to)
        elif originals and roll < RETRY_SHARE + CONFLICT_SHARE + REUSED_MESSAGE_SHARE:
            original = rng.choice(originals)
            planned = Planned(f"cmd-{n}", original.domain, original.message_id, b"again", reply_to)
        else:
            domain = rng.choice(domains)
            planned = Planned(f"cmd-{n}", domain, f"msg-{n}", rng.randbytes(rng.randint(1, 64)), reply_to)
            originals.append(planned)
        workload.append(planned)
    return workload


@dataclass(frozen=True, slots=True)
class Expected:
    status: str
    error_code: str | None = None


COMMITTED = Expected("committed")
CONFLICT = Expected("rejected", "Conflict")
EXHAUSTED = Expected("rejected", "ResourceExhausted")


@dataclass
class Model:
    """What applying the workload in log order must produce.

    `published[i]` is (index of the record whose outcome record i publishes, that outcome's status): a retry
    republishes the first occurrence's outcome, anything else publishes its own. `first` maps each command id to
    the record that decided its stored outcome; `messages` holds the message ids each domain's queue stores.
    """

    published: list[tuple[int, Expected]] = field(default_factory=list)
    first: dict[str, int] = field(default_factory=dict)
    messages: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def run_model(workload: list[Planned], quotas: dict[str, int]) -> Model:
    """Command ids never cross domains here, so the global order stands in for each partition's order."""
    model = Model()
    for index, planned in enumerate(workload):
        first = model.first.get(planned.command_id)
        if first is not None:
            retry = workload[first].same_command(planned)
            model.published.append(model.published[first] if retry else (index, CONFLICT))
            continue
        stored = model.messages[planned.domain]
        if planned.message_id in stored:
            expected = CONFLICT
        elif len(stored) >= quotas[planned.domain]:
            expected = EXHAUSTED
        else:
            stored.add(planned.message_id)
            expected = COMMITTED
        model.first[planned.command_id] = index
        model.published.append((index, expected))
    return model


class Appender:
    """Appends encoded records to the command log in consecutive chunks of 20-100, keeping their offsets."""

    def __init__(self, log: FileLog, partitions: list[int], values: list[bytes], rng: random.Random) -> None:
        self.log = log
        self.partitions = partitions
        self.values = values
        self.offsets: dict[int, int] = {}
        self.chunks: deque[range] = deque()
        start = 0
        while start < len(values):
            end = min(len(values), start + rng.randint(*CHUNK_RECORDS))
            self.chunks.append(range(start, end))
            start = end

    def append_next(self) -> None:
        by_partition: dict[int, list[int]] = defaultdict(list)
        for index in self.chunks.popleft():
            by_partition[self.partitions[index]].append(index)
        for partition, indices in by_partition.items():
            appended = self.log.append(partition, [self.values[i] for i in indices])
            self.offsets.update(zip(indices, (a.offset for a in appended), strict=True))


@pytest.mark.slow
def test_kill_9_during_workload_loses_nothing_and_applies_nothing_twice(tmp_path: Path) -> None:
    rng = random.Random(20240607)
    root = tmp_path / "data"
    data = DataDir.create(root, PARTITIONS)
    domains = spread_domains(DOMAINS, PARTITIONS)
    partition_of = {domain: partition_for(domain, PARTITIONS) for domain in domains}
    quotas = {domain: SMALL_QUOTA if domain == domains[0] else 100_000 for domain in domains}
    workload = plan_workload(rng, domains, data.outcome_partitions)
    model = run_model(workload, quotas)
    # Signed by the administrator: `keyload run` turns access control on before it serves, so records
    # appended after its EnableAccessControl must be signed (those before it apply either way).
    admin = system_credential(root, ADMIN_PRINCIPAL)
    values = [planned.encode(admin) for planned in workload]
    log = data.command_log()
    try:
        created: dict[str, tuple[str, int]] = {}  # domain -> (command id, offset) of its CreateQueue
        for domain in domains:
            command_id = f"create-{domain}"
            body = create_queue_body(queue_for(domain), max_stored_messages=quotas[domain])
            value = signed_command(admin, domain, CREATE_QUEUE, body, command_id, reply_to=0)
            [position] = log.append(partition_of[domain], [value])
            created[domain] = (command_id, position.offset)
        appender = Appender(log, [partition_of[planned.domain] for planned in workload], values, rng)

        # Each round: append some chunks while no service runs, start one, keep appending at random moments
        # of a random window, then SIGKILL it wherever it is (idle, applying a group, publishing, committing).
        kills = kills_with_backlog = 0
        started_at = time.monotonic()
        while kills < KILLS:
            share = -(-len(appender.chunks) // (KILLS - kills))
            while_down = share // 3
            for _ in range(while_down):
                appender.append_next()
            with running(root) as service:
                window = rng.uniform(*RUN_WINDOW_S)
                served_at = time.monotonic()
                for moment in sorted(rng.uniform(0, window) for _ in range(share - while_down)):
                    time.sleep(max(0.0, served_at + moment - time.monotonic()))
                    appender.append_next()
                time.sleep(max(0.0, served_at + window - time.monotonic()))
                service.kill()
            kills += 1
            kills_with_backlog += any(lag(data, log))
        assert not appender.chunks
        with running(root) as service:
            wait_until(lambda: not any(lag(data, log)), CATCH_UP_TIMEOUT_S, "the last run to catch up")
            assert stop_service(service) == 0
        crash_phase_s = time.monotonic() - started_at
    finally:
        log.close()

    assert_live_equals_replay(data, tmp_path)
    offsets = appender.offsets

    # Stored outcomes: exactly one per command id, decided by its first occurrence.
    stored = stored_outcomes(data)
    assert [command_id for command_id, n in Counter(c for _, _, c, _ in stored).items() if n > 1] == []
    by_id = {command_id: (partition, value) for partition, _, command_id, value in stored}
    # `keyload run`'s own EnableAccessControl commands aside (whether their outcomes are stored is the service's
    # business), the stored outcomes are the workload's and the CreateQueues'.
    service_own = {f"enable-access-control-p{partition}" for partition in range(PARTITIONS)}
    assert by_id.keys() - service_own == set(model.first) | {command_id for command_id, _ in created.values()}
    for domain, (command_id, offset) in created.items():
        outcome = decode_outcome(by_id[command_id][1][FINGERPRINT_BYTES:])
        assert (outcome["status"], outcome["partition"], outcome["offset"]) == (
            "committed",
            partition_of[domain],
            offset,
        )
    wrong = []
    for command_id, index in model.first.items():
        partition, value = by_id[command_id]
        outcome = decode_outcome(value[FINGERPRINT_BYTES:])
        original = REGISTRY.decode("keyload.Command", contents(values[index]))
        actual = (partition, value[:FINGERPRINT_BYTES], outcome["offset"], outcome["status"], outcome["error_code"])
        expected = model.published[index][1]
        want = (
            partition_of[workload[index].domain],
            fingerprint(original, contents(values[index])),
            offsets[index],
            expected.status,
            expected.error_code,
        )
        if actual != want:
            wrong.append((command_id, actual, want))
    assert wrong == []

    # Published outcomes: every record's outcome reached its reply partition, and copies are identical
    # Outcomes (a copy published before the partition applied EnableAccessControl is plain, one after
    # it sealed for the administrator).
    want_published = {
        (0, command_id, partition_of[domain], offset): COMMITTED for domain, (command_id, offset) in created.items()
    }
    for planned, (carrier, expected) in zip(workload, model.published, strict=True):
        key = (planned.reply_to, planned.command_id, partition_of[planned.domain], offsets[carrier])
        want_published[key] = expected
    published = published_outcomes(data)
    copies: dict[tuple[int, str, int, int], set[bytes]] = defaultdict(set)
    for reply_partition, value in published:
        outcome = decode_outcome(value)
        copies[(reply_partition, outcome["command_id"], outcome["partition"], outcome["offset"])].add(contents(value))
    assert [key for key, found in copies.items() if len(found) > 1] == []
    seen = {}
    for key, [value] in copies.items():
        outcome = decode_outcome(value)
        seen[key] = Expected(outcome["status"], outcome["error_code"])
    assert seen == want_published

    # Effects: each committed enqueue stored its message once, and the counters agree.
    for domain in domains:
        store = Store(data.projection(partition_of[domain]), read_only=True)
        try:
            record = queue_record(store, domain, queue_for(domain))
            stored_ids = message_ids(store, record["view"]["incarnation"])
        finally:
            store.close()
        counters = record["view"]["counters"]
        assert stored_ids == model.messages[domain]
        assert counters["stored_messages"] == counters["enqueued_total"] == len(model.messages[domain])

    statuses = Counter(expected for _, expected in model.published)
    print(
        f"\n{kills} kills ({kills_with_backlog} left unapplied records), "
        f"{len(published) - len(workload) - len(created)} outcomes republished after a crash, "
        f"crash phase {crash_phase_s:.1f}s; workload outcomes: "
        + ", ".join(f"{e.error_code or e.status} {n}" for e, n in statuses.most_common())
    )


def test_a_stop_leaves_the_backlog_to_the_next_start(tmp_path: Path) -> None:
    """SIGTERM stops the processors between two groups (ARCHITECTURE.md §10a, "Stopping"): a service
    stopped with a backlog in its log exits without applying it, and the next start applies it.
    (A stop that drained the log first would never end behind a producer faster than the processor.)"""
    root = tmp_path / "data"
    assert stop_service(start_service(root, "--listen", "none")) == 0
    data = DataDir.open(root)
    partition = partition_for(STOP_DOMAIN, data.partitions)
    with data.file_command_log() as log:
        for start in range(0, STOP_BACKLOG, 500):  # unsigned: each is refused, and is a record to apply all the same
            values = [command(STOP_DOMAIN, ENQUEUE, enqueue_body("q", f"m{n}")) for n in range(start, start + 500)]
            log.append(partition, values)
        end = log.end_offset(partition)
    assert stop_service(start_service(root, "--listen", "none")) == 0
    assert _applied(data, partition) < end - 1
    until_idle = keyload_command("run", "--data", str(root), "--listen", "none", "--until-idle")
    assert subprocess.run(until_idle, timeout=300).returncode == 0
    assert _applied(data, partition) >= end - 1


def _applied(data: DataDir, partition: int) -> int:
    store = Store(data.projection(partition))
    try:
        return store.applied_offset
    finally:
        store.close()
