"""KafkaLog and ensure_topics against a real broker; every test has topics of its own."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from keyload.log import kafka_log
from keyload.log.base import LogError, LogRecord
from keyload.log.kafka_log import (
    MAX_MESSAGE_BYTES,
    MAX_RECORD_BYTES,
    READ_WAIT_MS,
    KafkaLog,
    KafkaSettings,
    TopicMismatch,
    ensure_topics,
    record_from_message,
)

PARTITIONS = 2
OUTCOME_PARTITIONS = 3
CREATE_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 10.0


@pytest.fixture
def settings(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(
        kafka_bootstrap,
        topic_prefix=f"test-{uuid.uuid4().hex}",
        partitions=PARTITIONS,
        outcome_partitions=OUTCOME_PARTITIONS,
    )


@pytest.fixture
def commands(settings: KafkaSettings) -> Iterator[KafkaLog]:
    ensure_topics(settings)
    with KafkaLog.commands(settings) as log:
        yield log


def _read(log: KafkaLog, partition: int, from_offset: int, count: int) -> list[LogRecord]:
    """Exactly `count` records: a read may return fewer than it could (those fetched so far)."""
    records: list[LogRecord] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    while len(records) < count and time.monotonic() < deadline:
        records += log.read(partition, from_offset + len(records), count - len(records))
    assert [r.offset for r in records] == list(range(from_offset, from_offset + count))
    return records


def _create(settings: KafkaSettings, topic: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(CREATE_TIMEOUT_S)


def _right_commands_config() -> dict[str, str]:
    return {
        "message.timestamp.type": "LogAppendTime",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "max.message.bytes": str(MAX_MESSAGE_BYTES),
    }


def test_append_and_read_back(settings: KafkaSettings, commands: KafkaLog) -> None:
    values = [f"command-{i}".encode() for i in range(7)] + [b""]
    before_ms = time.time_ns() // 1_000_000
    appended = commands.append(1, values[:3]) + commands.append(1, values[3:])
    after_ms = time.time_ns() // 1_000_000
    assert [(a.partition, a.offset) for a in appended] == [(1, i) for i in range(8)]
    stamps = [a.timestamp_ms for a in appended]
    assert stamps == sorted(stamps)
    assert before_ms - 1000 <= stamps[0] and stamps[-1] <= after_ms + 1000  # the broker's clock, on this host
    assert commands.append(1, []) == []

    records = _read(commands, 1, 0, len(values))
    assert [r.value for r in records] == values
    assert [(r.partition, r.offset, r.timestamp_ms) for r in records] == [
        (a.partition, a.offset, a.timestamp_ms) for a in appended
    ]
    assert commands.read(0, 0, 10) == []  # appending to partition 1 left partition 0 alone
    assert (commands.start_offset(1), commands.end_offset(1), commands.end_offset(0)) == (0, 8, 0)
    commands.sync_through(1, 7)

    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "test", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(settings.commands_topic, 1, 2)])
        message = consumer.poll(CREATE_TIMEOUT_S)
        assert message is not None
        assert message.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME
        assert record_from_message(message) == records[2]
    finally:
        consumer.close()


def test_append_batches_across_partitions(settings: KafkaSettings) -> None:
    ensure_topics(settings)
    with KafkaLog.outcomes(settings) as outcomes:
        assert outcomes.partitions == OUTCOME_PARTITIONS
        outcomes.append_batches({2: [b"c0", b"c1", b"c2"], 0: [b"a0"], 1: []})
        outcomes.append_batches({2: [b"c3"], 0: [b"a1", b"a2"]})
        assert [r.value for r in _read(outcomes, 0, 0, 3)] == [b"a0", b"a1", b"a2"]
        assert [r.value for r in _read(outcomes, 2, 0, 4)] == [b"c0", b"c1", b"c2", b"c3"]
        assert outcomes.read(1, 0, 10) == []
        assert [outcomes.end_offset(p) for p in range(OUTCOME_PARTITIONS)] == [3, 0, 4]


def test_reads_from_any_offset_and_wait_at_the_end(settings: KafkaSettings, commands: KafkaLog) -> None:
    values = [f"v{i}".encode() for i in range(20)]
    commands.append(0, values)
    _read(commands, 0, 10, 5)
    _read(commands, 0, 15, 5)
    assert [r.value for r in _read(commands, 0, 3, 2)] == values[3:5]  # back: a seek
    assert [r.value for r in _read(commands, 0, 17, 2)] == values[17:19]  # forward, past the buffer
    started = time.monotonic()
    assert commands.read(0, 20, 10) == []
    waited = time.monotonic() - started
    assert READ_WAIT_MS / 1000 * 0.9 <= waited < 5
    commands.append(0, [b"late"])
    assert [r.value for r in _read(commands, 0, 20, 1)] == [b"late"]
    with KafkaLog.commands(settings) as other:  # another process's view: starts in the middle
        assert [r.value for r in _read(other, 0, 12, 3)] == values[12:15]
        with pytest.raises(LogError, match="outside the log"):
            other.read(0, 50, 1)


def test_truncate_before(commands: KafkaLog) -> None:
    commands.append(0, [f"v{i}".encode() for i in range(10)])
    _read(commands, 0, 0, 2)  # the rest is buffered now
    assert commands.truncate_before(0, 4) == 4
    assert (commands.start_offset(0), commands.end_offset(0)) == (4, 10)
    with pytest.raises(LogError, match="below the log's start offset 4"):
        commands.read(0, 2, 10)
    with pytest.raises(LogError, match="truncated"):
        commands.read(0, 0, 10)
    _read(commands, 0, 4, 6)
    assert commands.truncate_before(0, 4) == 4
    with pytest.raises(LogError):
        commands.truncate_before(0, 11)  # beyond the end
    assert commands.start_offset(1) == 0


def test_large_records(commands: KafkaLog) -> None:
    megabyte = bytes(range(256)) * 4096
    largest = b"x" * MAX_RECORD_BYTES
    assert [a.offset for a in commands.append(0, [megabyte, b"small", largest])] == [0, 1, 2]
    assert [r.value for r in _read(commands, 0, 0, 3)] == [megabyte, b"small", largest]
    with pytest.raises(LogError, match="exceeds"):
        commands.append(0, [b"fine", largest + b"x"])
    assert commands.end_offset(0) == 3  # nothing of the refused call was appended


def test_ensure_topics_is_idempotent_and_safe_to_race(settings: KafkaSettings) -> None:
    errors: list[BaseException] = []

    def ensure() -> None:
        try:
            ensure_topics(settings)
        except BaseException as exc:
            errors.append(exc)

    racers = [threading.Thread(target=ensure) for _ in range(3)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert errors == []
    ensure_topics(settings)  # every topic exists now: all are checked
    topics = AdminClient({"bootstrap.servers": settings.bootstrap}).list_topics(timeout=CREATE_TIMEOUT_S).topics
    expected = {settings.commands_topic: PARTITIONS, settings.outcomes_topic: OUTCOME_PARTITIONS}
    expected[settings.catalog_topic] = 1
    assert {name: len(topics[name].partitions) for name in expected} == expected


@pytest.mark.parametrize(
    ("partitions", "change", "setting", "found"),
    [
        (PARTITIONS, {"message.timestamp.type": "CreateTime"}, "message.timestamp.type", "CreateTime"),
        (PARTITIONS + 1, {}, "the partition count", str(PARTITIONS + 1)),
        (PARTITIONS, {"retention.ms": "86400000"}, "retention.ms", "86400000"),
        (PARTITIONS, {"max.message.bytes": "1048588"}, "max.message.bytes", "1048588"),
    ],
)
def test_ensure_topics_refuses_a_mismatched_commands_topic(
    settings: KafkaSettings, partitions: int, change: dict[str, str], setting: str, found: str
) -> None:
    _create(settings, settings.commands_topic, partitions, {**_right_commands_config(), **change})
    with pytest.raises(TopicMismatch) as raised:
        ensure_topics(settings)
    mismatch = raised.value
    assert (mismatch.topic, mismatch.setting, mismatch.found) == (settings.commands_topic, setting, found)
    message = str(mismatch)
    assert settings.commands_topic in message and setting in message and found in message
    assert "to fix it" in message


def test_ensure_topics_accepts_a_topic_created_to_spec(settings: KafkaSettings) -> None:
    _create(settings, settings.commands_topic, PARTITIONS, _right_commands_config())
    ensure_topics(settings)


def test_bad_arguments(settings: KafkaSettings) -> None:
    with pytest.raises(ValueError):
        KafkaSettings(settings.bootstrap, replication_factor=1, min_insync_replicas=2)
    with pytest.raises(ValueError):
        KafkaSettings(settings.bootstrap, partitions=0)
    with pytest.raises(LogError):
        KafkaLog(settings, settings.commands_topic, 0)
    log = KafkaLog.commands(settings)  # no topic needed: every call below fails before reaching Kafka
    calls: list[Any] = [
        lambda: log.append(PARTITIONS, [b"x"]),
        lambda: log.append_batches({-1: [b"x"]}),
        lambda: log.read(PARTITIONS, 0, 1),
        lambda: log.read(0, -1, 1),
        lambda: log.read(0, 0, 0),
        lambda: log.truncate_before(0, -1),
    ]
    for call in calls:
        with pytest.raises(LogError):
            call()
    log.close()
    log.close()
    with pytest.raises(LogError, match="closed"):
        log.end_offset(0)


def test_timestamps_never_go_backwards_under_interleaved_appends(settings: KafkaSettings, commands: KafkaLog) -> None:
    """Two producers (say, two client processes) appending to one partition."""
    with KafkaLog.commands(settings) as other:
        for i in range(10):
            (commands if i % 2 else other).append(0, [f"r{i}".encode(), b"more"])
    records = _read(commands, 0, 0, 20)
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in itertools.pairwise(records))


def test_a_partition_read_later_is_paused_not_buffered_without_bound(
    commands: KafkaLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_log, "MAX_BUFFERED_BYTES", 1000)
    values = [f"{i:0100d}".encode() for i in range(300)]
    for partition in range(PARTITIONS):
        commands.append(partition, values)
    _read(commands, 1, 0, 1)  # assigns partition 1 too: from now on its records arrive with partition 0's
    assert [r.value for r in _read(commands, 0, 0, 300)] == values
    assert [r.value for r in _read(commands, 1, 150, 10)] == values[150:160]  # a seek while paused
    assert [r.value for r in _read(commands, 1, 1, 299)] == values[1:]


def test_a_missing_topic_is_an_error_not_an_empty_log(settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_log, "FETCH_TIMEOUT_S", 0.5)
    with KafkaLog.commands(settings) as log:  # ensure_topics was not called
        with pytest.raises(LogError, match="does the topic exist"):
            log.read(0, 0, 10)
        with pytest.raises(LogError, match="cannot query the offsets"):
            log.end_offset(0)
