"""Topic policy changes and retention by age and size (docs/ARCHITECTURE.md §6, "Topic retention").

What a user notices: ConfigureTopic replaces the policy, fenced by its policy version; events older
than `max_age_ms` leave the front as log time passes; under `discard: old` a publish at a cap pushes
the oldest events out instead of being refused; and nothing ever removes an event a subscription
group has not completed. Every removal replays to the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.processors.policy import default_topic_spec
from keyload.processors.queues.state import next_due_ms
from keyload.projections import keys
from keyload.projections.records import TopicRecord
from keyload.sdk.results import TopicView

from .support import (
    CREATE_TOPIC,
    GROUP_ACK,
    PAUSE_GROUP,
    PUBLISH,
    READ_TOPIC,
    Embedded,
    assert_replay_equals_live,
    create_topic_body,
    event,
    publish_body,
    read_body,
)
from .test_groups import D, T, create, ok, publish, purge, receive, refused, seek, settle, status, status_topic, tick

CONFIGURE_TOPIC = "keyload.command.ConfigureTopic"
SECOND = 1_000
AGE = 10 * SECOND


def configure(embedded: Embedded, expected: int | None = None, **policy: Any) -> Any:
    body = {"topic": T, "policy": {**default_topic_spec(), **policy}, "expected_policy_version": expected}
    return embedded.submit(D, CONFIGURE_TOPIC, body)


def stored(embedded: Embedded) -> TopicRecord:
    """The topic as its projection holds it: read without a command, before which timers would fire."""
    raw = embedded.store(D).get(keys.topic(D, T))
    assert raw is not None
    return TopicRecord.decode(raw)


def topic_timer(embedded: Embedded) -> int | None:
    return stored(embedded).next_timer_ms


def retained(embedded: Embedded) -> tuple[int, int, int]:
    view = status_topic(embedded)
    return view.first_available, view.tail, view.retained_events


def test_configure_topic_replaces_the_policy_fenced_by_its_version(embedded: Embedded, tmp_path: Path) -> None:
    created = ok(embedded, CREATE_TOPIC, create_topic_body(T, max_retained_events=50))
    assert isinstance(created, TopicView)
    assert (created.policy_version, created.policy.max_age_ms, created.policy.discard) == (1, 0, "new")
    configured = configure(embedded, 1, max_age_ms=AGE, discard="old")
    assert configured.status == "committed", configured
    view = configured.result
    assert isinstance(view, TopicView)
    assert (view.policy_version, view.policy.max_age_ms, view.policy.discard) == (2, AGE, "old")
    assert view.policy.max_retained_events == 1_000_000  # not given: its default again
    before = embedded.state_digest(D)
    stale = configure(embedded, 1, max_age_ms=1)
    assert (stale.error_code, stale.detail) == ("RevisionConflict", "policy version is 2, expected 1")
    assert configure(embedded, discard="oldest").error_code == "Validation"
    assert configure(embedded, max_age_ms=-1).error_code == "Validation"
    assert configure(embedded, max_age_ms=limits.MAX_TOPIC_AGE_MS + 1).error_code == "Validation"
    missing = embedded.submit(D, CONFIGURE_TOPIC, {"topic": "nope", "policy": default_topic_spec()})
    assert missing.error_code == "NotFound"
    assert embedded.state_digest(D) == before  # refusals change nothing
    assert configure(embedded).result.policy_version == 3  # unfenced
    assert_replay_equals_live(embedded, D, tmp_path)


def test_events_older_than_max_age_leave_the_front_as_log_time_passes(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, CREATE_TOPIC, create_topic_body(T, max_age_ms=AGE))
    start = embedded.now_ms
    publish(embedded, 2)  # positions 1 and 2 at `start`
    assert topic_timer(embedded) == start + AGE
    embedded.now_ms = start + 5 * SECOND
    publish(embedded, 1)
    tick(embedded, start + AGE - 1)
    assert retained(embedded) == (1, 3, 3)
    tick(embedded, start + AGE)
    view = status_topic(embedded)
    assert (view.first_available, view.retained_events, view.generation) == (3, 1, 2)
    assert view.retained_bytes == len(b"body") + len("t")
    assert topic_timer(embedded) == start + 5 * SECOND + AGE  # the new front's expiry
    assert refused(embedded, READ_TOPIC, read_body(T, 1)) == "HistoryUnavailable"
    tick(embedded, start + 5 * SECOND + AGE)
    assert retained(embedded) == (4, 3, 0)
    assert topic_timer(embedded) is None and next_due_ms(embedded.store(D)) is None  # nothing left to expire
    assert refused(embedded, PUBLISH, publish_body(T, event("e-1", b"body"))) == "DuplicateEventId"  # ids outlive
    publish(embedded, 1)  # into the empty topic: a new front, a new expiry
    assert topic_timer(embedded) == embedded.now_ms + AGE
    assert_replay_equals_live(embedded, D, tmp_path)


def test_age_never_passes_what_a_group_has_not_completed(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, CREATE_TOPIC, create_topic_body(T, max_age_ms=AGE))
    create(embedded, "slow")
    create(embedded, "paused")
    ok(embedded, PAUSE_GROUP, {"topic": T, "group": "paused"})
    start = embedded.now_ms
    publish(embedded, 3)
    tick(embedded, start + AGE)
    assert retained(embedded) == (1, 3, 3)  # expired, and pinned by both groups
    expired_at = start + AGE
    assert topic_timer(embedded) == expired_at + limits.TOPIC_RETENTION_RECHECK_MS
    first, second, _third = receive(embedded, "slow").deliveries
    settle(embedded, GROUP_ACK, first.token, "slow")
    settle(embedded, GROUP_ACK, second.token, "slow")
    seek(embedded, "position", 3, group="paused")  # completes 1 and 2 for this group
    tick(embedded, expired_at + limits.TOPIC_RETENTION_RECHECK_MS - 1)
    assert retained(embedded) == (1, 3, 3)  # not looked at again before the recheck
    tick(embedded, expired_at + limits.TOPIC_RETENTION_RECHECK_MS)
    assert retained(embedded) == (3, 3, 1)  # up to the slowest group's checkpoint, not past it
    assert (status(embedded, "slow").checkpoint, status(embedded, "paused").checkpoint) == (2, 2)
    seek(embedded, "end", group="slow")
    seek(embedded, "end", group="paused")
    tick(embedded, expired_at + 2 * limits.TOPIC_RETENTION_RECHECK_MS)
    assert retained(embedded) == (4, 3, 0)
    assert_replay_equals_live(embedded, D, tmp_path)


def test_discard_old_pushes_the_oldest_events_out_at_a_cap(embedded: Embedded, tmp_path: Path) -> None:
    charge = len(b"body") + len("t")
    ok(
        embedded,
        CREATE_TOPIC,
        create_topic_body(T, max_retained_events=3, max_retained_bytes=4 * charge, discard="old"),
    )
    publish(embedded, 3)
    too_big = embedded.submit(D, PUBLISH, publish_body(T, event("e-huge", b"b" * 30)))  # at both caps
    assert (too_big.error_code, too_big.detail) == ("ResourceExhausted", "the events alone exceed max_retained_bytes")
    publish(embedded, 2)  # 4 and 5 push 1 and 2 out
    view = status_topic(embedded)
    assert (view.first_available, view.tail, view.retained_events, view.generation) == (3, 5, 3, 2)
    big = event("e-big", b"body" * 3)  # charged 3 * 4 + 1: the bytes cap pushes out two more
    ok(embedded, PUBLISH, publish_body(T, big))
    assert retained(embedded) == (5, 6, 2)
    assert status_topic(embedded).retained_bytes == charge + 13
    alone = embedded.submit(D, PUBLISH, publish_body(T, *(event(f"x-{i}") for i in range(4))))
    assert (alone.error_code, alone.detail) == ("ResourceExhausted", "the events alone exceed max_retained_events")
    create(embedded, "reader")  # from the beginning: it pins 5 and 6
    before = embedded.state_digest(D)
    pinned = embedded.submit(D, PUBLISH, publish_body(T, event("e-7", b"body" * 3)))
    assert (pinned.error_code, pinned.detail) == (
        "ResourceExhausted",
        "the topic would exceed max_retained_bytes, and a group has not completed position 5",
    )
    assert embedded.state_digest(D) == before  # refused whole: nothing discarded
    for delivery in receive(embedded, "reader").deliveries:
        settle(embedded, GROUP_ACK, delivery.token, "reader")
    ok(embedded, PUBLISH, publish_body(T, event("e-7", b"body" * 3)))
    assert retained(embedded) == (7, 7, 1)  # 13 bytes more: both older events go
    assert_replay_equals_live(embedded, D, tmp_path)


def test_discard_new_refuses_at_a_cap_as_before(embedded: Embedded) -> None:
    ok(embedded, CREATE_TOPIC, create_topic_body(T, max_retained_events=2))
    publish(embedded, 2)
    full = embedded.submit(D, PUBLISH, publish_body(T, event("e-3")))
    assert (full.error_code, full.detail) == ("ResourceExhausted", "the topic would exceed max_retained_events")


def test_a_lowered_cap_under_discard_old_is_applied_in_bounded_steps(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, CREATE_TOPIC, create_topic_body(T))
    for _ in range(6):
        publish(embedded, limits.MAX_PUBLISH_EVENTS)
    configured = configure(embedded, max_retained_events=10, discard="old")
    assert configured.result.retained_events == 600  # configure itself removes nothing
    assert topic_timer(embedded) == embedded.now_ms  # due at once
    budget = limits.TICK_EXAMINATION_BUDGET
    remaining = []
    for _ in range(3):
        tick(embedded, embedded.now_ms)
        remaining.append(stored(embedded).view.retained_events)
    assert remaining == [600 - budget, 600 - 2 * budget, 10]
    assert retained(embedded) == (591, 600, 10)
    assert topic_timer(embedded) is None
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_purge_resets_the_age_timer_to_the_new_front(embedded: Embedded) -> None:
    ok(embedded, CREATE_TOPIC, create_topic_body(T, max_age_ms=AGE))
    start = embedded.now_ms
    publish(embedded, 1)
    embedded.now_ms = start + SECOND
    publish(embedded, 1)
    assert purge(embedded, 1).status == "committed"
    assert topic_timer(embedded) == start + SECOND + AGE


@pytest.mark.parametrize("policy", [{"max_age_ms": AGE}, {"discard": "old", "max_retained_events": 1}])
def test_a_topic_without_retention_keeps_no_timer(embedded: Embedded, policy: dict[str, Any]) -> None:
    """Only an age limit, or a cap already passed under discard old, arms the timer; removing it
    from the policy disarms it."""
    ok(embedded, CREATE_TOPIC, create_topic_body(T))
    publish(embedded, 2)
    assert topic_timer(embedded) is None
    configure(embedded, **policy)
    assert topic_timer(embedded) is not None
    configure(embedded)
    assert topic_timer(embedded) is None and next_due_ms(embedded.store(D)) is None
