"""Queue dispatch pause and close (docs/ARCHITECTURE.md §6, "Queue lifecycle"), on the embedded deployment.

What a user notices: a paused queue refuses receives with DispatchPaused (a waiting receive waits
for the resume) while enqueues, leases in hand and timers go on; a closed queue refuses every new
message with Conflict while what it holds is still delivered and settled; each change is shown by
InspectQueue and replays to the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.cli import main
from keyload.log.codec import REGISTRY
from keyload.processors.reclamation import QUEUE_FAMILIES
from keyload.projections import keys
from keyload.sdk.results import PayloadReservation, QueueView

from .payloads import CANCEL_LARGE, COMMIT, INSPECT_RESERVATION, PREPARE, Large, prepare_body
from .support import (
    ACK,
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_QUEUE,
    RECEIVE,
    TICK,
    Embedded,
    assert_replay_equals_live,
    batch_body,
    command,
    create_queue_body,
    enqueue_body,
    expect,
    mutation,
    receive_body,
    submit_unhalted,
)
from .test_long_poll import published

D = "acme"
Q = "jobs"
PAUSE = "keyload.command.PauseQueue"
RESUME = "keyload.command.ResumeQueue"
CLOSE = "keyload.command.CloseQueue"


def ok(embedded: Embedded, kind: str, body: dict[str, Any]) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body), None)


def refused(embedded: Embedded, kind: str, body: dict[str, Any], code: str) -> str:
    outcome = submit_unhalted(embedded, D, kind, body)
    expect(outcome, code)
    assert outcome.detail is not None
    return outcome.detail


def view(embedded: Embedded) -> QueueView:
    found: QueueView = ok(embedded, INSPECT_QUEUE, {"queue": Q})
    return found


def test_a_paused_queue_refuses_receives_and_everything_else_goes_on(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q, lease_ms=1_000))
    for message_id in ("m1", "m2"):
        ok(embedded, ENQUEUE, enqueue_body(Q, message_id))
    [first] = ok(embedded, RECEIVE, receive_body(Q, max_messages=1)).deliveries
    [second] = ok(embedded, RECEIVE, receive_body(Q, max_messages=1)).deliveries
    paused: QueueView = ok(embedded, PAUSE, {"queue": Q})
    assert (paused.paused, paused.closed) == (True, False)
    assert "paused" in refused(embedded, RECEIVE, receive_body(Q), "DispatchPaused")
    assert ok(embedded, ENQUEUE, enqueue_body(Q, "m3")).state == "ready"  # producers are not stopped
    assert ok(embedded, ACK, {"token": first.token}).state == "acked"  # leases in hand settle
    embedded.now_ms += 1_000  # the second lease runs out while paused: its message waits for its retry
    ok(embedded, TICK, {})
    counters = view(embedded).counters
    assert (counters.ready, counters.scheduled, counters.leased, counters.acked_total) == (1, 1, 0, 1)
    embedded.now_ms += 60_000  # past any retry delay: ready again, still not dispatched
    ok(embedded, TICK, {})
    assert view(embedded).counters.ready == 2
    assert "paused" in refused(embedded, RECEIVE, receive_body(Q), "DispatchPaused")
    assert not ok(embedded, RESUME, {"queue": Q}).paused
    again = ok(embedded, RECEIVE, receive_body(Q, max_messages=5)).deliveries
    assert [(d.message_id, d.attempts) for d in again] == [("m3", 1), ("m2", 2)]  # in the order they became ready
    assert second.message_id == "m2"
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_waiting_receive_on_a_paused_queue_is_served_by_the_resume(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    ok(embedded, PAUSE, {"queue": Q})
    cursor = embedded.outcomes.end_offset(0)
    waiting = dict(receive_body(Q), wait_ms=20_000)
    embedded.append(D, command(D, RECEIVE, waiting, "wait-1", principal="worker", reply_to=0))
    embedded.run()
    ok(embedded, ENQUEUE, enqueue_body(Q, "m1", b"hello"))
    assert "wait-1" not in [o["command_id"] for o in published(embedded, cursor)]  # paused: it still waits
    embedded.now_ms += 500
    ok(embedded, RESUME, {"queue": Q})
    served = [o for o in published(embedded, cursor) if o["command_id"] == "wait-1"]
    [delivery] = served[0]["result"][1]["deliveries"]
    assert (delivery["message_id"], delivery["body"]) == ("m1", b"hello")
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_resume_serves_every_waiter_over_the_records_that_follow(embedded: Embedded, tmp_path: Path) -> None:
    """Waiters piled up while paused: the resume serves MAX_WAITERS_SERVED of them, and leaves a
    serve timer due at once, so the next record serves the rest."""
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    ok(embedded, PAUSE, {"queue": Q})
    count = limits.MAX_WAITERS_SERVED + 36
    cursor = embedded.outcomes.end_offset(0)
    waiting = dict(receive_body(Q, max_messages=1), wait_ms=20_000)
    for i in range(count):
        embedded.append(D, command(D, RECEIVE, waiting, f"wait-{i}", reply_to=0))
    embedded.run()
    batch = [mutation(ENQUEUE, enqueue_body(Q, f"m{i}")) for i in range(count)]
    for first in range(0, count, 100):
        ok(embedded, "keyload.command.Batch", batch_body(*batch[first : first + 100]))

    def served() -> int:
        return sum(1 for o in published(embedded, cursor) if o["command_id"].startswith("wait-"))

    assert served() == 0
    ok(embedded, RESUME, {"queue": Q})
    assert served() == limits.MAX_WAITERS_SERVED
    ok(embedded, TICK, {})
    assert served() == count
    assert view(embedded).counters.leased == count
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_waiting_receive_on_a_paused_queue_ends_empty_at_its_deadline(embedded: Embedded) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    ok(embedded, ENQUEUE, enqueue_body(Q, "m1"))
    ok(embedded, PAUSE, {"queue": Q})
    cursor = embedded.outcomes.end_offset(0)
    waiting = dict(receive_body(Q), wait_ms=1_000)
    embedded.append(D, command(D, RECEIVE, waiting, "wait-2", reply_to=0))
    embedded.run()
    embedded.now_ms += 1_000
    ok(embedded, TICK, {})
    [answered] = [o for o in published(embedded, cursor) if o["command_id"] == "wait-2"]
    assert (answered["status"], answered["result"][1]["deliveries"]) == ("committed", [])
    assert view(embedded).counters.ready == 1


def test_pause_resume_and_close_again_change_nothing(embedded: Embedded) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    for kind in (PAUSE, CLOSE, RESUME):
        ok(embedded, kind, {"queue": Q})
        state = embedded.state_digest(D)
        ok(embedded, kind, {"queue": Q})
        assert embedded.state_digest(D) == state, kind
    assert (view(embedded).paused, view(embedded).closed) == (False, True)
    assert refused(embedded, PAUSE, {"queue": "missing"}, "NotFound")


def test_a_closed_queue_takes_no_new_message_and_delivers_what_it_holds(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    ok(embedded, ENQUEUE, enqueue_body(Q, "m1", b"kept"))
    closed: QueueView = ok(embedded, CLOSE, {"queue": Q})
    assert (closed.paused, closed.closed, closed.counters.stored_messages) == (False, True, 1)
    before = embedded.state_digest(D)
    detail = refused(embedded, ENQUEUE, enqueue_body(Q, "m2"), "Conflict")
    assert detail == f"queue {Q} is closed: it takes no new messages"
    # A batch holding an enqueue into it fails whole: the document it also writes is not written.
    put = mutation("keyload.command.PutDocument", {"key": "d", "value": b"v", "expected_revision": None})
    batch = batch_body(put, mutation(ENQUEUE, enqueue_body(Q, "m3")))
    expect(submit_unhalted(embedded, D, "keyload.command.Batch", batch), "Conflict")
    assert refused(embedded, PREPARE, prepare_body("m4", b"large", queue=Q), "Conflict") == detail
    assert embedded.state_digest(D) == before
    [delivery] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    assert (delivery.message_id, delivery.body) == ("m1", b"kept")
    assert ok(embedded, ACK, {"token": delivery.token}).state == "acked"
    counters = view(embedded).counters
    assert (counters.stored_messages, counters.enqueued_total, counters.acked_total) == (0, 1, 1)
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_large_message_reserved_before_the_close_is_not_committed(large: Large, tmp_path: Path) -> None:
    data = b"large body" * 100
    receipt: PayloadReservation = large.prepare("big", data)
    proof = large.gateway.attest(large.upload(receipt, data, tmp_path))
    expect(submit_unhalted(large.embedded, "shop", CLOSE, {"queue": "media"}), None)
    large.commit(receipt, proof, "Conflict")
    cancel = {"reservation_id": receipt.reservation_id}
    cancelled = expect(submit_unhalted(large.embedded, "shop", CANCEL_LARGE, cancel), None)
    assert cancelled.state == "cancelled"  # the reservation is released as usual


# -- delete ---------------------------------------------------------------------------------------------------

DELETE = "keyload.command.DeleteQueue"


def incarnation_rows(embedded: Embedded, incarnation: int) -> int:
    """The rows a queue incarnation keeps under its id, in every family reclamation sweeps."""
    store = embedded.store(D)
    return sum(
        1
        for family in QUEUE_FAMILIES
        for _ in store.scan(family + keys.u64(incarnation), keys.prefix_end(family + keys.u64(incarnation)))
    )


def state_of(embedded: Embedded, incarnation: int, message_id: str) -> str:
    raw = embedded.store(D).get(keys.message(incarnation, message_id))
    assert raw is not None
    return str(REGISTRY.decode("keyload.MessageMeta", raw)["state"])


def test_a_queue_that_holds_messages_or_reservations_is_not_deleted(embedded: Embedded) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q, max_attempts=1))
    ok(embedded, ENQUEUE, enqueue_body(Q, "m1"))
    held = "queue jobs holds 1 message: settle, cancel or wait for them first, or delete it by force"
    assert refused(embedded, DELETE, {"queue": Q}, "Conflict") == held
    [delivery] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    assert refused(embedded, DELETE, {"queue": Q}, "Conflict") == held  # in flight
    nack = {"token": delivery.token, "delay_ms": None}
    assert ok(embedded, "keyload.command.Nack", nack).state == "dead_lettered"
    assert refused(embedded, DELETE, {"queue": Q}, "Conflict") == held  # a dead letter is held too
    assert refused(embedded, DELETE, {"queue": "missing"}, "NotFound")
    stale = {"queue": Q, "force": True, "expected_incarnation": view(embedded).incarnation + 1}
    assert refused(embedded, DELETE, stale, "RevisionConflict") == "queue jobs is incarnation 1, expected 2"


def test_only_an_open_reservation_holds_a_queue_back(large: Large, tmp_path: Path) -> None:
    """A reservation that ended (cancelled, expired) keeps its quota until the GC confirms its
    object's deletion, but does not keep its queue from being deleted; an open one does."""
    open_one = large.prepare("open", b"o" * 100)
    detail = refused_in(large, DELETE, {"queue": "media"}, "Conflict")
    assert detail == (
        "queue media holds open large-payload reservations: commit, cancel or let them expire first, "
        "or delete it by force"
    )
    expect(submit_unhalted(large.embedded, "shop", CANCEL_LARGE, {"reservation_id": open_one.reservation_id}), None)
    expired = large.prepare("expired", b"e" * 100)
    large.embedded.now_ms = expired.upload_deadline_ms
    expect(submit_unhalted(large.embedded, "shop", TICK, {}), None)
    expect(submit_unhalted(large.embedded, "shop", DELETE, {"queue": "media"}), None)
    assert_replay_equals_live(large.embedded, "shop", tmp_path)


def test_a_reservation_of_a_queue_deleted_by_force_is_not_found_then_cancelled(large: Large, tmp_path: Path) -> None:
    """Commands on a reservation whose queue was deleted before reclamation reached it answer
    NotFound, without halting; reclamation then cancels it (or marks it expired past its deadline)."""
    embedded = large.embedded
    soon = embedded.now_ms + 1_000  # before the reservation's deadline: their timers are walked first
    for first in range(0, 300, 100):
        batch = [
            mutation(ENQUEUE, enqueue_body("media", f"m{i}", not_before_ms=soon)) for i in range(first, first + 100)
        ]
        expect(submit_unhalted(embedded, "shop", "keyload.command.Batch", batch_body(*batch)), None)
    data = b"p" * 1_000
    receipt: PayloadReservation = large.prepare("pending", data)
    proof = large.gateway.attest(large.upload(receipt, data, tmp_path))
    expect(submit_unhalted(embedded, "shop", DELETE, {"queue": "media", "force": True}), None)
    # Before this record, reclamation walks 256 of the 301 timers: not yet the reservation's.
    commit = {"reservation_id": receipt.reservation_id, "proof": proof}
    assert (
        refused_in(large, COMMIT, commit, "NotFound")
        == f"the queue of reservation {receipt.reservation_id} was deleted"
    )
    # Before this one it reaches the reservation's deadline timer, and cancels it.
    assert refused_in(large, COMMIT, commit, "Conflict") == "the reservation was cancelled"
    inspect = {"reservation_id": receipt.reservation_id}
    assert expect(submit_unhalted(embedded, "shop", INSPECT_RESERVATION, inspect), None).state == "cancelled"
    assert expect(submit_unhalted(embedded, "shop", CANCEL_LARGE, inspect), None).state == "cancelled"
    assert_replay_equals_live(embedded, "shop", tmp_path)


def refused_in(large: Large, kind: str, body: dict[str, Any], code: str) -> str:
    outcome = submit_unhalted(large.embedded, "shop", kind, body)
    expect(outcome, code)
    assert outcome.detail is not None
    return outcome.detail


def test_a_deleted_queue_frees_its_name_and_answers_its_waiters(embedded: Embedded, tmp_path: Path) -> None:
    old = ok(embedded, CREATE_QUEUE, create_queue_body(Q)).incarnation
    ok(embedded, ENQUEUE, enqueue_body(Q, "m1", b"first"))
    [delivery] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    ok(embedded, ACK, {"token": delivery.token})
    cursor = embedded.outcomes.end_offset(0)
    embedded.append(D, command(D, RECEIVE, dict(receive_body(Q), wait_ms=20_000), "wait-1", reply_to=0))
    embedded.run()
    deleted: QueueView = ok(embedded, DELETE, {"queue": Q})
    assert (deleted.incarnation, deleted.counters.acked_total) == (old, 1)
    [answered] = [o for o in published(embedded, cursor) if o["command_id"] == "wait-1"]
    assert (answered["status"], answered["result"][1]["deliveries"]) == ("committed", [])
    assert refused(embedded, INSPECT_QUEUE, {"queue": Q}, "NotFound") == "queue does not exist"
    assert refused(embedded, ENQUEUE, enqueue_body(Q, "m2"), "NotFound")
    assert refused(embedded, ACK, {"token": delivery.token}, "TokenInvalidated")
    # The name is free: a new incarnation, with a message id space of its own.
    assert ok(embedded, CREATE_QUEUE, create_queue_body(Q)).incarnation > old
    assert ok(embedded, ENQUEUE, enqueue_body(Q, "m1", b"second")).state == "ready"
    [again] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    assert (again.message_id, again.body, again.attempts) == ("m1", b"second", 1)
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_deleted_queues_rows_are_reclaimed_in_bounded_steps(embedded: Embedded, tmp_path: Path) -> None:
    """Every record after the delete reclaims at most the tick examination budget of rows, before
    itself; once all are gone, so are the reclamation row, the resource row and the due entry."""
    incarnation = ok(embedded, CREATE_QUEUE, create_queue_body(Q, receive_max_messages=100)).incarnation
    count = 700
    for i in range(count):
        ordering_key = f"k{i % 3}" if i % 2 else None
        ok(embedded, ENQUEUE, enqueue_body(Q, f"m{i}", b"x", ordering_key=ordering_key))
    while deliveries := ok(embedded, RECEIVE, receive_body(Q, max_messages=100)).deliveries:
        tokens = [d.token for d in deliveries]
        ok(embedded, "keyload.command.AckBatch", {"tokens": tokens})
    rows = incarnation_rows(embedded, incarnation)
    assert rows >= count  # every finished message keeps its metadata
    ok(embedded, DELETE, {"queue": Q})
    assert incarnation_rows(embedded, incarnation) == rows  # the delete itself reclaims nothing
    budget = limits.TICK_EXAMINATION_BUDGET
    for step in range(1, rows // budget + 2):
        embedded.now_ms += 1
        ok(embedded, TICK, {})
        assert incarnation_rows(embedded, incarnation) == max(rows - step * budget, 0)
    store = embedded.store(D)
    assert store.get(keys.retired(incarnation)) is None and store.get(keys.resource_key(incarnation)) is None
    assert list(store.scan(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))) == []
    assert store.get(keys.NEXT_DUE) is None
    assert_replay_equals_live(embedded, D, tmp_path)


def test_keyload_status_names_the_deleted_queues_still_being_reclaimed(
    embedded: Embedded, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    for first in range(0, 600, 100):
        ok(
            embedded,
            "keyload.command.Batch",
            batch_body(*(mutation(ENQUEUE, enqueue_body(Q, f"m{i}")) for i in range(first, first + 100))),
        )
    ok(embedded, DELETE, {"queue": Q, "force": True})

    def status_line() -> str:
        assert main(["status", "--data", str(embedded.data.root), "--output", "text"]) == 0
        return capsys.readouterr().out.splitlines()[1 + embedded.partition(D)]

    assert status_line().endswith(", poison 0, reclaiming 1 deleted queue")
    for _ in range(4):
        ok(embedded, TICK, {})
    assert status_line().endswith(", poison 0")


def test_reclamation_waits_behind_timers_already_due(embedded: Embedded) -> None:
    """A reclamation step queues the rest at the log time of its record, so a lease due before
    that fires in the next record rather than after the whole reclamation."""
    incarnation = ok(embedded, CREATE_QUEUE, create_queue_body(Q, receive_max_messages=100)).incarnation
    for i in range(600):
        ok(embedded, ENQUEUE, enqueue_body(Q, f"m{i}"))
    while deliveries := ok(embedded, RECEIVE, receive_body(Q, max_messages=100)).deliveries:
        ok(embedded, "keyload.command.AckBatch", {"tokens": [d.token for d in deliveries]})
    other = ok(embedded, CREATE_QUEUE, create_queue_body("other", lease_ms=1_000)).incarnation
    ok(embedded, ENQUEUE, enqueue_body("other", "o1"))
    ok(embedded, RECEIVE, receive_body("other"))  # its lease is due in 1 s
    ok(embedded, DELETE, {"queue": Q})
    embedded.now_ms += 1_001
    ok(embedded, TICK, {})  # a reclamation step (due first, at the delete's time), queued again at this time
    assert state_of(embedded, other, "o1") == "leased"
    embedded.now_ms += 1
    ok(embedded, TICK, {})  # the lease, due before the rest of the reclamation, fires first
    assert state_of(embedded, other, "o1") == "scheduled"  # its retry
    assert incarnation_rows(embedded, incarnation) > 0  # reclamation is not done yet


def test_a_forced_delete_drops_messages_in_every_state(embedded: Embedded, tmp_path: Path) -> None:
    policy = {"max_attempts": 1, "lease_ms": 60_000, "ordering": "strict_per_key", "receive_max_messages": 10}
    incarnation = ok(embedded, CREATE_QUEUE, create_queue_body(Q, **policy)).incarnation
    ok(embedded, ENQUEUE, enqueue_body(Q, "dead"))
    [dead] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    ok(embedded, "keyload.command.Nack", {"token": dead.token, "delay_ms": None})  # dead-lettered
    ok(embedded, ENQUEUE, enqueue_body(Q, "k1", ordering_key="k"))
    ok(embedded, ENQUEUE, enqueue_body(Q, "k2", ordering_key="k"))  # waits behind k1
    ok(
        embedded,
        ENQUEUE,
        enqueue_body(Q, "later", not_before_ms=embedded.now_ms + 60_000, expires_at_ms=embedded.now_ms + 90_000),
    )
    [leased] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    assert leased.message_id == "k1"
    ok(embedded, ENQUEUE, enqueue_body(Q, "ready"))
    counters = view(embedded).counters
    assert (counters.dead_lettered, counters.leased, counters.scheduled, counters.ready) == (1, 1, 1, 2)
    assert refused(embedded, DELETE, {"queue": Q}, "Conflict")
    deleted: QueueView = ok(embedded, DELETE, {"queue": Q, "force": True})
    assert deleted.counters.stored_messages == 5  # its last view
    assert refused(embedded, ACK, {"token": leased.token}, "TokenInvalidated")
    ok(embedded, CREATE_QUEUE, create_queue_body(Q))
    assert view(embedded).counters.stored_messages == 0  # a new incarnation: nothing carried over
    ok(embedded, TICK, {})
    assert incarnation_rows(embedded, incarnation) == 0
    embedded.now_ms += 120_000  # the dropped messages' timers are gone with them: nothing fires
    ok(embedded, TICK, {})
    assert view(embedded).counters.stored_messages == 0
    assert_replay_equals_live(embedded, D, tmp_path)


PURGE = "keyload.command.PurgeQueue"


def test_a_purge_drops_every_message_and_keeps_the_queue_as_configured(embedded: Embedded, tmp_path: Path) -> None:
    """SQS's PurgeQueue: messages in every state go, in one command; the queue keeps its name,
    policy, policy version, flags and creation time as a new incarnation, so tokens in hand are
    invalid, a waiting receive is answered empty, and the old rows are reclaimed as a deletion's."""
    policy = {"max_attempts": 1, "lease_ms": 60_000, "receive_max_messages": 10}
    created: QueueView = ok(embedded, CREATE_QUEUE, create_queue_body(Q, **policy))
    ok(embedded, ENQUEUE, enqueue_body(Q, "dead"))
    [dead] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    ok(embedded, "keyload.command.Nack", {"token": dead.token, "delay_ms": None})  # dead-lettered
    ok(embedded, ENQUEUE, enqueue_body(Q, "later", not_before_ms=embedded.now_ms + 60_000))
    ok(embedded, ENQUEUE, enqueue_body(Q, "m1"))
    [leased] = ok(embedded, RECEIVE, receive_body(Q)).deliveries
    ok(embedded, ENQUEUE, enqueue_body(Q, "ready"))
    ok(embedded, PAUSE, {"queue": Q})
    before = view(embedded)
    assert before.counters.stored_messages == 4 and before.paused
    assert refused(embedded, PURGE, {"queue": Q, "expected_incarnation": 99}, "RevisionConflict")

    purged: QueueView = ok(embedded, PURGE, {"queue": Q, "expected_incarnation": created.incarnation})
    assert purged.incarnation > created.incarnation and purged == view(embedded)
    assert purged.counters.stored_messages == 0 and purged.counters.enqueued_total == 0
    kept = ("domain", "queue", "created_at_ms", "policy_version", "policy", "paused", "closed")
    assert all(getattr(purged, field) == getattr(before, field) for field in kept)
    assert refused(embedded, ACK, {"token": leased.token}, "TokenInvalidated")
    ok(embedded, RESUME, {"queue": Q})
    cursor = embedded.outcomes.end_offset(0)
    embedded.append(D, command(D, RECEIVE, dict(receive_body(Q), wait_ms=20_000), "wait-1", reply_to=0))
    embedded.run()
    ok(embedded, PURGE, {"queue": Q, "expected_incarnation": None})
    [answered] = [o for o in published(embedded, cursor) if o["command_id"] == "wait-1"]
    assert (answered["status"], answered["result"][1]["deliveries"]) == ("committed", [])
    # The new incarnation has a message id space of its own, and time passing fires nothing old.
    assert ok(embedded, ENQUEUE, enqueue_body(Q, "m1", b"again")).state == "ready"
    ok(embedded, TICK, {})
    assert incarnation_rows(embedded, created.incarnation) == 0
    embedded.now_ms += 120_000
    ok(embedded, TICK, {})
    assert view(embedded).counters.stored_messages == 1
    assert_replay_equals_live(embedded, D, tmp_path)
