"""Taking, publishing, restoring and retiring checkpoints.

Take: a RocksDB checkpoint of the projection into a scratch folder, its files and
then its manifest put into the object store under a prefix unique to this take
(two owners of one partition during a rebalance may both take one: each is a
valid state of the same offset, and neither overwrites the other), then the
entry published to the catalog — only then does it count. Older checkpoints
beyond the retained count are retired: first out of the catalog (so the recovery
floor moves up), then their objects deleted.

Restore: the entry's files fetched into a scratch folder and verified against the
manifest (size and SHA-256 of each file) before the projection is used. Opening it
writable migrates a checkpoint taken by an older processor (projections/migration.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from keyload.catalog import CatalogEntry, CheckpointCatalog, recovery_floor
from keyload.object_store import ObjectStore, ObjectStoreError
from keyload.projections.store import CHECKPOINT_DB, MANIFEST, Manifest, Store, StoreError, verify_checkpoint
from keyload.version import __version__

PROCESSOR_VERSION = __version__
DEFAULT_RETAINED_CHECKPOINTS = 3  # per partition: the recovery set
DEFAULT_CHECKPOINT_EVERY_RECORDS = 100_000  # periodic checkpoint after this many applied records ...
DEFAULT_CHECKPOINT_INTERVAL_S = 600.0  # ... or this long after the last one, when anything was applied


class CheckpointError(Exception):
    """A checkpoint cannot be found, fetched or verified."""


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When the runtime takes a checkpoint by itself (a Checkpoint command always takes one)."""

    every_records: int = DEFAULT_CHECKPOINT_EVERY_RECORDS
    interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    retain: int = DEFAULT_RETAINED_CHECKPOINTS

    def __post_init__(self) -> None:
        assert self.every_records >= 1 and self.interval_s > 0 and self.retain >= 1


class Checkpoints:
    def __init__(
        self,
        objects: ObjectStore,
        catalog: CheckpointCatalog,
        scratch: Path,
        policy: CheckpointPolicy | None = None,
    ) -> None:
        self.objects = objects
        self.catalog = catalog
        self.scratch = scratch
        self.policy = policy or CheckpointPolicy()

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def take(self, store: Store, partition: int) -> CatalogEntry:
        """Checkpoint the projection at its applied offset, store it, publish it, retire the oldest."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        local = Path(tempfile.mkdtemp(dir=self.scratch, prefix=f"take-p{partition}-"))
        try:
            target = local / "checkpoint"
            manifest = store.checkpoint(target, partition, PROCESSOR_VERSION)
            prefix = f"checkpoints/p-{partition:04d}/{manifest.offset:020d}/{os.urandom(8).hex()}/"
            for file in manifest.files:
                self.objects.put_if_absent(f"{prefix}{CHECKPOINT_DB}/{file.name}", target / CHECKPOINT_DB / file.name)
            self.objects.put_if_absent(prefix + MANIFEST, target / MANIFEST)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        entry = CatalogEntry(manifest, prefix)
        self.catalog.publish(entry)
        self.retire_beyond(partition)
        return entry

    def retire_beyond(self, partition: int) -> list[CatalogEntry]:
        """Retire all but the newest `retain` checkpoints of the partition."""
        entries = self.catalog.entries(partition)
        retired = entries[: max(0, len(entries) - self.policy.retain)]
        for entry in retired:
            self.catalog.retire(entry.partition, entry.offset)
            for stored in list(self.objects.list(entry.object_prefix)):
                self.objects.delete(stored.key, stored.version)
        return retired

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
        except (ObjectStoreError, StoreError) as exc:
            raise CheckpointError(f"checkpoint {entry.key} cannot be restored: {exc}") from exc
        try:
            if manifest != entry.manifest:
                raise CheckpointError(f"checkpoint {entry.key}: stored manifest differs from the catalog's")
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(local / CHECKPOINT_DB, into, dirs_exist_ok=True)
            return manifest
        finally:
            shutil.rmtree(local, ignore_errors=True)
