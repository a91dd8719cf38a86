"""The embedded outcome stream keeps what it published for 7 days (OUTCOME_RETENTION_MS), as the
outcomes topic does in Kafka mode: the serving process deletes older segments, and a local client
whose position they held reads on from the stream's start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from keyload import Client
from keyload.errors import OutcomeTimeout
from keyload.log.base import OUTCOME_RETENTION_MS
from keyload.log.file_log import DEFAULT_CONFIG, FileLog, FileLogConfig, FsyncPolicy
from keyload.service.runtime import wall_clock_ms
from keyload.storage.datadir import DEFAULT_OUTCOME_PARTITIONS

from .support import keyload_command, start_service, stop_service, wait_until


def test_the_service_deletes_outcome_segments_past_retention_and_a_client_reads_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run(
        keyload_command("run", "--data", str(data), "--partitions", "1", "--until-idle", "--listen", "none"),
        check=True,
        capture_output=True,
        timeout=60,
    )
    stale_ms = wall_clock_ms() - OUTCOME_RETENTION_MS - 60_000
    stream = data / "log" / "outcomes"
    outcomes = FileLog(stream, DEFAULT_OUTCOME_PARTITIONS, FileLogConfig(fsync=FsyncPolicy.NONE), lambda: stale_ms)
    with Client(data, timeout_s=0.2, reply_partition=0) as client, outcomes:
        with pytest.raises(OutcomeTimeout):  # nothing serves: the client's position stays at the stream's start
            client.create_queue("shop", "orders")
        # Outcomes published 7 days and a minute ago, over two segments (the largest records: few writes).
        outcomes.append(0, [bytes(DEFAULT_CONFIG.max_record_bytes)] * 20)
        [second] = [base for base in _segments(data) if base > 0]
        service = start_service(data, "--listen", "none", "--gc-interval-s", "0")
        try:
            wait_until(lambda: _segments(data) == [second], what="the segment past retention deleted")
            client.timeout_s = 30
            assert client.enqueue("shop", "orders", b"x", message_id="m").state == "ready"
        finally:
            assert stop_service(service) == 0
        assert _segments(data) == [second]  # the newest segment stays, though it is as old


def _segments(data: Path) -> list[int]:
    return sorted(int(path.stem) for path in (data / "log" / "outcomes" / "p-0000").glob("*.seg"))
