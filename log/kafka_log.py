"""The Kafka backend of the command log: one topic per log, a producer and a group-less reader.

Topics, created and checked by ensure_topics::

    <prefix>.commands      the command log: LogAppendTime, kept until `keyload log truncate` deletes
    <prefix>.outcomes      the outcome stream: derived data (a replay reproduces it), kept OUTCOME_RETENTION_MS
    <prefix>.checkpoints   the checkpoint catalog: one compacted partition

Appends are idempotent (enable.idempotence, acks=all) and wait for every delivery
report, so an appended record is on every in-sync replica when append returns. The
reader assigns partitions itself, joins no consumer group and commits nothing: a
projection's applied_offset is the authority (DESIGN §3). It never moves a position
on its own either (auto.offset.reset=error): reading outside the log is a LogError.

An instance is not thread-safe: use one per thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, Producer, TopicPartition

# confluent_kafka.admin re-exports most of these without an __all__, which mypy --strict does not count as exporting.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    DeletedRecords,
    NewTopic,
    OffsetSpec,
    ResourceType,
    TopicMetadata,
)

from .base import OUTCOME_RETENTION_MS, Appended, ClosedOnExit, LogError, LogRecord, LogTruncated
from .file_log import DEFAULT_CONFIG

MAX_RECORD_BYTES = DEFAULT_CONFIG.max_record_bytes  # the file log's limit: both backends accept the same records
RECORD_FRAMING_BYTES = 1024  # a record batch's header (61 bytes) and one record's header, with room to spare
MAX_MESSAGE_BYTES = MAX_RECORD_BYTES + RECORD_FRAMING_BYTES  # producer message.max.bytes, topic max.message.bytes
LINGER_MS = 1  # an append's flush sends at once anyway: this only groups the records of one call
DELIVERY_TIMEOUT_MS = 30_000  # message.timeout.ms: how long librdkafka retries a record before failing its append
DELIVERY_MARGIN_S = 5.0  # on top of DELIVERY_TIMEOUT_MS: every record has its report by then
QUEUE_FULL_WAIT_S = 0.1  # the producer's local queue is full: serve deliveries this long, then produce again
READ_WAIT_MS = 100  # how long a read waits for records before it reports none, so that callers do not spin
FETCH_WAIT_MS = 100  # fetch.wait.max.ms: an idle fetch delays a seek's first records by up to this much
FETCH_TIMEOUT_S = 30.0  # a read that neither gets records nor learns it is at the end this long fails
DRAIN_BATCH = 1000  # messages taken from the consumer's queue at once, once one has arrived
MAX_BUFFERED_BYTES = 16 * 1024 * 1024  # per partition, fetched but not read: beyond it (by a fetch at most) it pauses
REQUEST_TIMEOUT_S = 30.0  # watermark queries and record deletion
REQUEST_ATTEMPT_S = 5.0  # one watermark query; a request sent to a restarting broker may never be answered
TOPIC_VISIBLE_POLL_S = 0.1  # a topic another process just created is not in every broker's metadata at once
UNLIMITED = "-1"
LEADER_MOVING = frozenset(  # a new topic's partitions, or a restarted broker's, are between leaders
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
    }
)  # retention.ms / retention.bytes: keep forever

# confluent_kafka leaves these two factories unannotated.
_EARLIEST: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Where a deployment's topics live and how they are laid out; every process of it must agree."""

    bootstrap: str
    topic_prefix: str = "keyload"
    partitions: int = 4  # of the commands topic: partition_for() depends on it, so it never changes
    outcome_partitions: int = 8
    replication_factor: int = 1
    min_insync_replicas: int = 1
    # Extra librdkafka settings (security: a SASL password, say), so never in a repr.
    client_config: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.outcome_partitions < 1:
            raise ValueError("partitions and outcome_partitions must be >= 1")
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ValueError("min_insync_replicas must be in 1..replication_factor")

    @property
    def commands_topic(self) -> str:
        return f"{self.topic_prefix}.commands"

    @property
    def outcomes_topic(self) -> str:
        return f"{self.topic_prefix}.outcomes"

    @property
    def catalog_topic(self) -> str:
        return f"{self.topic_prefix}.checkpoints"


class TopicMismatch(LogError):
    """An existing topic is laid out or configured other than keyload requires."""

    def __init__(self, topic: str, setting: str, found: str, required: str, fix: str) -> None:
        super().__init__(f"topic {topic}: {setting} is {found}, keyload requires {required}; to fix it: {fix}")
        self.topic = topic
        self.setting = setting
        self.found = found
        self.required = required
        self.fix = fix


@dataclass(frozen=True, slots=True)
class _TopicSpec:
    name: str
    partitions: int
    exact: Mapping[str, str]  # configs an existing topic must have exactly
    minimum: Mapping[str, int]  # numeric configs an existing topic must have at least
    initial: Mapping[str, str] = field(default_factory=dict)  # set at creation, an operator may change them

    def new_topic(self, replication_factor: int) -> NewTopic:
        config = {**self.initial, **self.exact, **{name: str(value) for name, value in self.minimum.items()}}
        return NewTopic(self.name, self.partitions, replication_factor, config=config)


def _topic_specs(settings: KafkaSettings) -> list[_TopicSpec]:
    insync = {"min.insync.replicas": settings.min_insync_replicas}
    return [
        _TopicSpec(
            settings.commands_topic,
            settings.partitions,
            exact={
                "cleanup.policy": "delete",
                # The processor's evaluation time is the record's append time (DESIGN §3).
                "message.timestamp.type": "LogAppendTime",
                # The command log is the source of truth: only `keyload log truncate` deletes.
                "retention.ms": UNLIMITED,
                "retention.bytes": UNLIMITED,
            },
            minimum={**insync, "max.message.bytes": MAX_MESSAGE_BYTES},
        ),
        _TopicSpec(
            settings.outcomes_topic,
            settings.outcome_partitions,
            exact={"cleanup.policy": "delete"},
            minimum={**insync, "max.message.bytes": MAX_MESSAGE_BYTES},
            initial={"retention.ms": str(OUTCOME_RETENTION_MS)},
        ),
        _TopicSpec(
            settings.catalog_topic,
            1,
            exact={"cleanup.policy": "compact", "retention.ms": UNLIMITED},
            minimum=insync,
        ),
    ]


def ensure_topics(settings: KafkaSettings, timeout_s: float = 30) -> None:
    """Creates the deployment's topics that are missing and checks the ones that exist.

    Another process creating a topic at the same moment is fine: that topic is then
    checked like any existing one. A mismatch raises TopicMismatch.
    """
    deadline = time.monotonic() + timeout_s
    admin = AdminClient(_client_config(settings))
    specs = _topic_specs(settings)
    existing = _list_topics(admin, _left(deadline))
    missing = [spec for spec in specs if spec.name not in existing]
    created: set[str] = set()
    if missing:
        futures = admin.create_topics(
            [spec.new_topic(settings.replication_factor) for spec in missing],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        for spec in missing:
            try:
                futures[spec.name].result(timeout=_left(deadline))
            except KafkaException as exc:
                if _error(exc).code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise LogError(f"cannot create topic {spec.name}: {_describe(exc)}") from exc
            except FutureTimeout as exc:
                raise LogError(f"creating topic {spec.name} took more than {timeout_s} s") from exc
            else:
                created.add(spec.name)
    for spec in specs:
        if spec.name not in created:
            _check_topic(admin, settings, spec, deadline)


def holds_commands(settings: KafkaSettings, timeout_s: float = 30) -> bool:
    """Whether the deployment's command topic exists and has ever held a record: some processor of
    that deployment has run (its ticker appends), so a new one must share its keyring."""
    metadata = _list_topics(AdminClient(_client_config(settings)), timeout_s).get(settings.commands_topic)
    if metadata is None or not metadata.partitions:
        return False
    with KafkaLog(settings, settings.commands_topic, len(metadata.partitions)) as log:
        return any(log.end_offset(partition) > 0 for partition in range(log.partitions))


def _check_topic(admin: AdminClient, settings: KafkaSettings, spec: _TopicSpec, deadline: float) -> None:
    metadata = _topic_metadata(admin, spec.name, deadline)
    partitions = len(metadata.partitions)
    if partitions != spec.partitions:
        raise TopicMismatch(
            spec.name,
            "the partition count",
            str(partitions),
            str(spec.partitions),
            "the partition count decides where each domain lives, so it cannot change under existing records: "
            f"configure keyload with {partitions} partitions, or delete the topic if it holds nothing you need",
        )
    replicas = min(len(partition.replicas) for partition in metadata.partitions.values())
    if replicas < settings.replication_factor:
        raise TopicMismatch(
            spec.name,
            "the replication factor",
            str(replicas),
            f"at least {settings.replication_factor}",
            "add replicas with kafka-reassign-partitions.sh, or configure a lower replication factor",
        )
    configs = _topic_configs(admin, spec.name, deadline)
    fix = (
        f"kafka-configs.sh --bootstrap-server {settings.bootstrap} --alter --entity-type topics "
        f"--entity-name {spec.name} --add-config"
    )
    for setting, required in spec.exact.items():
        found = configs.get(setting)
        if found != required:
            raise TopicMismatch(spec.name, setting, str(found), required, f"{fix} {setting}={required}")
    for setting, minimum in spec.minimum.items():
        found = configs.get(setting)
        if found is None or int(found) < minimum:
            raise TopicMismatch(spec.name, setting, str(found), f"at least {minimum}", f"{fix} {setting}={minimum}")


def _list_topics(admin: AdminClient, timeout_s: float) -> dict[str, TopicMetadata]:
    """Every topic's metadata; asking for all of them never makes a broker auto-create one."""
    try:
        return admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise LogError(f"cannot list the topics: {_describe(exc)}") from exc


def _topic_metadata(admin: AdminClient, name: str, deadline: float) -> TopicMetadata:
    while True:
        metadata = _list_topics(admin, _left(deadline)).get(name)
        if metadata is not None and metadata.error is None and metadata.partitions:
            return metadata
        if time.monotonic() >= deadline:
            problem = "missing" if metadata is None else str(metadata.error or "without partitions")
            raise LogError(f"topic {name} exists but its metadata is {problem}")
        time.sleep(TOPIC_VISIBLE_POLL_S)


def _topic_configs(admin: AdminClient, name: str, deadline: float) -> dict[str, str | None]:
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
    try:
        entries: dict[str, Any] = future.result(timeout=_left(deadline))
    except KafkaException as exc:
        raise LogError(f"cannot read the configuration of topic {name}: {_describe(exc)}") from exc
    except FutureTimeout as exc:
        raise LogError(f"reading the configuration of topic {name} timed out") from exc
    return {setting: entry.value for setting, entry in entries.items()}


def record_from_message(message: Message) -> LogRecord:
    """A consumed message as a LogRecord, its timestamp as the topic stamped it.

    Checking that a command record carries LogAppendTime is the caller's business.
    """
    error = message.error()
    if error is not None:
        raise LogError(f"not a record: {error.name()}: {error.str()}")
    partition, offset, value = message.partition(), message.offset(), message.value()
    if partition is None or offset is None:
        raise LogError("a consumed message without a partition or offset")
    _, timestamp_ms = message.timestamp()
    return LogRecord(partition, offset, timestamp_ms, b"" if value is None else value)


@dataclass
class _Assigned:
    """A partition the reader has assigned: records fetched but not yet read, and where fetching goes on."""

    position: int  # offset after the last buffered record (the seek target while none is)
    records: deque[LogRecord] = field(default_factory=deque)
    buffered_bytes: int = 0
    paused: bool = False
    out_of_range: bool = False  # librdkafka stopped fetching: the position is outside the log


class _Deliveries:
    """The delivery reports of one append call, by partition and position in the call."""

    def __init__(self) -> None:
        self.appended: dict[tuple[int, int], Appended] = {}
        self.errors: list[KafkaError] = []
        self.missing = 0

    def callback(self, partition: int, index: int) -> Callable[[KafkaError | None, Message], None]:
        self.missing += 1

        def delivered(error: KafkaError | None, message: Message) -> None:
            self.missing -= 1
            if error is not None:
                self.errors.append(error)
                return
            offset = message.offset()
            if offset is None:
                self.errors.append(KafkaError(KafkaError._BAD_MSG, "a delivery report without an offset"))
                return
            self.appended[(partition, index)] = Appended(partition, offset, message.timestamp()[1])

        return delivered


class KafkaLog(ClosedOnExit):
    """CommandLog on one Kafka topic; see the module docstring."""

    def __init__(self, settings: KafkaSettings, topic: str, partitions: int) -> None:
        if partitions < 1:
            raise LogError("partitions must be >= 1")
        self._settings = settings
        self._topic = topic
        self._partitions = partitions
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._assigned: dict[int, _Assigned] = {}
        self._closed = False

    @classmethod
    def commands(cls, settings: KafkaSettings) -> KafkaLog:
        return cls(settings, settings.commands_topic, settings.partitions)

    @classmethod
    def outcomes(cls, settings: KafkaSettings) -> KafkaLog:
        return cls(settings, settings.outcomes_topic, settings.outcome_partitions)

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def topic(self) -> str:
        return self._topic

    def append(self, partition: int, values: list[bytes]) -> list[Appended]:
        appended = self._append({partition: values})
        return [appended[(partition, index)] for index in range(len(values))]

    def append_batches(self, batches: Mapping[int, list[bytes]]) -> None:
        """Produces every record, then waits once for all of their delivery reports."""
        self._append(batches)

    def read(self, partition: int, from_offset: int, max_records: int) -> list[LogRecord]:
        """Records from the partition's buffer, fetching when it is empty.

        Empty means `from_offset` is the end of the log as of the latest fetch
        response: otherwise the read waits (up to FETCH_TIMEOUT_S) for the records or
        for the broker's out-of-range error, so an empty read never just means that
        a fetch is still on its way.
        """
        self._check(partition)
        if from_offset < 0 or max_records < 1:
            raise LogError("from_offset must be >= 0 and max_records >= 1")
        consumer = self._reader()
        state = self._position(consumer, partition, from_offset)
        self._resume_below_limit(consumer, partition, state)
        if not state.records:
            self._fetch(consumer, partition, state)
        records = [state.records.popleft() for _ in range(min(max_records, len(state.records)))]
        state.buffered_bytes -= sum(len(record.value) for record in records)
        self._resume_below_limit(consumer, partition, state)
        return records

    def end_offset(self, partition: int) -> int:
        """The high watermark, asked of the broker (never a cached value)."""
        return self._list_offset(partition, _LATEST)

    def start_offset(self, partition: int) -> int:
        """The low watermark: moved by truncate_before."""
        return self._list_offset(partition, _EARLIEST)

    def sync_through(self, partition: int, offset: int) -> None:
        """Nothing to do: a consumer only sees records below the high watermark, which
        every in-sync replica has, so whatever was read is already as durable as acks=all makes it."""
        self._check(partition)

    def truncate_before(self, partition: int, offset: int) -> int:
        """Deletes the records below `offset` (DeleteRecords): the new start is exactly `offset`."""
        self._check(partition)
        if offset < 0:
            raise LogError(f"cannot truncate before offset {offset}")
        target = TopicPartition(self._topic, partition, offset)
        [future] = (
            self._administrator()
            .delete_records([target], request_timeout=REQUEST_TIMEOUT_S, operation_timeout=REQUEST_TIMEOUT_S)
            .values()
        )
        try:
            deleted: DeletedRecords = future.result(timeout=REQUEST_TIMEOUT_S)
        except KafkaException as exc:
            raise LogError(
                f"cannot truncate partition {partition} of {self._topic} before {offset}: {_describe(exc)}"
            ) from exc
        except FutureTimeout as exc:
            raise LogError(f"truncating partition {partition} of {self._topic} timed out") from exc
        state = self._assigned.get(partition)
        while state is not None and state.records and state.records[0].offset < deleted.low_watermark:
            state.buffered_bytes -= len(state.records.popleft().value)
        return deleted.low_watermark

    def close(self) -> None:
        """Flushes what a failed append may have left queued and closes the clients."""
        if self._closed:
            return
        self._closed = True
        producer, consumer = self._producer, self._consumer
        self._producer = self._consumer = self._admin = None
        try:
            if producer is not None:
                producer.flush(DELIVERY_TIMEOUT_MS / 1000 + DELIVERY_MARGIN_S)
        finally:
            if consumer is not None:
                consumer.close()

    # -- appending ---------------------------------------------------------------------

    def _append(self, batches: Mapping[int, list[bytes]]) -> dict[tuple[int, int], Appended]:
        """Produces every record and waits for all the delivery reports.

        A failed append may still have appended some of its records, as with any
        networked log: command ids make a retry harmless (DESIGN §4).
        """
        for partition, values in batches.items():
            self._check(partition)
            for value in values:
                if len(value) > MAX_RECORD_BYTES:
                    raise LogError(f"record of {len(value)} bytes exceeds the limit of {MAX_RECORD_BYTES}")
        deliveries = _Deliveries()
        if not any(batches.values()):
            return deliveries.appended
        producer = self._writer()
        for partition, values in batches.items():
            for index, value in enumerate(values):
                self._produce(producer, partition, value, deliveries.callback(partition, index))
        producer.flush(DELIVERY_TIMEOUT_MS / 1000 + DELIVERY_MARGIN_S)
        if deliveries.errors:
            error = deliveries.errors[0]
            if error.fatal():
                self._producer = None  # librdkafka refuses everything after a fatal error: start afresh
            raise LogError(f"append to {self._topic} failed: {error.name()}: {error.str()}")
        if deliveries.missing:
            raise LogError(f"append to {self._topic}: {deliveries.missing} records have no delivery report")
        return deliveries.appended

    def _produce(
        self, producer: Producer, partition: int, value: bytes, callback: Callable[[KafkaError | None, Message], None]
    ) -> None:
        while True:
            try:
                producer.produce(self._topic, value, partition=partition, on_delivery=callback)
                return
            except BufferError:
                producer.poll(QUEUE_FULL_WAIT_S)  # deliveries make room in the local queue
            except KafkaException as exc:
                raise LogError(f"append to {self._topic} failed: {_describe(exc)}") from exc

    def _writer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(producer_config(self._settings))
        return self._producer

    # -- reading -----------------------------------------------------------------------

    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(reader_config(self._settings))
        return self._consumer

    def _position(self, consumer: Consumer, partition: int, from_offset: int) -> _Assigned:
        """The partition's state, its buffer starting at `from_offset` or empty and fetching from there."""
        state = self._assigned.get(partition)
        if state is None:
            consumer.incremental_assign([TopicPartition(self._topic, partition, from_offset)])
            state = self._assigned[partition] = _Assigned(from_offset)
            return state
        first = state.records[0].offset if state.records else state.position
        if first <= from_offset <= state.position:
            while state.records and state.records[0].offset < from_offset:
                state.buffered_bytes -= len(state.records.popleft().value)
            return state
        target = TopicPartition(self._topic, partition, from_offset)
        try:
            consumer.seek(target)
        except KafkaException as exc:
            if _error(exc).code() != KafkaError._STATE:
                raise LogError(f"cannot seek partition {partition} of {self._topic}: {_describe(exc)}") from exc
            # A partition stopped by an out-of-range error cannot seek: assign it afresh (unpaused).
            consumer.incremental_unassign([target])
            consumer.incremental_assign([target])
        else:
            if state.paused:
                consumer.resume([target])
        state.position = from_offset
        state.records.clear()
        state.buffered_bytes = 0
        state.paused = state.out_of_range = False
        return state

    def _fetch(self, consumer: Consumer, partition: int, state: _Assigned) -> None:
        """Waits until the partition has records, or READ_WAIT_MS passed and it is at its end."""
        deadline = time.monotonic() + READ_WAIT_MS / 1000
        give_up = time.monotonic() + FETCH_TIMEOUT_S
        while not state.records:
            if state.out_of_range:
                raise self._out_of_range(partition, state.position)
            now = time.monotonic()
            if now < deadline:
                self._poll(consumer, deadline - now)
                continue
            _, high = consumer.get_watermark_offsets(TopicPartition(self._topic, partition), cached=True)
            if high == state.position:
                return  # at the end; past it, the cached end may just be older than the caller's offset
            if now >= give_up:
                known = "unknown" if high < 0 else str(high)
                raise LogError(
                    f"no records of partition {partition} of {self._topic} from offset {state.position} "
                    f"within {FETCH_TIMEOUT_S} s (its end offset: {known}): is the broker reachable "
                    "and does the topic exist?"
                )
            deadline = now + READ_WAIT_MS / 1000

    def _poll(self, consumer: Consumer, timeout_s: float) -> None:
        """Buffers what arrives within `timeout_s`: the first message, then whatever else is queued."""
        message = consumer.poll(timeout_s)
        if message is None:
            return
        self._take(consumer, message)
        for message in consumer.consume(DRAIN_BATCH, 0):
            self._take(consumer, message)

    def _take(self, consumer: Consumer, message: Message) -> None:
        error = message.error()
        if error is not None:
            partition = message.partition()
            if error.code() == KafkaError._AUTO_OFFSET_RESET and partition in self._assigned:
                self._assigned[partition].out_of_range = True
            elif error.fatal():
                raise LogError(f"reading {self._topic} failed: {error.name()}: {error.str()}")
            # Anything else is news (a broker connection dropped, say): librdkafka retries on its own.
            return
        record = record_from_message(message)
        state = self._assigned[record.partition]
        state.records.append(record)
        state.position = record.offset + 1
        state.buffered_bytes += len(record.value)
        if not state.paused and state.buffered_bytes >= MAX_BUFFERED_BYTES:
            consumer.pause([TopicPartition(self._topic, record.partition)])
            state.paused = True

    def _resume_below_limit(self, consumer: Consumer, partition: int, state: _Assigned) -> None:
        if state.paused and state.buffered_bytes < MAX_BUFFERED_BYTES:
            consumer.resume([TopicPartition(self._topic, partition)])
            state.paused = False

    def _out_of_range(self, partition: int, offset: int) -> LogError:
        start = self.start_offset(partition)
        if offset < start:
            return LogTruncated(
                f"offset {offset} of partition {partition} of {self._topic} is below the log's start offset "
                f"{start}: the records before it were truncated"
            )
        end = self.end_offset(partition)
        return LogError(
            f"offset {offset} of partition {partition} of {self._topic} is outside the log: "
            f"a read may start at {start}..{end}"
        )

    # -- shared ------------------------------------------------------------------------

    def _list_offset(self, partition: int, spec: OffsetSpec) -> int:
        """A watermark, from the admin client: the reader's get_watermark_offsets would queue
        behind its own idle fetch on the broker connection, for up to FETCH_WAIT_MS."""
        self._check(partition)
        target = TopicPartition(self._topic, partition)
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            attempt_s = min(REQUEST_ATTEMPT_S, max(_left(deadline), 0.1))
            futures = self._administrator().list_offsets(
                {target: spec}, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=attempt_s
            )
            [future] = futures.values()
            try:
                offset: int = future.result(timeout=attempt_s + REQUEST_ATTEMPT_S).offset
                return offset
            except KafkaException as exc:
                error = _error(exc)
                if not (error.retriable() or error.code() in LEADER_MOVING) or time.monotonic() >= deadline:
                    raise LogError(
                        f"cannot query the offsets of partition {partition} of {self._topic}: {_describe(exc)}"
                    ) from exc
                # The admin client can keep asking with a stale leader epoch: start a fresh one.
                self._admin = None
            except FutureTimeout as exc:
                if time.monotonic() >= deadline:
                    raise LogError(f"querying the offsets of partition {partition} of {self._topic} timed out") from exc
            time.sleep(TOPIC_VISIBLE_POLL_S)

    def _administrator(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(_client_config(self._settings))
        return self._admin

    def _check(self, partition: int) -> None:
        if self._closed:
            raise LogError("the log is closed")
        if not 0 <= partition < self._partitions:
            raise LogError(f"partition {partition} is not in 0..{self._partitions - 1}")


# librdkafka writes its log to stderr itself; its informational lines ("Purging 1 unserved events from
# background queue" when an admin client goes away) are no news for an operator: warnings and errors only.
LIBRDKAFKA_LOG_LEVEL = 4


def _client_config(settings: KafkaSettings) -> dict[str, Any]:
    return {"bootstrap.servers": settings.bootstrap, "log_level": LIBRDKAFKA_LOG_LEVEL, **settings.client_config}


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """Every keyload producer's settings: idempotent, acknowledged by all in-sync replicas."""
    return {
        **_client_config(settings),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": LINGER_MS,
        "message.max.bytes": MAX_MESSAGE_BYTES,
        "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        "allow.auto.create.topics": False,  # topics come from ensure_topics, configured
    }


def reader_config(settings: KafkaSettings) -> dict[str, Any]:
    """A group-less reader's settings (a group id is required, never joined or committed to)."""
    return {
        **_client_config(settings),
        "group.id": f"{settings.topic_prefix}.reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # a truncated offset is an error, not a silent jump
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "allow.auto.create.topics": False,
    }


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def _error(exc: KafkaException) -> KafkaError:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else KafkaError(KafkaError.UNKNOWN, str(exc))


def _describe(exc: KafkaException) -> str:
    error = _error(exc)
    return f"{error.name()}: {error.str()}"
