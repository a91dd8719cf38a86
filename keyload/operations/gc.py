"""The GC worker: drives retention tasks through their logged workflow (processors/payloads/retention.py).

One pass, per partition:
1. Log the recovery floor (AdvanceRecoveryFloor) when the catalog's oldest retained
   checkpoint is above the floor the partition last logged.
2. Page through ListRetention. A waiting task with nothing blocking it gets
   BeginDelete: the processor decides, at log time, whether it may go.
3. A deleting task's key is emptied by exact version: every unfinished multipart
   upload is aborted and every version found under the key deleted, whoever wrote
   it. The key was the reservation's alone, so a retired message's own version and
   any a late or racing upload left (an S3 store that does not hold concurrent
   conditional writes to one version: moto) go alike. Then an exact check
   (`version_ids`, `uploads`) must find none left, and DeleteConfirmed reports what
   was deleted (a message's own version first, at most MAX_DELETED_VERSIONS). A
   delete whose response is lost is resolved by that check, not by retrying
   blindly; a version still there waits for the next pass.

4. Sweep objects of checkpoints that were uploaded but never published and lie below
   the floor (Checkpoints.sweep_orphans).

Every step is idempotent, so a worker killed anywhere just repeats steps on its next
pass; the processor, not the worker, decides what may be deleted.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from threading import Event
from typing import Protocol

from keyload.bodies import ListRetention
from keyload.errors import CommandRejected, KeyloadError, NotFoundError
from keyload.limits import MAX_DELETED_VERSIONS
from keyload.operations.catalog import CatalogError, recovery_floor
from keyload.operations.checkpoints import CheckpointError, Checkpoints
from keyload.processors.context import Context
from keyload.processors.payloads import retention
from keyload.projections.store import Staged, Store
from keyload.sdk.client import Client
from keyload.sdk.results import RetentionPage, RetentionStatus, RetentionTask
from keyload.service.runtime import wall_clock_ms
from keyload.storage.datadir import DataDir
from keyload.storage.object_store import ObjectStoreError

log = logging.getLogger("keyload.operations.gc")

DEFAULT_GC_INTERVAL_S = 10.0
TIME_BLOCKERS = frozenset({"live_handles", "upload_horizon"})  # lifted by log time alone
MAX_PAGES_PER_PASS = 100  # ListRetention pages one pass reads per partition
# What a pass meets and rides out: it is logged, and the partition (or pass) is tried again next time.
PASS_FAULTS = (KeyloadError, CatalogError, CheckpointError, ObjectStoreError, OSError)  # retried next pass


@dataclass(slots=True)
class GcPass:
    """What one pass did, for logs and tests."""

    floors_logged: int = 0
    begun: int = 0
    confirmed: int = 0
    objects_deleted: int = 0
    blocked: dict[str, int] = field(default_factory=dict)  # blocker -> tasks it held back
    # task id -> why its deletion is not confirmed yet (the store refused, or a version or upload is
    # still under its key): the task stays `deleting` and is tried again next pass
    unresolved: dict[int, str] = field(default_factory=dict)
    quiet: int = 0  # partitions passed over: nothing changed since a pass found nothing to do
    orphans_deleted: int = 0  # objects of checkpoints uploaded but never published, below the floor
    # partition -> why its part of the pass failed (a halted partition's log cannot be read, say): the
    # other partitions are collected all the same, and it is tried again next pass
    failed: dict[int, str] = field(default_factory=dict)

    def leave_deleting(self, task_id: int, why: str) -> None:
        """A deletion this pass could not confirm: said (an operator's only sign of a store that keeps
        refusing) and tried again next pass."""
        log.warning("gc: task %d stays deleting, tried again next pass: %s", task_id, why)
        self.unresolved[task_id] = why


class RetentionClient(Protocol):
    """The commands the worker sends (keyload.Client has them)."""

    @property
    def data(self) -> DataDir: ...

    def list_retention(
        self, partition: int, *, after_task: int | None = None, limit: int | None = None
    ) -> RetentionPage: ...

    def advance_recovery_floor(self, partition: int, floor_offset: int) -> RetentionPage: ...

    def begin_delete(self, partition: int, task_id: int) -> RetentionStatus: ...

    def delete_confirmed(self, partition: int, task_id: int, deleted_versions: list[str]) -> RetentionStatus: ...


@dataclass(frozen=True, slots=True)
class _Quiet:
    """A partition where the last pass found nothing to do: passed over until its log grows, its
    catalog floor moves, or a blocker of time lifts (so an idle deployment's log stays idle)."""

    log_end: int
    floor: int | None
    wake_ms: int | None  # the earliest protect_until_ms among tasks waiting for time


class LocalRetention:
    """The worker's client inside an embedded `keyload run`: it reads retention from the live
    projections (a look costs no log record) and sends every change through `client` as a command.
    Blockers are judged at the later of the projection's last log time and the wall clock: only a
    proposal, the processor decides at the BeginDelete's own log time."""

    def __init__(self, client: Client, stores: Mapping[int, Store], clock: Callable[[], int] = wall_clock_ms) -> None:
        self.client = client
        self.stores = stores
        self.clock = clock

    @property
    def data(self) -> DataDir:
        return self.client.data

    def list_retention(
        self, partition: int, *, after_task: int | None = None, limit: int | None = None
    ) -> RetentionPage:
        store = self.stores[partition]
        now_ms = max(store.last_time_ms, self.clock())
        look = Context(partition, store.applied_offset, now_ms, "gc-look", "", "", {})
        page = retention.list_retention(Staged(store), ListRetention(after_task=after_task, limit=limit), look)
        return RetentionPage.from_avro(page)

    def advance_recovery_floor(self, partition: int, floor_offset: int) -> RetentionPage:
        return self.client.advance_recovery_floor(partition, floor_offset)

    def begin_delete(self, partition: int, task_id: int) -> RetentionStatus:
        return self.client.begin_delete(partition, task_id)

    def delete_confirmed(self, partition: int, task_id: int, deleted_versions: list[str]) -> RetentionStatus:
        return self.client.delete_confirmed(partition, task_id, deleted_versions)


class GcWorker:
    """Payload objects and checkpoint orphans of one data directory (`checkpoints` has its object
    store and catalog): of every partition, or of `partitions` (a process of `keyload run
    --workers` collects for the partitions it serves)."""

    def __init__(
        self,
        client: RetentionClient,
        checkpoints: Checkpoints,
        clock: Callable[[], int] = wall_clock_ms,
        partitions: Sequence[int] | None = None,
    ) -> None:
        self.client = client
        self.partitions = range(client.data.partitions) if partitions is None else partitions
        self.checkpoints = checkpoints
        self.catalog = checkpoints.catalog
        self.clock = clock
        self._log = client.data.command_log()
        self._quiet: dict[int, _Quiet] = {}

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> GcWorker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def run_once(self) -> GcPass:
        done = GcPass()
        for partition in self.partitions:
            try:
                self._partition(partition, done)
                done.orphans_deleted += self.checkpoints.sweep_orphans(partition)
            except PASS_FAULTS as exc:  # a fault halts at most its own partition's collection
                log.warning("gc: partition %d passed by, tried again next pass: %s", partition, exc)
                done.failed[partition] = str(exc)
        return done

    def _partition(self, partition: int, done: GcPass) -> None:
        floor = recovery_floor(self.catalog, partition)
        quiet = self._quiet.pop(partition, None)
        if (
            quiet is not None
            and (quiet.log_end, quiet.floor) == (self._log.end_offset(partition), floor)
            and (quiet.wake_ms is None or self.clock() < quiet.wake_ms)
        ):
            done.quiet += 1
            self._quiet[partition] = quiet
            return
        page = self.client.list_retention(partition)
        acted = False
        if floor is not None and (page.recovery_floor is None or floor > page.recovery_floor):
            try:
                self.client.advance_recovery_floor(partition, floor)
            except NotFoundError:
                pass  # the partition has not applied its record of that checkpoint yet: a later pass logs it
            else:
                done.floors_logged += 1
                page = self.client.list_retention(partition)
                acted = True
        wake: list[int] = []
        for _ in range(MAX_PAGES_PER_PASS):
            for status in page.tasks:
                task = status.task
                if task.state == "waiting":
                    if status.blocked_by:
                        for blocker in status.blocked_by:
                            done.blocked[blocker] = done.blocked.get(blocker, 0) + 1
                        if set(status.blocked_by) & TIME_BLOCKERS:
                            wake.append(task.protect_until_ms)
                        continue
                    acted = True
                    try:
                        task = self.client.begin_delete(partition, task.task_id).task
                    except CommandRejected:
                        continue  # blocked after all (log time decides): next pass
                    done.begun += 1
                if task.state == "deleting":
                    acted = True
                    self._delete(partition, task, done)
            if page.next_after_task is None:
                break
            page = self.client.list_retention(partition, after_task=page.next_after_task)
        else:
            acted = True  # more pages than one pass reads: go on next pass
        if not acted:
            self._quiet[partition] = _Quiet(self._log.end_offset(partition), floor, min(wake, default=None))

    def _delete(self, partition: int, task: RetentionTask, done: GcPass) -> None:
        key, objects = task.object_key, self.checkpoints.objects
        try:
            for upload_id in objects.uploads(key):
                objects.abort_upload(key, upload_id)
            found = objects.version_ids(key)
            for version in found:
                with contextlib.suppress(ObjectStoreError):  # a lost response: the check below decides
                    if objects.delete(key, version):
                        done.objects_deleted += 1
            settled = not objects.version_ids(key) and not objects.uploads(key)
        except ObjectStoreError as exc:
            done.leave_deleting(task.task_id, f"the object store failed: {exc}")
            return
        if not settled:  # a late writer, or a delete that did not happen
            done.leave_deleting(task.task_id, f"{key} still holds a version or an unfinished upload after the deletes")
            return
        own = [] if task.object_version is None else [task.object_version]  # gone already, if a pass was cut short
        others = sorted(set(found) - set(own))
        self.client.delete_confirmed(partition, task.task_id, (own + others)[:MAX_DELETED_VERSIONS])
        done.confirmed += 1


def run_worker(
    worker: GcWorker,
    stop: Event,
    interval_s: float = DEFAULT_GC_INTERVAL_S,
    report: Callable[[GcPass], object] | None = None,
) -> None:
    """Run passes every `interval_s` until `stop` is set; a failed pass is reported and retried."""
    while not stop.is_set():
        try:
            done = worker.run_once()
        except PASS_FAULTS as exc:
            log.warning("gc: pass failed, retrying in %.0f s: %s", interval_s, exc)
        else:
            if report is not None:
                report(done)
        stop.wait(interval_s)
