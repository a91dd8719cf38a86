"""Recovery pins, the recovery-floor guard on takes, and the sweep of unpublished uploads."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from keyload.log.kafka_log import ensure_topics
from keyload.operations.catalog import CatalogEntry, CheckpointCatalog, FileCatalog, RecoveryPin
from keyload.operations.checkpoints import CheckpointError, CheckpointPolicy, Checkpoints, partition_prefix
from keyload.operations.recovery import replay
from keyload.projections.store import Store
from keyload.service.kafka import KafkaService
from keyload.storage.datadir import DataDir, KafkaConfig
from keyload.storage.object_store import FileObjectStore, ObjectVersion

from .support import CREATE_QUEUE, Embedded, command, create_queue_body, wait_until
from .test_checkpoints import D, checkpoints_of, fill

RETAIN_ONE = CheckpointPolicy(retain=1)


class PinWatchingStore(FileObjectStore):
    """A real file object store that notes the partition's pins each time an object is fetched."""

    def __init__(self, root: Path, catalog: CheckpointCatalog, partition: int) -> None:
        super().__init__(root)
        self.catalog = catalog
        self.partition = partition
        self.pins_seen: list[list[RecoveryPin]] = []

    def get(self, key: str, into: Path, version: str | None = None) -> ObjectVersion:
        self.pins_seen.append(self.catalog.pins(self.partition))
        return super().get(key, into, version)


@pytest.fixture
def queued(embedded: Embedded) -> Embedded:
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("q")))
    return embedded


def digest_of_restore(checkpoints: Checkpoints, partition: int, offset: int, into: Path) -> str:
    checkpoints.restore(checkpoints.find(partition, offset), into)
    store = Store(into)
    try:
        return store.digest()
    finally:
        store.close()


def test_a_pinned_checkpoint_outlives_retention_until_released(queued: Embedded, tmp_path: Path) -> None:
    checkpoints = checkpoints_of(queued, tmp_path, RETAIN_ONE)
    partition = queued.partition(D)
    fill(queued, 3)
    old = checkpoints.take(queued.store(D), partition)
    old_digest = queued.digest(D)
    with checkpoints.pinned(old, "drill-p0-test") as entry:
        assert entry == old and checkpoints.catalog.pins(partition) == [
            RecoveryPin(partition, old.offset, "drill-p0-test")
        ]
        fill(queued, 3)
        middle = checkpoints.take(queued.store(D), partition)
        fill(queued, 3)
        newest = checkpoints.take(queued.store(D), partition)
        # retain=1 keeps the newest and the pinned one; the floor stays at the pinned one.
        assert [e.offset for e in checkpoints.entries(partition)] == [old.offset, newest.offset]
        assert checkpoints.floor(partition) == old.offset
        assert list(checkpoints.objects.list(middle.object_prefix)) == []
        assert digest_of_restore(checkpoints, partition, old.offset, tmp_path / "old") == old_digest
    assert checkpoints.catalog.pins(partition) == []
    fill(queued, 3)
    latest = checkpoints.take(queued.store(D), partition)
    assert [e.offset for e in checkpoints.entries(partition)] == [latest.offset]
    assert list(checkpoints.objects.list(old.object_prefix)) == []


def put_by_hand(objects: FileObjectStore, prefix: str, scratch: Path) -> None:
    """Two objects under a take prefix, as a process that died before publishing leaves them."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "bytes").write_bytes(prefix.encode())
    for name in ("db/CURRENT", "manifest.json"):
        objects.put_if_absent(prefix + name, scratch / "bytes")


def test_a_take_below_the_floor_is_refused_and_unpublished_uploads_below_it_are_swept(
    queued: Embedded, tmp_path: Path
) -> None:
    checkpoints = checkpoints_of(queued, tmp_path, RETAIN_ONE)
    objects = checkpoints.objects
    assert isinstance(objects, FileObjectStore)
    partition = queued.partition(D)
    fill(queued, 3)
    old = checkpoints.take(queued.store(D), partition)
    zombie = tmp_path / "zombie"  # an owner that lost the partition and is still at the old offset
    checkpoints.restore(old, zombie)
    fill(queued, 3)
    floor = checkpoints.take(queued.store(D), partition)
    assert checkpoints.floor(partition) == floor.offset > old.offset
    stale = Store(zombie)
    try:
        with pytest.raises(CheckpointError, match=f"offset {old.offset} is below the recovery floor {floor.offset}"):
            checkpoints.take(stale, partition)
    finally:
        stale.close()
    assert list(objects.list(f"{partition_prefix(partition)}{old.offset:020d}/")) == []
    assert [e.offset for e in checkpoints.entries(partition)] == [floor.offset]
    # Unpublished uploads: below the floor (an orphan), at it and above it (takes that may still publish).
    prefix = partition_prefix(partition)
    orphan, at_floor, above = (f"{prefix}{offset:020d}/{uuid.uuid4().hex[:16]}/" for offset in (1, floor.offset, 99))
    for take_prefix in (orphan, at_floor, above):
        put_by_hand(objects, take_prefix, tmp_path / "uploads")
    before = {v.key for v in objects.list(prefix)}
    assert checkpoints.sweep_orphans(1 - partition) == 0  # nothing published there: no floor, no sweep
    assert checkpoints.sweep_orphans(partition) == 2
    assert {v.key for v in objects.list(prefix)} == {k for k in before if not k.startswith(orphan)}
    assert len(list(objects.list(floor.object_prefix))) == len(floor.manifest.files) + 1
    assert checkpoints.sweep_orphans(partition) == 0


def test_replay_from_a_checkpoint_pins_it_while_fetching(
    queued: Embedded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = queued.partition(D)
    fill(queued, 3)
    taken = queued.checkpoints.take(queued.store(D), partition)
    fill(queued, 2)
    watching = PinWatchingStore(queued.data.root / "objects", queued.data.catalog(), partition)
    # replay opens the data directory's checkpoints itself: hand it ones over the watching store.
    monkeypatch.setattr(
        DataDir, "checkpoints", lambda data, policy=None: Checkpoints(watching, data.catalog(), tmp_path / "scratch")
    )
    replayed = replay(queued.data, partition, tmp_path / "replay", from_offset=taken.offset + 1, progress=False)
    assert replayed.digest == queued.digest(D)
    assert len(watching.pins_seen) == len(taken.manifest.files) + 1
    for pins in watching.pins_seen:
        [pin] = pins
        assert (pin.partition, pin.offset) == (partition, taken.offset) and pin.session.startswith(
            f"replay-p{partition}-"
        )
    assert watching.catalog.pins(partition) == []


@pytest.fixture
def kafka_data(kafka_bootstrap: str, tmp_path: Path) -> DataDir:
    data = DataDir.create(
        tmp_path / "kafka-data", 2, kafka=KafkaConfig(kafka_bootstrap, f"pins-{uuid.uuid4().hex[:8]}")
    )
    ensure_topics(data.kafka_settings())
    return data


def own(data: DataDir, checkpoints: Checkpoints, partition: int) -> None:
    """Run a processor service until it owns `partition` (restoring it if need be), then stop it."""
    service = KafkaService(data, checkpoints, tick_interval_ms=3_600_000)
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        wait_until(lambda: partition in service.owned, 60, "the partition's assignment")
    finally:
        stop.set()
        runner.join(30)


def assert_restored_under_pin(data: DataDir, watching: PinWatchingStore, entry: CatalogEntry, digest: str) -> None:
    """Every fetch saw exactly the restore's pin on `entry`; it is released; the projection is that checkpoint."""
    assert len(watching.pins_seen) == len(entry.manifest.files) + 1
    for pins in watching.pins_seen:
        [pin] = pins
        assert (pin.partition, pin.offset) == (entry.partition, entry.offset)
        assert pin.session.startswith(f"restore-p{entry.partition}-")
    assert watching.catalog.pins(entry.partition) == []
    restored = Store(data.projection(entry.partition))
    try:
        assert (restored.applied_offset, restored.digest()) == (entry.offset, digest)
    finally:
        restored.close()


def test_a_new_owner_pins_the_checkpoint_it_restores_until_it_is_open(queued: Embedded, kafka_data: DataDir) -> None:
    partition = queued.partition(D)
    fill(queued, 3)
    watching = PinWatchingStore(kafka_data.root / "objects", kafka_data.catalog(), partition)
    checkpoints = Checkpoints(watching, kafka_data.catalog(), kafka_data.root / "scratch")  # the service closes it
    taken = checkpoints.take(queued.store(D), partition)  # as the partition's previous owner did
    own(kafka_data, checkpoints, partition)
    try:
        assert_restored_under_pin(kafka_data, watching, taken, queued.digest(D))
    finally:
        watching.catalog.close()


class RetiredBeforePinCatalog(FileCatalog):
    """A real file catalog in which another owner publishes a newer checkpoint and retires the
    candidate just before the first pin is written: the race between `latest()` and `pin()`."""

    def __init__(self, root: Path, race: Callable[[], object]) -> None:
        super().__init__(root)
        self.race: Callable[[], object] | None = race

    def pin(self, pin: RecoveryPin) -> None:
        if self.race is not None:
            race, self.race = self.race, None
            race()
        super().pin(pin)


def test_a_candidate_retired_before_its_pin_makes_the_new_owner_restore_the_newest(
    queued: Embedded, kafka_data: DataDir, tmp_path: Path
) -> None:
    partition = queued.partition(D)
    fill(queued, 3)
    objects = FileObjectStore(kafka_data.root / "objects")
    other_owner = Checkpoints(objects, FileCatalog(tmp_path / "catalog"), tmp_path / "other", RETAIN_ONE)
    old = other_owner.take(queued.store(D), partition)
    fill(queued, 3)
    newer: list[CatalogEntry] = []
    catalog = RetiredBeforePinCatalog(
        tmp_path / "catalog", lambda: newer.append(other_owner.take(queued.store(D), partition))
    )
    watching = PinWatchingStore(kafka_data.root / "objects", catalog, partition)
    own(kafka_data, Checkpoints(watching, catalog, kafka_data.root / "scratch"), partition)
    assert [e.offset for e in newer] == [e.offset for e in catalog.entries(partition)] and newer[0].offset > old.offset
    assert_restored_under_pin(kafka_data, watching, newer[0], queued.digest(D))
