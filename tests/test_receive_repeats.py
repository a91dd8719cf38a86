"""Repeated receives from feature level 3 (processors/repeats.py): leases are kept, bodies are not.

What a user notices: a Receive or GroupReceive sent again under its command id (a retry after a
lost answer) gets the same deliveries, each as it stands now: a lease still held with its body and
current deadline, one acked, expired or invalidated since with that error code and no body. The
stored outcome holds no body, so the projection does not grow with what was delivered, and a
replay reaches the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keyload.log.codec import REGISTRY
from keyload.processors.features import LEASES_KEPT
from keyload.projections import keys

from .support import (
    ACK,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    GROUP_ACK,
    GROUP_RECEIVE,
    PUBLISH,
    RAISE_FEATURE_LEVEL,
    RECEIVE,
    Embedded,
    assert_replay_equals_live,
    command,
    create_group_body,
    create_queue_body,
    create_topic_body,
    enqueue_body,
    event,
    expect,
    group_receive_body,
    publish_body,
    receive_body,
    submit_unhalted,
)

D = "acme"
BODY = b"b" * 1024


def ok(embedded: Embedded, kind: str, body: dict[str, Any], command_id: str | None = None) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body, command_id), None)


def stored_deliveries(embedded: Embedded, command_id: str) -> list[dict[str, Any]]:
    stored = embedded.stored_outcome(D, command_id)
    assert stored is not None
    deliveries: list[dict[str, Any]] = REGISTRY.decode("keyload.Outcome", stored[keys.SHA256_BYTES :])["result"][1][
        "deliveries"
    ]
    return deliveries


def test_a_repeated_receive_gets_each_lease_as_it_stands(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": LEASES_KEPT})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    for n in range(3):
        ok(embedded, ENQUEUE, enqueue_body("jobs", f"m{n}", BODY))
    first = ok(embedded, RECEIVE, receive_body("jobs", max_messages=3, lease_ms=10_000), "take")
    assert [d.body for d in first.deliveries] == [BODY] * 3
    assert [d["body"] for d in stored_deliveries(embedded, "take")] == [b""] * 3  # leases kept, bodies not
    stored = embedded.stored_outcome(D, "take")
    assert stored is not None and len(stored) < 3 * len(BODY)

    again = ok(embedded, RECEIVE, receive_body("jobs", max_messages=3, lease_ms=10_000), "take")
    assert again == first  # every lease still held: the same answer

    acked, renewed, _ = first.deliveries
    ok(embedded, ACK, {"token": acked.token})
    embedded.now_ms += 5_000
    renewal = ok(embedded, "keyload.command.Renew", {"token": renewed.token, "lease_ms": 60_000})
    repeat = ok(embedded, RECEIVE, receive_body("jobs", max_messages=3, lease_ms=10_000), "take")
    assert [(d.message_id, d.error_code, d.body) for d in repeat.deliveries] == [
        ("m0", "StaleLease", b""),
        ("m1", None, BODY),
        ("m2", None, BODY),
    ]
    assert repeat.deliveries[1].lease_until_ms == renewal.lease_until_ms  # the deadline as it is now
    assert repeat.deliveries[1].token == renewed.token

    embedded.now_ms += 5_000  # m2's lease has run out
    late = ok(embedded, RECEIVE, receive_body("jobs", max_messages=3, lease_ms=10_000), "take")
    assert [(d.message_id, d.error_code) for d in late.deliveries] == [
        ("m0", "StaleLease"),
        ("m1", None),
        ("m2", "StaleLease"),  # its expiry made it ready again: the lease is gone
    ]
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_repeated_receive_of_a_deleted_queue_names_its_tokens_invalid(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": LEASES_KEPT})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m0", BODY))
    ok(embedded, RECEIVE, receive_body("jobs"), "take")
    ok(embedded, "keyload.command.DeleteQueue", {"queue": "jobs", "force": True, "expected_incarnation": None})
    [repeat] = ok(embedded, RECEIVE, receive_body("jobs"), "take").deliveries
    assert (repeat.error_code, repeat.body) == ("TokenInvalidated", b"")
    assert_replay_equals_live(embedded, D, tmp_path)


def test_below_level_3_a_repeat_returns_the_stored_bodies(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": LEASES_KEPT - 1})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m0", BODY))
    [delivery] = ok(embedded, RECEIVE, receive_body("jobs"), "take").deliveries
    ok(embedded, ACK, {"token": delivery.token})
    [repeat] = ok(embedded, RECEIVE, receive_body("jobs"), "take").deliveries
    assert (repeat.error_code, repeat.body) == (None, BODY)


def test_a_long_poll_answered_later_keeps_its_leases_too(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": LEASES_KEPT})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    waiting = dict(receive_body("jobs"), wait_ms=20_000)
    embedded.append(D, command(D, RECEIVE, waiting, "waiting", reply_to=0))
    embedded.run()
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m0", BODY))
    assert [d["body"] for d in stored_deliveries(embedded, "waiting")] == [b""]
    [repeat] = ok(embedded, RECEIVE, waiting, "waiting").deliveries
    assert (repeat.message_id, repeat.error_code, repeat.body) == ("m0", None, BODY)
    ok(embedded, ACK, {"token": repeat.token})
    [settled] = ok(embedded, RECEIVE, waiting, "waiting").deliveries
    assert (settled.error_code, settled.body) == ("StaleLease", b"")


def test_a_repeated_group_receive_gets_each_lease_as_it_stands(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": LEASES_KEPT})
    ok(embedded, CREATE_TOPIC, create_topic_body("news"))
    ok(embedded, PUBLISH, publish_body("news", event("e0", BODY), event("e1", BODY)))
    ok(embedded, CREATE_GROUP, create_group_body("news", "g"))
    receive = group_receive_body("news", "g", max_events=2)
    first = ok(embedded, GROUP_RECEIVE, receive, "take")
    assert [d["body"] for d in stored_deliveries(embedded, "take")] == [b"", b""]
    assert ok(embedded, GROUP_RECEIVE, receive, "take") == first
    ok(embedded, GROUP_ACK, {"topic": "news", "group": "g", "token": first.deliveries[0].token})
    repeat = ok(embedded, GROUP_RECEIVE, receive, "take")
    assert [(d.position, d.error_code, d.body) for d in repeat.deliveries] == [(1, "StaleLease", b""), (2, None, BODY)]
    ok(embedded, "keyload.command.DeleteGroup", {"topic": "news", "group": "g", "force": True})
    gone = ok(embedded, GROUP_RECEIVE, receive, "take")
    assert [d.error_code for d in gone.deliveries] == ["TokenInvalidated", "TokenInvalidated"]
    assert_replay_equals_live(embedded, D, tmp_path)
