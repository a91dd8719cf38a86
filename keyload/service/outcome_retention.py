"""Retention of the embedded outcome stream (`DATA/log/outcomes`).

The outcome stream is derived data: a replay reproduces every outcome, and a client that lost
one resubmits its command by id, answered from the stored outcome. Nothing reads an outcome long
after it was published (a client waits for its own for seconds), so the stream keeps what it
published for `OUTCOME_RETENTION_MS` (7 days), as the outcomes topic does in Kafka mode, and the
serving process deletes older segments: once at start and every `OUTCOME_RETENTION_CHECK_S`. A
reader whose position was deleted reads on from the stream's start (keyload/sdk/log_transport.py,
keyload/server/writer.py). Only whole segments go, never the newest, so a reply partition keeps
at most a segment (64 MiB) besides its last 7 days.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from keyload.log.base import OUTCOME_RETENTION_MS, LogError
from keyload.log.file_log import FileLog

log = logging.getLogger("keyload.service.outcome_retention")

OUTCOME_RETENTION_CHECK_S = 600.0  # between two passes over the reply partitions


class OutcomeRetention:
    """Deletes the outcome stream's segments past retention, on a thread of its own, through an
    instance of the stream's log it owns (closed at `stop`)."""

    def __init__(
        self, outcomes: FileLog, clock_ms: Callable[[], int], interval_s: float = OUTCOME_RETENTION_CHECK_S
    ) -> None:
        self.outcomes = outcomes
        self.clock_ms = clock_ms
        self._starts: dict[int, int] = {}  # each reply partition's start offset after the last pass
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(interval_s,), name="keyload-outcome-retention", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.outcomes.close()

    def collect(self) -> None:
        """One pass: every reply partition keeps what it published within the retention."""
        cutoff = self.clock_ms() - OUTCOME_RETENTION_MS
        for partition in range(self.outcomes.partitions):
            try:
                start = self.outcomes.truncate_older_than(partition, cutoff)
            except LogError as exc:  # a damaged segment (§7b): its partition is tried again next pass
                log.warning("outcome stream partition %d: retention passed over: %s", partition, exc)
            except Exception:  # a fault of its own: logged, and the next pass tries again
                log.exception("outcome stream partition %d: retention failed", partition)
            else:
                if start > self._starts.get(partition, 0):
                    log.info("outcome stream partition %d now starts at offset %d", partition, start)
                self._starts[partition] = start

    def _run(self, interval_s: float) -> None:
        while True:
            self.collect()
            if self._stop.wait(interval_s):
                return
