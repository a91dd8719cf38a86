"""The projections `/metrics` reads its queue and group figures from.

The embedded service's server holds its processors' projections open. With worker processes
(`keyload run --workers`, keyload/service/workers.py) the other partitions' projections are open
in the workers: a scrape opens each read-only for its read (RocksDB lets a read-only instance
beside the writer; it sees what the writer had committed, write-ahead log included, when it
opened). An open costs about 2 ms, plus replaying the write-ahead log the worker has not flushed
yet (up to its two memtables of 16 MiB by default: tens of ms), and holds the GIL meanwhile. A Kafka
processor's server holds none: they come and go with its partitions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from keyload.projections.store import Store
from keyload.storage.datadir import DataDir


@dataclass(frozen=True)
class HeldProjections:
    """The projections of a data directory this process holds open (`held`), and with `workers`
    the others, opened read-only for a read."""

    data: DataDir
    held: Mapping[int, Store]
    workers: bool = False  # the projections `held` lacks are open in worker processes

    def partitions(self) -> list[int]:
        """The partitions whose projection `read` can open."""
        return list(range(self.data.partitions)) if self.workers else sorted(self.held)

    @contextlib.contextmanager
    def read(self, partition: int) -> Iterator[Store | None]:
        """The partition's projection for one read; None where it is not here (StoreError when it
        cannot be opened)."""
        store = self.held.get(partition)
        if store is not None or not self.workers:
            yield store
            return
        opened = Store(self.data.projection(partition), read_only=True)
        try:
            yield opened
        finally:
            opened.close()
