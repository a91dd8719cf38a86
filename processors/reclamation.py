"""Reclaiming a deleted queue's rows in bounded steps, fired like a timer.

DeleteQueue frees the queue's name at once, but its incarnation may still hold any number of rows:
the metadata of every message it ever finished, retired message identities, inbox entries, and —
deleted by force — live messages, their indexes and timers. Deleting them inside the command would
make one record's work unbounded. Instead the queue is *retired*: its record moves to its `X` key,
with `reclaim_from` the next row to reclaim, its `i` row names that key, and it waits in the
partition's due index like a timer, due at the deletion's log time. Firing it
(processors/timers.py, before a record and within the tick examination budget) deletes rows from
that cursor on, in a fixed order of families, and queues the rest again at the current log time,
behind the timers due earlier. The ticker keeps appending Ticks while a timer is due, so the
backlog drains at the processor's pace, between other commands. The last step deletes the `X` row,
the `i` row and the due entry.

What a forced deletion drops still owns objects: a live large message's object and an open
reservation's upload go to the guarded retention workflow (processors/payloads/retention.py) as
the row naming them is reclaimed, exactly as a cancel would send them. Every step is decided by
log time and log order, so a replay deletes exactly the same rows.
"""

from __future__ import annotations

from itertools import islice

from msgspec.structs import replace

from keyload.processors.context import Context
from keyload.processors.errors import Corruption
from keyload.processors.payloads import reservations, retention
from keyload.processors.queues.state import LIVE_STATES, move_due_entry
from keyload.projections import keys
from keyload.projections.records import MessageMeta, QueueRecord, ReservationState, load, save
from keyload.projections.store import Readable, Staged

# The families of rows a queue keeps under its incarnation (projections/keys.py), in reclaiming order.
QUEUE_FAMILIES = (
    keys.MESSAGE,
    keys.BODY,
    keys.READY,
    keys.DEAD_LETTER,
    keys.PENDING_DEAD_LETTER,
    keys.WAITER,
    keys.ORDERING,
    keys.KEY_HEAD,
    keys.TIMER,
    keys.INBOX_ENTRY,
    keys.IDENTITY,
)


def retire(stage: Staged, record: QueueRecord, now_ms: int) -> None:
    """Start reclaiming a queue whose `q` row is deleted: its record moves to its `X` key, its `i`
    row names that key, and its due-index entry moves to `now_ms`."""
    incarnation = record.view.incarnation
    stage.put(keys.resource_key(incarnation), keys.retired(incarnation))
    first = QUEUE_FAMILIES[0] + keys.u64(incarnation)
    save(stage, keys.retired(incarnation), replace(record, next_timer_ms=now_ms, reclaim_from=first))
    move_due_entry(stage, incarnation, record.next_timer_ms, now_ms)


def reclaim_step(stage: Staged, incarnation: int, due_ms: int, ctx: Context, budget: int) -> int:
    """Delete up to `budget` (≥ 1) rows of the retired queue; the rows examined, at least one (the
    step that finds nothing more counts as one, and ends the reclamation)."""
    record = load(stage, keys.retired(incarnation), QueueRecord)
    if record is None or record.reclaim_from is None:
        raise Corruption(f"resource {incarnation} is retired without its reclamation record")
    if record.next_timer_ms != due_ms:
        raise Corruption(f"due index of retired resource {incarnation} disagrees with its record")
    cursor = record.reclaim_from
    if cursor[:1] not in QUEUE_FAMILIES:
        raise Corruption(f"reclamation of resource {incarnation} stands at a row of no queue family")
    examined = 0
    for family in QUEUE_FAMILIES[QUEUE_FAMILIES.index(cursor[:1]) :]:
        prefix = family + keys.u64(incarnation)
        start = cursor if family == cursor[:1] else prefix
        left = budget - examined
        # One more than the budget: the first row left is where the next step starts.
        rows = list(islice(stage.scan(start, keys.prefix_end(prefix)), left + 1))
        for key, _ in rows[:left]:
            _release_objects(stage, record, key, ctx)
            stage.delete(key)
        examined += min(len(rows), left)
        if len(rows) > left:
            rest = replace(record, next_timer_ms=ctx.now_ms, reclaim_from=rows[left][0])
            save(stage, keys.retired(incarnation), rest)
            if ctx.now_ms != due_ms:
                move_due_entry(stage, incarnation, due_ms, ctx.now_ms)
            return examined
    stage.delete(keys.retired(incarnation))
    stage.delete(keys.resource_key(incarnation))
    move_due_entry(stage, incarnation, due_ms, None)
    return max(examined, 1)


def _release_objects(stage: Staged, record: QueueRecord, key: bytes, ctx: Context) -> None:
    """Before a row of a force-deleted queue goes: a live large message's object, or an open
    reservation's upload (its deadline timer is the row), goes to the retention workflow."""
    family = key[:1]
    if family == keys.MESSAGE:
        meta = load(stage, key, MessageMeta)
        assert meta is not None
        if meta.payload is not None and meta.state in LIVE_STATES:
            message_id = key[9:].decode("utf-8")
            retention.retire_payload(stage, record.view, message_id, replace(meta, terminal_at_ms=ctx.now_ms), ctx)
    elif family == keys.TIMER and keys.parse_timer(key)[1] == keys.TIMER_RESERVATION:
        reservations.abandon_open(stage, record.view, ctx, keys.parse_timer(key)[2], ReservationState.cancelled)


def deleted(stage: Readable, incarnation: int) -> bool:
    """Whether a queue incarnation was deleted: retired, or reclaimed so far that nothing of it is
    left. Retention tasks outlive their queue (the object store's deletion waits for the recovery
    floor), so they ask this before taking a missing queue, message or identity for corruption."""
    resource_key = stage.get(keys.resource_key(incarnation))
    return resource_key is None or resource_key[:1] == keys.RETIRED
