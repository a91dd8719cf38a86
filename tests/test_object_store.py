"""The object-store contract, the same for both backends: the versioned folder and S3 (a real server process)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from keyload.catalog import FileCatalog
from keyload.checkpoints import CheckpointPolicy, Checkpoints
from keyload.object_store import FileObjectStore, ObjectConflict, ObjectStore, ObjectStoreError, S3ObjectStore
from keyload.projections.store import Store

from .s3 import S3Endpoint
from .support import CREATE_QUEUE, ENQUEUE, Embedded, command, create_queue_body, enqueue_body


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
    with pytest.raises(ObjectStoreError, match="opening the bucket"):
        S3ObjectStore(store.bucket + "-absent", client=store.client, create_bucket=False)


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
