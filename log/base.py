"""The log interface every backend (embedded file log, Kafka) implements."""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from keyload.errors import KeyloadError

# The log times a processor evaluates commands at: milliseconds since the epoch,
# from just after it (0 and negative are "no time") to 2^43 - 1 (year 2248). A record
# stamped outside this range is bad input: recorded as poison, never applied, and
# it does not move log time. Every duration a command may add to log time is far
# below 2^62, so log time plus any duration fits a u64 key and an Avro long.
MIN_LOG_TIME_MS = 1
MAX_LOG_TIME_MS = 2**43 - 1

# How long the outcome stream keeps what it published (derived data: a replay reproduces it): the
# outcomes topic is created with it (Kafka), the embedded service deletes older segments.
OUTCOME_RETENTION_MS = 7 * 24 * 60 * 60 * 1000


def valid_log_time(timestamp_ms: int) -> bool:
    return MIN_LOG_TIME_MS <= timestamp_ms <= MAX_LOG_TIME_MS


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record as read back: its position and the time the log stamped on it."""

    partition: int
    offset: int
    timestamp_ms: int
    value: bytes


def record_identity(record: LogRecord) -> bytes:
    """SHA-256 over a record's offset, timestamp and bytes: what a projection remembers of the
    record it applied last, so that a log that lost and rewrote its tail is noticed."""
    digest = hashlib.sha256(_IDENTITY.pack(record.offset, record.timestamp_ms))
    digest.update(record.value)
    return digest.digest()


_IDENTITY = struct.Struct(">Qq")


@dataclass(frozen=True, slots=True)
class Appended:
    partition: int
    offset: int
    timestamp_ms: int


class ClosedOnExit:
    """`with log:` closes the log on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class LogError(KeyloadError):
    """The log cannot serve the request (I/O failure, integrity failure, bad argument)."""


class LogCorruption(LogError):
    """A record in the middle of a partition fails its checksum: recovery is required.

    `offset` is the first offset that cannot be read, when the log knows it.
    """

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


class LogTruncated(LogError):
    """The offset asked for lies below the log's start: the records before it were truncated."""


ROUTED_DOMAINS = 4096  # domains whose partition is remembered: every request and command asks again
# Only names no longer than a domain may be are remembered (keyload.limits asserts the relation): the
# HTTP API routes a request by its domain before the domain is checked, so a longer name, never a
# valid domain, is routed without being kept.
ROUTED_DOMAIN_CHARS = 64


def partition_for(domain: str, partitions: int) -> int:
    """The one domain→partition function; every backend must use it.

    SHA-256 of the UTF-8 domain, first 8 bytes big-endian, modulo the partition
    count: stable across processes, languages and Python versions. Pure, so the answers
    for recent domains are kept (the HTTP API and the processor each ask once a command).
    """
    if len(domain) <= ROUTED_DOMAIN_CHARS:
        return _remembered_partition(domain, partitions)
    return _partition(domain, partitions)


@functools.lru_cache(maxsize=ROUTED_DOMAINS)
def _remembered_partition(domain: str, partitions: int) -> int:
    return _partition(domain, partitions)


def _partition(domain: str, partitions: int) -> int:
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    digest = hashlib.sha256(domain.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


class CommandLog(Protocol):
    """A partitioned, append-only log of opaque records.

    Offsets start at 0 and are dense per partition. The log stamps each record
    with its append time in milliseconds; readers treat it as the record's time.
    """

    @property
    def partitions(self) -> int: ...

    def append(self, partition: int, values: list[bytes]) -> list[Appended]:
        """Append records to one partition, durably per the backend's policy."""
        ...

    def append_batches(self, batches: Mapping[int, list[bytes]]) -> None:
        """Append to several partitions at once; durable when it returns; order within each list kept."""
        ...

    def read(self, partition: int, from_offset: int, max_records: int) -> list[LogRecord]:
        """Up to `max_records` records from `from_offset`; empty when none are there yet."""
        ...

    def end_offset(self, partition: int) -> int:
        """The offset the next appended record of `partition` will get."""
        ...

    def start_offset(self, partition: int) -> int:
        """The first offset still readable: 0 until the log is truncated."""
        ...

    def truncate_before(self, partition: int, offset: int) -> int:
        """Delete records below `offset`; returns the new start offset.

        A backend that deletes in whole segments may keep some records below
        `offset`: the returned start is never above it.
        """
        ...

    def sync_through(self, partition: int, offset: int) -> None:
        """Make records through `offset` durable before a projection that applied them is.

        A reader may see records an appender has written but not yet fsynced; the
        processor calls this before committing so its projection is never ahead of
        the durable log.
        """
        ...

    def close(self) -> None: ...
