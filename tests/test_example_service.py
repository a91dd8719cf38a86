"""End to end: examples/order_service.py processes 5,000 orders exactly once while it keeps dying.

Two phases over one `keyload run`:

1. A zombie: an instance is frozen (SIGSTOP) with deliveries in hand, a second
   instance takes them over once their leases run out and finishes every order,
   then the frozen one is thawed and completes what it was holding. Each of those
   completions must be recognised as a repeat (`already_processed`), exactly as
   many as it held, and apply nothing.
2. Crashes: the rest of the orders, with the example's crash hook killing its own
   process (SIGKILL) at random points mid-handling; it is restarted each time
   until every order is acked.

Then every order has exactly one document at revision 1 with the expected bytes,
"shipments" holds exactly one message per order, nothing was dead-lettered or
nacked, and the live projections equal a clean replay (`keyload drill` and a
replay of every partition).
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from keyload import Capability, Client, Grant
from keyload.log.base import partition_for
from keyload.sdk.results import EnqueueMessage, PutDocument, QueuePolicySpec, QueueView
from keyload.storage.datadir import DataDir

from .support import assert_live_equals_replay, keyload_command, run_keyload

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "order_service.py"
DOMAIN = "shop"
ORDERS = 5_000
ZOMBIE_ORDERS = 200  # phase 1
ZOMBIE_FREEZE_AFTER = 50  # orders acked before the zombie is frozen
CRASH_PROBABILITY = 0.002  # phase 2: per order handled, the process kills itself
LEASE_MS = 2_000  # short, so the deliveries of a dead or frozen instance come back soon
ENQUEUE_BATCH = 100
SERVICE_TIMEOUT_S = 240.0
MIN_CRASHES = 3  # with seeded crash hooks ~10 happen; fewer would mean the hook is not exercised


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("order_service", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def order(i: int) -> dict[str, Any]:
    return {
        "id": f"o{i}",
        "customer": f"customer-{i % 97}",
        "items": [{"sku": f"sku-{i % 13}", "qty": 1 + i % 3}, {"sku": f"sku-{i % 7}", "qty": 1}],
        "amount_cents": 100 * (i % 50 + 1),
    }


def wait_for(predicate: Any, timeout_s: float, what: str, pause_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause_s)


@contextmanager
def keyload_run(root: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`keyload run` over `root`, its output in `log` (a file, never an undrained pipe); stopped on the way out."""
    with log.open("ab") as out:
        start = out.tell()
        process = subprocess.Popen(keyload_command("run", "--data", str(root)), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: b"keyload: serving" in log.read_bytes()[start:] or process.poll() is not None, 30, "keyload run"
        )
        assert process.poll() is None, log.read_text()
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Instance:
    """One run of the example service."""

    process: subprocess.Popen[bytes]
    log: Path

    def stats(self) -> dict[str, int]:
        """The stats line a clean exit prints."""
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        assert len(lines) == 1, self.log.read_text()
        stats: dict[str, int] = lines[0]["stats"]
        return stats

    def stop(self, timeout_s: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # SIGKILL: a frozen process dies of it too
            self.process.wait()


def start_instance(root: Path, log: Path, *options: str) -> Instance:
    command = [sys.executable, str(EXAMPLE), "--data", str(root), "--lease-ms", str(LEASE_MS), "--wait-ms", "500"]
    with log.open("wb") as out:
        process = subprocess.Popen([*command, *options], stdout=out, stderr=subprocess.STDOUT)
    return Instance(process, log)


def enqueue_orders(client: Client, numbers: range) -> None:
    """Enqueue orders o<i> as message order-o<i>, a batch of 100 per command."""
    for first in range(numbers.start, numbers.stop, ENQUEUE_BATCH):
        chunk = range(first, min(first + ENQUEUE_BATCH, numbers.stop))
        messages = [EnqueueMessage("orders", f"order-o{i}", json.dumps(order(i)).encode()) for i in chunk]
        client.batch(DOMAIN, messages, command_id=f"enqueue-orders-{first}")


def orders_view(client: Client) -> QueueView:
    return client.inspect_queue(DOMAIN, "orders")


def holds_append_lock(root: Path, partition: int) -> bool:
    """Whether some process holds the partition's append lock, over a few tries (the ticker takes it briefly)."""
    lock = root / "log" / "commands" / f"p-{partition:04d}" / ".lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        for _ in range(20):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise
                time.sleep(0.01)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def freeze_holding_deliveries(zombie: Instance, client: Client, root: Path, partition: int) -> int:
    """SIGSTOP the zombie at a moment it holds leased orders and no log lock; the number it holds."""
    for _ in range(50):
        os.kill(zombie.process.pid, signal.SIGSTOP)
        # A process frozen inside an append would keep every appender of the partition waiting.
        if not holds_append_lock(root, partition):
            # Every command the zombie appended is before this one in the log: what is leased now, it holds.
            held = orders_view(client).counters.leased
            if held > 0:
                return held
        os.kill(zombie.process.pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("could not freeze the zombie while it held deliveries")


def test_order_service_processes_each_order_once_through_crashes_and_a_zombie(tmp_path: Path) -> None:
    example = load_example()
    root = tmp_path / "data"
    started = time.monotonic()
    instances: list[Instance] = []
    with keyload_run(root, tmp_path / "keyload-run.log"), Client(root) as client:
        data = DataDir.open(root)
        partition = partition_for(DOMAIN, data.partitions)
        try:
            # The service's principal, as examples/README.md makes it: only what the service does.
            grants = [
                Grant(capability=Capability.consume, domain=DOMAIN, resource="orders"),
                Grant(capability=Capability.documents_write, domain=DOMAIN),
                Grant(capability=Capability.enqueue, domain=DOMAIN, resource="shipments"),
            ]
            client.create_principal("order-service", grants)
            client.create_queue(
                DOMAIN, "orders", QueuePolicySpec(max_attempts=1_000, retry_base_ms=10, retry_max_ms=100)
            )
            client.create_queue(DOMAIN, "shipments", QueuePolicySpec(receive_max_messages=1_000, max_in_flight=ORDERS))

            # Phase 1: a zombie's completions after its leases were taken over are recognised repeats.
            enqueue_orders(client, range(ZOMBIE_ORDERS))
            zombie = start_instance(root, tmp_path / "zombie.log", "--timeout", "120")
            instances.append(zombie)
            wait_for(lambda: orders_view(client).counters.acked_total >= ZOMBIE_FREEZE_AFTER, 60, "the zombie to work")
            held = freeze_holding_deliveries(zombie, client, root, partition)
            rescuer = start_instance(root, tmp_path / "rescuer.log", "--timeout", "120")
            instances.append(rescuer)
            wait_for(lambda: orders_view(client).counters.acked_total == ZOMBIE_ORDERS, 60, "the rescuer")
            os.kill(zombie.process.pid, signal.SIGCONT)
            assert zombie.stop() == 0, zombie.log.read_text()
            assert rescuer.stop() == 0, rescuer.log.read_text()
            zombie_stats, rescuer_stats = zombie.stats(), rescuer.stats()
            assert zombie_stats["already_processed"] == held, (held, zombie_stats)
            assert rescuer_stats["already_processed"] == 0, rescuer_stats
            applied = sum(s["acked"] - s["already_processed"] for s in (zombie_stats, rescuer_stats))
            assert applied == ZOMBIE_ORDERS, (zombie_stats, rescuer_stats)
            assert zombie_stats["nacked"] == rescuer_stats["nacked"] == 0
            zombie_phase_s = time.monotonic() - started

            # Phase 2: the rest of the orders, the service killing itself at random points, restarted each time.
            enqueue_orders(client, range(ZOMBIE_ORDERS, ORDERS))
            crashes = 0
            clean: list[dict[str, int]] = []
            while True:
                seed = len(instances)
                instance = start_instance(
                    root,
                    tmp_path / f"instance-{seed}.log",
                    "--crash-probability",
                    str(CRASH_PROBABILITY),
                    "--seed",
                    str(seed),
                    "--stop-after-idle",
                    "3",
                )
                instances.append(instance)
                while instance.process.poll() is None and orders_view(client).counters.acked_total < ORDERS:
                    assert time.monotonic() - started < SERVICE_TIMEOUT_S, orders_view(client).counters
                    time.sleep(0.2)
                drained = orders_view(client).counters.acked_total == ORDERS
                code = instance.stop() if drained else instance.process.wait()
                if code == -signal.SIGKILL:
                    crashes += 1
                else:
                    assert code == 0, instance.log.read_text()
                    clean.append(instance.stats())
                if drained:
                    break
            crash_phase_s = time.monotonic() - started - zombie_phase_s

            # Nothing was refused (a second application would have hit expected_revision=0), and no one else
            # completed what a live instance held: dead instances complete nothing.
            assert [(s["nacked"], s["already_processed"]) for s in clean] == [(0, 0)] * len(clean)
            assert crashes >= MIN_CRASHES, crashes

            counters = orders_view(client).counters
            assert (counters.acked_total, counters.stored_messages, counters.dead_lettered) == (ORDERS, 0, 0)
            assert (counters.ready, counters.leased, counters.scheduled) == (0, 0, 0)

            # Exactly one document per order, at revision 1, with the bytes the handler computes.
            expected_documents: dict[str, bytes] = {}
            expected_shipments: dict[str, bytes] = {}
            for i in range(ORDERS):
                document, shipment = example.order_effects(order(i))
                assert isinstance(document, PutDocument) and isinstance(shipment, EnqueueMessage)
                expected_documents[document.key] = document.value
                expected_shipments[shipment.message_id] = shipment.body
            documents: dict[str, tuple[bytes, int]] = {}
            after = None
            while True:
                page = client.list_documents(DOMAIN, "order/", after=after, max_documents=1_000)
                for found in page.documents:
                    assert found.key not in documents, found.key
                    documents[found.key] = (found.value, found.revision)
                if page.next_after is None:
                    break
                after = page.next_after
            assert documents == {key: (value, 1) for key, value in expected_documents.items()}

            # Exactly one shipment per order, with the expected body.
            shipments = client.inspect_queue(DOMAIN, "shipments").counters
            assert (shipments.stored_messages, shipments.enqueued_total) == (ORDERS, ORDERS)
            received: dict[str, bytes] = {}
            while len(received) < ORDERS:
                batch = client.receive(DOMAIN, "shipments", max_messages=1_000, lease_ms=600_000).deliveries
                assert batch, f"shipments ran out after {len(received)}"
                for delivery in batch:
                    assert delivery.message_id not in received, delivery.message_id
                    received[delivery.message_id] = delivery.body
            assert received == expected_shipments

            drill = run_keyload("drill", "--data", str(root), "--domain", DOMAIN, "--quiet", timeout=120)
            assert drill.returncode == 0 and "PASS" in drill.stdout, drill.stdout + drill.stderr
        finally:
            for instance in instances:
                instance.kill()
    assert_live_equals_replay(DataDir.open(root), tmp_path / "replay")
    print(
        f"\n{ORDERS} orders in {time.monotonic() - started:.1f}s: zombie phase {zombie_phase_s:.1f}s "
        f"(held {held}, all recognised as already processed); crash phase {crash_phase_s:.1f}s with "
        f"{crashes} crashes over {len(instances) - 2} instances; clean exits: {clean}"
    )
