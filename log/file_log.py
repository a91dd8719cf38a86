"""The embedded command log: append-only segment files, one folder per partition.

Layout::

    <directory>/p-0000/.lock                         flock(2) target that serialises appenders
    <directory>/p-0000/00000000000000000000.seg      segment named by its base (first) offset
    <directory>/p-0000/00000000000000004096.seg

Frame format (a contract: tools outside this module read these files). A segment is
a run of frames back to back, one per record, all integers big-endian::

    u32 payload_length | u32 crc32 | u64 offset | i64 timestamp_ms | payload

The header is 24 bytes; crc32 is zlib.crc32 over the offset bytes, the timestamp
bytes and the payload. Offsets are dense per partition and a segment's first frame
carries the segment's base offset.

Concurrency: processes may append to and read the same partition at once. An
append holds an exclusive flock on the partition's .lock and writes its frames with
one write() on an O_APPEND descriptor; readers take no lock. An instance is not
thread-safe: use one per thread.

Damage: frames are found only by walking lengths from the last good frame, never
by searching the bytes (a payload may hold frame-shaped bytes). A frame that is
incomplete or fails its CRC is a torn tail (a write in progress, or a crashed
appender) when walking on from it reaches the end of the file without meeting a
valid frame. Readers stop in front of it; the next append, or repair(), truncates
it. A bad frame that the walk finds a valid frame after, a frame whole but for
its length field (its CRC verifies up to a valid frame of the next offset), a bad
frame in a segment that has a successor, or an offset out of sequence is
corruption: LogCorruption, which names the partition and offset and stops only
that partition. Damage to the very last frame of the active segment cannot be
told from a tear and is cut like one.

Files are private to the service: segments and the lock file are created 0600 and
partition directories 0700.
"""

from __future__ import annotations

import bisect
import enum
import fcntl
import itertools
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from .base import Appended, ClosedOnExit, LogCorruption, LogError, LogRecord, LogTruncated, valid_log_time

HEADER = struct.Struct(">IIQq")  # payload_length, crc32, offset, timestamp_ms
HEADER_BYTES = HEADER.size
CRC_START = 8  # the CRC covers the header from the offset field on, then the payload
STAMP = struct.Struct(">Qq")  # offset, timestamp_ms: the CRC-covered part of the header
MAX_PAYLOAD_BYTES = 2**32 - 1  # what the u32 length field can express
SEGMENT_SUFFIX = ".seg"
SEGMENT_NAME_DIGITS = 20
PARTITION_DIR_FORMAT = "p-{:04d}"
LOCK_FILE_NAME = ".lock"
FILE_MODE = 0o600  # segments hold message bodies: owner only
DIRECTORY_MODE = 0o700
READ_CHUNK_BYTES = 1024 * 1024  # how much a scan reads from a segment at a time


class FsyncPolicy(enum.StrEnum):
    """When appends reach the disk rather than the page cache."""

    ALWAYS = "always"  # fsync after every record
    GROUP = "group"  # one fsync per append() call
    INTERVAL = "interval"  # fsync when fsync_interval_ms passed since this process's last one
    NONE = "none"  # never fsync (OS page cache only): for derived streams


@dataclass(frozen=True)
class FileLogConfig:
    """Tuning of one FileLog. Every process appending to or reading a directory must agree on it
    (DataDir opens every log of a data directory with the settings it records): a reader refuses a
    frame longer than its `max_record_bytes`, and takes a segment that has room left for such a
    frame under its `segment_bytes` to be the newest, so a reader whose segments are larger than
    its writers' would not see them roll."""

    segment_bytes: int = 64 * 1024 * 1024
    fsync: FsyncPolicy = FsyncPolicy.GROUP
    fsync_interval_ms: int = 100
    max_record_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.segment_bytes < 1:
            raise ValueError("segment_bytes must be >= 1")
        if self.fsync_interval_ms < 0:
            raise ValueError("fsync_interval_ms must be >= 0")
        if not 0 <= self.max_record_bytes <= MAX_PAYLOAD_BYTES:
            raise ValueError(f"max_record_bytes must be in 0..{MAX_PAYLOAD_BYTES}")


DEFAULT_CONFIG = FileLogConfig()


@dataclass
class _Tail:
    """This process's view of a partition's newest segment: bytes up to `size` are good."""

    fd: int  # O_APPEND descriptor of the segment
    base: int
    size: int
    next_offset: int
    last_timestamp_ms: int | None  # of the segment's last frame; None while it is empty
    dirty: bool = False  # written by us since our last fsync


@dataclass
class _Cursor:
    """Where the last read() stopped, so that sequential reads only scan new data."""

    fd: int
    base: int
    position: int
    next_offset: int
    previous: tuple[int, int] | None = None  # (segment base, byte position) of the frame of next_offset - 1


@dataclass
class _Partition:
    directory: str
    segments: list[int] = field(default_factory=list)  # base offsets seen, ascending
    lock_fd: int | None = None
    tail: _Tail | None = None
    cursor: _Cursor | None = None
    last_fsync_ms: int | None = None  # monotonic
    synced_through: int | None = None  # records through this offset are durable (set by the first read)


class _Scanner:
    """Walks one segment's frames from a known-good position, verifying each one."""

    def __init__(self, partition: int, fd: int, position: int, next_offset: int, max_record_bytes: int) -> None:
        self.partition = partition
        self.position = position
        self.next_offset = next_offset
        self.last_timestamp_ms: int | None = None
        self.last_position: int | None = None  # where the last good frame starts
        self.torn = False  # stopped in front of a torn tail rather than at the end of the file
        self._fd = fd
        self._max_record_bytes = max_record_bytes
        self._buffer = b""
        self._buffer_start = position

    def records(self) -> Iterator[LogRecord]:
        """The good frames up to the file's current end.

        The scanner's state is updated before each yield, so a caller may stop early
        and still read position/next_offset.
        """
        end = os.fstat(self._fd).st_size
        while self.position < end:
            frame_end, record = self._frame_at(self.position, end)
            if frame_end is None or record is None:
                self._check_torn(self.position, end)
                self.torn = True
                return
            if record.offset != self.next_offset:
                raise LogCorruption(
                    f"partition {self.partition}: offset {record.offset} at byte "
                    f"{self.position}, expected {self.next_offset}",
                    offset=self.next_offset,
                )
            self.last_position = self.position
            self.position = frame_end
            self.next_offset += 1
            self.last_timestamp_ms = record.timestamp_ms
            yield record

    def scan_to_end(self) -> None:
        for _ in self.records():
            pass

    def _check_torn(self, position: int, end: int) -> None:
        """Raise LogCorruption unless the bad frame at `position` is a torn tail.

        A torn write is a prefix of one append, so no valid frame follows it.
        Two kinds of damage are told apart from a tear without ever taking bytes
        inside a frame (a payload holding a well-formed frame, say) for a frame:
        - walking frame lengths on from the bad frame meets a valid frame (a
          flipped byte in a payload, a CRC, an offset or a timestamp);
        - the bad frame is whole but for its length field: its own CRC verifies
          over the bytes up to a valid frame of the next offset.
        """
        walk = position
        while True:
            frame_end, record = self._frame_at(walk, end)
            if frame_end is None:
                break  # the walk ran into the end of the file
            if record is not None:
                raise LogCorruption(
                    f"partition {self.partition}: bad frame at byte {position} "
                    f"(offset {self.next_offset}) followed by a valid frame at byte {walk}",
                    offset=self.next_offset,
                )
            walk = frame_end
        if self._damaged_length(position, end):
            raise LogCorruption(
                f"partition {self.partition}: the length field of the frame at byte {position} "
                f"(offset {self.next_offset}) is damaged; valid frames follow it",
                offset=self.next_offset,
            )

    def _damaged_length(self, position: int, end: int) -> bool:
        """Whether the frame at `position` is intact but for its length field."""
        header = self._bytes(position, HEADER_BYTES, end)
        if header is None:
            return False
        _, crc, offset, timestamp_ms = HEADER.unpack(header)
        if offset != self.next_offset:
            return False
        stamp = STAMP.pack(offset, timestamp_ms)
        needle = STAMP.pack(offset + 1, 0)[:8]
        start = position + HEADER_BYTES
        rest = os.pread(self._fd, end - start, start)
        found = rest.find(needle, CRC_START)
        while found != -1:
            candidate = start + found - CRC_START
            whole = zlib.crc32(rest[: candidate - start], zlib.crc32(stamp)) == crc
            if whole and self._frame_at(candidate, end)[1] is not None:
                return True
            found = rest.find(needle, found + 1)
        return False

    def _frame_at(self, position: int, end: int) -> tuple[int | None, LogRecord | None]:
        """(end of the frame or None if it is incomplete, record or None if it is bad)."""
        header = self._bytes(position, HEADER_BYTES, end)
        if header is None:
            return None, None
        length, crc, offset, timestamp_ms = HEADER.unpack(header)
        if length > self._max_record_bytes:
            return None, None
        frame = self._bytes(position, HEADER_BYTES + length, end)
        if frame is None:
            return None, None
        frame_end = position + len(frame)
        if zlib.crc32(frame[CRC_START:]) != crc:
            return frame_end, None
        payload = bytes(frame[HEADER_BYTES:])
        return frame_end, LogRecord(self.partition, offset, timestamp_ms, payload)

    def _bytes(self, position: int, length: int, end: int) -> memoryview | None:
        """`length` bytes at `position`, or None if the file (as of `end`) is shorter."""
        if position + length > end:
            return None
        start = position - self._buffer_start
        if start < 0 or start + length > len(self._buffer):
            size = min(max(length, READ_CHUNK_BYTES), end - position)
            self._buffer = os.pread(self._fd, size, position)
            self._buffer_start = position
            start = 0
            if len(self._buffer) < length:  # a torn tail was cut meanwhile
                return None
        return memoryview(self._buffer)[start : start + length]


def _encode_frame(offset: int, timestamp_ms: int, value: bytes) -> bytes:
    crc = zlib.crc32(value, zlib.crc32(STAMP.pack(offset, timestamp_ms)))
    return HEADER.pack(len(value), crc, offset, timestamp_ms) + value


def _segment_base(name: str) -> int | None:
    stem = name.removesuffix(SEGMENT_SUFFIX)
    if stem == name or len(stem) != SEGMENT_NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _sync_segment(fd: int) -> None:
    """Make what was appended to (or truncated from) a segment durable: fdatasync, which flushes its
    data and its size (what reading it back needs) and leaves out its timestamps, as PostgreSQL and
    etcd sync their logs on Linux. A new segment's directory entry takes `fsync_directory` too."""
    os.fdatasync(fd)


def fsync_directory(path: str) -> None:
    """Makes a new directory entry durable (fsync of the file alone does not)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileLog(ClosedOnExit):
    """CommandLog on local segment files; see the module docstring for the format."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        partitions: int,
        config: FileLogConfig = DEFAULT_CONFIG,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if partitions < 1:
            raise LogError("partitions must be >= 1")
        self._directory = os.fspath(directory)
        self._partitions = partitions
        self._config = config
        # A segment no longer than this has room for one more frame of the largest record.
        self._roll_threshold = config.segment_bytes - HEADER_BYTES - config.max_record_bytes
        self._clock_ms = clock_ms or _wall_clock_ms
        self._states: dict[int, _Partition] = {}
        self._closed = False

    @property
    def partitions(self) -> int:
        return self._partitions

    def append(self, partition: int, values: list[bytes]) -> list[Appended]:
        state = self._state(partition)
        for value in values:
            if len(value) > self._config.max_record_bytes:
                raise LogError(f"record of {len(value)} bytes exceeds max_record_bytes {self._config.max_record_bytes}")
        if not values:
            return []
        with self._io_errors(), self._locked(state):
            try:
                return self._append_locked(partition, state, values)
            except BaseException:
                self._drop_tail(state)  # the file may not match the cache any more: rescan
                raise

    def append_batches(self, batches: Mapping[int, list[bytes]]) -> None:
        """One append per partition: each is durable per the fsync policy when it returns."""
        for partition, values in batches.items():
            self.append(partition, values)

    def read(self, partition: int, from_offset: int, max_records: int) -> list[LogRecord]:
        state = self._state(partition)
        if from_offset < 0 or max_records < 1:
            raise LogError("from_offset must be >= 0 and max_records >= 1")
        with self._io_errors():
            cursor = self._cursor_for(partition, state, from_offset)
            if cursor is None:
                return []
            return self._read_from(partition, state, cursor, from_offset, max_records)

    def end_offset(self, partition: int) -> int:
        state = self._state(partition)
        with self._io_errors():
            tail = self._refresh_tail(partition, state, repair=False)
        return 0 if tail is None else tail.next_offset

    def start_offset(self, partition: int) -> int:
        state = self._state(partition)
        with self._io_errors():
            bases = self._list_segments(state)
        return bases[0] if bases else 0

    def truncate_before(self, partition: int, offset: int) -> int:
        """Deletes whole segments whose every record is below `offset`, oldest first so
        that a crash midway leaves no hole; the newest segment always stays."""
        state = self._state(partition)
        end = self.end_offset(partition)
        if not 0 <= offset <= end:
            raise LogError(f"cannot truncate partition {partition} before {offset}: its offsets end at {end}")
        with self._io_errors():
            bases = self._list_segments(state)
            for base, successor in itertools.pairwise(bases):
                if successor > offset:
                    break
                if state.cursor is not None and state.cursor.base == base:
                    os.close(state.cursor.fd)
                    state.cursor = None
                with suppress(FileNotFoundError):  # another process truncated it first
                    os.remove(self._segment_path(state, base))
            return self.start_offset(partition)

    def truncate_older_than(self, partition: int, cutoff_ms: int) -> int:
        """Deletes whole segments whose every record was stamped before `cutoff_ms` (retention by
        time, as a Kafka topic's `retention.ms`); the newest segment always stays. A segment's
        records are no later than its successor's first (stamps never decrease), so that one record
        decides without a scan. Returns the log's start offset."""
        state = self._state(partition)
        with self._io_errors():
            bases = self._list_segments(state)
        keep_from = bases[0] if bases else 0
        for successor in bases[1:]:
            first = self.read(partition, successor, 1)
            if not first or first[0].timestamp_ms >= cutoff_ms:
                break
            keep_from = successor
        return self.truncate_before(partition, keep_from)

    def sync_through(self, partition: int, offset: int) -> None:
        """fsync every segment holding records this instance read through `offset`.

        Records before this instance's first read were made durable by whoever
        committed them; a group may span a segment roll, so each segment from the
        last synced record's to `offset`'s is synced, and the directory too when a
        new segment's entry is involved. With the default GROUP policy the
        appender has already synced, and this costs one cheap syscall a segment.
        """
        state = self._state(partition)
        cursor = state.cursor
        if cursor is None or state.synced_through is None or offset >= cursor.next_offset:
            raise LogError(f"offset {offset} of partition {partition} was not read by this instance")
        if offset <= state.synced_through:
            return
        bases = state.segments
        first = bisect.bisect_right(bases, state.synced_through + 1) - 1
        last = bisect.bisect_right(bases, offset) - 1
        with self._io_errors():
            for base in bases[max(first, 0) : last + 1]:
                if base == cursor.base:
                    _sync_segment(cursor.fd)
                else:
                    self._fsync_segment(state, base)
            # A segment begun since the last sync (a roll, or the partition's first) needs its
            # directory entry made durable too: an appender with the NONE policy (the HTTP
            # server's) did not sync it.
            if last > first or bases[max(first, 0)] == state.synced_through + 1:
                fsync_directory(state.directory)
        state.synced_through = offset

    def _fsync_segment(self, state: _Partition, base: int) -> None:
        try:
            fd = os.open(self._segment_path(state, base), os.O_RDONLY)
        except FileNotFoundError:
            return  # truncated meanwhile: its records lie below the recovery floor
        try:
            _sync_segment(fd)
        finally:
            os.close(fd)

    def repair(self, partition: int) -> int:
        """Truncates a torn tail left by a crashed appender; returns the end offset."""
        state = self._state(partition)
        with self._io_errors(), self._locked(state):
            tail = self._refresh_tail(partition, state, repair=True)
        return 0 if tail is None else tail.next_offset

    def close(self) -> None:
        """Closes every descriptor, first syncing data an INTERVAL policy left unsynced."""
        if self._closed:
            return
        self._closed = True
        with self._io_errors():
            for state in self._states.values():
                try:
                    self._drop_tail(state)
                finally:
                    if state.cursor is not None:
                        os.close(state.cursor.fd)
                    if state.lock_fd is not None:
                        os.close(state.lock_fd)

    # -- appending ---------------------------------------------------------------------

    def _append_locked(self, partition: int, state: _Partition, values: list[bytes]) -> list[Appended]:
        tail = self._refresh_tail(partition, state, repair=True)
        if tail is None:
            tail = self._start_segment(state, base=0, last_timestamp_ms=None)
        floor = tail.last_timestamp_ms
        if floor is None:
            floor = self._last_timestamp_before(partition, state, tail.base)
        if floor is not None and not valid_log_time(floor):
            floor = None  # an absurd stamp (processors record it as poison) must not hold later ones
        timestamp = self._clock_ms() if floor is None else max(self._clock_ms(), floor)
        always = self._config.fsync is FsyncPolicy.ALWAYS
        appended: list[Appended] = []
        pending = bytearray()
        offset = tail.next_offset
        for value in values:
            frame = _encode_frame(offset, timestamp, value)
            used = tail.size + len(pending)
            if used > 0 and used + len(frame) > self._config.segment_bytes:
                self._write(tail, pending, offset, timestamp)
                pending = bytearray()
                tail = self._start_segment(state, base=offset, last_timestamp_ms=timestamp)
            pending += frame
            appended.append(Appended(partition, offset, timestamp))
            offset += 1
            if always:
                self._write(tail, pending, offset, timestamp)
                pending = bytearray()
                self._fsync_tail(state, tail)
        self._write(tail, pending, offset, timestamp)
        if self._fsync_due(state):
            self._fsync_tail(state, tail)
        return appended

    def _write(self, tail: _Tail, data: bytearray, next_offset: int, timestamp_ms: int) -> None:
        """Appends whole frames; one write() unless the kernel takes them piecewise."""
        view = memoryview(data)
        while view:
            view = view[os.write(tail.fd, view) :]
        if data:
            tail.size += len(data)
            tail.next_offset = next_offset
            tail.last_timestamp_ms = timestamp_ms
            tail.dirty = True

    def _fsync_due(self, state: _Partition) -> bool:
        policy = self._config.fsync
        if policy is FsyncPolicy.GROUP:
            return True
        if policy is FsyncPolicy.INTERVAL:
            last = state.last_fsync_ms
            return last is None or _monotonic_ms() - last >= self._config.fsync_interval_ms
        return False  # ALWAYS has synced each record already; NONE never syncs

    def _fsync_tail(self, state: _Partition, tail: _Tail) -> None:
        _sync_segment(tail.fd)
        tail.dirty = False
        state.last_fsync_ms = _monotonic_ms()

    def _start_segment(self, state: _Partition, base: int, last_timestamp_ms: int | None) -> _Tail:
        """Rolls to a new segment; the old one is synced first so that no later segment
        can survive a power loss that an earlier one's data did not."""
        durable = self._config.fsync is not FsyncPolicy.NONE
        if state.tail is not None and durable:
            self._fsync_tail(state, state.tail)
        self._drop_tail(state)
        path = self._segment_path(state, base)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, FILE_MODE)
        state.tail = _Tail(fd, base, 0, base, last_timestamp_ms)
        if durable:
            fsync_directory(state.directory)
        return state.tail

    def _last_timestamp_before(self, partition: int, state: _Partition, base: int) -> int | None:
        """The last timestamp of the segment before `base`: needed only when the newest
        segment is empty (an appender died between creating and writing it)."""
        earlier = [b for b in state.segments if b < base]
        if not earlier:
            return None
        fd = os.open(self._segment_path(state, earlier[-1]), os.O_RDONLY)
        try:
            scanner = _Scanner(partition, fd, 0, earlier[-1], self._config.max_record_bytes)
            scanner.scan_to_end()
        finally:
            os.close(fd)
        return scanner.last_timestamp_ms

    def _refresh_tail(self, partition: int, state: _Partition, repair: bool) -> _Tail | None:
        """Brings the cached tail up to date by scanning what other processes appended;
        with `repair` (only under the lock) a torn tail is truncated. None: no segments.

        The directory is listed only when there is no cached tail or another process rolled
        it (a segment exists at the offset after its last frame), not on every append."""
        tail = state.tail
        if tail is not None:
            scanner = self._scan_tail(partition, tail)
            if not self._rolled(state, tail.base, tail.next_offset, tail.size):
                return self._repaired(tail, scanner, repair)
        bases = self._list_segments(state)
        if not bases:
            return None
        if tail is None or tail.base != bases[-1]:
            self._drop_tail(state)
            fd = os.open(self._segment_path(state, bases[-1]), os.O_RDWR | os.O_APPEND)
            tail = state.tail = _Tail(fd, bases[-1], 0, bases[-1], None)
        return self._repaired(tail, self._scan_tail(partition, tail), repair)

    def _scan_tail(self, partition: int, tail: _Tail) -> _Scanner:
        scanner = _Scanner(partition, tail.fd, tail.size, tail.next_offset, self._config.max_record_bytes)
        scanner.scan_to_end()
        tail.size = scanner.position
        tail.next_offset = scanner.next_offset
        if scanner.last_timestamp_ms is not None:
            tail.last_timestamp_ms = scanner.last_timestamp_ms
        return scanner

    @staticmethod
    def _repaired(tail: _Tail, scanner: _Scanner, repair: bool) -> _Tail:
        if scanner.torn and repair:
            os.ftruncate(tail.fd, scanner.position)
            _sync_segment(tail.fd)
        return tail

    def _rolled(self, state: _Partition, base: int, next_offset: int, size: int) -> bool:
        """Whether the segment at `base`, read through `next_offset` (`size` bytes of whole frames),
        has a successor: it can only start at that offset (offsets are dense and a segment is named
        by its first), and an empty segment has none (that name is its own). An appender rolls only
        when the next frame would not fit, so a segment with room left for the largest frame has no
        successor either: no stat (about 10 µs in a processor's step) until a segment nears its end.
        Otherwise one stat, instead of listing the directory."""
        if next_offset == base or size <= self._roll_threshold:
            return False
        return os.path.exists(self._segment_path(state, next_offset))

    def _drop_tail(self, state: _Partition) -> None:
        tail = state.tail
        if tail is None:
            return
        state.tail = None
        try:
            if tail.dirty and self._config.fsync is not FsyncPolicy.NONE:
                _sync_segment(tail.fd)
        finally:
            os.close(tail.fd)

    @contextmanager
    def _locked(self, state: _Partition) -> Iterator[None]:
        if state.lock_fd is None:
            self._make_directory(state.directory)
            lock_path = os.path.join(state.directory, LOCK_FILE_NAME)
            state.lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        fcntl.flock(state.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(state.lock_fd, fcntl.LOCK_UN)

    def _make_directory(self, path: str) -> None:
        if os.path.isdir(path):
            return
        os.makedirs(path, mode=DIRECTORY_MODE, exist_ok=True)
        if self._config.fsync is not FsyncPolicy.NONE:
            fsync_directory(os.path.dirname(path))

    # -- reading -----------------------------------------------------------------------

    def _cursor_for(self, partition: int, state: _Partition, from_offset: int) -> _Cursor | None:
        """A cursor at or before `from_offset` in the segment holding it; None: no segments.

        Reading again the last record read (a processor checking the identity of
        the record it applied last) steps back one frame instead of rescanning.
        """
        if state.synced_through is None:
            state.synced_through = from_offset - 1
        cursor = state.cursor
        if cursor is not None and cursor.next_offset == from_offset:
            return cursor
        if cursor is not None and cursor.next_offset == from_offset + 1 and cursor.previous is not None:
            base, position = cursor.previous
            if base != cursor.base:
                cursor = self._open_cursor(state, base)
            cursor.position, cursor.next_offset, cursor.previous = position, from_offset, None
            return cursor
        bases = self._list_segments(state)
        if not bases:
            return None
        if from_offset < bases[0]:
            raise LogTruncated(
                f"offset {from_offset} of partition {partition} is below the log's start offset "
                f"{bases[0]}: the records before it were truncated"
            )
        base = bases[bisect.bisect_right(bases, from_offset) - 1]
        if cursor is not None and cursor.base == base and cursor.next_offset <= from_offset:
            return cursor
        return self._open_cursor(state, base)

    def _open_cursor(self, state: _Partition, base: int) -> _Cursor:
        if state.cursor is not None:
            os.close(state.cursor.fd)
            state.cursor = None
        fd = os.open(self._segment_path(state, base), os.O_RDONLY)
        state.cursor = _Cursor(fd, base, 0, base)
        return state.cursor

    def _read_from(
        self, partition: int, state: _Partition, cursor: _Cursor, from_offset: int, max_records: int
    ) -> list[LogRecord]:
        records: list[LogRecord] = []
        while True:
            # A segment with a successor is complete: its frames were written before the
            # successor was created, so it cannot hold a write in progress or a torn tail.
            sealed = cursor.base != state.segments[-1]
            scanner = _Scanner(partition, cursor.fd, cursor.position, cursor.next_offset, self._config.max_record_bytes)
            for record in scanner.records():
                if record.offset >= from_offset:
                    records.append(record)
                    if len(records) == max_records:
                        break
            cursor.position = scanner.position
            cursor.next_offset = scanner.next_offset
            if scanner.last_position is not None:
                cursor.previous = (cursor.base, scanner.last_position)
            if len(records) == max_records:
                return records
            if not sealed:
                if not self._rolled(state, cursor.base, cursor.next_offset, cursor.position):
                    if records or cursor.position <= self._roll_threshold or os.fstat(cursor.fd).st_nlink:
                        return records
                    # The segment was deleted under this reader, with its successors (it had one:
                    # it was filled): truncation or retention passed the reader's position.
                    raise self._truncated_under(partition, state, cursor.next_offset)
                self._list_segments(state)
                continue  # it was sealed meanwhile: read its last frames before moving on
            next_base = state.segments[bisect.bisect_right(state.segments, cursor.base)]
            if scanner.torn or cursor.next_offset != next_base:
                raise LogCorruption(
                    f"partition {partition}: segment {cursor.base} ends at offset "
                    f"{cursor.next_offset} (torn: {scanner.torn}), the next starts at {next_base}"
                )
            previous = cursor.previous
            try:
                cursor = self._open_cursor(state, next_base)
            except FileNotFoundError:  # deleted since it was listed: oldest first, so this reader's too
                if records:
                    return records
                raise self._truncated_under(partition, state, next_base) from None
            cursor.previous = previous

    def _truncated_under(self, partition: int, state: _Partition, offset: int) -> LogError:
        """LogTruncated when the segments were deleted up to past `offset`, as truncation and
        retention delete them (oldest first); else LogError: a segment missing from the middle."""
        if state.cursor is not None:
            os.close(state.cursor.fd)
            state.cursor = None
        bases = self._list_segments(state)
        start = bases[0] if bases else 0
        if offset < start:
            return LogTruncated(
                f"offset {offset} of partition {partition} is below the log's start offset {start}: "
                "the records before it were truncated while this reader read them"
            )
        return LogError(f"partition {partition}: the segment holding offset {offset} is missing")

    # -- shared ------------------------------------------------------------------------

    def _state(self, partition: int) -> _Partition:
        if self._closed:
            raise LogError("the log is closed")
        if not 0 <= partition < self._partitions:
            raise LogError(f"partition {partition} is not in 0..{self._partitions - 1}")
        state = self._states.get(partition)
        if state is None:
            directory = os.path.join(self._directory, PARTITION_DIR_FORMAT.format(partition))
            state = self._states[partition] = _Partition(directory)
        return state

    def _list_segments(self, state: _Partition) -> list[int]:
        try:
            names = os.listdir(state.directory)
        except FileNotFoundError:
            names = []
        bases = (_segment_base(name) for name in names)
        state.segments = sorted(base for base in bases if base is not None)
        return state.segments

    @staticmethod
    def _segment_path(state: _Partition, base: int) -> str:
        name = f"{base:0{SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"
        return os.path.join(state.directory, name)

    @staticmethod
    @contextmanager
    def _io_errors() -> Iterator[None]:
        """Reports I/O failures as LogError, as the CommandLog contract says."""
        try:
            yield
        except OSError as exc:
            raise LogError(f"file log I/O failed: {exc}") from exc
