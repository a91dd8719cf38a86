"""Long-poll GroupReceive: a receive with nothing to deliver waits in the log and is served by
what makes something deliverable (publish, ack opening the window, retry due, resume) or
ends empty at its deadline. Also the topic read cursor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.operations.recovery import replay

from .support import (
    CREATE_GROUP,
    CREATE_TOPIC,
    GROUP_ACK,
    GROUP_NACK,
    GROUP_RECEIVE,
    GROUP_STATUS,
    PAUSE_GROUP,
    PUBLISH,
    PURGE_TOPIC,
    READ_TOPIC,
    RESUME_GROUP,
    TICK,
    Embedded,
    command,
    create_group_body,
    create_topic_body,
    event,
    group_receive_body,
    publish_body,
    read_body,
    submit_unhalted,
)

D = "acme"
T = "news"
WAIT_MS = 20_000


def ok(embedded: Embedded, kind: str, body: dict[str, Any]) -> Any:
    outcome = submit_unhalted(embedded, D, kind, body)
    assert outcome.status == "committed", outcome
    return outcome.result


def refused(embedded: Embedded, kind: str, body: dict[str, Any]) -> str | None:
    outcome = submit_unhalted(embedded, D, kind, body)
    assert outcome.status == "rejected", outcome
    return outcome.error_code


def published(embedded: Embedded, since: int) -> dict[str, dict[str, Any]]:
    """Outcomes published to reply partition 0 since `since`, by command id (the last one wins)."""
    outcomes = (REGISTRY.decode("keyload.Outcome", r.value) for r in embedded.outcomes.read(0, since, 10_000))
    return {o["command_id"]: o for o in outcomes}


def start_waiting(
    embedded: Embedded, command_id: str, group: str = "g", wait_ms: int = WAIT_MS, principal: str = "worker"
) -> None:
    body = group_receive_body(T, group, wait_ms=wait_ms)
    embedded.append(D, command(D, GROUP_RECEIVE, body, command_id, principal=principal, reply_to=0))
    embedded.run()
    assert all(p.halt is None for p in embedded.processors)


def deliveries(outcome: dict[str, Any]) -> list[dict[str, Any]]:
    assert outcome["status"] == "committed", outcome
    found: list[dict[str, Any]] = outcome["result"][1]["deliveries"]
    return found


def publish(embedded: Embedded, *event_ids: str, event_type: str = "t") -> None:
    ok(embedded, PUBLISH, publish_body(T, *(event(e, b"body", event_type) for e in event_ids)))


def news(embedded: Embedded, *groups: str, **fields: Any) -> Embedded:
    ok(embedded, CREATE_TOPIC, create_topic_body(T))
    for group in groups:
        ok(embedded, CREATE_GROUP, create_group_body(T, group, **fields))
    return embedded


def test_a_matching_publish_serves_the_waiter_in_the_same_round(embedded: Embedded, tmp_path: Path) -> None:
    news(embedded, "g", event_types=["order"])
    since = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "wait-1")
    assert "wait-1" not in published(embedded, since)
    publish(embedded, "e1", event_type="refund")  # filtered: nothing to deliver, still waiting
    assert "wait-1" not in published(embedded, since)
    embedded.now_ms += 700
    publish(embedded, "e2", event_type="order")
    outcomes = published(embedded, since)
    [delivery] = deliveries(outcomes["wait-1"])
    assert (delivery["position"], delivery["event_id"], delivery["attempts"]) == (2, "e2", 1)
    # Served by the publish, in its processing round, and leased to the waiter's principal.
    assert outcomes["wait-1"]["eval_time_ms"] == max(o["eval_time_ms"] for o in outcomes.values())
    principal_bound = submit_unhalted(embedded, D, GROUP_ACK, {"topic": T, "group": "g", "token": delivery["token"]})
    assert principal_bound.error_code == "PermissionDenied"  # the tests' principal is not "worker"
    view = ok(embedded, GROUP_STATUS, {"topic": T, "group": "g"})
    assert (view.checkpoint, view.issued, view.outstanding) == (1, 2, 1)
    assert embedded.digest(D) == replay(embedded.data, embedded.partition(D), tmp_path / "r", progress=False).digest


def test_an_ack_that_opens_a_full_window_serves_the_waiter(embedded: Embedded) -> None:
    news(embedded, "g", max_window=1)
    publish(embedded, "e1", "e2")
    [first] = ok(embedded, GROUP_RECEIVE, group_receive_body(T, "g")).deliveries
    since = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "wait-1", principal="tester")
    assert "wait-1" not in published(embedded, since)
    ok(embedded, GROUP_ACK, {"topic": T, "group": "g", "token": first.token})
    assert [d["position"] for d in deliveries(published(embedded, since)["wait-1"])] == [2]


def test_a_retry_coming_due_serves_the_waiter(embedded: Embedded) -> None:
    news(embedded, "g")
    publish(embedded, "e1")
    [first] = ok(embedded, GROUP_RECEIVE, group_receive_body(T, "g")).deliveries
    ok(embedded, GROUP_NACK, {"topic": T, "group": "g", "token": first.token, "delay_ms": 5_000})
    since = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "wait-1")
    embedded.now_ms += 4_999
    ok(embedded, TICK, {})
    assert "wait-1" not in published(embedded, since)
    embedded.now_ms += 1
    ok(embedded, TICK, {})
    [again] = deliveries(published(embedded, since)["wait-1"])
    assert (again["position"], again["attempts"]) == (1, 2)


def test_a_paused_group_refuses_a_plain_receive_and_a_waiting_one_is_served_on_resume(embedded: Embedded) -> None:
    news(embedded, "g")
    publish(embedded, "e1")
    ok(embedded, PAUSE_GROUP, {"topic": T, "group": "g"})
    assert refused(embedded, GROUP_RECEIVE, group_receive_body(T, "g")) == "DispatchPaused"
    since = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "wait-1")
    assert "wait-1" not in published(embedded, since)
    ok(embedded, RESUME_GROUP, {"topic": T, "group": "g"})
    assert [d["event_id"] for d in deliveries(published(embedded, since)["wait-1"])] == ["e1"]


def test_a_resume_serves_every_waiter_over_the_records_that_follow(embedded: Embedded, tmp_path: Path) -> None:
    """More waiters than one pass serves (64): the rest get a serve timer, so the next record serves
    them instead of leaving them to their deadline while events wait."""
    news(embedded, "g")
    ok(embedded, PAUSE_GROUP, {"topic": T, "group": "g"})
    since = embedded.outcomes.end_offset(0)
    count = limits.MAX_WAITERS_SERVED + 20
    body = group_receive_body(T, "g", wait_ms=WAIT_MS, max_events=1)
    for i in range(count):
        embedded.append(D, command(D, GROUP_RECEIVE, body, f"wait-{i}", principal="worker", reply_to=0))
    embedded.run()
    ok(embedded, PUBLISH, publish_body(T, *(event(f"e{i}") for i in range(count))))

    def served() -> int:
        return sum(
            1 for o in published(embedded, since).values() if o["command_id"].startswith("wait-") and deliveries(o)
        )

    assert served() == 0
    ok(embedded, RESUME_GROUP, {"topic": T, "group": "g"})
    assert served() == limits.MAX_WAITERS_SERVED
    ok(embedded, TICK, {})
    assert served() == count
    assert embedded.digest(D) == replay(embedded.data, embedded.partition(D), tmp_path / "r", progress=False).digest


def test_the_deadline_ends_a_waiter_empty_and_a_retry_returns_that(embedded: Embedded) -> None:
    news(embedded, "g", "other")
    since = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "wait-1", wait_ms=1_000, principal="tester")
    # A retry while it waits neither answers nor waits twice.
    start_waiting(embedded, "wait-1", wait_ms=1_000, principal="tester")
    assert "wait-1" not in published(embedded, since)
    embedded.now_ms += 999
    ok(embedded, TICK, {})
    assert "wait-1" not in published(embedded, since)
    embedded.now_ms += 1
    ok(embedded, TICK, {})
    ended = published(embedded, since)["wait-1"]
    assert deliveries(ended) == [] and ended["result"][1]["window_full"] is False
    retried = submit_unhalted(embedded, D, GROUP_RECEIVE, group_receive_body(T, "g", wait_ms=1_000), "wait-1")
    assert retried.status == "committed" and retried.result.deliveries == []  # type: ignore[union-attr]
    # The ended waiter is gone: the next publish is for the next receive, in either group.
    since = embedded.outcomes.end_offset(0)
    publish(embedded, "e1")
    assert ok(embedded, GROUP_STATUS, {"topic": T, "group": "g"}).outstanding == 0
    assert [d.position for d in ok(embedded, GROUP_RECEIVE, group_receive_body(T, "other")).deliveries] == [1]


def test_waiters_are_served_oldest_first_and_groups_independently(embedded: Embedded) -> None:
    news(embedded, "g", "h")
    since = embedded.outcomes.end_offset(0)
    start_waiting(embedded, "g-first")
    start_waiting(embedded, "g-second")
    start_waiting(embedded, "h-first", group="h")
    publish(embedded, "e1")
    outcomes = published(embedded, since)
    assert "g-second" not in outcomes
    assert [d["position"] for d in deliveries(outcomes["g-first"])] == [1]
    assert [d["position"] for d in deliveries(outcomes["h-first"])] == [1]  # each group gets every event
    publish(embedded, "e2")
    assert [d["position"] for d in deliveries(published(embedded, since)["g-second"])] == [2]


def test_read_cursor_reads_on_where_a_page_ended(embedded: Embedded) -> None:
    news(embedded, "g")
    publish(embedded, *(f"e{i}" for i in range(1, 8)))
    page = ok(embedded, READ_TOPIC, read_body(T, max_events=3))
    assert [e.position for e in page.events] == [1, 2, 3] and page.next_position == 4
    seen = [e.position for e in page.events]
    while page.next_position <= page.tail:
        page = ok(embedded, READ_TOPIC, read_body(T, None, max_events=3, cursor=page.next_cursor))
        seen += [e.position for e in page.events]
    assert seen == list(range(1, 8))
    assert ok(embedded, READ_TOPIC, read_body(T, None, cursor=page.next_cursor)).events == []  # at the tail
    tampered = page.next_cursor[:-1] + ("A" if page.next_cursor[-1] != "A" else "B")
    for cursor in (tampered, "", "not a cursor", page.next_cursor[:-2]):
        assert refused(embedded, READ_TOPIC, read_body(T, None, cursor=cursor)) == "Validation"
    both = read_body(T, 1, cursor=page.next_cursor)
    assert refused(embedded, READ_TOPIC, both) == "Validation"
    assert refused(embedded, READ_TOPIC, read_body(T, None)) == "Validation"
    # A cursor into history a purge removed is HistoryUnavailable, as its position would be.
    at_two = ok(embedded, READ_TOPIC, read_body(T, max_events=1)).next_cursor
    for delivered in ok(embedded, GROUP_RECEIVE, group_receive_body(T, "g", max_events=2)).deliveries:
        ok(embedded, GROUP_ACK, {"topic": T, "group": "g", "token": delivered.token})
    ok(embedded, PURGE_TOPIC, {"topic": T, "through": 1, "expected_generation": 1})
    assert ok(embedded, READ_TOPIC, read_body(T, None, cursor=at_two)).events[0].position == 2
    ok(embedded, PURGE_TOPIC, {"topic": T, "through": 2, "expected_generation": 2})
    assert refused(embedded, READ_TOPIC, read_body(T, None, cursor=at_two)) == "HistoryUnavailable"
