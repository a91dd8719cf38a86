"""FileLog on real files: format, rolling, torn tails, corruption, several processes."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.log import file_log
from keyload.log.base import LogCorruption, LogError, LogRecord, LogTruncated
from keyload.log.file_log import (
    HEADER_BYTES,
    FileLog,
    FileLogConfig,
    FsyncPolicy,
)

WORKERS = 3
RECORDS_PER_WORKER = 300
MAX_BATCH = 5
TAIL_TIMEOUT_S = 15.0
WORKER_START_TIMEOUT_S = 120.0


def _segments(directory: Path, partition: int = 0) -> list[Path]:
    return sorted((directory / f"p-{partition:04d}").glob("*.seg"))


def _read_all(log: FileLog, partition: int = 0, from_offset: int = 0) -> list[LogRecord]:
    return log.read(partition, from_offset, 1_000_000)


def _clock(values: list[int]) -> Callable[[], int]:
    ticks: Iterator[int] = iter(values)
    return lambda: next(ticks)


def _flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def test_round_trip_across_partitions(tmp_path: Path) -> None:
    with FileLog(tmp_path, 3) as log:
        for partition in range(3):
            values = [f"{partition}-{i}".encode() for i in range(7)]
            appended = log.append(partition, values[:3]) + log.append(partition, values[3:])
            assert [a.offset for a in appended] == list(range(7))
            assert {a.partition for a in appended} == {partition}
        for partition in range(3):
            records = _read_all(log, partition)
            assert [r.value for r in records] == [f"{partition}-{i}".encode() for i in range(7)]
            assert [r.offset for r in records] == list(range(7))
            assert log.end_offset(partition) == 7
        assert log.partitions == 3
        assert log.append(0, []) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-0000", "p-0001", "p-0002"]
    assert (tmp_path / "p-0000" / ".lock").exists()


def test_frame_format_on_disk(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1, clock_ms=lambda: 1234) as log:
        log.append(0, [b"hello", b"world!"])
    data = (tmp_path / "p-0000" / f"{0:020d}.seg").read_bytes()
    length, crc, offset, timestamp = struct.unpack_from(">IIQq", data, 0)
    assert (length, offset, timestamp) == (5, 0, 1234)
    assert data[HEADER_BYTES : HEADER_BYTES + 5] == b"hello"
    assert crc == zlib.crc32(data[8 : HEADER_BYTES + 5])
    second = HEADER_BYTES + 5
    assert struct.unpack_from(">IIQq", data, second)[2] == 1
    assert len(data) == 2 * HEADER_BYTES + 11


def test_timestamps_never_go_backwards(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1, clock_ms=_clock([1000, 900, 1100, 500])) as log:
        batches = [[b"a", b"b"], [b"c"], [b"d"], [b"e"]]
        stamps = [a.timestamp_ms for batch in batches for a in log.append(0, batch)]
    assert stamps == [1000, 1000, 1000, 1100, 1100]
    # A new instance (another process, say) with an even earlier clock still continues from disk.
    with FileLog(tmp_path, 1, clock_ms=lambda: 10) as log:
        assert log.append(0, [b"f"])[0].timestamp_ms == 1100
        assert [r.timestamp_ms for r in _read_all(log)] == [1000, 1000, 1000, 1100, 1100, 1100]


def test_segments_roll_and_read_from_any_offset(tmp_path: Path) -> None:
    config = FileLogConfig(segment_bytes=200)
    values = [f"record-{i:03d}".encode() * (1 + i % 3) for i in range(40)]
    with FileLog(tmp_path, 1, config) as log:
        i = 0
        for size in [1, 3, 2, 5, 1, 4, 7, 2, 6, 9]:
            log.append(0, values[i : i + size])
            i += size
        assert log.end_offset(0) == 40
        for from_offset in range(41):
            for max_records in (1, 3, 100):
                got = log.read(0, from_offset, max_records)
                assert [r.value for r in got] == values[from_offset : from_offset + max_records]
                assert [r.offset for r in got] == list(range(from_offset, from_offset + len(got)))
        assert log.read(0, 40, 10) == []
        assert log.read(0, 1000, 10) == []
        big = b"x" * 500  # larger than a segment: it gets one of its own
        assert log.append(0, [big, b"after"])[1].offset == 41
        assert [r.value for r in log.read(0, 40, 10)] == [big, b"after"]
    segments = _segments(tmp_path)
    assert len(segments) > 10
    bases = [int(p.stem) for p in segments]
    assert bases[0] == 0 and bases[-2:] == [40, 41]
    assert all(p.stat().st_size <= 200 for p in segments if int(p.stem) != 40)
    with FileLog(tmp_path, 1, config) as log:  # a fresh instance finds the same records
        assert [r.value for r in _read_all(log, 0, 17)] == [*values[17:], big, b"after"]
        assert log.end_offset(0) == 42


def _damage_truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 3)


def _damage_short_garbage(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\x00\x01\x02\x03\x04")


def _damage_long_garbage(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\xff" * 40)  # its length field claims 4 GiB: an incomplete frame


def _damage_zeros(path: Path) -> None:
    with path.open("ab") as f:
        f.write(bytes(4096))  # what a file system may leave after a power loss


def _damage_flip_last(path: Path) -> None:
    _flip_byte(path, path.stat().st_size - 1)


@pytest.mark.parametrize(
    ("damage", "survivors"),
    [
        (_damage_truncate, 9),
        (_damage_flip_last, 9),
        (_damage_short_garbage, 10),
        (_damage_long_garbage, 10),
        (_damage_zeros, 10),
    ],
)
@pytest.mark.parametrize("fix", ["append", "repair"])
def test_torn_tail_is_cut_and_the_log_continues(
    tmp_path: Path, damage: Callable[[Path], None], survivors: int, fix: str
) -> None:
    config = FileLogConfig(segment_bytes=300)
    values = [f"value-{i}".encode() for i in range(10)]
    with FileLog(tmp_path, 1, config) as log:
        for i in range(0, 10, 2):
            log.append(0, values[i : i + 2])
    last = _segments(tmp_path)[-1]
    damage(last)
    with FileLog(tmp_path, 1, config) as log:
        assert [r.value for r in _read_all(log)] == values[:survivors]
        assert log.end_offset(0) == survivors
        if fix == "append":
            assert log.append(0, [b"next"])[0].offset == survivors
        else:
            assert log.repair(0) == survivors
            log.append(0, [b"next"])
        assert [r.value for r in _read_all(log)] == [*values[:survivors], b"next"]
    with FileLog(tmp_path, 1, config) as log:
        assert [r.offset for r in _read_all(log)] == list(range(survivors + 1))


def test_corruption_in_the_middle_is_reported(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1) as log:
        log.append(0, [f"value-{i}".encode() for i in range(10)])
    segment = _segments(tmp_path)[0]
    size = segment.stat().st_size
    _flip_byte(segment, HEADER_BYTES + 2)  # the first record's payload
    with FileLog(tmp_path, 1) as log:
        with pytest.raises(LogCorruption):
            log.read(0, 0, 100)
        with pytest.raises(LogCorruption):
            log.read(0, 5, 100)
        with pytest.raises(LogCorruption):
            log.end_offset(0)
        with pytest.raises(LogCorruption):
            log.append(0, [b"more"])
    assert segment.stat().st_size == size  # nothing was cut or added


@pytest.mark.parametrize("flipped_bit", [0, 3, 30])
def test_a_damaged_length_field_is_corruption_not_a_torn_tail(tmp_path: Path, flipped_bit: int) -> None:
    """A frame that claims more bytes than it has, with good frames after it, must not be cut."""
    with FileLog(tmp_path, 1) as log:
        log.append(0, [f"value-{i}".encode() for i in range(10)])
    segment = _segments(tmp_path)[0]
    size = segment.stat().st_size
    frame = HEADER_BYTES + len(b"value-0")
    position = 3 * frame + 3 - flipped_bit // 8  # a bit of the fourth frame's u32 length field
    data = bytearray(segment.read_bytes())
    data[position] ^= 1 << (flipped_bit % 8)
    segment.write_bytes(bytes(data))
    with FileLog(tmp_path, 1) as log:
        with pytest.raises(LogCorruption):
            log.read(0, 0, 100)
        with pytest.raises(LogCorruption):
            log.repair(0)
    assert segment.stat().st_size == size


def test_torn_frame_in_a_sealed_segment_is_corruption(tmp_path: Path) -> None:
    config = FileLogConfig(segment_bytes=100)
    with FileLog(tmp_path, 1, config) as log:
        log.append(0, [b"a" * 40, b"b" * 40, b"c" * 40])
    first = _segments(tmp_path)[0]
    os.truncate(first, first.stat().st_size - 1)
    with FileLog(tmp_path, 1, config) as log, pytest.raises(LogCorruption):
        log.read(0, 0, 10)


def test_offset_below_the_first_segment_is_an_error(tmp_path: Path) -> None:
    config = FileLogConfig(segment_bytes=100)
    with FileLog(tmp_path, 1, config) as log:
        log.append(0, [b"a" * 40, b"b" * 40, b"c" * 40])
    _segments(tmp_path)[0].unlink()  # as a retention job would
    with FileLog(tmp_path, 1, config) as log:
        with pytest.raises(LogError):
            log.read(0, 0, 10)
        assert [r.value for r in log.read(0, 2, 10)] == [b"c" * 40]


def test_empty_newest_segment_keeps_timestamps_monotonic(tmp_path: Path) -> None:
    """An appender that died between creating a segment and writing to it."""
    config = FileLogConfig(segment_bytes=100)
    with FileLog(tmp_path, 1, config, clock_ms=lambda: 5000) as log:
        log.append(0, [b"a" * 40, b"b" * 40])
    (tmp_path / "p-0000" / f"{2:020d}.seg").touch()
    with FileLog(tmp_path, 1, config, clock_ms=lambda: 10) as log:
        assert log.end_offset(0) == 2
        appended = log.append(0, [b"c"])
        assert (appended[0].offset, appended[0].timestamp_ms) == (2, 5000)
        assert [r.value for r in _read_all(log)] == [b"a" * 40, b"b" * 40, b"c"]


def test_tailing_reader_in_another_instance(tmp_path: Path) -> None:
    config = FileLogConfig(segment_bytes=150, fsync=FsyncPolicy.NONE)
    with FileLog(tmp_path, 2, config) as writer, FileLog(tmp_path, 2, config) as reader:
        assert reader.read(1, 0, 10) == []
        assert reader.end_offset(1) == 0
        seen: list[bytes] = []
        for batch in range(10):
            writer.append(1, [f"b{batch}-{i}".encode() * 3 for i in range(batch % 4 + 1)])
            while records := reader.read(1, len(seen), 2):
                seen.extend(r.value for r in records)
            assert len(seen) == writer.end_offset(1) == reader.end_offset(1)
        assert seen == [r.value for r in _read_all(writer, 1)]
        assert len(_segments(tmp_path, 1)) > 3


def test_oversize_record_is_rejected_before_writing(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1, FileLogConfig(max_record_bytes=100)) as log:
        with pytest.raises(LogError):
            log.append(0, [b"fine", b"x" * 101])
        assert log.end_offset(0) == 0
        assert log.read(0, 0, 10) == []
        assert _segments(tmp_path) == []
        assert log.append(0, [b"x" * 100])[0].offset == 0


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_every_fsync_policy_appends(tmp_path: Path, policy: FsyncPolicy) -> None:
    config = FileLogConfig(segment_bytes=100, fsync=policy, fsync_interval_ms=0)
    with FileLog(tmp_path, 1, config) as log:
        log.append(0, [b"a" * 30] * 5)
        log.append(0, [b"b" * 30])
        assert [r.offset for r in _read_all(log)] == list(range(6))


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(LogError):
        FileLog(tmp_path, 0)
    log = FileLog(tmp_path, 2)
    for call in (
        lambda: log.append(2, [b"x"]),
        lambda: log.append(-1, [b"x"]),
        lambda: log.read(2, 0, 1),
        lambda: log.read(0, -1, 1),
        lambda: log.read(0, 0, 0),
        lambda: log.end_offset(5),
    ):
        with pytest.raises(LogError):
            call()
    log.close()
    log.close()
    with pytest.raises(LogError):
        log.read(0, 0, 1)


def _append_worker(
    directory: str, worker: int, ready: multiprocessing.synchronize.Event, start: multiprocessing.synchronize.Event
) -> None:
    rng = random.Random(worker)
    with FileLog(directory, 1) as log:
        ready.set()
        start.wait()
        i = 0
        while i < RECORDS_PER_WORKER:
            size = min(rng.randint(1, MAX_BATCH), RECORDS_PER_WORKER - i)
            log.append(0, [f"{worker}:{n}".encode() for n in range(i, i + size)])
            i += size


def test_concurrent_appenders_in_several_processes(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    ready = [context.Event() for _ in range(WORKERS)]
    workers = [
        context.Process(target=_append_worker, args=(str(tmp_path), worker, ready[worker], start))
        for worker in range(WORKERS)
    ]
    for process in workers:
        process.start()
    for worker_ready in ready:  # a spawned interpreter's start-up is not what this test times
        assert worker_ready.wait(WORKER_START_TIMEOUT_S)
    total = WORKERS * RECORDS_PER_WORKER
    seen: list[LogRecord] = []
    with FileLog(tmp_path, 1) as reader:
        start.set()
        deadline = time.monotonic() + TAIL_TIMEOUT_S
        while len(seen) < total and time.monotonic() < deadline:
            seen.extend(reader.read(0, len(seen), 37))
        for process in workers:
            process.join(TAIL_TIMEOUT_S)
            assert process.exitcode == 0
        assert reader.end_offset(0) == total
    assert [r.offset for r in seen] == list(range(total))
    with FileLog(tmp_path, 1) as log:
        assert [r.value for r in seen] == [r.value for r in _read_all(log)]
    by_worker: dict[int, list[int]] = {w: [] for w in range(WORKERS)}
    for record in seen:
        worker, n = record.value.decode().split(":")
        by_worker[int(worker)].append(int(n))
    assert by_worker == {w: list(range(RECORDS_PER_WORKER)) for w in range(WORKERS)}
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in itertools.pairwise(seen))


def test_append_batches_appends_each_partition_in_order(tmp_path: Path) -> None:
    with FileLog(tmp_path, 3) as log:
        log.append_batches({2: [b"c0", b"c1"], 0: [b"a0"], 1: []})
        log.append_batches({2: [b"c2"]})
        assert [r.value for r in _read_all(log, 0)] == [b"a0"]
        assert _read_all(log, 1) == []
        assert [(r.offset, r.value) for r in _read_all(log, 2)] == [(0, b"c0"), (1, b"c1"), (2, b"c2")]


def test_truncate_before_deletes_whole_segments_below_the_offset(tmp_path: Path) -> None:
    config = FileLogConfig(segment_bytes=150)  # two 64-byte frames (40-byte records) a segment
    values = [bytes([65 + i]) * 40 for i in range(7)]
    with FileLog(tmp_path, 1, config) as log:
        assert log.start_offset(0) == 0
        assert log.truncate_before(0, 0) == 0  # an empty partition: nothing to delete
        log.append(0, values)
        assert [int(p.stem) for p in _segments(tmp_path)] == [0, 2, 4, 6]
        assert log.start_offset(0) == 0
        assert [r.value for r in log.read(0, 0, 2)] == values[:2]  # a cursor in the first segment
        assert log.truncate_before(0, 3) == 2  # offset 2 shares a segment with 3: it stays
        assert [int(p.stem) for p in _segments(tmp_path)] == [2, 4, 6]
        assert log.start_offset(0) == 2
        with pytest.raises(LogError, match="below the log's start offset 2"):
            log.read(0, 1, 10)
        assert [r.value for r in log.read(0, 2, 10)] == values[2:]
        assert log.truncate_before(0, 2) == 2  # idempotent
        assert log.truncate_before(0, 7) == 6  # never the newest segment
        assert log.start_offset(0) == 6
        with pytest.raises(LogError):
            log.truncate_before(0, 8)  # beyond the end
        assert log.append(0, [b"next"])[0].offset == 7
        assert [r.offset for r in _read_all(log, 0, 6)] == [6, 7]
    with FileLog(tmp_path, 1, config) as log:  # another instance sees the same start
        assert log.start_offset(0) == 6
        with pytest.raises(LogError, match="truncated"):
            log.read(0, 0, 10)


def test_truncate_older_than_keeps_every_segment_with_a_record_at_or_after_the_cutoff(tmp_path: Path) -> None:
    """Retention by time: a segment goes once its successor's first record is older than the cutoff
    (no record of it can be newer); the newest segment stays, however old."""
    config = FileLogConfig(segment_bytes=150)  # two 64-byte frames (40-byte records) a segment
    now = [1_000]
    with FileLog(tmp_path, 1, config, clock_ms=lambda: now[0]) as log:
        assert log.truncate_older_than(0, 10_000) == 0  # an empty partition: nothing to delete
        for stamp in (1_000, 1_000, 2_000, 3_000, 3_000, 4_000, 5_000):  # segments 0, 2, 4, 6
            now[0] = stamp
            log.append(0, [bytes(40)])
        assert [r.timestamp_ms for r in log.read(0, 0, 10)] == [1_000, 1_000, 2_000, 3_000, 3_000, 4_000, 5_000]
        assert log.truncate_older_than(0, 2_000) == 0  # segment 0's successor starts at 2,000: not older
        assert log.truncate_older_than(0, 3_001) == 4  # 0 and 2 go; 4 holds 3,000 and 4,000
        assert [int(p.stem) for p in _segments(tmp_path)] == [4, 6]
        assert log.truncate_older_than(0, 10**6) == 6  # never the newest segment
        assert [r.offset for r in log.read(0, 6, 10)] == [6]
        with pytest.raises(LogTruncated):
            log.read(0, 5, 10)


@pytest.mark.parametrize("read_through", [3, 4], ids=["at-the-end-of-the-newest", "segments-listed"])
def test_a_reader_whose_segments_were_deleted_under_it_learns_it_was_truncated(
    tmp_path: Path, read_through: int
) -> None:
    """A reader that read up to a segment's end, then had that segment and the ones after it
    deleted by another process (retention, `keyload log truncate`), gets LogTruncated and reads on
    from the start: its cached cursor must not read on as if nothing came (an answer it waits for
    would never arrive) nor fail with a missing file."""
    config = FileLogConfig(segment_bytes=150)  # two 64-byte frames (40-byte records) a segment
    with FileLog(tmp_path, 1, config) as writer, FileLog(tmp_path, 1, config) as reader:
        writer.append(0, [bytes(40)] * read_through)  # segments 0, 2 (and 4 at the end of the second case)
        assert [r.offset for r in reader.read(0, 0, 10)] == list(range(read_through))
        writer.append(0, [bytes(40)] * 5)
        assert writer.truncate_before(0, 6) == 6  # the reader's segments and their successors go
        got: list[int] = []  # what the segment it has open still held, then LogTruncated
        with pytest.raises(LogTruncated):
            while True:
                records = reader.read(0, read_through + len(got), 10)
                assert records, "the reader read on as if nothing came"
                got += [r.offset for r in records]
        assert got == list(range(read_through, read_through + len(got)))
        start = reader.start_offset(0)
        assert [r.offset for r in reader.read(0, start, 10)] == list(range(start, read_through + 5))


def _frame(offset: int, timestamp_ms: int, value: bytes) -> bytes:
    crc = zlib.crc32(value, zlib.crc32(struct.pack(">Qq", offset, timestamp_ms)))
    return struct.pack(">IIQq", len(value), crc, offset, timestamp_ms) + value


@pytest.mark.parametrize("cut_after_forged", [0, 1, 17])
def test_a_forged_frame_inside_a_torn_record_is_not_taken_for_a_frame(tmp_path: Path, cut_after_forged: int) -> None:
    """A body holding a well-formed frame of the next offset, torn after it: the tear is cut, nothing before lost."""
    with FileLog(tmp_path, 1) as log:
        log.append(0, [b"first", b"second"])
        forged = _frame(3, 1234, b"forged-by-a-client")
        body = b"head" + forged + b"tail" * 10
        [appended] = log.append(0, [body])
    assert appended.offset == 2
    segment = _segments(tmp_path)[0]
    end_of_forged = segment.stat().st_size - len(b"tail" * 10)
    os.truncate(segment, end_of_forged + cut_after_forged)  # the crash tore the record after the forged frame
    with FileLog(tmp_path, 1) as log:
        assert [r.value for r in _read_all(log)] == [b"first", b"second"]
        assert log.repair(0) == 2
        log.append(0, [b"again"])
        assert [r.value for r in _read_all(log)] == [b"first", b"second", b"again"]


def test_a_forged_frame_in_a_good_record_before_a_torn_tail(tmp_path: Path) -> None:
    with FileLog(tmp_path, 1) as log:
        log.append(0, [b"first", b"x" + _frame(2, 1, b"forged") + b"y"])
        log.append(0, [b"torn-" * 20])
    segment = _segments(tmp_path)[0]
    os.truncate(segment, segment.stat().st_size - 7)
    with FileLog(tmp_path, 1) as log:
        assert log.repair(0) == 2
        assert [r.offset for r in _read_all(log)] == [0, 1]


def test_sync_through_covers_a_group_that_crossed_a_segment_roll(tmp_path: Path) -> None:
    """A reader whose group ended in the previous segment (a checkpoint, a halt) can still sync it."""
    config = FileLogConfig(segment_bytes=100, fsync=FsyncPolicy.NONE)
    with FileLog(tmp_path, 1, config) as writer:
        writer.append(0, [b"a" * 40, b"b" * 40, b"c" * 40, b"d" * 40])
    assert len(_segments(tmp_path)) >= 3
    with FileLog(tmp_path, 1, config) as reader:
        records = reader.read(0, 0, 100)
        assert [r.offset for r in records] == [0, 1, 2, 3]
        for offset in (0, 1, 2, 3):
            reader.sync_through(0, offset)
        with pytest.raises(LogError):
            reader.sync_through(0, 4)  # not read yet


def test_sync_through_after_a_roll_left_an_empty_segment(tmp_path: Path) -> None:
    """The instant of a roll: the new segment exists, empty, while the reader's records are in the old one."""
    config = FileLogConfig(segment_bytes=100)
    with FileLog(tmp_path, 1, config) as writer:
        writer.append(0, [b"a" * 40, b"b" * 40])
    empty = tmp_path / "p-0000" / f"{2:020d}.seg"
    empty.touch()
    with FileLog(tmp_path, 1, config) as reader:
        assert [r.offset for r in reader.read(0, 0, 10)] == [0, 1]
        reader.sync_through(0, 1)
        assert reader.read(0, 2, 10) == []


def test_reading_the_last_record_again_steps_back_one_frame(tmp_path: Path) -> None:
    config = FileLogConfig(segment_bytes=100)
    with FileLog(tmp_path, 1, config) as log:
        log.append(0, [b"a" * 40, b"b" * 40, b"c" * 40])
        assert [r.offset for r in log.read(0, 0, 2)] == [0, 1]
        assert [r.value for r in log.read(0, 1, 1)] == [b"b" * 40]
        assert [r.offset for r in log.read(0, 2, 5)] == [2]
        assert [r.value for r in log.read(0, 2, 5)] == [b"c" * 40]  # back across the roll
        assert log.read(0, 3, 5) == []


def test_log_files_are_private(tmp_path: Path) -> None:
    with FileLog(tmp_path / "log", 1) as log:
        log.append(0, [b"secret"])
    partition = tmp_path / "log" / "p-0000"
    assert partition.stat().st_mode & 0o777 == 0o700
    for path in partition.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path.name


def test_a_segment_an_unsyncing_appender_began_is_made_durable_by_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HTTP server appends with the NONE policy; the processor's sync_through must then make the
    directory entry of every segment begun since its last sync durable, a roll or the first segment."""
    synced: list[str] = []
    real = file_log.fsync_directory
    monkeypatch.setattr(file_log, "fsync_directory", lambda path: (synced.append(path), real(path))[1])
    writer = FileLog(tmp_path, 1, FileLogConfig(segment_bytes=4096, fsync=FsyncPolicy.NONE))
    reader = FileLog(tmp_path, 1, FileLogConfig(segment_bytes=4096))  # as the writer's (FileLogConfig)
    writer.append(0, [b"a" * 100])
    synced.clear()
    [record] = reader.read(0, 0, 10)
    reader.sync_through(0, record.offset)
    assert len(synced) == 1, "the partition's first segment"
    writer.append(0, [b"b" * 3000])
    writer.append(0, [b"c" * 3000])  # rolls: the new segment starts at offset 2
    synced.clear()
    records = reader.read(0, 1, 10)
    reader.sync_through(0, 1)  # the caught-up reader syncs the old segment: nothing new in it
    assert synced == []
    reader.sync_through(0, records[-1].offset)
    assert len(synced) == 1, "the rolled segment's entry"
    writer.close()
    reader.close()


ROOMY = FileLogConfig(segment_bytes=1024, fsync=FsyncPolicy.NONE, max_record_bytes=200)  # 4 to 40 frames a segment


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["append-a", "append-b"]), st.lists(st.integers(0, 200), min_size=1, max_size=6)),
            st.tuples(st.just("read"), st.integers(1, 8)),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_instances_see_each_others_rolls_without_a_stat_per_read(steps: list[tuple[str, Any]]) -> None:
    """An instance looks for a successor segment only once its segment lacks room for the largest
    frame; below that it cannot have been rolled. Two appenders and a tailing reader, each its own
    instance, over segments a few records long: the appenders never write behind each other's roll,
    and the reader reads every record once, in order, across every roll."""
    with tempfile.TemporaryDirectory() as directory:
        with FileLog(directory, 1, ROOMY) as a, FileLog(directory, 1, ROOMY) as b, FileLog(directory, 1, ROOMY) as r:
            appenders = {"append-a": a, "append-b": b}
            written: list[bytes] = []
            seen: list[LogRecord] = []
            for step, argument in steps:
                if step == "read":
                    seen.extend(r.read(0, len(seen), argument))
                    continue
                values = [f"{len(written) + i}:".encode().ljust(size, b"x")[:size] for i, size in enumerate(argument)]
                appended = appenders[step].append(0, values)
                assert [x.offset for x in appended] == list(range(len(written), len(written) + len(values)))
                written.extend(values)
            while records := r.read(0, len(seen), 8):
                seen.extend(records)
            assert [x.offset for x in seen] == list(range(len(written)))
            assert [x.value for x in seen] == written
            assert a.end_offset(0) == b.end_offset(0) == r.end_offset(0) == len(written)
        with FileLog(directory, 1, ROOMY) as fresh:
            assert [x.value for x in _read_all(fresh)] == written


@pytest.mark.parametrize("filled", [0, 1], ids=["at-the-threshold", "one-past-it"])
def test_a_segment_at_the_roll_threshold_is_not_looked_past_and_one_byte_more_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filled: int
) -> None:
    """ROOMY's threshold is 1024 - 24 - 200 = 800 bytes. Filled to exactly 800, a segment still takes
    a frame of the largest record, so an appender looks for no successor and makes none; one byte
    more, it looks (one stat) and the largest frame rolls the segment. The other instances read and
    append on across the roll."""
    threshold = ROOMY.segment_bytes - HEADER_BYTES - ROOMY.max_record_bytes
    stats: list[str] = []
    real = os.path.exists
    monkeypatch.setattr(file_log.os.path, "exists", lambda path: (stats.append(str(path)), real(path))[1])
    with FileLog(tmp_path, 1, ROOMY) as a, FileLog(tmp_path, 1, ROOMY) as b, FileLog(tmp_path, 1, ROOMY) as r:
        b.append(0, [b"b"])  # b now holds the segment as its tail
        values = [b"a" * (100 - HEADER_BYTES)] * 7 + [b"a" * (threshold - 725 - HEADER_BYTES + filled)]
        a.append(0, values)
        assert sum(len(v) + HEADER_BYTES for v in [b"b", *values]) == threshold + filled
        assert len(r.read(0, 0, 100)) == 9
        stats.clear()
        b.append(0, [b"B" * ROOMY.max_record_bytes])  # the largest frame
        assert len(stats) == filled, "b looked for a successor only past the threshold"
        assert len(_segments(tmp_path)) == 1 + filled
        [largest] = r.read(0, 9, 100)
        a.append(0, [b"c"])
        [last] = r.read(0, 10, 100)
        assert (largest.offset, largest.value, last.offset, last.value) == (9, b"B" * 200, 10, b"c")
    with FileLog(tmp_path, 1, ROOMY) as fresh:
        assert [x.offset for x in _read_all(fresh)] == list(range(11))
