"""The processor runtime: the only place where log, projection and outcome stream meet.

Per partition: read from `applied_offset + 1`, evaluate each record at its log
time clamped to be non-decreasing, apply it with the pure processors, make the
group's records durable in the log, publish the outcomes, then commit the group's
writes together with `applied_offset`, `last_time` and the identity of the last
applied record in one WriteBatch.

Order is what makes it safe:
- Nothing is published before the records it depends on are durable
  (`sync_through` first): a consumer is never handed a message that a power cut
  could take out of the log.
- Outcomes are published before the commit: a crash in between replays the same
  records, which recompute the same outcomes, so subscribers may see an outcome
  twice but never miss one.
- The projection remembers which record it applied last (offset and a digest of
  its bytes) and checks the log still holds it when it opens and whenever it
  resumes after being caught up: a log that lost its tail and took new appends
  at the same offsets halts the partition instead of skipping a record.

A fault halts at most the partition it touches: corruption in its log or
projection halts it (`Halt`; a row the processor reads from its read cache is
checked as it was committed, `projections/read_cache.py`), a write that cannot
be made (a full disk) leaves it at a command boundary and is retried (`Stalled`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from threading import Event
from typing import Protocol

from keyload import limits
from keyload.errors import KeyloadError
from keyload.log.base import (
    CommandLog,
    LogCorruption,
    LogError,
    LogRecord,
    LogTruncated,
    record_identity,
    valid_log_time,
)
from keyload.log.file_log import DEFAULT_CONFIG
from keyload.operations.catalog import CatalogEntry
from keyload.operations.checkpoints import Checkpoints
from keyload.processors.apply import CHECKPOINT_KIND, Applied, apply_out_of_range, apply_record
from keyload.processors.errors import Corruption
from keyload.processors.key_rotation import MissingKey
from keyload.processors.payloads.retention import awaits_announcement
from keyload.processors.queues.state import next_due_ms
from keyload.projections.read_cache import ReadCache
from keyload.projections.store import Staged, Store, StoreError, poison_count
from keyload.service.checkpoint_uploads import (
    MAX_PENDING_CHECKPOINTS,
    PUBLICATION_FAILURES,
    CheckpointUploads,
    Published,
    publish,
    retire,
)
from keyload.service.halts import Halt
from keyload.service.ticker import Ticker

MAX_GROUP_RECORDS = 512  # records applied per WriteBatch (group commit)
IDLE_POLL_MIN_S = 0.001  # first wait after the log runs dry
IDLE_POLL_MAX_S = 0.020  # the wait doubles while idle, up to this (worst added latency without a doorbell)
STALL_RETRY_MIN_S = 0.1  # first wait after a write failed (a full disk) before trying again
STALL_RETRY_MAX_S = 5.0  # the wait doubles while the write keeps failing, up to this
# Processors refuse results over MAX_OUTCOME_BYTES so that every outcome can be published.
assert DEFAULT_CONFIG.max_record_bytes >= limits.MAX_OUTCOME_BYTES, "an outcome must fit one log record"

log = logging.getLogger("keyload.service.runtime")


class RecordSource(Protocol):
    """What a processor reads: one partition of the command log (whole, or as fetched for it)."""

    def read(self, partition: int, from_offset: int, max_records: int) -> list[LogRecord]: ...

    def end_offset(self, partition: int) -> int: ...

    def sync_through(self, partition: int, offset: int) -> None: ...


class Stalled(KeyloadError):
    """A partition could not make its group durable (a full disk, an I/O error).

    Nothing of the group was committed: the partition stays at a command
    boundary, and stepping it again retries the same records.
    """

    def __init__(self, partition: int, offset: int, cause: Exception) -> None:
        super().__init__(f"partition {partition}: cannot commit through offset {offset}: {cause}")
        self.partition = partition


@dataclass(frozen=True, slots=True)
class _Group:
    """What applying one group of records produced, before it is made durable."""

    stage: Staged
    applied: int
    last_time: int
    last_record: LogRecord
    published: dict[int | None, list[bytes]]  # by reply partition; None: answered in process only
    poison: list[tuple[LogRecord, str]]
    take_checkpoint: bool


def first_record_ms(log: CommandLog, partition: int) -> int | None:
    """The log time of the first record `log` holds of `partition`, where a partition with no published
    checkpoint counts its periodic checkpoints' time from (`PartitionProcessor`); None when it holds
    none, or cannot be read now (the processor's start then)."""
    try:
        records = log.read(partition, log.start_offset(partition), 1)
    except LogError:
        return None
    return records[0].timestamp_ms if records else None


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
        identity_log: RecordSource | None = None,
        verify_on_resume: bool = True,
        announce: Callable[[int, CatalogEntry], None] | None = None,
        on_published: Callable[[int | None, list[bytes]], None] | None = None,
        uploads: CheckpointUploads | None = None,
        newest_checkpoint: CatalogEntry | None = None,
        first_record_ms: int | None = None,
    ) -> None:
        """`identity_log` (default: `log`) is read to check the applied record when the processor
        opens; `verify_on_resume` checks it again on every resume, which a source that cannot
        read behind what it handed out (Kafka mode's feed) turns off. `announce` is told of every
        checkpoint the processor publishes (the service's `Announcer` logs it). `on_published` is
        told of the outcomes of each reply partition once they are published (the HTTP server
        answers its requests from it), and of those of commands that name no reply partition, which
        it alone is told of (the embedded server's own commands: nothing else reads them). With
        `uploads`, a checkpoint is stored and published on their thread, not this one.
        `newest_checkpoint`, the partition's newest published checkpoint, is where periodic
        checkpoints count from: its offset, and as its time its last record's log time, so a
        restart does not start the count again (a service restarted more often than the interval
        would never take one); without it, records count from the log's start, and time from
        `first_record_ms`, the log time of the partition's first record (the services look it up
        when none is published: the function of that name), else from this processor's start."""
        assert 1 <= group_records <= MAX_GROUP_RECORDS
        self.partition = partition
        self.partitions = partitions
        self.log = log
        self.store = store
        self.reads = ReadCache(store)  # what its groups read, between groups (projections/read_cache.py)
        self.outcomes = outcomes
        self.checkpoints = checkpoints
        self.uploads = uploads
        self.group_records = group_records
        self.keyring = dict(keyring or {})
        self.keyring_loader = keyring_loader
        self.announce = announce
        self.on_published = on_published
        self.halt: Halt | None = None
        self.last_checkpoint: CatalogEntry | None = None
        self._applied = store.applied_offset
        self._last_time = store.last_time_ms
        self.poison_records = poison_count(store)  # kept as groups commit, for `/metrics`
        # The identity of the applied record as the projection holds it, once this processor has read
        # or committed it: the check on resuming compares against it without reading the projection.
        self._applied_identity: bytes | None = None
        self._unconfirmed = newest_checkpoint  # looked up in the projection once caught up (`_announced_newest`)
        # Periodic checkpoints count from the newest published one, also across restarts; while none is,
        # from the log's start (so restarts do not put off a partition's first).
        if newest_checkpoint is None:
            counted_from, counted_ms = -1, first_record_ms
        else:
            counted_from, counted_ms = newest_checkpoint.offset, newest_checkpoint.manifest.last_time_ms
        age_s = 0.0 if counted_ms is None else max(0, wall_clock_ms() - counted_ms) / 1000
        self._checkpointed_offset, self._checkpointed_at = counted_from, time.monotonic() - age_s
        self._identity_log = identity_log or log
        self._verify_on_resume = verify_on_resume
        self._verified = False  # the log holds the applied record, as of the last read
        self.caught_up = False  # the last step applied every record its read found, and the read was short
        self._store_failed = False  # a commit failed: reopen the projection before the next one
        self.stall: str | None = None  # why the last group could not be made durable, until one is
        self._skipped_checkpoints = 0  # periodic checkpoints skipped since the last one taken (`_skip_checkpoint`)
        self._verify_applied_record()

    @property
    def applied_offset(self) -> int:
        return self._applied

    def step(self, stop_after: int | None = None) -> int:
        """Apply at most one group of records (none past `stop_after`); returns how many. (Two
        groups, once, when the first catches up and the newest checkpoint needs announcing.)

        A record that needs a key the keyring lacks makes the runtime reload the
        keyring (keys are added to the file while running) and apply the group again;
        if the key is still missing the partition halts with RecoveryRequired.
        Raises Stalled when the group cannot be made durable; nothing is committed then.
        """
        self.settle_checkpoints()
        try:
            count = self._step_with_keys(stop_after)
            if self._announced_newest():
                count += self._step_with_keys(stop_after)  # apply it now: an announcement rings no doorbell
        except Stalled as exc:
            self.stall = str(exc)
            raise
        self.stall = None
        return count

    def _announced_newest(self) -> bool:
        """Announce the newest published checkpoint again if the projection, caught up with the log,
        never recorded it: its publisher stopped (kill -9) between publishing and announcing. Left
        so, the recovery floor could not move onto it (with access control on, it may name only a
        recorded checkpoint) until the catalog retired it. Once per processor, once caught up: an
        announcement a stop left in the log's backlog has been applied by then."""
        entry = self._unconfirmed
        if entry is None or self.announce is None or not self.caught_up or self.halt is not None or self._store_failed:
            return False
        try:  # caught up with the log itself, not a reader's buffer (Kafka mode's feed before its first fetch)
            if self.log.end_offset(self.partition) > self._applied + 1:
                return False
        except LogError:
            return False  # asked again at the next step that catches up
        self._unconfirmed = None
        if not awaits_announcement(self.store, entry.offset):
            return False
        log.info("partition %d: checkpoint at offset %d was never announced", self.partition, entry.offset)
        self._settle(Published(self.partition, entry.offset, entry))
        return not self.caught_up  # appended (`_settle` reports an append that failed)

    def _step_with_keys(self, stop_after: int | None) -> int:
        """A step; when a record needs a key the keyring lacks, the keyring is read again and the
        group applied again, in which a key still missing halts the partition at that record (the
        records before it commit, as before any halt)."""
        try:
            return self._step(stop_after)
        except MissingKey:
            if self.keyring_loader is not None:
                self.keyring = dict(self.keyring_loader())
            return self._step(stop_after, keys_reloaded=True)

    def _step(self, stop_after: int | None, keys_reloaded: bool = False) -> int:
        if self.halt is not None:
            return 0
        limit = self.group_records
        if stop_after is not None:
            limit = min(limit, stop_after - self._applied)
            if limit <= 0:
                return 0
        if self._store_failed:
            self._reopen_store()
        records = self._read(limit)
        if not records:
            return 0
        group = self._apply(records, keys_reloaded)
        if group is None:
            return 0
        if group.applied != records[-1].offset:  # a checkpoint ended the group early: records are left
            self.caught_up = False
        count = group.applied - self._applied
        if not self._commit(group):
            return 0
        if group.take_checkpoint or self._periodic_checkpoint_due():
            self.take_checkpoint()
        return count

    def _read(self, limit: int) -> list[LogRecord]:
        """The next records to apply; on resuming, first the applied record again, to check it.

        Fewer than `limit` records means the log held no more when it was read: the partition is
        caught up (`caught_up`), so the service need not read it again until an append rings, and
        the next read is a resume."""
        check = self._verify_on_resume and not self._verified and self._applied >= 0
        start = self._applied if check else self._applied + 1
        try:
            records = self.log.read(self.partition, start, limit + 1 if check else limit)
        except LogCorruption as exc:
            if exc.offset is not None and self._applied + 1 < exc.offset:
                # The records in front of the damage apply first (a projection rebuilt over a damaged
                # log): the partition is served up to the damage, then halts at it on the next read.
                return self._read(min(limit, exc.offset - self._applied - 1))
            self._halt_on_corruption(exc)
            return []
        except LogTruncated as exc:
            if check:  # truncated through the applied record (up to the floor + 1): nothing left to compare
                self._verified = True
                return self._read(limit)
            reason = f"RecoveryRequired: {exc}; restore a checkpoint at or past the log's start"
            self.halt = Halt(self.partition, start, reason)
            return []
        except LogError as exc:
            raise Stalled(self.partition, self._applied + 1, exc) from exc
        if check:
            if not self._check_identity(records[0] if records else None):
                return []
            records = records[1:]
        self.caught_up = len(records) < limit
        if self.caught_up:
            self._verified = False  # check the applied record once more on the next resume
        return records

    def _apply(self, records: list[LogRecord], keys_reloaded: bool = False) -> _Group | None:
        """Apply the records to a stage over the projection; None when the first one halts. A key
        the keyring lacks raises MissingKey (so the keyring is read again) until `keys_reloaded`."""
        stage = Staged(self.reads)
        published: dict[int | None, list[bytes]] = {}
        poison: list[tuple[LogRecord, str]] = []
        applied, last_time, take_checkpoint = self._applied, self._last_time, False
        last_record: LogRecord | None = None
        for record in records:
            assert record.offset == applied + 1, "log offsets must be dense"
            try:
                result, now_ms = self._apply_one(stage, record, last_time)
            except Corruption as exc:
                self.halt = Halt(self.partition, record.offset, f"Corruption: {exc}")
                break
            except MissingKey as exc:
                if not keys_reloaded:
                    raise  # nothing of this group is committed yet: the step reloads the keyring
                self.halt = Halt(self.partition, record.offset, f"RecoveryRequired: {exc}")
                break
            except Exception as exc:  # a processor bug: stop this partition, not the service
                self.halt = Halt(self.partition, record.offset, f"RecoveryRequired: {type(exc).__name__}: {exc}")
                break
            applied, last_time, last_record = record.offset, now_ms, record
            if result.poison is not None:
                poison.append((record, result.poison))
            for reply_to, outcome in result.published:
                if self._publishes_to(reply_to):
                    published.setdefault(reply_to, []).append(outcome)
            if result.kind == CHECKPOINT_KIND and result.committed:
                take_checkpoint = True
                break  # a checkpoint is taken exactly at its command's offset
        if last_record is None:
            return None
        return _Group(stage, applied, last_time, last_record, published, poison, take_checkpoint)

    def _apply_one(self, stage: Staged, record: LogRecord, last_time: int) -> tuple[Applied, int]:
        """(what the record did, its evaluation time): its log time clamped, or poison when out of range."""
        if not valid_log_time(record.timestamp_ms):
            return apply_out_of_range(stage, record.value, record.offset, last_time, record.timestamp_ms), last_time
        now_ms = max(record.timestamp_ms, last_time)
        applied = apply_record(
            stage, record.value, self.partition, self.partitions, record.offset, now_ms, self.keyring
        )
        return applied, now_ms

    def _commit(self, group: _Group) -> bool:
        """Durable log, then outcomes, then the projection (see the module docstring).

        False: a corrupt log halted the partition instead; nothing was committed.
        """
        identity = record_identity(group.last_record)
        try:
            self.log.sync_through(self.partition, group.applied)
            self._publish(group.published)
            stage = group.stage
            self.reads.commit(stage.encoded_writes(), group.applied, group.last_time, identity, stage.written_records())
        except LogCorruption as exc:
            self._halt_on_corruption(exc)
            return False
        except StoreError as exc:
            self._store_failed = True
            raise Stalled(self.partition, group.applied, exc) from exc
        except LogError as exc:
            raise Stalled(self.partition, group.applied, exc) from exc
        self._applied, self._last_time, self._applied_identity = group.applied, group.last_time, identity
        self.poison_records += len(group.poison)
        for record, reason in group.poison:
            log.warning(
                "partition %d: poison record at offset %d (%d bytes): %s",
                self.partition,
                record.offset,
                len(record.value),
                reason,
            )
        return True

    def _publish(self, published: dict[int | None, list[bytes]]) -> None:
        """Append the group's outcomes, reply partition by reply partition; those of commands that
        name none go to `on_published` alone.

        A corrupt reply partition of the outcome stream (derived data, never
        fsynced) loses its outcomes and is reported; it does not halt the command
        partition: every outcome is stored (or, a read's, computed afresh), and a client
        resubmitting by command id is answered on another reply partition or once the
        stream is repaired.
        """
        for reply_to, outcomes in published.items():
            # Durable already (stored, recomputed on replay, or a read's), so handed over in process
            # first: a Kafka server notes them before the copies it reads back can reach it.
            if self.on_published is not None:
                self.on_published(reply_to, outcomes)
            if reply_to is not None:
                self._append_outcomes(reply_to, outcomes)

    def _append_outcomes(self, reply_to: int, outcomes: list[bytes]) -> None:
        assert self.outcomes is not None
        try:
            self.outcomes.append(reply_to, outcomes)
        except LogCorruption as exc:
            log.error(
                "partition %d: %d outcomes not published: outcome partition %d is damaged (%s); "
                "stop the service and delete log/outcomes/p-%04d (derived data) to repair it",
                self.partition,
                len(outcomes),
                reply_to,
                exc,
                reply_to,
            )

    def _reopen_store(self) -> None:
        """Reopen the projection after a failed write; it may hold the failed group after all
        (RocksDB recovered it from its write-ahead log), so the position is read again."""
        try:
            self.reads.clear()
            self.store.reopen()
        except StoreError as exc:
            raise Stalled(self.partition, self._applied + 1, exc) from exc
        self._store_failed = False
        self._applied, self._last_time = self.store.applied_offset, self.store.last_time_ms
        self.poison_records = poison_count(self.store)
        self._applied_identity = None
        self._verified = False

    def _verify_applied_record(self) -> None:
        """Halt unless the log still holds, at the applied offset, the record the projection applied."""
        if self._applied < 0:
            self._verified = True
            return
        try:
            records = self._identity_log.read(self.partition, self._applied, 1)
        except LogCorruption as exc:
            self._halt_on_corruption(exc)
            return
        except LogTruncated:
            self._verified = True  # truncated through the applied record: there is nothing to compare
            return
        except LogError as exc:  # a log that cannot be read now (Kafka: past its end, or unreachable)
            try:
                ended = self._identity_log.end_offset(self.partition) <= self._applied
            except LogError:
                ended = False
            if ended:
                self._check_identity(None)
            else:
                log.warning("partition %d: the applied record could not be checked: %s", self.partition, exc)
            return
        self._check_identity(records[0] if records else None)

    def _check_identity(self, record: LogRecord | None) -> bool:
        """Whether `record` (read at the applied offset) is the one applied; halts the partition if not."""
        if record is None or record.offset != self._applied:
            reason = (
                f"RecoveryRequired: the projection applied offset {self._applied} but the log now ends before it "
                "(its tail was lost); restore a checkpoint at or below the log's end and replay"
            )
            self.halt = Halt(self.partition, self._applied, reason)
            return False
        identity = record_identity(record)
        stored = self._applied_identity if self._applied_identity is not None else self.store.applied_record
        if stored is None:
            self.store.record_applied(identity)  # a projection from before identities were kept
        elif stored != identity:
            reason = (
                f"RecoveryRequired: the record at offset {self._applied} is not the one the projection applied "
                "(the log lost its tail and took new records at the same offsets); "
                "restore a checkpoint at or below the log's end and replay"
            )
            self.halt = Halt(self.partition, self._applied, reason)
            return False
        self._applied_identity = identity
        self._verified = True
        return True

    def _halt_on_corruption(self, exc: LogCorruption) -> None:
        offset = exc.offset if exc.offset is not None else self._applied + 1
        self.halt = Halt(self.partition, offset, f"Corruption: {exc}")

    def _periodic_checkpoint_due(self) -> bool:
        if self.checkpoints is None or self._applied == self._checkpointed_offset:
            return False
        policy = self.checkpoints.policy
        return (
            self._applied - self._checkpointed_offset >= policy.every_records
            or time.monotonic() - self._checkpointed_at >= policy.interval_s
        )

    def take_checkpoint(self) -> CatalogEntry | None:
        """Checkpoint the projection at its applied offset and publish it: here, or through
        `uploads` on their thread (None then: `settle_checkpoints` announces it later).

        A failure (object store or catalog unreachable) is reported and leaves the
        partition running: the next periodic checkpoint tries again.
        """
        if self.checkpoints is None or self._applied < 0:
            return None
        self._checkpointed_offset, self._checkpointed_at = self._applied, time.monotonic()
        if self.uploads is not None and not self.uploads.has_room(self.partition):
            self._skip_checkpoint()
            return None
        try:
            snapshot = self.checkpoints.snapshot(self.store, self.partition)
        except PUBLICATION_FAILURES as exc:
            return self._settle(Published(self.partition, self._applied, None, str(exc)))
        if self.uploads is None:
            published = publish(self.checkpoints, snapshot)
            entry = self._settle(published)
            retire(self.checkpoints, published)
            return entry
        if not self.uploads.submit(snapshot):
            self.checkpoints.discard(snapshot)  # the service began stopping since `has_room`
            self._skip_checkpoint()
        elif self._skipped_checkpoints:
            log.info(
                "partition %d: checkpoint at offset %d taken, after %d skipped",
                self.partition,
                self._applied,
                self._skipped_checkpoints,
            )
            self._skipped_checkpoints = 0
        return None

    def _skip_checkpoint(self) -> None:
        """A periodic checkpoint not taken while earlier ones are still being published (an object
        store slower than the policy asks): said once per run of them, counted when one is taken."""
        if not self._skipped_checkpoints:
            log.warning(
                "partition %d: checkpoint at offset %d skipped: the service is stopping, or %d earlier ones "
                "are still being published (further ones skipped are counted when one is taken)",
                self.partition,
                self._applied,
                MAX_PENDING_CHECKPOINTS,
            )
        self._skipped_checkpoints += 1

    def settle_checkpoints(self) -> None:
        """Announce the checkpoints `uploads` published for this partition since the last call,
        and report those that failed."""
        if self.uploads is not None:
            for published in self.uploads.finished(self.partition):
                self._settle(published)

    def _settle(self, published: Published) -> CatalogEntry | None:
        if published.entry is None:
            log.warning(
                "partition %d: checkpoint at offset %d failed: %s", self.partition, published.offset, published.failure
            )
            return None
        self.last_checkpoint = published.entry
        if self._unconfirmed is not None and published.offset >= self._unconfirmed.offset:
            self._unconfirmed = None  # a newer checkpoint is announced: the older one need not be
        if self.announce is not None:
            try:
                self.announce(self.partition, published.entry)
                self.caught_up = False  # the announcement was appended to this partition: read it again
            except (LogError, OSError) as exc:  # the floor waits for a later checkpoint: never too early
                log.warning(
                    "partition %d: checkpoint at offset %d not recorded: %s", self.partition, published.offset, exc
                )
        return published.entry

    def _publishes_to(self, reply_to: int | None) -> bool:
        """Whether an outcome goes to a reply partition (an unknown one is ignored), or, naming none,
        to `on_published`."""
        if reply_to is None:
            return self.on_published is not None
        return self.outcomes is not None and 0 <= reply_to < self.outcomes.partitions

    def next_timer_ms(self) -> int | None:
        """Due time of the earliest pending timer in the projection, if any; None while a failed
        commit stalls the partition (its projection may not even be open): a Tick could not apply."""
        if self._store_failed:
            return None
        return next_due_ms(self.store)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Stalls:
    """Steps partitions and tracks those waiting for a write to succeed again (a full disk).

    It says so once when a partition stalls and once when it resumes. A stalled
    partition is tried again after a back-off of its own (STALL_RETRY_MIN_S,
    doubling to STALL_RETRY_MAX_S) while the others go on at full speed; with
    `fail_fast` the first stall is raised instead (the operator asked the
    service to exit on it).
    """

    def __init__(self, fail_fast: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.fail_fast = fail_fast
        self.waiting: dict[int, tuple[float, float]] = {}  # partition -> (when to try again, back-off)
        self._clock = clock

    def step(self, processor: PartitionProcessor) -> int:
        partition = processor.partition
        waiting = self.waiting.get(partition)
        if waiting is not None and self._clock() < waiting[0]:
            return 0
        try:
            count = processor.step()
        except Stalled as exc:
            if self.fail_fast:
                raise
            if waiting is None:
                log.error("%s; retrying until it succeeds", exc)
            backoff = STALL_RETRY_MIN_S if waiting is None else min(waiting[1] * 2, STALL_RETRY_MAX_S)
            self.waiting[partition] = (self._clock() + backoff, backoff)
            return 0
        if waiting is not None:
            del self.waiting[partition]
            log.warning("partition %d: writes succeed again; applied through %d", partition, processor.applied_offset)
        return count

    def tick(self, ticker: Ticker, processors: list[PartitionProcessor]) -> int:
        """Let the ticker append; a failed append (a full disk) is retried at the next poll."""
        try:
            return ticker.poll(processors, wall_clock_ms())
        except LogError as exc:
            if self.fail_fast:
                raise
            log.error("ticker: cannot append a Tick: %s; retrying", exc)
            return 0


def run_until(
    processors: list[PartitionProcessor],
    stop: Event,
    ticker: Ticker | None = None,
    idle_exit: bool = False,
    idle: Callable[[float], object] | None = None,
    idle_min_s: float = IDLE_POLL_MIN_S,
    idle_max_s: float = IDLE_POLL_MAX_S,
    on_halt: Callable[[Halt], None] | None = None,
    fail_fast: bool = False,
) -> list[Halt]:
    """Round-robin the partitions until `stop` is set (or, with idle_exit, until no work is left).

    When every partition is caught up the loop calls `idle(seconds)` (default: sleep
    unless stopped), doubling the wait from `idle_min_s` up to `idle_max_s`; a
    doorbell's wait returns early when an appender rings, so with one the wait need
    not start short. When it returns the partitions the rings named (a frozenset),
    only those are read, and a partition that applied something is read again until
    it has caught up (a short read says so: `caught_up`): a wake-up costs a read of the
    partition that has work, not of every one. While partitions are busy the rings that
    came meanwhile are taken with `idle(0)`, so a busy partition never keeps a rung one
    waiting. Every partition is read at least every `idle_max_s` all the same, busy or
    not, for appenders that do not ring (the ticker's appends, or a lost ring; the
    checkpoint announcer's append marks its partition not caught up). Any
    other answer of `idle` than a frozenset means: read every partition. A halted
    partition is reported once (and passed to `on_halt`) while the others go on; a
    stalled one is retried with back-off.
    """
    idle = idle or stop.wait
    reported: set[int] = set()
    stalls = Stalls(fail_fast)
    idle_wait = idle_min_s
    due = processors
    swept_at = time.monotonic()
    while not stop.is_set():
        if due is processors:
            swept_at = time.monotonic()
        applied = [processor for processor in due if stalls.step(processor)]
        busy = [processor for processor in applied if not processor.caught_up]
        report_halts(processors, reported, on_halt)
        ticked = stalls.tick(ticker, processors) if ticker is not None else 0
        if applied:
            idle_wait = idle_min_s
        if busy or ticked:
            rung = None if ticked else idle(0)  # rings that came meanwhile, taken without waiting
        else:
            if due is not processors and (idle_exit or time.monotonic() - swept_at >= idle_max_s):
                due = processors
                continue
            if idle_exit and not stalls.waiting:
                break
            wait = idle_wait if ticker is None else min(idle_wait, ticker.next_poll_ms(wall_clock_ms()) / 1000)
            rung = idle(wait)  # never past the ticker's next look: a due timer is not kept waiting by the idle back-off
            idle_wait = min(idle_wait * 2, idle_max_s)
        if isinstance(rung, frozenset) and time.monotonic() - swept_at < idle_max_s:
            due = [p for p in processors if p in busy or p.partition in rung or p.partition in stalls.waiting]
        else:
            due = processors
    return [p.halt for p in processors if p.halt is not None]


def report_halts(
    processors: list[PartitionProcessor], reported: set[int], on_halt: Callable[[Halt], None] | None = None
) -> None:
    """Say once that a partition halted, and why; the others keep serving."""
    for processor in processors:
        halt = processor.halt
        if halt is not None and halt.partition not in reported:
            reported.add(halt.partition)
            log.error("partition %d halted at offset %d: %s", halt.partition, halt.offset, halt.reason)
            if on_halt is not None:
                on_halt(halt)
