"""`keyload run --workers N`: the embedded log's partitions served by worker processes (worker w owns
partitions p % N == w; worker 0 is `keyload run` itself, with the HTTP API).

Real processes throughout: a worker killed with SIGKILL under HTTP load is started again by the
serving process, and the clients retrying by command id lose and duplicate nothing; workers die with a
killed `keyload run`, leaving no projection held; what the workers applied replays byte for byte."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from keyload import Client, Credential
from keyload.errors import OutcomeTimeout
from keyload.log.base import partition_for
from keyload.operations.recovery import drill
from keyload.projections.store import Store
from keyload.service.halts import recorded_halts
from keyload.storage.datadir import DataDir

from .support import (
    assert_each_enqueued_once,
    enqueue_retrying,
    free_port,
    run_keyload,
    start_service,
    stop_service,
    wait_until,
)

pytestmark = pytest.mark.slow

WORKERS = 2
PARTITIONS = 4  # the default
PRODUCERS = 2  # per domain
MESSAGES = 100  # per producer
GIVE_UP_S = 120.0


def served_by(worker: int, prefix: str) -> str:
    """A domain whose partition worker `worker` of WORKERS owns."""
    return next(
        name for name in (f"{prefix}-{n}" for n in range(1000)) if partition_for(name, PARTITIONS) % WORKERS == worker
    )


def worker_pid(service_pid: int, worker: int) -> int | None:
    """The live process of worker `worker` of the `keyload run` with pid `service_pid` (its OS name
    is keyload-wN)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if comm == f"keyload-w{worker}" and parent == service_pid and state != "Z":
            return int(entry.name)
    return None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_worker_is_started_again_and_its_clients_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    listen = f"127.0.0.1:{free_port()}"
    url = f"http://{listen}"
    service = start_service(root, "--listen", listen, "--workers", str(WORKERS))
    credential = Credential.load(root / "credentials" / "keyload-admin.json")
    domains = [served_by(worker, "crash") for worker in range(WORKERS)]
    with Client(url, credential=credential) as admin:
        for domain in domains:
            admin.create_queue(domain, "jobs")
    answered: list[int] = []
    failures: list[str] = []

    def produce(domain: str, producer: int) -> None:
        with Client(url, credential=credential, timeout_s=5) as client:
            for n in range(MESSAGES):
                try:
                    enqueue_retrying(client, domain, "jobs", f"p{producer}-{n}", GIVE_UP_S)
                except AssertionError as exc:
                    failures.append(str(exc))
                    return
                answered.append(1)

    threads = [
        threading.Thread(target=produce, args=(domain, producer)) for domain in domains for producer in range(PRODUCERS)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: worker_pid(service.pid, 1) is not None, 30, "worker 1")
        killed = worker_pid(service.pid, 1)
        assert killed is not None
        total = len(threads) * MESSAGES
        wait_until(lambda: len(answered) >= total // 3, 120, "a third of the messages")
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: worker_pid(service.pid, 1) not in (None, killed), 30, "worker 1 to be started again")
        for thread in threads:
            thread.join(GIVE_UP_S + 30)
        assert service.poll() is None, "the serving process did not outlive its worker"
        assert failures == []
        assert len(answered) == total
        with Client(url, credential=credential) as admin:
            for domain in domains:
                assert_each_enqueued_once(admin, domain, "jobs", PRODUCERS, MESSAGES)
    finally:
        if service.poll() is None:
            assert stop_service(service, 30) == 0
    data = DataDir.open(root)
    for domain in domains:
        partition = partition_for(domain, data.partitions)
        report = drill(data, partition, tmp_path / f"drill-{partition}", progress=False)
        assert report.passed, report


def test_workers_die_with_a_killed_service_and_hold_nothing_back(tmp_path: Path) -> None:
    """kill -9 of `keyload run`: its workers die too (nothing keeps a projection open), and the next
    `keyload run --workers` serves every partition again, from the local path as well."""
    root = tmp_path / "data"
    service = start_service(root, "--listen", "none", "--workers", str(WORKERS))
    wait_until(lambda: worker_pid(service.pid, 1) is not None, 30, "worker 1")
    worker = worker_pid(service.pid, 1)
    assert worker is not None
    service.send_signal(signal.SIGKILL)
    service.wait()
    wait_until(lambda: not alive(worker), 10, "the worker to die with its service")
    service = start_service(root, "--listen", "none", "--workers", str(WORKERS))
    try:
        with Client(root) as local:  # appends to the file log, rings, reads the outcome stream
            for domain in (served_by(0, "local"), served_by(1, "local")):
                local.create_queue(domain, "q")
                local.enqueue(domain, "q", b"body", message_id="m")
                [delivery] = local.receive(domain, "q").deliveries
                assert local.ack(domain, delivery.token).state == "acked"
    finally:
        assert stop_service(service, 30) == 0


def test_what_workers_apply_replays_byte_for_byte_and_until_idle_waits_for_them(tmp_path: Path) -> None:
    """A log applied by two workers, and the same log applied by one process, give projections with
    the same digests, partition by partition; `--until-idle` returns once every worker caught up."""
    root = tmp_path / "data"
    assert run_keyload("run", "--data", str(root), "--until-idle", "--listen", "none").returncode == 0
    domains = [served_by(worker, "replay") + suffix for worker in range(WORKERS) for suffix in ("", "-b")]
    with Client(root, timeout_s=0.05) as local:  # no service: each command is appended, none answered yet
        for domain in domains:
            with pytest.raises(OutcomeTimeout):
                local.create_queue(domain, "q")
            for n in range(20):
                with pytest.raises(OutcomeTimeout):
                    local.enqueue(domain, "q", b"x" * n, message_id=f"m{n}")
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    for data_dir, workers in ((root, WORKERS), (copy, 1)):
        done = run_keyload(
            "run", "--data", str(data_dir), "--until-idle", "--listen", "none", "--workers", str(workers)
        )
        assert done.returncode == 0, done.stdout + done.stderr
    for partition in range(PARTITIONS):
        two = Store(root / "projections" / f"p-{partition:04d}", read_only=True)
        one = Store(copy / "projections" / f"p-{partition:04d}", read_only=True)
        try:
            assert two.applied_offset == one.applied_offset
            assert two.digest() == one.digest(), partition
        finally:
            two.close()
            one.close()
    with Client(root) as local:
        service = start_service(root, "--listen", "none", "--workers", str(WORKERS))
        try:
            for domain in domains:
                assert local.inspect_queue(domain, "q").counters.stored_messages == 20
        finally:
            assert stop_service(service, 30) == 0


def test_a_workers_halt_fails_an_until_idle_run_and_a_failing_worker_stops_the_service(tmp_path: Path) -> None:
    """A partition of worker 1 that halts is reported by `keyload run --until-idle`, whose exit status
    says so, as one process's would; a worker that cannot serve at all (a projection it cannot open)
    stops the service, which names it."""
    root = tmp_path / "data"
    damaged = served_by(1, "halt")
    assert run_keyload("run", "--data", str(root), "--until-idle", "--listen", "none").returncode == 0
    with Client(root, timeout_s=0.05) as local:
        for n in range(5):
            with pytest.raises(OutcomeTimeout):
                local.enqueue(damaged, "q", b"body-%d" % n, message_id=f"m{n}")
    partition = partition_for(damaged, PARTITIONS)
    [segment] = sorted((root / "log" / "commands" / f"p-{partition:04d}").glob("*.seg"))[-1:]
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0x40  # one flipped byte in the middle of the segment
    segment.write_bytes(bytes(raw))
    halted = run_keyload("run", "--data", str(root), "--until-idle", "--listen", "none", "--workers", str(WORKERS))
    assert halted.returncode == 1, halted.stdout + halted.stderr
    assert partition in recorded_halts(root)
    assert f"partition {partition} halted at offset" in halted.stdout + halted.stderr

    projection = root / "projections" / f"p-{partition:04d}"
    shutil.rmtree(projection)
    projection.write_text("not a projection")
    failed = run_keyload("run", "--data", str(root), "--listen", "none", "--workers", str(WORKERS))
    assert failed.returncode == 1
    owned = ", ".join(str(p) for p in range(1, PARTITIONS, WORKERS))
    assert f"worker 1 (partitions {owned}) exited with status 1" in failed.stderr
    assert "Traceback" not in failed.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--workers", "5"), "--workers must be 1..4"),
        (("--partitions", "2", "--workers", "3"), "--workers must be 1..2"),
        (("--workers", "0"), "--workers"),
        (("--kafka", "127.0.0.1:1", "--workers", "2"), "on Kafka, run more `keyload run`"),
    ],
)
def test_a_worker_count_the_directory_cannot_take_is_refused_before_anything_is_made(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    refused = run_keyload("run", "--data", str(tmp_path / "data"), "--listen", "none", *args)
    assert refused.returncode == 2
    assert says in refused.stderr
    assert not (tmp_path / "data").exists()
