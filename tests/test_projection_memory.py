"""`keyload run --projection-memtable-mib` and `--projection-cache-mib`: the operator's bound on what the
projections of a service hold in memory, with the same rows and digests whatever it is."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keyload import Client
from keyload.log.base import partition_for
from keyload.storage.datadir import DataDir

from .support import assert_live_equals_replay, start_service, stop_service

pytestmark = pytest.mark.slow

PARTITIONS = 2
DOMAIN, QUEUE = "shop", "orders"
BODY_BYTES = 200 * 1024
MESSAGES = 20  # about 4 MiB of rows: past a 1 MiB memtable's flushes, inside one of the default 16 MiB
FLUSH_WAIT_S = 60.0  # for RocksDB's background flush: only a hang reaches it


def test_a_small_memtable_flushes_the_projection_sooner_and_changes_no_byte(tmp_path: Path) -> None:
    root = tmp_path / "data"
    data = DataDir.create(root, PARTITIONS)
    projection = data.projection(partition_for(DOMAIN, PARTITIONS))
    service = start_service(root, "--projection-memtable-mib", "1", "--projection-cache-mib", "8")
    try:
        with Client(root) as client:
            client.create_queue(DOMAIN, QUEUE)
            for n in range(MESSAGES):
                client.enqueue(DOMAIN, QUEUE, bytes([n]) * BODY_BYTES, message_id=f"m-{n}")
            deadline = time.monotonic() + FLUSH_WAIT_S
            while not any(projection.glob("*.sst")) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert any(projection.glob("*.sst")), "a 1 MiB memtable flushed to a table file"
            received = client.receive(DOMAIN, QUEUE, max_messages=1)
            assert [delivery.body for delivery in received.deliveries] == [bytes([0]) * BODY_BYTES]
    finally:
        assert stop_service(service, 30) == 0
    # A replay in this process, with the default budget, gives the same offset and digest.
    assert_live_equals_replay(data, tmp_path / "replay")
