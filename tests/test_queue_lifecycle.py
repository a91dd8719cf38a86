"""Queue dispatch pause and close (docs/ARCHITECTURE.md §6, "Queue lifecycle"), on the embedded deployment.

What a user notices: a paused queue refuses receives with DispatchPaused (a waiting receive waits
for the resume) while enqueues, leases in hand and timers go on; a closed queue refuses every new
message with Conflict while what it holds is still delivered and settled; each change is shown by
InspectQueue and replays to the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keyload.sdk.results import PayloadReservation, QueueView

from .payloads import CANCEL_LARGE, PREPARE, Large, prepare_body
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
