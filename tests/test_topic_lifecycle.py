"""Closing and deleting topics and subscription groups (docs/ARCHITECTURE.md §6b, "Topic lifecycle").

What a user notices: a closed topic refuses publishes with Conflict while reads and groups go on; a
group or topic is deleted only when that drops no work in progress, unless forced; its name is free
at once, its tokens are dead, its waiting receives are answered empty, a deleted group's pins go
at once, and its rows are reclaimed in bounded steps. Every step replays to the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.cli import main
from keyload.projections import keys
from keyload.sdk.results import GroupView, TopicView

from .support import (
    CREATE_GROUP,
    CREATE_TOPIC,
    DELETE_GROUP,
    DELETE_TOPIC,
    GROUP_ACK,
    GROUP_RECEIVE,
    GROUP_STATUS,
    INSPECT_TOPIC,
    PUBLISH,
    READ_TOPIC,
    TICK,
    Embedded,
    assert_replay_equals_live,
    batch_body,
    command,
    create_group_body,
    create_topic_body,
    event,
    group_receive_body,
    mutation,
    publish_body,
    read_body,
)
from .test_groups import D, T, create, ok, publish, receive, refused, settle, status, status_topic, tick
from .test_long_poll import published
from .test_topic_retention import stored

CLOSE_TOPIC = "keyload.command.CloseTopic"
GROUP_FAMILIES = (keys.WAITER, keys.TIMER, keys.POSITION, keys.DUE_POSITION, keys.PARKED, keys.INBOX_ENTRY)
TOPIC_FAMILIES = (keys.EVENT, keys.EVENT_ID)


def rejected(embedded: Embedded, kind: str, body: dict[str, Any]) -> tuple[str | None, str]:
    outcome = embedded.submit(D, kind, body)
    assert outcome.status == "rejected", outcome
    return outcome.error_code, outcome.detail


def rows(embedded: Embedded, incarnation: int, families: tuple[bytes, ...]) -> int:
    store = embedded.store(D)
    return sum(
        1
        for family in families
        for _ in store.scan(family + keys.u64(incarnation), keys.prefix_end(family + keys.u64(incarnation)))
    )


def gone(embedded: Embedded, incarnation: int) -> bool:
    """Nothing of a deleted resource is left: no reclamation row, no resource row, no due entry."""
    store = embedded.store(D)
    due = {keys.parse_due_queue(key)[1] for key, _ in store.scan(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))}
    retired = (keys.retired(incarnation, family) for family in (keys.RETIRED_GROUP, keys.RETIRED_TOPIC))
    return (
        all(store.get(key) is None for key in retired)
        and store.get(keys.resource_key(incarnation)) is None
        and (incarnation not in due)
    )


@pytest.fixture
def news(embedded: Embedded) -> Embedded:
    ok(embedded, CREATE_TOPIC, create_topic_body(T))
    return embedded


def test_a_closed_topic_takes_no_new_event_and_everything_else_goes_on(news: Embedded, tmp_path: Path) -> None:
    publish(news, 2)
    create(news)
    closed = ok(news, CLOSE_TOPIC, {"topic": T})
    assert isinstance(closed, TopicView) and closed.closed
    before = news.state_digest(D)
    assert ok(news, CLOSE_TOPIC, {"topic": T}).closed and news.state_digest(D) == before  # again: nothing
    assert rejected(news, PUBLISH, publish_body(T, event("late"))) == (
        "Conflict",
        "topic news is closed: it takes no new events",
    )
    in_batch = news.submit(D, "keyload.command.Batch", batch_body(mutation(PUBLISH, publish_body(T, event("x")))))
    assert in_batch.error_code == "Conflict"
    assert news.state_digest(D) == before
    assert [e.position for e in ok(news, READ_TOPIC, read_body(T, 1)).events] == [1, 2]
    for delivery in receive(news).deliveries:
        settle(news, GROUP_ACK, delivery.token)
    assert status(news).checkpoint == 2
    assert status_topic(news).closed
    assert_replay_equals_live(news, D, tmp_path)


def test_a_group_with_outstanding_deliveries_is_deleted_only_by_force(news: Embedded, tmp_path: Path) -> None:
    publish(news, 3)
    group_id = create(news).incarnation
    [first, *_] = receive(news, max_events=2).deliveries
    assert rejected(news, DELETE_GROUP, {"topic": T, "group": "g"}) == (
        "Conflict",
        "group g has 2 outstanding deliveries: settle them, seek the group, or delete it by force",
    )
    stale = {"topic": T, "group": "g", "force": True, "expected_incarnation": group_id + 1}
    assert rejected(news, DELETE_GROUP, stale)[0] == "RevisionConflict"
    deleted = ok(news, DELETE_GROUP, {"topic": T, "group": "g", "force": True, "expected_incarnation": group_id})
    assert isinstance(deleted, GroupView) and deleted.outstanding == 2
    assert rejected(news, GROUP_STATUS, {"topic": T, "group": "g"}) == ("NotFound", "group does not exist")
    assert refused(news, GROUP_ACK, {"topic": T, "group": "g", "token": first.token}) == "NotFound"
    # The name is free: a new incarnation from its own start, and the old tokens stay dead.
    again = create(news)
    assert again.incarnation > group_id and again.checkpoint == 0
    assert refused(news, GROUP_ACK, {"topic": T, "group": "g", "token": first.token}) == "TokenInvalidated"
    assert [d.position for d in receive(news).deliveries] == [1, 2, 3]
    tick(news, news.now_ms + 1)
    assert rows(news, group_id, GROUP_FAMILIES) == 0 and gone(news, group_id)
    assert_replay_equals_live(news, D, tmp_path)


def test_a_deleted_group_answers_its_waiting_receives_empty(news: Embedded, tmp_path: Path) -> None:
    create(news)
    cursor = news.outcomes.end_offset(0)
    waiting = dict(group_receive_body(T, "g"), wait_ms=20_000)
    news.append(D, command(D, GROUP_RECEIVE, waiting, "wait-1", reply_to=0))
    news.run()
    ok(news, DELETE_GROUP, {"topic": T, "group": "g"})  # nothing outstanding: no force needed
    ok(news, TICK, {})  # the next record reclaims, and answers the waiter
    [answered] = [o for o in published(news, cursor) if o["command_id"] == "wait-1"]
    assert (answered["status"], answered["result"][1]["deliveries"]) == ("committed", [])
    assert_replay_equals_live(news, D, tmp_path)


def test_a_deleted_groups_pins_go_at_once(embedded: Embedded, tmp_path: Path) -> None:
    """Retention held back by a group looks at the topic's front again at the next record."""
    ok(embedded, CREATE_TOPIC, create_topic_body(T, max_age_ms=1_000))
    create(embedded, "stuck")
    publish(embedded, 3)
    tick(embedded, embedded.now_ms + 1_000)
    assert status_topic(embedded).retained_events == 3  # aged out, but pinned
    assert stored(embedded).next_timer_ms == embedded.now_ms + limits.TOPIC_RETENTION_RECHECK_MS
    ok(embedded, DELETE_GROUP, {"topic": T, "group": "stuck"})
    assert stored(embedded).next_timer_ms == embedded.now_ms
    tick(embedded, embedded.now_ms)
    view = status_topic(embedded)
    assert (view.first_available, view.retained_events) == (4, 0)
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_topic_is_deleted_with_its_groups_once_they_have_completed_what_it_retains(
    news: Embedded, tmp_path: Path
) -> None:
    publish(news, 2)
    create(news, "done")
    create(news, "behind")
    for delivery in receive(news, "done").deliveries:
        settle(news, GROUP_ACK, delivery.token, "done")
    topic_id = status_topic(news).incarnation
    assert rejected(news, DELETE_TOPIC, {"topic": T}) == (
        "Conflict",
        "group behind has not completed position 1 of topic news: let it catch up, seek it or delete it "
        "first, or delete the topic by force",
    )
    assert rejected(news, DELETE_TOPIC, {"topic": T, "expected_incarnation": topic_id + 1})[0] == "RevisionConflict"
    for delivery in receive(news, "behind").deliveries:
        settle(news, GROUP_ACK, delivery.token, "behind")
    deleted = ok(news, DELETE_TOPIC, {"topic": T, "expected_incarnation": topic_id})
    assert isinstance(deleted, TopicView) and (deleted.incarnation, deleted.tail) == (topic_id, 2)
    assert rejected(news, INSPECT_TOPIC, {"topic": T}) == ("NotFound", "topic does not exist")
    assert rejected(news, GROUP_STATUS, {"topic": T, "group": "done"})[0] == "NotFound"
    # The name is free: a new topic, with an event-id space of its own.
    assert ok(news, CREATE_TOPIC, create_topic_body(T)).incarnation > topic_id
    assert [e.position for e in ok(news, PUBLISH, publish_body(T, event("e-1", b"body"))).events] == [1]
    assert_replay_equals_live(news, D, tmp_path)


def test_a_deleted_topics_rows_are_reclaimed_in_bounded_steps(news: Embedded, tmp_path: Path) -> None:
    """Forced past a group that has completed nothing; then every record reclaims at most the tick
    examination budget of rows, before itself, and the last leaves nothing behind."""
    for _ in range(3):
        publish(news, limits.MAX_PUBLISH_EVENTS)
    group_id = create(news).incarnation
    receive(news, max_events=100)
    topic_id = status_topic(news).incarnation
    topic_rows = rows(news, topic_id, TOPIC_FAMILIES)
    assert topic_rows == 600  # an event row and an event-id row each
    assert rejected(news, DELETE_TOPIC, {"topic": T})[0] == "Conflict"
    ok(news, DELETE_TOPIC, {"topic": T, "force": True})
    assert rows(news, topic_id, TOPIC_FAMILIES) == topic_rows  # the delete itself reclaims nothing
    budget = limits.TICK_EXAMINATION_BUDGET
    group_rows = rows(news, group_id, GROUP_FAMILIES)
    assert group_rows == 200  # 100 leased positions, each with its lease timer
    left = []
    for _ in range((topic_rows + group_rows) // budget + 1):
        news.now_ms += 1
        ok(news, TICK, {})
        left.append(rows(news, topic_id, TOPIC_FAMILIES) + rows(news, group_id, GROUP_FAMILIES))
    assert left[:3] == [800 - budget, 800 - 2 * budget, 800 - 3 * budget] and left[-1] == 0
    assert gone(news, topic_id) and gone(news, group_id)
    assert news.store(D).get(keys.NEXT_DUE) is None
    assert_replay_equals_live(news, D, tmp_path)


def test_keyload_status_names_the_deleted_topics_and_groups_still_being_reclaimed(
    news: Embedded, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(3):
        publish(news, limits.MAX_PUBLISH_EVENTS)
    create(news, "a")
    create(news, "b")
    ok(news, DELETE_TOPIC, {"topic": T, "force": True})

    def status_line() -> str:
        assert main(["status", "--data", str(news.data.root), "--output", "text"]) == 0
        return capsys.readouterr().out.splitlines()[1 + news.partition(D)]

    assert status_line().endswith(", poison 0, reclaiming 2 deleted groups, 1 deleted topic")
    for _ in range(4):
        ok(news, TICK, {})
    assert status_line().endswith(", poison 0")


def test_deleting_a_group_or_topic_that_is_not_there_is_not_found(news: Embedded) -> None:
    assert rejected(news, DELETE_GROUP, {"topic": T, "group": "nope"}) == ("NotFound", "group does not exist")
    assert rejected(news, DELETE_TOPIC, {"topic": "nope"}) == ("NotFound", "topic does not exist")
    assert rejected(news, CLOSE_TOPIC, {"topic": "nope"}) == ("NotFound", "topic does not exist")
    ok(news, CREATE_GROUP, create_group_body(T, "g"))
