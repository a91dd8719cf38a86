"""The lease lifecycle: receive, renew, ack, nack — fenced by delivery tokens.

A receive claims ready messages in FIFO order under a lease; the lease is a timer
that, if it fires first, ends the attempt like a nack. Every later command about
the delivery presents its token, checked in a fixed order: signature and queue
incarnation (TokenInvalidated), principal (PermissionDenied), delivery generation,
lease version and state (StaleLease), deadline (LeaseExpired).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import Ack, AckBatch, Nack, Receive, Renew
from keyload.commands import Capability
from keyload.log.codec import Record
from keyload.processors import access, tokens, waiters
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import HELD_OUT_OF_READY, feature_level
from keyload.processors.key_rotation import TOKEN, active_key
from keyload.processors.payloads import handles
from keyload.processors.queues.lifecycle import end_attempt, enter, hold_back, is_key_head, leave, receive_result
from keyload.processors.queues.state import (
    Working,
    bounded,
    load_message,
    load_queue,
    load_queue_by_id,
    result_item_bytes,
    save_queue,
)
from keyload.projections import keys
from keyload.projections.records import LargePayload, MessageMeta, MessageState, QueuePolicy, QueueRecord
from keyload.projections.store import Staged


@dataclass(frozen=True, slots=True)
class ReceiveLimits:
    max_messages: int
    max_bytes: int
    lease_ms: int


def receive_limits(policy: QueuePolicy, body: Receive) -> ReceiveLimits:
    """A Receive's limits, defaulted from and bounded by the queue's policy."""
    return ReceiveLimits(
        bounded("max_messages", body.max_messages, policy.receive_max_messages, 1, policy.receive_max_messages),
        bounded("max_bytes", body.max_bytes, policy.receive_max_bytes, 1, policy.receive_max_bytes),
        bounded("lease_ms", body.lease_ms, policy.lease_ms, limits.MIN_LEASE_MS, policy.max_lease_ms),
    )


def follow_repeat(stage: Staged, body: Receive, ctx: Context) -> None:
    """A repeat of this Receive while it waits: its answer goes where the repeat asks (feature level
    13, processors/waiters.py)."""
    waiters.follow_repeat(stage, load_queue(stage, ctx.domain, body.queue), ctx)


def receive(stage: Staged, body: Receive, ctx: Context) -> Record | None:
    """Claim ready messages; with none and `wait_ms`, wait for them as a long poll
    (processors/waiters.py) instead of answering empty.

    A paused queue refuses a receive (DispatchPaused), unless it waits: then it waits for the
    resume like for a message.
    """
    work = Working(load_queue(stage, ctx.domain, body.queue))
    wanted = receive_limits(work.view.policy, body)
    wait_ms = bounded("wait_ms", body.wait_ms, 0, 0, limits.MAX_WAIT_MS)
    paused = work.view.paused
    if paused and wait_ms == 0:
        raise Rejected(ErrorCode.DISPATCH_PAUSED, f"dispatch of queue {body.queue} is paused")
    deliveries, budget_hit = ([], False) if paused else claim(stage, work, ctx, ctx.principal, wanted)
    if not deliveries and wait_ms > 0:
        work.record = waiters.wait(
            stage, work.record, ctx, wanted.max_messages, wanted.max_bytes, wanted.lease_ms, ctx.now_ms + wait_ms
        )
        save_queue(stage, work.record)
        return None
    save_queue(stage, work.record)
    return {"deliveries": deliveries, "budget_exhausted": budget_hit or bool(ctx.fired.get("budget_exhausted", False))}


def claim(
    stage: Staged, work: Working, ctx: Context, principal: str, wanted: ReceiveLimits
) -> tuple[list[Record], bool]:
    """Lease ready messages in FIFO order for `principal`: (deliveries, examination budget hit)."""
    queue = work.view
    room = min(wanted.max_messages, queue.policy.max_in_flight - queue.counters.leased)
    queue_id = queue.incarnation
    claims: list[tuple[str, MessageMeta]] = []
    held: list[tuple[str, MessageMeta]] = []  # rows of messages behind their key's head, taken out (level 15)
    hold: bool | None = None  # whether to take them out: read at the first such row
    size = examined = result_bytes = 0
    budget_hit = False
    # The ready floor: no ready row lies below it, so the scan never walks the
    # tombstones of rows claimed earlier. It moves to the first row left behind.
    floor: int | None = None
    scan = stage.scan(keys.ready(queue_id, work.record.ready_floor), keys.prefix_end(keys.ready_prefix(queue_id)))
    for key, value in scan:
        if len(claims) >= room:
            floor = keys.read_u64(key, 9) if floor is None else floor
            break
        if examined == limits.RECEIVE_EXAMINATION_BUDGET:
            budget_hit = True
            floor = keys.read_u64(key, 9) if floor is None else floor
            break
        examined += 1
        message_id = value.decode("utf-8")
        meta = load_message(stage, queue_id, message_id)
        if meta is None or meta.state != MessageState.ready:
            raise Corruption("the ready index names a message that is not ready")
        if not is_key_head(stage, queue, meta):
            hold = feature_level(stage) >= HELD_OUT_OF_READY if hold is None else hold
            if hold:  # it enters the ready order again when it becomes its key's head
                held.append((message_id, meta))
            else:
                floor = meta.ready_sequence if floor is None else floor
            continue  # an older message of its ordering key is unresolved: it waits
        inline = 0 if meta.payload is not None else meta.body_bytes
        item = result_item_bytes(inline, meta.headers, message_id, meta.ordering_key)
        if claims and (size + meta.body_bytes > wanted.max_bytes or result_bytes + item > limits.RESULT_BYTES_BUDGET):
            floor = meta.ready_sequence if floor is None else floor
            break  # the first claim is always made, so one large message never wedges a queue
        size += meta.body_bytes
        result_bytes += item
        claims.append((message_id, meta))
    for message_id, meta in held:
        hold_back(stage, work, message_id, meta)
    work.update(ready_floor=work.record.next_ready_sequence if floor is None else floor)
    if not claims:
        return [], budget_hit
    key_id, key = active_key(stage, ctx.keyring, TOKEN)
    lease_until = ctx.now_ms + wanted.lease_ms
    ids_reusable = stage.get(keys.MESSAGE_IDS_REUSABLE_SINCE) is not None  # then v2 tokens
    deliveries = []
    for message_id, ready in claims:
        meta = leave(stage, work, message_id, ready)
        # A large message remembers the latest expiry of a read handle it was delivered with:
        # retention keeps its object until then.
        read_until = meta.read_until_ms if meta.payload is None else max(meta.read_until_ms or 0, lease_until)
        meta = replace(meta, attempts=meta.attempts + 1, lease_version=meta.lease_version + 1, read_until_ms=read_until)
        meta = enter(
            stage, work, message_id, meta, MessageState.leased, ctx, lease_until_ms=lease_until, lease_owner=principal
        )
        payload = stage.get(keys.body(queue_id, message_id))
        if payload is None:
            raise Corruption("a leased message has no body")
        token = tokens.issue(
            {key_id: key},
            key_id,
            domain=queue.domain,
            queue=queue.queue,
            incarnation=queue_id,
            message_id=message_id,
            principal=principal,
            delivery_generation=meta.delivery_generation,
            lease_version=meta.lease_version,
            enqueue_sequence=meta.enqueue_sequence if ids_reusable else None,
        )
        deliveries.append(
            {
                "message_id": message_id,
                "token": token,
                "body": payload,
                "headers": meta.headers,
                "ordering_key": meta.ordering_key,
                "attempts": meta.attempts,
                "delivery_generation": meta.delivery_generation,
                "lease_until_ms": lease_until,
                "enqueued_at_ms": meta.enqueued_at_ms,
                "payload": _readable_payload({key_id: key}, key_id, queue.domain, meta.payload, lease_until),
            }
        )
    return deliveries, budget_hit


def _readable_payload(
    keyring: Mapping[str, bytes], key_id: str, domain: str, payload: LargePayload | None, until_ms: int
) -> Record | None:
    """A large message's payload with a read handle valid for this lease (signed with the token key)."""
    if payload is None:
        return None
    handle = handles.ReadHandle(key_id, domain, payload.object_key, payload.object_version, until_ms)
    return replace(payload, read_handle=handles.issue(keyring, handle)).to_avro()


def serve_waiters(stage: Staged, ctx: Context, queue_keys: list[bytes]) -> None:
    """Serve waiting long-poll receives of the queues a record changed, oldest waiter first.

    Serving examines at most MAX_WAITERS_SERVED waiters (it runs after a record's timers fire and
    again after its command). A queue whose waiters were cut off by that budget, with waiters and
    ready messages left, gets a serve timer due now (TIMER_SERVE): the next record fires it, which
    saves the queue, which serves it again (a resume after waiters piled up, a batch of enqueues),
    and the ticker's catch-up keeps records coming while it is due.
    """
    budget = limits.MAX_WAITERS_SERVED
    for queue_key in queue_keys:
        # Most queues a record writes have no waiter: the staged dict tells, without building the record.
        stored = stage.peek_record(queue_key, QueueRecord.SCHEMA)
        if stored is None or stored["waiting_receives"] == 0:
            continue
        record = QueueRecord.from_avro(stored)
        if record.view.paused:
            continue  # a paused queue's waiters wait for the resume (or their deadline)
        work = Working(record)
        examined, cut_off = _serve(stage, ctx, work, budget)
        budget -= examined
        if cut_off:
            _serve_later(stage, work, ctx)
        # Saved whenever it changed, served or not: finding the waiters moves the waiter floor, and
        # a claim that delivers nothing may still move the ready floor.
        if work.record is not record:
            save_queue(stage, work.record)


def _serve(stage: Staged, ctx: Context, work: Working, budget: int) -> tuple[int, bool]:
    """Serve the queue's waiters, oldest first, examining at most `budget`: (waiters examined,
    whether the budget cut serving off rather than the waiters or the messages running out)."""
    if budget == 0:
        return 0, True
    work.record, oldest = waiters.oldest(stage, work.record, budget)
    for examined, (sequence, waiter) in enumerate(oldest):
        if not access.may_still(stage, waiter.principal, Capability.consume, waiter.domain, work.view.queue):
            work.record = waiters.complete(stage, work.record, ctx, sequence, waiter, receive_result([]))
            continue  # answered empty: its principal's next Receive gets its PermissionDenied
        if work.view.counters.ready == 0:
            return examined, False
        wanted = ReceiveLimits(waiter.max_messages, waiter.max_bytes, waiter.lease_ms)
        deliveries, _ = claim(stage, work, ctx, waiter.principal, wanted)
        if not deliveries:
            return examined, False
        work.record = waiters.complete(stage, work.record, ctx, sequence, waiter, receive_result(deliveries))
    return len(oldest), len(oldest) == budget


def _serve_later(stage: Staged, work: Working, ctx: Context) -> None:
    """A serve timer due now, when waiters are left with ready messages to take."""
    if work.record.waiting_receives and work.view.counters.ready:
        work.record = waiters.serve_later(stage, work.record, ctx.now_ms)


def verified_token(stage: Staged, ctx: Context, token_text: str) -> tuple[QueueRecord, tokens.Token]:
    """(queue record, token) of a token this queue signed for the command's principal, or the refusal."""
    token = tokens.parse(token_text)
    return _signed_for(stage, ctx, token, load_queue_by_id(stage, token.incarnation)), token


def _signed_for(stage: Staged, ctx: Context, token: tokens.Token, record: QueueRecord | None) -> QueueRecord:
    """The queue record of the incarnation the token names (None: no such queue) if that queue signed
    the token for the command's principal; else the refusal."""
    if record is None or record.view.domain != ctx.domain:
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")
    tokens.verify_signature(access.service_key(stage, ctx, token.key_id), token, record.view.domain, record.view.queue)
    if token.principal != ctx.principal:
        raise Rejected(ErrorCode.PERMISSION_DENIED, "the delivery was issued to another principal")
    access.require(ctx, Capability.consume, record.view.queue)  # the queue a token names is known only now
    return record


def _leased(stage: Staged, ctx: Context, token: tokens.Token) -> MessageMeta:
    """The metadata of the live lease a verified token names; else StaleLease or LeaseExpired."""
    meta = load_message(stage, token.incarnation, token.message_id)
    if meta is None:
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")
    if (
        meta.state != MessageState.leased
        or meta.delivery_generation != token.delivery_generation
        or meta.lease_version != token.lease_version
        or not _same_message(stage, token, meta)
    ):
        raise Rejected(ErrorCode.STALE_LEASE, "the lease this token names is no longer current")
    assert meta.lease_until_ms is not None
    if meta.lease_until_ms <= ctx.now_ms:
        raise Rejected(ErrorCode.LEASE_EXPIRED, "the lease has expired")
    return meta


def _same_message(stage: Staged, token: tokens.Token, meta: MessageMeta) -> bool:
    """Whether the token was issued for this message and not an earlier one under its id: a v2
    token names its enqueue sequence; a v1 token was issued before the partition's message ids could
    become new (processors/tokens.py), so it names no message enqueued after that."""
    if token.enqueue_sequence is not None:
        return token.enqueue_sequence == meta.enqueue_sequence
    since = stage.get(keys.MESSAGE_IDS_REUSABLE_SINCE)
    return since is None or meta.enqueued_at_ms <= keys.read_u64(since)


def check_lease(stage: Staged, ctx: Context, token_text: str) -> tuple[Working, str, MessageMeta]:
    """(queue, message id, metadata) of the live lease a token names, or the specific refusal."""
    record, token = verified_token(stage, ctx, token_text)
    return Working(record), token.message_id, _leased(stage, ctx, token)


def live_lease(stage: Staged, ctx: Context, token: tokens.Token) -> tuple[QueueRecord, MessageMeta]:
    """(queue record, metadata) of the live lease a verified token names, read afresh; else
    StaleLease or LeaseExpired."""
    record = load_queue_by_id(stage, token.incarnation)
    assert record is not None, "a verified token names a queue"
    return record, _leased(stage, ctx, token)


def held_lease(stage: Staged, ctx: Context, token: tokens.Token) -> tuple[bytes, int | None]:
    """(body, lease deadline) of the lease a token of a stored Receive outcome names, while it is
    held (processors/repeats.py); else the refusal (the queue deleted: TokenInvalidated)."""
    if load_queue_by_id(stage, token.incarnation) is None:
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")
    meta = _leased(stage, ctx, token)
    body = stage.get(keys.body(token.incarnation, token.message_id))
    if body is None:
        raise Corruption("a leased message has no body")
    return body, meta.lease_until_ms


def _lease_result(message_id: str, meta: MessageMeta) -> Record:
    scheduled = meta.state == MessageState.scheduled
    return {
        "message_id": message_id,
        "state": str(meta.state),
        "lease_until_ms": meta.lease_until_ms,
        "not_before_ms": meta.not_before_ms if scheduled else None,
        "retry_delay_ms": meta.last_retry_delay_ms if scheduled else None,
    }


def renew(stage: Staged, body: Renew, ctx: Context) -> Record:
    work, message_id, meta = check_lease(stage, ctx, body.token)
    policy = work.view.policy
    lease_ms = bounded("lease_ms", body.lease_ms, policy.lease_ms, limits.MIN_LEASE_MS, policy.max_lease_ms)
    owner = meta.lease_owner
    meta = leave(stage, work, message_id, meta)
    meta = enter(
        stage, work, message_id, meta, MessageState.leased, ctx, lease_until_ms=ctx.now_ms + lease_ms, lease_owner=owner
    )
    save_queue(stage, work.record)
    return _lease_result(message_id, meta)


def ack(stage: Staged, body: Ack, ctx: Context) -> Record:
    # Nothing changes between the token's check and the ack: the queue is read once.
    work, message_id, meta = check_lease(stage, ctx, body.token)
    return _ack(stage, ctx, work, message_id, meta)


def ack_lease(stage: Staged, ctx: Context, token: tokens.Token) -> Record:
    """Ack the live lease a verified token names (the queue is read afresh)."""
    record, meta = live_lease(stage, ctx, token)
    return _ack(stage, ctx, Working(record), token.message_id, meta)


def _ack(stage: Staged, ctx: Context, work: Working, message_id: str, meta: MessageMeta) -> Record:
    meta = _acked(stage, ctx, work, message_id, meta)
    save_queue(stage, work.record)
    return _lease_result(message_id, meta)


def _acked(stage: Staged, ctx: Context, work: Working, message_id: str, meta: MessageMeta) -> MessageMeta:
    """Move a checked lease's message to acked (the queue record changed in `work`, not saved)."""
    meta = leave(stage, work, message_id, meta)
    return enter(stage, work, message_id, meta, MessageState.acked, ctx)


def check_settle_count(batch: list[str]) -> None:
    """An AckBatch or GroupAckBatch settles 1..MAX_ACK_BATCH tokens."""
    if not 1 <= len(batch) <= limits.MAX_ACK_BATCH:
        raise Rejected(ErrorCode.VALIDATION, f"tokens must hold 1..{limits.MAX_ACK_BATCH} tokens")


def ack_batch(stage: Staged, body: AckBatch, ctx: Context) -> Record:
    """Ack each token on its own: one refusal does not undo the others.

    A token's checks only read, and a checked lease is acked without another refusal, so a refused
    token leaves nothing behind and the acks need no stage of their own: they share their queues,
    each read at its first token and saved once after the last, its due entry and timer floor brought
    up to date once rather than per token. The projection is the one a run of single Acks in token
    order leaves."""
    check_settle_count(body.tokens)
    queues: dict[int, Working] = {}
    results: list[Record] = []
    for text in body.tokens:
        try:
            token = tokens.parse(text)
            work = queues.get(token.incarnation)
            known = load_queue_by_id(stage, token.incarnation) if work is None else work.record
            record = _signed_for(stage, ctx, token, known)
            meta = _leased(stage, ctx, token)
        except Rejected as refusal:
            results.append({"status": "rejected", "error_code": str(refusal.code), "message_id": None})
            continue
        if work is None:
            work = queues[token.incarnation] = Working(record)
        _acked(stage, ctx, work, token.message_id, meta)
        results.append({"status": "committed", "error_code": None, "message_id": token.message_id})
    for work in queues.values():
        save_queue(stage, work.record)
    return {"results": results}


def nack(stage: Staged, body: Nack, ctx: Context) -> Record:
    work, message_id, meta = check_lease(stage, ctx, body.token)
    delay = body.delay_ms
    if delay is not None and not 0 <= delay <= work.view.policy.max_lease_ms:
        raise Rejected(ErrorCode.VALIDATION, "delay_ms must be between 0 and the queue's max_lease_ms")
    meta = end_attempt(stage, work, message_id, meta, ctx, delay)
    save_queue(stage, work.record)
    return _lease_result(message_id, meta)
