"""Reclaiming a deleted resource's rows in bounded steps, fired like a timer.

Queues, subscription groups and topics are reclaimed alike (a `Retirement` says how for each
kind; groups and topics in processors/topics/deletion.py); queues are the example below.

DeleteQueue frees the queue's name at once, but its incarnation may still hold any number of rows:
the metadata of every message it ever finished, retired message identities, inbox entries, and —
deleted by force — live messages with their bodies, index rows and timers. Deleting them inside the
command would make one record's work unbounded. Instead the queue is *retired*: its record moves to
its `X` key, with `reclaim_from` the next row to reclaim, its `i` row names that key, and it waits
in the partition's due index like a timer, due at the deletion's log time. Firing it
(processors/timers.py, before a record and within the tick examination budget) reclaims from that
cursor on and queues the rest again at the current log time, behind the timers due earlier. The
ticker keeps appending Ticks while a timer is due, so the backlog drains at the processor's pace,
between other commands. The last step deletes the `X` row, the `i` row and the due entry.

Only the families a queue never deletes from as it works are walked: its timers (from its timer
floor, so the tombstones of timers that fired are not), its messages' metadata, its inbox entries
and its identity rows. A live message's other rows (body, ready, dead-letter or pending row,
ordering row and key head, expiry timer) are deleted by key as its metadata is reached, so the
tombstones that a working queue leaves in those families are never walked (in the walked families,
rows deleted behind the timer floor, metadata retention compacted, and from feature level 4 the
metadata, identities and inbox entries the horizon sweep removed, are walked once, until RocksDB
compacts their tombstones away). What a forced
deletion drops still owns objects: as a live large message is reached its object, and as an open
reservation's deadline timer is reached whatever an upload left, go to the guarded retention
workflow (processors/payloads/retention.py), exactly as a cancel would send them. Every step is
decided by log time and log order, so a replay deletes exactly the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Generic, TypeVar

from msgspec.structs import replace

from keyload.processors.context import Context
from keyload.processors.errors import Corruption
from keyload.processors.payloads import reservations, retention
from keyload.processors.queues.lifecycle import state_row
from keyload.processors.queues.state import LIVE_STATES, move_due_entry
from keyload.projections import keys
from keyload.projections.records import (
    GroupRecord,
    MessageMeta,
    Ordering,
    QueueRecord,
    ReservationState,
    TopicRecord,
    load,
    save,
)
from keyload.projections.store import Staged

Retired = TypeVar("Retired", QueueRecord, GroupRecord, TopicRecord)


@dataclass(frozen=True, slots=True)
class Retirement(Generic[Retired]):
    """How one kind of deleted resource is reclaimed.

    `families` are walked in order, each from where `starts` says its rows begin (None: it has none
    to walk): past the tombstones the working resource left in front of them, where its record
    tells where those end. `reclaim` deletes one
    walked row, with whatever else it holds, and returns the record as it now is.
    """

    record: type[Retired]
    family: bytes  # where the record waits: RETIRED (X), RETIRED_GROUP (Y) or RETIRED_TOPIC (Z)
    families: tuple[bytes, ...]
    starts: Callable[[Retired], dict[bytes, bytes | None]]
    reclaim: Callable[[Staged, Retired, bytes, bytes, Context], Retired]


def retire(stage: Staged, retirement: Retirement[Retired], record: Retired, now_ms: int) -> None:
    """Start reclaiming a resource whose own row is deleted: its record moves to its retired key,
    its `i` row names that key, and its due-index entry moves to `now_ms`. One with no row left to
    walk is gone at once."""
    incarnation = record.view.incarnation
    starts = retirement.starts(record)
    first = next((starts[family] for family in retirement.families if starts[family] is not None), None)
    if first is None:
        stage.delete(keys.resource_key(incarnation))
        move_due_entry(stage, incarnation, record.next_timer_ms, None)
        return
    retired = keys.retired(incarnation, retirement.family)
    stage.put(keys.resource_key(incarnation), retired)
    save(stage, retired, replace(record, next_timer_ms=now_ms, reclaim_from=first))
    move_due_entry(stage, incarnation, record.next_timer_ms, now_ms)


def reclaim_step(
    stage: Staged, retirement: Retirement[Retired], incarnation: int, due_ms: int, ctx: Context, budget: int
) -> int:
    """Reclaim up to `budget` (≥ 1) rows of the retired resource; the rows examined, at least one
    (the step that finds nothing more counts as one, and ends the reclamation)."""
    retired = keys.retired(incarnation, retirement.family)
    record = load(stage, retired, retirement.record)
    if record is None or record.reclaim_from is None:
        raise Corruption(f"resource {incarnation} is retired without its reclamation record")
    if record.next_timer_ms != due_ms:
        raise Corruption(f"due index of retired resource {incarnation} disagrees with its record")
    cursor = record.reclaim_from
    families = retirement.families
    if cursor[:1] not in families:
        raise Corruption(f"reclamation of resource {incarnation} stands at a row of no family it walks")
    starts = retirement.starts(record)
    examined = 0
    for family in families[families.index(cursor[:1]) :]:
        start = cursor if family == cursor[:1] else starts[family]
        if start is None:
            continue
        prefix = family + keys.u64(incarnation)
        left = budget - examined
        # One more than the budget: the first row left is where the next step starts.
        rows = list(islice(stage.scan(start, keys.prefix_end(prefix)), left + 1))
        for key, value in rows[:left]:
            record = retirement.reclaim(stage, record, key, value, ctx)
        examined += min(len(rows), left)
        if len(rows) > left:
            save(stage, retired, replace(record, next_timer_ms=ctx.now_ms, reclaim_from=rows[left][0]))
            if ctx.now_ms != due_ms:
                move_due_entry(stage, incarnation, due_ms, ctx.now_ms)
            return examined
    stage.delete(retired)
    stage.delete(keys.resource_key(incarnation))
    move_due_entry(stage, incarnation, due_ms, None)
    return max(examined, 1)


# -- queues ----------------------------------------------------------------------------------

# The families walked, in order (projections/keys.py); a live message's rows in the others go with it.
WALKED_FAMILIES = (keys.TIMER, keys.MESSAGE, keys.INBOX_ENTRY, keys.IDENTITY)
# Every family a queue keeps rows in under its incarnation.
QUEUE_FAMILIES = (
    *WALKED_FAMILIES,
    keys.BODY,
    keys.READY,
    keys.DEAD_LETTER,
    keys.PENDING_DEAD_LETTER,
    keys.WAITER,
    keys.ORDERING,
    keys.KEY_HEAD,
)


def _queue_starts(record: QueueRecord) -> dict[bytes, bytes | None]:
    """Timers from the timer floor (none without one); the others from their first row."""
    incarnation = record.view.incarnation
    floor = record.timer_floor
    starts: dict[bytes, bytes | None] = {family: family + keys.u64(incarnation) for family in WALKED_FAMILIES}
    starts[keys.TIMER] = None if floor is None else keys.timer_prefix(incarnation) + floor
    return starts


def _reclaim_queue_row(stage: Staged, record: QueueRecord, key: bytes, value: bytes, ctx: Context) -> QueueRecord:
    """Delete one walked row, and with a live message the rows that hold it; an open reservation's
    deadline timer ends the reservation first, and a live large message's object is retired."""
    family = key[:1]
    if family == keys.TIMER:
        _, kind, sequence = keys.parse_timer(key)
        if kind == keys.TIMER_RESERVATION:
            reservations.abandon_open(stage, record.view, ctx, sequence, ReservationState.cancelled)
    elif family == keys.MESSAGE:
        meta = MessageMeta.decode(value)  # the row as the walk read it: no second read
        if meta.state in LIVE_STATES:
            _drop_live(stage, record, keys.message_id_of(key), meta, ctx)
    stage.delete(key)
    return record


def _drop_live(stage: Staged, record: QueueRecord, message_id: str, meta: MessageMeta, ctx: Context) -> None:
    """The rows a live message holds besides its metadata, deleted by key (its timers were walked
    before it); its object, if it is a large message, goes to the retention workflow."""
    incarnation = record.view.incarnation
    stage.delete(keys.body(incarnation, message_id))
    row = state_row(incarnation, meta)
    if row is not None and row[:1] != keys.TIMER:
        stage.delete(row)
    if record.view.policy.ordering == Ordering.strict_per_key and meta.ordering_key is not None:
        stage.delete(keys.ordering(incarnation, meta.ordering_key, meta.enqueue_sequence))
        stage.delete(keys.key_head(incarnation, meta.ordering_key))  # every message of its key goes too
    if meta.payload is not None:
        retention.retire_payload(stage, record.view, message_id, replace(meta, terminal_at_ms=ctx.now_ms), ctx)


QUEUE_RETIREMENT = Retirement(QueueRecord, keys.RETIRED, WALKED_FAMILIES, _queue_starts, _reclaim_queue_row)
