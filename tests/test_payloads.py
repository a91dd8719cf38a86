"""Large payloads through the embedded processor: reserve, upload, attest, commit, refusals by
log time and log order, and what never appears in the log."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.processors.payloads import proofs
from keyload.sdk.payloads import PayloadConflict, PayloadError
from keyload.storage.object_store import ObjectConflict

from .payloads import CANCEL_LARGE, COMMIT, INSPECT_RESERVATION, WINDOW_MS, D, Large, Q, counters
from .support import (
    ACK,
    ENQUEUE,
    INSPECT_MESSAGE,
    RECEIVE,
    TICK,
    assert_replay_equals_live,
    enqueue_body,
    expect,
    submit_unhalted,
)


def test_the_whole_protocol_delivers_exactly_the_uploaded_bytes(large: Large, tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: larger than any inline body
    receipt = large.prepare("big-1", data, headers={"kind": "video"})
    assert (receipt.state, receipt.length, receipt.object_key) == ("reserved", len(data), receipt.object_key)
    assert (
        receipt.object_key.startswith("payloads/p-") and receipt.upload_deadline_ms == large.embedded.now_ms + WINDOW_MS
    )
    # The reservation holds quota before any byte moves.
    held = counters(large)
    assert (held.reserved_messages, held.reserved_bytes, held.payload_object_bytes) == (1, len(data), len(data))
    proof = large.gateway.attest(large.upload(receipt, data, tmp_path))
    committed = large.commit(receipt, proof)
    assert (committed.state, committed.object_version) == ("committed", proof["object_version"])
    after = counters(large)
    assert (after.reserved_messages, after.reserved_bytes, after.stored_messages, after.stored_bytes) == (
        0,
        0,
        1,
        len(data),
    )
    [delivery] = large.receive()
    assert delivery.body == b"" and delivery.headers == {"kind": "video"}
    assert delivery.payload is not None and delivery.payload.length == len(data)
    assert large.read(delivery, tmp_path) == data
    view = expect(
        submit_unhalted(large.embedded, D, INSPECT_MESSAGE, {"queue": Q, "message_id": "big-1", "include_body": False}),
        None,
    )
    assert view.meta.payload.object_version == proof["object_version"] and view.meta.payload.read_handle is None
    # An equivalent proof again (a retried commit under a new command id) is idempotent.
    again = large.commit(receipt, large.gateway.attest(large.handle(receipt)))
    assert again.state == "committed" and counters(large).stored_messages == 1
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def test_refused_proofs_have_clear_codes_and_no_effect(large: Large, tmp_path: Path) -> None:
    data = b"payload bytes" * 1000
    receipt = large.prepare("big-1", data)
    proof = large.gateway.attest(large.upload(receipt, data, tmp_path))
    before = large.embedded.state_digest(D)
    material = large.embedded.data.keyring()

    def signed(**changes: Any) -> dict[str, Any]:
        """A proof with these fields, validly signed by the reservation's trust key."""
        changed = proof | changes
        return changed | {"signature": proofs.sign(material[changed["key_id"]], changed)}

    forged = proof | {"signature": bytes(64)}
    tampered = proof | {"length": len(data) + 1}  # the signature covers the length
    wrong_key = signed(key_id="k-other")
    unknown_key = proof | {"key_id": "k-missing"}
    wrong_length = signed(length=len(data) + 1)
    wrong_digest = signed(sha256=hashlib.sha256(b"other").digest())
    other_object = signed(object_key="payloads/p-0000/00000000000000000999")
    for bad, code in [
        (forged, "TokenInvalidated"),
        (tampered, "TokenInvalidated"),
        (wrong_key, "TokenInvalidated"),
        (unknown_key, "TokenInvalidated"),
        (wrong_length, "Conflict"),
        (wrong_digest, "Conflict"),
        (other_object, "Conflict"),
    ]:
        large.commit(receipt, bad, code)
        assert large.embedded.state_digest(D) == before
    # The genuine proof still commits; a proof naming another object version then conflicts.
    large.commit(receipt, proof)
    large.commit(receipt, signed(object_version="another-version"), "Conflict")


def test_a_commit_after_the_deadline_is_refused_even_if_no_scanner_ran(
    large: Large, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"late" * 5000
    receipt = large.prepare("big-1", data)
    proof = large.gateway.attest(large.upload(receipt, data, tmp_path))
    monkeypatch.setattr(limits, "TICK_EXAMINATION_BUDGET", 0)  # no timer fires: the scanner never runs
    large.embedded.now_ms += WINDOW_MS
    before = large.embedded.state_digest(D)
    large.commit(receipt, proof, "LeaseExpired")
    assert large.embedded.state_digest(D) == before
    inspected = expect(
        submit_unhalted(large.embedded, D, INSPECT_RESERVATION, {"reservation_id": receipt.reservation_id}), None
    )
    assert inspected.state == "expired"  # decided by log time, though the stored record still says reserved
    monkeypatch.undo()
    expect(submit_unhalted(large.embedded, D, TICK, {}), None)
    large.commit(receipt, proof, "LeaseExpired")
    held = counters(large)
    # Abandoned: quota stays held until retention confirms the object is gone.
    assert (held.stored_messages, held.reserved_messages, held.payload_object_bytes) == (0, 1, len(data))
    # (No replay comparison here: the live run had a patched tick budget, a replay would not.)


def test_log_order_decides_cancel_against_commit(large: Large, tmp_path: Path) -> None:
    data = b"race" * 1000
    first = large.prepare("cancelled-first", data)
    proof = large.gateway.attest(large.upload(first, data, tmp_path))
    expect(submit_unhalted(large.embedded, D, CANCEL_LARGE, {"reservation_id": first.reservation_id}), None)
    large.commit(first, proof, "Conflict")
    second = large.prepare("committed-first", data)
    large.commit(second, large.gateway.attest(large.upload(second, data, tmp_path)))
    outcome = submit_unhalted(large.embedded, D, CANCEL_LARGE, {"reservation_id": second.reservation_id})
    expect(outcome, "Conflict")
    assert [d.message_id for d in large.receive()] == ["committed-first"]


def test_uploads_are_immutable_and_the_identity_is_reserved(large: Large, tmp_path: Path) -> None:
    data = b"exact bytes" * 1000
    receipt = large.prepare("big-1", data)
    handle = large.handle(receipt)
    source = tmp_path / "same"
    source.write_bytes(data)
    first = large.gateway.upload(handle, source)
    assert large.gateway.upload(handle, source) == first  # the same bytes again: idempotent
    other = tmp_path / "other"
    other.write_bytes(b"Exact bytes" * 1000)  # same length, other bytes
    with pytest.raises(PayloadConflict):
        large.gateway.upload(handle, other)
    with pytest.raises(ObjectConflict):  # and straight at the store: a conditional create
        large.gateway.objects.put_if_absent(receipt.object_key, other)
    assert large.gateway.objects.head(receipt.object_key) == first
    # Handles are capabilities: a changed one is refused, and so is an expired one.
    with pytest.raises(PayloadError, match="signature"):
        large.gateway.upload(handle[:-4] + ("AAAA" if not handle.endswith("AAAA") else "BBBB"), source)
    # The message id is taken from the reservation on, for enqueues and reservations alike.
    expect(submit_unhalted(large.embedded, D, ENQUEUE, enqueue_body(Q, "big-1")), "Conflict")
    large.prepare("big-1", data, "Conflict")
    large.embedded.now_ms += WINDOW_MS
    with pytest.raises(PayloadError, match="expired"):
        large.gateway.upload(handle, source)


def test_the_upload_handle_appears_in_no_record_outcome_checkpoint_or_result(large: Large, tmp_path: Path) -> None:
    data = b"secret-free" * 3000
    receipt = large.prepare("big-1", data)
    handle = large.upload(receipt, data, tmp_path)
    large.commit(receipt, large.gateway.attest(handle))
    [delivery] = large.receive()
    expect(submit_unhalted(large.embedded, D, ACK, {"token": delivery.token}), None)
    expect(submit_unhalted(large.embedded, D, INSPECT_RESERVATION, {"reservation_id": receipt.reservation_id}), None)
    page = expect(
        submit_unhalted(large.embedded, D, "keyload.command.ListRetention", {"after_task": None, "limit": None}), None
    )
    assert len(page.tasks) == 1
    expect(submit_unhalted(large.embedded, D, "keyload.command.Checkpoint", {}), None)
    body, mac = handle[4:].split(".")
    needles = [handle.encode(), body.encode(), mac.encode()]
    places = [tmp_path / "data" / "log", tmp_path / "data" / "projections", tmp_path / "data" / "objects"]
    scanned = 0
    for place in places:
        for path in place.rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                scanned += 1
                assert not any(needle in content for needle in needles), path
    assert scanned > 10
    # Checkpoint files are among them: the checkpoint was published under objects/.
    assert any((tmp_path / "data" / "objects" / "checkpoints").rglob("*"))


def test_bad_ids_and_malformed_proofs_are_refused_and_never_halt_the_partition(large: Large, tmp_path: Path) -> None:
    data = b"x" * 1000
    receipt = large.prepare("big-1", data)
    proof = large.gateway.attest(large.upload(receipt, data, tmp_path))
    before = large.embedded.state_digest(D)
    for reservation_id in (-1, 0, 2**63 - 1, 999):
        for kind in (COMMIT, CANCEL_LARGE, INSPECT_RESERVATION):
            body: dict[str, Any] = {"reservation_id": reservation_id}
            if kind == COMMIT:
                body["proof"] = proof | {"reservation_id": reservation_id}
            expect(submit_unhalted(large.embedded, D, kind, body), "NotFound")
    system = {"after_task": -5, "limit": None}
    expect(submit_unhalted(large.embedded, D, "keyload.command.ListRetention", system), "Validation")
    for task_id in (-1, 0, 7):
        expect(submit_unhalted(large.embedded, D, "keyload.command.BeginDelete", {"task_id": task_id}), "NotFound")
    large.commit(receipt, proof | {"signature": b"short"}, "TokenInvalidated")
    large.commit(receipt, proof | {"object_version": ""} | {"signature": b""}, "TokenInvalidated")
    large.prepare("big-2", data, "Validation", length=-1)
    large.prepare("big-3", data, "Validation", upload_window_ms=0)
    assert large.embedded.state_digest(D) == before


def test_a_repeated_receive_gives_a_large_deliverys_read_handle_only_while_its_lease_is_held(
    large: Large, tmp_path: Path
) -> None:
    """Feature level 3 (processors/repeats.py): the repeat of a receive that delivered a large
    message keeps its read handle while the lease is held, and has none once it was acked."""
    submit_unhalted(large.embedded, D, "keyload.command.RaiseFeatureLevel", {"level": 3})
    data = b"large " * 100_000
    large.schedule("big-1", data, tmp_path)
    receive = {"queue": Q, "max_messages": None, "max_bytes": None, "lease_ms": None, "wait_ms": None}
    [first] = expect(submit_unhalted(large.embedded, D, RECEIVE, receive, "take"), None).deliveries
    [held] = expect(submit_unhalted(large.embedded, D, RECEIVE, receive, "take"), None).deliveries
    assert held == first and large.read(held, tmp_path) == data
    expect(submit_unhalted(large.embedded, D, ACK, {"token": first.token}), None)
    [acked] = expect(submit_unhalted(large.embedded, D, RECEIVE, receive, "take"), None).deliveries
    assert (acked.error_code, acked.body, acked.payload) == ("StaleLease", b"", None)
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")
