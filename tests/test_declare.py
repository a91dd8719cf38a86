"""Creating is declaring from feature level 9 (processors/declare.py): a create naming a queue, topic
or group that exists with the same configuration returns it unchanged; another configuration, or a
partition below level 9, is Conflict. Through the real processor, file log and RocksDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyload.processors.features import CREATES_DECLARE, DECLARES_UNSTARTED, LARGE_IDENTITIES_KEPT, PRINCIPALS_CHECKED
from keyload.sdk.results import DomainView, GroupView, QueueView, TopicView

from .support import (
    CONFIGURE_QUEUE,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    INSPECT_DOMAIN,
    PUBLISH,
    PURGE_TOPIC,
    RAISE_FEATURE_LEVEL,
    Embedded,
    assert_replay_equals_live,
    create_group_body,
    create_queue_body,
    create_topic_body,
    event,
    expect,
    publish_body,
    submit_unhalted,
)

D = "acme"


def raise_to(embedded: Embedded, level: int) -> None:
    expect(submit_unhalted(embedded, D, RAISE_FEATURE_LEVEL, {"level": level}), None)


def conflict(embedded: Embedded, kind: str, body: dict[str, object]) -> str:
    outcome = submit_unhalted(embedded, D, kind, body)
    expect(outcome, "Conflict")
    return outcome.detail


def test_a_queue_created_again_as_it_is_is_returned_unchanged(embedded: Embedded, tmp_path: Path) -> None:
    raise_to(embedded, CREATES_DECLARE)
    first = expect(submit_unhalted(embedded, D, CREATE_QUEUE, create_queue_body("jobs", max_attempts=3)), None)
    again = expect(submit_unhalted(embedded, D, CREATE_QUEUE, create_queue_body("jobs", max_attempts=3)), None)
    assert isinstance(again, QueueView) and again == first  # same incarnation, created_at_ms, policy version
    usage = expect(submit_unhalted(embedded, D, INSPECT_DOMAIN, {}), None)
    assert isinstance(usage, DomainView) and usage.usage is not None and usage.usage.queues == 1  # charged once
    detail = conflict(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=4))
    assert detail == "queue already exists with another policy"
    # Once configured otherwise, a create of the new configuration is the declare.
    configure = {"queue": "jobs", "policy": create_queue_body("jobs", max_attempts=4)["policy"]}
    expect(submit_unhalted(embedded, D, CONFIGURE_QUEUE, {**configure, "expected_policy_version": 1}), None)
    declared = expect(submit_unhalted(embedded, D, CREATE_QUEUE, create_queue_body("jobs", max_attempts=4)), None)
    assert (declared.incarnation, declared.policy_version, declared.policy.max_attempts) == (first.incarnation, 2, 4)
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_topic_and_a_group_created_again_as_they_are_are_returned(embedded: Embedded) -> None:
    raise_to(embedded, CREATES_DECLARE)
    topic = expect(submit_unhalted(embedded, D, CREATE_TOPIC, create_topic_body("news")), None)
    assert expect(submit_unhalted(embedded, D, CREATE_TOPIC, create_topic_body("news")), None) == topic
    detail = conflict(embedded, CREATE_TOPIC, create_topic_body("news", max_retained_events=10))
    assert detail == "topic already exists with another policy"
    expect(submit_unhalted(embedded, D, PUBLISH, publish_body("news", event("e1"), event("e2"))), None)
    assert isinstance(topic, TopicView)

    group = expect(submit_unhalted(embedded, D, CREATE_GROUP, create_group_body("news", "g", event_types=["t"])), None)
    assert isinstance(group, GroupView) and group.checkpoint == 0
    # The start applies to a new group only, as auto.offset.reset does in Kafka: the group stays where it is.
    again = create_group_body("news", "g", event_types=["t"], start="end")
    assert expect(submit_unhalted(embedded, D, CREATE_GROUP, again), None) == group
    other = create_group_body("news", "g", event_types=["u"], max_attempts=9)
    assert conflict(embedded, CREATE_GROUP, other) == "group already exists with another filter and policy"


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (CREATE_QUEUE, create_queue_body("jobs")),
        (CREATE_TOPIC, create_topic_body("news")),
        (CREATE_GROUP, create_group_body("news", "g")),
    ],
)
def test_below_level_9_a_create_of_what_exists_is_conflict_as_it_was(
    embedded: Embedded, tmp_path: Path, kind: str, body: dict[str, object]
) -> None:
    """The records before the raise replay as their writers saw them: Conflict, then the declare."""
    raise_to(embedded, LARGE_IDENTITIES_KEPT)
    expect(submit_unhalted(embedded, D, CREATE_TOPIC, create_topic_body("news")), None)
    if kind != CREATE_TOPIC:
        expect(submit_unhalted(embedded, D, kind, body), None)
    name = {CREATE_QUEUE: "queue", CREATE_TOPIC: "topic", CREATE_GROUP: "group"}[kind]
    assert conflict(embedded, kind, body) == f"{name} already exists"
    raise_to(embedded, CREATES_DECLARE)
    expect(submit_unhalted(embedded, D, kind, body), None)
    assert_replay_equals_live(embedded, D, tmp_path)


def test_from_level_12_a_group_declared_at_a_position_the_topic_has_passed_is_returned(
    embedded: Embedded, tmp_path: Path
) -> None:
    """A service declaring its group at a fixed position when it boots still starts once a purge has
    passed that position, or when it lies past the tail: the start is for a new group only. Below
    level 12 such a declare was refused by the start's range first, and replays so."""
    raise_to(embedded, PRINCIPALS_CHECKED)
    expect(submit_unhalted(embedded, D, CREATE_TOPIC, create_topic_body("news")), None)
    expect(submit_unhalted(embedded, D, PUBLISH, publish_body("news", event("e1"), event("e2"))), None)
    group = expect(submit_unhalted(embedded, D, CREATE_GROUP, create_group_body("news", "g", start="end")), None)
    expect(submit_unhalted(embedded, D, PURGE_TOPIC, {"topic": "news", "through": 2, "expected_generation": 1}), None)
    passed = create_group_body("news", "g", start="position", position=1)
    beyond = create_group_body("news", "g", start="position", position=99)
    expect(submit_unhalted(embedded, D, CREATE_GROUP, passed), "HistoryUnavailable")
    expect(submit_unhalted(embedded, D, CREATE_GROUP, beyond), "Validation")

    raise_to(embedded, DECLARES_UNSTARTED)
    for body in (passed, beyond):
        declared = expect(submit_unhalted(embedded, D, CREATE_GROUP, body), None)
        assert isinstance(declared, GroupView) and declared.checkpoint == group.checkpoint == 2
    # The start's form is still checked, and another configuration is still Conflict.
    malformed = create_group_body("news", "g", start="end", position=3)
    expect(submit_unhalted(embedded, D, CREATE_GROUP, malformed), "Validation")
    other = create_group_body("news", "g", event_types=["t"], start="position", position=1)
    assert conflict(embedded, CREATE_GROUP, other) == "group already exists with another filter"
    # A new group is still held to where its start points.
    expect(
        submit_unhalted(embedded, D, CREATE_GROUP, create_group_body("news", "h", start="position", position=1)),
        "HistoryUnavailable",
    )
    assert_replay_equals_live(embedded, D, tmp_path)
