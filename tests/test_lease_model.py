"""Model-based test of the lease lifecycle: random consumer and operator commands against a reference model.

The model is plain Python written from the documented behaviour (docs/ARCHITECTURE.md §6):
states, attempts, generations, deadlines, backoff, dead-letter sublimits and timer order.
It does not import the processors.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from keyload.log.codec import REGISTRY
from keyload.processors.features import LEASES_KEPT
from keyload.projections import keys
from keyload.sdk.results import AckBatchResult, LeaseResult, Outcome, ReceiveResult

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    TICK,
    Embedded,
    close_after_replay_check,
    create_queue_body,
    enqueue_body,
    expect,
    submit_unhalted,
)

D = "acme"
BASE_POLICY = {
    "max_stored_messages": 6,
    "max_stored_bytes": 60,
    "lease_ms": 100,
    "max_lease_ms": 1_000,
    "retry_base_ms": 50,
    "retry_factor": 2,
    "retry_max_ms": 80,
    "receive_max_messages": 3,
    "receive_max_bytes": 40,
}
LIVE = ("scheduled", "ready", "leased", "dead_lettered", "pending_dead_letter")
TERMINAL_TOTAL = {"acked": "acked_total", "expired": "expired_total", "cancelled": "cancelled_total"}
EXPIRY, LEASE, NOT_BEFORE = 0, 1, 2  # timer kinds in the order they fire at the same instant
SIZES = st.sampled_from([0, 1, 5, 10, 15])


@dataclass
class Message:
    body: bytes
    sequence: int
    expires_at: int | None
    state: str = "new"
    state_version: int = 0
    attempts: int = 0
    generation: int = 1
    lease_version: int = 0
    not_before: int | None = None
    lease_until: int | None = None
    ready_sequence: int | None = None
    parked_sequence: int | None = None
    last_retry_delay: int | None = None


@dataclass(frozen=True)
class Token:
    text: str
    message_id: str
    generation: int
    lease_version: int


class Model:
    """The queue as documented: every method is one transition or one command's effect."""

    def __init__(self, policy: dict[str, Any]) -> None:
        self.policy = policy
        self.messages: dict[str, Message] = {}
        self.next_sequence = self.next_ready = self.next_parked = 1
        self.totals = {"enqueued_total": 0, "acked_total": 0, "expired_total": 0, "cancelled_total": 0}
        self.paused = False  # PauseQueue: receives are refused with DispatchPaused
        self.closed = False  # CloseQueue: enqueues are refused with Conflict

    def live(self) -> list[Message]:
        return [m for m in self.messages.values() if m.state in LIVE]

    def count(self, state: str) -> int:
        return sum(m.state == state for m in self.messages.values())

    def enter(self, message: Message, state: str) -> None:
        assert message.state not in TERMINAL_TOTAL, "terminal states never change"
        message.state = state
        message.state_version += 1
        message.ready_sequence = message.parked_sequence = None
        if state != "leased":
            message.lease_until = None
        if state == "ready":
            message.ready_sequence = self.next_ready
            self.next_ready += 1
        elif state == "dead_lettered":
            message.parked_sequence = self.next_parked
            self.next_parked += 1
        elif state in TERMINAL_TOTAL:
            self.totals[TERMINAL_TOTAL[state]] += 1

    def dead_letter_fits(self, message: Message) -> bool:
        parked = [m for m in self.messages.values() if m.state == "dead_lettered"]
        max_messages: int = self.policy["max_dead_letter_messages"]
        max_bytes: int = self.policy["max_dead_letter_bytes"]
        return len(parked) + 1 <= max_messages and sum(len(m.body) for m in parked) + len(message.body) <= max_bytes

    def end_attempt(self, message: Message, now: int, delay: int | None = None) -> None:
        if message.expires_at is not None and message.expires_at <= now:
            self.enter(message, "expired")
        elif message.attempts >= self.policy["max_attempts"]:
            self.enter(message, "dead_lettered" if self.dead_letter_fits(message) else "pending_dead_letter")
        else:
            if delay is None:
                backoff = self.policy["retry_base_ms"] * self.policy["retry_factor"] ** (message.attempts - 1)
                delay = min(backoff, self.policy["retry_max_ms"])
            message.last_retry_delay = delay
            message.not_before = now + delay
            self.enter(message, "scheduled")

    def timers(self) -> list[tuple[int, int, int, str]]:
        found = []
        for message_id, m in self.messages.items():
            if m.expires_at is not None and m.state in ("scheduled", "ready", "leased"):
                found.append((m.expires_at, EXPIRY, m.sequence, message_id))
            if m.state == "scheduled":
                assert m.not_before is not None
                found.append((m.not_before, NOT_BEFORE, m.sequence, message_id))
            if m.state == "leased":
                assert m.lease_until is not None
                found.append((m.lease_until, LEASE, m.sequence, message_id))
        return sorted(found)

    def fire_due(self, now: int) -> None:
        """Every record first fires what is due at its evaluation time, earliest first."""
        while True:
            due = [t for t in self.timers() if t[0] <= now]
            if not due:
                return
            _, kind, _, message_id = due[0]
            message = self.messages[message_id]
            if kind == EXPIRY:
                self.enter(message, "expired")
            elif kind == NOT_BEFORE:
                self.enter(message, "ready")
            else:
                self.end_attempt(message, now)

    def deliverable(self) -> list[str]:
        ready = [(m.ready_sequence or 0, i) for i, m in self.messages.items() if m.state == "ready"]
        return [i for _, i in sorted(ready)]

    def parked(self) -> list[str]:
        parked = [(m.parked_sequence or 0, i) for i, m in self.messages.items() if m.state == "dead_lettered"]
        return [i for _, i in sorted(parked)]

    def counters(self) -> dict[str, int]:
        live = self.live()
        return {
            "stored_messages": len(live),
            "stored_bytes": sum(len(m.body) for m in live),
            **{state: self.count(state) for state in LIVE},
            "dead_letter_bytes": sum(len(m.body) for m in live if m.state == "dead_lettered"),
            **self.totals,
            # this model makes no large-message reservations
            "reserved_messages": 0,
            "reserved_bytes": 0,
            "payload_object_bytes": 0,
        }

    def lease_check(self, token: Token) -> str | None:
        """The refusal a token gets, or None. Timers have fired, so a live lease is never past its deadline."""
        message = self.messages[token.message_id]
        if message.state != "leased" or (message.generation, message.lease_version) != (
            token.generation,
            token.lease_version,
        ):
            return "StaleLease"
        return None


class LeaseMachine(RuleBasedStateMachine):
    LEVEL = LEASES_KEPT  # the partition's feature level (processors/features.py)

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-lease-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        self.model = Model(dict(BASE_POLICY))
        self.policy = self.model.policy
        self.tokens: list[Token] = []
        # command id, body, first answer, its tokens
        self.receives: list[tuple[str, dict[str, Any], ReceiveResult, list[Token]]] = []
        self.enqueued = 0

    @initialize(
        max_attempts=st.integers(1, 3),
        max_in_flight=st.integers(1, 3),
        dead_letter_messages=st.integers(0, 3),
        dead_letter_bytes=st.sampled_from([0, 5, 10, 15, 30]),
        initial=st.lists(st.tuples(SIZES, st.none() | st.integers(50, 400)), min_size=1, max_size=5),
    )
    def create_queue(
        self,
        max_attempts: int,
        max_in_flight: int,
        dead_letter_messages: int,
        dead_letter_bytes: int,
        initial: list[tuple[int, int | None]],
    ) -> None:
        self.policy.update(
            max_attempts=max_attempts,
            max_in_flight=max_in_flight,
            max_dead_letter_messages=dead_letter_messages,
            max_dead_letter_bytes=dead_letter_bytes,
        )
        # From level 3 a receive's outcome keeps its leases, and its repeat re-checks them (repeat_a_receive).
        assert self.submit("keyload.command.RaiseFeatureLevel", {"level": self.LEVEL}).status == "committed"
        assert self.submit(CREATE_QUEUE, create_queue_body("jobs", **self.policy)).status == "committed"
        for size, ttl in initial:
            self.enqueue(size, None, ttl)

    # -- plumbing -------------------------------------------------------------------------

    def submit(self, kind: str, body: dict[str, Any], command_id: str | None = None) -> Outcome:
        """Append and apply one command; the model fires its due timers at the same log time."""
        self.model.fire_due(self.embedded.now_ms)
        return submit_unhalted(self.embedded, D, kind, body, command_id)

    def record(self, name: str, key: bytes) -> dict[str, Any] | None:
        raw = self.embedded.store(D).get(key)
        decoded: dict[str, Any] | None = None if raw is None else REGISTRY.decode(name, raw)
        return decoded

    def index(self, family: bytes) -> list[str]:
        prefix = family + keys.u64(1)
        return [v.decode() for _, v in self.embedded.store(D).scan(prefix, keys.prefix_end(prefix))]

    def fence(self, message_id: str, stale: bool) -> dict[str, Any]:
        message = self.model.messages[message_id]
        return {
            "queue": "jobs",
            "message_id": message_id,
            "expected_state_version": message.state_version - (1 if stale else 0),
            "expected_delivery_generation": message.generation,
        }

    def pick(self, index: int, states: tuple[str, ...] = ()) -> str:
        """A message by index: among those in `states` when there are any, else among all."""
        chosen = [i for i, m in self.model.messages.items() if m.state in states] or list(self.model.messages)
        return chosen[index % len(chosen)]

    # -- rules ------------------------------------------------------------------------------

    @rule(
        size=SIZES,  # few sizes, so byte limits are hit exactly
        delay=st.none() | st.integers(1, 300),
        ttl=st.none() | st.integers(1, 400),
    )
    def enqueue(self, size: int, delay: int | None, ttl: int | None) -> None:
        now = self.embedded.now_ms
        not_before = None if delay is None else now + delay
        expires_at = None if ttl is None else (not_before or now) + ttl
        message_id = f"m{self.enqueued}"
        self.enqueued += 1
        body = bytes([self.enqueued % 256]) * size
        fields = {"not_before_ms": not_before, "expires_at_ms": expires_at}
        outcome = self.submit(ENQUEUE, enqueue_body("jobs", message_id, body, **fields))
        live = self.model.live()
        fits = len(live) + 1 <= self.policy["max_stored_messages"]
        fits = fits and sum(len(m.body) for m in live) + size <= self.policy["max_stored_bytes"]
        refusal = "Conflict" if self.model.closed else None if fits else "ResourceExhausted"
        if not expect(outcome, refusal):
            return
        message = Message(body, self.model.next_sequence, expires_at)
        self.model.next_sequence += 1
        self.model.totals["enqueued_total"] += 1
        self.model.messages[message_id] = message
        message.not_before = not_before
        self.model.enter(message, "scheduled" if not_before is not None else "ready")

    @precondition(lambda self: bool(self.model.messages))
    @rule(index=st.integers(0, 100))
    def enqueue_a_used_id(self, index: int) -> None:
        message_id = self.pick(index)
        expect(self.submit(ENQUEUE, enqueue_body("jobs", message_id)), "Conflict")

    @rule(
        max_messages=st.none() | st.integers(1, 3),
        max_bytes=st.none() | SIZES.filter(bool) | st.integers(1, 40),
        lease_ms=st.none() | st.integers(100, 300),
    )
    def receive(self, max_messages: int | None, max_bytes: int | None, lease_ms: int | None) -> None:
        body = {"queue": "jobs", "max_messages": max_messages, "max_bytes": max_bytes, "lease_ms": lease_ms}
        command_id = f"receive-{self.model.next_sequence}-{self.embedded.log.end_offset(0)}"  # never used before
        outcome = self.submit("keyload.command.Receive", body, command_id)
        result = expect(outcome, "DispatchPaused" if self.model.paused else None)
        if self.model.paused:
            return
        assert isinstance(result, ReceiveResult)
        now = self.embedded.now_ms
        in_flight_room = self.policy["max_in_flight"] - self.model.count("leased")
        wanted = min(max_messages or self.policy["receive_max_messages"], in_flight_room)
        limit = max_bytes or self.policy["receive_max_bytes"]
        claimed: list[str] = []
        size = 0
        for message_id in self.model.deliverable():
            if len(claimed) >= wanted:
                break
            length = len(self.model.messages[message_id].body)
            if claimed and size + length > limit:
                break
            size += length
            claimed.append(message_id)
        assert [d.message_id for d in result.deliveries] == claimed
        for delivery in result.deliveries:
            message = self.model.messages[delivery.message_id]
            message.attempts += 1
            message.lease_version += 1
            message.lease_until = now + (lease_ms or self.policy["lease_ms"])
            self.model.enter(message, "leased")
            assert delivery.body == message.body
            assert (delivery.attempts, delivery.delivery_generation) == (message.attempts, message.generation)
            assert delivery.lease_until_ms == message.lease_until
            self.tokens.append(Token(delivery.token, delivery.message_id, message.generation, message.lease_version))
        self.receives.append((command_id, body, result, self.tokens[len(self.tokens) - len(result.deliveries) :]))

    @precondition(lambda self: bool(self.receives))
    @rule(index=st.integers(0, 100))
    def repeat_a_receive(self, index: int) -> None:
        """A receive sent again under its command id: from level 3 the same deliveries, each as the
        model says its lease stands now: held (its body, its current deadline) or StaleLease with no
        body; below it the first answer as it was."""
        command_id, body, first, tokens = self.receives[index % len(self.receives)]
        result = expect(self.submit("keyload.command.Receive", body, command_id), None)
        assert isinstance(result, ReceiveResult)
        if self.LEVEL < LEASES_KEPT:
            assert result == first
            return
        assert [(d.message_id, d.token) for d in result.deliveries] == [(t.message_id, t.text) for t in tokens]
        for delivery, token in zip(result.deliveries, tokens, strict=True):
            refusal = self.model.lease_check(token)
            message = self.model.messages[token.message_id]
            assert (delivery.error_code, delivery.body) == (refusal, b"" if refusal else message.body)
            if refusal is None:
                assert delivery.lease_until_ms == message.lease_until

    @rule(delay=st.none() | st.integers(0, 100))
    def receive_and_nack_all(self, delay: int | None) -> None:
        """A consumer that fails everything it gets, once retries are due: drives messages to dead letters."""
        self.embedded.now_ms += 80
        before = len(self.tokens)
        self.receive(None, None, None)
        for index in range(before, len(self.tokens)):
            self.nack(index, delay)

    @rule(count=st.integers(1, 3), extra=st.sampled_from([-1, 0, 1]))
    def receive_at_a_byte_boundary(self, count: int, extra: int) -> None:
        """max_bytes just below, at or just above what the first `count` deliverable messages need."""
        sizes = [len(self.model.messages[i].body) for i in self.model.deliverable()[:count]]
        self.receive(None, max(1, min(sum(sizes) + extra, self.policy["receive_max_bytes"])), None)

    @precondition(lambda self: bool(self.tokens))
    @rule(index=st.integers(0, 100), lease_ms=st.none() | st.integers(100, 300))
    def renew(self, index: int, lease_ms: int | None) -> None:
        token = self.tokens[index % len(self.tokens)]
        self.model.fire_due(self.embedded.now_ms)
        refusal = self.model.lease_check(token)
        result = expect(self.submit("keyload.command.Renew", {"token": token.text, "lease_ms": lease_ms}), refusal)
        if refusal is None:
            message = self.model.messages[token.message_id]
            message.lease_until = self.embedded.now_ms + (lease_ms or self.policy["lease_ms"])
            self.model.enter(message, "leased")
            assert result == LeaseResult(
                message_id=token.message_id,
                state="leased",
                lease_until_ms=message.lease_until,
                not_before_ms=None,
                retry_delay_ms=None,
            )

    @precondition(lambda self: bool(self.tokens))
    @rule(index=st.integers(0, 100))
    def ack(self, index: int) -> None:
        token = self.tokens[index % len(self.tokens)]
        self.model.fire_due(self.embedded.now_ms)
        refusal = self.model.lease_check(token)
        result = expect(self.submit("keyload.command.Ack", {"token": token.text}), refusal)
        if refusal is None:
            self.model.enter(self.model.messages[token.message_id], "acked")
            assert result == LeaseResult(
                message_id=token.message_id, state="acked", lease_until_ms=None, not_before_ms=None, retry_delay_ms=None
            )

    @precondition(lambda self: bool(self.tokens))
    @rule(indexes=st.lists(st.integers(0, 100), min_size=1, max_size=4), garbage=st.booleans())
    def ack_batch(self, indexes: list[int], garbage: bool) -> None:
        chosen = [self.tokens[i % len(self.tokens)] for i in indexes]
        texts = [t.text for t in chosen] + (["v1.garbage"] if garbage else [])
        result = expect(self.submit("keyload.command.AckBatch", {"tokens": texts}), None)
        assert isinstance(result, AckBatchResult)
        expected: list[tuple[str, str | None, str | None]] = []
        for token in chosen:
            refusal = self.model.lease_check(token)
            if refusal is None:
                self.model.enter(self.model.messages[token.message_id], "acked")
                expected.append(("committed", None, token.message_id))
            else:
                expected.append(("rejected", refusal, None))
        if garbage:
            expected.append(("rejected", "TokenInvalidated", None))
        assert [(r.status, r.error_code, r.message_id) for r in result.results] == expected

    @precondition(lambda self: bool(self.tokens))
    @rule(index=st.integers(0, 100), delay=st.none() | st.integers(0, 200))
    def nack(self, index: int, delay: int | None) -> None:
        token = self.tokens[index % len(self.tokens)]
        self.model.fire_due(self.embedded.now_ms)
        refusal = self.model.lease_check(token)
        outcome = self.submit("keyload.command.Nack", {"token": token.text, "delay_ms": delay})
        result = expect(outcome, refusal)
        if refusal is None:
            message = self.model.messages[token.message_id]
            self.model.end_attempt(message, self.embedded.now_ms, delay)
            assert isinstance(result, LeaseResult) and result.state == message.state
            if message.state == "scheduled":
                assert (result.not_before_ms, result.retry_delay_ms) == (message.not_before, message.last_retry_delay)

    @rule(paused=st.booleans())
    def pause_or_resume(self, paused: bool) -> None:
        """Dispatch stops or starts again; enqueues, leases in hand and timers go on either way."""
        kind = "keyload.command.PauseQueue" if paused else "keyload.command.ResumeQueue"
        assert expect(self.submit(kind, {"queue": "jobs"}), None).paused == paused
        self.model.paused = paused

    @precondition(lambda self: self.enqueued >= 4)  # late in a run: a closed queue takes no new messages
    @rule()
    def close(self) -> None:
        assert expect(self.submit("keyload.command.CloseQueue", {"queue": "jobs"}), None).closed
        self.model.closed = True

    @rule(ms=st.integers(0, 200) | st.just(1_000))
    def advance(self, ms: int) -> None:
        self.embedded.now_ms += ms

    @rule()
    def tick(self) -> None:
        expect(self.submit(TICK, {}), None)

    @precondition(lambda self: bool(self.model.messages))
    @rule(index=st.integers(0, 100), stale=st.booleans(), anyone=st.booleans())
    def cancel(self, index: int, stale: bool, anyone: bool) -> None:
        message_id = self.pick(index, () if anyone else LIVE)
        body = self.fence(message_id, stale)  # what the operator saw before this record's timers fire
        message = self.model.messages[message_id]
        self.model.fire_due(self.embedded.now_ms)
        code = self.operator_check(message, body)
        expect(self.submit("keyload.command.Cancel", body), code)
        if code is None:
            self.model.enter(message, "cancelled")

    @precondition(lambda self: bool(self.model.messages))
    @rule(index=st.integers(0, 100), stale=st.booleans(), anyone=st.booleans())
    def redrive(self, index: int, stale: bool, anyone: bool) -> None:
        message_id = self.pick(index, () if anyone else ("dead_lettered", "pending_dead_letter"))
        body = self.fence(message_id, stale)
        message = self.model.messages[message_id]
        now = self.embedded.now_ms
        self.model.fire_due(now)
        code = self.operator_check(message, body)
        if code is None and message.state not in ("dead_lettered", "pending_dead_letter"):
            code = "Conflict"
        if code is None and message.expires_at is not None and message.expires_at <= now:
            code = "Conflict"
        expect(self.submit("keyload.command.Redrive", body), code)
        if code is None:
            message.attempts = 0
            message.generation += 1
            self.model.enter(message, "ready")

    @precondition(lambda self: bool(self.model.messages))
    @rule(index=st.integers(0, 100), stale=st.booleans(), anyone=st.booleans())
    def park_pending(self, index: int, stale: bool, anyone: bool) -> None:
        message_id = self.pick(index, () if anyone else ("pending_dead_letter",))
        body = self.fence(message_id, stale)
        message = self.model.messages[message_id]
        self.model.fire_due(self.embedded.now_ms)
        code = self.operator_check(message, body)
        if code is None and message.state != "pending_dead_letter":
            code = "Conflict"
        if code is None and not self.model.dead_letter_fits(message):
            code = "ResourceExhausted"
        expect(self.submit("keyload.command.ParkPending", body), code)
        if code is None:
            self.model.enter(message, "dead_lettered")

    @staticmethod
    def operator_check(message: Message, body: dict[str, Any]) -> str | None:
        if (message.state_version, message.generation) != (
            body["expected_state_version"],
            body["expected_delivery_generation"],
        ):
            return "RevisionConflict"
        if message.state not in LIVE:
            return "Conflict"
        return None

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def queue_and_messages_match_the_model(self) -> None:
        queue = self.record("keyload.QueueRecord", keys.queue(D, "jobs"))
        assert queue is not None
        assert queue["view"]["counters"] == self.model.counters()
        assert (queue["view"]["paused"], queue["view"]["closed"]) == (self.model.paused, self.model.closed)
        for message_id, expected in self.model.messages.items():
            meta = self.record("keyload.MessageMeta", keys.message(1, message_id))
            assert meta is not None
            seen = {
                "state": meta["state"],
                "state_version": meta["state_version"],
                "attempts": meta["attempts"],
                "generation": meta["delivery_generation"],
                "lease_version": meta["lease_version"],
                "expires_at": meta["expires_at_ms"],
                "lease_until": meta["lease_until_ms"],
                "parked_sequence": meta["parked_sequence"],
                "last_retry_delay": meta["last_retry_delay_ms"],
                "not_before": meta["not_before_ms"] if meta["state"] == "scheduled" else None,
            }
            assert seen == {
                "state": expected.state,
                "state_version": expected.state_version,
                "attempts": expected.attempts,
                "generation": expected.generation,
                "lease_version": expected.lease_version,
                "expires_at": expected.expires_at,
                "lease_until": expected.lease_until,
                "parked_sequence": expected.parked_sequence,
                "last_retry_delay": expected.last_retry_delay,
                "not_before": expected.not_before if expected.state == "scheduled" else None,
            }, message_id
            body = self.embedded.store(D).get(keys.body(1, message_id))
            assert body == (expected.body if expected.state in LIVE else None), message_id

    @invariant()
    def every_live_message_is_in_exactly_one_state_index(self) -> None:
        assert self.index(keys.READY) == self.model.deliverable()
        assert self.index(keys.DEAD_LETTER) == self.model.parked()
        pending = sorted(i for i, m in self.model.messages.items() if m.state == "pending_dead_letter")
        assert sorted(self.index(keys.PENDING_DEAD_LETTER)) == pending
        prefix = keys.timer_prefix(1)
        timers = [
            (*keys.parse_timer(k)[:2], v.decode())
            for k, v in self.embedded.store(D).scan(prefix, keys.prefix_end(prefix))
        ]
        assert sorted(timers) == sorted((due, kind, i) for due, kind, _, i in self.model.timers())
        # No message in no index or in two (lost or duplicated); terminal ones in none (not resurrected).
        state_rows = self.index(keys.READY) + self.index(keys.DEAD_LETTER) + self.index(keys.PENDING_DEAD_LETTER)
        state_rows += [i for _, kind, i in timers if kind != 0]
        assert sorted(state_rows) == sorted(i for i, m in self.model.messages.items() if m.state in LIVE)

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


class LeaseMachineAtLevel0(LeaseMachine):
    """The same leases as 0.2.0 logs replay them: a repeated receive returns its stored outcome."""

    LEVEL = 0


LeaseMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
LeaseMachineAtLevel0.TestCase.settings = settings(max_examples=15, stateful_step_count=40, deadline=None)
test_lease_model = LeaseMachine.TestCase
test_lease_model_at_level_0 = LeaseMachineAtLevel0.TestCase
