"""The object-store contract, the same for both backends: the versioned folder and S3 (a real server process)."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from keyload.credentials import ADMIN_PRINCIPAL, Credential, contents
from keyload.log.codec import REGISTRY
from keyload.operations.catalog import FileCatalog
from keyload.operations.checkpoints import CheckpointPolicy, Checkpoints, Snapshot
from keyload.projections.store import Store
from keyload.sdk.client import Client
from keyload.service.checkpoint_uploads import CheckpointUploads, Published
from keyload.storage.datadir import DataDir, S3StoreConfig
from keyload.storage.object_store import (
    MIN_PART_BYTES,
    FileObjectStore,
    ObjectConflict,
    ObjectCorrupt,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    ObjectVersion,
    S3ObjectStore,
)

from .s3 import HangingEndpoint, S3Endpoint
from .support import (
    COMMAND,
    CREATE_QUEUE,
    ENQUEUE,
    Embedded,
    bearer,
    command,
    create_queue_body,
    enqueue_body,
    free_port,
    records_from,
    served_url,
    start_service,
    stop_service,
    wait_until,
)

HUNG_STORE_ANSWER_S = 20.0  # far below boto3's own give-up time against a store that never answers


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "file":
        yield FileObjectStore(tmp_path / "objects")
        return
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    yield endpoint.fresh_store()


BIG_PART = b"\x01" * MIN_PART_BYTES


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(store: ObjectStore, key: str, *parts: bytes, declared: str | None = None) -> str:
    """An unfinished upload of `parts`, declaring their SHA-256 unless told otherwise."""
    upload_id = store.begin_upload(key, declared or sha256(b"".join(parts)))
    for number, part in enumerate(parts, 1):
        store.upload_part(key, upload_id, number, part)
    return upload_id


def test_multipart_upload_creates_once_like_put(store: ObjectStore, tmp_path: Path) -> None:
    data = BIG_PART + b"tail"
    upload_id = upload(store, "big", b"first try", b"tail", declared=sha256(data))
    store.upload_part("big", upload_id, 1, BIG_PART)  # uploading a part number again replaces it
    assert store.uploads("big") == [upload_id]
    created = store.complete_upload("big", upload_id, 2)
    assert (created.key, created.etag, created.length) == ("big", sha256(data), len(data))
    assert store.uploads("big") == [] and store.head("big") == created
    assert store.get("big", tmp_path / "out") == created and (tmp_path / "out").read_bytes() == data
    # The same bytes again return the existing version and drop the upload; other bytes conflict.
    again = upload(store, "big", BIG_PART, b"tail")
    assert store.complete_upload("big", again, 2) == created
    other = upload(store, "big", BIG_PART, b"other tail")
    with pytest.raises(ObjectConflict):
        store.complete_upload("big", other, 2)
    assert store.uploads("big") == [] and store.versions("big") == [created]
    # A put of the same bytes finds the multipart object.
    assert store.put_if_absent("big", write(tmp_path / "same", data)) == created


def test_multipart_upload_refuses_bytes_it_was_not_promised(store: ObjectStore) -> None:
    upload_id = upload(store, "k", BIG_PART, b"tail", declared=sha256(b"something else"))
    with pytest.raises(ObjectCorrupt):
        store.complete_upload("k", upload_id, 2)
    assert store.head("k") is None and store.versions("k") == [] and store.uploads("k") == []


def test_multipart_upload_needs_every_part_and_big_ones(store: ObjectStore) -> None:
    with pytest.raises(ObjectStoreError, match="SHA-256"):
        store.begin_upload("k", "not a digest")
    upload_id = upload(store, "k", b"small", b"tail", declared=sha256(BIG_PART + b"tail"))
    with pytest.raises(ObjectStoreError, match="smaller than"):
        store.complete_upload("k", upload_id, 2)
    with pytest.raises(ObjectStoreError, match="missing"):
        store.complete_upload("k", upload_id, 3)
    with pytest.raises(ObjectStoreError, match="part numbers"):
        store.upload_part("k", upload_id, 0, b"x")
    # Those failures keep the upload: the writer fixes it and completes.
    assert store.uploads("k") == [upload_id]
    store.upload_part("k", upload_id, 1, BIG_PART)
    assert store.complete_upload("k", upload_id, 2).etag == sha256(BIG_PART + b"tail")
    with pytest.raises(ObjectStoreError, match="no upload"):
        store.complete_upload("k", upload_id, 2)
    with pytest.raises(ObjectStoreError):  # S3 says NoSuchUpload; moto 5 fails with a 500
        store.upload_part("k", upload_id, 1, b"x")


def test_abort_is_idempotent_and_leaves_objects_alone(store: ObjectStore, tmp_path: Path) -> None:
    written = store.put_if_absent("k", write(tmp_path / "v", b"v"))
    first = upload(store, "k", b"one")
    second = upload(store, "k", b"two")
    nested = upload(store, "k/deeper", b"three")
    assert set(store.uploads("k")) == {first, second} and store.uploads("k") == store.uploads("k")
    assert [v.key for v in store.list("")] == ["k"]  # an upload is no object
    store.abort_upload("k", first)
    store.abort_upload("k", first)
    assert store.uploads("k") == [second]
    # A delete of the last version leaves an upload in progress alone, and the other way round.
    assert store.delete("k", written.version) is True
    assert store.uploads("k") == [second]
    store.abort_upload("k", second)
    store.abort_upload("k", "no-such-upload")
    assert store.uploads("k") == [] and store.uploads("k/deeper") == [nested]
    assert store.head("k") is None and list(store.list("")) == []


def write_late(store: ObjectStore, key: str, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a writer racing a create can leave: a second version of the key."""
    if isinstance(store, S3ObjectStore):  # one whose write was not conditional (S3 before conditional writes)
        store.client.put_object(Bucket=store.bucket, Key=key, Body=data, Metadata={"sha256": sha256(data)})
        return
    real_head = store.head
    # Both its HEADs, before and under the folder's lock, ran before the other version was linked:
    # what a writer that took no lock (keyload before it took one) could leave.
    stale = iter([None, None])
    monkeypatch.setattr(store, "head", lambda key: next(stale, real_head(key)))
    store.put_if_absent(key, write(tmp_path / "late", data))
    monkeypatch.undo()


def test_versions_lists_every_version_of_exactly_the_key(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert store.versions("k") == []
    first = store.put_if_absent("k", write(tmp_path / "one", b"one"))
    store.put_if_absent("k/nested", write(tmp_path / "nested", b"nested"))
    store.put_if_absent("k2", write(tmp_path / "k2", b"k2"))
    assert store.delete("k", first.version)
    second = store.put_if_absent("k", write(tmp_path / "two", b"two"))
    assert store.versions("k") == [second]
    # A late writer's version is listed too, oldest first, so a collector deletes both.
    write_late(store, "k", b"three", tmp_path, monkeypatch)
    third = store.head("k")
    assert third is not None and third.etag == sha256(b"three")
    assert store.versions("k") == [second, third]
    assert [store.verify("k", v.version) for v in store.versions("k")] == [second, third]
    assert store.version_ids("k") == [second.version, third.version]


def test_a_version_another_writer_left_in_a_key_is_listed_by_id_and_deleted(
    s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    """A collector empties a key whoever wrote into it: a version without this store's SHA-256
    metadata cannot be described (`versions`), but `version_ids` lists it and `delete` removes it."""
    store = s3_endpoint.fresh_store(prefix="kl")
    ours = store.put_if_absent("payloads/k", write(tmp_path / "ours", b"ours"))
    store.client.put_object(Bucket=store.bucket, Key="kl/payloads/k", Body=b"theirs")
    ids = store.version_ids("payloads/k")
    assert len(ids) == 2 and ids[0] == ours.version
    with pytest.raises(ObjectStoreError, match="not ours"):
        store.versions("payloads/k")
    assert [store.delete("payloads/k", version) for version in ids] == [True, True]
    assert store.version_ids("payloads/k") == [] and store.head("payloads/k") is None


def test_verify_reads_the_bytes(store: ObjectStore, tmp_path: Path) -> None:
    written = store.put_if_absent("k", write(tmp_path / "v", b"trusted"))
    assert store.verify("k", written.version) == written
    store.delete("k", written.version)
    with pytest.raises(ObjectStoreError, match="no version"):
        store.verify("k", written.version)


def test_deleting_an_object_leaves_no_empty_folders_of_its_key(tmp_path: Path) -> None:
    """A retired checkpoint's objects (`checkpoints/p-0001/OFFSET/ID/db/…`) leave nothing behind in a
    folder store; folders still holding another key stay, and the store's root stays."""
    root = tmp_path / "objects"
    store = FileObjectStore(root)
    kept = store.put_if_absent("checkpoints/p-0001/200/b/db/1.sst", write(tmp_path / "kept", b"kept"))
    retired = [
        store.put_if_absent(f"checkpoints/p-0001/100/a/db/{name}", write(tmp_path / name, name.encode()))
        for name in ("1.sst", "MANIFEST")
    ]
    for version in retired:
        assert store.delete(version.key, version.version) is True
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir()) == [
        "checkpoints",
        "checkpoints/p-0001",
        "checkpoints/p-0001/200",
        "checkpoints/p-0001/200/b",
        "checkpoints/p-0001/200/b/db",
        "checkpoints/p-0001/200/b/db/1.sst~",
    ]
    assert store.delete(kept.key, kept.version) is True
    assert root.is_dir() and list(root.iterdir()) == []
    assert store.put_if_absent(kept.key, write(tmp_path / "again", b"again")).length == 5  # made again at will


def test_verify_catches_damaged_bytes_in_the_folder(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "objects")
    written = store.put_if_absent("k", write(tmp_path / "v", b"trusted"))
    (tmp_path / "objects" / "k~" / written.version).write_bytes(b"tampered")
    assert store.head("k") == ObjectVersion("k", written.version, written.etag, 8)  # metadata is not the bytes
    with pytest.raises(ObjectCorrupt):
        store.verify("k", written.version)


def test_creates_once_and_deletes_exact_versions(store: ObjectStore, tmp_path: Path) -> None:
    first = store.put_if_absent("a/b.sst", write(tmp_path / "one", b"one"))
    assert (first.key, first.etag, first.length) == ("a/b.sst", hashlib.sha256(b"one").hexdigest(), 3)
    # The same bytes again are idempotent; other bytes are a conflict and change nothing.
    assert store.put_if_absent("a/b.sst", write(tmp_path / "same", b"one")) == first
    with pytest.raises(ObjectConflict):
        store.put_if_absent("a/b.sst", write(tmp_path / "other", b"two"))
    assert store.head("a/b.sst") == first
    # A key may also be a prefix of other keys.
    nested = store.put_if_absent("a/b.sst/c", write(tmp_path / "c", b"c"))
    store.put_if_absent("ab", write(tmp_path / "ab", b"ab"))
    assert [v.key for v in store.list("a/")] == ["a/b.sst", "a/b.sst/c"]
    assert [v.key for v in store.list("a")] == ["a/b.sst", "a/b.sst/c", "ab"]
    assert list(store.list("zz/")) == []
    assert store.get("a/b.sst", tmp_path / "fetched") == first
    assert (tmp_path / "fetched").read_bytes() == b"one"
    # Deletes name a version: a repeated or stale delete never removes a newer object.
    assert store.delete("a/b.sst", first.version) is True
    assert store.delete("a/b.sst", first.version) is False
    assert store.head("a/b.sst") is None
    recreated = store.put_if_absent("a/b.sst", write(tmp_path / "again", b"other bytes now"))
    assert recreated.version != first.version
    assert (recreated.etag, recreated.length) == (hashlib.sha256(b"other bytes now").hexdigest(), 15)
    assert store.delete("a/b.sst", first.version) is False
    assert store.head("a/b.sst") == recreated
    assert store.head("a/b.sst/c") == nested


def test_get_names_a_version_and_fails_clearly_when_missing(store: ObjectStore, tmp_path: Path) -> None:
    written = store.put_if_absent("k", write(tmp_path / "v", b"\x00" * 3000 + b"end"))
    assert store.get("k", tmp_path / "out" / "deep" / "file", written.version) == written
    assert (tmp_path / "out" / "deep" / "file").read_bytes() == b"\x00" * 3000 + b"end"
    assert store.head("missing") is None
    with pytest.raises(ObjectStoreError, match="does not exist"):
        store.get("missing", tmp_path / "nothing")
    assert store.delete("k", written.version) is True
    with pytest.raises(ObjectStoreError, match="no version"):
        store.get("k", tmp_path / "gone", written.version)
    assert store.delete("missing", written.version) is False
    # An empty object is an object.
    empty = store.put_if_absent("empty", write(tmp_path / "empty", b""))
    assert (empty.length, empty.etag) == (0, hashlib.sha256(b"").hexdigest())
    assert store.get("empty", tmp_path / "empty-out") == empty


@pytest.mark.parametrize("bad", ["", "../x", "a//b", "a/../b", "/a", "a b", "x" * 513])
def test_invalid_keys_are_refused(store: ObjectStore, tmp_path: Path, bad: str) -> None:
    with pytest.raises(ObjectStoreError):
        store.head(bad)
    with pytest.raises(ObjectStoreError):
        store.put_if_absent(bad, write(tmp_path / "data", b"x"))
    with pytest.raises(ObjectStoreError):
        store.get(bad, tmp_path / "out")
    with pytest.raises(ObjectStoreError):
        store.delete(bad, "v")


def test_s3_keys_live_under_the_prefix_and_buckets_need_versioning(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    store = s3_endpoint.fresh_store(prefix="tenant/one")
    written = store.put_if_absent("a/b", write(tmp_path / "data", b"data"))
    stored = store.client.list_objects_v2(Bucket=store.bucket)["Contents"]
    assert [item["Key"] for item in stored] == ["tenant/one/a/b"]
    assert [v.key for v in store.list("")] == ["a/b"]
    # The same bucket through another prefix sees nothing of it.
    other = S3ObjectStore(store.bucket, "tenant/two", client=store.client)
    assert other.head("a/b") is None and list(other.list("")) == []
    assert S3ObjectStore(store.bucket, "tenant/one", client=store.client).head("a/b") == written
    # A bucket without versioning is refused rather than silently losing version-aware deletes.
    store.client.create_bucket(Bucket=store.bucket + "-unversioned")
    with pytest.raises(ObjectStoreError, match="versioning"):
        S3ObjectStore(store.bucket + "-unversioned", client=store.client)
    with pytest.raises(ObjectStoreError, match="opening the bucket") as absent:
        S3ObjectStore(store.bucket + "-absent", client=store.client, create_bucket=False)
    assert not isinstance(absent.value, ObjectStoreUnavailable)  # an answer: no later try changes it


def test_an_s3_store_that_does_not_answer_is_unavailable_not_missing(s3_endpoint: S3Endpoint) -> None:
    """A store nobody listens for may serve the same request later (as may one answering 5xx): it is
    ObjectStoreUnavailable, which the HTTP API answers 503, not the 410 of a payload that is gone."""
    from botocore.config import Config

    options = s3_endpoint.client_options | {"config": Config(retries={"max_attempts": 1}, connect_timeout=2)}
    with pytest.raises(ObjectStoreUnavailable, match="opening the bucket"):
        S3ObjectStore("keyload-nobody", endpoint_url=f"http://127.0.0.1:{free_port()}", **options)


def test_checkpoints_are_taken_and_restored_through_s3(
    s3_endpoint: S3Endpoint, embedded: Embedded, tmp_path: Path
) -> None:
    domain = "shop"
    embedded.append(domain, command(domain, CREATE_QUEUE, create_queue_body("q")))
    for n in range(5):
        embedded.append(domain, command(domain, ENQUEUE, enqueue_body("q", f"m{n}")))
    embedded.run()
    objects = s3_endpoint.fresh_store(prefix="keyload")
    partition = embedded.partition(domain)
    catalog = FileCatalog(tmp_path / "catalog")
    with Checkpoints(objects, catalog, tmp_path / "scratch", CheckpointPolicy(retain=1)) as cp:
        first = cp.take(embedded.store(domain), partition)
        embedded.append(domain, command(domain, ENQUEUE, enqueue_body("q", "late")))
        embedded.run()
        second = cp.take(embedded.store(domain), partition)
        # Retention deleted the first checkpoint's objects by version; the second one's are all there.
        assert list(objects.list(first.object_prefix)) == []
        assert len(list(objects.list(second.object_prefix))) == len(second.manifest.files) + 1
        restored = tmp_path / "restored"
        assert cp.restore(second, restored) == second.manifest
    store = Store(restored)
    try:
        assert (store.applied_offset, store.digest()) == (second.offset, embedded.digest(domain))
    finally:
        store.close()


def test_a_data_directory_keeps_checkpoints_in_s3(
    s3_endpoint: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keyload.json names the bucket; the credentials come from the environment, as in production."""
    for name, value in [
        ("AWS_ACCESS_KEY_ID", "keyload"),
        ("AWS_SECRET_ACCESS_KEY", "keyload"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ]:
        monkeypatch.setenv(name, value)
    bucket = s3_endpoint.fresh_store().bucket
    config = S3StoreConfig(bucket, "deployment/one", s3_endpoint.url)
    DataDir.create(tmp_path / "data", 2, object_store=config)
    data = DataDir.open(tmp_path / "data")
    assert (data.object_store_config, data.object_root) == (config, None)
    embedded = Embedded(tmp_path / "data")  # opens the directory created above
    try:
        domain = "shop"
        embedded.append(domain, command(domain, CREATE_QUEUE, create_queue_body("q")))
        embedded.append(domain, command(domain, ENQUEUE, enqueue_body("q", "m")))
        embedded.run()
        with data.checkpoints() as checkpoints:
            taken = checkpoints.take(embedded.store(domain), embedded.partition(domain))
            assert checkpoints.restore(taken, tmp_path / "restored") == taken.manifest
        objects = data.object_store()
        assert isinstance(objects, S3ObjectStore) and objects.prefix == "deployment/one/"
        assert len(list(objects.list(taken.object_prefix))) == len(taken.manifest.files) + 1
        restored = Store(tmp_path / "restored")
        try:
            assert restored.digest() == embedded.digest(domain)
        finally:
            restored.close()
    finally:
        embedded.close()


@pytest.mark.parametrize("racing_bytes", [b"mine", b"theirs"])
def test_s3_conditional_create_settles_a_race(
    s3_endpoint: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, racing_bytes: bytes
) -> None:
    """The PUT itself is conditional (If-None-Match: *): a writer whose HEAD missed another object cannot replace it."""
    store = s3_endpoint.fresh_store()
    theirs = store.put_if_absent("k", write(tmp_path / "theirs", racing_bytes))
    real_head = store.head
    stale = iter([None])  # the first HEAD ran before the other writer's PUT landed
    monkeypatch.setattr(store, "head", lambda key: next(stale, real_head(key)))
    source = write(tmp_path / "mine", b"mine")
    if racing_bytes == b"mine":
        assert store.put_if_absent("k", source) == theirs
    else:
        with pytest.raises(ObjectConflict):
            store.put_if_absent("k", source)
    versions = store.client.list_object_versions(Bucket=store.bucket)["Versions"]
    assert [v["VersionId"] for v in versions] == [theirs.version]


@pytest.mark.parametrize("racing_bytes", [BIG_PART + b"tail", b"theirs"])
def test_s3_conditional_complete_settles_a_race(
    s3_endpoint: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, racing_bytes: bytes
) -> None:
    """The complete itself is conditional (If-None-Match: *, which moto 5 honours too)."""
    store = s3_endpoint.fresh_store()
    upload_id = upload(store, "k", BIG_PART, b"tail")
    theirs = store.put_if_absent("k", write(tmp_path / "theirs", racing_bytes))
    real_head = store.head
    stale = iter([None])  # the HEAD before completing ran before the other writer's PUT landed
    monkeypatch.setattr(store, "head", lambda key: next(stale, real_head(key)))
    if racing_bytes == BIG_PART + b"tail":
        assert store.complete_upload("k", upload_id, 2) == theirs
    else:
        with pytest.raises(ObjectConflict):
            store.complete_upload("k", upload_id, 2)
    assert store.versions("k") == [theirs] and store.uploads("k") == []


def test_writers_of_the_same_bytes_at_once_make_one_version(store: ObjectStore, tmp_path: Path) -> None:
    """The conditional create under concurrent writers of the same key (an upload sent twice at once):
    every writer gets the one version made, so nothing is left that no reservation names."""
    data = b"same bytes " * 10_000
    sources = [write(tmp_path / f"source-{n}", data) for n in range(8)]
    with ThreadPoolExecutor(len(sources)) as pool:
        made = list(pool.map(lambda source: store.put_if_absent("payloads/raced", source), sources))
    assert {version.version for version in made} == {store.versions("payloads/raced")[0].version}
    assert len(store.versions("payloads/raced")) == 1


def test_a_hung_object_store_delays_checkpoints_never_the_service(
    s3_endpoint: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's upload waits on the object store on a thread of its own: while the store
    takes requests and answers none, the service starts (opening the bucket waits for the first
    use), a requested checkpoint is answered at once and the queue goes on serving over HTTP;
    once the store answers again the checkpoint is published and announced. (Taken on the
    serving thread, the first request after the Checkpoint waited for boto3 to give up; and the
    service did not start until the bucket had answered.)"""
    for name, value in [("AWS_ACCESS_KEY_ID", "keyload"), ("AWS_SECRET_ACCESS_KEY", "keyload")]:
        monkeypatch.setenv(name, value)
    bucket = s3_endpoint.fresh_store().bucket
    store = HangingEndpoint(s3_endpoint.url)
    root = tmp_path / "data"
    DataDir.create(root, 1, object_store=S3StoreConfig(bucket, "", store.url, "us-east-1"))
    store.hung.set()
    service = start_service(root)
    try:
        credential = Credential.load(root / "credentials" / f"{ADMIN_PRINCIPAL}.json")
        with Client(served_url(root), credential=credential, timeout_s=HUNG_STORE_ANSWER_S) as client:
            client.create_queue("shop", "q")
            client.enqueue("shop", "q", b"before", message_id="before")
            requested = client.request_checkpoint(0)
            client.enqueue("shop", "q", b"during", message_id="during")
            received = client.receive("shop", "q", max_messages=2)
            assert sorted(d.message_id for d in received.deliveries) == ["before", "during"]
            for delivery in received.deliveries:
                client.ack("shop", delivery.token)
            assert _published(root) == []  # the upload still waits
            store.hung.clear()
            wait_until(lambda: _published(root) == [requested.offset], 60, "the checkpoint's publication")
            announcement = f"checkpoint-published-p0-{requested.offset}"
            wait_until(lambda: announcement in _command_ids(root, requested.offset), 30, "its announcement")
        assert stop_service(service) == 0
    finally:
        if service.poll() is None:
            service.kill()
        store.close()


def _command_ids(root: Path, start: int) -> list[str]:
    with DataDir.open(root).file_command_log() as log:
        return [
            REGISTRY.decode(COMMAND, contents(record.value))["command_id"] for record in records_from(log, 0, start)
        ]


def _published(root: Path) -> list[int]:
    catalog = DataDir.open(root).catalog()
    try:
        return [entry.offset for entry in catalog.entries(0)]
    finally:
        catalog.close()


def test_checkpoint_uploads_keep_order_bound_what_waits_and_outlive_a_failure(
    s3_endpoint: S3Endpoint, embedded: Embedded, tmp_path: Path
) -> None:
    """The uploads' thread publishes snapshots in the order taken; while the store hangs, a
    partition's third snapshot is refused (MAX_PENDING_CHECKPOINTS) rather than kept waiting; a
    failure (here the bucket cannot even be opened) is reported as that snapshot's and the next
    one is tried afresh; a partition forgotten while its snapshot waits is published but not
    handed on; and no scratch folder outlives its snapshot."""
    domain = "shop"
    embedded.append(domain, command(domain, CREATE_QUEUE, create_queue_body("q")))
    embedded.run()
    partition, store = embedded.partition(domain), embedded.store(domain)
    bucket = s3_endpoint.fresh_store().bucket
    hanging = HangingEndpoint(s3_endpoint.url)
    endpoints = iter([f"http://127.0.0.1:{free_port()}"])  # nobody listens: the first open fails

    def open_checkpoints() -> Checkpoints:
        objects = S3ObjectStore(bucket, endpoint_url=next(endpoints, hanging.url), **s3_endpoint.client_options)
        return Checkpoints(objects, FileCatalog(tmp_path / "catalog"), tmp_path / "scratch")

    def snapshot(message_id: str) -> Snapshot:
        embedded.append(domain, command(domain, ENQUEUE, enqueue_body("q", message_id)))
        embedded.run()
        return taking.snapshot(store, partition)

    taking = Checkpoints(s3_endpoint.fresh_store(), FileCatalog(tmp_path / "unused"), tmp_path / "scratch")
    uploads = CheckpointUploads(open_checkpoints)
    try:
        unopened = snapshot("m0")
        assert uploads.submit(unopened)
        [failed] = _finished(uploads, partition, 1)
        assert (failed.offset, failed.entry) == (unopened.offset, None)
        assert "opening the bucket" in failed.failure
        hanging.hung.set()
        waiting = [snapshot(f"m{n}") for n in range(1, 4)]
        assert [uploads.submit(taken) for taken in waiting] == [True, True, False]
        taking.discard(waiting[2])
        assert uploads.finished(partition) == []  # the store takes the requests and answers none
        hanging.hung.clear()
        published = _finished(uploads, partition, 2)
        assert [(p.offset, p.failure) for p in published] == [(taken.offset, "") for taken in waiting[:2]]
        assert [p.entry.offset for p in published if p.entry] == [taken.offset for taken in waiting[:2]]
        hanging.hung.set()
        released = snapshot("m4")
        assert uploads.submit(released)
        uploads.forget(partition)  # its processor is gone (Kafka mode released the partition)
        hanging.hung.clear()
        assert uploads.close() == 0
        assert uploads.finished(partition) == []  # published, and handed to no later owner
        assert FileCatalog(tmp_path / "catalog").entries(partition)[-1].offset == released.offset
        assert list((tmp_path / "scratch").glob("take-*")) == []
    finally:
        uploads.close(wait_s=0)
        hanging.close()


def _finished(uploads: CheckpointUploads, partition: int, count: int) -> list[Published]:
    finished: list[Published] = []

    def collect() -> bool:
        finished.extend(uploads.finished(partition))
        return len(finished) >= count

    wait_until(collect, 60, f"{count} publications")
    return finished


def test_a_listing_passes_over_objects_deleted_while_it_runs(tmp_path: Path) -> None:
    """A GC worker lists a partition's checkpoint objects while the service retires some in
    another process: an object's folder can go between being seen and being looked into. The
    listing leaves such an object out; it never fails (the worker once died of it)."""
    store = FileObjectStore(tmp_path / "objects")
    source = write(tmp_path / "source", b"x")
    keys = [f"checkpoints/p-0001/{n:04d}/take/db/file-{m}" for n in range(40) for m in range(5)]
    created = {key: store.put_if_absent(key, source) for key in keys}
    done = threading.Event()

    def retire() -> None:
        for key, version in created.items():
            store.delete(key, version.version)
        done.set()

    retiring = threading.Thread(target=retire)
    retiring.start()
    listings = 0
    while not done.is_set() or listings == 0:
        listed = [version.key for version in store.list("checkpoints/p-0001/")]
        assert set(listed) <= set(keys) and listed == sorted(listed)
        listings += 1
    retiring.join()
    assert list(store.list("checkpoints/")) == []


def test_an_upload_while_the_store_cannot_be_opened_is_503_and_nothing_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HTTP API opens the object store at its first payload request: one the service cannot
    reach since it started is the same retryable 503 `Unavailable` as one that fails later (not a
    400, which a client would not retry), and the reservation stays open for the upload again."""
    for name, value in [("AWS_ACCESS_KEY_ID", "keyload"), ("AWS_SECRET_ACCESS_KEY", "keyload")]:
        monkeypatch.setenv(name, value)
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    root = tmp_path / "data"
    DataDir.create(root, 1, object_store=S3StoreConfig("nowhere", "", nowhere, "us-east-1"))
    service = start_service(root)
    try:
        payload = b"x" * 1000
        digest = base64.b64encode(hashlib.sha256(payload).digest()).decode()
        reserve = {"message_id": "m", "length": len(payload), "sha256": digest, "headers": {}}
        with httpx.Client(base_url=served_url(root), headers=bearer(root), timeout=120) as api:
            assert api.put("/v1/domains/shop/queues/q", json={}).status_code == 200
            reservation = api.post("/v1/domains/shop/queues/q/reservations", json=reserve)
            assert reservation.status_code == 200, reservation.text
            number = reservation.json()["result"]["reservation_id"]
            upload = api.put(
                f"/v1/domains/shop/reservations/{number}/content",
                content=payload,
                headers={"content-type": "application/octet-stream"},
            )
            assert (upload.status_code, upload.json()["error_code"]) == (503, "Unavailable"), upload.text
            assert upload.json()["detail"].startswith("the object store failed: ")
            inspected = api.get(f"/v1/domains/shop/reservations/{number}").json()["result"]
            assert inspected["state"] == "reserved"
        assert stop_service(service) == 0
    finally:
        if service.poll() is None:
            service.kill()
