"""The checkpoint catalog (files and a compacted Kafka topic), and checkpoints through them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from keyload import Client
from keyload.log.kafka_log import KafkaSettings, ensure_topics
from keyload.operations.catalog import (
    CatalogEntry,
    CatalogError,
    CheckpointCatalog,
    FileCatalog,
    KafkaCatalog,
    NotPublished,
    RecoveryPin,
    recovery_floor,
)
from keyload.operations.checkpoints import CheckpointError, CheckpointPolicy, Checkpoints
from keyload.projections.store import Manifest, ManifestFile, Store
from keyload.service.runtime import PartitionProcessor
from keyload.storage.datadir import DataDir

from .support import (
    CHECKPOINT,
    CREATE_QUEUE,
    ENQUEUE,
    Embedded,
    command,
    create_queue_body,
    enqueue_body,
    start_service,
    stop_service,
)

D = "shop"


def manifest(partition: int, offset: int) -> Manifest:
    return Manifest(partition, offset, 1_000 + offset, "test", "d" * 64, (ManifestFile("CURRENT", 16, "0" * 64),))


@pytest.fixture(params=["file", "kafka"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointCatalog]:
    if request.param == "file":
        yield FileCatalog(tmp_path / "catalog")
        return
    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    settings = KafkaSettings(bootstrap, topic_prefix=f"cat-{uuid.uuid4().hex[:8]}")
    ensure_topics(settings)
    kafka = KafkaCatalog(settings)
    yield kafka
    kafka.close()


def test_catalog_recovery_set_and_floor(catalog: CheckpointCatalog) -> None:
    assert catalog.entries(0) == [] and recovery_floor(catalog, 0) is None
    for offset in (30, 10, 20):
        catalog.publish(CatalogEntry(manifest(0, offset), f"checkpoints/p-0000/{offset}/x/"))
    catalog.publish(CatalogEntry(manifest(1, 5), "checkpoints/p-0001/5/x/"))
    assert [e.offset for e in catalog.entries(0)] == [10, 20, 30]
    assert catalog.entries(0)[0] == CatalogEntry(manifest(0, 10), "checkpoints/p-0000/10/x/")
    assert recovery_floor(catalog, 0) == 10
    catalog.retire(0, 10)
    assert [e.offset for e in catalog.entries(0)] == [20, 30]
    assert recovery_floor(catalog, 0) == 20
    assert [e.offset for e in catalog.entries(1)] == [5]


def test_catalog_pins_round_trip(catalog: CheckpointCatalog) -> None:
    for offset in (10, 20):
        catalog.publish(CatalogEntry(manifest(0, offset), f"checkpoints/p-0000/{offset}/x/"))
    catalog.publish(CatalogEntry(manifest(1, 5), "checkpoints/p-0001/5/x/"))
    odd = RecoveryPin(0, 10, "restore p0 / ../ host:1")  # no safe file name: stored under its hash
    plain = RecoveryPin(0, 20, "restore-p0-host.example-42-beef")
    other = RecoveryPin(1, 5, "replay-p1-host-7-cafe")
    for pin in (plain, odd, other, plain):  # pinning twice is harmless
        catalog.pin(pin)
    assert catalog.pins(0) == [odd, plain] and catalog.pins(1) == [other]
    # Pins are no entries: the recovery set is unchanged.
    assert [e.offset for e in catalog.entries(0)] == [10, 20] and recovery_floor(catalog, 0) == 10
    with pytest.raises(NotPublished, match="no published checkpoint at offset 15"):
        catalog.pin(RecoveryPin(0, 15, "restore-x"))
    assert issubclass(NotPublished, CatalogError) and catalog.pins(0) == [odd, plain]
    catalog.release(odd)
    catalog.release(odd)  # idempotent
    assert catalog.pins(0) == [plain]
    with pytest.raises(ValueError, match="printable ASCII"):
        RecoveryPin(0, 20, "tab\there")


def checkpoints_of(embedded: Embedded, tmp_path: Path, policy: CheckpointPolicy) -> Checkpoints:
    """Checkpoints over the deployment's object store and catalog, with a policy of the test's own."""
    return Checkpoints(embedded.checkpoints.objects, embedded.checkpoints.catalog, tmp_path / "scratch", policy)


def fill(embedded: Embedded, count: int) -> None:
    for n in range(count):
        embedded.append(D, command(D, ENQUEUE, enqueue_body("q", f"m{embedded.now_ms}-{n}")))
        embedded.now_ms += 1
    embedded.run()


def test_checkpoints_are_stored_published_restored_and_retired(embedded: Embedded, tmp_path: Path) -> None:
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("q")))
    checkpoints = checkpoints_of(embedded, tmp_path, CheckpointPolicy(retain=2))
    partition = embedded.partition(D)
    taken = []
    for _ in range(3):
        fill(embedded, 5)
        taken.append(checkpoints.take(embedded.store(D), partition))
    # Only the newest two remain published; the oldest one's objects are gone.
    assert [e.offset for e in checkpoints.entries(partition)] == [taken[1].offset, taken[2].offset]
    assert checkpoints.floor(partition) == taken[1].offset
    assert list(checkpoints.objects.list(taken[0].object_prefix)) == []
    assert len(list(checkpoints.objects.list(taken[2].object_prefix))) == len(taken[2].manifest.files) + 1
    # A restore is verified and holds exactly the checkpointed state.
    restored = tmp_path / "restored"
    assert checkpoints.restore(taken[2], restored) == taken[2].manifest
    store = Store(restored)
    try:
        assert (store.applied_offset, store.digest()) == (taken[2].offset, embedded.digest(D))
    finally:
        store.close()
    with pytest.raises(CheckpointError, match="not empty"):
        checkpoints.restore(taken[2], restored)
    # A damaged object is caught before use: by the store, which checks what it reads against the
    # SHA-256 the object was stored with (as S3's does); a local copy against the manifest (test_store).
    damaged = next(v for v in checkpoints.objects.list(taken[1].object_prefix) if v.key.endswith("CURRENT"))
    damaged_path = Path(checkpoints.objects.root) / (damaged.key + "~") / damaged.version  # type: ignore[attr-defined]
    damaged_path.write_bytes(b"garbage\n")
    with pytest.raises(CheckpointError, match="bytes do not match their SHA-256"):
        checkpoints.restore(taken[1], tmp_path / "from-damaged")


def test_the_runtime_checkpoints_by_itself_every_n_records(embedded: Embedded, tmp_path: Path) -> None:
    partition = embedded.partition(D)
    checkpoints = checkpoints_of(embedded, tmp_path, CheckpointPolicy(every_records=5))
    processor = PartitionProcessor(
        partition, embedded.data.partitions, embedded.log, embedded.store(D), checkpoints=checkpoints
    )
    embedded.processors[partition] = processor
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("q")))
    fill(embedded, 11)  # one group of 12 records: a checkpoint at its end
    fill(embedded, 3)  # 3 past it: none
    assert [e.offset for e in checkpoints.entries(partition)] == [11]
    fill(embedded, 2)  # 5 past it
    assert [e.offset for e in checkpoints.entries(partition)] == [11, 16]
    # A Checkpoint command takes one at its own offset whatever the count.
    offset = embedded.append(D, command(D, CHECKPOINT, {}))
    embedded.run()
    assert [e.offset for e in checkpoints.entries(partition)] == [11, 16, offset]


def test_a_service_restarted_more_often_than_its_interval_still_takes_its_first_checkpoint(tmp_path: Path) -> None:
    """`keyload run --checkpoint-interval-s 3` stopped about a second after each start (a crash loop,
    frequent redeploys): no lifetime lasts the interval, yet the partition's first checkpoint is taken,
    since while none is published the interval counts from the log time of its first record."""
    root = tmp_path / "data"
    DataDir.create(root, 1)
    lifetimes = 0
    while not _published(root):
        assert lifetimes < 8, "no checkpoint after 8 lifetimes"
        service = start_service(root, "--checkpoint-interval-s", "3", "--listen", "none")
        with Client(root) as client:  # a commit: what a periodic checkpoint is taken at
            client.enqueue("acme", "jobs", b"x") if lifetimes else client.create_queue("acme", "jobs")
        time.sleep(1)
        assert stop_service(service, 30) == 0  # a publication in progress is waited for
        lifetimes += 1


def _published(root: Path) -> bool:
    catalog = DataDir.open(root).catalog()
    try:
        return bool(catalog.entries(0))
    finally:
        catalog.close()
