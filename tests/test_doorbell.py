"""The doorbell names the partitions appended to; the runtime reads those at once and every
partition at least once a sweep interval, so an append nobody rang for is never starved."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from keyload.service.doorbell import Doorbell, Listener
from keyload.service.runtime import run_until

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
        assert listener.wait(0.01) is None  # nothing rang: the timeout passed
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
