"""Inboxes through the real processor, file log and RocksDB (DESIGN.md §7, processors/documents/inbox.py):
CompleteProcessing applies a delivery's effects, records its inbox entry and acks it, all or nothing,
for queues and subscription groups; CommitInbox deduplicates effects on the target's side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.processors.apply import FINGERPRINT_BYTES
from keyload.sdk.results import (
    BatchResult,
    Delivery,
    Document,
    DocumentResult,
    EnqueueResult,
    GroupDelivery,
    GroupReceiveResult,
    GroupView,
    InboxView,
    Outcome,
    ProcessingResult,
    PublishResult,
    QueueCounters,
    QueueView,
    ReceiveResult,
    TopicView,
)

from .support import (
    COMMIT_INBOX,
    COMPLETE_PROCESSING,
    CONFIGURE_INBOX,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    GET_DOCUMENT,
    GROUP_RECEIVE,
    GROUP_RENEW,
    GROUP_STATUS,
    INSPECT_QUEUE,
    INSPECT_TOPIC,
    PUBLISH,
    PUT_DOCUMENT,
    RECEIVE,
    SEEK_GROUP,
    TICK,
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
    mutation,
    publish_body,
    put_document_body,
    receive_body,
    submit_unhalted,
)
from .test_batch import delete, message, observed, ok, put, refused
from .test_leases import fill_due_timers

D = "acme"
SCOPE = "billing"


def enqueue(message_id: str, queue: str = "jobs") -> dict[str, Any]:
    return mutation(ENQUEUE, enqueue_body(queue, message_id, b"follow-up"))


def publish(event_id: str) -> dict[str, Any]:
    return mutation(PUBLISH, publish_body("news", event(event_id, b"done")))


def complete_body(
    token: str,
    effects: list[dict[str, Any]],
    scope: str = SCOPE,
    execution_generation: int = 0,
    group: str | None = None,
) -> dict[str, Any]:
    return {
        "token": token,
        "handler_scope": scope,
        "execution_generation": execution_generation,
        "effects": effects,
        "topic": None if group is None else "news",
        "group": group,
    }


def complete(
    embedded: Embedded,
    token: str,
    effects: list[dict[str, Any]],
    *,
    command_id: str | None = None,
    principal: str = "tester",
    **fields: Any,
) -> Outcome:
    body = complete_body(token, effects, **fields)
    outcome = embedded.submit(D, COMPLETE_PROCESSING, body, command_id, principal=principal)
    assert not [p.halt for p in embedded.processors if p.halt is not None]
    assert token not in outcome.detail  # details never echo tokens
    return outcome


def receipt(outcome: Outcome) -> ProcessingResult:
    result = expect(outcome, None)
    assert isinstance(result, ProcessingResult) and outcome.failed_index is None
    return result


def document(embedded: Embedded, key: str) -> tuple[bytes, int] | None:
    outcome = submit_unhalted(embedded, D, GET_DOCUMENT, {"key": key})
    return (outcome.result.value, outcome.result.revision) if isinstance(outcome.result, Document) else None


def counters(embedded: Embedded) -> QueueCounters:
    view = ok(embedded, INSPECT_QUEUE, {"queue": "jobs"})
    assert isinstance(view, QueueView)
    return view.counters


def tail(embedded: Embedded) -> int:
    view = ok(embedded, INSPECT_TOPIC, {"topic": "news"})
    assert isinstance(view, TopicView)
    return view.tail


def deliver(embedded: Embedded, message_id: str) -> Delivery:
    """Enqueue a message and lease it."""
    ok(embedded, ENQUEUE, enqueue_body("jobs", message_id, b"work"))
    received = ok(embedded, RECEIVE, receive_body("jobs", max_messages=1))
    assert isinstance(received, ReceiveResult)
    [delivery] = received.deliveries
    assert delivery.message_id == message_id
    return delivery


def forged(token: str) -> str:
    middle = len(token) // 2
    return token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]


@pytest.fixture
def work(embedded: Embedded) -> Embedded:
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs", lease_ms=10_000))
    ok(embedded, CREATE_TOPIC, create_topic_body("news"))
    ok(embedded, PUT_DOCUMENT, put_document_body("b", b"b1"))
    ok(embedded, PUT_DOCUMENT, put_document_body("c", b"c1"))
    return embedded


def five(expected_b: int) -> list[dict[str, Any]]:
    return [put("a", b"a1", 0), enqueue("m1-next"), put("b", b"b2", expected_b), publish("e1"), delete("c", 1)]


# -- CompleteProcessing of a queue's delivery --------------------------------------------------------


def test_effects_inbox_entry_and_ack_commit_together(work: Embedded) -> None:
    delivery = deliver(work, "m1")
    work.now_ms += 250
    outcome = complete(work, delivery.token, [put("a", b"paid", 0), enqueue("m1-next"), publish("e1")])
    first = receipt(outcome)
    assert (first.already_processed, first.command_id, first.offset, first.completed_at_ms) == (
        False,
        outcome.command_id,
        outcome.offset,
        work.now_ms,
    )
    put_result, enqueue_result, publish_result = first.results.results
    assert put_result == DocumentResult(key="a", revision=1, deleted=False)
    assert isinstance(enqueue_result, EnqueueResult) and enqueue_result.message_id == "m1-next"
    assert isinstance(publish_result, PublishResult) and publish_result.events[0].position == 1
    assert message(work, "m1").meta.state == "acked"
    assert message(work, "m1-next").meta.state == "ready"
    assert document(work, "a") == (b"paid", 1)
    assert tail(work) == 1
    live = counters(work)
    assert (live.acked_total, live.leased, live.ready, live.stored_messages) == (1, 0, 1, 1)


def test_a_repeat_returns_the_first_receipt_and_other_effects_conflict(work: Embedded) -> None:
    delivery = deliver(work, "m1")
    effects = [put("a", b"paid", 0), enqueue("m1-next")]
    first_outcome = complete(work, delivery.token, effects, command_id="complete-1")
    first = receipt(first_outcome)
    state = work.state_digest(D)
    # The same command again: its stored outcome.
    again = complete(work, delivery.token, effects, command_id="complete-1")
    assert (again.offset, receipt(again)) == (first_outcome.offset, first)
    # The same effects under a new command id (a retry after a crash): the first receipt, no new effect.
    work.now_ms += 60_000  # long past the lease: the delivery is settled, the repeat is recognised all the same
    repeat = receipt(complete(work, delivery.token, effects, command_id="complete-2"))
    assert repeat == ProcessingResult(True, "complete-1", first_outcome.offset, first.completed_at_ms, first.results)
    # Naming the command's own domain explicitly is the same effect.
    explicit = [put("a", b"paid", 0, domain=D), mutation(ENQUEUE, enqueue_body("jobs", "m1-next", b"follow-up"), D)]
    assert receipt(complete(work, delivery.token, explicit)).command_id == "complete-1"
    assert work.state_digest(D) == state
    # Other effects for the same delivery, scope and execution generation: Conflict, nothing applied.
    refused(complete(work, delivery.token, [put("a", b"refunded", 0), enqueue("m1-next")]), "Conflict")
    refused(complete(work, delivery.token, effects[:1]), "Conflict")
    assert work.state_digest(D) == state
    assert document(work, "a") == (b"paid", 1)
    assert counters(work).enqueued_total == 2


def test_a_repeat_in_the_same_group_commit_as_the_first_is_recognised(work: Embedded) -> None:
    """The first receipt is read from the first command's stored outcome, which a repeat applied in
    the same group commit finds staged, not yet in RocksDB."""
    delivery = deliver(work, "m1")
    ok(work, CONFIGURE_INBOX, {"max_receipts": 10, "max_bytes": 10_000})
    target = {"source": source("m1"), "handler_scope": SCOPE, "execution_generation": 0, "effects": [put("t")]}
    appended = [
        ("first", COMPLETE_PROCESSING, complete_body(delivery.token, [put("a")])),
        ("repeat", COMPLETE_PROCESSING, complete_body(delivery.token, [put("a")])),
        ("target-first", COMMIT_INBOX, target),
        ("target-repeat", COMMIT_INBOX, target),
    ]
    for command_id, kind, body in appended:
        work.append(D, command(D, kind, body, command_id))
    work.run()
    assert not [p.halt for p in work.processors if p.halt is not None]
    stored = {
        command_id: REGISTRY.decode("keyload.Outcome", (work.stored_outcome(D, command_id) or b"")[FINGERPRINT_BYTES:])
        for command_id, _, _ in appended
    }
    for first, repeat in (("first", "repeat"), ("target-first", "target-repeat")):
        assert stored[first]["status"] == stored[repeat]["status"] == "committed"
        assert stored[repeat]["result"][1] == dict(stored[first]["result"][1], already_processed=True)
    assert document(work, "a") == (b"v", 1) and document(work, "t") == (b"v", 1)


def test_a_repeat_with_its_headers_in_another_order_is_the_same_effects(work: Embedded) -> None:
    forward = {"a": "1", "b": "2", "c": "3"}
    backward = dict(reversed(forward.items()))

    def effects(headers: dict[str, str], suffix: str = "") -> list[dict[str, Any]]:
        return [
            mutation(ENQUEUE, enqueue_body("jobs", "m1-next" + suffix, b"x", headers=headers)),
            mutation(PUBLISH, publish_body("news", event("e1" + suffix, b"x", "t", **headers))),
        ]

    delivery = deliver(work, "m1")
    first = receipt(complete(work, delivery.token, effects(forward), command_id="ordered"))
    state = work.state_digest(D)
    repeat = receipt(complete(work, delivery.token, effects(backward)))
    assert (repeat.already_processed, repeat.command_id, repeat.results) == (True, "ordered", first.results)
    # The same command id too: the maps of its effects are sorted for its fingerprint.
    assert receipt(complete(work, delivery.token, effects(backward), command_id="ordered")) == first
    assert work.state_digest(D) == state
    ok(work, CONFIGURE_INBOX, {"max_receipts": 10, "max_bytes": 10_000})
    committed = receipt(commit(work, source("m1"), effects(forward, "-t"), command_id="commit-ordered"))
    assert receipt(commit(work, source("m1"), effects(backward, "-t"), command_id="commit-ordered")) == committed
    assert receipt(commit(work, source("m1"), effects(backward, "-t"))).command_id == "commit-ordered"


def test_a_holder_whose_lease_ran_out_is_told_the_redelivery_was_processed(work: Embedded) -> None:
    """The exactly-once case: a handler stalls past its lease, the message is redelivered and
    processed by another consumer; the stalled one's late completion applies nothing twice."""
    stalled = deliver(work, "m1")
    work.now_ms = stalled.lease_until_ms
    ok(work, TICK, {})  # the lease runs out: a retry is scheduled
    work.now_ms += 60_000
    received = ok(work, RECEIVE, receive_body("jobs", max_messages=1))
    assert isinstance(received, ReceiveResult)
    [again] = received.deliveries
    assert (again.message_id, again.attempts, again.delivery_generation) == ("m1", 2, stalled.delivery_generation)
    effects = [put("a", b"paid", 0), enqueue("m1-next")]
    # While the redelivery is in hand, the stalled holder's completion is refused: its lease is over.
    refused(complete(work, stalled.token, effects), "StaleLease")
    done = receipt(complete(work, again.token, effects, command_id="redelivery"))
    state = work.state_digest(D)
    late = receipt(complete(work, stalled.token, effects))
    assert (late.already_processed, late.command_id, late.results) == (True, "redelivery", done.results)
    assert work.state_digest(D) == state
    assert document(work, "a") == (b"paid", 1) and counters(work).enqueued_total == 2


def test_a_failing_effect_rolls_everything_back_and_the_lease_stays(work: Embedded) -> None:
    delivery = deliver(work, "m1")
    before = observed(work)
    outcome = complete(work, delivery.token, five(expected_b=3))
    refused(outcome, "RevisionConflict", 2)
    assert outcome.detail.startswith("mutation 2")
    assert observed(work) == before
    meta = message(work, "m1").meta
    assert (meta.state, meta.lease_until_ms) == ("leased", delivery.lease_until_ms)
    # No inbox entry was recorded: the corrected effects apply, with the same token.
    fixed = receipt(complete(work, delivery.token, five(expected_b=1)))
    assert [type(r) for r in fixed.results.results] == [
        DocumentResult,
        EnqueueResult,
        DocumentResult,
        PublishResult,
        DocumentResult,
    ]
    assert [document(work, key) for key in ("a", "b", "c")] == [(b"a1", 1), (b"b2", 2), None]
    assert message(work, "m1").meta.state == "acked"
    assert tail(work) == 1


def test_a_quota_refusal_among_the_effects_keeps_the_lease(work: Embedded) -> None:
    ok(work, CREATE_QUEUE, create_queue_body("small", max_stored_messages=1))
    ok(work, ENQUEUE, enqueue_body("small", "full"))
    delivery = deliver(work, "m1")
    before = observed(work)
    refused(complete(work, delivery.token, [put("a"), enqueue("x", queue="small")]), "ResourceExhausted", 1)
    assert observed(work) == before
    assert message(work, "m1").meta.state == "leased"


@pytest.mark.parametrize("lapse", ["foreign principal", "forged token", "lease over"])
def test_lease_refusals_apply_nothing(work: Embedded, lapse: str) -> None:
    delivery = deliver(work, "m1")
    token, principal, code = delivery.token, "tester", "StaleLease"
    if lapse == "foreign principal":
        principal, code = "mallory", "PermissionDenied"
    elif lapse == "forged token":
        token, code = forged(token), "TokenInvalidated"
    else:
        work.now_ms = delivery.lease_until_ms
        ok(work, TICK, {})  # the lease timer ends the attempt
    before = observed(work)
    refused(complete(work, token, five(expected_b=1), principal=principal), code)
    assert observed(work) == before
    assert document(work, "a") is None
    if lapse != "lease over":
        assert receipt(complete(work, delivery.token, five(expected_b=1))).already_processed is False


def test_a_lease_past_its_deadline_is_lease_expired(work: Embedded) -> None:
    """As for an ack (test_leases.py): reached only while earlier due timers hold the lease timer back."""
    start = work.now_ms
    delivery = deliver(work, "m1")
    ok(work, "keyload.command.Renew", {"token": delivery.token, "lease_ms": 100})
    fill_due_timers(work, start + 10, records=2)
    work.now_ms = start + 120
    before = work.state_digest(D)
    refused(complete(work, delivery.token, [put("a")]), "LeaseExpired")
    assert work.state_digest(D) != before  # the record fired filler timers: that is all it did
    assert document(work, "a") is None


def test_effects_naming_another_domain_are_refused_before_the_token_is_even_read(work: Embedded) -> None:
    delivery = deliver(work, "m1")
    before = observed(work)
    for token in (delivery.token, forged(delivery.token)):
        outcome = complete(work, token, [put("a"), put("b", domain="elsewhere"), enqueue("x")])
        refused(outcome, "Validation", 1)
        assert "another domain" in outcome.detail
    assert observed(work) == before
    assert message(work, "m1").meta.state == "leased"


@pytest.mark.parametrize(
    "fields",
    [
        {"scope": ""},
        {"scope": "has space"},
        {"scope": "s" * (limits.MAX_HANDLER_SCOPE_CHARS + 1)},
        {"execution_generation": -1},
    ],
)
def test_processing_validation(work: Embedded, fields: dict[str, Any]) -> None:
    delivery = deliver(work, "m1")
    refused(complete(work, delivery.token, [put("a")], **fields), "Validation")
    refused(complete(work, delivery.token, [], **fields), "Validation")
    assert message(work, "m1").meta.state == "leased"


def test_processing_takes_up_to_a_hundred_effects_and_none_just_acks(work: Embedded) -> None:
    delivery = deliver(work, "m1")
    too_many = [put(f"k{i}") for i in range(limits.MAX_BATCH_MUTATIONS + 1)]
    refused(complete(work, delivery.token, too_many), "Validation")
    assert message(work, "m1").meta.state == "leased"
    assert len(receipt(complete(work, delivery.token, too_many[:-1])).results.results) == limits.MAX_BATCH_MUTATIONS
    # A handler with nothing to write still records that it ran, and acks.
    other = deliver(work, "m2")
    nothing = receipt(complete(work, other.token, [], command_id="nothing"))
    assert (nothing.already_processed, nothing.results) == (False, BatchResult([]))
    assert message(work, "m2").meta.state == "acked"
    assert receipt(complete(work, other.token, [])).command_id == "nothing"
    refused(complete(work, other.token, [put("late")]), "Conflict")


def test_another_scope_or_execution_generation_is_another_inbox_key(work: Embedded) -> None:
    """Not a repeat: a different key is processed anew, so here, the delivery being acked by the first
    processing, it meets a settled lease instead of the first receipt."""
    delivery = deliver(work, "m1")
    effects = [put("a")]
    receipt(complete(work, delivery.token, effects))
    state = work.state_digest(D)
    refused(complete(work, delivery.token, effects, scope="shipping"), "StaleLease")
    refused(complete(work, delivery.token, effects, execution_generation=1), "StaleLease")
    assert receipt(complete(work, delivery.token, effects)).already_processed is True
    assert work.state_digest(D) == state
    # Before the first processing, a second scope's effects apply and ack.
    other = deliver(work, "m2")
    assert receipt(complete(work, other.token, effects, scope="shipping")).already_processed is False
    assert document(work, "a") == (b"v", 2)
    refused(complete(work, other.token, effects), "StaleLease")  # the billing scope was never applied


# -- CompleteProcessing of a subscription group's delivery ---------------------------------------------


def group_view(embedded: Embedded) -> GroupView:
    view = ok(embedded, GROUP_STATUS, {"topic": "news", "group": "g"})
    assert isinstance(view, GroupView)
    return view


@pytest.fixture
def subscribed(work: Embedded) -> list[GroupDelivery]:
    ok(work, PUBLISH, publish_body("news", event("p1"), event("p2"), event("p3")))
    ok(work, CREATE_GROUP, create_group_body("news", "g"))
    received = ok(work, GROUP_RECEIVE, group_receive_body("news", "g"))
    assert isinstance(received, GroupReceiveResult)
    assert [d.position for d in received.deliveries] == [1, 2, 3]
    return received.deliveries


def test_a_group_delivery_commits_effects_and_acks_its_position(
    work: Embedded, subscribed: list[GroupDelivery]
) -> None:
    first, second, third = subscribed
    effects = [put("a", b"from p1", 0), enqueue("p1-next"), publish("e-p1")]
    outcome = complete(work, first.token, effects, group="g", command_id="group-1")
    done = receipt(outcome)
    assert (done.already_processed, done.command_id, done.offset) == (False, "group-1", outcome.offset)
    view = group_view(work)
    assert (view.checkpoint, view.outstanding, view.acked_total) == (1, 2, 1)
    assert document(work, "a") == (b"from p1", 1)
    assert message(work, "p1-next").meta.state == "ready"
    assert tail(work) == 4  # the effect published to the group's own topic
    state = work.state_digest(D)
    # A repeat under a new command id: the first receipt; other effects: Conflict.
    repeat = receipt(complete(work, first.token, effects, group="g"))
    assert repeat == ProcessingResult(True, "group-1", outcome.offset, done.completed_at_ms, done.results)
    refused(complete(work, first.token, effects[:2], group="g"), "Conflict")
    assert work.state_digest(D) == state

    # A failing effect rolls back, the position stays leased, the same token completes it after.
    before = observed(work), group_view(work)
    failing = [put("z", b"z", 0), enqueue("z-next"), put("b", b"b2", 9), publish("e-z"), delete("c", 1)]
    refused(complete(work, third.token, failing, group="g"), "RevisionConflict", 2)
    assert (observed(work), group_view(work)) == before
    renewed = ok(work, GROUP_RENEW, {"topic": "news", "group": "g", "token": third.token, "lease_ms": None})
    assert renewed.state == "leased"
    assert receipt(complete(work, third.token, [put("b", b"b2", 1)], group="g")).already_processed is False
    assert group_view(work).checkpoint == 1  # position 2 holds it
    assert receipt(complete(work, second.token, [put("b", b"b3", 2)], group="g")).already_processed is False
    view = group_view(work)
    assert (view.checkpoint, view.outstanding, view.acked_total) == (3, 0, 3)
    assert document(work, "b") == (b"b3", 3)


def test_a_group_holder_whose_lease_ran_out_is_told_the_redelivery_was_processed(
    work: Embedded, subscribed: list[GroupDelivery]
) -> None:
    stalled = subscribed[0]
    work.now_ms = stalled.lease_until_ms
    ok(work, TICK, {})  # the lease runs out: position 1 will be retried
    work.now_ms += 600_000
    received = ok(work, GROUP_RECEIVE, group_receive_body("news", "g", max_events=1))
    assert isinstance(received, GroupReceiveResult)
    [again] = received.deliveries
    assert (again.position, again.attempts) == (1, 2)
    effects = [put("a", b"from p1", 0)]
    refused(complete(work, stalled.token, effects, group="g"), "StaleLease")
    done = receipt(complete(work, again.token, effects, group="g", command_id="redelivery"))
    state = work.state_digest(D)
    late = receipt(complete(work, stalled.token, effects, group="g"))
    assert (late.already_processed, late.command_id, late.results) == (True, "redelivery", done.results)
    assert work.state_digest(D) == state
    assert group_view(work).checkpoint == 1


def test_after_a_seek_a_group_repeat_is_token_invalidated(work: Embedded, subscribed: list[GroupDelivery]) -> None:
    """A seek starts a new generation: the old tokens are invalid, a repeat included (documented)."""
    effects = [put("a")]
    receipt(complete(work, subscribed[0].token, effects, group="g"))
    seek = {"topic": "news", "group": "g", "to": "position", "position": 1, "expected_generation": None}
    ok(work, SEEK_GROUP, seek)
    state = work.state_digest(D)
    refused(complete(work, subscribed[0].token, effects, group="g"), "TokenInvalidated")
    assert work.state_digest(D) == state


def test_group_delivery_refusals(work: Embedded, subscribed: list[GroupDelivery]) -> None:
    token = subscribed[0].token
    queue_token = deliver(work, "m1").token
    before = observed(work), group_view(work)
    refused(complete(work, token, [put("a")], group="g", principal="mallory"), "PermissionDenied")
    refused(complete(work, forged(token), [put("a")], group="g"), "TokenInvalidated")
    refused(complete(work, queue_token, [put("a")], group="g"), "TokenInvalidated")
    refused(complete(work, token, [put("a")]), "TokenInvalidated")  # a group's token is not a queue's
    refused(complete(work, token, [put("a"), put("b", domain="other")], group="g"), "Validation", 1)
    only_topic = dict(complete_body(token, [put("a")]), topic="news")
    refused(submit_unhalted(work, D, COMPLETE_PROCESSING, only_topic), "Validation")
    missing = dict(complete_body(token, [put("a")], group="nope"))
    refused(submit_unhalted(work, D, COMPLETE_PROCESSING, missing), "NotFound")
    assert (observed(work), group_view(work)) == before


def test_replay_rebuilds_processing(work: Embedded, subscribed: list[GroupDelivery], tmp_path: Path) -> None:
    delivery = deliver(work, "m1")
    complete(work, delivery.token, five(expected_b=5))
    receipt(complete(work, delivery.token, five(expected_b=1), command_id="q-1"))
    receipt(complete(work, delivery.token, five(expected_b=1)))
    work.now_ms += 100
    receipt(complete(work, subscribed[0].token, [put("g1"), enqueue("g-next")], group="g"))
    refused(complete(work, subscribed[0].token, [put("g2")], group="g"), "Conflict")
    ok(work, CONFIGURE_INBOX, {"max_receipts": 3, "max_bytes": 10_000})
    commit(work, source("m9"), [put("t1")])
    assert_replay_equals_live(work, D, tmp_path)


# -- CommitInbox: target-side deduplication ----------------------------------------------------------


def source(message_id: str, domain: str = "orders", queue: str = "jobs", generation: int = 1) -> dict[str, Any]:
    return {"domain": domain, "queue": queue, "message_id": message_id, "delivery_generation": generation}


def commit(
    embedded: Embedded,
    from_: dict[str, Any],
    effects: list[dict[str, Any]],
    scope: str = SCOPE,
    execution_generation: int = 0,
    command_id: str | None = None,
) -> Outcome:
    body = {"source": from_, "handler_scope": scope, "execution_generation": execution_generation, "effects": effects}
    return submit_unhalted(embedded, D, COMMIT_INBOX, body, command_id)


def configure(embedded: Embedded, max_receipts: int = 100, max_bytes: int = 100_000) -> InboxView:
    view = ok(embedded, CONFIGURE_INBOX, {"max_receipts": max_receipts, "max_bytes": max_bytes})
    assert isinstance(view, InboxView)
    return view


def test_a_domain_without_an_inbox_does_not_take_commits(work: Embedded) -> None:
    before = work.state_digest(D)
    refused(commit(work, source("m1"), [put("a")]), "UnsupportedCapability")
    assert work.state_digest(D) == before and document(work, "a") is None


@pytest.mark.parametrize(
    "policy",
    [
        {"max_receipts": 0, "max_bytes": 1},
        {"max_receipts": limits.MAX_INBOX_RECEIPTS + 1, "max_bytes": 1},
        {"max_receipts": 1, "max_bytes": 0},
        {"max_receipts": 1, "max_bytes": limits.MAX_INBOX_BYTES + 1},
    ],
)
def test_configure_inbox_validation(work: Embedded, policy: dict[str, int]) -> None:
    refused(submit_unhalted(work, D, CONFIGURE_INBOX, policy), "Validation")
    refused(commit(work, source("m1"), [put("a")]), "UnsupportedCapability")  # still no inbox


def test_configure_inbox_shows_its_policy_and_use(work: Embedded) -> None:
    assert configure(work, 5, 9_000) == InboxView(domain=D, max_receipts=5, max_bytes=9_000, receipts=0, bytes=0)
    assert configure(work, limits.MAX_INBOX_RECEIPTS, limits.MAX_INBOX_BYTES).receipts == 0
    receipt(commit(work, source("m1"), [put("a")]))
    receipt(commit(work, source("m2"), [put("b")]))
    view = configure(work, 5, 9_000)
    assert (view.max_receipts, view.max_bytes, view.receipts) == (5, 9_000, 2)
    one = configure(work, 5, 9_000).bytes // 2
    assert one > 0 and view.bytes == 2 * one  # equal-sized entries are charged alike
    assert configure(work, 1, 1) == InboxView(
        domain=D, max_receipts=1, max_bytes=1, receipts=2, bytes=view.bytes
    )  # below its use: allowed


def test_duplicate_deliveries_apply_once(work: Embedded) -> None:
    configure(work)
    effects = [put("a", b"credited"), enqueue("notify-1")]
    first_outcome = commit(work, source("m1"), effects, command_id="commit-1")
    first = receipt(first_outcome)
    assert (first.already_processed, first.command_id, first.offset) == (False, "commit-1", first_outcome.offset)
    state, use = work.state_digest(D), configure(work)
    for _ in range(2):
        repeat = receipt(commit(work, source("m1"), effects))
        assert repeat == ProcessingResult(True, "commit-1", first_outcome.offset, first.completed_at_ms, first.results)
    assert (work.state_digest(D), configure(work)) == (state, use)
    assert document(work, "a") == (b"credited", 1)
    refused(commit(work, source("m1"), [put("a", b"credited twice"), enqueue("notify-1")]), "Conflict")
    assert (work.state_digest(D), configure(work)) == (state, use)


@pytest.mark.parametrize(
    ("changed", "fields"),
    [
        ("scope", {"scope": "other-handler"}),
        ("execution generation", {"execution_generation": 1}),
        ("delivery generation", {"from_": source("m1", generation=2)}),
        ("source domain", {"from_": source("m1", domain="returns")}),
        ("source queue", {"from_": source("m1", queue="refunds")}),
        ("message", {"from_": source("m2")}),
    ],
)
def test_each_part_of_the_source_reference_makes_another_key(
    work: Embedded, changed: str, fields: dict[str, Any]
) -> None:
    configure(work)
    receipt(commit(work, source("m1"), [put("a")]))
    again = receipt(commit(work, **{"from_": source("m1"), "effects": [put("a")], **fields}))
    assert again.already_processed is False, changed
    assert document(work, "a") == (b"v", 2)
    assert configure(work).receipts == 2


def test_quota_refusals_change_nothing(work: Embedded) -> None:
    configure(work, max_receipts=1)
    first = receipt(commit(work, source("m1"), [put("a")]))
    use = configure(work, max_receipts=1)
    state = work.state_digest(D)
    refused(commit(work, source("m2"), [put("b", b"x")]), "ResourceExhausted")
    assert work.state_digest(D) == state and document(work, "b") == (b"b1", 1)
    # A duplicate is still answered when the inbox is full.
    assert receipt(commit(work, source("m1"), [put("a")])).command_id == first.command_id
    # Bytes: room for the receipts held and nothing more.
    configure(work, max_receipts=100, max_bytes=use.bytes)
    state = work.state_digest(D)
    refused(commit(work, source("m2"), [put("b", b"x")]), "ResourceExhausted")
    assert work.state_digest(D) == state and document(work, "b") == (b"b1", 1)
    configure(work, max_receipts=100, max_bytes=3 * use.bytes)
    receipt(commit(work, source("m2"), [put("b", b"x")]))
    assert configure(work).receipts == 2


def test_a_failing_or_foreign_effect_commits_nothing(work: Embedded) -> None:
    configure(work)
    state, use = work.state_digest(D), configure(work)
    refused(commit(work, source("m1"), [put("a"), put("b", b"x", 7), enqueue("n")]), "RevisionConflict", 1)
    refused(commit(work, source("m1"), [put("a"), enqueue("n", queue="missing")]), "NotFound", 1)
    refused(commit(work, source("m1"), [put("a"), put("b", domain="orders")]), "Validation", 1)
    assert (work.state_digest(D), configure(work)) == (state, use)
    # Nothing was recorded for the source delivery: its effects apply now.
    assert receipt(commit(work, source("m1"), [put("a"), enqueue("n")])).already_processed is False


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"from_": source("m1", domain="Not A Domain")}, "source domain"),
        ({"from_": source("m1", queue="")}, "source queue"),
        ({"from_": source("has space")}, "message id"),
        ({"from_": source("m1", generation=-1)}, "delivery_generation"),
        ({"scope": ""}, "handler scope"),
        ({"execution_generation": -1}, "execution_generation"),
        ({"effects": [put(f"k{i}") for i in range(limits.MAX_BATCH_MUTATIONS + 1)]}, "mutations"),
    ],
)
def test_commit_inbox_validation(work: Embedded, fields: dict[str, Any], what: str) -> None:
    configure(work)
    state = work.state_digest(D)
    outcome = commit(work, **{"from_": source("m1"), "effects": [put("a")], **fields})
    refused(outcome, "Validation")
    assert what in outcome.detail
    assert work.state_digest(D) == state
