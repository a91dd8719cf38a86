"""Model-based test: random enqueue/tick/configure sequences against a reference model of a queue."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyload.log.codec import REGISTRY
from keyload.projections import keys

from .support import (
    CONFIGURE_QUEUE,
    CREATE_QUEUE,
    ENQUEUE,
    TICK,
    Embedded,
    close_after_replay_check,
    create_queue_body,
    enqueue_body,
)

D = "acme"
MAX_BYTES = 400


@dataclass
class ModelMessage:
    state: str
    size: int
    not_before: int | None
    expires_at: int | None


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        self.max_messages = 12
        policy = create_queue_body("jobs", max_stored_messages=self.max_messages, max_stored_bytes=MAX_BYTES)
        assert self.embedded.submit(D, CREATE_QUEUE, policy).status == "committed"
        self.messages: dict[str, ModelMessage] = {}
        self.expired_total = 0

    def fire_due(self) -> None:
        """Every applied command first lets log time fire what is due."""
        now = self.embedded.now_ms
        for message in self.live():
            if message.expires_at is not None and message.expires_at <= now:
                message.state = "expired"
                self.expired_total += 1
            elif message.state == "scheduled" and message.not_before is not None and message.not_before <= now:
                message.state = "ready"

    def live(self) -> list[ModelMessage]:
        return [m for m in self.messages.values() if m.state in ("scheduled", "ready")]

    @rule(
        size=st.integers(0, 60),
        delay=st.none() | st.integers(1, 100),
        ttl=st.none() | st.integers(1, 200),
    )
    def enqueue(self, size: int, delay: int | None, ttl: int | None) -> None:
        now = self.embedded.now_ms
        not_before = None if delay is None else now + delay
        expires_at = None if ttl is None else (not_before or now) + ttl
        message_id = f"m{len(self.messages)}"
        fields = {"not_before_ms": not_before, "expires_at_ms": expires_at}
        outcome = self.embedded.submit(D, ENQUEUE, enqueue_body("jobs", message_id, b"b" * size, **fields))
        self.fire_due()
        live = self.live()
        fits = len(live) + 1 <= self.max_messages and sum(m.size for m in live) + size <= MAX_BYTES
        if not fits:
            assert outcome.error_code == "ResourceExhausted", outcome
            return
        assert outcome.status == "committed", outcome
        state = "scheduled" if not_before is not None else "ready"
        self.messages[message_id] = ModelMessage(state, size, not_before, expires_at)

    @rule(ms=st.integers(0, 150))
    def advance(self, ms: int) -> None:
        self.embedded.now_ms += ms

    @rule()
    def tick(self) -> None:
        outcome = self.embedded.submit(D, TICK, {})
        assert outcome.status == "committed"
        self.fire_due()

    @precondition(lambda self: len(self.messages) > 0)
    @rule(limit=st.integers(1, 15))
    def reconfigure(self, limit: int) -> None:
        policy = create_queue_body("jobs", max_stored_messages=limit, max_stored_bytes=MAX_BYTES)["policy"]
        body = {"queue": "jobs", "policy": policy, "expected_policy_version": None}
        assert self.embedded.submit(D, CONFIGURE_QUEUE, body).status == "committed"
        self.fire_due()
        self.max_messages = limit

    @invariant()
    def counters_match_the_model(self) -> None:
        raw = self.embedded.store(D).get(keys.queue(D, "jobs"))
        assert raw is not None
        counters = REGISTRY.decode("keyload.QueueRecord", raw)["view"]["counters"]
        live = self.live()
        assert counters["stored_messages"] == len(live)
        assert counters["stored_bytes"] == sum(m.size for m in live)
        assert counters["scheduled"] == sum(m.state == "scheduled" for m in live)
        assert counters["ready"] == sum(m.state == "ready" for m in live)
        assert counters["expired_total"] == self.expired_total
        assert counters["enqueued_total"] == len(self.messages)

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


QueueMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_queue_model = QueueMachine.TestCase
