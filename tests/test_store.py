"""The projection store: staged reads-your-writes, atomic commits, digests, checkpoints."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.log.codec import REGISTRY
from keyload.projections import keys
from keyload.projections.store import (
    MERGE_BY_INSERTION,
    MIB,
    ProjectionMemory,
    Staged,
    Store,
    StoreError,
    describe_checkpoint,
    projection_memory,
    use_projection_memory,
    verify_checkpoint,
)

FLUSH_WAIT_S = 60.0  # for RocksDB's background flushes: only a hang reaches it

small_keys = st.binary(min_size=1, max_size=3)
operations = st.lists(st.tuples(st.booleans(), small_keys, st.binary(max_size=4)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    base=st.dictionaries(small_keys, st.binary(max_size=4), max_size=20),
    parent_ops=operations,
    child_ops=operations,
)
def test_staged_scans_match_a_dictionary_model(
    base: dict[bytes, bytes], parent_ops: list[tuple[bool, bytes, bytes]], child_ops: list[tuple[bool, bytes, bytes]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = Store(Path(directory) / "db")
        store.commit(dict(base), 0, 0)
        # A writable store is marked with the schema set it is written under (migration.py).
        model = {
            **base,
            keys.APPLIED_OFFSET: keys.u64(0),
            keys.LAST_TIME: keys.u64(0),
            keys.SCHEMA_SET: REGISTRY.schema_set,
        }
        parent = Staged(store)
        child = Staged(parent)
        for stage, ops in ((parent, parent_ops), (child, child_ops)):
            for is_put, key, value in ops:
                if is_put:
                    stage.put(key, value)
                    model[key] = value
                else:
                    stage.delete(key)
                    model.pop(key, None)
        assert list(child.scan(b"", b"\xff\xff\xff\xff")) == sorted(model.items())
        assert list(child.scan(b"\x10", b"\x80")) == sorted((k, v) for k, v in model.items() if b"\x10" <= k < b"\x80")
        for key in list(model)[:5]:
            assert child.get(key) == model[key]
        # `first` reads no further than its row, and finds the row a scan would yield first.
        bounds = sorted({b"", b"\x10", b"\x80", b"\xff\xff\xff\xff", *(k for _, k, _ in parent_ops + child_ops)})
        for start in bounds:
            for end in bounds:
                expected = min(((k, v) for k, v in model.items() if start <= k < end), default=None)
                assert child.first(start, end) == expected, (start, end)
                assert parent.first(start, end) == next(parent.scan(start, end), None), (start, end)
        child.merge_into(parent)
        # The parent now reads what the child did: its order of staged keys took the child's in.
        assert list(parent.scan(b"", b"\xff\xff\xff\xff")) == sorted(model.items())
        for start in bounds:
            assert parent.first(start, b"\xff\xff\xff\xff") == child.first(start, b"\xff\xff\xff\xff")
        store.commit(parent.encoded_writes(), 1, 5)
        assert list(store.scan(b"", b"\xff\xff\xff\xff")) == sorted(
            {**model, keys.APPLIED_OFFSET: keys.u64(1), keys.LAST_TIME: keys.u64(5)}.items()
        )
        store.close()


@pytest.mark.parametrize(
    ("parent_keys", "child_keys"),
    [
        (range(0, 200, 2), range(200, 300)),  # every new key sorts after the parent's: appended
        (range(0, 200, 2), range(1, 2 * MERGE_BY_INSERTION, 2)),  # a few between them: inserted
        (range(0, 400, 2), range(1, 400, 2)),  # many between them: the two runs merged
        ((), range(100)),
    ],
)
def test_a_merge_keeps_the_parents_keys_in_order(parent_keys: range, child_keys: range) -> None:
    parent = Staged(_Nothing())
    for number in parent_keys:
        parent.put(number.to_bytes(2, "big"), b"p")
    child = Staged(parent)
    for number in (*child_keys, *parent_keys[:3]):  # new keys, and some the parent has
        child.put(number.to_bytes(2, "big"), b"c")
    child.merge_into(parent)
    expected = {number.to_bytes(2, "big"): b"p" for number in parent_keys}
    expected.update({number.to_bytes(2, "big"): b"c" for number in (*child_keys, *parent_keys[:3])})
    assert list(parent.scan(b"", b"\xff\xff")) == sorted(expected.items())
    assert parent.first(b"\x00\x03", b"\xff\xff") == min((k, v) for k, v in expected.items() if k >= b"\x00\x03")


class _Nothing:
    """A base that holds no row."""

    def get(self, key: bytes) -> bytes | None:
        return None

    def record(self, key: bytes, name: str) -> dict[str, object] | None:
        return None

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return iter(())

    def first(self, start: bytes, end: bytes) -> tuple[bytes, bytes] | None:
        return None


def test_digest_depends_on_every_key_and_value(tmp_path: Path) -> None:
    def digest_of(items: dict[bytes, bytes], name: str) -> str:
        store = Store(tmp_path / name)
        store.commit(items, 0, 0)
        try:
            return store.digest()
        finally:
            store.close()

    base = digest_of({b"a": b"1", b"b": b"2"}, "one")
    assert digest_of({b"b": b"2", b"a": b"1"}, "two") == base  # order of writes is irrelevant
    assert digest_of({b"a": b"1", b"b": b"3"}, "three") != base
    assert digest_of({b"a": b"12", b"b": b""}, "four") != digest_of({b"a": b"1", b"b": b"2"}, "five")


def test_commit_must_advance_the_applied_offset(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.commit({b"a": b"1"}, 3, 10)
    with pytest.raises(AssertionError):
        store.commit({b"a": b"2"}, 3, 11)
    assert (store.applied_offset, store.last_time_ms, store.get(b"a")) == (3, 10, b"1")
    store.close()


def test_checkpoint_manifest_verifies_files(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.commit({b"a": b"1" * 1000}, 7, 99)
    store.snapshot(tmp_path / "cp")
    manifest = describe_checkpoint(tmp_path / "cp", partition=2, processor_version="test")
    assert (manifest.partition, manifest.offset, manifest.last_time_ms) == (2, 7, 99)
    assert manifest.digest == store.digest()
    assert verify_checkpoint(tmp_path / "cp") == manifest
    with pytest.raises(StoreError, match="already exists"):
        store.snapshot(tmp_path / "cp")
    store.close()
    victim = next(f for f in manifest.files if f.size > 0 and f.name.endswith(".sst"))
    path = tmp_path / "cp" / "db" / victim.name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="does not match its manifest"):
        verify_checkpoint(tmp_path / "cp")


def test_staged_records_are_copied_into_a_child_and_dropped_with_it(tmp_path: Path) -> None:
    name = "keyload.PoisonEntry"
    entry = {"offset": 1, "timestamp_ms": 2, "length": 3, "sha256": b"\x00" * 32, "reason": "r"}
    store = Store(tmp_path / "db")
    store.commit({b"k": REGISTRY.encode(name, entry)}, 0, 0)
    group = Staged(store)
    first = group.get_record(b"k", name)
    assert first == entry and group.get_record(b"k", name) is first  # decoded once per stage

    rejected = Staged(group)
    mine = rejected.get_record(b"k", name)
    assert mine is not None and mine is not first
    mine["reason"] = "changed by a command that is then rejected"
    rejected.put_record(b"k", name, mine)
    assert group.get_record(b"k", name) == entry  # the parent never saw it

    accepted = Staged(group)
    record = accepted.get_record(b"k", name)
    assert record is not None
    record["length"] = 99
    accepted.put_record(b"k", name, record)
    accepted.merge_into(group)
    assert REGISTRY.decode(name, group.get(b"k") or b"")["length"] == 99
    store.commit(group.encoded_writes(), 1, 0)
    assert REGISTRY.decode(name, store.get(b"k") or b"") == dict(entry, length=99)
    store.close()


@pytest.fixture
def small_memory() -> Iterator[ProjectionMemory]:
    """A budget smaller than the default for the projections the test opens; the default again after."""
    memory = ProjectionMemory(cache_bytes=8 * MIB, write_buffer_bytes=1 * MIB)
    use_projection_memory(memory)
    yield memory
    use_projection_memory(ProjectionMemory())


def test_projections_of_a_process_share_one_block_cache_and_cap_their_memtables(
    tmp_path: Path, small_memory: ProjectionMemory
) -> None:
    """A projection written past its memtable cap flushes to table files, and reading its rows back
    fills the process's one block cache; so does reading another projection's; a full scan (a
    digest) leaves the cache as it is."""
    stores = [Store(tmp_path / f"p{n}") for n in range(2)]
    memory, cache = projection_memory()
    assert memory == small_memory
    try:
        value = bytes(4096)
        rows = 3 * small_memory.write_buffer_bytes // len(value)  # three memtables' worth each
        for n, store in enumerate(stores):
            for offset, start in enumerate(range(0, rows, 64)):
                store.commit({b"%d-%06d" % (n, i): value for i in range(start, min(rows, start + 64))}, offset, 0)
        deadline = time.monotonic() + FLUSH_WAIT_S
        while not all(any(store.path.glob("*.sst")) for store in stores) and time.monotonic() < deadline:
            time.sleep(0.05)  # flushes run on RocksDB's background threads
        assert all(any(store.path.glob("*.sst")) for store in stores)
        for n, store in enumerate(stores):
            before = cache.get_usage()
            assert all(store.get(b"%d-%06d" % (n, i)) == value for i in range(0, rows, 7))
            assert cache.get_usage() > before
        before = cache.get_usage()
        stores[0].digest()
        assert cache.get_usage() <= before
        assert cache.get_usage() <= small_memory.cache_bytes
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize(("cache_mib", "memtable_mib"), [(0, 16), (64 * 1024 + 1, 16), (128, 0), (128, 1025)])
def test_a_projection_memory_outside_its_bounds_is_refused(cache_mib: int, memtable_mib: int) -> None:
    with pytest.raises(ValueError, match=r"must be \d+ to \d+ MiB"):
        ProjectionMemory(cache_mib * MIB, memtable_mib * MIB)


def test_a_following_store_reads_what_its_writer_had_committed_at_its_last_catch_up(tmp_path: Path) -> None:
    """`/metrics` beside worker processes follows their projections (keyload/server/held.py)."""
    writer = Store(tmp_path / "projection")
    writer.commit({b"a": b"1"}, 0, 1)
    follower = Store(tmp_path / "projection", follow=tmp_path / "follower")
    try:
        assert (follower.get(b"a"), follower.applied_offset) == (b"1", 0)
        writer.commit({b"b": b"2", b"a": None}, 1, 2)
        assert (follower.get(b"a"), follower.get(b"b"), follower.applied_offset) == (b"1", None, 0)
        follower.catch_up()
        assert (follower.get(b"a"), follower.get(b"b"), follower.applied_offset) == (None, b"2", 1)
        with pytest.raises(StoreError):
            follower.commit({b"c": b"3"}, 2, 3)  # it only reads
    finally:
        follower.close()
        writer.close()
