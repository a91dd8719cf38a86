"""A partition's census: what its projection holds, by key family, and what bounded work is left.

State should grow with what is live, not with what was ever processed (DESIGN.md's bounded-state
promise), and this is how an operator sees whether it does: rows and bytes per key family
(projections/keys.py), and the work the processor still has queued behind the records it applies —
deleted queues, groups and topics being reclaimed, retention tasks waiting for the GC worker, and
timers already due. It reads a projection read-only, beside a running service, with one scan of
every row: its cost grows with the projection (about a second per million rows), so it is an
operator's command, never a processor's.
"""

from __future__ import annotations

from dataclasses import dataclass

from keyload.errors import KeyloadError
from keyload.processors import usage
from keyload.projections import keys
from keyload.projections.store import NO_OFFSET, Store
from keyload.storage.datadir import DataDir

# Each family tag's name, from projections/keys.py's constant for it ("message", "retired_group", ...).
FAMILY_NAMES = {
    value: name.lower()
    for name, value in vars(keys).items()
    if name.isupper() and isinstance(value, bytes) and len(value) == 1 and value in keys.FAMILY_VALUES
}
# The families whose rows are work still queued, by what they count.
RECLAIMING = {keys.RETIRED: "queues", keys.RETIRED_GROUP: "groups", keys.RETIRED_TOPIC: "topics"}


@dataclass(frozen=True, slots=True)
class FamilyCount:
    """The rows of one key family and their bytes (keys and values as stored)."""

    family: str
    tag: str
    rows: int
    key_bytes: int
    value_bytes: int


@dataclass(frozen=True, slots=True)
class Census:
    partition: int
    applied_offset: int | None  # None: nothing applied yet
    families: tuple[FamilyCount, ...]  # the families holding rows, in tag order
    rows: int
    bytes: int  # keys and values
    reclaiming: dict[str, int]  # deleted queues, groups and topics whose rows are still being reclaimed
    retention_tasks: int  # guarded object deletions not yet confirmed (processors/payloads/retention.py)
    # queues, groups, topics, reclamations and the horizon sweep due at the last applied record's time or before
    timers_due: int
    # horizon index rows due by then: outcomes, receipts and finished work the sweep has still to remove
    horizon_due: int
    # the partition is still counting what its domains held when it reached feature level 5 (their caps wait)
    usage_counting: bool


class CensusError(KeyloadError):
    """The projection cannot be read (absent, or not a projection)."""


def census(data: DataDir, partition: int) -> Census:
    """Count partition `partition`'s projection, read-only."""
    data.check_partition(partition)
    path = data.projection(partition)
    if not path.is_dir():
        raise CensusError(f"partition {partition} has no projection yet: `keyload run` creates it")
    store = Store(path, read_only=True)
    try:
        return _count(store, partition)
    finally:
        store.close()


def _count(store: Store, partition: int) -> Census:
    counts: dict[bytes, list[int]] = {}
    for key, value in store.scan(b"", b"\xff"):
        count = counts.setdefault(key[:1], [0, 0, 0])
        count[0] += 1
        count[1] += len(key)
        count[2] += len(value)
    families = tuple(
        FamilyCount(FAMILY_NAMES.get(tag, tag.hex()), tag.decode("latin-1"), rows, key_bytes, value_bytes)
        for tag, (rows, key_bytes, value_bytes) in sorted(counts.items())
    )
    last = store.get(keys.LAST_TIME)
    due = horizon_due = 0
    if last is not None:
        after = keys.u64(keys.read_u64(last) + 1)
        due = sum(1 for _ in store.scan(keys.DUE_QUEUE, keys.DUE_QUEUE + after))
        horizon_due = sum(1 for _ in store.scan(keys.HORIZON, keys.HORIZON + after))
    return Census(
        partition=partition,
        applied_offset=None if store.applied_offset == NO_OFFSET else store.applied_offset,
        families=families,
        rows=sum(family.rows for family in families),
        bytes=sum(family.key_bytes + family.value_bytes for family in families),
        reclaiming={kind: counts.get(tag, [0])[0] for tag, kind in RECLAIMING.items()},
        retention_tasks=counts.get(keys.RETENTION_TASK, [0])[0],
        timers_due=due,
        horizon_due=horizon_due,
        usage_counting=usage.counting(store),
    )
