"""Long-poll receive: a Receive with nothing ready waits in the log, served by a later message or its deadline."""

from __future__ import annotations

from pathlib import Path

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.operations.recovery import replay
from keyload.processors.features import WAITERS_FOLLOW_REPEATS

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_QUEUE,
    RAISE_FEATURE_LEVEL,
    TICK,
    Embedded,
    command,
    create_queue_body,
    enqueue_body,
)

D = "acme"
RECEIVE = "keyload.command.Receive"


def receive_body(wait_ms: int | None, max_messages: int = 5) -> dict[str, object]:
    return {"queue": "q", "max_messages": max_messages, "max_bytes": None, "lease_ms": None, "wait_ms": wait_ms}


def published(embedded: Embedded, cursor: int) -> list[dict[str, object]]:
    return [REGISTRY.decode("keyload.Outcome", r.value) for r in embedded.outcomes.read(0, cursor, 1_000)]


def start_waiting(embedded: Embedded, command_id: str, wait_ms: int, principal: str = "tester") -> int:
    value = command(D, RECEIVE, receive_body(wait_ms), command_id, principal=principal, reply_to=0)
    offset = embedded.append(D, value)
    embedded.run()
    return offset


def test_a_waiting_receive_is_served_by_the_next_enqueue(embedded: Embedded, tmp_path: Path) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("q"))
    cursor = embedded.outcomes.end_offset(0)
    offset = start_waiting(embedded, "wait-1", 20_000, principal="worker")
    assert published(embedded, cursor) == []  # nothing to say yet
    embedded.now_ms += 700
    embedded.submit(D, ENQUEUE, enqueue_body("q", "m1", b"hello"))
    [enqueued, served] = published(embedded, cursor)
    assert served["command_id"] == "wait-1" and served["offset"] == offset
    assert served["eval_time_ms"] == enqueued["eval_time_ms"]  # served in the same processing round
    [delivery] = served["result"][1]["deliveries"]  # type: ignore[index]
    assert delivery["message_id"] == "m1" and delivery["body"] == b"hello"
    # The lease belongs to the waiting receive's principal.
    assert delivery["token"]
    counters = embedded.submit(D, INSPECT_QUEUE, {"queue": "q"}).result.counters  # type: ignore[union-attr]
    assert (counters.ready, counters.leased) == (0, 1)
    assert embedded.digest(D) == replay(embedded.data, embedded.partition(D), tmp_path / "r", progress=False).digest


def test_a_waiting_receive_ends_empty_at_its_deadline_and_a_retry_returns_that(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("q"))
    cursor = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "wait-2", 1_000)
    # A retry of the same command while it waits neither publishes nor waits twice.
    start_waiting(embedded, "wait-2", 1_000)
    assert published(embedded, cursor) == []
    embedded.now_ms += 999
    embedded.submit(D, TICK, {})
    assert [o["command_id"] for o in published(embedded, cursor)][-1] != "wait-2"
    embedded.now_ms += 1
    embedded.submit(D, TICK, {})
    ended = [o for o in published(embedded, cursor) if o["command_id"] == "wait-2"]
    assert len(ended) == 1 and ended[0]["result"][1]["deliveries"] == []  # type: ignore[index]
    again = embedded.submit(D, RECEIVE, receive_body(1_000), command_id="wait-2")
    assert again.result is not None and again.result.deliveries == []  # type: ignore[union-attr]
    # The message enqueued after the deadline is for the next receive, not the ended one.
    embedded.submit(D, ENQUEUE, enqueue_body("q", "m1"))
    assert embedded.submit(D, INSPECT_QUEUE, {"queue": "q"}).result.counters.ready == 1  # type: ignore[union-attr]


def test_waiters_are_served_oldest_first_and_each_gets_its_own_messages(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("q"))
    cursor = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "first", 20_000)
    start_waiting(embedded, "second", 20_000)
    embedded.submit(D, ENQUEUE, enqueue_body("q", "m1"))
    served = {o["command_id"]: o for o in published(embedded, cursor) if o["result"] and "deliveries" in o["result"][1]}
    assert set(served) == {"first"}
    embedded.submit(D, ENQUEUE, enqueue_body("q", "m2"))
    served = {o["command_id"]: o for o in published(embedded, cursor) if o["result"] and "deliveries" in o["result"][1]}
    assert set(served) == {"first", "second"}
    assert served["second"]["result"][1]["deliveries"][0]["message_id"] == "m2"  # type: ignore[index]


def test_wait_is_bounded(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("q"))
    outcome = embedded.submit(D, RECEIVE, receive_body(limits.MAX_WAIT_MS + 1))
    assert outcome.error_code == "Validation" and "wait_ms" in outcome.detail


def test_a_receive_repeated_while_it_waits_is_answered_where_the_repeat_asks(
    embedded: Embedded, tmp_path: Path
) -> None:
    """A client whose server stopped resubmits its long poll through another (on Kafka, one reading
    another reply partition): from feature level 13 the waiter's outcome is published to the reply
    partition its latest repeat names. Below it, to the first one's only, as those logs replay."""
    embedded.submit(D, RAISE_FEATURE_LEVEL, {"level": WAITERS_FOLLOW_REPEATS - 1})
    embedded.submit(D, CREATE_QUEUE, create_queue_body("q"))

    def answered(command_id: str, message_id: str) -> list[int]:
        """The reply partitions the waiting receive's outcome went to, once `message_id` came."""
        cursors = [embedded.outcomes.end_offset(partition) for partition in (0, 1)]
        for reply_to in (0, 1):
            embedded.append(D, command(D, RECEIVE, receive_body(20_000), command_id, reply_to=reply_to))
            embedded.run()
        embedded.submit(D, ENQUEUE, enqueue_body("q", message_id))
        return [
            partition
            for partition, cursor in zip((0, 1), cursors, strict=True)
            for record in embedded.outcomes.read(partition, cursor, 1_000)
            if REGISTRY.decode("keyload.Outcome", record.value)["command_id"] == command_id
        ]

    assert answered("before", "m1") == [0]
    embedded.submit(D, RAISE_FEATURE_LEVEL, {"level": WAITERS_FOLLOW_REPEATS})
    assert answered("after", "m2") == [1]
    assert embedded.digest(D) == replay(embedded.data, embedded.partition(D), tmp_path / "r", progress=False).digest
