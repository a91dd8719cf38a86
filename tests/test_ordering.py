"""Strict per-key ordering: only the oldest unresolved message of a key is deliverable."""

from __future__ import annotations

from typing import Any

import pytest

from keyload import limits
from keyload.processors.features import HELD_OUT_OF_READY
from keyload.sdk.results import LeaseResult, ReceiveResult

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_MESSAGE,
    RAISE_FEATURE_LEVEL,
    Embedded,
    create_queue_body,
    enqueue_body,
)

D = "acme"
RECEIVE = "keyload.command.Receive"
NACK = "keyload.command.Nack"
ACK = "keyload.command.Ack"
REDRIVE = "keyload.command.Redrive"


def strict_queue(embedded: Embedded, parked_head: str = "continue", **policy: Any) -> None:
    body = create_queue_body("q", ordering="strict_per_key", parked_head=parked_head, **policy)
    assert embedded.submit(D, CREATE_QUEUE, body).status == "committed"


def enqueue(embedded: Embedded, message_id: str, key: str | None) -> None:
    assert embedded.submit(D, ENQUEUE, enqueue_body("q", message_id, b"x", ordering_key=key)).status == "committed"


def receive(embedded: Embedded, max_messages: int = 10) -> dict[str, str]:
    body = {"queue": "q", "max_messages": max_messages, "max_bytes": None, "lease_ms": None}
    result = embedded.submit(D, RECEIVE, body).result
    assert isinstance(result, ReceiveResult)
    return {d.message_id: d.token for d in result.deliveries}


def settle(embedded: Embedded, kind: str, token: str) -> LeaseResult:
    body = {"token": token} if kind == ACK else {"token": token, "delay_ms": None}
    result = embedded.submit(D, kind, body).result
    assert isinstance(result, LeaseResult)
    return result


def test_a_retrying_head_blocks_its_key_while_other_keys_progress(embedded: Embedded) -> None:
    strict_queue(embedded, retry_base_ms=100, retry_max_ms=100)
    enqueue(embedded, "a1", "A")
    enqueue(embedded, "a2", "A")
    enqueue(embedded, "b1", "B")
    enqueue(embedded, "free", None)
    first = receive(embedded)
    assert set(first) == {"a1", "b1", "free"}  # a2 waits behind a1
    assert settle(embedded, NACK, first["a1"]).state == "scheduled"
    settle(embedded, ACK, first["b1"])
    assert receive(embedded) == {}  # a1 retries later and still holds A: a2 may not overtake it
    embedded.now_ms += 100
    second = receive(embedded)
    assert set(second) == {"a1"}
    settle(embedded, ACK, second["a1"])
    assert set(receive(embedded)) == {"a2"}


@pytest.mark.parametrize(("parked_head", "successor_delivered"), [("continue", True), ("block", False)])
def test_a_parked_head_releases_or_blocks_its_successors(
    embedded: Embedded, parked_head: str, successor_delivered: bool
) -> None:
    strict_queue(embedded, parked_head, max_attempts=1)
    enqueue(embedded, "a1", "A")
    enqueue(embedded, "a2", "A")
    enqueue(embedded, "b1", "B")
    first = receive(embedded)
    assert set(first) == {"a1", "b1"}
    assert settle(embedded, NACK, first["a1"]).state == "dead_lettered"
    assert ("a2" in receive(embedded)) is successor_delivered


def test_redriving_a_blocking_head_lets_it_go_first_again(embedded: Embedded) -> None:
    strict_queue(embedded, "block", max_attempts=1)
    enqueue(embedded, "a1", "A")
    enqueue(embedded, "a2", "A")
    settle(embedded, NACK, receive(embedded)["a1"])
    meta = embedded.submit(D, INSPECT_MESSAGE, {"queue": "q", "message_id": "a1", "include_body": False})
    view = meta.result.meta  # type: ignore[union-attr]
    body = {
        "queue": "q",
        "message_id": "a1",
        "expected_state_version": view.state_version,
        "expected_delivery_generation": view.delivery_generation,
    }
    assert embedded.submit(D, REDRIVE, body).status == "committed"
    assert set(receive(embedded)) == {"a1"}


def test_held_messages_count_against_the_receive_budget(embedded: Embedded) -> None:
    """Below feature level 15 (this deployment is at 0) a key's waiting messages keep ready rows."""
    strict_queue(embedded, max_stored_messages=1_000)
    for i in range(limits.RECEIVE_EXAMINATION_BUDGET + 5):
        enqueue(embedded, f"a{i}", "A")
    enqueue(embedded, "b1", "B")
    first = receive(embedded, max_messages=10)
    assert set(first) == {"a0"}
    body = {"queue": "q", "max_messages": 10, "max_bytes": None, "lease_ms": None}
    outcome = embedded.submit(D, RECEIVE, body)
    assert isinstance(outcome.result, ReceiveResult)
    # a1..a256 are held behind a0 and use up the examination budget before b1 is reached.
    assert outcome.result.deliveries == [] and outcome.result.budget_exhausted


def nack_now(embedded: Embedded, token: str) -> None:
    """Its retry is due at once: the next record's timers make it ready again, at the back of the ready order."""
    assert embedded.submit(D, NACK, {"token": token, "delay_ms": 0}).status == "committed"


def behind_one_head(embedded: Embedded, level: int) -> None:
    """A strict queue at `level` whose key A holds more messages than a receive examines, then B."""
    assert embedded.submit(D, RAISE_FEATURE_LEVEL, {"level": level}).status == "committed"
    strict_queue(embedded, max_stored_messages=1_000)
    for i in range(limits.RECEIVE_EXAMINATION_BUDGET + 44):
        enqueue(embedded, f"a{i}", "A")
    enqueue(embedded, "b1", "B")


def test_from_level_15_a_keys_waiting_messages_stay_out_of_the_ready_order(embedded: Embedded) -> None:
    """Feature level 15: only key heads are in the ready index, so a retried head (at the back of the
    ready order) and other keys are reached at once, and a key's next message enters when it is head."""
    behind_one_head(embedded, HELD_OUT_OF_READY)
    first = receive(embedded)
    assert set(first) == {"a0", "b1"}
    nack_now(embedded, first["a0"])
    again = receive(embedded)
    assert set(again) == {"a0"}
    settle(embedded, ACK, again["a0"])
    assert set(receive(embedded)) == {"a1"}


def test_a_head_retried_behind_more_held_rows_than_a_receive_examines_is_reached_from_level_15(
    embedded: Embedded,
) -> None:
    """Below level 15 every receive scanned the same held rows from a floor that could not pass them:
    the retried head and key B were never delivered again. Raised to 15, receives take those rows out
    as they meet them, and reach both."""
    behind_one_head(embedded, HELD_OUT_OF_READY - 1)
    nack_now(embedded, receive(embedded)["a0"])
    body = {"queue": "q", "max_messages": 10, "max_bytes": None, "lease_ms": None}
    for _ in range(3):
        stalled = embedded.submit(D, RECEIVE, body).result
        assert isinstance(stalled, ReceiveResult) and stalled.deliveries == [] and stalled.budget_exhausted
    assert embedded.submit(D, RAISE_FEATURE_LEVEL, {"level": HELD_OUT_OF_READY}).status == "committed"
    delivered: set[str] = set()
    for _ in range(3):
        delivered |= set(receive(embedded))
    assert delivered == {"a0", "b1"}
    counters = embedded.submit(D, "keyload.command.InspectQueue", {"queue": "q"}).result.counters  # type: ignore[union-attr]
    assert (counters.ready, counters.leased) == (limits.RECEIVE_EXAMINATION_BUDGET + 43, 2)
