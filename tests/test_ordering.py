"""Strict per-key ordering: only the oldest unresolved message of a key is deliverable."""

from __future__ import annotations

from typing import Any

import pytest

from keyload import limits
from keyload.sdk.results import LeaseResult, ReceiveResult

from .support import CREATE_QUEUE, ENQUEUE, INSPECT_MESSAGE, Embedded, create_queue_body, enqueue_body

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
