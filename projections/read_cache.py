"""The processor's bounded cache of the projection's small rows, kept between groups.

Every command reads the same few rows again: the partition's next due time, its feature level and
policy epoch, its domain's policy, the principal, the queue or group it works on. Within a group
the staged overlay (`Staged`) holds them, but a sparse service applies one command per group, and
in a deep projection each RocksDB read of a row written long ago costs more (under cProfile, in
`bench.depth`'s probes: 1.9 µs per get with 10,000 messages in the queue, 4.9 µs with 1,000,000).
The cache answers those reads from memory; a row known to be missing is cached as None.

It also keeps rows decoded (`record`): the records a group wrote, as the group staged them, and
those read since. A command's stage owns the records it reads, so each read is handed a copy,
which costs a quarter of a decode (on the development VM: a QueueRecord 3.4 µs against 14.5 µs,
a MessageMeta 1.3 µs against 5.2): the queue record every step reads, the messages a Batch staged
that the next Receive claims and the next AckBatch settles, are decoded by no one.

It is the processor's: the processor is the projection's only writer, and every group it commits
passes through `commit`, which brings the cached rows and records it wrote up to date, so the cache
never answers what RocksDB would not. A cached record is never mutated: it was read or committed,
and only copies of it leave. It is not thread-safe, so only the processor's thread reads it:
the embedded HTTP server authenticates each request through it, on that thread, between groups;
other threads (the GC worker, metrics) read the `Store` itself. It holds only rows of at most
MAX_CACHED_VALUE_BYTES (message bodies pass by), at most MAX_CACHED_ROWS of them and
MAX_CACHED_RECORDS records decoded from such rows, least recently read first out: its memory is
bounded (per partition: each processor has its own), and nothing of it reaches the projection or
its digest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from keyload.bounded import remember
from keyload.log.codec import REGISTRY, Record

from . import keys
from .store import Store, clone

MAX_CACHED_ROWS = 4096
MAX_CACHED_VALUE_BYTES = 1024
# Decoded, a record takes tens of times its row's bytes (a QueueRecord of 103 bytes: 5.8 KB with
# its field names): a thousand queue records are about 6 MiB, per partition.
MAX_CACHED_RECORDS = 1024
POSITION_ROWS = (keys.APPLIED_OFFSET, keys.LAST_TIME, keys.APPLIED_RECORD)
assert MAX_CACHED_ROWS * MAX_CACHED_VALUE_BYTES <= 4 * 2**20, "the cache stays within a few MiB of values"
assert MAX_CACHED_RECORDS <= MAX_CACHED_ROWS, "a decoded record costs more memory than its row"


class ReadCache:
    """A `Readable` over a `Store` that remembers recently read small rows, present or missing."""

    __slots__ = ("_records", "_rows", "store")

    def __init__(self, store: Store) -> None:
        self.store = store
        self._rows: OrderedDict[bytes, bytes | None] = OrderedDict()  # in read order, least recent first
        self._records: OrderedDict[bytes, tuple[str, Record]] = OrderedDict()  # decoded rows, with their schema

    def get(self, key: bytes) -> bytes | None:
        rows = self._rows
        if key in rows:
            rows.move_to_end(key)  # now the most recently read
            return rows[key]
        value = self.store.get(key)
        if value is None or len(value) <= MAX_CACHED_VALUE_BYTES:
            remember(rows, key, value, MAX_CACHED_ROWS)
        return value

    def record(self, key: bytes, name: str) -> Record | None:
        records = self._records
        cached = records.get(key)
        if cached is not None:
            if cached[0] == name:
                records.move_to_end(key)  # now the most recently read
                return clone(cached[1])
            del records[key]  # read as another record: decoded afresh, as the store's reader would
        raw = self.get(key)
        if raw is None:
            return None
        record = REGISTRY.decode(name, raw)
        if len(raw) > MAX_CACHED_VALUE_BYTES:
            return record
        remember(records, key, (name, record), MAX_CACHED_RECORDS)
        return clone(record)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.store.scan(start, end)

    def first(self, start: bytes, end: bytes) -> tuple[bytes, bytes] | None:
        return self.store.first(start, end)

    def commit(
        self,
        writes: dict[bytes, bytes | None],
        applied_offset: int,
        last_time_ms: int,
        applied_record: bytes | None = None,
        records: Iterable[tuple[bytes, str, Record]] = (),
    ) -> None:
        """`Store.commit`, then the cached rows it wrote as they now are, and `records`, the decoded
        forms of rows of `writes` (a group's staged records: `Staged.written_records`), which the
        cache now owns. A failed commit empties the cache: the caller reopens the projection, whose
        rows are then what RocksDB recovered."""
        try:
            self.store.commit(writes, applied_offset, last_time_ms, applied_record)
        except BaseException:
            self.clear()
            raise
        rows = self._rows
        decoded = self._records
        for position in POSITION_ROWS:  # written by Store.commit besides: read afresh if ever asked for
            rows.pop(position, None)
        for key, value in writes.items():
            decoded.pop(key, None)
            if key in rows:
                if value is not None and len(value) > MAX_CACHED_VALUE_BYTES:
                    del rows[key]
                else:
                    rows[key] = value
        for key, name, record in records:
            value = writes[key]
            if value is not None and len(value) <= MAX_CACHED_VALUE_BYTES:
                remember(decoded, key, (name, record), MAX_CACHED_RECORDS)

    def clear(self) -> None:
        """Forget every row and record (the projection was reopened)."""
        self._rows.clear()
        self._records.clear()
