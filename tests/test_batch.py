"""Batches through the real processor, file log and RocksDB (DESIGN.md §4, processors/batch.py):
ordered mutations applied all or nothing, the failing one named by `failed_index`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.errors import ConflictError, NotFoundError, RevisionConflictError, ValidationError
from keyload.log.codec import REGISTRY
from keyload.processors.apply import FINGERPRINT_BYTES
from keyload.sdk.client import Client
from keyload.sdk.results import (
    BatchResult,
    CancelMessage,
    DeleteDocument,
    Document,
    DocumentResult,
    EnqueueMessage,
    EnqueueResult,
    Event,
    MessageView,
    Outcome,
    PublishedEvent,
    PublishEvents,
    PublishResult,
    PutDocument,
    QueuePolicySpec,
    QueueView,
    ReceiveResult,
    TopicView,
)

from .support import (
    BATCH,
    CANCEL,
    CONFIGURE_QUEUE,
    CREATE_QUEUE,
    CREATE_TOPIC,
    DELETE_DOCUMENT,
    ENQUEUE,
    GET_DOCUMENT,
    INSPECT_MESSAGE,
    INSPECT_QUEUE,
    INSPECT_TOPIC,
    NACK,
    PUBLISH,
    PUT_DOCUMENT,
    RECEIVE,
    REDRIVE,
    Embedded,
    assert_replay_equals_live,
    batch_body,
    command,
    create_queue_body,
    create_topic_body,
    delete_document_body,
    enqueue_body,
    event,
    expect,
    message_fence,
    mutation,
    publish_body,
    put_document_body,
    receive_body,
    start_service,
    stop_service,
    submit_unhalted,
)

D = "acme"
PARK_PENDING = "keyload.command.ParkPending"
MAX_STORED = 3


def ok(embedded: Embedded, kind: str, body: dict[str, Any], domain: str = D) -> Any:
    return expect(submit_unhalted(embedded, domain, kind, body), None)


def put(key: str, value: bytes = b"v", expected: int | None = None, domain: str | None = None) -> dict[str, Any]:
    return mutation(PUT_DOCUMENT, put_document_body(key, value, expected), domain)


def delete(key: str, expected: int | None = None) -> dict[str, Any]:
    return mutation(DELETE_DOCUMENT, delete_document_body(key, expected))


def enqueue(message_id: str, body: bytes = b"job") -> dict[str, Any]:
    return mutation(ENQUEUE, enqueue_body("jobs", message_id, body))


def publish(*event_ids: str) -> dict[str, Any]:
    return mutation(PUBLISH, publish_body("news", *(event(e, e.encode()) for e in event_ids)))


def run_batch(embedded: Embedded, *mutations: dict[str, Any], command_id: str | None = None) -> Outcome:
    return submit_unhalted(embedded, D, BATCH, batch_body(*mutations), command_id)


def refused(outcome: Outcome, code: str, failed_index: int | None = None) -> None:
    expect(outcome, code)
    assert outcome.failed_index == failed_index, outcome
    if failed_index is not None:
        assert outcome.detail.startswith(f"mutation {failed_index}"), outcome.detail


def applied(outcome: Outcome) -> list[Any]:
    result = expect(outcome, None)
    assert isinstance(result, BatchResult) and outcome.failed_index is None
    return result.results


def documents(embedded: Embedded, *names: str) -> dict[str, tuple[bytes, int] | None]:
    """Each named document's (value, revision), None when absent."""
    found: dict[str, tuple[bytes, int] | None] = {}
    for name in names:
        outcome = submit_unhalted(embedded, D, GET_DOCUMENT, {"key": name})
        found[name] = (outcome.result.value, outcome.result.revision) if isinstance(outcome.result, Document) else None
    return found


def queue_view(embedded: Embedded) -> QueueView:
    view = ok(embedded, INSPECT_QUEUE, {"queue": "jobs"})
    assert isinstance(view, QueueView)
    return view


def topic_view(embedded: Embedded) -> TopicView:
    view = ok(embedded, INSPECT_TOPIC, {"topic": "news"})
    assert isinstance(view, TopicView)
    return view


def message(embedded: Embedded, message_id: str) -> MessageView:
    view = ok(embedded, INSPECT_MESSAGE, {"queue": "jobs", "message_id": message_id, "include_body": False})
    assert isinstance(view, MessageView)
    return view


def observed(embedded: Embedded) -> tuple[Any, ...]:
    """What a user can see of the shop: its documents, the queue and the topic, and the partition's state."""
    return (
        documents(embedded, "a", "b", "c"),
        queue_view(embedded).counters,
        topic_view(embedded),
        embedded.state_digest(D),
    )


@pytest.fixture
def shop(embedded: Embedded) -> Embedded:
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=MAX_STORED, max_attempts=1))
    ok(embedded, CREATE_TOPIC, create_topic_body("news"))
    ok(embedded, PUT_DOCUMENT, put_document_body("b", b"b1"))
    ok(embedded, PUT_DOCUMENT, put_document_body("c", b"c1"))
    return embedded


def five(expected_b: int) -> list[dict[str, Any]]:
    return [put("a", b"a1", 0), enqueue("m1"), put("b", b"b2", expected_b), publish("e1"), delete("c", 1)]


def test_a_refusal_in_the_middle_undoes_everything_and_the_corrected_retry_applies_in_order(shop: Embedded) -> None:
    before = observed(shop)
    outcome = run_batch(shop, *five(expected_b=7))
    refused(outcome, "RevisionConflict", 2)
    assert outcome.detail == "mutation 2: the document is at revision 1, not at revision 7"
    assert observed(shop) == before
    assert documents(shop, "a", "b", "c") == {"a": None, "b": (b"b1", 1), "c": (b"c1", 1)}
    assert (queue_view(shop).counters.stored_messages, topic_view(shop).tail) == (0, 0)

    results = applied(run_batch(shop, *five(expected_b=1)))
    assert [type(r) for r in results] == [DocumentResult, EnqueueResult, DocumentResult, PublishResult, DocumentResult]
    assert results[0] == DocumentResult(key="a", revision=1, deleted=False)
    assert isinstance(results[1], EnqueueResult)
    assert (results[1].message_id, results[1].state, results[1].stored_messages) == ("m1", "ready", 1)
    assert results[2] == DocumentResult(key="b", revision=2, deleted=False)
    assert results[3] == PublishResult(
        topic="news",
        events=[PublishedEvent(event_id="e1", position=1)],
        retained_events=1,
        retained_bytes=results[3].retained_bytes,
    )
    assert results[4] == DocumentResult(key="c", revision=1, deleted=True)
    assert documents(shop, "a", "b", "c") == {"a": (b"a1", 1), "b": (b"b2", 2), "c": None}
    assert message(shop, "m1").meta.state == "ready"
    assert topic_view(shop).tail == 1


def test_later_mutations_see_earlier_ones(shop: Embedded) -> None:
    results = applied(run_batch(shop, put("k", b"1", 0), put("k", b"2", 1), delete("k", 2), put("k", b"4", 0)))
    assert [(r.revision, r.deleted) for r in results] == [(1, False), (2, False), (2, True), (4, False)]
    assert documents(shop, "k") == {"k": (b"4", 4)}
    # An enqueue then a cancel of that message: the cancel sees the message the enqueue made.
    results = applied(run_batch(shop, enqueue("m1"), mutation(CANCEL, message_fence("jobs", "m1", 1, 1))))
    assert isinstance(results[1], MessageView) and results[1].meta.state == "cancelled"
    assert queue_view(shop).counters.stored_messages == 0
    # The same event id twice across mutations is refused by the second one, not by the first.
    before = shop.state_digest(D)
    refused(run_batch(shop, publish("e1"), publish("e1")), "DuplicateEventId", 1)
    assert shop.state_digest(D) == before


def test_a_mutation_naming_another_domain_rejects_the_batch_before_any_effect(shop: Embedded) -> None:
    before = observed(shop)
    outcome = run_batch(shop, put("a", b"x"), enqueue("m1"), put("b", b"x", domain="elsewhere"), delete("c"))
    refused(outcome, "Validation", 2)
    assert "names another domain" in outcome.detail
    assert observed(shop) == before
    # Naming its own domain is allowed.
    assert applied(run_batch(shop, put("a", b"x", domain=D)))[0] == DocumentResult(key="a", revision=1, deleted=False)


def test_empty_and_oversized_batches_are_refused(shop: Embedded) -> None:
    before = shop.state_digest(D)
    refused(run_batch(shop), "Validation", None)
    too_many = [put(f"k{i}") for i in range(limits.MAX_BATCH_MUTATIONS + 1)]
    refused(run_batch(shop, *too_many), "Validation", None)
    assert shop.state_digest(D) == before
    results = applied(run_batch(shop, *too_many[:-1]))
    assert len(results) == limits.MAX_BATCH_MUTATIONS
    assert documents(shop, f"k{limits.MAX_BATCH_MUTATIONS - 1}")[f"k{limits.MAX_BATCH_MUTATIONS - 1}"] == (b"v", 1)


def test_a_queue_quota_refusal_rolls_back_a_preceding_document_write(shop: Embedded) -> None:
    for i in range(MAX_STORED - 1):
        ok(shop, ENQUEUE, enqueue_body("jobs", f"old{i}"))
    before = observed(shop)
    outcome = run_batch(shop, put("a", b"a1"), delete("b"), enqueue("m1"), enqueue("m2"))
    refused(outcome, "ResourceExhausted", 3)
    assert observed(shop) == before
    assert queue_view(shop).counters.stored_messages == MAX_STORED - 1
    # One fits.
    results = applied(run_batch(shop, put("a", b"a1"), delete("b"), enqueue("m1")))
    assert isinstance(results[2], EnqueueResult) and results[2].stored_messages == MAX_STORED


def dead_letter(embedded: Embedded, message_id: str) -> MessageView:
    """Enqueue a message and fail its only attempt: it is dead-lettered (max_attempts=1)."""
    ok(embedded, ENQUEUE, enqueue_body("jobs", message_id))
    received = ok(embedded, RECEIVE, receive_body("jobs", max_messages=1))
    assert isinstance(received, ReceiveResult)
    [delivery] = received.deliveries
    ok(embedded, NACK, {"token": delivery.token, "delay_ms": None})
    view = message(embedded, message_id)
    assert view.meta.state == "dead_lettered"
    return view


def fenced(kind: str, view: MessageView) -> dict[str, Any]:
    fence = message_fence("jobs", view.message_id, view.meta.state_version, view.meta.delivery_generation)
    return mutation(kind, fence)


def test_cancel_redrive_and_publish_inside_a_batch(shop: Embedded) -> None:
    dead = dead_letter(shop, "d1")
    ok(shop, ENQUEUE, enqueue_body("jobs", "m1"))
    waiting = message(shop, "m1")
    # A stale fence on the cancel refuses the batch: the redrive before it does not happen.
    stale = message_fence("jobs", "m1", waiting.meta.state_version + 1, waiting.meta.delivery_generation)
    before = observed(shop)
    outcome = run_batch(shop, fenced(REDRIVE, dead), mutation(CANCEL, stale), publish("e1"))
    refused(outcome, "RevisionConflict", 1)
    assert observed(shop) == before
    assert message(shop, "d1").meta.state == "dead_lettered"

    results = applied(run_batch(shop, fenced(REDRIVE, dead), fenced(CANCEL, waiting), publish("e1", "e2")))
    redriven, cancelled, published = results
    assert isinstance(redriven, MessageView) and isinstance(cancelled, MessageView)
    assert (redriven.meta.state, redriven.meta.attempts, redriven.meta.delivery_generation) == (
        "ready",
        0,
        dead.meta.delivery_generation + 1,
    )
    assert cancelled.meta.state == "cancelled"
    assert isinstance(published, PublishResult) and [e.position for e in published.events] == [1, 2]
    counters = queue_view(shop).counters
    assert (counters.ready, counters.dead_lettered, counters.cancelled_total, counters.stored_messages) == (1, 0, 1, 1)
    # A terminal message cannot be cancelled again: Conflict, and the batch's document write goes too.
    again = message(shop, "m1")
    refused(run_batch(shop, put("a"), fenced(CANCEL, again)), "Conflict", 1)
    assert documents(shop, "a") == {"a": None}


def test_a_retried_batch_returns_its_first_outcome(shop: Embedded) -> None:
    first = run_batch(shop, put("a", b"1"), enqueue("m1"), command_id="batch-1")
    state = shop.state_digest(D)
    again = run_batch(shop, put("a", b"1"), enqueue("m1"), command_id="batch-1")
    assert (again.offset, again.result) == (first.offset, first.result)
    assert shop.state_digest(D) == state
    assert documents(shop, "a") == {"a": (b"1", 1)} and queue_view(shop).counters.stored_messages == 1
    refused(run_batch(shop, put("a", b"2"), command_id="batch-1"), "Conflict", None)
    # A rejected batch's outcome is stored too, failed index included.
    failed = run_batch(shop, put("z"), put("b", b"x", 9), command_id="batch-2")
    refused(failed, "RevisionConflict", 1)
    repeat = run_batch(shop, put("z"), put("b", b"x", 9), command_id="batch-2")
    refused(repeat, "RevisionConflict", 1)
    assert (repeat.offset, repeat.detail) == (failed.offset, failed.detail)


def test_an_enqueue_in_a_committed_batch_serves_a_waiting_receive(shop: Embedded) -> None:
    cursor = shop.outcomes.end_offset(0)
    body = dict(receive_body("jobs"), wait_ms=10_000)
    shop.append(D, command(D, RECEIVE, body, "waiting", reply_to=0))
    shop.run()

    def answered() -> list[Outcome]:
        return [
            Outcome.from_record(decoded)
            for record in shop.outcomes.read(0, cursor, 1_000)
            if (decoded := REGISTRY.decode("keyload.Outcome", record.value))["command_id"] == "waiting"
        ]

    assert answered() == []
    refused(run_batch(shop, enqueue("m1"), put("b", b"x", 5)), "RevisionConflict", 1)
    assert answered() == []  # the refused enqueue never happened
    applied(run_batch(shop, put("a"), enqueue("m1")))
    [outcome] = answered()
    assert isinstance(outcome.result, ReceiveResult)
    assert [d.message_id for d in outcome.result.deliveries] == ["m1"]


def test_replay_rebuilds_what_batches_did(shop: Embedded, tmp_path: Path) -> None:
    dead = dead_letter(shop, "d1")
    run_batch(shop, *five(expected_b=7))
    applied(run_batch(shop, *five(expected_b=1)))
    shop.now_ms += 1_000
    applied(run_batch(shop, fenced(REDRIVE, dead), put("a", b"a2", 1), publish("e2")))
    run_batch(shop, enqueue("m2"), enqueue("m3"), enqueue("m4"))  # over the quota
    assert_replay_equals_live(shop, D, tmp_path)


@pytest.mark.slow
def test_the_sdk_batch_raises_the_refusal_with_its_failed_index(tmp_path: Path) -> None:
    service = start_service(tmp_path / "data", "--partitions", "2")
    try:
        with Client(tmp_path / "data") as client:
            client.create_queue(D, "jobs", QueuePolicySpec(max_stored_messages=10))
            client.create_topic(D, "news")
            client.publish(D, "news", [Event("e1", "t", b"first")])
            with pytest.raises(RevisionConflictError) as revision:
                client.batch(D, [PutDocument("a", b"1", 0), PutDocument("a", b"2", 5)])
            assert revision.value.failed_index == 1
            with pytest.raises(ConflictError) as conflict:
                client.batch(D, [PutDocument("a", b"1"), PublishEvents("news", [Event("e1", "t", b"other")])])
            assert conflict.value.failed_index == 1
            with pytest.raises(ValidationError) as empty:
                client.batch(D, [])
            assert empty.value.failed_index is None
            with pytest.raises(NotFoundError):
                client.get_document(D, "a")
            result = client.batch(
                D,
                [
                    PutDocument("a", b"1", 0),
                    EnqueueMessage("jobs", "m1", b"job"),
                    PublishEvents("news", [Event("e2", "t", b"second")]),
                    CancelMessage("jobs", "m1", 1, 1),
                    DeleteDocument("a", 1),
                ],
                command_id="sdk-batch",
            )
            assert [type(r) for r in result.results] == [
                DocumentResult,
                EnqueueResult,
                PublishResult,
                MessageView,
                DocumentResult,
            ]
            assert result.results[4] == DocumentResult(key="a", revision=1, deleted=True)
            assert client.inspect_queue(D, "jobs").counters.cancelled_total == 1
            assert client.inspect_topic(D, "news").tail == 2
    finally:
        assert stop_service(service) == 0


def test_a_retry_with_its_maps_in_another_order_is_the_same_batch(shop: Embedded) -> None:
    """Maps are unordered: a retry from a client that builds headers in another order gets the
    stored outcome, not a Conflict (the fingerprint sorts maps inside the mutations' union too)."""
    forward = {"a": "1", "b": "2", "c": "3"}
    backward = dict(reversed(forward.items()))

    def with_headers(headers: dict[str, str]) -> list[dict[str, Any]]:
        return [
            mutation(ENQUEUE, enqueue_body("jobs", "m1", b"x", headers=headers)),
            mutation(PUBLISH, publish_body("news", event("e1", b"x", "t", **headers))),
        ]

    first = run_batch(shop, *with_headers(forward), command_id="ordered")
    applied(first)
    state = shop.state_digest(D)
    again = run_batch(shop, *with_headers(backward), command_id="ordered")
    assert (again.status, again.offset, again.result) == ("committed", first.offset, first.result)
    assert shop.state_digest(D) == state


def test_a_refused_batch_inside_a_group_commit_leaves_its_neighbours_alone(shop: Embedded) -> None:
    """Commands applied in one group commit see each other; the refused batch between them does
    not leave a trace in the records they share."""
    ids = ["before", "refused", "after"]
    bodies = [
        (PUT_DOCUMENT, put_document_body("b", b"b2", 1)),
        (BATCH, batch_body(put("b", b"lost", 2), enqueue("m1"), put("c", b"x", 9))),
        (BATCH, batch_body(put("b", b"b3", 2), enqueue("m2"))),
    ]
    for command_id, (kind, body) in zip(ids, bodies, strict=True):
        shop.append(D, command(D, kind, body, command_id))
    shop.run()  # one group: the three records are applied together
    statuses = [REGISTRY.decode("keyload.Outcome", (shop.stored_outcome(D, i) or b"")[FINGERPRINT_BYTES:]) for i in ids]
    assert [(o["status"], o["failed_index"]) for o in statuses] == [
        ("committed", None),
        ("rejected", 2),
        ("committed", None),
    ]
    assert documents(shop, "b", "c") == {"b": (b"b3", 3), "c": (b"c1", 1)}
    counters = queue_view(shop).counters
    assert (counters.stored_messages, counters.enqueued_total) == (1, 1)


def test_park_pending_inside_a_batch(shop: Embedded) -> None:
    policy = {"max_attempts": 1, "max_dead_letter_messages": 0}
    ok(shop, CREATE_QUEUE, create_queue_body("strict", **policy))
    ok(shop, ENQUEUE, enqueue_body("strict", "p1"))
    received = ok(shop, RECEIVE, receive_body("strict"))
    assert isinstance(received, ReceiveResult)
    ok(shop, NACK, {"token": received.deliveries[0].token, "delay_ms": None})
    view = ok(shop, INSPECT_MESSAGE, {"queue": "strict", "message_id": "p1", "include_body": False})
    assert isinstance(view, MessageView) and view.meta.state == "pending_dead_letter"
    park = mutation(PARK_PENDING, message_fence("strict", "p1", view.meta.state_version, view.meta.delivery_generation))
    before = observed(shop)
    refused(run_batch(shop, put("a"), park), "ResourceExhausted", 1)  # the sublimit is full
    assert observed(shop) == before
    ok(shop, CONFIGURE_QUEUE, {"queue": "strict", "policy": create_queue_body("strict", max_attempts=1)["policy"]})
    _, parked = applied(run_batch(shop, put("a"), park))
    assert isinstance(parked, MessageView) and parked.meta.state == "dead_lettered"
    assert documents(shop, "a") == {"a": (b"v", 1)}
