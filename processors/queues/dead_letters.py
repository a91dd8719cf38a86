"""Operator commands on dead letters and other stuck messages: redrive, cancel, park, list.

Each names the message's state version and delivery generation as the operator
last saw them (RevisionConflict otherwise), so an operator never acts on a
message that moved meanwhile (from feature level 4: within the domain's receipt
horizon, after which a finished message's id can name a new message, restarting
at version 1). Terminal states never come back.
"""

from __future__ import annotations

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import Cancel, FencedMessageCommand, ListDeadLetters, ParkPending, Redrive
from keyload.log.codec import Record
from keyload.processors import validation
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.queues.lifecycle import add_expiry, enter, expired, leave
from keyload.processors.queues.state import (
    DEAD_STATES,
    LIVE_STATES,
    Working,
    check_message_id,
    has_dead_letter_room,
    load_message,
    load_queue,
    result_item_bytes,
    save_queue,
)
from keyload.projections import keys
from keyload.projections.records import MessageMeta, MessageState, QueueView
from keyload.projections.store import Staged


def _fenced(stage: Staged, body: FencedMessageCommand, ctx: Context) -> tuple[Working, str, MessageMeta]:
    """(queue, message id, metadata) of the live message a fenced command (Redrive, Cancel,
    ParkPending) names, as the operator last saw it."""
    kind = type(body).__name__
    validation.check_integer(f"{kind}.expected_state_version", body.expected_state_version)
    validation.check_integer(f"{kind}.expected_delivery_generation", body.expected_delivery_generation)
    work = Working(load_queue(stage, ctx.domain, body.queue))
    message_id = body.message_id
    check_message_id(message_id)
    meta = load_message(stage, work.view.incarnation, message_id)
    if meta is None:
        raise Rejected(ErrorCode.NOT_FOUND, "message does not exist")
    if (meta.state_version, meta.delivery_generation) != (
        body.expected_state_version,
        body.expected_delivery_generation,
    ):
        raise Rejected(ErrorCode.REVISION_CONFLICT, "the message changed since the expected version")
    if meta.state not in LIVE_STATES:
        raise Rejected(ErrorCode.CONFLICT, "the message is in a terminal state")
    return work, message_id, meta


def _view(queue: QueueView, message_id: str, meta: MessageMeta) -> Record:
    return {"queue": queue.queue, "message_id": message_id, "meta": meta.to_avro(), "body": None}


def redrive(stage: Staged, body: Redrive, ctx: Context) -> Record:
    """A dead letter goes back to ready with fresh attempts and a new generation (old tokens go stale)."""
    work, message_id, meta = _fenced(stage, body, ctx)
    if meta.state not in DEAD_STATES:
        raise Rejected(ErrorCode.CONFLICT, "only dead-lettered or pending messages can be redriven")
    if expired(meta, ctx.now_ms):
        raise Rejected(ErrorCode.CONFLICT, "the message is past its expiry")
    meta = leave(stage, work, message_id, meta)
    meta = replace(meta, attempts=0, delivery_generation=meta.delivery_generation + 1)
    meta = enter(stage, work, message_id, meta, MessageState.ready, ctx)
    add_expiry(stage, work, message_id, meta)
    save_queue(stage, work.record)
    return _view(work.view, message_id, meta)


def cancel(stage: Staged, body: Cancel, ctx: Context) -> Record:
    work, message_id, meta = _fenced(stage, body, ctx)
    meta = leave(stage, work, message_id, meta)
    meta = enter(stage, work, message_id, meta, MessageState.cancelled, ctx)
    save_queue(stage, work.record)
    return _view(work.view, message_id, meta)


def park_pending(stage: Staged, body: ParkPending, ctx: Context) -> Record:
    work, message_id, meta = _fenced(stage, body, ctx)
    if meta.state != MessageState.pending_dead_letter:
        raise Rejected(ErrorCode.CONFLICT, "only pending dead letters can be parked")
    if not has_dead_letter_room(work.view, meta.body_bytes):
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, "the dead-letter sublimit is full")
    meta = leave(stage, work, message_id, meta)
    meta = enter(stage, work, message_id, meta, MessageState.dead_lettered, ctx)
    save_queue(stage, work.record)
    return _view(work.view, message_id, meta)


def list_dead_letters(stage: Staged, body: ListDeadLetters, ctx: Context) -> Record:
    """A page of dead-lettered messages in parked order, after `after_sequence`."""
    queue = load_queue(stage, ctx.domain, body.queue).view
    limit = body.limit
    if not 1 <= limit <= limits.MAX_DEAD_LETTER_PAGE:
        raise Rejected(ErrorCode.VALIDATION, f"limit must be between 1 and {limits.MAX_DEAD_LETTER_PAGE}")
    queue_id = queue.incarnation
    if body.after_sequence is not None:
        validation.check_integer("ListDeadLetters.after_sequence", body.after_sequence)
    after = body.after_sequence or 0
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
        meta = load_message(stage, queue_id, message_id)
        if meta is None or meta.state != MessageState.dead_lettered:
            raise Corruption("the dead-letter index names a message that is not dead-lettered")
        body_bytes = meta.body_bytes if body.include_body else 0
        result_bytes += result_item_bytes(body_bytes, meta.headers, message_id, meta.ordering_key)
        if messages and result_bytes > limits.RESULT_BYTES_BUDGET:
            more = True  # the page would not fit one outcome: the rest comes on the next page
            break
        payload = stage.get(keys.body(queue_id, message_id)) if body.include_body else None
        messages.append({"queue": queue.queue, "message_id": message_id, "meta": meta.to_avro(), "body": payload})
        last = keys.read_u64(key, 9)
    return {"messages": messages, "next_after_sequence": last if more else None}
