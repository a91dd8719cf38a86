"""Guarded payload deletion survives SIGKILL of the processor and of the GC worker.

`keyload run` (its own GC disabled) and a separate `keyload gc run` serve a data
directory of two partitions while the test runs a mixed large-payload workload on a
queue per partition: scheduled messages (resumed by request id after a lost outcome),
messages read back and acked, messages received and left to their lease's expiry,
reservations uploaded to and cancelled, reservations left to expire by log time, and
checkpoints requested every few operations so the recovery floor moves (2 retained).
Meanwhile a killer thread SIGKILLs the service and the GC worker at random moments and
restarts each at once.

Then the workload quiesces: everything deliverable is read and acked, checkpoints move
every partition's floor past each retire offset, and every retention task is confirmed
(or compacted away). With the service stopped: every live message's exact object version
exists, no object under payloads/ (and no unfinished upload) is left without a live
message, the live projections equal a clean replay, and every acked message was read
back with exactly the bytes scheduled.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

import pytest

from keyload import Client
from keyload.errors import CommandRejected, LeaseExpiredError, OutcomeTimeout, StaleLeaseError
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY, Record
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.sdk.payloads import PayloadError
from keyload.sdk.results import Delivery, QueuePolicySpec, RetentionTask
from keyload.storage.datadir import DataDir

from .support import assert_live_equals_replay, keyload_command, spread_domains, start_service, stop_service

pytestmark = pytest.mark.slow

T = TypeVar("T")

SEED = int(os.environ.get("KEYLOAD_PAYLOAD_CRASH_SEED", "20261129"))
PARTITIONS = 2
QUEUE = "big"
POLICY = QueuePolicySpec(
    lease_ms=500,
    payload_request_horizon_ms=200,
    max_attempts=1_000,  # nothing dead-letters: every message can be acked at the end
    retry_base_ms=50,
    retry_max_ms=200,
)
SERVICE_ARGS = (
    "--partitions",
    str(PARTITIONS),
    "--gc-interval-s",
    "0",
    "--tick-interval-ms",
    "50",
    "--checkpoint-retain",
    "2",
)
GC_INTERVAL_S = 0.2
CLIENT_TIMEOUT_S = 5.0
KILLS = 5  # of each process
KILL_AFTER_S = (0.6, 1.6)
PAYLOAD_BYTES = (10 * 1024, 200 * 1024)
HOLD_LEASE_MS = 600_000  # a message held by a handler that hangs: live, leased, at the end
KEEP_FOR_MS = 3_600_000  # a message scheduled this far ahead: live, scheduled, at the end
READ_LEASE_MS = 3_000  # receives that read and ack hold their lease a little longer than the policy's
# A scheduled message's object outlives its upload handle: this window must outlast a restart, and
# its end (plus the horizon) must come in test time.
SCHEDULE_WINDOW_MS = 15_000
CANCEL_WINDOW_MS = 2_000  # an uploaded-then-cancelled reservation: its horizon must end in test time
EXPIRE_WINDOW_MS = 1_000  # a reservation left to expire by log time
CHECKPOINT_EVERY_OPS = 6
WORKLOAD_DEADLINE_S = 45.0
QUIESCE_TIMEOUT_S = 60.0


def until_known(call: Callable[[], T], deadline: float) -> T:
    """`call` (one command under a fixed command id) again until its outcome is known."""
    while True:
        try:
            return call()
        except OutcomeTimeout:
            if time.monotonic() > deadline:
                raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class GcWorkerProcess:
    """`keyload gc run` over the data directory; its output goes to a file, never a pipe."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> None:
        if self._out is None:
            self._out = self.log.open("ab")
        self.process = subprocess.Popen(
            keyload_command("gc", "run", "--data", str(self.root), "--interval-s", str(GC_INTERVAL_S)),
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, "keyload gc run died on its own"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        assert self.process is not None
        return stop_service(self.process)

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._out is not None:
            self._out.close()


class Service:
    """`keyload run` (started by support.start_service), killed and restarted at will."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.process = start_service(root, *SERVICE_ARGS)

    def kill(self) -> None:
        assert self.process.poll() is None, "keyload run died on its own"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def restart(self) -> None:
        self.process = start_service(self.root, *SERVICE_ARGS)

    def cleanup(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Killer(threading.Thread):
    """SIGKILLs the service and the GC worker at random moments, restarting each promptly."""

    def __init__(self, rng: random.Random, service: Service, gc: GcWorkerProcess) -> None:
        super().__init__(daemon=True)
        self.rng = rng
        self.service = service
        self.gc = gc
        self.halt = threading.Event()
        self.done = threading.Event()
        self.service_kills = 0
        self.gc_kills = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        victims = ["service"] * KILLS + ["gc"] * KILLS
        self.rng.shuffle(victims)
        try:
            for victim in victims:
                if self.halt.wait(self.rng.uniform(*KILL_AFTER_S)):
                    return
                if victim == "service":
                    self.service.kill()
                    self.service_kills += 1
                    self.service.restart()
                else:
                    self.gc.kill()
                    self.gc_kills += 1
                    self.gc.start()
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.done.set()


@dataclass
class Ledger:
    """What the workload did."""

    scheduled: dict[str, str] = field(default_factory=dict)  # message id -> SHA-256 of its bytes
    lengths: dict[str, int] = field(default_factory=dict)  # message id -> its payload's length
    object_keys: dict[str, str] = field(default_factory=dict)  # message id -> its object key
    kept: set[str] = field(default_factory=set)  # scheduled far ahead: never delivered in the test
    held: set[str] = field(default_factory=set)  # leased for long and never acked
    verified: set[str] = field(default_factory=set)  # read back with exactly those bytes
    acked: set[str] = field(default_factory=set)
    reservation_keys: set[str] = field(default_factory=set)  # every object key a reservation named
    abandoned_reservations: int = 0  # reserved and never committed: cancelled or expired
    cancelled: int = 0
    left_to_expire: int = 0
    abandoned_leases: int = 0
    checkpoints: int = 0
    unknown: int = 0  # outcomes that did not come in time (around kills): retried or given up
    lost_leases: int = 0
    stale_reads: int = 0


class Workload:
    def __init__(self, client: Client, domains: list[str], rng: random.Random, ledger: Ledger, deadline: float):
        self.client = client
        self.domains = domains
        self.rng = rng
        self.ledger = ledger
        self.deadline = deadline
        self.n = 0

    def next_id(self, what: str) -> str:
        self.n += 1
        return f"{what}-{self.n}"

    def known(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except OutcomeTimeout:
            self.ledger.unknown += 1
            return until_known(call, self.deadline)

    def schedule(self, domain: str, keep: bool = False) -> None:
        mid = self.next_id("kept" if keep else "m")
        not_before = time.time_ns() // 1_000_000 + KEEP_FOR_MS if keep else None
        data = self.rng.randbytes(self.rng.randint(*PAYLOAD_BYTES))
        request_id = f"req-{mid}"
        while True:
            try:
                receipt = self.client.schedule_large(
                    domain,
                    QUEUE,
                    data,
                    message_id=mid,
                    not_before_ms=not_before,
                    request_id=request_id,
                    upload_window_ms=SCHEDULE_WINDOW_MS,
                )
                break
            except OutcomeTimeout:
                self.ledger.unknown += 1
                assert time.monotonic() < self.deadline, f"schedule of {mid} did not finish"
        assert receipt.state == "committed", receipt
        self.ledger.reservation_keys.add(receipt.object_key)
        self.ledger.scheduled[mid] = sha256(data)
        self.ledger.lengths[mid] = len(data)
        self.ledger.object_keys[mid] = receipt.object_key
        if keep:
            self.ledger.kept.add(mid)

    def check_read(self, delivery: Delivery) -> bool:
        """Read a delivery's payload; its bytes must be exactly the scheduled ones. False: the handle ran out."""
        try:
            data = self.client.read_payload(delivery)
        except PayloadError:
            self.ledger.stale_reads += 1  # the lease ended (a kill delayed us): the message comes again
            return False
        assert data is not None
        assert sha256(data) == self.ledger.scheduled[delivery.message_id], delivery.message_id
        self.ledger.verified.add(delivery.message_id)
        return True

    def ack(self, domain: str, delivery: Delivery) -> None:
        command_id = f"ack-{delivery.message_id}-{delivery.delivery_generation}"
        try:
            self.known(lambda: self.client.ack(domain, delivery.token, command_id=command_id))
        except (LeaseExpiredError, StaleLeaseError):
            self.ledger.lost_leases += 1
            return
        self.ledger.acked.add(delivery.message_id)

    def receive_read_ack(self, domain: str, max_messages: int = 3) -> int:
        command_id = self.next_id("receive")
        received = self.known(
            lambda: self.client.receive(
                domain, QUEUE, max_messages=max_messages, lease_ms=READ_LEASE_MS, command_id=command_id
            )
        )
        for delivery in received.deliveries:
            if self.check_read(delivery):
                self.ack(domain, delivery)
        return len(received.deliveries)

    def receive_and_abandon(self, domain: str) -> None:
        command_id = self.next_id("abandon")
        received = self.known(lambda: self.client.receive(domain, QUEUE, max_messages=1, command_id=command_id))
        self.ledger.abandoned_leases += len(received.deliveries)

    def hold(self, domain: str) -> None:
        command_id = self.next_id("hold")
        received = self.known(
            lambda: self.client.receive(domain, QUEUE, max_messages=1, lease_ms=HOLD_LEASE_MS, command_id=command_id)
        )
        self.ledger.held.update(delivery.message_id for delivery in received.deliveries)

    def upload_and_cancel(self, domain: str, partition: int) -> None:
        mid = self.next_id("cancelled")
        data = self.rng.randbytes(self.rng.randint(*PAYLOAD_BYTES))
        prepare_id = f"prepare-{mid}"
        receipt = self.known(
            lambda: self.client.prepare_large_schedule(
                domain,
                QUEUE,
                mid,
                len(data),
                hashlib.sha256(data).digest(),
                upload_window_ms=CANCEL_WINDOW_MS,
                command_id=prepare_id,
            )
        )
        self.ledger.reservation_keys.add(receipt.object_key)
        self.ledger.abandoned_reservations += 1
        handle = self.client.payloads.upload_handle(receipt, partition)
        source = self.client.data.root / "scratch" / f"{mid}.bin"
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        try:
            self.client.payloads.upload(handle, source)
        except PayloadError:
            pass  # the window closed while a kill held the prepare back: expired, not cancelled
        finally:
            source.unlink()
        try:
            self.known(
                lambda: self.client.cancel_large_schedule(domain, receipt.reservation_id, command_id=f"cancel-{mid}")
            )
        except CommandRejected:
            return  # expired first: log order decides, retention deletes it either way
        self.ledger.cancelled += 1

    def prepare_and_forget(self, domain: str) -> None:
        mid = self.next_id("forgotten")
        receipt = self.known(
            lambda: self.client.prepare_large_schedule(
                domain,
                QUEUE,
                mid,
                12_345,
                hashlib.sha256(mid.encode()).digest(),
                upload_window_ms=EXPIRE_WINDOW_MS,
                command_id=f"prepare-{mid}",
            )
        )
        self.ledger.reservation_keys.add(receipt.object_key)
        self.ledger.abandoned_reservations += 1
        self.ledger.left_to_expire += 1

    def checkpoint(self, partition: int) -> None:
        try:
            self.client.request_checkpoint(partition, command_id=self.next_id(f"checkpoint-p{partition}"))
        except OutcomeTimeout:
            self.ledger.unknown += 1  # taken or not: the next one moves the floor
            return
        self.ledger.checkpoints += 1

    def step(self, partition_of: dict[str, int]) -> None:
        domain = self.rng.choice(self.domains)
        op = self.rng.choices(
            ["schedule", "read", "abandon", "cancel", "forget", "keep", "hold"], weights=[10, 6, 2, 2, 2, 1, 1]
        )[0]
        if op == "schedule":
            self.schedule(domain)
        elif op == "keep":
            self.schedule(domain, keep=True)
        elif op == "hold":
            self.hold(domain)
        elif op == "read":
            self.receive_read_ack(domain)
        elif op == "abandon":
            self.receive_and_abandon(domain)
        elif op == "cancel":
            self.upload_and_cancel(domain, partition_of[domain])
        else:
            self.prepare_and_forget(domain)
        if self.n % CHECKPOINT_EVERY_OPS == 0:
            self.checkpoint(partition_of[domain])


def retention_tasks(client: Client, partition: int) -> list[RetentionTask]:
    tasks: list[RetentionTask] = []
    after = None
    while True:
        page = client.list_retention(partition, after_task=after)
        tasks.extend(status.task for status in page.tasks)
        if page.next_after_task is None:
            return tasks
        after = page.next_after_task


def quiesce(work: Workload, partition_of: dict[str, int]) -> None:
    """Ack everything deliverable; move the floors until every retention task is confirmed."""
    client = work.client
    deadline = time.monotonic() + QUIESCE_TIMEOUT_S
    next_checkpoint = 0.0
    while True:
        assert time.monotonic() < deadline, "the workload did not quiesce in time"
        for domain in work.domains:
            while work.receive_read_ack(domain, max_messages=10):
                pass
        counters = [client.inspect_queue(domain, QUEUE).counters for domain in work.domains]
        found = [sum(c.stored_messages for c in counters), sum(c.reserved_messages for c in counters)]
        found.append(sum(c.payload_object_bytes for c in counters))
        live = work.ledger.kept | work.ledger.held
        expected = [len(live), 0, sum(work.ledger.lengths[mid] for mid in live)]
        tasks = [task for p in range(PARTITIONS) for task in retention_tasks(client, p)]
        if found == expected and all(task.state == "confirmed" for task in tasks):
            return
        if time.monotonic() >= next_checkpoint:  # floors keep moving past every retire offset
            for partition in sorted(set(partition_of.values())):
                work.checkpoint(partition)
            next_checkpoint = time.monotonic() + 0.5
        time.sleep(0.1)


def scan_projection(data: DataDir, partition: int) -> tuple[dict[str, Record], list[Record], list[Record], int]:
    """Messages with a payload (id -> meta), reservations and retention tasks of a stopped partition."""
    store = Store(data.projection(partition), read_only=True)
    try:
        messages: dict[str, Record] = {}
        for key, value in store.scan(keys.MESSAGE, keys.prefix_end(keys.MESSAGE)):
            meta = REGISTRY.decode("keyload.MessageMeta", value)
            if meta["payload"] is not None:
                messages[key[9:].decode()] = meta
        reservations = [
            REGISTRY.decode("keyload.PayloadReservation", value)
            for _, value in store.scan(keys.RESERVATION, keys.prefix_end(keys.RESERVATION))
        ]
        tasks = [
            REGISTRY.decode("keyload.RetentionTask", value)
            for _, value in store.scan(keys.RETENTION_TASK, keys.prefix_end(keys.RETENTION_TASK))
        ]
        retired = store.get(keys.RETIRED_IDENTITIES)
        return messages, reservations, tasks, 0 if retired is None else keys.read_u64(retired)
    finally:
        store.close()


def test_kill_9_of_processor_and_gc_keeps_payload_objects_exact(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    root = tmp_path / "data"
    started = time.monotonic()
    service = Service(root)
    gc = GcWorkerProcess(root, tmp_path / "gc.log")
    ledger = Ledger()
    domains = spread_domains(PARTITIONS, PARTITIONS)
    killer: Killer | None = None
    try:
        gc.start()
        # The administrator's client: besides the workload it requests checkpoints (admin) and
        # lists retention tasks (recovery), which no other principal may do.
        with Client(root, timeout_s=CLIENT_TIMEOUT_S) as client:
            partition_of = {domain: partition_for(domain, PARTITIONS) for domain in domains}
            assert sorted(partition_of.values()) == list(range(PARTITIONS))
            for domain in domains:
                client.create_queue(domain, QUEUE, POLICY, command_id=f"create-{domain}")
            work = Workload(client, domains, rng, ledger, started + WORKLOAD_DEADLINE_S)
            killer = Killer(random.Random(rng.random()), service, gc)
            killer.start()
            while not killer.done.is_set():
                work.step(partition_of)
                assert time.monotonic() < work.deadline, "the workload did not finish in time"
            killer.join()
            assert killer.error is None, killer.error
            assert (killer.service_kills, killer.gc_kills) == (KILLS, KILLS)
            workload_s = time.monotonic() - started
            quiesce(work, partition_of)
        assert gc.stop() == 0
        assert stop_service(service.process) == 0
    finally:
        if killer is not None:
            killer.halt.set()
            killer.join()
        gc.cleanup()
        service.cleanup()

    data = DataDir.open(root)
    objects = data.object_store()
    live: dict[str, tuple[str, str]] = {}  # object key -> (version, message id) of messages not terminal
    tasks_made = 0
    for partition in range(PARTITIONS):
        messages, reservations, tasks, retired = scan_projection(data, partition)
        tasks_made += len(tasks) + retired
        assert all(task["state"] == "confirmed" for task in tasks), tasks
        open_reservations = [r for r in reservations if r["state"] == "reserved"]
        assert not open_reservations, open_reservations
        for mid, meta in messages.items():
            payload = meta["payload"]
            stored = {v.version for v in objects.versions(payload["object_key"])}
            if meta["terminal_at_ms"] is None:
                # 1. No referenced object is missing.
                assert payload["object_version"] in stored, (mid, meta["state"], payload)
                live[payload["object_key"]] = (payload["object_version"], mid)
            else:
                assert payload["object_version"] not in stored, (mid, meta["state"], "outlived its retention")

    # 2. No unreferenced object outlives the workflow, and no unfinished upload.
    listed = {version.key for version in objects.list("payloads/")}
    for key in sorted(listed | ledger.reservation_keys):
        versions = [version.version for version in objects.versions(key)]
        if key in live:
            assert versions == [live[key][0]], (key, versions, live[key])
        else:
            assert versions == [], (key, versions, "no live message references it")
        assert objects.uploads(key) == [], key
    assert listed <= ledger.reservation_keys

    # 3. Digests equal a clean replay.
    assert_live_equals_replay(data, tmp_path / "replay")

    # 4. Every acked message was read back with exactly its bytes; everything else scheduled is live.
    assert ledger.acked <= ledger.verified
    assert ledger.acked == set(ledger.scheduled) - ledger.kept - ledger.held
    assert {mid for _, mid in live.values()} == ledger.kept | ledger.held
    assert {key: version for key, (version, _) in live.items()} == {
        ledger.object_keys[mid]: version for _, (version, mid) in live.items()
    }
    # Each acked message and each reservation never committed had its one retention task.
    assert tasks_made == len(ledger.acked) + ledger.abandoned_reservations

    print(
        f"\n{len(ledger.scheduled)} scheduled, {len(ledger.acked)} acked, {ledger.cancelled} cancelled, "
        f"{ledger.left_to_expire} left to expire, {ledger.abandoned_leases} leases abandoned, "
        f"{len(ledger.kept)} kept and {len(ledger.held)} held live, "
        f"{ledger.checkpoints} checkpoints; {killer.service_kills if killer else 0} service and "
        f"{killer.gc_kills if killer else 0} gc kills in {workload_s:.1f}s of workload; "
        f"{ledger.unknown} unknown outcomes, {ledger.lost_leases} lost leases, {ledger.stale_reads} stale reads; "
        f"{time.monotonic() - started:.1f}s in all"
    )


def test_a_restarted_service_clears_what_a_killed_one_staged(tmp_path: Path) -> None:
    """An upload streams into DATA/scratch/payloads; a server killed mid-transfer leaves the part it
    had, which nobody finishes (the client uploads again): the next start removes it."""
    root = tmp_path / "data"
    stop_service(start_service(root, "--gc-interval-s", "0"))
    staged = root / "scratch" / "payloads" / "upload-killed"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(b"\x00" * (2 * 1024 * 1024))
    service = start_service(root, "--gc-interval-s", "0")
    try:
        assert not staged.exists()
    finally:
        stop_service(service)
