"""Model-based test: a strict_per_key queue at feature level 15 under random enqueues, receives, acks
and retries (max_attempts at its maximum: none dead-letters), against a model of §6 "Strict per-key
ordering".

Checked after every receive: each delivery is the oldest unresolved message of its key and no other
message of that key is leased; and while the model holds a deliverable message (a ready key head, or
a ready unkeyed message) a few receives deliver one, however many held messages lie in front of it
(one rule enqueues more than a receive examines behind one head). The run ends with a drain that
delivers every message, each key's in enqueue order, and a replay that reaches the live digest.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from keyload import limits
from keyload.processors.features import HELD_OUT_OF_READY
from keyload.sdk.results import ReceiveResult

from .support import (
    ACK,
    CREATE_QUEUE,
    ENQUEUE,
    RAISE_FEATURE_LEVEL,
    Embedded,
    close_after_replay_check,
    create_queue_body,
    enqueue_body,
)

D = "acme"
NACK = "keyload.command.Nack"
RECEIVE = "keyload.command.Receive"
KEYS = st.sampled_from(["A", "B", None])
LONG_RUN = limits.RECEIVE_EXAMINATION_BUDGET + 20  # held messages behind one head: more than a receive examines
TRIES = 3  # receives that must deliver a deliverable message: ceil(held / budget) + 1 at most


@dataclass
class Message:
    key: str | None
    leased: str | None = None  # the token while leased


class StrictQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-ordering-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        assert self.submit(RAISE_FEATURE_LEVEL, {"level": HELD_OUT_OF_READY}).status == "committed"
        body = create_queue_body(
            "q",
            ordering="strict_per_key",
            max_stored_messages=2_000,
            max_in_flight=1_000,
            max_attempts=limits.MAX_ATTEMPTS,
        )
        assert self.submit(CREATE_QUEUE, body).status == "committed"
        self.messages: dict[str, Message] = {}  # unresolved, in enqueue order
        self.keys: dict[str, str | None] = {}  # every message's key
        self.acked: list[str] = []
        self.long_run_done = False

    def submit(self, kind: str, body: dict[str, object]):  # type: ignore[no-untyped-def]
        return self.embedded.submit(D, kind, body)

    def enqueue(self, key: str | None) -> None:
        message_id = f"m{len(self.messages) + len(self.acked)}"
        assert self.submit(ENQUEUE, enqueue_body("q", message_id, b"x", ordering_key=key)).status == "committed"
        self.messages[message_id] = Message(key)
        self.keys[message_id] = key

    def head(self, key: str) -> str:
        return next(message_id for message_id, m in self.messages.items() if m.key == key)

    def deliverable(self) -> bool:
        """Whether the model holds a ready unkeyed message or a key whose head is not leased."""
        heads: dict[str, Message] = {}
        for message in self.messages.values():
            if message.key is None and message.leased is None:
                return True
            if message.key is not None:
                heads.setdefault(message.key, message)
        return any(head.leased is None for head in heads.values())

    def receive(self) -> list[str]:
        result = self.submit(RECEIVE, {"queue": "q", "max_messages": 10, "max_bytes": None, "lease_ms": 60_000})
        assert isinstance(result.result, ReceiveResult), result
        delivered = []
        for delivery in result.result.deliveries:
            message = self.messages[delivery.message_id]
            assert message.leased is None, f"{delivery.message_id} delivered while leased"
            if message.key is not None:
                assert self.head(message.key) == delivery.message_id, f"{delivery.message_id} is not its key's head"
            message.leased = delivery.token
            delivered.append(delivery.message_id)
        return delivered

    def leased(self) -> list[str]:
        return [message_id for message_id, m in self.messages.items() if m.leased is not None]

    @rule(key=KEYS, count=st.integers(1, 4))
    def enqueue_some(self, key: str | None, count: int) -> None:
        for _ in range(count):
            self.enqueue(key)

    @precondition(lambda self: not self.long_run_done)
    @rule()
    def enqueue_a_long_run(self) -> None:
        self.long_run_done = True
        for _ in range(LONG_RUN):
            self.enqueue("A")

    @rule()
    def receive_while_deliverable(self) -> None:
        expected = self.deliverable()
        delivered: list[str] = []
        for _ in range(TRIES):
            delivered = self.receive()
            if delivered or not expected:
                break
        assert bool(delivered) == expected, "a deliverable message was not delivered"

    @precondition(lambda self: bool(self.leased()))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(self.leased()))
        token = self.messages[message_id].leased
        assert self.submit(ACK, {"token": token}).status == "committed"
        del self.messages[message_id]
        self.acked.append(message_id)

    @precondition(lambda self: bool(self.leased()))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """A nack due at once: the head goes to the back of the ready order and still holds its key."""
        message_id = data.draw(st.sampled_from(self.leased()))
        message = self.messages[message_id]
        assert self.submit(NACK, {"token": message.leased, "delay_ms": 0}).status == "committed"
        message.leased = None

    def teardown(self) -> None:
        try:
            while self.messages:  # drain: everything is delivered, each key's in enqueue order
                for message_id in self.leased():
                    assert self.submit(ACK, {"token": self.messages[message_id].leased}).status == "committed"
                    del self.messages[message_id]
                    self.acked.append(message_id)
                if self.messages:
                    assert any(self.receive() for _ in range(TRIES)), "the drain stalled"
            for key in ("A", "B"):
                mine = [message_id for message_id in self.acked if self.keys[message_id] == key]
                assert mine == sorted(mine, key=lambda message_id: int(message_id[1:]))
        finally:
            close_after_replay_check(self.embedded, self.directory)


StrictQueueMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=25, deadline=None)
test_strict_ordering_against_its_model = StrictQueueMachine.TestCase
