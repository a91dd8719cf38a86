"""kill -9 of `keyload run` while it reclaims a deleted queue's rows: after the restart the reclamation
goes on from where the last committed step left it, ends with none of the queue's rows left, and the
drill rebuilds the same projection from the log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from keyload import Client, Credential
from keyload.log.base import partition_for
from keyload.operations.recovery import drill
from keyload.processors.reclamation import QUEUE_FAMILIES
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.sdk.results import EnqueueMessage
from keyload.storage.datadir import DataDir

from .support import served_url, start_service, stop_service, wait_until

pytestmark = pytest.mark.slow

DOMAIN = "spent"
MESSAGES = 20_000  # 60,000 rows: about 120 reclamation steps of 256 messages
BATCH = 100
SLICE_S = 0.005  # the service runs this long between two looks at its projection
ATTEMPTS = 3  # reclamations tried before one is caught part-way (a busy machine may run one unseen)


def left(projection: Path, incarnation: int) -> tuple[int, bool]:
    """(rows of the incarnation left, whether it is still retired), read beside the service."""
    store = Store(projection, read_only=True)
    try:
        rows = sum(
            1
            for family in QUEUE_FAMILIES
            for _ in store.scan(family + keys.u64(incarnation), keys.prefix_end(family + keys.u64(incarnation)))
        )
        return rows, store.get(keys.resource_key(incarnation)) is not None
    finally:
        store.close()


def stopped_part_way(pid: int, projection: Path, incarnation: int) -> tuple[int, bool]:
    """The service stopped (SIGSTOP) once some of the incarnation's rows are reclaimed: it runs in
    slices of SLICE_S between looks, so a reclamation that takes about a second seldom finishes
    unseen while one look reads the projection. What `left` found then. The service runs at the
    lowest CPU priority meanwhile, so that on a busy machine the test is not kept waiting past its
    slice while the service runs on (a CI run once found the reclamation finished at the first look
    that saw it begin: the test then tries another queue)."""
    os.setpriority(os.PRIO_PROCESS, pid, 19)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        rows, retired = left(projection, incarnation)
        if rows < 3 * MESSAGES:
            return rows, retired
        os.kill(pid, signal.SIGCONT)
        time.sleep(SLICE_S)
    raise AssertionError("the reclamation did not begin within 60 s")


def filled_and_deleted(client: Client, queue: str) -> int:
    """The incarnation of `queue`, created with MESSAGES messages and deleted by force: its rows
    are being reclaimed."""
    incarnation = client.create_queue(DOMAIN, queue).incarnation
    for first in range(0, MESSAGES, BATCH):
        client.batch(DOMAIN, [EnqueueMessage(queue, f"m{i}", b"x" * 100) for i in range(first, first + BATCH)])
    client.delete_queue(DOMAIN, queue, force=True)
    return incarnation


def test_a_service_killed_while_reclaiming_finishes_after_restart(tmp_path: Path) -> None:
    root = tmp_path / "data"
    service = start_service(root)
    try:
        credential = Credential.load(root / "credentials" / "keyload-admin.json")
        data = DataDir.open(root)
        projection = data.projection(partition_for(DOMAIN, data.partitions))
        with Client(served_url(root), credential=credential) as client:
            for attempt in range(ATTEMPTS):
                incarnation = filled_and_deleted(client, f"jobs-{attempt}")
                rows, retired = stopped_part_way(service.pid, projection, incarnation)
                if rows:
                    break
                os.kill(service.pid, signal.SIGCONT)  # it reclaimed them all unseen: again, with another queue
        service.send_signal(signal.SIGKILL)
        service.wait()
        assert (rows, retired) == left(projection, incarnation)
        assert retired and 0 < rows < 3 * MESSAGES, rows  # killed part-way
        service = start_service(root)
        wait_until(lambda: left(projection, incarnation) == (0, False), 120, "the reclamation done after the restart")
    finally:
        if service.poll() is None:
            assert stop_service(service, 30) == 0
    report = drill(data, partition_for(DOMAIN, data.partitions), tmp_path / "drill", progress=False)
    assert report.passed, report
