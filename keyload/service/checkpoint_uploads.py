"""Checkpoints stored and published off the thread that applies records and answers requests.

A take has two halves (keyload/operations/checkpoints.py). The snapshot is hard links to the
projection's files: milliseconds, on the applying thread, at exactly the offset it is taken
for. Describing it (a digest pass and a SHA-256 of every file), uploading it and publishing it
to the catalog read the whole projection and wait on the object store: `CheckpointUploads`
runs them on a thread of its own, so an object store that answers slowly or not at all delays
checkpoints, never the records being applied or the HTTP requests being answered.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from keyload.operations.catalog import CatalogEntry, CatalogError
from keyload.operations.checkpoints import CheckpointError, Checkpoints, Snapshot
from keyload.projections.store import StoreError
from keyload.storage.object_store import ObjectStoreError

log = logging.getLogger(__name__)

MAX_PENDING_CHECKPOINTS = 2  # per partition: the one being published and one waiting; a take beyond is skipped
CHECKPOINT_DRAIN_S = 10.0  # how long a stopping service waits for the checkpoints still being published
PUBLICATION_FAILURES = (CheckpointError, CatalogError, ObjectStoreError, StoreError, OSError)


@dataclass(frozen=True, slots=True)
class Published:
    """How one snapshot's publication ended: its catalog entry, or why there is none."""

    partition: int
    offset: int
    entry: CatalogEntry | None
    failure: str = ""


def publish(checkpoints: Checkpoints, snapshot: Snapshot) -> Published:
    """Store and publish `snapshot`; a failure the object store or catalog reports is returned, not raised."""
    try:
        return Published(snapshot.partition, snapshot.offset, checkpoints.publish(snapshot))
    except PUBLICATION_FAILURES as exc:
        return Published(snapshot.partition, snapshot.offset, None, str(exc))


def retire(checkpoints: Checkpoints, published: Published) -> None:
    """After a publication, retire the checkpoints beyond the policy's `retain`. Any failure is
    logged, not raised: the publication stands, the uploads' thread goes on, and the next
    publication retires them."""
    if published.entry is None:
        return
    try:
        checkpoints.retire_beyond(published.partition)
    except Exception as exc:
        log.warning(
            "partition %d: older checkpoints not retired after the one at offset %d: %s: %s (the next "
            "publication tries again)",
            published.partition,
            published.offset,
            type(exc).__name__,
            exc,
        )


class CheckpointUploads:
    """Publishes a service's snapshots one at a time, in the order taken, on a thread of its own.

    The thread opens a `Checkpoints` of its own (`open_checkpoints`), so its catalog and object
    store clients are used by it alone. A partition has at most MAX_PENDING_CHECKPOINTS snapshots
    waiting or being published: while an object store hangs, further takes are skipped rather
    than piling up hard links to files RocksDB has since deleted. The processor that took a
    snapshot collects how it ended (`finished`) on its own thread, which announces it; the thread
    hands a publication over as soon as its catalog entry is written, and only then retires the
    checkpoints beyond `retain`.
    """

    def __init__(self, open_checkpoints: Callable[[], Checkpoints]) -> None:
        self._open = open_checkpoints
        self._queue: queue.SimpleQueue[tuple[int, Snapshot] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: Counter[int] = Counter()  # partition -> snapshots submitted and not finished
        self._owner: Counter[int] = Counter()  # partition -> its processor's number here (`forget`)
        self._finished: defaultdict[int, list[Published]] = defaultdict(list)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="keyload-checkpoint-uploads", daemon=True)
        self._thread.start()

    def has_room(self, partition: int) -> bool:
        """Whether a snapshot of `partition` would be queued now: a processor asks before it takes
        one (a snapshot flushes the projection's memtable and links its files), rather than taking
        it to discard it."""
        with self._lock:
            return not self._closed and self._pending[partition] < MAX_PENDING_CHECKPOINTS

    def submit(self, snapshot: Snapshot) -> bool:
        """Queue `snapshot` to be published; False, queuing nothing, once the service is stopping or
        while MAX_PENDING_CHECKPOINTS of its partition are pending (the caller discards it)."""
        with self._lock:  # queued under the lock: never behind close()'s end marker
            if self._closed or self._pending[snapshot.partition] >= MAX_PENDING_CHECKPOINTS:
                return False
            self._pending[snapshot.partition] += 1
            self._queue.put((self._owner[snapshot.partition], snapshot))
        return True

    def finished(self, partition: int) -> list[Published]:
        """The publications of `partition` that ended since the last call, oldest first."""
        with self._lock:
            return self._finished.pop(partition, [])

    def forget(self, partition: int) -> None:
        """The partition's processor is gone (Kafka mode released it): publications of its snapshots
        that end from now on are not handed to a later owner in this process, which announces its own."""
        with self._lock:
            self._owner[partition] += 1
            self._finished.pop(partition, None)

    def close(self, wait_s: float = CHECKPOINT_DRAIN_S) -> int:
        """Take no more snapshots and wait up to `wait_s` for those pending; returns how many are
        still unpublished, and says so. Their scratch folders are cleared when the service next
        starts, and what they uploaded is swept as orphans once below the recovery floor."""
        with self._lock:
            already, self._closed = self._closed, True
            self._queue.put(None)
        self._thread.join(wait_s)
        with self._lock:
            unpublished = sum(self._pending.values())
        if unpublished and not already:
            log.warning("%d checkpoints left unpublished: the object store did not take them in time", unpublished)
        return unpublished

    def _run(self) -> None:
        checkpoints: Checkpoints | None = None
        try:
            while (queued := self._queue.get()) is not None:
                owner, snapshot = queued
                try:
                    if checkpoints is None:  # opened here, and again after a failed open
                        checkpoints = self._open()
                    published = publish(checkpoints, snapshot)
                except Exception as exc:  # the thread outlives any one failure: the next take tries again
                    shutil.rmtree(snapshot.folder, ignore_errors=True)
                    published = Published(snapshot.partition, snapshot.offset, None, f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self._pending[snapshot.partition] -= 1
                    owned = owner == self._owner[snapshot.partition]
                    if owned:
                        self._finished[snapshot.partition].append(published)
                if checkpoints is not None and owned:  # a released partition's new owner retires its own
                    retire(checkpoints, published)
        finally:
            if checkpoints is not None:
                checkpoints.close()
