"""The processor's read cache answers exactly what its RocksDB projection would, stays bounded, and
keeps no message body."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.projections import read_cache
from keyload.projections.read_cache import MAX_CACHED_VALUE_BYTES, ReadCache
from keyload.projections.store import Store

KEYS = [bytes([0x40, n]) for n in range(8)]
SMALL_BOUND = 4  # rows the model's cache may hold, so that it evicts

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


@settings(max_examples=80, deadline=None)
@given(operations)
def test_the_cache_reads_what_the_store_holds(script: list[tuple[str, object]]) -> None:
    """Any interleaving of reads and commits: every read through the cache equals the store's,
    and the cache never holds more than its bound of rows, nor a row over its size bound."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(read_cache, "MAX_CACHED_ROWS", SMALL_BOUND)
        store = Store(Path(tmp) / "db")
        cache = ReadCache(store)
        offset = 0
        try:
            for operation, argument in script:
                if operation == "get":
                    assert isinstance(argument, bytes)
                    assert cache.get(argument) == store.get(argument)
                else:
                    assert isinstance(argument, dict)
                    offset += 1
                    cache.commit(argument, offset, offset)
                rows = cache._rows
                assert len(rows) <= SMALL_BOUND
                assert all(value is None or len(value) <= MAX_CACHED_VALUE_BYTES for value in rows.values())
            assert [cache.get(key) for key in KEYS] == [store.get(key) for key in KEYS]
        finally:
            store.close()


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


def test_a_failed_commit_forgets_every_row(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    cache = ReadCache(store)
    cache.commit({b"a": b"1"}, 0, 0)
    assert cache.get(b"a") == b"1"
    with pytest.raises(AssertionError):  # the store refuses a position that does not advance
        cache.commit({b"a": b"2"}, 0, 0)
    assert cache._rows == {}
    assert cache.get(b"a") == b"1"
    store.close()
