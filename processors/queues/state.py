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
from keyload.log.codec import Record
from keyload.processors.counters import adjusted
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.projections import keys
from keyload.projections.records import GroupRecord, MessageMeta, QueuePolicy, QueueRecord, load, save
from keyload.projections.store import Readable, Staged

QUEUE_RECORD = QueueRecord.SCHEMA
MESSAGE_META = MessageMeta.SCHEMA

TimedRecord = TypeVar("TimedRecord", QueueRecord, GroupRecord)
"""A typed record with timers and waiters: a queue's or a subscription group's."""

LIVE_STATES = ("scheduled", "ready", "leased", "dead_lettered", "pending_dead_letter")
TERMINAL_TOTALS = {"acked": "acked_total", "expired": "expired_total", "cancelled": "cancelled_total"}


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


def view(record: Record) -> Record:
    """The client-visible part of a stored queue or topic record."""
    result: Record = record["view"]
    return result


def load_queue(stage: Staged, domain: str, name: str) -> Record:
    check_name("queue name", name, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    record = stage.get_record(keys.queue(domain, name), QUEUE_RECORD)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "queue does not exist")
    return record


def load_queue_by_id(stage: Staged, queue_id: int) -> Record | None:
    """The queue with this incarnation; None when there is none (the id may name a topic or a group)."""
    queue_key = stage.get(keys.resource_key(queue_id))
    if queue_key is None or queue_key[:1] != keys.QUEUE:
        return None
    return stage.get_record(queue_key, QUEUE_RECORD)


def save_queue(stage: Staged, record: Record) -> None:
    """Store the queue record, first bringing its entry in the due index up to date."""
    refresh_due(stage, record)
    queue = record["view"]
    stage.put_record(keys.queue(queue["domain"], queue["queue"]), QUEUE_RECORD, record)


def load_message(stage: Staged, queue_id: int, message_id: str) -> Record | None:
    return stage.get_record(keys.message(queue_id, message_id), MESSAGE_META)


def save_message(stage: Staged, queue_id: int, message_id: str, meta: Record) -> None:
    stage.put_record(keys.message(queue_id, message_id), MESSAGE_META, meta)


# The typed forms (projections/records.py). Handlers still on the dict forms above
# (the lifecycle and what shares it with payloads and groups) keep those.


def load_queue_record(stage: Staged, domain: str, name: str) -> QueueRecord:
    """`load_queue` as a typed record."""
    check_name("queue name", name, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    record = load(stage, keys.queue(domain, name), QueueRecord)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "queue does not exist")
    return record


def save_queue_record(stage: Staged, record: QueueRecord) -> QueueRecord:
    """`save_queue` of a typed record; the record as stored (its due-index fields brought up to date)."""
    stored = refreshed_due(stage, record)
    save(stage, keys.queue(stored.view.domain, stored.view.queue), stored)
    return stored


def load_meta(stage: Staged, queue_id: int, message_id: str) -> MessageMeta | None:
    """`load_message` as a typed record."""
    return load(stage, keys.message(queue_id, message_id), MessageMeta)


def save_meta(stage: Staged, queue_id: int, message_id: str, meta: MessageMeta) -> None:
    save(stage, keys.message(queue_id, message_id), meta)


def adjust(counters: Record, name: str, delta: int) -> None:
    """Change an authoritative counter; going negative means the projection is corrupt."""
    counters[name] = adjusted(name, counters[name], delta)


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


def add_timer_row(stage: Staged, record: Record, due_ms: int, kind: int, sequence: int, value: str) -> None:
    """Add a timer, keeping the record's timer floor at or below every timer's due time."""
    key = keys.timer(record["view"]["incarnation"], due_ms, kind, sequence)
    add_index_row(stage, key, value)
    position = key[len(keys.timer_prefix(0)) :]
    floor = record["timer_floor"]
    record["timer_floor"] = position if floor is None else min(floor, position)


def with_timer(stage: Staged, record: TimedRecord, due_ms: int, kind: int, sequence: int, value: str) -> TimedRecord:
    """`add_timer_row` of a typed record: the record with its timer floor kept at or below the new timer."""
    key = keys.timer(record.view.incarnation, due_ms, kind, sequence)
    add_index_row(stage, key, value)
    position = key[len(keys.timer_prefix(0)) :]
    floor = record.timer_floor
    if floor is not None and floor <= position:
        return record
    return replace(record, timer_floor=position)


def _timer_floor(record: Record | TimedRecord) -> tuple[int, bytes | None]:
    """(incarnation, timer floor) of a record with timers, dict or typed."""
    if isinstance(record, dict):
        return record["view"]["incarnation"], record["timer_floor"]
    return record.view.incarnation, record.timer_floor


def timers_from_floor(stage: Staged, record: Record | TimedRecord) -> Iterator[tuple[bytes, bytes]]:
    """The queue's timers in due order, seeking past the deleted ones in front of its floor.

    Index rows are deleted from the front as a queue works through them; RocksDB
    keeps their tombstones for a while, so a scan from the prefix start would step
    over every one. Each index keeps a floor below which no row exists.
    """
    incarnation, floor = _timer_floor(record)
    if floor is None:
        return iter(())
    prefix = keys.timer_prefix(incarnation)
    return stage.scan(prefix + floor, keys.prefix_end(prefix))


def due_timers(stage: Staged, record: Record | TimedRecord, now_ms: int, budget: int) -> list[tuple[bytes, bytes]]:
    """The record's timers due by `now_ms`, earliest first, at most `budget` of them."""
    due: list[tuple[bytes, bytes]] = []
    for key, value in timers_from_floor(stage, record):
        if len(due) == budget or keys.parse_timer(key)[0] > now_ms:
            break
        due.append((key, value))
    return due


def refresh_due(stage: Staged, record: Record) -> None:
    """Keep the record's due-index entry at its earliest timer, and the partition's next due time."""
    floor, earliest = _refresh_due(stage, record, record["view"]["incarnation"], record["next_timer_ms"])
    record["timer_floor"] = floor
    record["next_timer_ms"] = earliest


def refreshed_due(stage: Staged, record: TimedRecord) -> TimedRecord:
    """`refresh_due` of a typed record: the record with its timer floor and next timer time updated."""
    floor, earliest = _refresh_due(stage, record, record.view.incarnation, record.next_timer_ms)
    if floor == record.timer_floor and earliest == record.next_timer_ms:
        return record
    return replace(record, timer_floor=floor, next_timer_ms=earliest)


def _refresh_due(
    stage: Staged, record: Record | TimedRecord, queue_id: int, previous: int | None
) -> tuple[bytes | None, int | None]:
    """Bring the due index up to date for a record whose next timer time was `previous`:
    its new (timer floor, next timer time)."""
    first = next(timers_from_floor(stage, record), None)
    earliest = None if first is None else keys.parse_timer(first[0])[0]
    # The floor is the first timer's whole position (due, kind, sequence): many timers
    # share a due time, and a floor of only the time would walk the deleted ones again.
    floor = None if first is None else first[0][len(keys.timer_prefix(0)) :]
    if earliest == previous:
        return floor, earliest
    if previous is not None:
        stage.delete(keys.due_queue(previous, queue_id))
    if earliest is not None:
        stage.put(keys.due_queue(earliest, queue_id), b"")
    # The partition's earliest is at or after the smaller of its old value and this queue's new one.
    candidates = [t for t in (next_due_ms(stage), earliest) if t is not None]
    start = keys.due_queue(min(candidates), 0) if candidates else keys.DUE_QUEUE
    first_due = stage.first(start, keys.prefix_end(keys.DUE_QUEUE))
    if first_due is None:
        stage.delete(keys.NEXT_DUE)
    else:
        stage.put(keys.NEXT_DUE, keys.u64(keys.parse_due_queue(first_due[0])[0]))
    return floor, earliest


def next_due_ms(stage: Readable) -> int | None:
    """The earliest timer of the partition: one read, so checking it costs every record little."""
    raw = stage.get(keys.NEXT_DUE)
    return None if raw is None else keys.read_u64(raw)


def dead_letter_limits(policy: Record | QueuePolicy) -> tuple[int, int]:
    """The dead-letter sublimits, null inheriting the stored grant."""
    if isinstance(policy, QueuePolicy):
        return (
            policy.max_stored_messages if policy.max_dead_letter_messages is None else policy.max_dead_letter_messages,
            policy.max_stored_bytes if policy.max_dead_letter_bytes is None else policy.max_dead_letter_bytes,
        )
    messages = policy["max_dead_letter_messages"]
    size = policy["max_dead_letter_bytes"]
    return (
        policy["max_stored_messages"] if messages is None else messages,
        policy["max_stored_bytes"] if size is None else size,
    )
