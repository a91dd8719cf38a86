"""Work queues: create/configure, enqueue, inspect, and the timers that move messages on.

State layout (projections/keys.py): the queue record carries policy, counters
and sequence allocators; each message has metadata and a separate body; ready
messages sit in a FIFO index by ready sequence; every pending timer (not-before,
expiry, and lease expiry later) is a key ordered by due time within its queue,
and each queue with timers has one entry in a partition-wide due index so a
Tick finds due work without scanning idle queues.
"""

from __future__ import annotations

from typing import Any

from keyload.projections import keys
from keyload.projections.store import Readable, Staged

from . import limits
from .context import Context
from .errors import Corruption, ErrorCode, Rejected
from .policy import resolve_policy

Record = dict[str, Any]

QUEUE_RECORD = "keyload.QueueRecord"
MESSAGE_META = "keyload.MessageMeta"

LIVE_STATES = ("scheduled", "ready", "leased", "dead_lettered", "pending_dead_letter")
ORDERING_FIELDS = ("ordering", "parked_head")

_ZERO_COUNTERS = {
    "stored_messages": 0,
    "stored_bytes": 0,
    "scheduled": 0,
    "ready": 0,
    "leased": 0,
    "dead_lettered": 0,
    "pending_dead_letter": 0,
    "dead_letter_bytes": 0,
    "enqueued_total": 0,
    "acked_total": 0,
    "expired_total": 0,
    "cancelled_total": 0,
}


# -- records ---------------------------------------------------------------------------


def load_queue(stage: Staged, domain: str, name: str) -> Record:
    check_name("queue name", name, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    record = stage.get_record(keys.queue(domain, name), QUEUE_RECORD)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "queue does not exist")
    return record


def save_queue(stage: Staged, record: Record) -> None:
    queue = record["view"]
    stage.put_record(keys.queue(queue["domain"], queue["queue"]), QUEUE_RECORD, record)


def load_message(stage: Staged, queue_id: int, message_id: str) -> Record | None:
    return stage.get_record(keys.message(queue_id, message_id), MESSAGE_META)


def save_message(stage: Staged, queue_id: int, message_id: str, meta: Record) -> None:
    stage.put_record(keys.message(queue_id, message_id), MESSAGE_META, meta)


def adjust(counters: Record, name: str, delta: int) -> None:
    """Change an authoritative counter; going negative means the projection is corrupt."""
    value = counters[name] + delta
    if value < 0:
        raise Corruption(f"counter {name} would become {value}")
    counters[name] = value


# -- validation ------------------------------------------------------------------------


def check_name(kind: str, value: str, max_chars: int, pattern: Any) -> None:
    if not 1 <= len(value) <= max_chars or not pattern.fullmatch(value):
        raise Rejected(
            ErrorCode.VALIDATION,
            f"{kind} must be 1..{max_chars} characters matching {pattern.pattern}",
        )


def _check_headers(headers: dict[str, str]) -> int:
    if len(headers) > limits.MAX_HEADERS:
        raise Rejected(ErrorCode.VALIDATION, f"at most {limits.MAX_HEADERS} headers")
    size = 0
    for name, value in headers.items():
        check_name("header name", name, limits.MAX_HEADER_NAME_CHARS, limits.HEADER_NAME_PATTERN)
        size += len(name.encode("utf-8")) + len(value.encode("utf-8"))
    if size > limits.MAX_HEADERS_BYTES:
        raise Rejected(ErrorCode.VALIDATION, f"headers exceed {limits.MAX_HEADERS_BYTES} bytes")
    return size


# -- timers ----------------------------------------------------------------------------


def _add_timer(stage: Staged, queue_id: int, due_ms: int, kind: int, meta: Record, message_id: str) -> None:
    stage.put(keys.timer(queue_id, due_ms, kind, meta["enqueue_sequence"]), message_id.encode("utf-8"))


def _refresh_due(stage: Staged, record: Record) -> None:
    """Keep the queue's entry in the partition-wide due index at its earliest timer."""
    queue_id = record["view"]["incarnation"]
    prefix = keys.timer_prefix(queue_id)
    first = stage.first(prefix, keys.prefix_end(prefix))
    earliest = None if first is None else keys.parse_timer(first[0])[0]
    previous = record["next_timer_ms"]
    if earliest == previous:
        return
    if previous is not None:
        stage.delete(keys.due_queue(previous, queue_id))
    if earliest is not None:
        stage.put(keys.due_queue(earliest, queue_id), b"")
    record["next_timer_ms"] = earliest
    first_due = stage.first(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))
    if first_due is None:
        stage.delete(keys.NEXT_DUE)
    else:
        stage.put(keys.NEXT_DUE, keys.u64(keys.parse_due_queue(first_due[0])[0]))


def next_due_ms(stage: Readable) -> int | None:
    """The earliest timer of the partition: one read, so checking it costs every record little."""
    raw = stage.get(keys.NEXT_DUE)
    return None if raw is None else keys.read_u64(raw)


def _make_ready(stage: Staged, record: Record, message_id: str, meta: Record) -> None:
    sequence = record["next_ready_sequence"]
    record["next_ready_sequence"] = sequence + 1
    meta["state"] = "ready"
    meta["ready_sequence"] = sequence
    stage.put(keys.ready(record["view"]["incarnation"], sequence), message_id.encode("utf-8"))
    adjust(record["view"]["counters"], "ready", 1)


def _expire(stage: Staged, record: Record, message_id: str, meta: Record, now_ms: int) -> None:
    """A scheduled or ready message passes its expiry: its body and quota are released."""
    queue_id = record["view"]["incarnation"]
    counters = record["view"]["counters"]
    if meta["state"] == "scheduled":
        index = keys.timer(queue_id, meta["not_before_ms"], keys.TIMER_NOT_BEFORE, meta["enqueue_sequence"])
    else:
        index = keys.ready(queue_id, meta["ready_sequence"])
    remove_index_row(stage, index, message_id)
    adjust(counters, meta["state"], -1)
    adjust(counters, "stored_messages", -1)
    adjust(counters, "stored_bytes", -meta["body_bytes"])
    adjust(counters, "expired_total", 1)
    stage.delete(keys.body(queue_id, message_id))
    meta["state"] = "expired"
    meta["ready_sequence"] = None
    meta["terminal_at_ms"] = now_ms


def remove_index_row(stage: Staged, key: bytes, message_id: str) -> None:
    """Delete an index row that must exist and name `message_id`; anything else is corruption."""
    if stage.get(key) != message_id.encode("utf-8"):
        raise Corruption(f"index row {key.hex()} is missing or names another message")
    stage.delete(key)


def fire_due_timers(stage: Staged, record: Record, now_ms: int, budget: int) -> tuple[int, int]:
    """Fire the queue's timers due at `now_ms`, examining at most `budget` of them.

    Returns (timers examined, state transitions). Every examined timer is consumed;
    one whose message has since moved on is a no-op.
    """
    assert budget >= 0
    queue_id = record["view"]["incarnation"]
    prefix = keys.timer_prefix(queue_id)
    due = list(_take_due(stage, prefix, now_ms, budget))
    transitions = 0
    for key, value in due:
        _, kind, _ = keys.parse_timer(key)
        stage.delete(key)
        message_id = value.decode("utf-8")
        meta = load_message(stage, queue_id, message_id)
        if meta is None:
            raise Corruption(f"timer {key.hex()} names a missing message")
        if kind == keys.TIMER_NOT_BEFORE and meta["state"] == "scheduled":
            adjust(record["view"]["counters"], "scheduled", -1)
            _make_ready(stage, record, message_id, meta)
        elif kind == keys.TIMER_EXPIRY and meta["state"] in ("scheduled", "ready"):
            _expire(stage, record, message_id, meta, now_ms)
        else:
            continue
        meta["state_version"] += 1
        save_message(stage, queue_id, message_id, meta)
        transitions += 1
    if due:
        _refresh_due(stage, record)
    return len(due), transitions


def _take_due(stage: Staged, prefix: bytes, now_ms: int, budget: int) -> list[tuple[bytes, bytes]]:
    taken: list[tuple[bytes, bytes]] = []
    if budget == 0:
        return taken
    for key, value in stage.scan(prefix, keys.prefix_end(prefix)):
        if keys.parse_timer(key)[0] > now_ms:
            break
        taken.append((key, value))
        if len(taken) == budget:
            break
    return taken


# -- commands --------------------------------------------------------------------------


def view(record: Record) -> Record:
    result: Record = record["view"]
    return result


def create_queue(stage: Staged, body: Record, ctx: Context) -> Record:
    name = body["queue"]
    check_name("queue name", name, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    policy = resolve_policy(body["policy"])
    if stage.get(keys.queue(ctx.domain, name)) is not None:
        raise Rejected(ErrorCode.CONFLICT, "queue already exists")
    raw_next = stage.get(keys.NEXT_QUEUE_ID)
    queue_id = 1 if raw_next is None else keys.read_u64(raw_next)
    stage.put(keys.NEXT_QUEUE_ID, keys.u64(queue_id + 1))
    stage.put(keys.queue_key(queue_id), keys.queue(ctx.domain, name))
    record: Record = {
        "view": {
            "domain": ctx.domain,
            "queue": name,
            "incarnation": queue_id,
            "created_at_ms": ctx.now_ms,
            "policy_version": 1,
            "policy": policy,
            "counters": dict(_ZERO_COUNTERS),
        },
        "next_enqueue_sequence": 1,
        "next_ready_sequence": 1,
        "next_parked_sequence": 1,
        "next_timer_ms": None,
    }
    save_queue(stage, record)
    return view(record)


def configure_queue(stage: Staged, body: Record, ctx: Context) -> Record:
    record = load_queue(stage, ctx.domain, body["queue"])
    current = record["view"]
    expected = body["expected_policy_version"]
    if expected is not None and expected != current["policy_version"]:
        raise Rejected(
            ErrorCode.REVISION_CONFLICT,
            f"policy version is {current['policy_version']}, expected {expected}",
        )
    policy = resolve_policy(body["policy"])
    if current["counters"]["stored_messages"] > 0:
        for name in ORDERING_FIELDS:
            if policy[name] != current["policy"][name]:
                raise Rejected(
                    ErrorCode.CONFLICT,
                    f"policy.{name} cannot change while the queue holds messages",
                )
    current["policy"] = policy
    current["policy_version"] += 1
    save_queue(stage, record)
    return view(record)


def enqueue(stage: Staged, body: Record, ctx: Context) -> Record:
    record = load_queue(stage, ctx.domain, body["queue"])
    queue = record["view"]
    message_id = body["message_id"]
    check_name("message id", message_id, limits.MAX_MESSAGE_ID_CHARS, limits.ID_PATTERN)
    payload: bytes = body["body"]
    if len(payload) > limits.MAX_INLINE_BODY_BYTES:
        raise Rejected(ErrorCode.VALIDATION, f"body exceeds {limits.MAX_INLINE_BODY_BYTES} bytes")
    _check_headers(body["headers"])
    ordering_key = body["ordering_key"]
    if ordering_key is not None:
        check_name("ordering key", ordering_key, limits.MAX_ORDERING_KEY_CHARS, limits.ID_PATTERN)
    not_before, expires_at = body["not_before_ms"], body["expires_at_ms"]
    if not_before is not None and not_before > ctx.now_ms + limits.MAX_SCHEDULE_AHEAD_MS:
        raise Rejected(ErrorCode.VALIDATION, "not_before_ms is more than 365 days ahead")
    if expires_at is not None:
        if expires_at <= ctx.now_ms:
            raise Rejected(ErrorCode.VALIDATION, "expires_at_ms is not in the future")
        if not_before is not None and expires_at <= not_before:
            raise Rejected(ErrorCode.VALIDATION, "expires_at_ms must be after not_before_ms")
    queue_id = queue["incarnation"]
    if stage.get(keys.message(queue_id, message_id)) is not None:
        raise Rejected(ErrorCode.CONFLICT, "message id is already used in this queue")
    counters, policy = queue["counters"], queue["policy"]
    if counters["stored_messages"] + 1 > policy["max_stored_messages"]:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, "queue is at max_stored_messages")
    if counters["stored_bytes"] + len(payload) > policy["max_stored_bytes"]:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, "queue is at max_stored_bytes")

    sequence = record["next_enqueue_sequence"]
    record["next_enqueue_sequence"] = sequence + 1
    scheduled = not_before is not None and not_before > ctx.now_ms
    meta: Record = {
        "state": "scheduled",
        "state_version": 1,
        "attempts": 0,
        "lease_version": 0,
        "delivery_generation": 1,
        "enqueue_sequence": sequence,
        "ready_sequence": None,
        "parked_sequence": None,
        "enqueued_at_ms": ctx.now_ms,
        "not_before_ms": not_before,
        "expires_at_ms": expires_at,
        "lease_owner": None,
        "lease_until_ms": None,
        "body_bytes": len(payload),
        "headers": dict(sorted(body["headers"].items())),
        "ordering_key": ordering_key,
        "terminal_at_ms": None,
    }
    if scheduled:
        adjust(counters, "scheduled", 1)
        _add_timer(stage, queue_id, not_before, keys.TIMER_NOT_BEFORE, meta, message_id)
    else:
        _make_ready(stage, record, message_id, meta)
    if expires_at is not None:
        _add_timer(stage, queue_id, expires_at, keys.TIMER_EXPIRY, meta, message_id)
    if scheduled or expires_at is not None:
        _refresh_due(stage, record)
    adjust(counters, "stored_messages", 1)
    adjust(counters, "stored_bytes", len(payload))
    adjust(counters, "enqueued_total", 1)
    stage.put(keys.body(queue_id, message_id), payload)
    save_message(stage, queue_id, message_id, meta)
    save_queue(stage, record)
    return {
        "queue": queue["queue"],
        "message_id": message_id,
        "state": meta["state"],
        "enqueue_sequence": sequence,
        "stored_messages": counters["stored_messages"],
        "stored_bytes": counters["stored_bytes"],
    }


def inspect_queue(stage: Staged, body: Record, ctx: Context) -> Record:
    return view(load_queue(stage, ctx.domain, body["queue"]))


def inspect_message(stage: Staged, body: Record, ctx: Context) -> Record:
    record = load_queue(stage, ctx.domain, body["queue"])
    queue_id = record["view"]["incarnation"]
    check_name("message id", body["message_id"], limits.MAX_MESSAGE_ID_CHARS, limits.ID_PATTERN)
    meta = load_message(stage, queue_id, body["message_id"])
    if meta is None:
        raise Rejected(ErrorCode.NOT_FOUND, "message does not exist")
    payload = stage.get(keys.body(queue_id, body["message_id"])) if body["include_body"] else None
    if meta["state"] in LIVE_STATES and payload is None and body["include_body"]:
        raise Corruption(f"live message {meta['enqueue_sequence']} of queue {queue_id} has no body")
    return {"queue": body["queue"], "message_id": body["message_id"], "meta": meta, "body": payload}


def fire_due(stage: Staged, now_ms: int) -> Record:
    """Fire due timers across the partition's queues, earliest first, within one budget.

    Runs before every record is applied, so log time reaching a timer's due time is
    what fires it; a Tick command is just a record that does nothing else.
    """
    budget = limits.TICK_EXAMINATION_BUDGET
    examined = transitions = 0
    while examined < budget:
        next_due = next_due_ms(stage)
        if next_due is None or next_due > now_ms:
            break
        first = stage.first(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))
        if first is None or keys.parse_due_queue(first[0])[0] != next_due:
            raise Corruption("the partition's next due time disagrees with its due index")
        due_ms, queue_id = keys.parse_due_queue(first[0])
        queue_key = stage.get(keys.queue_key(queue_id))
        record = None if queue_key is None else stage.get_record(queue_key, QUEUE_RECORD)
        if record is None:
            raise Corruption(f"due index names missing queue {queue_id}")
        if record["next_timer_ms"] != due_ms:
            raise Corruption(f"due index of queue {queue_id} disagrees with its record")
        seen, moved = fire_due_timers(stage, record, now_ms, budget - examined)
        if seen == 0:
            raise Corruption(f"due index of queue {queue_id} names no due timer")
        examined += seen
        transitions += moved
        save_queue(stage, record)
    return {"transitions": transitions, "budget_exhausted": examined >= budget, "next_due_ms": next_due_ms(stage)}
