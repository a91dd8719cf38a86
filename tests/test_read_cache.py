"""The processor's read cache answers exactly what its RocksDB projection would, stays bounded, and
keeps no message body."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.log.codec import REGISTRY
from keyload.projections import read_cache
from keyload.projections.read_cache import MAX_CACHED_VALUE_BYTES, ReadCache
from keyload.projections.records import DocumentRecord, load, save
from keyload.projections.store import Staged, Store

KEYS = [bytes([0x40, n]) for n in range(8)]
SMALL_BOUND = 4  # rows (or records) the model's cache may hold, so that it evicts

values = st.one_of(
    st.none(),
    st.binary(max_size=16),
    st.binary(min_size=MAX_CACHED_VALUE_BYTES + 1, max_size=MAX_CACHED_VALUE_BYTES + 8),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("get"), st.sampled_from(KEYS)),
        st.tuples(st.just("commit"), st.dictionaries(st.sampled_from(KEYS), values, max_size=4)),
    ),
    max_size=60,
)


@contextmanager
def _bounded_cache(bound: str) -> Iterator[tuple[Store, ReadCache]]:
    """A fresh store and its read cache, whose `bound` (a read_cache constant) is SMALL_BOUND. Each
    hypothesis example needs its own: a function's fixtures are not made again between examples."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(read_cache, bound, SMALL_BOUND)
        store = Store(Path(tmp) / "db")
        try:
            yield store, ReadCache(store)
        finally:
            store.close()


@settings(max_examples=80, deadline=None)
@given(operations)
def test_the_cache_reads_what_the_store_holds(script: list[tuple[str, object]]) -> None:
    """Any interleaving of reads and commits: every read through the cache equals the store's,
    and the cache never holds more than its bound of rows, nor a row over its size bound."""
    with _bounded_cache("MAX_CACHED_ROWS") as (store, cache):
        for offset, (operation, argument) in enumerate(script):
            if operation == "get":
                assert isinstance(argument, bytes)
                assert cache.get(argument) == store.get(argument)
            else:
                assert isinstance(argument, dict)
                cache.commit(argument, offset, offset)
            rows = cache._rows
            assert len(rows) <= SMALL_BOUND
            assert all(value is None or len(value) <= MAX_CACHED_VALUE_BYTES for value in rows.values())
        assert [cache.get(key) for key in KEYS] == [store.get(key) for key in KEYS]


def test_the_least_recently_read_row_leaves_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_cache, "MAX_CACHED_ROWS", 2)
    store = Store(tmp_path / "db")
    cache = ReadCache(store)
    store.commit({b"a": b"1", b"b": b"2", b"c": b"3"}, 0, 0)
    cache.get(b"a")
    cache.get(b"b")
    cache.get(b"a")  # b is now the least recently read
    cache.get(b"c")
    assert list(cache._rows) == [b"a", b"c"]
    store.close()


def test_a_failed_commit_forgets_every_row_and_record(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    cache = ReadCache(store)
    stage = Staged(cache)
    save(stage, b"d", DocumentRecord(value=b"v", revision=1, updated_at_ms=0, deleted=False))
    cache.commit({b"a": b"1", **stage.encoded_writes()}, 0, 0, None, stage.written_records())
    assert cache.get(b"a") == b"1"
    assert list(cache._records) == [b"d"]
    with pytest.raises(AssertionError):  # the store refuses a position that does not advance
        cache.commit({b"a": b"2"}, 0, 0)
    assert cache._rows == {} and cache._records == {}
    assert cache.get(b"a") == b"1"
    store.close()


DOCUMENT = DocumentRecord.SCHEMA
document_values = st.one_of(
    st.none(),  # deleted
    st.binary(max_size=16),
    st.binary(min_size=MAX_CACHED_VALUE_BYTES + 1, max_size=MAX_CACHED_VALUE_BYTES + 8),  # never kept decoded
)
record_operations = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.sampled_from(KEYS)),
        st.tuples(st.just("mutate"), st.sampled_from(KEYS)),
        st.tuples(st.just("group"), st.dictionaries(st.sampled_from(KEYS), document_values, max_size=4)),
        st.tuples(st.just("raw"), st.sampled_from(KEYS)),  # a group that puts a row's bytes, not its record
    ),
    max_size=60,
)


def _decoded(store: Store, key: bytes) -> dict[str, object] | None:
    raw = store.get(key)
    return None if raw is None else REGISTRY.decode(DOCUMENT, raw)


@settings(max_examples=80, deadline=None)
@given(record_operations)
def test_records_read_through_the_cache_are_the_store_s_decoded(script: list[tuple[str, object]]) -> None:
    """Any interleaving of groups committed as the processor commits them (staged records over the
    cache), reads and mutations of what was read: every record read equals the store's row decoded,
    a reader's mutation reaches neither the cache nor the next reader, and the cache holds at most
    its bound of records, none decoded from a row over its size bound."""
    with _bounded_cache("MAX_CACHED_RECORDS") as (store, cache):
        for offset, (operation, argument) in enumerate(script):
            if operation == "group":
                assert isinstance(argument, dict)
                stage = Staged(cache)
                for key, value in argument.items():
                    if value is None:
                        stage.delete(key)
                    else:
                        before = load(stage, key, DocumentRecord)
                        revision = 1 if before is None else before.revision + 1
                        document = DocumentRecord(value=value, revision=revision, updated_at_ms=offset, deleted=False)
                        save(stage, key, document)
                cache.commit(stage.encoded_writes(), offset, offset, None, stage.written_records())
            elif operation == "raw":
                assert isinstance(argument, bytes)
                raw = DocumentRecord(value=b"raw", revision=offset, updated_at_ms=offset, deleted=True).encode()
                cache.commit({argument: raw}, offset, offset)
            else:
                assert isinstance(argument, bytes)
                read = cache.record(argument, DOCUMENT)
                assert read == _decoded(store, argument)
                if operation == "mutate" and read is not None:
                    read["revision"] = -1
                    read["value"] = b"mutated"
                    assert cache.record(argument, DOCUMENT) == _decoded(store, argument)
            assert len(cache._records) <= SMALL_BOUND
            assert all(len(store.get(key) or b"") <= MAX_CACHED_VALUE_BYTES for key in cache._records)
        for key in KEYS:
            assert cache.record(key, DOCUMENT) == _decoded(store, key)


def test_a_committed_record_is_read_without_a_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records a group staged are what the next group reads: nobody decodes their rows."""
    store = Store(tmp_path / "db")
    cache = ReadCache(store)
    stage = Staged(cache)
    save(stage, b"a", DocumentRecord(value=b"v", revision=1, updated_at_ms=0, deleted=False))
    cache.commit(stage.encoded_writes(), 0, 0, None, stage.written_records())
    decodes: list[str] = []
    decode = REGISTRY.decode
    monkeypatch.setattr(REGISTRY, "decode", lambda name, raw: decodes.append(name) or decode(name, raw))
    assert load(Staged(Staged(cache)), b"a", DocumentRecord) == DocumentRecord(
        value=b"v", revision=1, updated_at_ms=0, deleted=False
    )
    assert decodes == []
    cache.clear()
    assert cache.record(b"a", DOCUMENT) == {"value": b"v", "revision": 1, "updated_at_ms": 0, "deleted": False}
    assert decodes == [DOCUMENT]
    store.close()
