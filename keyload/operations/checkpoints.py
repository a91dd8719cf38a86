"""Taking, publishing, restoring and retiring checkpoints.

Take: a RocksDB checkpoint of the projection into a scratch folder (a snapshot: hard
links, on the thread that applies), then, on any thread, its manifest written, its files and
then its manifest put into the object store under a prefix unique to this take
(two owners of one partition during a rebalance may both take one: each is a
valid state of the same offset, and neither overwrites the other), then the
entry published to the catalog — only then does it count. Older checkpoints
beyond the retained count are retired: first out of the catalog (so the recovery
floor moves up), then their objects deleted. A pinned checkpoint is never
retired, so the floor stays at or below every pinned one; and a take below the
floor is refused, so an upload below the floor that is not published never will
be — `sweep_orphans` deletes such leftovers of processes that died mid-take.

Restore: the entry's files fetched into a scratch folder and verified against the
manifest (size and SHA-256 of each file) before the projection is used. Opening it
writable migrates a checkpoint taken by an older processor (projections/migration.py).
A restore holds a pin on its entry (`pinned`) until the restored projection is open.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from keyload.credentials import Credential
from keyload.errors import KeyloadError
from keyload.log.base import CommandLog
from keyload.operations.catalog import CatalogEntry, CheckpointCatalog, RecoveryPin, recovery_floor
from keyload.projections.store import (
    CHECKPOINT_DB,
    MANIFEST,
    Manifest,
    Store,
    StoreError,
    describe_checkpoint,
    verify_checkpoint,
)
from keyload.service.system_commands import system_command
from keyload.storage.object_store import ObjectStore, ObjectStoreError, ObjectStoreUnavailable, ObjectVersion
from keyload.version import __version__

PROCESSOR_VERSION = __version__
DEFAULT_RETAINED_CHECKPOINTS = 3  # per partition: the recovery set
DEFAULT_CHECKPOINT_EVERY_RECORDS = 100_000  # periodic checkpoint after this many applied records ...
DEFAULT_CHECKPOINT_INTERVAL_S = 600.0  # ... or this long after the last one, when anything was applied


class CheckpointError(KeyloadError):
    """A checkpoint cannot be found, fetched, verified or (below the recovery floor) published."""


class CheckpointDamaged(CheckpointError):
    """A published checkpoint's objects are missing or not the bytes it was published with: no
    restore can use it (unlike an object store that does not answer, which may serve it later)."""


def recovery_session(purpose: str, partition: int) -> str:
    """A pin session naming its holder: `PURPOSE-pP-HOST-PID-RANDOM` (at most 128 printable ASCII)."""
    host = "".join(c for c in socket.gethostname() if " " < c <= "~")[:64] or "host"
    return f"{purpose}-p{partition}-{host}-{os.getpid()}-{os.urandom(4).hex()}"


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When the runtime takes a checkpoint by itself (a Checkpoint command always takes one)."""

    every_records: int = DEFAULT_CHECKPOINT_EVERY_RECORDS
    interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    retain: int = DEFAULT_RETAINED_CHECKPOINTS

    def __post_init__(self) -> None:
        assert self.every_records >= 1 and self.interval_s > 0 and self.retain >= 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A partition's projection as of `offset`, checkpointed into `folder` and not yet stored or
    published (`Checkpoints.snapshot`, then `Checkpoints.publish` or `discard`)."""

    partition: int
    offset: int
    folder: Path


def partition_prefix(partition: int) -> str:
    """Where a partition's checkpoint objects live: a take's are under `PREFIX + OFFSET/RANDOM/`."""
    return f"checkpoints/p-{partition:04d}/"


class Checkpoints:
    def __init__(
        self,
        objects: ObjectStore | None,
        catalog: CheckpointCatalog,
        scratch: Path,
        policy: CheckpointPolicy | None = None,
        *,
        open_objects: Callable[[], ObjectStore] | None = None,
    ) -> None:
        """The object store is `objects`, or the one `open_objects` opens at its first use: what
        needs only the catalog and the scratch folder (a service starting, a snapshot, a status)
        then never waits on an object store that does not answer."""
        assert (objects is None) != (open_objects is None)
        self._objects = objects
        self._open_objects = open_objects
        self.catalog = catalog
        self.scratch = scratch
        self.policy = policy or CheckpointPolicy()

    @property
    def objects(self) -> ObjectStore:
        if self._objects is None:
            assert self._open_objects is not None
            self._objects = self._open_objects()
        return self._objects

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def clear_abandoned_takes(self) -> int:
        """Delete the scratch folders of takes a killed service left behind; returns how many.

        They hold hard links to projection files RocksDB has since deleted, so the
        space stays used until they go. Only the serving process takes
        checkpoints, so at its start none is in progress.
        """
        abandoned = list(self.scratch.glob("take-p*")) if self.scratch.is_dir() else []
        for folder in abandoned:
            shutil.rmtree(folder, ignore_errors=True)
        return len(abandoned)

    def take(self, store: Store, partition: int) -> CatalogEntry:
        """Checkpoint the projection at its applied offset, store it, publish it, retire the oldest."""
        entry = self.publish(self.snapshot(store, partition))
        self.retire_beyond(partition)
        return entry

    def snapshot(self, store: Store, partition: int) -> Snapshot:
        """The first half of a take, on the thread that applies to `store`: a RocksDB checkpoint in
        a scratch folder of its own (`take-pP-…`, which `clear_abandoned_takes` clears)."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(dir=self.scratch, prefix=f"take-p{partition}-"))
        try:
            store.snapshot(folder / "checkpoint")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return Snapshot(partition, store.applied_offset, folder)

    def discard(self, snapshot: Snapshot) -> None:
        shutil.rmtree(snapshot.folder, ignore_errors=True)

    def publish(self, snapshot: Snapshot) -> CatalogEntry:
        """The second half of a take, on any thread: describe the snapshot, store it, publish it.
        Its scratch folder is gone afterwards, whatever happened. Retiring the oldest
        (`retire_beyond`) is the caller's next step, apart: a publication is announced without
        waiting for it (on Kafka it reads the catalog topic again, about a second), and a
        retirement that fails leaves the publication standing.

        A checkpoint below the recovery floor is refused (CheckpointError, its objects
        deleted again): a zombie owner must not publish an old state once newer
        checkpoints were retired, as the log below the floor may be gone. The floor is
        checked after the upload and before the publication, not atomically with it: a
        retirement in between can still let one such checkpoint through, and a
        `sweep_orphans` in that window may have deleted its objects (its restore then
        fails verification, and the restoring owner replays without it).
        """
        partition = snapshot.partition
        try:
            target = snapshot.folder / "checkpoint"
            manifest = describe_checkpoint(target, partition, PROCESSOR_VERSION)
            prefix = f"{partition_prefix(partition)}{manifest.offset:020d}/{os.urandom(8).hex()}/"
            uploaded = [
                self.objects.put_if_absent(f"{prefix}{CHECKPOINT_DB}/{file.name}", target / CHECKPOINT_DB / file.name)
                for file in manifest.files
            ]
            uploaded.append(self.objects.put_if_absent(prefix + MANIFEST, target / MANIFEST))
        finally:
            self.discard(snapshot)
        floor = self.floor(partition)
        if floor is not None and manifest.offset < floor:
            self._delete(uploaded)
            raise CheckpointError(
                f"partition {partition}: a checkpoint at offset {manifest.offset} is below the recovery floor {floor}"
            )
        entry = CatalogEntry(manifest, prefix)
        self.catalog.publish(entry)
        return entry

    def retire_beyond(self, partition: int) -> list[CatalogEntry]:
        """Retire all but the newest `retain` checkpoints and the pinned ones, oldest first.

        Each leaves the catalog before its objects are deleted, so no reader finds a
        published entry without objects. The pins are read again after retiring: a pin
        written meanwhile found its entry still published (the pin checks after writing),
        so that entry is published again and keeps its objects.
        """
        entries = self.catalog.entries(partition)
        pinned = self._pinned_offsets(partition)
        candidates = [e for e in entries[: max(0, len(entries) - self.policy.retain)] if e.offset not in pinned]
        for entry in candidates:
            self.catalog.retire(entry.partition, entry.offset)
        pinned_meanwhile = self._pinned_offsets(partition) if candidates else set()
        retired = []
        for entry in candidates:
            if entry.offset in pinned_meanwhile:
                self.catalog.publish(entry)
            else:
                self._delete(self.objects.list(entry.object_prefix))
                retired.append(entry)
        return retired

    def sweep_orphans(self, partition: int) -> int:
        """Delete the objects of takes that were uploaded but never published; return how many.

        Only takes below the recovery floor (which can never be published any more) and
        not pinned: an upload at or above the floor may be a take still in progress. With
        nothing published there is no floor and nothing is swept.
        """
        floor = self.floor(partition)
        if floor is None:
            return 0
        published = {entry.object_prefix for entry in self.catalog.entries(partition)}
        pinned = self._pinned_offsets(partition)
        orphans = []
        for stored in self.objects.list(partition_prefix(partition)):
            parts = stored.key.split("/")
            if len(parts) < 5 or not parts[2].isdigit():
                continue  # not an object of a take
            take_prefix = "/".join(parts[:4]) + "/"
            offset = int(parts[2])
            if take_prefix not in published and offset < floor and offset not in pinned:
                orphans.append(stored)
        return self._delete(orphans)

    @contextmanager
    def pinned(self, entry: CatalogEntry, session: str) -> Iterator[CatalogEntry]:
        """Hold a pin on `entry` while the block runs, so retention keeps it and its objects.

        NotPublished (a CatalogError) when the entry was retired before the pin took hold.
        """
        pin = RecoveryPin(entry.partition, entry.offset, session)
        self.catalog.pin(pin)
        try:
            yield entry
        finally:
            self.catalog.release(pin)

    def _pinned_offsets(self, partition: int) -> set[int]:
        return {pin.offset for pin in self.catalog.pins(partition)}

    def _delete(self, versions: Iterable[ObjectVersion]) -> int:
        """Delete exactly these object versions; the number actually deleted."""
        return sum(self.objects.delete(stored.key, stored.version) for stored in list(versions))

    def entries(self, partition: int) -> list[CatalogEntry]:
        return self.catalog.entries(partition)

    def latest(self, partition: int) -> CatalogEntry | None:
        entries = self.catalog.entries(partition)
        return entries[-1] if entries else None

    def find(self, partition: int, offset: int) -> CatalogEntry:
        entries = self.catalog.entries(partition)
        for entry in entries:
            if entry.offset == offset:
                return entry
        have = ", ".join(str(e.offset) for e in entries) or "none"
        raise CheckpointError(f"partition {partition} has no checkpoint at offset {offset} (published: {have})")

    def floor(self, partition: int) -> int | None:
        return recovery_floor(self.catalog, partition)

    def restore(self, entry: CatalogEntry, into: Path) -> Manifest:
        """Fetch and verify a published checkpoint into an empty folder, as a writable projection."""
        if into.exists() and any(into.iterdir()):
            raise CheckpointError(f"{into} is not empty")
        self.scratch.mkdir(parents=True, exist_ok=True)
        local = Path(tempfile.mkdtemp(dir=self.scratch, prefix=f"restore-p{entry.partition}-"))
        try:
            self.objects.get(entry.object_prefix + MANIFEST, local / MANIFEST)
            for file in entry.manifest.files:
                key = f"{entry.object_prefix}{CHECKPOINT_DB}/{file.name}"
                self.objects.get(key, local / CHECKPOINT_DB / file.name)
            manifest = verify_checkpoint(local)
        except ObjectStoreUnavailable as exc:
            raise CheckpointError(f"checkpoint {entry.key} cannot be restored now: {exc}") from exc
        except (ObjectStoreError, StoreError) as exc:  # an answer: missing, or not the published bytes
            raise CheckpointDamaged(f"checkpoint {entry.key} cannot be restored: {exc}") from exc
        try:
            if manifest != entry.manifest:
                raise CheckpointDamaged(f"checkpoint {entry.key}: stored manifest differs from the catalog's")
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(local / CHECKPOINT_DB, into, dirs_exist_ok=True)
            return manifest
        finally:
            shutil.rmtree(local, ignore_errors=True)


class Announcer:
    """Records each checkpoint the service publishes in its partition's log (CheckpointPublished),
    signed by the checkpoint publisher's principal: with access control on, the recovery floor may
    name only a checkpoint a partition recorded so (processors/payloads/retention.py)."""

    def __init__(self, log: CommandLog, credential: Credential) -> None:
        self.log = log
        self.credential = credential

    def __call__(self, partition: int, entry: CatalogEntry) -> None:
        offset = entry.manifest.offset
        body = {
            "offset": offset,
            "manifest_sha256": hashlib.sha256(entry.manifest.to_json().encode("utf-8")).digest(),
        }
        record = system_command(
            self.credential,
            "CheckpointPublished",
            body,
            partition=partition,
            partitions=self.log.partitions,
            command_id=f"checkpoint-published-p{partition}-{offset}",
        )
        self.log.append(partition, [record])
