"""Message state transitions: every move leaves one state's index row and enters another's.

`leave` and `enter` are the only places that touch state indexes and per-state
counters, so each transition keeps them exact by construction. Terminal states
(acked, expired, cancelled) release the body and the stored quota exactly once;
their metadata stays as a tombstone so a message id is not reused (from feature level 4 until
the domain's horizons, processors/horizons.py; before it, forever).

The records are frozen: a transition changes the command's queue record through its
`Working` (processors/queues/state.py) and returns the message's new metadata, which
the caller carries on to the next transition.
"""

from __future__ import annotations

import hashlib
import hmac

from msgspec.structs import replace

from keyload.log.codec import Record
from keyload.processors import horizons, waiters
from keyload.processors.context import Context
from keyload.processors.errors import Corruption
from keyload.processors.features import HELD_OUT_OF_READY, WORK_COMPACTED, feature_level
from keyload.processors.key_rotation import JITTER, active_key
from keyload.processors.payloads import reservations, retention
from keyload.processors.queues.state import (
    DEAD_STATES,
    LIVE_STATES,
    TERMINAL_TOTALS,
    Working,
    add_index_row,
    due_timers,
    has_dead_letter_room,
    load_message,
    remove_index_row,
    save_message,
    save_queue,
    with_timer,
)
from keyload.projections import keys
from keyload.projections.records import (
    GroupPolicy,
    MessageMeta,
    MessageState,
    Ordering,
    ParkedHead,
    QueuePolicy,
    QueueRecord,
    QueueView,
    ReservationState,
    RetryJitter,
)
from keyload.projections.store import Staged


def state_row(queue_id: int, meta: MessageMeta) -> bytes | None:
    """The index row that holds a message in its current state (None for terminal states, and for
    a ready message held out of the ready index behind its key's head, feature level 15)."""
    state, sequence = meta.state, meta.enqueue_sequence
    if state == MessageState.scheduled:
        assert meta.not_before_ms is not None
        return keys.timer(queue_id, meta.not_before_ms, keys.TIMER_NOT_BEFORE, sequence)
    if state == MessageState.ready:
        return None if meta.ready_sequence is None else keys.ready(queue_id, meta.ready_sequence)
    if state == MessageState.leased:
        assert meta.lease_until_ms is not None
        return keys.timer(queue_id, meta.lease_until_ms, keys.TIMER_LEASE, sequence)
    if state == MessageState.dead_lettered:
        assert meta.parked_sequence is not None
        return keys.dead_letter(queue_id, meta.parked_sequence)
    if state == MessageState.pending_dead_letter:
        return keys.pending_dead_letter(queue_id, sequence)
    return None


def leave(stage: Staged, work: Working, message_id: str, meta: MessageMeta) -> MessageMeta:
    """Take a live message out of its state's index and counter; the metadata without what
    that state held."""
    state = meta.state
    if state not in LIVE_STATES:
        raise Corruption(f"message {meta.enqueue_sequence} leaves terminal state {state}")
    row = state_row(work.view.incarnation, meta)
    assert row is not None or state == MessageState.ready  # a held ready message has none
    if row is not None:
        remove_index_row(stage, row, message_id)
    work.adjust(**{state.value: -1})
    if state == MessageState.ready:
        return replace(meta, ready_sequence=None)
    if state == MessageState.leased:
        return replace(meta, lease_until_ms=None, lease_owner=None)
    if state == MessageState.dead_lettered:
        work.adjust(dead_letter_bytes=-meta.body_bytes)
        return replace(meta, parked_sequence=None)
    return meta


def enter(
    stage: Staged,
    work: Working,
    message_id: str,
    meta: MessageMeta,
    state: MessageState,
    ctx: Context,
    *,
    not_before_ms: int | None = None,
    lease_until_ms: int | None = None,
    lease_owner: str | None = None,
) -> MessageMeta:
    """Put a message (fresh, or just out of `leave`) into `state` and save it; the saved metadata.

    `not_before_ms` is when a scheduled message becomes ready; `lease_until_ms` and
    `lease_owner` are a leased message's lease.
    """
    queue_id = work.view.incarnation
    sequence = meta.enqueue_sequence
    meta = replace(meta, state=state, state_version=meta.state_version + 1)
    if state == MessageState.scheduled:
        assert not_before_ms is not None
        meta = replace(meta, not_before_ms=not_before_ms)
        work.record = with_timer(stage, work.record, not_before_ms, keys.TIMER_NOT_BEFORE, sequence, message_id)
    elif state == MessageState.leased:
        assert lease_until_ms is not None and lease_owner is not None
        meta = replace(meta, lease_until_ms=lease_until_ms, lease_owner=lease_owner)
        work.record = with_timer(stage, work.record, lease_until_ms, keys.TIMER_LEASE, sequence, message_id)
    elif state == MessageState.dead_lettered:  # held by an index row of its own
        parked = work.record.next_parked_sequence
        meta = replace(meta, parked_sequence=parked)
        work.update(next_parked_sequence=parked + 1)
        work.adjust(dead_letter_bytes=meta.body_bytes)
        add_index_row(stage, keys.dead_letter(queue_id, parked), message_id)
    elif state == MessageState.pending_dead_letter:
        add_index_row(stage, keys.pending_dead_letter(queue_id, sequence), message_id)
    if state in LIVE_STATES:
        work.adjust(**{state.value: 1})
    else:
        meta = _release(stage, work, message_id, meta, ctx)
        work.adjust(**{TERMINAL_TOTALS[state]: 1})
    if state in DEAD_STATES:
        meta = replace(meta, dead_lettered_at_ms=ctx.now_ms)
        _drop_expiry(stage, queue_id, meta)
    _keep_ordering_row(stage, work, message_id, meta)
    if state == MessageState.ready and not held_back(stage, work.view, meta):
        meta = _in_ready_order(stage, work, message_id, meta)
    save_message(stage, queue_id, message_id, meta)
    return meta


def _in_ready_order(stage: Staged, work: Working, message_id: str, meta: MessageMeta) -> MessageMeta:
    """A ready message at the back of the ready order, its ready row written."""
    ready = work.record.next_ready_sequence
    work.update(next_ready_sequence=ready + 1)
    add_index_row(stage, keys.ready(work.view.incarnation, ready), message_id)
    return replace(meta, ready_sequence=ready)


def held_back(stage: Staged, queue: QueueView, meta: MessageMeta) -> bool:
    """Whether a ready message stays out of the ready index: from feature level 15, a keyed
    message of a strict_per_key queue that is not its key's head (it enters when it becomes one)."""
    return not is_key_head(stage, queue, meta) and feature_level(stage) >= HELD_OUT_OF_READY


def hold_back(stage: Staged, work: Working, message_id: str, meta: MessageMeta) -> None:
    """Take a ready row of a message that is not its key's head out of the ready index (a row from
    before feature level 15, or of a head a redriven older message displaced)."""
    assert meta.state == MessageState.ready and meta.ready_sequence is not None
    remove_index_row(stage, keys.ready(work.view.incarnation, meta.ready_sequence), message_id)
    save_message(stage, work.view.incarnation, message_id, replace(meta, ready_sequence=None))


def holds_its_key(policy: QueuePolicy, state: MessageState) -> bool:
    """Whether a message in `state` still holds back later messages of its ordering key.

    Every live state does, except a dead letter under parked_head=continue, which
    releases its successors; under block a parked head keeps holding them.
    """
    if state not in LIVE_STATES:
        return False
    return policy.parked_head == ParkedHead.block or state not in DEAD_STATES


def _keep_ordering_row(stage: Staged, work: Working, message_id: str, meta: MessageMeta) -> None:
    """In a strict_per_key queue, a message is in its key's ordering index while it holds the key.

    The key's head row (`h`) holds the lowest sequence in its ordering index and
    exists exactly while the index has rows, so finding a key's head is one read.
    A new head that is ready and held out of the ready index enters it (feature level 15).
    """
    queue = work.view
    if queue.policy.ordering != Ordering.strict_per_key or meta.ordering_key is None:
        return
    queue_id, key, sequence = queue.incarnation, meta.ordering_key, meta.enqueue_sequence
    row = keys.ordering(queue_id, key, sequence)
    head_key = keys.key_head(queue_id, key)
    raw_head = stage.get(head_key)
    head = None if raw_head is None else keys.read_u64(raw_head)
    if holds_its_key(queue.policy, meta.state):
        stage.put(row, message_id.encode("utf-8"))
        if head is None or sequence < head:
            stage.put(head_key, keys.u64(sequence))
    elif stage.get(row) is not None:
        stage.delete(row)
        if head == sequence:
            # Seek from just past the deleted head: the tombstones before it are never walked.
            following = stage.first(keys.ordering(queue_id, key, sequence + 1), keys.prefix_end(row[:-8]))
            if following is None:
                stage.delete(head_key)
            else:
                stage.put(head_key, following[0][-8:])
                _release_head(stage, work, following[1].decode("utf-8"))


def _release_head(stage: Staged, work: Working, message_id: str) -> None:
    """The key's new head, ready and held out of the ready index, takes its place in the ready order."""
    meta = load_message(stage, work.view.incarnation, message_id)
    if meta is None:
        raise Corruption("the ordering index names a message that does not exist")
    if meta.state == MessageState.ready and meta.ready_sequence is None:
        save_message(stage, work.view.incarnation, message_id, _in_ready_order(stage, work, message_id, meta))


def is_key_head(stage: Staged, queue: QueueView, meta: MessageMeta) -> bool:
    """Whether the message is the oldest unresolved one of its ordering key (always true without one)."""
    if queue.policy.ordering != Ordering.strict_per_key or meta.ordering_key is None:
        return True
    raw_head = stage.get(keys.key_head(queue.incarnation, meta.ordering_key))
    if raw_head is None:
        raise Corruption("a keyed message is missing from its ordering index")
    return keys.read_u64(raw_head) == meta.enqueue_sequence


def _release(stage: Staged, work: Working, message_id: str, meta: MessageMeta, ctx: Context) -> MessageMeta:
    """A message reaches a terminal state: its body and quota go, its expiry no longer applies;
    the metadata with its terminal time.

    A large message's object is not deleted here: this command is its retire intent, and
    the object goes through the guarded retention workflow (processors/payloads/retention.py)."""
    queue_id = work.view.incarnation
    work.adjust(stored_messages=-1, stored_bytes=-meta.body_bytes)
    stage.delete(keys.body(queue_id, message_id))
    _drop_expiry(stage, queue_id, meta)
    meta = replace(meta, terminal_at_ms=ctx.now_ms)
    if meta.payload is not None:
        retention.retire_payload(stage, work.view, message_id, meta, ctx)
    elif feature_level(stage) >= WORK_COMPACTED:
        horizons.retire_message(stage, work.view, message_id, meta)
    return meta


def _drop_expiry(stage: Staged, queue_id: int, meta: MessageMeta) -> None:
    # The expiry timer may have fired already (it is what expired the message): a plain delete.
    if meta.expires_at_ms is not None:
        stage.delete(keys.timer(queue_id, meta.expires_at_ms, keys.TIMER_EXPIRY, meta.enqueue_sequence))


def add_expiry(stage: Staged, work: Working, message_id: str, meta: MessageMeta) -> None:
    if meta.expires_at_ms is not None:
        expiry = meta.expires_at_ms
        work.record = with_timer(stage, work.record, expiry, keys.TIMER_EXPIRY, meta.enqueue_sequence, message_id)


def expired(meta: MessageMeta, now_ms: int) -> bool:
    return meta.expires_at_ms is not None and meta.expires_at_ms <= now_ms


# -- retries and dead letters ------------------------------------------------------------


def retry_delay_ms(
    policy: QueuePolicy | GroupPolicy, attempts: int, jitter_key: bytes, material: tuple[str, ...]
) -> int:
    """Backoff before the next attempt: min(base · factor^(attempts-1), max), optionally full jitter.

    Full jitter is deterministic: 1 + (HMAC-SHA256 over `material` — the triggering
    command id and what names the attempt — first 8 bytes big-endian) mod cap, so a
    replay chooses the same delay. Queues and subscription groups share it.
    """
    cap = policy.retry_base_ms
    for _ in range(attempts - 1):
        if cap >= policy.retry_max_ms:
            break
        cap *= policy.retry_factor
    cap = min(cap, policy.retry_max_ms)
    if policy.retry_jitter == RetryJitter.none or cap == 0:
        return cap
    digest = hmac.new(jitter_key, "\x00".join(material).encode("utf-8"), hashlib.sha256).digest()
    return 1 + int.from_bytes(digest[:8], "big") % cap


def _jitter_material(command_id: str, queue: QueueView, meta: MessageMeta) -> tuple[str, ...]:
    """What a message's jitter draws on: command id, domain, queue, enqueue sequence, generation,
    attempts, state version."""
    return (
        command_id,
        queue.domain,
        queue.queue,
        str(meta.enqueue_sequence),
        str(meta.delivery_generation),
        str(meta.attempts),
        str(meta.state_version),
    )


def dead_letter(stage: Staged, work: Working, message_id: str, meta: MessageMeta, ctx: Context) -> MessageMeta:
    """Park an exhausted message, or mark it pending when the dead-letter sublimit is full."""
    fits = has_dead_letter_room(work.view, meta.body_bytes)
    return enter(
        stage, work, message_id, meta, MessageState.dead_lettered if fits else MessageState.pending_dead_letter, ctx
    )


def end_attempt(
    stage: Staged,
    work: Working,
    message_id: str,
    meta: MessageMeta,
    ctx: Context,
    delay_ms: int | None = None,
) -> MessageMeta:
    """A leased attempt failed (nack or lease expiry): expire, dead-letter, or schedule a retry.

    Expiry wins over retry; a message that used up max_attempts is dead-lettered;
    otherwise it is scheduled after `delay_ms` (a nack's own delay) or the backoff.
    The message's metadata after it.
    """
    meta = leave(stage, work, message_id, meta)
    queue = work.view
    if expired(meta, ctx.now_ms):
        return enter(stage, work, message_id, meta, MessageState.expired, ctx)
    if meta.attempts >= queue.policy.max_attempts:
        return dead_letter(stage, work, message_id, meta, ctx)
    if delay_ms is None:
        _, jitter_key = active_key(stage, ctx.keyring, JITTER)
        material = _jitter_material(ctx.command_id, queue, meta)
        delay_ms = retry_delay_ms(queue.policy, meta.attempts, jitter_key, material)
    meta = replace(meta, last_retry_delay_ms=delay_ms)
    return enter(stage, work, message_id, meta, MessageState.scheduled, ctx, not_before_ms=ctx.now_ms + delay_ms)


# -- timers ------------------------------------------------------------------------------


def receive_result(deliveries: list[Record]) -> tuple[str, Record]:
    """What a waiting Receive completes with: its deliveries (none at its deadline)."""
    return "keyload.result.ReceiveResult", {"deliveries": deliveries, "budget_exhausted": False}


def fire_queue_timers(stage: Staged, record: QueueRecord, ctx: Context, budget: int) -> tuple[int, int]:
    """Fire one queue's due timers, examining at most `budget`, and save the queue; returns
    (examined, transitions)."""
    work = Working(record)
    queue_id = record.view.incarnation
    due = due_timers(stage, record, ctx.now_ms, budget)
    transitions = 0
    for key, value in due:
        if stage.get(key) != value:
            continue  # an earlier transition in this batch already moved the message off this timer
        _, kind, sequence = keys.parse_timer(key)
        if kind == keys.TIMER_WAITER:
            work.record = waiters.expire(stage, work.record, ctx, sequence, receive_result([]))
            transitions += 1
            continue
        if kind == keys.TIMER_RESERVATION:
            reservations.abandon_open(stage, work.view, ctx, sequence, ReservationState.expired)
            transitions += 1
            continue
        if kind == keys.TIMER_SERVE:
            stage.delete(key)  # saving the queue below has its waiters served (processors/apply.py)
            continue
        message_id = value.decode("utf-8")
        meta = load_message(stage, queue_id, message_id)
        if meta is None:
            raise Corruption(f"timer {key.hex()} names a missing message")
        state = meta.state
        if kind == keys.TIMER_EXPIRY:
            stage.delete(key)
            if state not in (MessageState.scheduled, MessageState.ready, MessageState.leased):
                raise Corruption(f"expiry timer of a message in state {state}")
            meta = leave(stage, work, message_id, meta)
            enter(stage, work, message_id, meta, MessageState.expired, ctx)
        elif kind == keys.TIMER_NOT_BEFORE:
            meta = leave(stage, work, message_id, meta)  # removes this timer row
            enter(stage, work, message_id, meta, MessageState.ready, ctx)
        elif kind == keys.TIMER_LEASE:
            end_attempt(stage, work, message_id, meta, ctx)
        else:
            raise Corruption(f"timer {key.hex()} has unknown kind {kind}")
        transitions += 1
    save_queue(stage, work.record)
    return len(due), transitions
