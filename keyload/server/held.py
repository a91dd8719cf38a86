"""The projections `/metrics` reads its queue and group figures from, and a principal's key is
checked against (a partition's own signing keys: keyload/server/app.py, `refuse_unusable_key`).

The embedded service's server holds its processors' projections open. With worker processes
(`keyload run --workers`, keyload/service/workers.py) the other partitions' projections are open
in the workers: the server follows each (a RocksDB secondary instance, `Store(follow=...)`, with its
files in DATA/scratch/follow/p-NNNN, removed when the server stops), and brings it up to what the
worker has committed before each read (`catch_up`), which replays only what the worker wrote since
the last scrape: about 1 ms a second of writes, where opening the projection read-only for each
scrape replayed the worker's whole unflushed write-ahead log (70 to 90 ms with full memtables, holding
the GIL meanwhile). A followed projection holds up to its own two memtables in the serving process.
A Kafka processor's server holds none: they come and go with its partitions.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator, Mapping

from keyload.projections.store import Store, StoreError
from keyload.storage.datadir import DataDir

FOLLOW = ("scratch", "follow")  # under the data directory: the followers' own files


class HeldProjections:
    """The projections of a data directory this process holds open (`held`), and with `workers`
    the others, followed (one read at a time: the scrape's)."""

    def __init__(self, data: DataDir, held: Mapping[int, Store], *, workers: bool = False) -> None:
        self.data = data
        self.held = held
        self.workers = workers  # the projections `held` lacks are open in worker processes
        self._followed: dict[int, Store] = {}
        self._following = threading.Lock()  # a scrape's thread and the event loop follow them in turn

    def partitions(self) -> list[int]:
        """The partitions whose projection `read` can give."""
        return list(range(self.data.partitions)) if self.workers else sorted(self.held)

    @contextlib.contextmanager
    def read(self, partition: int) -> Iterator[Store | None]:
        """The partition's projection for one read; None where it is not here (StoreError when it
        cannot be read now)."""
        store = self.held.get(partition)
        if store is not None or not self.workers:
            yield store
            return
        with self._following:
            yield self._caught_up(partition)

    def _caught_up(self, partition: int) -> Store:
        followed = self._followed.get(partition)
        if followed is not None:
            try:
                followed.catch_up()
                return followed
            except StoreError:  # the worker's projection was replaced (a restore): follow it anew
                self._followed.pop(partition).close()
        folder = self.data.root.joinpath(*FOLLOW, f"p-{partition:04d}")
        shutil.rmtree(folder, ignore_errors=True)
        followed = self._followed[partition] = Store(self.data.projection(partition), follow=folder)
        return followed

    def close(self) -> None:
        with self._following:
            for store in self._followed.values():
                store.close()
            self._followed.clear()
        shutil.rmtree(self.data.root.joinpath(*FOLLOW), ignore_errors=True)
