"""Guarded deletion of payload objects: a logged workflow tied to the recovery floor (DESIGN.md §8).

1. Retire intent: the command that makes a large message terminal (ack, cancel,
   expiry), or abandons a reservation (cancel, deadline), writes a retention task in
   the same batch; its offset is the task's `retire_offset`. The object and its quota
   (`payload_object_bytes`, and an abandoned reservation's `reserved_*`) stay.
2. Safety barrier, decided at evaluation time: the logged recovery floor
   (AdvanceRecoveryFloor, appended by the GC worker from the checkpoint catalog) must
   have reached `retire_offset`, so every checkpoint a recovery may start from already
   has the message terminal; and log time must be past `protect_until_ms` (the last
   read handle's expiry, or an abandoned reservation's upload deadline, plus
   the queue policy's payload_request_horizon_ms for requests still in flight). A retired message is
   terminal, so no delivery, dead letter or redrive can need its object any more.
3. BeginDelete moves a task with no blockers to `deleting`; only then may a worker
   delete (version-aware), resolve a lost response by exact HEAD, and send
   DeleteConfirmed, which releases the quota.
4. Once the floor reaches the confirmation's offset, AdvanceRecoveryFloor compacts
   the task: task, reservation and the message's history go; the message id keeps its
   identity row, so it is not used again: for as long as the queue when the task was
   retired below feature level 8, from it until the domain's receipt horizon after the
   retirement (the id is new once both that has passed and the task is compacted). From
   feature level 7 a confirmed task has an index row by its confirmation offset, which is
   how compaction finds it.
"""

from __future__ import annotations

from itertools import islice

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import AdvanceRecoveryFloor, BeginDelete, CheckpointPublished, DeleteConfirmed, ListRetention
from keyload.log.codec import Record
from keyload.processors import validation
from keyload.processors.access import policy_epoch
from keyload.processors.context import Context
from keyload.processors.counters import adjusted_fields
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import CONFIRMED_INDEXED, LARGE_IDENTITIES_KEPT, feature_level
from keyload.processors.horizons import keep_until_receipt_horizon
from keyload.processors.queues.state import allocate, bounded, load_queue_by_id, queue_deleted, save_queue
from keyload.projections import keys
from keyload.projections.records import (
    MessageMeta,
    PayloadReservation,
    QueueView,
    RetentionKind,
    RetentionState,
    RetentionTask,
    load,
    save,
)
from keyload.projections.store import Readable, Staged


def retire_payload(stage: Staged, queue: QueueView, message_id: str, meta: MessageMeta, ctx: Context) -> None:
    """A large message of `queue` became terminal: its object waits for the barrier, and for every
    handle naming it to expire — read handles, and the upload handle (a resumed upload could
    otherwise create the key again after its deletion)."""
    payload = meta.payload
    if payload is None:
        raise Corruption(f"message {message_id} is retired as a large message but has no payload")
    reservation = load(stage, keys.reservation(payload.reservation_id), PayloadReservation)
    if reservation is None:
        raise Corruption(f"large message {message_id} has no reservation {payload.reservation_id}")
    read_until = max(ctx.now_ms, meta.read_until_ms or 0, reservation.upload_deadline_ms)
    _new_task(
        stage,
        ctx,
        RetentionKind.message_payload,
        queue,
        message_id,
        payload.reservation_id,
        payload.object_key,
        payload.object_version,
        payload.length,
        read_until,
    )


def abandon_reservation(stage: Staged, queue: QueueView, reservation: PayloadReservation, ctx: Context) -> None:
    """A reservation ended uncommitted: whatever an upload left must go, once no upload can land."""
    uploads_until = max(ctx.now_ms, reservation.upload_deadline_ms)
    _new_task(
        stage,
        ctx,
        RetentionKind.abandoned_reservation,
        queue,
        reservation.message_id,
        reservation.reservation_id,
        reservation.object_key,
        None,
        reservation.length,
        uploads_until,
    )


def _new_task(
    stage: Staged,
    ctx: Context,
    kind: RetentionKind,
    queue: QueueView,
    message_id: str,
    reservation_id: int,
    object_key: str,
    object_version: str | None,
    length: int,
    handles_until_ms: int,
) -> None:
    task_id = allocate(stage, keys.NEXT_TASK_ID)
    task = RetentionTask(
        task_id=task_id,
        kind=kind,
        domain=queue.domain,
        queue=queue.queue,
        queue_id=queue.incarnation,
        message_id=message_id,
        reservation_id=reservation_id,
        object_key=object_key,
        object_version=object_version,
        length=length,
        retire_offset=ctx.offset,
        retired_at_ms=ctx.now_ms,
        # A request made with a handle may still reach the object store a while after it expires.
        protect_until_ms=handles_until_ms + queue.policy.payload_request_horizon_ms,
        state=RetentionState.waiting,
        delete_offset=None,
        confirmed_offset=None,
        confirmed_at_ms=None,
        deleted_versions=[],
    )
    save(stage, keys.retention_task(task_id), task)
    if feature_level(stage) >= LARGE_IDENTITIES_KEPT:
        # The id's identity keeps to the horizon in force now, as the message's inbox entries do
        # (CompleteProcessing's, written now too, sort before it): after it, and once the task is
        # compacted (the history goes with it), the id is new.
        keep_until_receipt_horizon(stage, keys.identity(queue.incarnation, message_id), queue.domain, ctx.now_ms)


def recovery_floor(stage: Readable) -> int | None:
    raw = stage.get(keys.RECOVERY_FLOOR)
    return None if raw is None else keys.read_u64(raw)


def awaits_announcement(stage: Readable, offset: int) -> bool:
    """Whether a checkpoint published at `offset` is not recorded (CheckpointPublished) yet and
    could still become the floor: the publisher stopped (kill -9) between publishing it and
    logging that it did, so the runtime logs it again."""
    floor = recovery_floor(stage)
    return (floor is None or offset >= floor) and stage.get(keys.published_checkpoint(offset)) is None


def _blockers(
    stage: Readable, state: str, kind: str, retire_offset: int, protect_until_ms: int, now_ms: int
) -> list[str]:
    if state != RetentionState.waiting:
        return []
    found = []
    floor = recovery_floor(stage)
    if floor is None or floor < retire_offset:
        found.append("recovery_floor")
    if now_ms < protect_until_ms:
        found.append("live_handles" if kind == RetentionKind.message_payload else "upload_horizon")
    return found


def blockers(stage: Readable, task: RetentionTask, now_ms: int) -> list[str]:
    """What keeps a waiting task's object from deletion at `now_ms` (empty: nothing)."""
    return _blockers(stage, task.state, task.kind, task.retire_offset, task.protect_until_ms, now_ms)


def _status(stage: Readable, task: RetentionTask, now_ms: int) -> Record:
    return {"task": task.to_avro(), "blocked_by": blockers(stage, task, now_ms)}


def _load_task(stage: Staged, task_id: int) -> RetentionTask:
    # An id outside its range (limits.TASK_ID) names no task: never packed into a key.
    task = load(stage, keys.retention_task(task_id), RetentionTask) if limits.TASK_ID.contains(task_id) else None
    if task is None:
        raise Rejected(ErrorCode.NOT_FOUND, "retention task does not exist (or was compacted)")
    return task


def list_retention(stage: Staged, body: ListRetention, ctx: Context) -> Record:
    limit = bounded("limit", body.limit, limits.DEFAULT_RETENTION_PAGE, 1, limits.MAX_RETENTION_PAGE)
    after = bounded("after_task", body.after_task, 0, 0, limits.MAX_SEQUENCE)
    tasks: list[Record] = []
    next_after = None
    for key, _ in stage.scan(keys.retention_task(after + 1), keys.prefix_end(keys.RETENTION_TASK)):
        if len(tasks) == limit:
            next_after = tasks[-1]["task"]["task_id"]
            break
        # Up to MAX_RETENTION_PAGE tasks, each returned as the dict it is stored as: a typed round
        # trip per task (~6 us) would only serve the four fields its blockers read.
        task = stage.get_record(key, RetentionTask.SCHEMA)
        assert task is not None
        blocked = _blockers(
            stage, task["state"], task["kind"], task["retire_offset"], task["protect_until_ms"], ctx.now_ms
        )
        tasks.append({"task": task, "blocked_by": blocked})
    return _page(stage, tasks, next_after)


def _page(stage: Readable, tasks: list[Record], next_after: int | None) -> Record:
    retired = stage.get(keys.RETIRED_IDENTITIES)
    return {
        "recovery_floor": recovery_floor(stage),
        "tasks": tasks,
        "next_after_task": next_after,
        "retired_identities": 0 if retired is None else keys.read_u64(retired),
    }


def begin_delete(stage: Staged, body: BeginDelete, ctx: Context) -> Record:
    task = _load_task(stage, body.task_id)
    if task.state == RetentionState.waiting:
        blocked = blockers(stage, task, ctx.now_ms)
        if blocked:
            raise Rejected(ErrorCode.CONFLICT, f"deletion is blocked by: {', '.join(blocked)}")
        task = replace(task, state=RetentionState.deleting, delete_offset=ctx.offset)
        save(stage, keys.retention_task(task.task_id), task)
    return _status(stage, task, ctx.now_ms)  # deleting or confirmed already: a worker's retry


def delete_confirmed(stage: Staged, body: DeleteConfirmed, ctx: Context) -> Record:
    task = _load_task(stage, body.task_id)
    versions = body.deleted_versions
    if len(versions) > limits.MAX_DELETED_VERSIONS or any(
        not 1 <= len(v) <= limits.MAX_OBJECT_VERSION_CHARS for v in versions
    ):
        raise Rejected(
            ErrorCode.VALIDATION,
            f"deleted_versions holds at most {limits.MAX_DELETED_VERSIONS} versions of "
            f"1..{limits.MAX_OBJECT_VERSION_CHARS} characters",
        )
    if task.state == RetentionState.waiting:
        raise Rejected(ErrorCode.CONFLICT, "the task's deletion has not begun (BeginDelete first)")
    if task.state == RetentionState.deleting:
        queue = load_queue_by_id(stage, task.queue_id)
        if queue is None and not queue_deleted(stage, task.domain, task.queue, task.queue_id):
            raise Corruption(f"retention task {task.task_id} names a missing queue")
        if queue is not None:  # a deleted queue's counters went with it
            if task.kind == RetentionKind.abandoned_reservation:
                counters = adjusted_fields(
                    queue.view.counters,
                    payload_object_bytes=-task.length,
                    reserved_messages=-1,
                    reserved_bytes=-task.length,
                )
            else:
                counters = adjusted_fields(queue.view.counters, payload_object_bytes=-task.length)
            save_queue(stage, replace(queue, view=replace(queue.view, counters=counters)))
        task = replace(
            task,
            state=RetentionState.confirmed,
            confirmed_offset=ctx.offset,
            confirmed_at_ms=ctx.now_ms,
            deleted_versions=sorted(versions),
        )
        save(stage, keys.retention_task(task.task_id), task)
        if feature_level(stage) >= CONFIRMED_INDEXED:
            stage.put(keys.retention_confirmed(ctx.offset, task.task_id), b"")
    return _status(stage, task, ctx.now_ms)


def checkpoint_published(stage: Staged, body: CheckpointPublished, ctx: Context) -> Record:
    """Record a checkpoint the publisher published (below the floor it can no longer become it)."""
    validation.check_integer("CheckpointPublished.offset", body.offset)
    if body.offset >= ctx.offset:
        raise Rejected(ErrorCode.VALIDATION, "offset must be below the command's own offset")
    floor = recovery_floor(stage)
    if floor is None or body.offset >= floor:
        stage.put(keys.published_checkpoint(body.offset), body.manifest_sha256)
    return {"offset": body.offset}


def advance_recovery_floor(stage: Staged, body: AdvanceRecoveryFloor, ctx: Context) -> Record:
    """Move the floor up. With access control on, only to a checkpoint the partition recorded as
    published (CheckpointPublished): the floor lets objects be deleted, so a principal that may
    send this (`recovery`) still cannot name a floor no published checkpoint is at. Without access
    control (a log written before it), any offset below the command's own, as before."""
    floor = body.floor_offset
    validation.check_integer("AdvanceRecoveryFloor.floor_offset", floor)
    if floor >= ctx.offset:
        raise Rejected(ErrorCode.VALIDATION, "floor_offset must be below the command's own offset")
    current = recovery_floor(stage)
    if current is None or floor > current:
        if policy_epoch(stage) is not None and stage.get(keys.published_checkpoint(floor)) is None:
            raise Rejected(
                ErrorCode.NOT_FOUND, "no published checkpoint at floor_offset was recorded in this partition"
            )
        stage.put(keys.RECOVERY_FLOOR, keys.u64(floor))
        for key, _ in list(stage.scan(keys.PUBLISHED_CHECKPOINT, keys.published_checkpoint(floor))):
            stage.delete(key)  # no floor can go back to them
        _compact(stage, floor)
    return _page(stage, [], None)


def start_indexing(stage: Staged) -> None:
    """The raise to feature level 7: the tasks that exist now are to be looked at once, so those
    confirmed before it get their index rows too (`_index_confirmed`)."""
    first = stage.first(keys.RETENTION_TASK, keys.prefix_end(keys.RETENTION_TASK))
    if first is None:
        return
    allocator = stage.get(keys.NEXT_TASK_ID)
    if allocator is None:
        raise Corruption("retention tasks exist without their allocator")
    stage.put(keys.RETENTION_INDEX_CURSOR, keys.u64(keys.read_u64(first[0], 1)) + allocator)


def _compact(stage: Staged, floor: int) -> None:
    """Drop confirmed tasks the floor has passed, with their reservation and message history, at
    most RETENTION_COMPACTION_BUDGET rows per command. From level 7 they are found by their index
    rows (`C`, by confirmation offset), every one of them compactable; before it the first tasks
    are examined, so waiting ones in front hold the later ones back.

    Tasks and messages are read as dicts here: this reads a few fields of each."""
    budget = limits.RETENTION_COMPACTION_BUDGET
    if feature_level(stage) < CONFIRMED_INDEXED:
        first_tasks = islice(stage.scan(keys.RETENTION_TASK, keys.prefix_end(keys.RETENTION_TASK)), budget)
        passed = [(key, task) for key, _ in first_tasks if _passed(task := _task_row(stage, key), floor)]
    else:
        examined = _index_confirmed(stage, budget)
        indexed = list(
            islice(stage.scan(keys.RETENTION_CONFIRMED, keys.retention_confirmed(floor + 1, 0)), budget - examined)
        )
        passed = []
        for index_key, _ in indexed:
            stage.delete(index_key)
            key = keys.retention_task(keys.read_u64(index_key, 9))
            task = _task_row(stage, key)
            if not _passed(task, floor):
                raise Corruption(f"retention task {task['task_id']} is indexed as confirmed by the floor, and is not")
            passed.append((key, task))
    for key, task in passed:
        _drop(stage, key, task)
    if passed:
        previous = stage.get(keys.RETIRED_IDENTITIES)
        retired = len(passed) + (0 if previous is None else keys.read_u64(previous))
        stage.put(keys.RETIRED_IDENTITIES, keys.u64(retired))


def _task_row(stage: Staged, key: bytes) -> Record:
    task = stage.get_record(key, RetentionTask.SCHEMA)
    if task is None:
        raise Corruption(f"retention task {keys.read_u64(key, 1)} is missing")
    return task


def _passed(task: Record, floor: int) -> bool:
    """Whether the task is confirmed deleted at or below the floor: no recovery can need it."""
    return bool(task["state"] == RetentionState.confirmed and task["confirmed_offset"] <= floor)


def _drop(stage: Staged, key: bytes, task: Record) -> None:
    """A compacted task goes with its reservation and its message's history. The identity stays,
    so the id is not used again: for as long as the queue when the task was retired below level 8;
    from it until the domain's receipt horizon after the retirement (`_new_task`), which may have
    passed already: then the identity is gone, and with the history the id is new."""
    stage.delete(key)
    stage.delete(keys.reservation(task["reservation_id"]))
    # The rows of a deleted queue are reclaimed on their own (processors/reclamation.py), maybe first.
    gone = queue_deleted(stage, task["domain"], task["queue"], task["queue_id"])
    if task["kind"] == RetentionKind.message_payload:
        message = keys.message(task["queue_id"], task["message_id"])
        meta = stage.get_record(message, MessageMeta.SCHEMA)
        if (meta is None and not gone) or (meta is not None and meta["terminal_at_ms"] is None):
            raise Corruption(f"retention task {task['task_id']} names a message that is not terminal")
        stage.delete(message)
    identity = keys.identity(task["queue_id"], task["message_id"])
    if stage.get(identity) is None and not gone and feature_level(stage) < LARGE_IDENTITIES_KEPT:
        raise Corruption(f"retention task {task['task_id']} names a message id without its identity row")


def _index_confirmed(stage: Staged, budget: int) -> int:
    """Give the tasks confirmed before the raise to level 7 their index rows, from the cursor on and
    within `budget` tasks; the tasks it looked at."""
    raw = stage.get(keys.RETENTION_INDEX_CURSOR)
    if raw is None:
        return 0
    end = keys.read_u64(raw, 8)
    rows = list(islice(stage.scan(keys.retention_task(keys.read_u64(raw)), keys.retention_task(end)), budget + 1))
    for key, _ in rows[:budget]:
        task = _task_row(stage, key)
        if task["state"] == RetentionState.confirmed:
            stage.put(keys.retention_confirmed(task["confirmed_offset"], task["task_id"]), b"")
    if len(rows) > budget:
        stage.put(keys.RETENTION_INDEX_CURSOR, keys.u64(keys.read_u64(rows[budget][0], 1)) + keys.u64(end))
        return budget
    stage.delete(keys.RETENTION_INDEX_CURSOR)
    return len(rows)
