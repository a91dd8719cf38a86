"""The GC worker: drives retention tasks through their logged workflow (processors/retention.py).

One pass, per partition:
1. Log the recovery floor (AdvanceRecoveryFloor) when the catalog's oldest retained
   checkpoint is above the floor the partition last logged.
2. Page through ListRetention. A waiting task with nothing blocking it gets
   BeginDelete: the processor decides, at log time, whether it may go.
3. A deleting task's object is deleted by exact version: a retired message's one
   version; for an abandoned reservation, every unfinished multipart upload and every
   version found under its key (a late writer may have left any). Then an exact check
   (`versions`, `uploads`) must find none of them left, and DeleteConfirmed reports
   what was deleted. A delete whose response is lost is resolved by that check, not
   by retrying blindly; a version still there waits for the next pass.

4. Sweep objects of checkpoints that were uploaded but never published and lie below
   the floor (Checkpoints.sweep_orphans).

Every step is idempotent, so a worker killed anywhere just repeats steps on its next
pass; the processor, not the worker, decides what may be deleted.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event

from keyload.catalog import CatalogError, recovery_floor
from keyload.checkpoints import CheckpointError, Checkpoints
from keyload.client import Client
from keyload.errors import CommandRejected, KeyloadError
from keyload.object_store import ObjectStore, ObjectStoreError
from keyload.results import RetentionTask

DEFAULT_GC_INTERVAL_S = 10.0
MAX_PAGES_PER_PASS = 100  # ListRetention pages one pass reads per partition


@dataclass(slots=True)
class GcPass:
    """What one pass did, for logs and tests."""

    floors_logged: int = 0
    begun: int = 0
    confirmed: int = 0
    objects_deleted: int = 0
    blocked: dict[str, int] = field(default_factory=dict)  # blocker -> tasks it held back
    unresolved: int = 0  # deletions whose outcome is not known yet: retried next pass
    orphans_deleted: int = 0  # objects of checkpoints uploaded but never published, below the floor


class GcWorker:
    """Payload objects and checkpoint orphans of one data directory (`checkpoints` has its object
    store and catalog)."""

    def __init__(self, client: Client, checkpoints: Checkpoints) -> None:
        self.client = client
        self.checkpoints = checkpoints
        self.objects: ObjectStore = checkpoints.objects
        self.catalog = checkpoints.catalog

    def run_once(self) -> GcPass:
        done = GcPass()
        for partition in range(self.client.data.partitions):
            self._partition(partition, done)
            done.orphans_deleted += self.checkpoints.sweep_orphans(partition)
        return done

    def _partition(self, partition: int, done: GcPass) -> None:
        first = self.client.list_retention(partition)
        floor = recovery_floor(self.catalog, partition)
        if floor is not None and (first.recovery_floor is None or floor > first.recovery_floor):
            first = self.client.advance_recovery_floor(partition, floor)
            done.floors_logged += 1
            first = self.client.list_retention(partition)
        page = first
        for _ in range(MAX_PAGES_PER_PASS):
            for status in page.tasks:
                task = status.task
                if task.state == "waiting":
                    if status.blocked_by:
                        for blocker in status.blocked_by:
                            done.blocked[blocker] = done.blocked.get(blocker, 0) + 1
                        continue
                    try:
                        task = self.client.begin_delete(partition, task.task_id).task
                    except CommandRejected:
                        continue  # blocked after all (log time decides): next pass
                    done.begun += 1
                if task.state == "deleting":
                    self._delete(partition, task, done)
            if page.next_after_task is None:
                return
            page = self.client.list_retention(partition, after_task=page.next_after_task)

    def _delete(self, partition: int, task: RetentionTask, done: GcPass) -> None:
        key = task.object_key
        try:
            if task.object_version is not None:
                doomed = [task.object_version]
            else:
                for upload_id in self.objects.uploads(key):
                    self.objects.abort_upload(key, upload_id)
                doomed = [version.version for version in self.objects.versions(key)]
            for version in doomed:
                with contextlib.suppress(ObjectStoreError):  # a lost response: the check below decides
                    if self.objects.delete(key, version):
                        done.objects_deleted += 1
            left = {version.version for version in self.objects.versions(key)}
            if task.object_version is not None:
                settled = task.object_version not in left
            else:
                settled = not left and not self.objects.uploads(key)
        except ObjectStoreError as exc:
            print(f"gc: task {task.task_id} ({key}): {exc}", file=sys.stderr)
            done.unresolved += 1
            return
        if not settled:
            done.unresolved += 1  # a late writer, or a delete that did not happen: next pass
            return
        self.client.delete_confirmed(partition, task.task_id, sorted(doomed))
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
        except (KeyloadError, CatalogError, CheckpointError, ObjectStoreError) as exc:
            print(f"gc: pass failed, retrying in {interval_s:.0f} s: {exc}", file=sys.stderr)
        else:
            if report is not None:
                report(done)
        stop.wait(interval_s)
