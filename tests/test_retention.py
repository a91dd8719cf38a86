"""Guarded deletion of payload objects: the GC worker against the embedded processor, a real
file object store and catalog. Nothing a recovery, a delivery or a dead letter needs is deleted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keyload.log.codec import REGISTRY
from keyload.operations.checkpoints import CheckpointPolicy, Checkpoints
from keyload.operations.gc import GcPass, GcWorker
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.sdk.results import RetentionPage, RetentionStatus
from keyload.service.system_commands import domain_for_partition
from keyload.storage.datadir import DataDir
from keyload.storage.object_store import FileObjectStore, ObjectStoreError

from .payloads import CANCEL_LARGE, D, Large, Q, counters, large_deployment
from .support import (
    ACK,
    CHECKPOINT,
    ENQUEUE,
    INSPECT_MESSAGE,
    NACK,
    REDRIVE,
    assert_replay_equals_live,
    enqueue_body,
    expect,
    message_fence,
    submit_unhalted,
)

LIVE = {"scheduled", "ready", "leased", "dead_lettered", "pending_dead_letter"}


@dataclass
class EmbeddedRetention:
    """The GC worker's commands, sent to the embedded deployment (keyload.Client sends them to a service)."""

    large: Large

    @property
    def data(self) -> DataDir:
        return self.large.embedded.data

    def _submit(self, partition: int, kind: str, body: dict[str, Any]) -> Any:
        domain = domain_for_partition(partition, self.data.partitions)
        return expect(submit_unhalted(self.large.embedded, domain, f"keyload.command.{kind}", body), None)

    def list_retention(
        self, partition: int, *, after_task: int | None = None, limit: int | None = None
    ) -> RetentionPage:
        page: RetentionPage = self._submit(partition, "ListRetention", {"after_task": after_task, "limit": limit})
        return page

    def advance_recovery_floor(self, partition: int, floor_offset: int) -> RetentionPage:
        page: RetentionPage = self._submit(partition, "AdvanceRecoveryFloor", {"floor_offset": floor_offset})
        return page

    def begin_delete(self, partition: int, task_id: int) -> RetentionStatus:
        status: RetentionStatus = self._submit(partition, "BeginDelete", {"task_id": task_id})
        return status

    def delete_confirmed(self, partition: int, task_id: int, deleted_versions: list[str]) -> RetentionStatus:
        body = {"task_id": task_id, "deleted_versions": deleted_versions}
        status: RetentionStatus = self._submit(partition, "DeleteConfirmed", body)
        return status


class LossyStore(FileObjectStore):
    """A real store whose next delete loses its response (after deleting) or its request (before)."""

    lose: str | None = None

    def delete(self, key: str, version: str) -> bool:
        lose, self.lose = self.lose, None
        if lose == "request":
            raise ObjectStoreError("connection reset before the request was sent")
        deleted = super().delete(key, version)
        if lose == "response":
            raise ObjectStoreError("connection reset while reading the response")
        return deleted


@dataclass
class Collected:
    large: Large
    worker: GcWorker
    objects: LossyStore

    def checkpoint(self) -> int:
        offset: int = expect(submit_unhalted(self.large.embedded, D, CHECKPOINT, {}), None).offset
        return offset

    def gc(self) -> GcPass:
        return self.worker.run_once()

    def tasks(self) -> list[RetentionStatus]:
        return self.worker.client.list_retention(self.large.embedded.partition(D)).tasks


@pytest.fixture
def collected(tmp_path: Path) -> Iterator[Collected]:
    """A deployment whose checkpoints keep 2 and whose payload horizon is 1 s, with a GC worker."""
    with large_deployment(tmp_path / "data", payload_request_horizon_ms=1_000) as large:
        embedded = large.embedded
        objects = LossyStore(embedded.data.object_root or tmp_path / "data" / "objects")
        checkpoints = Checkpoints(
            objects, embedded.data.catalog(), tmp_path / "data" / "scratch", CheckpointPolicy(retain=2)
        )
        for processor in embedded.processors:
            processor.checkpoints = checkpoints
        large.gateway.objects = objects
        with GcWorker(EmbeddedRetention(large), checkpoints) as worker:
            yield Collected(large, worker, objects)


def live_payloads(store_path: Path) -> list[tuple[str, str, str]]:
    """(message state, object key, version) of every live large message in a projection."""
    store = Store(store_path, read_only=True)
    try:
        found = []
        for _, value in store.scan(keys.MESSAGE, keys.prefix_end(keys.MESSAGE)):
            meta = REGISTRY.decode("keyload.MessageMeta", value)
            if meta["payload"] is not None and meta["state"] in LIVE:
                found.append((meta["state"], meta["payload"]["object_key"], meta["payload"]["object_version"]))
        return found
    finally:
        store.close()


def test_deletion_waits_for_the_recovery_floor_then_compaction_retires_the_identity(
    collected: Collected, tmp_path: Path
) -> None:
    large, embedded = collected.large, collected.large.embedded
    kept = large.schedule("kept", b"k" * 50_000, tmp_path)  # stays live throughout
    gone = large.schedule("gone", b"g" * 70_000, tmp_path)
    collected.checkpoint()  # taken before the retirement: it still has "gone" live
    deliveries = {d.message_id: d for d in large.receive()}
    assert large.read(deliveries["gone"], tmp_path) == b"g" * 70_000
    expect(submit_unhalted(embedded, D, ACK, {"token": deliveries["gone"].token}), None)
    [status] = collected.tasks()
    assert status.task.kind == "message_payload" and set(status.blocked_by) == {"recovery_floor", "live_handles"}
    embedded.now_ms += 40_000  # past the read handle's lease, not the upload handle's deadline
    assert collected.gc().blocked == {"recovery_floor": 1, "live_handles": 1}
    embedded.now_ms = gone.upload_deadline_ms + 1_000  # and the horizon after it
    collected.checkpoint()
    # Recovery set {before, after}: the floor is the one taken before the retirement.
    assert collected.gc().blocked == {"recovery_floor": 1}
    assert gone.object_version is not None
    assert [v.version for v in collected.objects.versions(gone.object_key)] == [gone.object_version]
    collected.checkpoint()  # the one from before the retirement leaves the recovery set
    done = collected.gc()
    assert (done.begun, done.confirmed, done.objects_deleted) == (1, 1, 1)
    assert collected.objects.versions(gone.object_key) == []
    assert counters(large).payload_object_bytes == 50_000
    [status] = collected.tasks()
    assert status.task.state == "confirmed" and status.task.deleted_versions == [gone.object_version]
    # Compaction waits for the floor to pass the confirmation too.
    collected.checkpoint()
    collected.checkpoint()
    collected.gc()
    assert collected.tasks() == []
    page = collected.worker.client.list_retention(embedded.partition(D))
    assert page.retired_identities == 1
    inspect = {"queue": Q, "message_id": "gone", "include_body": False}
    assert "reclaimed" in submit_unhalted(embedded, D, INSPECT_MESSAGE, inspect).detail
    # The id stays used: its history is gone, its tombstone is not.
    expect(submit_unhalted(embedded, D, ENQUEUE, enqueue_body(Q, "gone")), "Conflict")
    large.prepare("gone", b"again", "Conflict")
    # Every retained checkpoint restores to messages whose payloads are all readable.
    checkpoints = collected.worker.checkpoints
    entries = checkpoints.entries(embedded.partition(D))
    assert len(entries) == 2
    for entry in entries:
        restored = tmp_path / f"restored-{entry.offset}"
        checkpoints.restore(entry, restored)
        payloads = live_payloads(restored)
        assert [key for _, key, _ in payloads] == [kept.object_key]  # its lease ran out: a retry is scheduled
        for _, key, version in payloads:
            target = tmp_path / f"payload-{entry.offset}"
            collected.objects.get(key, target, version)
            assert target.read_bytes() == b"k" * 50_000
    assert_replay_equals_live(embedded, D, tmp_path / "replay")


def test_an_active_delivery_a_dead_letter_or_a_live_read_handle_keeps_the_object(
    tmp_path: Path,
) -> None:
    with (
        large_deployment(tmp_path / "data", max_attempts=1, payload_request_horizon_ms=0) as large,
        GcWorker(EmbeddedRetention(large), large.embedded.data.checkpoints(CheckpointPolicy(retain=1))) as worker,
    ):
        embedded = large.embedded
        objects = embedded.data.object_store()
        checkpoints = worker.checkpoints
        # Short upload windows: the read handles (30 s leases) are what outlives the acks here.
        parked = large.schedule("parked", b"p" * 1_000, tmp_path, upload_window_ms=1_000)
        leased = large.schedule("leased", b"l" * 1_000, tmp_path, upload_window_ms=1_000)
        first, second = large.receive()
        expect(submit_unhalted(embedded, D, NACK, {"token": first.token, "delay_ms": None}), None)  # dead letter
        for _ in range(2):
            expect(submit_unhalted(embedded, D, CHECKPOINT, {}), None)
            checkpoints.take(embedded.store(D), embedded.partition(D))
        worker.run_once()
        # A leased message and a dead letter are live: no retention task, the objects stay.
        assert worker.client.list_retention(embedded.partition(D)).tasks == []
        for reservation in (parked, leased):
            assert reservation.object_version is not None
            assert [v.version for v in objects.versions(reservation.object_key)] == [reservation.object_version]
        # A redriven dead letter is delivered again and its bytes are there.
        meta = expect(
            submit_unhalted(embedded, D, INSPECT_MESSAGE, {"queue": Q, "message_id": "parked", "include_body": False}),
            None,
        ).meta
        fence = message_fence(Q, "parked", meta.state_version, meta.delivery_generation)
        expect(submit_unhalted(embedded, D, REDRIVE, fence), None)
        [again] = large.receive()
        assert large.read(again, tmp_path) == b"p" * 1_000
        # Acked while an earlier read handle is still valid: deletion waits for that handle to expire.
        expect(submit_unhalted(embedded, D, ACK, {"token": second.token}), None)
        checkpoints.take(embedded.store(D), embedded.partition(D))
        assert worker.run_once().blocked == {"live_handles": 1}
        embedded.now_ms += 30_001
        assert worker.run_once().confirmed == 1
        assert objects.versions(leased.object_key) == []


@pytest.mark.parametrize("lost", ["response", "request"])
def test_a_lost_delete_is_resolved_by_an_exact_check(collected: Collected, tmp_path: Path, lost: str) -> None:
    large, embedded = collected.large, collected.large.embedded
    reservation = large.schedule("m", b"m" * 10_000, tmp_path)
    [delivery] = large.receive()
    expect(submit_unhalted(embedded, D, ACK, {"token": delivery.token}), None)
    embedded.now_ms = reservation.upload_deadline_ms + 1_000  # every handle expired, the horizon passed
    for _ in range(2):
        collected.checkpoint()
    collected.objects.lose = lost
    done = collected.gc()
    if lost == "response":  # it was deleted: the check finds no version and confirms
        assert (done.confirmed, done.unresolved) == (1, {})
    else:  # it was not: the version is still there, so nothing is confirmed until the next pass
        [(task_id, why)] = done.unresolved.items()
        assert (done.confirmed, task_id, why) == (
            0,
            collected.tasks()[0].task.task_id,
            f"{reservation.object_key} still holds a version or an unfinished upload after the deletes",
        )
        assert collected.tasks()[0].task.state == "deleting"
        assert collected.gc().confirmed == 1
    assert collected.objects.versions(reservation.object_key) == []
    assert collected.tasks()[0].task.state == "confirmed"


def test_a_retired_messages_key_is_emptied_of_the_versions_a_racing_upload_left(
    collected: Collected, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two uploads of one reservation at once on a store that does not hold concurrent conditional
    writes to one version (moto) leave two versions; the key was the reservation's alone, so the GC
    deletes both, and reports the message's own first."""
    large, embedded = collected.large, collected.large.embedded
    data = b"m" * 10_000
    reservation = large.schedule("m", data, tmp_path)
    (tmp_path / "raced").write_bytes(data)
    monkeypatch.setattr(collected.objects, "head", lambda key: None)  # the racing writer saw no version yet
    raced = collected.objects.put_if_absent(reservation.object_key, tmp_path / "raced")
    monkeypatch.undo()
    assert raced.version != reservation.object_version
    [delivery] = large.receive()
    expect(submit_unhalted(embedded, D, ACK, {"token": delivery.token}), None)
    embedded.now_ms = reservation.upload_deadline_ms + 1_000  # every handle expired, the horizon passed
    for _ in range(2):
        collected.checkpoint()
    done = collected.gc()
    assert (done.confirmed, done.objects_deleted) == (1, 2)
    assert collected.objects.version_ids(reservation.object_key) == []
    [status] = collected.tasks()
    assert status.task.deleted_versions == [reservation.object_version, raced.version]


def test_a_late_put_after_an_abandoned_reservation_cannot_resurrect_it(collected: Collected, tmp_path: Path) -> None:
    large, embedded = collected.large, collected.large.embedded
    data = b"abandoned" * 2_000
    receipt = large.prepare("m", data)
    proof_source = tmp_path / "late"
    proof_source.write_bytes(data)
    expect(submit_unhalted(embedded, D, CANCEL_LARGE, {"reservation_id": receipt.reservation_id}), None)
    for _ in range(2):
        collected.checkpoint()
    # Nothing was uploaded, and a HEAD finds nothing: not enough while an upload could still land.
    assert collected.objects.head(receipt.object_key) is None
    assert collected.gc().blocked == {"upload_horizon": 1}
    # An old upload lands late, with a multipart upload left half done.
    late = collected.objects.put_if_absent(receipt.object_key, proof_source)
    collected.objects.begin_upload(receipt.object_key, late.etag)
    proof = large.gateway.attest(large.handle(receipt))
    large.commit(receipt, proof, "Conflict")  # cancelled first in the log: the late object never becomes live
    held = counters(large)
    assert (held.reserved_messages, held.reserved_bytes, held.payload_object_bytes) == (1, len(data), len(data))
    embedded.now_ms = receipt.upload_deadline_ms + 1_000  # deadline closed, horizon quiet
    done = collected.gc()
    assert (done.confirmed, done.objects_deleted) == (1, 1)
    assert collected.objects.versions(receipt.object_key) == [] and collected.objects.uploads(receipt.object_key) == []
    held = counters(large)
    assert (held.reserved_messages, held.reserved_bytes, held.payload_object_bytes) == (0, 0, 0)
    assert large.receive() == []
    assert_replay_equals_live(embedded, D, tmp_path / "replay")


def test_a_deleted_queues_objects_are_still_collected_and_its_tasks_compact(
    collected: Collected, tmp_path: Path
) -> None:
    """A queue deleted while its acked message's object awaits the GC: the deletion, its confirmation
    and the task's compaction go on without the queue (and without a halt)."""
    large, embedded = collected.large, collected.large.embedded
    gone = large.schedule("gone", b"g" * 70_000, tmp_path)
    [delivery] = large.receive()
    expect(submit_unhalted(embedded, D, ACK, {"token": delivery.token}), None)
    expect(submit_unhalted(embedded, D, "keyload.command.DeleteQueue", {"queue": Q}), None)
    embedded.now_ms = gone.upload_deadline_ms + 1_000  # past the handles and the horizon after them
    for _ in range(4):
        collected.checkpoint()
        collected.gc()
    assert collected.tasks() == []  # confirmed, then compacted
    assert gone.object_version is not None and collected.objects.versions(gone.object_key) == []
    assert collected.worker.client.list_retention(embedded.partition(D)).retired_identities == 1
    assert_replay_equals_live(embedded, D, tmp_path / "replay")


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("keyload.command.DeleteQueue", {"queue": Q, "force": True}),
        ("keyload.command.PurgeQueue", {"queue": Q, "expected_incarnation": None}),
    ],
)
def test_a_forced_delete_or_a_purge_sends_live_objects_and_open_uploads_to_the_gc(
    collected: Collected, tmp_path: Path, kind: str, body: dict[str, object]
) -> None:
    """A queue deleted by force (or purged) with a live large message and an open reservation: as
    reclamation reaches them, each becomes a retention task, and the GC deletes both objects."""
    large, embedded = collected.large, collected.large.embedded
    live = large.schedule("live", b"l" * 60_000, tmp_path)
    pending = large.prepare("pending", b"p" * 10_000)
    large.upload(pending, b"p" * 10_000, tmp_path)  # uploaded, never committed
    expect(submit_unhalted(embedded, D, kind, body), None)
    expect(submit_unhalted(embedded, D, CHECKPOINT, {}), None)  # a record: reclamation runs before it
    kinds = sorted(status.task.kind for status in collected.tasks())
    assert kinds == ["abandoned_reservation", "message_payload"]
    reservation = expect(
        submit_unhalted(embedded, D, "keyload.command.InspectReservation", {"reservation_id": pending.reservation_id}),
        None,
    )
    assert reservation.state == "cancelled"
    embedded.now_ms = max(live.upload_deadline_ms, pending.upload_deadline_ms) + 1_000  # past every handle
    for _ in range(4):
        collected.checkpoint()
        collected.gc()
    assert collected.tasks() == []
    assert live.object_version is not None and collected.objects.versions(live.object_key) == []
    assert collected.objects.versions(pending.object_key) == []
    assert_replay_equals_live(embedded, D, tmp_path / "replay")
