"""The doorbell names the partitions appended to; the runtime reads those at once and every
partition at least once a sweep interval, so an append nobody rang for is never starved."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from keyload.log.base import LogRecord
from keyload.service.doorbell import Doorbell, Listener
from keyload.service.runtime import PartitionProcessor, run_until

from .support import ENQUEUE, Embedded, command, enqueue_body

SWEEP_S = 0.05
DEADLINE_S = 10.0


def test_a_ring_names_the_partitions_appended_to(tmp_path: Path) -> None:
    listener = Listener(tmp_path)
    doorbell = Doorbell(tmp_path)
    try:
        doorbell.ring((1, 3))
        doorbell.ring((3,))
        assert listener.wait(DEADLINE_S) == frozenset({1, 3})
        assert listener.wait(0.01) == frozenset()  # nothing rang: the timeout passed
        doorbell.ring()
        doorbell.ring((2,))
        assert listener.wait(DEADLINE_S) is None  # a ring naming no partition: look at every one
    finally:
        doorbell.close()
        listener.close()


def _domains(embedded: Embedded) -> tuple[str, str]:
    """Two domains on different partitions."""
    first = "d-0"
    other = next(f"d-{n}" for n in range(1, 100) if embedded.partition(f"d-{n}") != embedded.partition(first))
    return first, other


def test_an_append_nobody_rang_for_is_applied_while_another_partition_is_rung_without_pause(
    embedded: Embedded,
) -> None:
    """A busy partition whose rings arrive back to back does not keep the others from being read."""
    rung, silent = _domains(embedded)
    embedded.append(rung, command(rung, ENQUEUE, enqueue_body("q", "m-1"), "c-1"))
    silent_processor = embedded.processors[embedded.partition(silent)]
    appended: list[int] = []
    stop = threading.Event()
    deadline = time.monotonic() + DEADLINE_S

    def always_rung(_: float) -> frozenset[int]:
        """The doorbell of a partition under constant traffic: every wait returns at once, naming it."""
        if not appended:  # after the first sweep: only a sweep can find this one
            appended.append(embedded.append(silent, command(silent, ENQUEUE, enqueue_body("q", "m-2"), "c-2")))
        elif silent_processor.applied_offset >= appended[0] or time.monotonic() > deadline:
            stop.set()
        return frozenset({embedded.partition(rung)})

    run_until(embedded.processors, stop, idle=always_rung, idle_min_s=SWEEP_S, idle_max_s=SWEEP_S)
    assert silent_processor.applied_offset == appended[0]
    assert embedded.processors[embedded.partition(rung)].applied_offset == 0


class _Partition:
    """A processor's stand-in: `pending` records to apply, one per step (`always` never runs dry);
    at its 10th record it hands `then` 5 records."""

    def __init__(self, partition: int, always: bool = False, then: _Partition | None = None) -> None:
        self.partition = partition
        self.pending = 0
        self.always = always
        self.then = then
        self.halt = None
        self.applied_offset = -1

    @property
    def caught_up(self) -> bool:
        return not (self.always or self.pending)

    def step(self) -> int:
        if not (self.always or self.pending):
            return 0
        self.pending = max(self.pending - 1, 0)
        self.applied_offset += 1
        if self.then is not None and self.applied_offset == 10:
            self.then.pending = 5
        return 1


def _run_beside_a_busy_partition(rings: list[frozenset[int]]) -> _Partition:
    """Partition 0 always has work and hands partition 1 five records on its way; `rings` answer
    the waits (then nothing rings). Partition 1, once it has applied them or the deadline passed."""
    other = _Partition(1)
    busy = _Partition(0, always=True, then=other)
    stop = threading.Event()
    deadline = threading.Timer(DEADLINE_S, stop.set)
    deadline.start()

    def idle(_: float) -> frozenset[int]:
        if other.applied_offset == 4:
            stop.set()
        return rings.pop(0) if rings else frozenset()

    processors: list[PartitionProcessor] = [busy, other]  # type: ignore[list-item]
    try:
        run_until(processors, stop, idle=idle, idle_min_s=SWEEP_S, idle_max_s=SWEEP_S)
    finally:
        deadline.cancel()
    return other


def test_a_rung_partition_is_read_while_another_is_never_idle() -> None:
    other = _run_beside_a_busy_partition([frozenset()] * 12 + [frozenset({1})])
    assert other.applied_offset == 4


def test_an_append_nobody_rang_for_is_read_while_another_partition_is_never_idle() -> None:
    other = _run_beside_a_busy_partition([])  # only the sweep can find it
    assert other.applied_offset == 4


def test_a_partition_a_short_read_caught_up_waits_for_the_next_ring(embedded: Embedded) -> None:
    """Applying everything its read found, a partition is not read again at once: the service goes
    back to waiting on the doorbell (one read per wake-up, not two)."""
    domain = "d-0"
    processor = embedded.processors[embedded.partition(domain)]
    embedded.append(domain, command(domain, ENQUEUE, enqueue_body("q", "m-1"), "c-1"))
    log = processor.log
    reads: list[int] = []

    def counted(partition: int, from_offset: int, max_records: int) -> list[LogRecord]:
        reads.append(from_offset)
        return log.read(partition, from_offset, max_records)

    processor.log = SimpleNamespace(read=counted, end_offset=log.end_offset, sync_through=log.sync_through)
    waits: list[tuple[float, int]] = []
    stop = threading.Event()

    def idle(wait_s: float) -> frozenset[int]:
        waits.append((wait_s, len(reads)))
        stop.set()
        return frozenset()

    run_until([processor], stop, idle=idle, idle_min_s=SWEEP_S, idle_max_s=SWEEP_S)
    assert processor.applied_offset == 0
    assert waits == [(SWEEP_S, 1)]
