"""Queue commands through the real processor, file log and RocksDB: states, counters, codes."""

from __future__ import annotations

from typing import Any

import pytest

from keyload import limits
from keyload.sdk.results import EnqueueResult, MessageView, QueueView, TickResult

from .support import (
    CONFIGURE_QUEUE,
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_MESSAGE,
    INSPECT_QUEUE,
    TICK,
    Embedded,
    create_queue_body,
    enqueue_body,
)

D = "acme"


def queue_view(embedded: Embedded, queue: str = "jobs") -> QueueView:
    outcome = embedded.submit(D, INSPECT_QUEUE, {"queue": queue})
    assert isinstance(outcome.result, QueueView), outcome
    return outcome.result


def message_view(embedded: Embedded, message_id: str, include_body: bool = False) -> MessageView:
    body = {"queue": "jobs", "message_id": message_id, "include_body": include_body}
    outcome = embedded.submit(D, INSPECT_MESSAGE, body)
    assert isinstance(outcome.result, MessageView), outcome
    return outcome.result


def rejected(embedded: Embedded, kind: str, body: dict[str, Any]) -> tuple[str | None, str]:
    outcome = embedded.submit(D, kind, body)
    assert outcome.status == "rejected", outcome
    return outcome.error_code, outcome.detail


def test_create_queue_takes_documented_defaults(embedded: Embedded) -> None:
    outcome = embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    assert outcome.status == "committed"
    view = queue_view(embedded)
    policy = view.policy
    assert (policy.lease_ms, policy.retry_factor, policy.max_attempts) == (30_000, 2, 5)
    assert (policy.ordering, policy.parked_head, policy.retry_jitter) == ("competing", "continue", "none")
    assert policy.max_dead_letter_messages is None and policy.max_dead_letter_bytes is None
    assert view.policy_version == 1 and view.counters.stored_messages == 0


@pytest.mark.parametrize(
    ("name", "policy", "detail"),
    [
        ("", {}, "queue name"),
        ("has space", {}, "queue name"),
        ("x" * (limits.MAX_QUEUE_NAME_CHARS + 1), {}, "queue name"),
        ("jobs", {"max_attempts": 0}, "policy.max_attempts"),
        ("jobs", {"lease_ms": 60_000, "max_lease_ms": 30_000}, "lease_ms must not exceed"),
        ("jobs", {"max_stored_messages": 10, "max_dead_letter_messages": 11}, "max_dead_letter_messages"),
        ("jobs", {"ordering": "random"}, "policy.ordering"),
        ("jobs", {"retry_base_ms": 10, "retry_max_ms": 5}, "retry_base_ms"),
    ],
)
def test_create_queue_validates_name_and_policy(
    embedded: Embedded, name: str, policy: dict[str, Any], detail: str
) -> None:
    code, text = rejected(embedded, CREATE_QUEUE, create_queue_body(name, **policy))
    assert code == "Validation" and detail in text


def test_create_existing_queue_is_a_conflict(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    assert rejected(embedded, CREATE_QUEUE, create_queue_body("jobs"))[0] == "Conflict"


def test_configure_replaces_policy_with_revision_fencing(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    body = {"queue": "jobs", "policy": create_queue_body("jobs", max_attempts=9)["policy"]}
    stale = dict(body, expected_policy_version=7)
    assert rejected(embedded, CONFIGURE_QUEUE, stale)[0] == "RevisionConflict"
    outcome = embedded.submit(D, CONFIGURE_QUEUE, dict(body, expected_policy_version=1))
    assert isinstance(outcome.result, QueueView)
    assert outcome.result.policy.max_attempts == 9 and outcome.result.policy_version == 2


def test_ordering_profile_cannot_change_while_messages_are_stored(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    strict = {"queue": "jobs", "policy": create_queue_body("jobs", ordering="strict_per_key")["policy"]}
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1"))
    code, detail = rejected(embedded, CONFIGURE_QUEUE, dict(strict, expected_policy_version=None))
    assert code == "Conflict" and "ordering" in detail
    # An empty queue may change profile.
    embedded.submit(D, CREATE_QUEUE, create_queue_body("empty"))
    strict_empty = {"queue": "empty", "policy": strict["policy"], "expected_policy_version": None}
    assert embedded.submit(D, CONFIGURE_QUEUE, strict_empty).status == "committed"


def test_enqueue_charges_exact_quota_and_indexes_ready(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    outcome = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"12345", headers={"k": "v"}, ordering_key="o"))
    assert outcome.result == EnqueueResult(
        queue="jobs", message_id="m1", state="ready", enqueue_sequence=1, stored_messages=1, stored_bytes=5
    )
    view = queue_view(embedded)
    assert (view.counters.stored_messages, view.counters.stored_bytes, view.counters.ready) == (1, 5, 1)
    message = message_view(embedded, "m1", include_body=True)
    assert message.body == b"12345"
    assert message.meta.state == "ready" and message.meta.ready_sequence == 1
    assert message.meta.headers == {"k": "v"} and message.meta.ordering_key == "o"
    assert message.meta.enqueued_at_ms == outcome.eval_time_ms


def test_quota_refusal_leaves_the_queue_unchanged(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=2, max_stored_bytes=10))
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"1234"))
    before = queue_view(embedded)
    code, detail = rejected(embedded, ENQUEUE, enqueue_body("jobs", "big", b"1234567"))
    assert code == "ResourceExhausted" and "max_stored_bytes" in detail
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m2", b"1"))
    code, detail = rejected(embedded, ENQUEUE, enqueue_body("jobs", "m3", b"1"))
    assert code == "ResourceExhausted" and "max_stored_messages" in detail
    after = queue_view(embedded)
    assert after.counters.stored_messages == before.counters.stored_messages + 1 == 2
    assert after.counters.stored_bytes == 5
    assert (
        rejected(embedded, INSPECT_MESSAGE, {"queue": "jobs", "message_id": "big", "include_body": False})[0]
        == "NotFound"
    )


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"message_id": ""}, "message id"),
        ({"message_id": "has space"}, "message id"),
        ({"body": b"x" * (limits.MAX_INLINE_BODY_BYTES + 1)}, "body exceeds"),
        ({"headers": {"bad name": "v"}}, "header name"),
        ({"headers": {f"h{i}": "v" for i in range(limits.MAX_HEADERS + 1)}}, "headers"),
        ({"headers": {"h": "v" * limits.MAX_HEADERS_BYTES}}, "headers exceed"),
        ({"ordering_key": ""}, "ordering key"),
        ({"expires_at_ms": 1}, "expires_at_ms is not in the future"),
        ({"not_before_ms": 3_000_000, "expires_at_ms": 2_000_000}, "after not_before_ms"),
        ({"not_before_ms": 10**15}, "365 days"),
    ],
)
def test_enqueue_validation(embedded: Embedded, fields: dict[str, Any], detail: str) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    message_id = fields.pop("message_id", "m1")
    code, text = rejected(embedded, ENQUEUE, enqueue_body("jobs", message_id, **fields))
    assert code == "Validation" and detail in text
    assert queue_view(embedded).counters.stored_messages == 0


def test_message_ids_are_never_reused(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"a"))
    assert rejected(embedded, ENQUEUE, enqueue_body("jobs", "m1", b"a"))[0] == "Conflict"


def test_unknown_queue_is_not_found(embedded: Embedded) -> None:
    assert rejected(embedded, ENQUEUE, enqueue_body("nope", "m1"))[0] == "NotFound"
    assert rejected(embedded, INSPECT_QUEUE, {"queue": "nope"})[0] == "NotFound"


def test_scheduled_message_becomes_ready_on_tick_at_log_time(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    start = embedded.now_ms
    outcome = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "later", not_before_ms=start + 5_000))
    assert isinstance(outcome.result, EnqueueResult) and outcome.result.state == "scheduled"
    embedded.now_ms = start + 4_999
    tick = embedded.submit(D, TICK, {})
    assert tick.result == TickResult(transitions=0, budget_exhausted=False, next_due_ms=start + 5_000)
    assert message_view(embedded, "later").meta.state == "scheduled"
    embedded.now_ms = start + 5_000
    assert embedded.submit(D, TICK, {}).result == TickResult(transitions=1, budget_exhausted=False, next_due_ms=None)
    meta = message_view(embedded, "later").meta
    assert (meta.state, meta.ready_sequence, meta.state_version) == ("ready", 1, 2)
    counters = queue_view(embedded).counters
    assert (counters.scheduled, counters.ready) == (0, 1)


def test_expiry_releases_body_and_quota(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    start = embedded.now_ms
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "short", b"abc", expires_at_ms=start + 100))
    embedded.submit(
        D, ENQUEUE, enqueue_body("jobs", "sched", b"de", not_before_ms=start + 50, expires_at_ms=start + 60)
    )
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "keep", b"f"))
    embedded.now_ms = start + 100
    tick = embedded.submit(D, TICK, {})
    assert isinstance(tick.result, TickResult)
    assert tick.result.transitions == 3  # sched: ready at 50, expired at 60; short: expired at 100
    for message_id in ("short", "sched"):
        view = message_view(embedded, message_id, include_body=True)
        assert view.meta.state == "expired" and view.body is None and view.meta.terminal_at_ms == start + 100
    counters = queue_view(embedded).counters
    assert (counters.stored_messages, counters.stored_bytes, counters.ready, counters.expired_total) == (1, 1, 1, 2)
    # An expired id stays taken.
    assert rejected(embedded, ENQUEUE, enqueue_body("jobs", "short"))[0] == "Conflict"


def test_tick_examines_a_bounded_number_of_timers(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    start = embedded.now_ms
    due = limits.TICK_EXAMINATION_BUDGET + 10
    for i in range(due):
        embedded.submit(D, ENQUEUE, enqueue_body("jobs", f"m{i}", not_before_ms=start + 1 + i))
    embedded.now_ms = start + due + 1
    first = embedded.submit(D, TICK, {}).result
    assert first == TickResult(
        transitions=limits.TICK_EXAMINATION_BUDGET,
        budget_exhausted=True,
        next_due_ms=start + 1 + limits.TICK_EXAMINATION_BUDGET,
    )
    second = embedded.submit(D, TICK, {}).result
    assert second == TickResult(transitions=10, budget_exhausted=False, next_due_ms=None)
    assert queue_view(embedded).counters.ready == due


def test_timers_of_several_queues_fire_in_due_order(embedded: Embedded) -> None:
    start = embedded.now_ms
    for queue in ("a", "b"):
        embedded.submit(D, CREATE_QUEUE, create_queue_body(queue))
    embedded.submit(D, ENQUEUE, enqueue_body("b", "b1", not_before_ms=start + 10))
    embedded.submit(D, ENQUEUE, enqueue_body("a", "a1", not_before_ms=start + 20))
    embedded.submit(D, ENQUEUE, enqueue_body("b", "b2", not_before_ms=start + 30))
    embedded.now_ms = start + 25
    assert embedded.submit(D, TICK, {}).result == TickResult(
        transitions=2, budget_exhausted=False, next_due_ms=start + 30
    )
    embedded.now_ms = start + 30
    assert embedded.submit(D, TICK, {}).result == TickResult(transitions=1, budget_exhausted=False, next_due_ms=None)


def test_any_command_fires_due_timers_not_only_tick(embedded: Embedded) -> None:
    """Log time reaching a timer fires it: an enqueue after an expiry finds the slot free."""
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=1))
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", expires_at_ms=embedded.now_ms + 100))
    embedded.now_ms += 60_000
    assert embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m2")).status == "committed"
    assert message_view(embedded, "m1").meta.state == "expired"
