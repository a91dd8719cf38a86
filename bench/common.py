"""What bench.throughput and bench.cycle share: the workload's envelope, timing, the raw references."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from keyload.datadir import DataDir
from keyload.log.codec import REGISTRY

COMMAND = "keyload.Command"
OUTCOME = "keyload.Outcome"

DOMAIN = "bench"
QUEUE = "bench-queue"
PRINCIPAL = "bench"
REPLY_TO = 0  # the outcome partition the "client" listens on
CLIENT_TIME_MS = 1_700_000_000_000
SEED = 20_240_601

Write = tuple[bytes, bytes | None]  # a value of None is a delete


class BenchError(Exception):
    """The run did not do what it was meant to measure."""


def encode_command(command_id: str, kind: str, body: dict[str, Any]) -> bytes:
    """A Command envelope as the SDK writes it: one domain and principal, reply_to set."""
    return REGISTRY.encode(
        COMMAND,
        {
            "command_id": command_id,
            "domain": DOMAIN,
            "principal": PRINCIPAL,
            "body": (kind, body),
            "reply_to": REPLY_TO,
            "client_time_ms": CLIENT_TIME_MS,
        },
    )


def peak_rss_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KiB elsewhere


class Stopwatch:
    """Wall clock and this thread's CPU time between start() and stop().

    stop() adds to the totals, so one Stopwatch can time a loop that runs in pieces.
    """

    def __init__(self) -> None:
        self.seconds = self.cpu_seconds = 0.0
        self._wall = self._cpu = 0.0

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def stop(self) -> None:
        self.seconds += time.perf_counter() - self._wall
        self.cpu_seconds += time.thread_time() - self._cpu


def raw_writes(path: Path, batches: Iterable[Sequence[Write]]) -> Stopwatch:
    """The batches through rocksdict alone, one WriteBatch each, with the options Store uses."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    path.mkdir(parents=True)
    db = Rdict(str(path), options)
    write_options = WriteOptions()
    write_options.sync = False  # Store's default, and what `keyload run` uses
    watch = Stopwatch()
    try:
        watch.start()
        for writes in batches:
            batch = WriteBatch(raw_mode=True)
            for key, value in writes:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            db.write(batch, write_options)
        watch.stop()
    finally:
        db.close()
    return watch


def read_and_decode(data: DataDir, partition: int, first: int, groups: Sequence[int]) -> Stopwatch:
    """FileLog.read() from offset `first` in groups of the given sizes, and REGISTRY.decode of every record."""
    log = data.command_log()
    watch = Stopwatch()
    try:
        decode = REGISTRY.decode
        offset = first
        watch.start()
        for size in groups:
            records = log.read(partition, offset, size)
            if len(records) != size:
                raise BenchError(f"the log ended at offset {offset + len(records)}")
            for record in records:
                decode(COMMAND, record.value)
            offset += size
        watch.stop()
    finally:
        log.close()
    return watch


def environment(warmup: int, directory: Path) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "fastavro": importlib.metadata.version("fastavro"),
        "rocksdict": importlib.metadata.version("rocksdict"),
        "warmup_commands": warmup,
        "directory": str(directory),
    }
