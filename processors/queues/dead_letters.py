"""Operator commands on dead letters and other stuck messages: redrive, cancel, park, list.

Each names the message's state version and delivery generation as the operator
last saw them (RevisionConflict otherwise), so an operator never acts on a
message that moved meanwhile. Terminal states never come back.
"""

from __future__ import annotations

from keyload import limits
from keyload.log.codec import Record
from keyload.processors import validation
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.queues.lifecycle import add_expiry, enter, expired, leave
from keyload.processors.queues.state import (
    LIVE_STATES,
    check_message_id,
    dead_letter_limits,
    load_message,
    load_queue,
    load_queue_record,
    result_item_bytes,
    save_queue,
)
from keyload.projections import keys
from keyload.projections.store import Staged

DEAD_STATES = ("dead_lettered", "pending_dead_letter")


def _fenced(stage: Staged, body: Record, ctx: Context, kind: str) -> tuple[Record, str, Record]:
    """(queue record, message id, metadata) of the live message a `kind` command (Redrive, Cancel,
    ParkPending) names, as the operator last saw it."""
    for fence in ("expected_state_version", "expected_delivery_generation"):
        validation.check_integer(f"{kind}.{fence}", body[fence])
    record = load_queue(stage, ctx.domain, body["queue"])
    message_id = body["message_id"]
    check_message_id(message_id)
    meta = load_message(stage, record["view"]["incarnation"], message_id)
    if meta is None:
        raise Rejected(ErrorCode.NOT_FOUND, "message does not exist")
    if (meta["state_version"], meta["delivery_generation"]) != (
        body["expected_state_version"],
        body["expected_delivery_generation"],
    ):
        raise Rejected(ErrorCode.REVISION_CONFLICT, "the message changed since the expected version")
    if meta["state"] not in LIVE_STATES:
        raise Rejected(ErrorCode.CONFLICT, "the message is in a terminal state")
    return record, message_id, meta


def _view(record: Record, message_id: str, meta: Record) -> Record:
    return {"queue": record["view"]["queue"], "message_id": message_id, "meta": meta, "body": None}


def redrive(stage: Staged, body: Record, ctx: Context) -> Record:
    """A dead letter goes back to ready with fresh attempts and a new generation (old tokens go stale)."""
    record, message_id, meta = _fenced(stage, body, ctx, "Redrive")
    if meta["state"] not in DEAD_STATES:
        raise Rejected(ErrorCode.CONFLICT, "only dead-lettered or pending messages can be redriven")
    if expired(meta, ctx.now_ms):
        raise Rejected(ErrorCode.CONFLICT, "the message is past its expiry")
    leave(stage, record, message_id, meta)
    meta["attempts"] = 0
    meta["delivery_generation"] += 1
    enter(stage, record, message_id, meta, "ready", ctx)
    add_expiry(stage, record, message_id, meta)
    save_queue(stage, record)
    return _view(record, message_id, meta)


def cancel(stage: Staged, body: Record, ctx: Context) -> Record:
    record, message_id, meta = _fenced(stage, body, ctx, "Cancel")
    leave(stage, record, message_id, meta)
    enter(stage, record, message_id, meta, "cancelled", ctx)
    save_queue(stage, record)
    return _view(record, message_id, meta)


def park_pending(stage: Staged, body: Record, ctx: Context) -> Record:
    record, message_id, meta = _fenced(stage, body, ctx, "ParkPending")
    if meta["state"] != "pending_dead_letter":
        raise Rejected(ErrorCode.CONFLICT, "only pending dead letters can be parked")
    counters = record["view"]["counters"]
    max_messages, max_bytes = dead_letter_limits(record["view"]["policy"])
    if counters["dead_lettered"] + 1 > max_messages or counters["dead_letter_bytes"] + meta["body_bytes"] > max_bytes:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, "the dead-letter sublimit is full")
    leave(stage, record, message_id, meta)
    enter(stage, record, message_id, meta, "dead_lettered", ctx)
    save_queue(stage, record)
    return _view(record, message_id, meta)


def list_dead_letters(stage: Staged, body: Record, ctx: Context) -> Record:
    """A page of dead-lettered messages in parked order, after `after_sequence`."""
    queue = load_queue_record(stage, ctx.domain, body["queue"]).view
    limit = body["limit"]
    if not 1 <= limit <= limits.MAX_DEAD_LETTER_PAGE:
        raise Rejected(ErrorCode.VALIDATION, f"limit must be between 1 and {limits.MAX_DEAD_LETTER_PAGE}")
    queue_id = queue.incarnation
    if body["after_sequence"] is not None:
        validation.check_integer("ListDeadLetters.after_sequence", body["after_sequence"])
    after = body["after_sequence"] or 0
    start = keys.dead_letter(queue_id, after + 1)
    end = keys.prefix_end(keys.DEAD_LETTER + keys.u64(queue_id))
    messages: list[Record] = []
    last = None
    more = False
    result_bytes = 0
    for key, value in stage.scan(start, end):
        if len(messages) == limit:
            more = True  # there is at least one more after this page
            break
        message_id = value.decode("utf-8")
        # Read as a dict: the page's metas go into the result as they are stored, one per row.
        meta = load_message(stage, queue_id, message_id)
        if meta is None or meta["state"] != "dead_lettered":
            raise Corruption("the dead-letter index names a message that is not dead-lettered")
        body_bytes = meta["body_bytes"] if body["include_body"] else 0
        result_bytes += result_item_bytes(body_bytes, meta["headers"], message_id, meta["ordering_key"])
        if messages and result_bytes > limits.RESULT_BYTES_BUDGET:
            more = True  # the page would not fit one outcome: the rest comes on the next page
            break
        payload = stage.get(keys.body(queue_id, message_id)) if body["include_body"] else None
        messages.append({"queue": queue.queue, "message_id": message_id, "meta": meta, "body": payload})
        last = keys.read_u64(key, 9)
    return {"messages": messages, "next_after_sequence": last if more else None}
