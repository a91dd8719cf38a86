"""The processor service in Kafka mode: partition ownership through a consumer group.

Processors join one consumer group on the command topic (cooperative-sticky
assignment). Ownership only decides *who* applies a partition; *where* to start
is the projection's own `applied_offset`, never the group's committed offset:

- **Assigned**: open the local projection if it is current (at or past the
  newest published checkpoint); otherwise restore that checkpoint from the
  object store, pinned until the restored projection is open; then fetch from
  `applied_offset + 1`.
- **Revoked** (or lost): the batch in hand is already committed — rebalance
  callbacks run between batches — so the partition's projection is closed and
  nothing more is applied to it.
- Group offsets are committed as `applied_offset + 1` only so that lag shows in
  the usual Kafka tools.

Two processors applying one partition during a rebalance (a zombie) compute the
same outcomes and the same state, so an overlap is harmless.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from threading import Event
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from keyload.credentials import ADMIN_PRINCIPAL
from keyload.log.base import LogRecord
from keyload.log.kafka_log import KafkaLog, KafkaSettings, ensure_topics, record_from_message
from keyload.operations.catalog import CatalogEntry, NotPublished
from keyload.operations.checkpoints import Announcer, CheckpointError, Checkpoints, recovery_session
from keyload.projections.store import Store
from keyload.service import access_control
from keyload.service.checkpoint_uploads import CheckpointUploads
from keyload.service.halts import Halt, record_halt
from keyload.service.runtime import MAX_GROUP_RECORDS, PartitionProcessor, Stalls, first_record_ms, report_halts
from keyload.service.system_commands import feature_level_command
from keyload.service.ticker import Ticker
from keyload.storage.datadir import DataDir
from keyload.storage.principals import CHECKPOINTER_PRINCIPAL, TICKER_PRINCIPAL, system_credential

log = logging.getLogger("keyload.service.kafka")

FETCH_WAIT_S = 0.1  # longest wait for new records before the ticker and checkpoints get a turn
ADVISORY_COMMIT_INTERVAL_S = 5.0
DEFAULT_SESSION_TIMEOUT_MS = 10_000  # a killed processor's partitions move after about this long
GROUP_SUFFIX = ".processors"


class PartitionFeed:
    """What the group consumer fetched for one owned partition, read by its processor as its log."""

    def __init__(self, partition: int, end_offset: Callable[[int], int]) -> None:
        self.partition = partition
        self._end_offset = end_offset
        self._records: deque[LogRecord] = deque()

    def push(self, record: LogRecord) -> None:
        self._records.append(record)

    def read(self, partition: int, from_offset: int, max_records: int) -> list[LogRecord]:
        """The fetched records from `from_offset` on. Records are dropped only once a read starts
        past them, so a group that could not be committed (a stall, a missing key) is read again."""
        assert partition == self.partition
        while self._records and self._records[0].offset < from_offset:
            self._records.popleft()
        return list(itertools.islice(self._records, max_records))

    def end_offset(self, partition: int) -> int:
        return self._end_offset(partition)

    def sync_through(self, partition: int, offset: int) -> None:
        """Nothing to do: a consumer only sees records every in-sync replica has."""


@dataclass(slots=True)
class Owned:
    processor: PartitionProcessor
    store: Store
    feed: PartitionFeed


class KafkaService:
    """One processor process of the group: owns some partitions, applies them, checkpoints them."""

    def __init__(
        self,
        data: DataDir,
        checkpoints: Checkpoints,
        tick_interval_ms: int,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        on_published: Callable[[int | None, list[bytes]], None] | None = None,
    ) -> None:
        self.data = data
        self.on_published = on_published  # the HTTP server's in-process answers
        self.settings: KafkaSettings = data.kafka_settings()
        ensure_topics(self.settings)
        self.commands = KafkaLog.commands(self.settings)
        self.outcomes = KafkaLog.outcomes(self.settings)
        self.checkpoints = checkpoints
        self.uploads = CheckpointUploads(lambda: data.checkpoints(checkpoints.policy))
        # Every service appends the same EnableAccessControl: a repeat in a partition that applied one.
        access_control.enable(data.root, self.commands, range(self.commands.partitions))
        # And the same RaiseFeatureLevel (processors/features.py): a repeat where it was applied.
        admin = system_credential(data.root, ADMIN_PRINCIPAL)
        for partition in range(self.commands.partitions):
            self.commands.append(partition, [feature_level_command(admin, partition, self.commands.partitions)])
        self.ticker = Ticker(self.commands, system_credential(data.root, TICKER_PRINCIPAL), tick_interval_ms)
        self.announce = Announcer(self.commands, system_credential(data.root, CHECKPOINTER_PRINCIPAL))
        self.keyring = data.keyring()
        self.owned: dict[int, Owned] = {}
        self._consumer = Consumer(
            {
                "bootstrap.servers": self.settings.bootstrap,
                **self.settings.client_config,
                "group.id": self.group_id,
                "partition.assignment.strategy": "cooperative-sticky",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",  # a truncated position is an error, never a silent jump
                "session.timeout.ms": session_timeout_ms,
                "heartbeat.interval.ms": max(100, session_timeout_ms // 5),
            }
        )

    @property
    def topic(self) -> str:
        return self.settings.commands_topic

    def halt_of(self, partition: int) -> str | None:
        """Why an owned partition halted (None: serving, or owned by another process)."""
        owned = self.owned.get(partition)
        halt = None if owned is None else owned.processor.halt
        return None if halt is None else halt.where

    def stall_of(self, partition: int) -> str | None:
        """Why an owned partition cannot make its next group durable (None: it can, or not owned)."""
        owned = self.owned.get(partition)
        return None if owned is None else owned.processor.stall

    def poison_records(self, partition: int) -> int | None:
        """The poison records an owned partition's processor counts (None: owned by another process)."""
        owned = self.owned.get(partition)
        return None if owned is None else owned.processor.poison_records

    def applied_offsets(self) -> dict[int, int]:
        """The applied offset of each partition this process owns now."""
        return {partition: owned.processor.applied_offset for partition, owned in list(self.owned.items())}

    @property
    def group_id(self) -> str:
        return self.settings.topic_prefix + GROUP_SUFFIX

    def run(self, stop: Event) -> list[Halt]:
        self._consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked)
        reported: set[int] = set()
        stalls = Stalls()
        halts: list[Halt] = []
        last_commit = time.monotonic()
        try:
            while not stop.is_set():
                for message in self._fetch():
                    self._accept(message)
                processors = [owned.processor for owned in self.owned.values()]
                for processor in processors:
                    while stalls.step(processor):
                        pass
                report_halts(processors, reported, lambda halt: record_halt(self.data.root, halt))
                stalls.tick(self.ticker, processors)
                if time.monotonic() - last_commit >= ADVISORY_COMMIT_INTERVAL_S:
                    self._commit_advisory(list(self.owned))
                    last_commit = time.monotonic()
            halts = [owned.processor.halt for owned in self.owned.values() if owned.processor.halt is not None]
        finally:
            self.uploads.close()
            self._release(list(self.owned))
            self._consumer.close()
            self.commands.close()
            self.outcomes.close()
            self.checkpoints.close()
        return halts

    def _fetch(self) -> list[Any]:
        """Wait up to FETCH_WAIT_S for a record, then take what else is there without waiting.

        (consume(n, timeout) alone would wait out its whole timeout unless n records came.)
        """
        first = self._consumer.poll(FETCH_WAIT_S)
        if first is None:
            return []
        return [first, *self._consumer.consume(MAX_GROUP_RECORDS - 1, 0)]

    def _accept(self, message: Any) -> None:
        error = message.error()
        if error is not None:
            # With auto.offset.reset=error a truncated position arrives as _AUTO_OFFSET_RESET.
            truncated = error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
            if truncated and message.partition() in self.owned:
                owned = self.owned[message.partition()]
                reason = "RecoveryRequired: the log was truncated past the projection and no checkpoint covers it"
                owned.processor.halt = Halt(owned.processor.partition, owned.processor.applied_offset + 1, reason)
                return
            log.warning("kafka: %s", error)
            return
        receiver = self.owned.get(message.partition())
        if receiver is not None:
            receiver.feed.push(record_from_message(message))

    # -- ownership -----------------------------------------------------------------------------

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        positions = []
        for assigned in partitions:
            owned = self._open(assigned.partition)
            self.owned[assigned.partition] = owned
            positions.append(TopicPartition(self.topic, assigned.partition, owned.processor.applied_offset + 1))
            print(f"keyload: owns p{assigned.partition} from offset {owned.processor.applied_offset + 1}", flush=True)
        consumer.incremental_assign(positions)

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        self._release([revoked.partition for revoked in partitions])

    def _release(self, partitions: list[int]) -> None:
        self._commit_advisory([p for p in partitions if p in self.owned])
        for partition in partitions:
            owned = self.owned.pop(partition, None)
            if owned is not None:
                owned.processor.settle_checkpoints()  # announce what was published; the next owner takes its own
                self.uploads.forget(partition)
                owned.store.close()
                print(f"keyload: released p{partition} at offset {owned.processor.applied_offset}", flush=True)

    def _commit_advisory(self, partitions: list[int]) -> None:
        offsets = [
            TopicPartition(self.topic, p, self.owned[p].processor.applied_offset + 1)
            for p in partitions
            if self.owned[p].processor.applied_offset >= 0
        ]
        if offsets:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            except Exception as exc:  # advisory only: lag figures may lag
                log.warning("advisory offset commit failed: %s", exc)

    def _open(self, partition: int) -> Owned:
        """The partition's projection: local if current, else the newest published checkpoint."""
        path = self.data.projection(partition)
        store, newest = self._activate(partition, path)
        feed = PartitionFeed(partition, self.commands.end_offset)
        processor = PartitionProcessor(
            partition,
            self.settings.partitions,
            feed,
            store,
            self.outcomes,
            checkpoints=self.checkpoints,
            keyring=self.keyring,
            keyring_loader=self.data.keyring,
            identity_log=self.commands,
            verify_on_resume=False,  # the feed cannot read behind itself; the consumer validates leader epochs
            announce=self.announce,
            on_published=self.on_published,
            uploads=self.uploads,
            newest_checkpoint=newest,
            first_record_ms=first_record_ms(self.commands, partition) if newest is None else None,
        )
        start = self.commands.start_offset(partition)
        if processor.halt is None and processor.applied_offset + 1 < start:
            reason = (
                f"RecoveryRequired: the log starts at offset {start}, past the projection's {processor.applied_offset}"
            )
            processor.halt = Halt(partition, processor.applied_offset + 1, reason)
        return Owned(processor, store, feed)

    def _activate(self, partition: int, path: Path) -> tuple[Store, CatalogEntry | None]:
        """Open the local projection, first restoring the newest checkpoint if that is past it;
        with the newest checkpoint.

        The restore pins its candidate so that no owner's retention deletes its objects
        meanwhile, and releases the pin once the restored projection is open. A candidate
        retired before the pin took hold makes it try the then-newest checkpoint.
        """
        local = _applied_offset(path)
        session = recovery_session("restore", partition)
        while (latest := self.checkpoints.latest(partition)) is not None and local < latest.offset:
            try:
                with self.checkpoints.pinned(latest, session):
                    self._restore(latest, path)
                    return Store(path), latest
            except NotPublished:
                continue
        return Store(path), latest

    def _restore(self, entry: CatalogEntry, path: Path) -> None:
        """Swap the checkpoint in for the projection at `path`, which stays as it is if that fails."""
        incoming = path.with_name(path.name + ".restoring")
        shutil.rmtree(incoming, ignore_errors=True)
        try:
            self.checkpoints.restore(entry, incoming)
        except CheckpointError as exc:
            # The local projection (or an empty one) replays further instead.
            log.warning("p%d: %s; replaying without it", entry.partition, exc)
            shutil.rmtree(incoming, ignore_errors=True)
            return
        shutil.rmtree(path, ignore_errors=True)
        incoming.rename(path)
        print(f"keyload: p{entry.partition}: restored the checkpoint at offset {entry.offset}", flush=True)


def _applied_offset(path: Path) -> int:
    if not path.exists():
        return -1
    store = Store(path)
    try:
        return store.applied_offset
    finally:
        store.close()
