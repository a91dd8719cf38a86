"""The processor runtime: the only place where log, projection and outcome stream meet.

Per partition: read from `applied_offset + 1`, evaluate each record at its log
time clamped to be non-decreasing, apply it with the pure processors, publish
the outcomes, then commit the group's writes together with `applied_offset` and
`last_time` in one WriteBatch. Outcomes are published before the commit: a crash
in between replays the same records, which recompute the same outcomes, so
subscribers may see an outcome twice but never miss one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from threading import Event
from typing import Protocol, TypeGuard

from keyload.catalog import CatalogEntry, CatalogError
from keyload.checkpoints import CheckpointError, Checkpoints
from keyload.halts import Halt
from keyload.log.base import CommandLog, LogRecord
from keyload.log.file_log import DEFAULT_CONFIG
from keyload.object_store import ObjectStoreError
from keyload.processors import limits
from keyload.processors.apply import CHECKPOINT_KIND, apply_record
from keyload.processors.errors import Corruption
from keyload.processors.key_rotation import MissingKey
from keyload.processors.state import next_due_ms
from keyload.projections.store import Staged, Store, StoreError
from keyload.ticker import Ticker

MAX_GROUP_RECORDS = 512  # records applied per WriteBatch (group commit)
IDLE_POLL_MIN_S = 0.001  # first wait after the log runs dry
IDLE_POLL_MAX_S = 0.020  # the wait doubles while idle, up to this (worst added latency without a doorbell)
# Processors refuse results over MAX_OUTCOME_BYTES so that every outcome can be published.
assert DEFAULT_CONFIG.max_record_bytes >= limits.MAX_OUTCOME_BYTES, "an outcome must fit one log record"


class RecordSource(Protocol):
    """What a processor reads: one partition of the command log (whole, or as fetched for it)."""

    def read(self, partition: int, from_offset: int, max_records: int) -> list[LogRecord]: ...

    def end_offset(self, partition: int) -> int: ...

    def sync_through(self, partition: int, offset: int) -> None: ...


class PartitionProcessor:
    """Applies one partition of the command log to its projection."""

    def __init__(
        self,
        partition: int,
        partitions: int,
        log: RecordSource,
        store: Store,
        outcomes: CommandLog | None = None,
        checkpoints: Checkpoints | None = None,
        group_records: int = MAX_GROUP_RECORDS,
        keyring: Mapping[str, bytes] | None = None,
        keyring_loader: Callable[[], Mapping[str, bytes]] | None = None,
    ) -> None:
        assert 1 <= group_records <= MAX_GROUP_RECORDS
        self.partition = partition
        self.partitions = partitions
        self.log = log
        self.store = store
        self.outcomes = outcomes
        self.checkpoints = checkpoints
        self.group_records = group_records
        self.keyring = dict(keyring or {})
        self.keyring_loader = keyring_loader
        self.halt: Halt | None = None
        self.last_checkpoint: CatalogEntry | None = None
        self._applied = store.applied_offset
        self._last_time = store.last_time_ms
        self._checkpointed_offset = self._applied  # periodic checkpoints count from here ...
        self._checkpointed_at = time.monotonic()  # ... and from now
        end = log.end_offset(partition)
        if self._applied >= end:
            # The projection applied records the log no longer has (its tail was lost
            # after a crash): applying new records at those offsets would skip them.
            reason = f"RecoveryRequired: projection applied offset {self._applied} but the log ends at {end - 1}"
            self.halt = Halt(partition, self._applied, reason)

    @property
    def applied_offset(self) -> int:
        return self._applied

    def step(self, stop_after: int | None = None) -> int:
        """Apply at most one group of records (none past `stop_after`); returns how many.

        A record that needs a key the keyring lacks makes the runtime reload the
        keyring (keys are added to the file while running) and apply the group again;
        if the key is still missing the partition halts with RecoveryRequired.
        """
        try:
            return self._step(stop_after)
        except MissingKey:
            if self.keyring_loader is not None:
                self.keyring = dict(self.keyring_loader())
                try:
                    return self._step(stop_after)
                except MissingKey as again:
                    missing = again
            self.halt = Halt(self.partition, self._applied + 1, f"RecoveryRequired: {missing}")
            return 0

    def _step(self, stop_after: int | None) -> int:
        if self.halt is not None:
            return 0
        limit = self.group_records
        if stop_after is not None:
            limit = min(limit, stop_after - self._applied)
            if limit <= 0:
                return 0
        records = self.log.read(self.partition, self._applied + 1, limit)
        if not records:
            return 0
        stage = Staged(self.store)
        published: dict[int, list[bytes]] = {}
        applied, last_time, take_checkpoint = self._applied, self._last_time, False
        for record in records:
            assert record.offset == applied + 1, "log offsets must be dense"
            now_ms = max(record.timestamp_ms, last_time)
            try:
                result = apply_record(
                    stage, record.value, self.partition, self.partitions, record.offset, now_ms, self.keyring
                )
            except Corruption as exc:
                self.halt = Halt(self.partition, record.offset, f"Corruption: {exc}")
                break
            except MissingKey:
                raise  # nothing of this group is committed yet: step() reloads the keyring
            except Exception as exc:  # a processor bug: stop this partition, not the service
                self.halt = Halt(self.partition, record.offset, f"RecoveryRequired: {type(exc).__name__}: {exc}")
                break
            applied, last_time = record.offset, now_ms
            for reply_to, outcome in result.published:
                if self._publishes_to(reply_to):
                    published.setdefault(reply_to, []).append(outcome)
            if result.kind == CHECKPOINT_KIND and result.committed:
                take_checkpoint = True
                break  # a checkpoint is taken exactly at its command's offset
        count = applied - self._applied
        if count == 0:
            return 0
        if published:
            assert self.outcomes is not None
            self.outcomes.append_batches(published)
        self.log.sync_through(self.partition, applied)
        self.store.commit(stage.encoded_writes(), applied, last_time)
        self._applied, self._last_time = applied, last_time
        if take_checkpoint or self._periodic_checkpoint_due():
            self.take_checkpoint()
        return count

    def _periodic_checkpoint_due(self) -> bool:
        if self.checkpoints is None or self._applied == self._checkpointed_offset:
            return False
        policy = self.checkpoints.policy
        return (
            self._applied - self._checkpointed_offset >= policy.every_records
            or time.monotonic() - self._checkpointed_at >= policy.interval_s
        )

    def take_checkpoint(self) -> CatalogEntry | None:
        """Checkpoint and publish the projection at its applied offset.

        A failure (object store or catalog unreachable) is reported and leaves the
        partition running: the next periodic checkpoint tries again.
        """
        if self.checkpoints is None or self._applied < 0:
            return None
        self._checkpointed_offset, self._checkpointed_at = self._applied, time.monotonic()
        try:
            self.last_checkpoint = self.checkpoints.take(self.store, self.partition)
        except (CheckpointError, CatalogError, ObjectStoreError, StoreError, OSError) as exc:
            print(f"partition {self.partition}: checkpoint at offset {self._applied} failed: {exc}", file=sys.stderr)
            return None
        return self.last_checkpoint

    def _publishes_to(self, reply_to: int | None) -> TypeGuard[int]:
        """Whether an outcome goes to a reply partition (an unknown one is ignored)."""
        return self.outcomes is not None and reply_to is not None and 0 <= reply_to < self.outcomes.partitions

    def next_timer_ms(self) -> int | None:
        """Due time of the earliest pending timer in the projection, if any."""
        return next_due_ms(self.store)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def run_until(
    processors: list[PartitionProcessor],
    stop: Event,
    ticker: Ticker | None = None,
    idle_exit: bool = False,
    idle: Callable[[float], object] | None = None,
    idle_max_s: float = IDLE_POLL_MAX_S,
) -> list[Halt]:
    """Round-robin the partitions until `stop` is set (or, with idle_exit, until no work is left).

    When every partition is caught up the loop calls `idle(seconds)` (default: sleep
    unless stopped), doubling the wait up to `idle_max_s`; a doorbell's wait returns
    early when an appender rings.
    """
    idle = idle or stop.wait
    reported: set[int] = set()
    idle_wait = IDLE_POLL_MIN_S
    while not stop.is_set():
        applied = sum(processor.step() for processor in processors)
        report_halts(processors, reported)
        ticked = ticker.poll(processors, wall_clock_ms()) if ticker is not None else 0
        if applied or ticked:
            idle_wait = IDLE_POLL_MIN_S
            continue
        if idle_exit:
            break
        idle(idle_wait)
        idle_wait = min(idle_wait * 2, idle_max_s)
    return [p.halt for p in processors if p.halt is not None]


def report_halts(processors: list[PartitionProcessor], reported: set[int]) -> None:
    """Say once on stderr that a partition halted, and why."""
    for processor in processors:
        halt = processor.halt
        if halt is not None and halt.partition not in reported:
            reported.add(halt.partition)
            print(f"partition {halt.partition} halted at offset {halt.offset}: {halt.reason}", file=sys.stderr)
