"""Deliveries of subscription groups: receive, renew, ack, nack, and their lease and retry timers.

The queue's machinery, applied to positions: a claim takes attempts+1 and
lease_version+1 under a lease timer and a delivery token (processors/tokens.py,
scoped to the group, naming the position as its message id and the group's
generation as its delivery generation); a failed attempt (nack or lease expiry)
retries after the queue's backoff (`lifecycle.retry_delay_ms`) or, at
max_attempts, parks the position, which resolves it for the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import GroupAck, GroupAckBatch, GroupNack, GroupReceive, GroupRenew
from keyload.commands import Capability
from keyload.log.codec import REGISTRY, Record
from keyload.processors import access, tokens, waiters
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import TOKEN_CHECKPOINTS, feature_level
from keyload.processors.groups.group import (
    GROUP_RECEIVE_RESULT,
    GROUP_RECORD,
    Working,
    empty_receive_result,
    enter,
    leave,
    load_group,
    load_position,
    matches,
    resolve,
    store_group,
    token_scope,
    topic_view,
)
from keyload.processors.key_rotation import JITTER, TOKEN, active_key
from keyload.processors.queues.leases import check_settle_count
from keyload.processors.queues.lifecycle import retry_delay_ms
from keyload.processors.queues.state import bounded, due_timers, result_item_bytes
from keyload.processors.topics.topic import EVENT_RECORD, event_item
from keyload.projections import keys
from keyload.projections.records import GroupRecord, PositionMeta, PositionState, TopicRecord, TopicView, load
from keyload.projections.store import Staged


def _load_event(stage: Staged, topic_id: int, position: int) -> Record:
    """The event at a retained position. A receive reads many events once each, for a filter
    match and a delivery dict, so it reads them as dicts (no EventRecord conversion)."""
    raw = stage.get(keys.event(topic_id, position))
    if raw is None:
        raise Corruption(f"topic {topic_id} has no event at retained position {position}")
    return REGISTRY.decode(EVENT_RECORD, raw)


class _Claims:
    """What one receive has taken so far, against its count, byte and result budgets."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events, self.max_bytes = max_events, max_bytes
        self.taken: list[tuple[int, Record]] = []
        self.size = self.result_bytes = 0

    def full(self) -> bool:
        return len(self.taken) == self.max_events

    def take(self, position: int, event: Record) -> bool:
        """Take the event unless it would pass max_bytes or the result budget (the first always goes)."""
        item = result_item_bytes(len(event["body"]), event["headers"], event["event_id"], event["type"])
        over = self.size + event["charged_bytes"] > self.max_bytes
        if self.taken and (over or self.result_bytes + item > limits.RESULT_BYTES_BUDGET):
            return False
        self.size += event["charged_bytes"]
        self.result_bytes += item
        self.taken.append((position, event))
        return True


@dataclass(frozen=True, slots=True)
class _Wanted:
    """A receive's limits, bounded; a waiter keeps them (its max_messages holds max_events)."""

    max_events: int
    max_bytes: int
    lease_ms: int


def follow_repeat(stage: Staged, body: GroupReceive, ctx: Context) -> None:
    """A repeat of this GroupReceive while it waits: its answer goes where the repeat asks (feature
    level 13, processors/waiters.py)."""
    _, work = load_group(stage, ctx.domain, body.topic, body.group)
    waiters.follow_repeat(stage, work.record, ctx)


def group_receive(stage: Staged, body: GroupReceive, ctx: Context) -> Record | None:
    """Claim what the group can deliver now (see `_claim`); with nothing claimed and `wait_ms`,
    wait for it as a long poll (processors/waiters.py) instead of answering empty.

    A paused group refuses a receive (DispatchPaused), unless it waits: then it
    waits for the resume like for an event.
    """
    topic, work = load_group(stage, ctx.domain, body.topic, body.group)
    group = work.view
    policy = group.policy
    wanted = _Wanted(
        bounded("max_events", body.max_events, limits.DEFAULT_GROUP_RECEIVE_EVENTS, 1, limits.MAX_GROUP_RECEIVE_EVENTS),
        bounded("max_bytes", body.max_bytes, limits.DEFAULT_GROUP_RECEIVE_BYTES, 1, limits.MAX_GROUP_RECEIVE_BYTES),
        bounded("lease_ms", body.lease_ms, policy.lease_ms, limits.MIN_LEASE_MS, policy.max_lease_ms),
    )
    wait_ms = bounded("wait_ms", body.wait_ms, 0, 0, limits.MAX_WAIT_MS)
    if group.paused and wait_ms == 0:
        raise Rejected(ErrorCode.DISPATCH_PAUSED, "the group is paused")
    result = empty_receive_result()[1] if group.paused else _claim(stage, topic, work, ctx, ctx.principal, wanted)
    if not result["deliveries"] and not result["budget_exhausted"] and wait_ms > 0:
        work.record = waiters.wait(
            stage, work.record, ctx, wanted.max_events, wanted.max_bytes, wanted.lease_ms, ctx.now_ms + wait_ms
        )
        store_group(stage, work)
        return None
    store_group(stage, work)
    result["budget_exhausted"] = result["budget_exhausted"] or bool(ctx.fired.get("budget_exhausted", False))
    return result


def _claim(stage: Staged, topic: TopicView, work: Working, ctx: Context, principal: str, wanted: _Wanted) -> Record:
    """Lease due redeliveries first, in position order; then new positions from issued + 1.

    New matching positions are claimed and non-matching ones resolved as filtered,
    until max_events, max_bytes, the result budget, a full window (or MAX_GROUP_SPAN
    ahead of the checkpoint: `window_full`), the tail, or
    GROUP_RECEIVE_EXAMINATION_BUDGET rows (`budget_exhausted`). A GroupReceiveResult.
    """
    group = work.view
    claims = _Claims(wanted.max_events, wanted.max_bytes)
    group_id, topic_id = group.incarnation, topic.incarnation
    examined = 0
    stopped = window_full = budget_hit = False
    redeliveries: set[int] = set()
    if group.redeliverable:
        start = keys.due_position(group_id, group.checkpoint + 1)
        for key, _ in stage.scan(start, keys.group_row_end(start)):
            if claims.full():
                break
            if examined == limits.GROUP_RECEIVE_EXAMINATION_BUDGET:
                stopped = budget_hit = True
                break
            examined += 1
            position = keys.row_position(key)
            if not claims.take(position, _load_event(stage, topic_id, position)):
                stopped = True
                break
            redeliveries.add(position)
    # The loop moves these; the group's state is replaced once, after it.
    issued, checkpoint, outstanding, filtered_total = (
        group.issued,
        group.checkpoint,
        group.outstanding,
        group.filtered_total,
    )
    max_window, group_filter, tail = group.policy.max_window, group.filter, topic.tail
    while not stopped and not claims.full() and issued < tail:
        if outstanding >= max_window or issued - checkpoint >= limits.MAX_GROUP_SPAN:
            window_full = True
            break
        if examined == limits.GROUP_RECEIVE_EXAMINATION_BUDGET:
            budget_hit = True
            break
        examined += 1
        position = issued + 1
        event = _load_event(stage, topic_id, position)
        if not matches(group_filter, event):
            issued = position
            filtered_total += 1
            if outstanding == 0:
                checkpoint = position
            continue
        if not claims.take(position, event):
            break
        issued = position
        outstanding += 1
    if issued != group.issued:
        work.update(issued=issued, checkpoint=checkpoint, outstanding=outstanding, filtered_total=filtered_total)
    deliveries = _lease(stage, work, ctx, principal, claims.taken, redeliveries, wanted.lease_ms)
    return {"deliveries": deliveries, "window_full": window_full, "budget_exhausted": budget_hit}


def _deliverable(topic: TopicView, work: Working) -> bool:
    """Whether a receive could claim something now: a due redelivery, or a new position within the window."""
    group = work.view
    window_open = group.outstanding < group.policy.max_window and (
        group.issued - group.checkpoint < limits.MAX_GROUP_SPAN
    )
    return not group.paused and (group.redeliverable > 0 or (window_open and group.issued < topic.tail))


def serve_waiters(stage: Staged, ctx: Context, topic_keys: list[bytes], group_keys: list[bytes]) -> None:
    """Serve waiting GroupReceives of the groups a record changed, and of every group of a topic
    it changed (a publish), oldest waiter first, at most MAX_WAITERS_SERVED in all. A group cut off
    by that budget with waiters left and positions to deliver gets a serve timer due now
    (TIMER_SERVE), as a queue does: the next record serves it again."""
    candidates = set(group_keys)
    for topic_key in topic_keys:
        topic_record = load(stage, topic_key, TopicRecord)
        if topic_record is not None:
            prefix = keys.group_prefix(topic_record.view.incarnation)
            candidates.update(key for key, _ in stage.scan(prefix, keys.prefix_end(prefix)))
    served = 0
    for group_key in sorted(candidates):
        # Every record that touches a topic or group looks at each of its groups here, and
        # most have no waiter: a read of the staged dict tells, and only a group with waiters is converted.
        stored = stage.peek_record(group_key, GROUP_RECORD)
        if stored is None or stored["waiting_receives"] == 0:
            continue
        work = Working(GroupRecord.from_avro(stored))
        group = work.view
        topic = topic_view(stage, group.domain, group.topic)
        changed = False
        while work.record.waiting_receives > 0 and served < limits.MAX_WAITERS_SERVED and _deliverable(topic, work):
            work.record, oldest = waiters.oldest(stage, work.record, 1)
            if not oldest:
                raise Corruption(f"group {group.incarnation} counts waiting receives it has no row for")
            [(sequence, waiter)] = oldest
            changed = True
            if not access.may_still(stage, waiter.principal, Capability.consume, group.domain, group.topic):
                work.record = waiters.complete(stage, work.record, ctx, sequence, waiter, empty_receive_result())
                continue  # answered empty: its principal's next GroupReceive gets its PermissionDenied
            wanted = _Wanted(waiter.max_messages, waiter.max_bytes, waiter.lease_ms)
            result = _claim(stage, topic, work, ctx, waiter.principal, wanted)
            if not result["deliveries"]:
                break
            work.record = waiters.complete(stage, work.record, ctx, sequence, waiter, (GROUP_RECEIVE_RESULT, result))
            served += 1
        if served == limits.MAX_WAITERS_SERVED and work.record.waiting_receives > 0 and _deliverable(topic, work):
            work.record = waiters.serve_later(stage, work.record, ctx.now_ms)
            changed = True
        if changed:
            store_group(stage, work)


def _lease(
    stage: Staged,
    work: Working,
    ctx: Context,
    principal: str,
    taken: list[tuple[int, Record]],
    redeliveries: set[int],
    lease_ms: int,
) -> list[Record]:
    """Lease the claimed positions to `principal` and sign their tokens."""
    if not taken:
        return []
    group_id = work.view.incarnation
    key_id, key = active_key(stage, ctx.keyring, TOKEN)
    lease_until = ctx.now_ms + lease_ms
    deliveries = []
    for position, event in taken:
        if position in redeliveries:
            stored = load_position(stage, group_id, position)
            if stored is None:
                raise Corruption(f"group {group_id} redelivers position {position}, which has no row")
            meta = leave(stage, work, position, stored)
            meta = replace(meta, attempts=meta.attempts + 1, lease_version=meta.lease_version + 1)
        else:
            meta = PositionMeta(state=PositionState.leased, attempts=1, lease_version=1)
        meta = enter(stage, work, position, meta, PositionState.leased, until_ms=lease_until, lease_owner=principal)
        group = work.view
        token = tokens.issue(
            {key_id: key},
            key_id,
            domain=group.domain,
            queue=token_scope(group),
            incarnation=group_id,
            message_id=str(position),
            principal=principal,
            delivery_generation=group.generation,
            lease_version=meta.lease_version,
        )
        deliveries.append(
            {**event_item(position, event), "token": token, "attempts": meta.attempts, "lease_until_ms": lease_until}
        )
    work.update(delivered_total=work.view.delivered_total + len(taken))
    return deliveries


def _verified_token(
    stage: Staged, ctx: Context, topic: str, group_name: str, token_text: str
) -> tuple[Working, tokens.Token]:
    _, work = load_group(stage, ctx.domain, topic, group_name)
    return work, _signed_by(stage, ctx, work, topic, token_text)


def _signed_by(stage: Staged, ctx: Context, work: Working, topic: str, token_text: str) -> tokens.Token:
    """The token, if the group signed it in its current generation for the command's principal;
    else the refusal."""
    group = work.view
    token = tokens.parse(token_text)
    if token.incarnation != group.incarnation:
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")
    tokens.verify_signature(access.service_key(stage, ctx, token.key_id), token, group.domain, token_scope(group))
    if token.delivery_generation != group.generation:
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")
    if token.principal != ctx.principal:
        raise Rejected(ErrorCode.PERMISSION_DENIED, "the delivery was issued to another principal")
    access.require(ctx, Capability.consume, topic)  # a CompleteProcessing names its topic in no route
    return token


def verified_group_token(
    stage: Staged, ctx: Context, topic: str, group_name: str, token_text: str
) -> tuple[GroupRecord, tokens.Token]:
    """(group record, token) of a token the group signed in its current generation for the
    command's principal, or the refusal (processors/documents/inbox.py)."""
    work, token = _verified_token(stage, ctx, topic, group_name, token_text)
    return work.record, token


def _check_group_lease(stage: Staged, ctx: Context, body: GroupRenew | GroupNack) -> tuple[Working, int, PositionMeta]:
    """(group, position, position meta) of the live lease a token names, or the refusal.

    Order: not a token of this group, or of an older generation (a seek or
    configure happened) → TokenInvalidated; another principal → PermissionDenied;
    lease no longer current → StaleLease; deadline reached → LeaseExpired.
    """
    work, token = _verified_token(stage, ctx, body.topic, body.group, body.token)
    position, meta = _leased(stage, ctx, work, token)
    return work, position, meta


def _leased(stage: Staged, ctx: Context, work: Working, token: tokens.Token) -> tuple[int, PositionMeta]:
    """(position, position meta) of the live lease a verified token of the group names; else
    StaleLease or LeaseExpired."""
    position = int(token.message_id)
    meta = load_position(stage, work.view.incarnation, position)
    if meta is None or meta.state != PositionState.leased or meta.lease_version != token.lease_version:
        raise Rejected(ErrorCode.STALE_LEASE, "the lease this token names is no longer current")
    assert meta.lease_until_ms is not None
    if meta.lease_until_ms <= ctx.now_ms:
        raise Rejected(ErrorCode.LEASE_EXPIRED, "the lease has expired")
    return position, meta


def _live_lease(
    stage: Staged, ctx: Context, topic: str, group_name: str, token: tokens.Token
) -> tuple[Working, int, PositionMeta]:
    _, work = load_group(stage, ctx.domain, topic, group_name)
    position, meta = _leased(stage, ctx, work, token)
    return work, position, meta


def live_group_lease(
    stage: Staged, ctx: Context, topic: str, group_name: str, token: tokens.Token
) -> tuple[GroupRecord, int, PositionMeta]:
    """(group record, position, position meta) of the live lease a verified token names, read
    afresh; else StaleLease or LeaseExpired (processors/documents/inbox.py)."""
    work, position, meta = _live_lease(stage, ctx, topic, group_name, token)
    return work.record, position, meta


def held_lease(stage: Staged, ctx: Context, token: tokens.Token) -> tuple[bytes, int | None]:
    """(event body, lease deadline) of the lease a token of a stored GroupReceive outcome names,
    while it is held (processors/repeats.py); else the refusal (the group deleted, sought or
    reconfigured: TokenInvalidated)."""
    group_key = stage.get(keys.resource_key(token.incarnation))
    record = None if group_key is None or group_key[:1] != keys.GROUP else load(stage, group_key, GroupRecord)
    if record is None or record.view.generation != token.delivery_generation:
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")
    position, meta = _leased(stage, ctx, Working(record), token)
    return _load_event(stage, record.view.topic_incarnation, position)["body"], meta.lease_until_ms


def _lease_result(work: Working, position: int, meta: PositionMeta) -> Record:
    retrying = meta.state == PositionState.retrying
    return {
        "position": position,
        "state": str(meta.state),
        "checkpoint": work.view.checkpoint,
        "lease_until_ms": meta.lease_until_ms,
        "not_before_ms": meta.not_before_ms if retrying else None,
        "retry_delay_ms": meta.last_retry_delay_ms if retrying else None,
    }


def group_renew(stage: Staged, body: GroupRenew, ctx: Context) -> Record:
    work, position, meta = _check_group_lease(stage, ctx, body)
    policy = work.view.policy
    lease_ms = bounded("lease_ms", body.lease_ms, policy.lease_ms, limits.MIN_LEASE_MS, policy.max_lease_ms)
    owner = meta.lease_owner
    meta = leave(stage, work, position, meta)
    meta = enter(stage, work, position, meta, PositionState.leased, until_ms=ctx.now_ms + lease_ms, lease_owner=owner)
    store_group(stage, work)
    return _lease_result(work, position, meta)


def group_ack(stage: Staged, body: GroupAck, ctx: Context) -> Record:
    # Nothing changes between the token's check and the ack: the group is read once.
    work, token = _verified_token(stage, ctx, body.topic, body.group, body.token)
    position, meta = _leased(stage, ctx, work, token)
    return _ack(stage, ctx, work, position, meta)


def group_ack_lease(stage: Staged, ctx: Context, topic: str, group_name: str, token: tokens.Token) -> Record:
    """Ack the live lease a verified token of the group names (the group is read afresh)."""
    work, position, meta = _live_lease(stage, ctx, topic, group_name, token)
    return _ack(stage, ctx, work, position, meta)


def _ack(stage: Staged, ctx: Context, work: Working, position: int, meta: PositionMeta) -> Record:
    meta = resolve(stage, work, position, meta, PositionState.acked, ctx.now_ms)
    store_group(stage, work)
    return _lease_result(work, position, meta)


def group_ack_batch(stage: Staged, body: GroupAckBatch, ctx: Context) -> Record:
    """Ack each token on its own: one refusal does not undo the others.

    As a queue's AckBatch does (processors/queues/leases.py), the acks share the group: a token's
    checks only read, and a checked lease is acked without another refusal, so the group is read
    once and saved once, after the last token, when any was acked. The projection is the one a run
    of single GroupAcks in token order leaves, and from feature level 10 each acked token's result
    holds the checkpoint the lone GroupAck would have answered."""
    _, work = load_group(stage, ctx.domain, body.topic, body.group)  # NotFound refuses the whole batch
    check_settle_count(body.tokens)
    token_checkpoints = feature_level(stage) >= TOKEN_CHECKPOINTS
    results: list[Record] = []
    for text in body.tokens:
        try:
            position, meta = _leased(stage, ctx, work, _signed_by(stage, ctx, work, body.topic, text))
        except Rejected as refusal:
            refused = {"status": "rejected", "error_code": str(refusal.code), "position": None, "checkpoint": None}
            results.append(refused)
            continue
        resolve(stage, work, position, meta, PositionState.acked, ctx.now_ms)
        checkpoint = work.view.checkpoint if token_checkpoints else None
        results.append({"status": "committed", "error_code": None, "position": position, "checkpoint": checkpoint})
    if any(result["status"] == "committed" for result in results):
        store_group(stage, work)
    return {"results": results, "checkpoint": work.view.checkpoint}


def group_nack(stage: Staged, body: GroupNack, ctx: Context) -> Record:
    work, position, meta = _check_group_lease(stage, ctx, body)
    delay = body.delay_ms
    if delay is not None and not 0 <= delay <= work.view.policy.max_lease_ms:
        raise Rejected(ErrorCode.VALIDATION, "delay_ms must be between 0 and the group's max_lease_ms")
    meta = _end_attempt(stage, work, position, meta, ctx, delay)
    store_group(stage, work)
    return _lease_result(work, position, meta)


def _end_attempt(
    stage: Staged, work: Working, position: int, meta: PositionMeta, ctx: Context, delay_ms: int | None = None
) -> PositionMeta:
    """A leased attempt failed (nack or lease expiry): park at max_attempts, else retry after
    `delay_ms` (a nack's own) or the backoff. The position's meta after it."""
    group = work.view
    policy = group.policy
    if meta.attempts >= policy.max_attempts:
        return resolve(stage, work, position, meta, PositionState.parked, ctx.now_ms)
    meta = leave(stage, work, position, meta)
    if delay_ms is None:
        _, jitter_key = active_key(stage, ctx.keyring, JITTER)
        material = (
            ctx.command_id,
            group.domain,
            token_scope(group),
            str(position),
            str(group.generation),
            str(meta.attempts),
            str(meta.lease_version),
        )
        delay_ms = retry_delay_ms(policy, meta.attempts, jitter_key, material)
    meta = replace(meta, last_retry_delay_ms=delay_ms)
    return enter(stage, work, position, meta, PositionState.retrying, until_ms=ctx.now_ms + delay_ms)


def fire_group_timers(stage: Staged, record: GroupRecord, ctx: Context, budget: int) -> tuple[int, int]:
    """Fire one group's due timers, examining at most `budget`, and save the group; returns
    (examined, transitions).

    A lease timer ends the attempt like a nack; a retry timer makes the position due,
    so the next receive delivers it before any new position; a waiter's deadline
    completes its GroupReceive empty.
    """
    work = Working(record)
    group_id = work.view.incarnation
    due = due_timers(stage, work.record, ctx.now_ms, budget)
    for key, value in due:
        _, kind, position = keys.parse_timer(key)
        if kind == keys.TIMER_SERVE:
            stage.delete(key)  # storing the group below has its waiters served (processors/apply.py)
            continue
        if kind == keys.TIMER_WAITER:
            window_full = work.view.outstanding >= work.view.policy.max_window
            work.record = waiters.expire(stage, work.record, ctx, position, empty_receive_result(window_full))
            continue
        meta = load_position(stage, group_id, position)
        if meta is None or value != str(position).encode("utf-8"):
            raise Corruption(f"timer {key.hex()} names a position that is not outstanding")
        if kind == keys.TIMER_LEASE:
            _end_attempt(stage, work, position, meta, ctx)
        elif kind == keys.TIMER_NOT_BEFORE:
            meta = leave(stage, work, position, meta)
            enter(stage, work, position, meta, PositionState.due)
        else:
            raise Corruption(f"timer {key.hex()} has kind {kind}, which groups do not use")
    store_group(stage, work)
    return len(due), len(due)
