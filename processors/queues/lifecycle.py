"""Message state transitions: every move leaves one state's index row and enters another's.

`leave` and `enter` are the only places that touch state indexes and per-state
counters, so each transition keeps them exact by construction. Terminal states
(acked, expired, cancelled) release the body and the stored quota exactly once;
their metadata stays as a tombstone so a message id is never reused.
"""

from __future__ import annotations

import hashlib
import hmac

from keyload.log.codec import Record
from keyload.processors import waiters
from keyload.processors.context import Context
from keyload.processors.errors import Corruption
from keyload.processors.key_rotation import JITTER, active_key
from keyload.processors.payloads import reservations, retention
from keyload.processors.queues.state import (
    LIVE_STATES,
    TERMINAL_TOTALS,
    add_index_row,
    add_timer_row,
    adjust,
    dead_letter_limits,
    due_timers,
    load_message,
    remove_index_row,
    save_message,
)
from keyload.projections import keys
from keyload.projections.store import Staged


def _state_row(queue_id: int, meta: Record) -> bytes | None:
    """The index row that holds a message in its current state (None for terminal states)."""
    state, sequence = meta["state"], meta["enqueue_sequence"]
    if state == "scheduled":
        return keys.timer(queue_id, meta["not_before_ms"], keys.TIMER_NOT_BEFORE, sequence)
    if state == "ready":
        return keys.ready(queue_id, meta["ready_sequence"])
    if state == "leased":
        return keys.timer(queue_id, meta["lease_until_ms"], keys.TIMER_LEASE, sequence)
    if state == "dead_lettered":
        return keys.dead_letter(queue_id, meta["parked_sequence"])
    if state == "pending_dead_letter":
        return keys.pending_dead_letter(queue_id, sequence)
    return None


def _expiry_timer(queue_id: int, meta: Record) -> bytes:
    return keys.timer(queue_id, meta["expires_at_ms"], keys.TIMER_EXPIRY, meta["enqueue_sequence"])


def leave(stage: Staged, record: Record, message_id: str, meta: Record) -> None:
    """Take a live message out of its state's index and counter."""
    state = meta["state"]
    if state not in LIVE_STATES:
        raise Corruption(f"message {meta['enqueue_sequence']} leaves terminal state {state}")
    queue = record["view"]
    row = _state_row(queue["incarnation"], meta)
    assert row is not None
    remove_index_row(stage, row, message_id)
    counters = queue["counters"]
    adjust(counters, state, -1)
    if state == "ready":
        meta["ready_sequence"] = None
    elif state == "leased":
        meta["lease_until_ms"] = None
        meta["lease_owner"] = None
    elif state == "dead_lettered":
        adjust(counters, "dead_letter_bytes", -meta["body_bytes"])
        meta["parked_sequence"] = None


def enter(
    stage: Staged,
    record: Record,
    message_id: str,
    meta: Record,
    state: str,
    ctx: Context,
    *,
    not_before_ms: int | None = None,
    lease_until_ms: int | None = None,
    lease_owner: str | None = None,
) -> None:
    """Put a message (fresh, or just out of `leave`) into `state` and save it."""
    queue = record["view"]
    queue_id = queue["incarnation"]
    counters = queue["counters"]
    meta["state"] = state
    meta["state_version"] += 1
    if state == "scheduled":
        assert not_before_ms is not None
        meta["not_before_ms"] = not_before_ms
    elif state == "ready":
        meta["ready_sequence"] = record["next_ready_sequence"]
        record["next_ready_sequence"] += 1
    elif state == "leased":
        assert lease_until_ms is not None and lease_owner is not None
        meta["lease_until_ms"] = lease_until_ms
        meta["lease_owner"] = lease_owner
    elif state == "dead_lettered":
        meta["parked_sequence"] = record["next_parked_sequence"]
        record["next_parked_sequence"] += 1
        adjust(counters, "dead_letter_bytes", meta["body_bytes"])
    if state in ("scheduled", "leased"):
        due = meta["not_before_ms"] if state == "scheduled" else meta["lease_until_ms"]
        kind = keys.TIMER_NOT_BEFORE if state == "scheduled" else keys.TIMER_LEASE
        add_timer_row(stage, record, due, kind, meta["enqueue_sequence"], message_id)
    elif state in LIVE_STATES:
        row = _state_row(queue_id, meta)
        assert row is not None
        add_index_row(stage, row, message_id)
    if state in LIVE_STATES:
        adjust(counters, state, 1)
    else:
        _release(stage, record, message_id, meta, ctx)
        adjust(counters, TERMINAL_TOTALS[state], 1)
    if state in ("dead_lettered", "pending_dead_letter"):
        meta["dead_lettered_at_ms"] = ctx.now_ms
        _drop_expiry(stage, queue_id, meta)
    _keep_ordering_row(stage, queue, message_id, meta)
    save_message(stage, queue_id, message_id, meta)


def holds_its_key(policy: Record, state: str) -> bool:
    """Whether a message in `state` still holds back later messages of its ordering key.

    Every live state does, except a dead letter under parked_head=continue, which
    releases its successors; under block a parked head keeps holding them.
    """
    if state not in LIVE_STATES:
        return False
    return policy["parked_head"] == "block" or state not in ("dead_lettered", "pending_dead_letter")


def _keep_ordering_row(stage: Staged, queue: Record, message_id: str, meta: Record) -> None:
    """In a strict_per_key queue, a message is in its key's ordering index while it holds the key.

    The key's head row (`h`) holds the lowest sequence in its ordering index and
    exists exactly while the index has rows, so finding a key's head is one read.
    """
    if queue["policy"]["ordering"] != "strict_per_key" or meta["ordering_key"] is None:
        return
    queue_id, key, sequence = queue["incarnation"], meta["ordering_key"], meta["enqueue_sequence"]
    row = keys.ordering(queue_id, key, sequence)
    head_key = keys.key_head(queue_id, key)
    raw_head = stage.get(head_key)
    head = None if raw_head is None else keys.read_u64(raw_head)
    if holds_its_key(queue["policy"], meta["state"]):
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


def is_key_head(stage: Staged, queue: Record, meta: Record) -> bool:
    """Whether the message is the oldest unresolved one of its ordering key (always true without one)."""
    if queue["policy"]["ordering"] != "strict_per_key" or meta["ordering_key"] is None:
        return True
    raw_head = stage.get(keys.key_head(queue["incarnation"], meta["ordering_key"]))
    if raw_head is None:
        raise Corruption("a keyed message is missing from its ordering index")
    sequence: int = meta["enqueue_sequence"]
    return keys.read_u64(raw_head) == sequence


def _release(stage: Staged, record: Record, message_id: str, meta: Record, ctx: Context) -> None:
    """A message reaches a terminal state: its body and quota go, its expiry no longer applies.

    A large message's object is not deleted here: this command is its retire intent, and
    the object goes through the guarded retention workflow (processors/payloads/retention.py)."""
    queue_id = record["view"]["incarnation"]
    counters = record["view"]["counters"]
    adjust(counters, "stored_messages", -1)
    adjust(counters, "stored_bytes", -meta["body_bytes"])
    stage.delete(keys.body(queue_id, message_id))
    _drop_expiry(stage, queue_id, meta)
    meta["terminal_at_ms"] = ctx.now_ms
    if meta["payload"] is not None:
        retention.retire_payload(stage, record, message_id, meta, ctx)


def _drop_expiry(stage: Staged, queue_id: int, meta: Record) -> None:
    # The expiry timer may have fired already (it is what expired the message): a plain delete.
    if meta["expires_at_ms"] is not None:
        stage.delete(_expiry_timer(queue_id, meta))


def add_expiry(stage: Staged, record: Record, message_id: str, meta: Record) -> None:
    if meta["expires_at_ms"] is not None:
        add_timer_row(stage, record, meta["expires_at_ms"], keys.TIMER_EXPIRY, meta["enqueue_sequence"], message_id)


def expired(meta: Record, now_ms: int) -> bool:
    return meta["expires_at_ms"] is not None and meta["expires_at_ms"] <= now_ms


# -- retries and dead letters ------------------------------------------------------------


def retry_delay_ms(policy: Record, attempts: int, jitter_key: bytes, material: tuple[str, ...]) -> int:
    """Backoff before the next attempt: min(base · factor^(attempts-1), max), optionally full jitter.

    Full jitter is deterministic: 1 + (HMAC-SHA256 over `material` — the triggering
    command id and what names the attempt — first 8 bytes big-endian) mod cap, so a
    replay chooses the same delay. Queues and subscription groups share it.
    """
    cap = policy["retry_base_ms"]
    for _ in range(attempts - 1):
        if cap >= policy["retry_max_ms"]:
            break
        cap *= policy["retry_factor"]
    cap = min(cap, policy["retry_max_ms"])
    if policy["retry_jitter"] == "none" or cap == 0:
        return int(cap)
    digest = hmac.new(jitter_key, "\x00".join(material).encode("utf-8"), hashlib.sha256).digest()
    return 1 + int.from_bytes(digest[:8], "big") % int(cap)


def _jitter_material(command_id: str, queue: Record, meta: Record) -> tuple[str, ...]:
    """What a message's jitter draws on: command id, domain, queue, enqueue sequence, generation,
    attempts, state version."""
    return (
        command_id,
        queue["domain"],
        queue["queue"],
        str(meta["enqueue_sequence"]),
        str(meta["delivery_generation"]),
        str(meta["attempts"]),
        str(meta["state_version"]),
    )


def dead_letter(stage: Staged, record: Record, message_id: str, meta: Record, ctx: Context) -> None:
    """Park an exhausted message, or mark it pending when the dead-letter sublimit is full."""
    counters = record["view"]["counters"]
    max_messages, max_bytes = dead_letter_limits(record["view"]["policy"])
    fits = counters["dead_lettered"] + 1 <= max_messages and counters["dead_letter_bytes"] + meta["body_bytes"] <= (
        max_bytes
    )
    enter(stage, record, message_id, meta, "dead_lettered" if fits else "pending_dead_letter", ctx)


def end_attempt(
    stage: Staged,
    record: Record,
    message_id: str,
    meta: Record,
    ctx: Context,
    delay_ms: int | None = None,
) -> None:
    """A leased attempt failed (nack or lease expiry): expire, dead-letter, or schedule a retry.

    Expiry wins over retry; a message that used up max_attempts is dead-lettered;
    otherwise it is scheduled after `delay_ms` (a nack's own delay) or the backoff.
    """
    leave(stage, record, message_id, meta)
    queue = record["view"]
    if expired(meta, ctx.now_ms):
        enter(stage, record, message_id, meta, "expired", ctx)
    elif meta["attempts"] >= queue["policy"]["max_attempts"]:
        dead_letter(stage, record, message_id, meta, ctx)
    else:
        if delay_ms is None:
            _, jitter_key = active_key(stage, ctx.keyring, JITTER)
            material = _jitter_material(ctx.command_id, queue, meta)
            delay_ms = retry_delay_ms(queue["policy"], meta["attempts"], jitter_key, material)
        meta["last_retry_delay_ms"] = delay_ms
        enter(stage, record, message_id, meta, "scheduled", ctx, not_before_ms=ctx.now_ms + delay_ms)


# -- timers ------------------------------------------------------------------------------


def receive_result(deliveries: list[Record]) -> tuple[str, Record]:
    """What a waiting Receive completes with: its deliveries (none at its deadline)."""
    return "keyload.result.ReceiveResult", {"deliveries": deliveries, "budget_exhausted": False}


def fire_queue_timers(stage: Staged, record: Record, ctx: Context, budget: int) -> tuple[int, int]:
    """Fire one queue's due timers, examining at most `budget`; returns (examined, transitions)."""
    queue_id = record["view"]["incarnation"]
    due = due_timers(stage, record, ctx.now_ms, budget)
    transitions = 0
    for key, value in due:
        if stage.get(key) != value:
            continue  # an earlier transition in this batch already moved the message off this timer
        _, kind, sequence = keys.parse_timer(key)
        if kind == keys.TIMER_WAITER:
            waiters.expire(stage, record, ctx, sequence, receive_result([]))
            transitions += 1
            continue
        if kind == keys.TIMER_RESERVATION:
            reservations.expire_reservation(stage, record, ctx, sequence)
            transitions += 1
            continue
        message_id = value.decode("utf-8")
        meta = load_message(stage, queue_id, message_id)
        if meta is None:
            raise Corruption(f"timer {key.hex()} names a missing message")
        state = meta["state"]
        if kind == keys.TIMER_EXPIRY:
            stage.delete(key)
            if state not in ("scheduled", "ready", "leased"):
                raise Corruption(f"expiry timer of a message in state {state}")
            leave(stage, record, message_id, meta)
            enter(stage, record, message_id, meta, "expired", ctx)
        elif kind == keys.TIMER_NOT_BEFORE:
            leave(stage, record, message_id, meta)  # removes this timer row
            enter(stage, record, message_id, meta, "ready", ctx)
        elif kind == keys.TIMER_LEASE:
            end_attempt(stage, record, message_id, meta, ctx)
        else:
            raise Corruption(f"timer {key.hex()} has unknown kind {kind}")
        transitions += 1
    return len(due), transitions
