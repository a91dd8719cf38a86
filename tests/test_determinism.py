"""The determinism contract: processors never read a clock or randomness, and every replay agrees."""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from keyload.operations.recovery import replay
from keyload.service import runtime

from .support import (
    CHECKPOINT,
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_MESSAGE,
    TICK,
    Embedded,
    command,
    create_queue_body,
    enqueue_body,
)

D = "acme"


def _forbidden(*_: object, **__: object) -> object:
    raise AssertionError("a processor read a clock or a random source")


FORBIDDEN = [
    (time, "time"),
    (time, "time_ns"),
    (time, "monotonic"),
    (time, "monotonic_ns"),
    (time, "perf_counter"),
    (random, "random"),
    (random, "getrandbits"),
    (random, "randint"),
    (os, "urandom"),
    (uuid, "uuid1"),
    (uuid, "uuid4"),
]


def append_workload(embedded: Embedded, rounds: int) -> None:
    """Queues, scheduled and expiring messages, ticks, rejections: a bit of everything."""
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=40)))
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("bad name")))
    for i in range(rounds):
        embedded.now_ms += 7
        fields = {}
        if i % 3 == 0:
            fields["not_before_ms"] = embedded.now_ms + 50
        if i % 4 == 0:
            fields["expires_at_ms"] = embedded.now_ms + 120
        embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", f"m{i}", bytes([i % 256]) * i, **fields)))
        if i % 10 == 0:
            embedded.append(D, command(D, TICK, {}))
            embedded.append(D, command(D, INSPECT_MESSAGE, {"queue": "jobs", "message_id": "m0", "include_body": True}))
        if i == rounds // 2:
            embedded.append(D, command(D, CHECKPOINT, {}))
    # The clock going backwards in the log must not move evaluation time backwards.
    embedded.now_ms -= 10_000
    embedded.append(D, command(D, TICK, {}))


def test_processing_reads_no_clock_or_randomness_and_replays_agree(
    embedded: Embedded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append_workload(embedded, 120)
    apply_record = runtime.apply_record

    def guarded(*args: Any, **kwargs: Any) -> Any:
        # Only the processors are forbidden clocks and randomness; the runtime around
        # them (checkpoint files and object versions, periodic timing) does I/O.
        with pytest.MonkeyPatch.context() as patch:
            for module, name in FORBIDDEN:
                patch.setattr(module, name, _forbidden)
            return apply_record(*args, **kwargs)

    monkeypatch.setattr(runtime, "apply_record", guarded)
    partition = embedded.partition(D)
    processor = embedded.processors[partition]
    while processor.step():
        pass
    live_offset = embedded.store(D).applied_offset
    live_digest = embedded.digest(D)
    assert live_offset == embedded.log.end_offset(partition) - 1

    [manifest] = [e.manifest for e in embedded.checkpoints.entries(partition)]
    assert 0 < manifest.offset < live_offset
    from_zero = replay(embedded.data, partition, tmp_path / "from-zero", progress=False)
    from_checkpoint = replay(
        embedded.data, partition, tmp_path / "from-checkpoint", from_offset=manifest.offset + 1, progress=False
    )
    assert from_zero.applied_offset == from_checkpoint.applied_offset == live_offset
    assert from_zero.digest == from_checkpoint.digest == live_digest
    # The checkpoint's own digest equals a replay stopped at its offset.
    at_checkpoint = replay(
        embedded.data, partition, tmp_path / "to-checkpoint", to_offset=manifest.offset, progress=False
    )
    assert at_checkpoint.digest == manifest.digest


def test_evaluation_time_never_goes_backwards(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    later = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1"))
    embedded.now_ms -= 60_000
    earlier_stamp = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m2"))
    assert earlier_stamp.eval_time_ms >= later.eval_time_ms


def test_replay_refuses_an_offset_without_a_checkpoint(embedded: Embedded, tmp_path: Path) -> None:
    from keyload.operations.recovery import RecoveryError

    append_workload(embedded, 5)
    embedded.run()
    with pytest.raises(RecoveryError, match="no checkpoint at offset 2"):
        replay(embedded.data, embedded.partition(D), tmp_path / "x", from_offset=3, progress=False)


def test_a_drill_of_a_partition_never_applied_here_leaves_nothing_behind(tmp_path: Path) -> None:
    """A drill on a node that never held the partition (Kafka: another node owns it) fails with one
    line, and leaves the data directory as it found it: `keyload status` still says "applied
    nothing" there, not that an unreadable projection appeared."""
    from keyload.operations.recovery import RecoveryError, drill
    from keyload.storage.datadir import DataDir

    data = DataDir.create(tmp_path / "data", 4)
    projection = data.projection(2)
    before = sorted(projection.parent.rglob("*")) if projection.parent.exists() else []
    with pytest.raises(RecoveryError, match=r"partition 2 has no live projection yet: .* no projection there yet"):
        drill(data, 2, tmp_path / "scratch", progress=False)
    assert not projection.exists()
    assert (sorted(projection.parent.rglob("*")) if projection.parent.exists() else []) == before
