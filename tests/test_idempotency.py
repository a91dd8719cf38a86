"""Command-id idempotency: a repeat returns the stored outcome; a changed command conflicts."""

from __future__ import annotations

from pathlib import Path

from keyload.credentials import Credential

from .support import CREATE_QUEUE, ENQUEUE, INSPECT_QUEUE, Embedded, create_queue_body, enqueue_body

D = "acme"


def stored_messages(embedded: Embedded, credential: Credential | None = None) -> int:
    result = embedded.submit(D, INSPECT_QUEUE, {"queue": "jobs"}, credential=credential).result
    return result.counters.stored_messages  # type: ignore[union-attr]


def state_without_position(embedded: Embedded) -> dict[bytes, bytes]:
    """Every key/value of the projection except the partition metadata family."""
    return dict(embedded.store(D).scan(b"\x01", b"\xff"))


def test_same_id_same_body_returns_the_original_outcome_without_new_effect(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    first = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"hello"), command_id="c-1")
    before = state_without_position(embedded)
    embedded.now_ms += 5_000
    again = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"hello"), command_id="c-1")
    assert again == first  # same offset, same evaluation time, same result
    # Only the partition position moved: every other key and value is untouched.
    assert state_without_position(embedded) == before
    assert stored_messages(embedded) == 1


def test_same_id_different_body_is_a_conflict_and_the_original_stays(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    first = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"hello"), command_id="c-1")
    stored = embedded.stored_outcome(D, "c-1")
    conflict = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m2", b"other"), command_id="c-1")
    assert conflict.status == "rejected" and conflict.error_code == "Conflict"
    assert embedded.stored_outcome(D, "c-1") == stored
    assert stored_messages(embedded) == 1
    assert embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"hello"), command_id="c-1") == first


def test_rejections_are_stored_and_replayed_too(embedded: Embedded) -> None:
    first = embedded.submit(D, ENQUEUE, enqueue_body("missing", "m1"), command_id="c-9")
    assert first.error_code == "NotFound"
    embedded.submit(D, CREATE_QUEUE, create_queue_body("missing"))
    # The queue exists now, but the command id's outcome is decided forever.
    assert embedded.submit(D, ENQUEUE, enqueue_body("missing", "m1"), command_id="c-9") == first


def test_idempotency_holds_across_a_restart(tmp_path: Path) -> None:
    embedded = Embedded(tmp_path / "data")
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    first = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"hello"), command_id="c-1")
    embedded.close()

    restarted = Embedded(tmp_path / "data")
    try:
        assert restarted.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"hello"), command_id="c-1") == first
        conflict = restarted.submit(D, ENQUEUE, enqueue_body("jobs", "m1", b"changed"), command_id="c-1")
        assert conflict.error_code == "Conflict"
        assert stored_messages(restarted) == 1
    finally:
        restarted.close()


def test_client_resubmission_after_a_lost_response(tmp_path: Path) -> None:
    """The SDK path: a response lost in transit is recovered by resubmitting the same id."""
    from keyload.sdk.client import Client

    embedded = Embedded(tmp_path / "data")
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    # As under `keyload run`: the client accepts only outcomes sealed for its principal, the administrator.
    admin = embedded.enable_access_control()
    client = Client(tmp_path / "data", reply_partition=3)
    try:
        # First submission: the processor applies it, but nobody is reading (response lost).
        from .support import signed_command

        embedded.append(D, signed_command(admin, D, ENQUEUE, enqueue_body("jobs", "m1", b"a"), "lost-1", reply_to=3))
        embedded.run()
        # The client resubmits with the same id; the processor runs again and republishes.
        import threading

        runner = threading.Timer(0.2, embedded.run)
        runner.start()
        result = client.enqueue(D, "jobs", b"a", message_id="m1", command_id="lost-1")
        runner.join()
        assert result.message_id == "m1" and result.enqueue_sequence == 1
        assert stored_messages(embedded, admin) == 1
    finally:
        client.close()
        embedded.close()


def test_queue_names_and_command_ids_are_scoped_by_domain(embedded: Embedded) -> None:
    """Domains sharing a partition never see each other's queues or command ids."""
    other = next(d for d in (f"tenant-{i}" for i in range(100)) if embedded.partition(d) == embedded.partition(D))
    for domain in (D, other):
        assert embedded.submit(domain, CREATE_QUEUE, create_queue_body("jobs"), command_id="same-id").status == (
            "committed"
        )
    embedded.submit(other, ENQUEUE, enqueue_body("jobs", "m1"))
    assert stored_messages(embedded) == 0
    other_view = embedded.submit(other, INSPECT_QUEUE, {"queue": "jobs"}).result
    assert other_view.counters.stored_messages == 1  # type: ignore[union-attr]
    assert other_view.domain == other  # type: ignore[union-attr]
