"""Reading and writing a queue's state: records, names, counters, timer and state indexes.

State layout (projections/keys.py): the queue record carries policy, counters
and sequence allocators; each message has metadata and a separate body. Each
live state has exactly one index row per message — ready (FIFO by ready
sequence), scheduled (a not-before timer), leased (a lease timer), dead-lettered
(by parked sequence), pending dead letter (by enqueue sequence) — plus an expiry
timer while an expiry can still apply. Every queue with timers has one entry in
a partition-wide due index at its earliest timer, and the partition keeps its
earliest due time in one key, so checking for due work costs one read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from msgspec.structs import replace

from keyload import limits
from keyload.processors.counters import adjusted_fields
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.projections import keys
from keyload.projections.records import (
    GroupRecord,
    MessageMeta,
    MessageState,
    QueueRecord,
    QueueView,
    load,
    save,
)
from keyload.projections.store import Readable, Staged

TimedRecord = TypeVar("TimedRecord", QueueRecord, GroupRecord)
"""A typed record with timers and waiters: a queue's or a subscription group's."""

LIVE_STATES = frozenset(
    (
        MessageState.scheduled,
        MessageState.ready,
        MessageState.leased,
        MessageState.dead_lettered,
        MessageState.pending_dead_letter,
    )
)
"""A message's states until it ends: each has a counter of its name and, per message, an index row."""
TERMINAL_TOTALS = {
    MessageState.acked: "acked_total",
    MessageState.expired: "expired_total",
    MessageState.cancelled: "cancelled_total",
}
"""The counter each terminal state adds to."""
DEAD_STATES = (MessageState.dead_lettered, MessageState.pending_dead_letter)
"""The dead-letter states: parked, or waiting for room under the dead-letter sublimits."""


def check_name(kind: str, value: str, max_chars: int, pattern: Any) -> None:
    if not 1 <= len(value) <= max_chars or not pattern.fullmatch(value):
        raise Rejected(
            ErrorCode.VALIDATION,
            f"{kind} must be 1..{max_chars} characters matching {pattern.pattern}",
        )


def bounded(name: str, value: int | None, default: int, minimum: int, maximum: int) -> int:
    """A command's optional limit: `default` when null, else checked against its bounds."""
    chosen = default if value is None else value
    if not minimum <= chosen <= maximum:
        raise Rejected(ErrorCode.VALIDATION, f"{name} must be between {minimum} and {maximum}")
    return chosen


def result_item_bytes(body_bytes: int, headers: dict[str, str], *names: str | None) -> int:
    """What one delivered message adds to an outcome, at most (see limits.RESULT_BYTES_BUDGET)."""
    named = sum(len(name.encode("utf-8")) for name in names if name is not None)
    header_bytes = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in headers.items())
    return body_bytes + header_bytes + named + limits.RESULT_ITEM_OVERHEAD_BYTES


def check_message_id(message_id: str) -> None:
    check_name("message id", message_id, limits.MAX_MESSAGE_ID_CHARS, limits.ID_PATTERN)


def check_headers(headers: dict[str, str]) -> int:
    """Validate message or event headers; their size (names and values, UTF-8) in bytes."""
    if len(headers) > limits.MAX_HEADERS:
        raise Rejected(ErrorCode.VALIDATION, f"at most {limits.MAX_HEADERS} headers")
    size = 0
    for name, value in headers.items():
        check_name("header name", name, limits.MAX_HEADER_NAME_CHARS, limits.HEADER_NAME_PATTERN)
        size += len(name.encode("utf-8")) + len(value.encode("utf-8"))
    if size > limits.MAX_HEADERS_BYTES:
        raise Rejected(ErrorCode.VALIDATION, f"headers exceed {limits.MAX_HEADERS_BYTES} bytes")
    return size


def allocate(stage: Staged, allocator: bytes) -> int:
    """The next id of a partition-wide allocator (a meta key holding the next id; ids start at 1)."""
    raw_next = stage.get(allocator)
    allocated = 1 if raw_next is None else keys.read_u64(raw_next)
    stage.put(allocator, keys.u64(allocated + 1))
    return allocated


def allocate_incarnation(stage: Staged) -> int:
    """A new queue or topic id. One allocator for both: tokens name resources by id, so ids never collide."""
    return allocate(stage, keys.NEXT_QUEUE_ID)


class Working:
    """A queue record that one command changes.

    The records are frozen, and one command chains many changes to its queue:
    transitions (processors/queues/lifecycle.py) move counters and sequence
    allocators, timers the timer floor, waiters their count. Each replaces `record`,
    so the handler and every transition it calls share one current record rather
    than passing it back and forth: the queue is read once per command and written
    once, by `save_queue(stage, work.record)`.
    """

    __slots__ = ("record",)

    def __init__(self, record: QueueRecord) -> None:
        self.record = record

    @property
    def view(self) -> QueueView:
        return self.record.view

    def update(self, **changes: Any) -> None:
        """Replace fields of the stored record (its allocators and floors)."""
        self.record = replace(self.record, **changes)

    def adjust(self, **deltas: int) -> None:
        """Change authoritative counters, checked in the order given: one going negative means
        the projection is corrupt."""
        queue = self.record.view
        self.record = replace(self.record, view=replace(queue, counters=adjusted_fields(queue.counters, **deltas)))


def load_queue(stage: Staged, domain: str, name: str) -> QueueRecord:
    check_name("queue name", name, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    record = load(stage, keys.queue(domain, name), QueueRecord)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "queue does not exist")
    return record


def load_queue_by_id(stage: Staged, queue_id: int) -> QueueRecord | None:
    """The queue with this incarnation; None when there is none (the id may name a topic or a group)."""
    queue_key = stage.get(keys.resource_key(queue_id))
    if queue_key is None or queue_key[:1] != keys.QUEUE:
        return None
    return load(stage, queue_key, QueueRecord)


def queue_retired(stage: Readable, incarnation: int) -> bool:
    """Whether a queue incarnation is deleted and its rows are being reclaimed: its `i` row names its
    `X` row (processors/reclamation.py)."""
    resource_key = stage.get(keys.resource_key(incarnation))
    return resource_key is not None and resource_key[:1] == keys.RETIRED


def queue_deleted(stage: Readable, domain: str, name: str, incarnation: int) -> bool:
    """Whether the queue incarnation `domain`/`name` was deleted: retired, or reclaimed so far that
    it has no `i` row left while its name is free or holds a later incarnation. (A live queue that
    lost its `i` row is not deleted: it is corruption.) Rows that outlive their queue (retention
    tasks: the object store's deletion waits for the recovery floor) ask this before taking a
    missing queue, message or identity for corruption."""
    if stage.get(keys.resource_key(incarnation)) is not None:
        return queue_retired(stage, incarnation)
    raw = stage.get(keys.queue(domain, name))
    return raw is None or QueueRecord.decode(raw).view.incarnation != incarnation


def save_queue(stage: Staged, record: QueueRecord) -> None:
    """Store the queue record, first bringing its entry in the due index up to date."""
    stored = refreshed_due(stage, record)
    save(stage, keys.queue(stored.view.domain, stored.view.queue), stored)


def load_message(stage: Staged, queue_id: int, message_id: str) -> MessageMeta | None:
    return load(stage, keys.message(queue_id, message_id), MessageMeta)


def save_message(stage: Staged, queue_id: int, message_id: str, meta: MessageMeta) -> None:
    save(stage, keys.message(queue_id, message_id), meta)


def add_index_row(stage: Staged, key: bytes, message_id: str) -> None:
    stage.put(key, message_id.encode("utf-8"))


def remove_index_row(stage: Staged, key: bytes, message_id: str) -> None:
    """Delete an index row that must exist and name `message_id`; anything else is corruption."""
    if stage.get(key) != message_id.encode("utf-8"):
        raise Corruption(f"index row {key.hex()} is missing or names another message")
    stage.delete(key)


# Timers are shared by queues and subscription groups: a record with timers keeps
# `view.incarnation`, `timer_floor` and `next_timer_ms`, and the functions below keep
# its timer rows, its due-index entry and the partition's next due time consistent.
# The records are frozen: each returns the record as it now is.


def with_timer(stage: Staged, record: TimedRecord, due_ms: int, kind: int, sequence: int, value: str) -> TimedRecord:
    """Add a timer: the record with its timer floor kept at or below every timer's due time."""
    key = keys.timer(record.view.incarnation, due_ms, kind, sequence)
    add_index_row(stage, key, value)
    position = key[len(keys.timer_prefix(0)) :]
    floor = record.timer_floor
    if floor is not None and floor <= position:
        return record
    return replace(record, timer_floor=position)


def timers_from_floor(stage: Staged, record: TimedRecord) -> Iterator[tuple[bytes, bytes]]:
    """The record's timers in due order, seeking past the deleted ones in front of its floor.

    Index rows are deleted from the front as a queue works through them; RocksDB
    keeps their tombstones for a while, so a scan from the prefix start would step
    over every one. Each index keeps a floor below which no row exists.
    """
    if record.timer_floor is None:
        return iter(())
    prefix = keys.timer_prefix(record.view.incarnation)
    return stage.scan(prefix + record.timer_floor, keys.prefix_end(prefix))


def due_timers(stage: Staged, record: TimedRecord, now_ms: int, budget: int) -> list[tuple[bytes, bytes]]:
    """The record's timers due by `now_ms`, earliest first, at most `budget` of them."""
    due: list[tuple[bytes, bytes]] = []
    for key, value in timers_from_floor(stage, record):
        if len(due) == budget or keys.parse_timer(key)[0] > now_ms:
            break
        due.append((key, value))
    return due


def refreshed_due(stage: Staged, record: TimedRecord) -> TimedRecord:
    """Keep the record's due-index entry at its earliest timer, and the partition's next due time:
    the record with its timer floor and next timer time brought up to date."""
    first = next(timers_from_floor(stage, record), None)
    earliest = None if first is None else keys.parse_timer(first[0])[0]
    # The floor is the first timer's whole position (due, kind, sequence): many timers
    # share a due time, and a floor of only the time would walk the deleted ones again.
    floor = None if first is None else first[0][len(keys.timer_prefix(0)) :]
    previous = record.next_timer_ms
    if earliest != previous:
        move_due_entry(stage, record.view.incarnation, previous, earliest)
    if floor == record.timer_floor and earliest == previous:
        return record
    return replace(record, timer_floor=floor, next_timer_ms=earliest)


def move_due_entry(stage: Staged, resource_id: int, previous: int | None, earliest: int | None) -> None:
    """Move a resource's due-index entry from `previous` to `earliest`, and recompute the
    partition's next due time, the due time of the index's first entry.

    The index is read only when the entry moved away from that first due time to a later one (or
    out): the first entry may then be another resource's at the same time, or any later one. In
    every other move the next due time follows from the old one: an entry moved to it or in front
    of it is the new first, and an entry moved behind it (or added, or taken out) leaves it first."""
    if previous is not None:
        stage.delete(keys.due_queue(previous, resource_id))
    if earliest is not None:
        stage.put(keys.due_queue(earliest, resource_id), b"")
    current = next_due_ms(stage)
    if earliest is not None and (current is None or earliest <= current):
        stage.put(keys.NEXT_DUE, keys.u64(earliest))
        return
    if current is not None and (previous is None or previous > current):
        return
    # The partition's earliest is at or after the smaller of its old value and this queue's new one.
    candidates = [t for t in (current, earliest) if t is not None]
    start = keys.due_queue(min(candidates), 0) if candidates else keys.DUE_QUEUE
    first_due = stage.first(start, keys.prefix_end(keys.DUE_QUEUE))
    if first_due is None:
        stage.delete(keys.NEXT_DUE)
    else:
        stage.put(keys.NEXT_DUE, keys.u64(keys.parse_due_queue(first_due[0])[0]))


def next_due_ms(stage: Readable) -> int | None:
    """The earliest timer of the partition: one read, so checking it costs every record little."""
    raw = stage.get(keys.NEXT_DUE)
    return None if raw is None else keys.read_u64(raw)


def has_dead_letter_room(queue: QueueView, body_bytes: int) -> bool:
    """Whether the dead-letter sublimits hold one more message of `body_bytes` (null limits
    inheriting the stored grant)."""
    policy, counters = queue.policy, queue.counters
    messages, size = policy.max_dead_letter_messages, policy.max_dead_letter_bytes
    max_messages = policy.max_stored_messages if messages is None else messages
    max_bytes = policy.max_stored_bytes if size is None else size
    return counters.dead_lettered + 1 <= max_messages and counters.dead_letter_bytes + body_bytes <= max_bytes
