"""What the benchmarks share: the workload's envelope, timing, the raw references, and the cycle harness.

bench.cycle (queues) and bench.groups (topics and subscription groups) both measure a
produce → receive → ack cycle with a Driver subclass; everything from the rounds on
(timing, references, best-of, reporting, the command line) is here.
"""

from __future__ import annotations

import argparse
import cProfile
import enum
import importlib.metadata
import itertools
import json
import math
import os
import platform
import pstats
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from keyload import limits
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY, Record
from keyload.operations.recovery import replay
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.service.runtime import PartitionProcessor
from keyload.storage.datadir import DataDir

COMMAND = "keyload.Command"
OUTCOME = "keyload.Outcome"

DOMAIN = "bench"
QUEUE = "bench-queue"
PRINCIPAL = "bench"
REPLY_TO = 0  # the outcome partition the "client" listens on
CLIENT_TIME_MS = 1_700_000_000_000
SEED = 20_240_601
PROFILE_LINES = 30
OUTCOME_READ_BATCH = 4096
LABEL_WIDTH = 24  # the cycle column of the tables, at least

Write = tuple[bytes, bytes | None]  # a value of None is a delete
Commit = tuple[dict[bytes, bytes | None], int, int]  # (writes, applied offset, last time), as Store.commit gets them


class BenchError(Exception):
    """The run did not do what it was meant to measure."""


KEYLOAD_RUN = [sys.executable, "-m", "keyload.cli", "run"]
OUTPUT_TAIL_LINES = 40  # of a child's output, in an error


class ServiceProcess:
    """`keyload run` (`KEYLOAD_RUN` + its arguments) as a child process, its output collected line by
    line; `wait_for` until it says what the benchmark waits for, `stop` always ends it."""

    def __init__(self, arguments: Sequence[str], stop_s: float) -> None:
        self.stop_s = stop_s
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [*KEYLOAD_RUN, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Until `ready()`; BenchError naming `what` (stopping the child) if it exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"`keyload run` {what}:\n{self.tail()}")
            time.sleep(0.02)

    def tail(self) -> str:
        return "\n".join(self.lines[-OUTPUT_TAIL_LINES:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise BenchError(f"`keyload run` exited with status {self.process.returncode}:\n{self.tail()}")

    def stop(self) -> int:
        """SIGTERM for the clean shutdown; SIGKILL after `stop_s`; the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(self.stop_s)
        return self.process.returncode


# What the bench principal may do in its domain, served by a `keyload run` with access control on.
BENCH_CAPABILITIES = ("resource_manage", "enqueue", "consume", "inspect")


def create_bench_principal(root: Path) -> None:
    """The bench principal and its credential file, made by the administrator of a served directory:
    benchmarks against `keyload run` act as it (`Client(root, principal=PRINCIPAL)`), as a service would."""
    from keyload import Capability, Client, Grant

    grants = [Grant(capability=Capability(name), domain=DOMAIN) for name in BENCH_CAPABILITIES]
    with Client(root) as admin:
        admin.create_principal(PRINCIPAL, grants)


def encode_command(
    command_id: str, kind: str, body: dict[str, Any], principal: str = PRINCIPAL, domain: str = DOMAIN
) -> bytes:
    """A Command envelope as the SDK writes it: one domain and principal, reply_to set."""
    return REGISTRY.encode(
        COMMAND,
        {
            "command_id": command_id,
            "domain": domain,
            "principal": principal,
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


def measured(name: str, measure: Callable[[Path], dict[str, Any]]) -> dict[str, Any] | None:
    """`measure` run in a temporary directory of its own: its result with the environment, or None once
    a BenchError it raised is printed (`bench.NAME: ...` on stderr)."""
    with tempfile.TemporaryDirectory(prefix=f"keyload-bench-{name}-") as directory:
        try:
            result = measure(Path(directory))
        except BenchError as exc:
            print(f"bench.{name}: {exc}", file=sys.stderr)
            return None
        result["environment"] = environment(0, Path(directory))
    return result


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


# -- the cycle harness: produce → receive → ack in rounds (bench.cycle, bench.groups) ------------


@dataclass(frozen=True)
class Unit:
    """What a cycle moves, as the reports name it."""

    one: str  # "message"
    many: str  # "messages"
    short: str  # "msg", in column headings


class Settle(enum.Enum):
    """How a cycle settles the deliveries of its receives."""

    ACK = "ack"  # one Ack (GroupAck) per token
    ACK_BATCH = "ack-batch"  # one AckBatch (GroupAckBatch) per receive, of its tokens
    COMPLETE = "complete"  # one CompleteProcessing per token, without effects: inbox entry + ack
    COMPLETE_DOC = "complete-doc"  # one CompleteProcessing per token with one PutDocument effect


@dataclass(frozen=True)
class Cycle:
    key: str
    label: str
    receive_max: int  # items one receive asks for
    settle: Settle


class RecordingStore(Store):
    """A Store that keeps every commit's writes while `commits` is a list; (c) writes them again.

    The cost inside the timed loop is one list append per group commit.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits: list[Commit] | None = None

    def commit(
        self,
        writes: dict[bytes, bytes | None],
        applied_offset: int,
        last_time_ms: int,
        applied_record: bytes | None = None,
    ) -> None:
        super().commit(writes, applied_offset, last_time_ms, applied_record)
        if self.commits is not None:
            self.commits.append((writes, applied_offset, last_time_ms))


class Profiler(Protocol):
    """What samples the timed loops (cProfile.Profile; bench.interpreter's perf)."""

    def enable(self) -> None: ...

    def disable(self) -> None: ...


class Driver(ABC):
    """Producers, consumers and the processor of one partition, for one cycle.

    A subclass applies its untimed setup commands and calls start_recording() (setup),
    plays one round of `count` items (_round) and checks the end state (check_drained).
    """

    kinds: ClassVar[tuple[str, ...]]  # the kinds of step a round times, in order

    def __init__(
        self,
        root: Path,
        cycle: Cycle,
        body_bytes: int,
        profiler: Profiler | None = None,
        feature_level: int = 0,
    ) -> None:
        self.root = root
        self.cycle = cycle
        self.body_bytes = body_bytes
        self.profiler = profiler
        self.data = DataDir.create(root / "data")
        self.partition = partition_for(DOMAIN, self.data.partitions)
        self.watches = {kind: Stopwatch() for kind in self.kinds}
        self.first_timed = 0  # offset of the first record applied in a timed loop
        self.round_cpu: list[tuple[int, float]] = []  # (items, apply CPU seconds) of each round
        self.rng = random.Random(SEED)
        self._producer = self.data.file_command_log()  # the default fsync policy: one fsync per append()
        self._log = self.data.file_command_log()  # the processor's own instance, as in `keyload run`
        self._outcomes = self.data.outcome_log()
        self._cursor = 0  # next offset to read on the outcome partition the clients listen on
        self.store = RecordingStore(self.data.projection(self.partition))
        self.processor = PartitionProcessor(
            self.partition,
            self.data.partitions,
            self._log,
            self.store,
            self._outcomes,
            keyring=self.data.keyring(),
        )

        if feature_level:  # the semantics `keyload run` serves (processors/features.py), untimed
            self.submit(None, [("keyload.command.RaiseFeatureLevel", {"level": feature_level})])

    @abstractmethod
    def setup(self, count: int, window: int) -> None:
        """Apply what the cycle needs before its first round (untimed), then start_recording()."""

    @abstractmethod
    def _round(self, count: int) -> None:
        """Produce, receive and ack `count` items, checking each step's outcomes."""

    @abstractmethod
    def check_drained(self, count: int) -> None:
        """After the last round: every item acked, nothing left outstanding (not timed)."""

    def close(self) -> None:
        self._producer.close()
        self._log.close()
        self._outcomes.close()
        self.store.close()

    def new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def start_recording(self) -> None:
        """Record commits from the next one on: everything after this is the timed workload."""
        self.first_timed = self.processor.applied_offset + 1
        self.store.commits = []

    def submit(self, kind: str | None, commands: list[tuple[str, Record]]) -> list[Record]:
        """Append (kind, body) commands in one append(), apply them (timed unless kind is None),
        and return their outcomes from the outcome stream, each checked to be committed."""
        ids = [self.new_id() for _ in commands]
        values = [
            encode_command(command_id, name, body) for command_id, (name, body) in zip(ids, commands, strict=True)
        ]
        target = self._producer.append(self.partition, values)[-1].offset
        processor = self.processor
        watch = self.watches[kind] if kind is not None else Stopwatch()
        if self.profiler is not None and kind is not None:
            self.profiler.enable()
        watch.start()
        while processor.applied_offset < target and processor.step() > 0:
            pass
        watch.stop()
        if self.profiler is not None and kind is not None:
            self.profiler.disable()
        if processor.halt is not None or processor.applied_offset != target:
            raise BenchError(f"apply stopped at offset {processor.applied_offset} of {target}: {processor.halt}")
        outcomes = self._read_outcomes()
        if [outcome["command_id"] for outcome in outcomes] != ids:
            raise BenchError(f"{len(outcomes)} outcomes published for {len(ids)} {kind} commands, or out of order")
        for outcome in outcomes:
            if outcome["status"] != "committed":
                raise BenchError(f"{kind} at offset {outcome['offset']} was {outcome['status']}: {outcome['detail']}")
        return outcomes

    def _read_outcomes(self) -> list[Record]:
        decoded = []
        while records := self._outcomes.read(REPLY_TO, self._cursor, OUTCOME_READ_BATCH):
            decoded += [REGISTRY.decode(OUTCOME, record.value) for record in records]
            self._cursor = records[-1].offset + 1
        return decoded

    def round(self, count: int) -> None:
        """One round of `count` items; its apply CPU time goes to `round_cpu`."""
        cpu_before = sum(watch.cpu_seconds for watch in self.watches.values())
        self._round(count)
        self.round_cpu.append((count, sum(watch.cpu_seconds for watch in self.watches.values()) - cpu_before))


def rounds(count: int, window: int) -> Iterator[int]:
    for first in range(0, count, window):
        yield min(window, count - first)


# -- measurements ----------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    seconds: float
    cpu_seconds: float

    @staticmethod
    def of(watch: Stopwatch) -> Timing:
        return Timing(watch.seconds, watch.cpu_seconds)

    @staticmethod
    def best(timings: Iterable[Timing]) -> Timing:
        """The shortest wall time and the least CPU time (possibly of different runs)."""
        every = list(timings)
        return Timing(min(t.seconds for t in every), min(t.cpu_seconds for t in every))

    def rate(self, count: int) -> float:
        return count / self.seconds if self.seconds > 0 else math.inf

    def cpu_rate(self, count: int) -> float:
        return count / self.cpu_seconds if self.cpu_seconds > 0 else math.inf


@dataclass(frozen=True)
class CycleResult:
    cycle: Cycle
    count: int  # messages or events per cycle
    partitions: int
    records: int  # commands applied in the timed loops (all but the setup)
    groups: int  # group commits (WriteBatches) of the timed loops
    apply: Timing  # (a): the sum of the kinds
    kinds: dict[str, Timing]  # (a) split by the round's command kind
    replay: Timing  # (b)
    writes: Timing  # (c)
    reads: Timing  # (d)
    trend: tuple[float, float]  # (a)'s CPU µs per item over the first and the last tenth of the rounds
    write_bytes: int  # keys + values (c) wrote
    digest_live: str
    digest_replay: str
    peak_rss_kib: int

    @property
    def digests_equal(self) -> bool:
        return self.digest_live == self.digest_replay

    def ratios(self) -> dict[str, float]:
        a = self.apply
        return {
            "a/c": self.writes.seconds / a.seconds,
            "a/d": self.reads.seconds / a.seconds,
            "b/c": self.writes.seconds / self.replay.seconds,
        }

    def cpu_ratios(self) -> dict[str, float]:
        a = self.apply
        return {
            "a/c": self.writes.cpu_seconds / a.cpu_seconds,
            "a/d": self.reads.cpu_seconds / a.cpu_seconds,
            "b/c": self.writes.cpu_seconds / self.replay.cpu_seconds,
        }


def best_of(results: list[CycleResult]) -> CycleResult:
    """Repetitions of one cycle: per phase, and per kind of (a), the shortest wall time and the least CPU time.

    The trend is the one of the repetition with the least (a) CPU; unequal digests win over equal ones.
    """
    first = results[0]
    steadiest = min(results, key=lambda r: r.apply.cpu_seconds)
    unequal = [r for r in results if not r.digests_equal]
    worst = unequal[0] if unequal else first
    return CycleResult(
        first.cycle,
        first.count,
        first.partitions,
        first.records,
        first.groups,
        Timing.best(r.apply for r in results),
        {kind: Timing.best(r.kinds[kind] for r in results) for kind in first.kinds},
        Timing.best(r.replay for r in results),
        Timing.best(r.writes for r in results),
        Timing.best(r.reads for r in results),
        steadiest.trend,
        first.write_bytes,
        worst.digest_live,
        worst.digest_replay,
        max(r.peak_rss_kib for r in results),
    )


def trend(round_cpu: list[tuple[int, float]]) -> tuple[float, float]:
    """CPU µs per item over the first and the last tenth of the rounds (at least one round each)."""
    tenth = max(1, len(round_cpu) // 10)

    def per_item(part: list[tuple[int, float]]) -> float:
        return 1e6 * sum(cpu for _, cpu in part) / sum(count for count, _ in part)

    return per_item(round_cpu[:tenth]), per_item(round_cpu[-tenth:])


def batches_of(commits: list[Commit]) -> list[list[Write]]:
    """Each commit's WriteBatch as Store.commit builds it: the staged writes, then the two position keys."""
    return [
        [*writes.items(), (keys.APPLIED_OFFSET, keys.u64(applied)), (keys.LAST_TIME, keys.u64(last_time))]
        for writes, applied, last_time in commits
    ]


def drive(driver: Driver, count: int, window: int) -> list[Commit]:
    """(a): the setup and every round of the driver's cycle; closes the driver, returns the commits it recorded."""
    try:
        driver.setup(count, window)
        for items in rounds(count, window):
            driver.round(items)
        driver.check_drained(count)
        commits = driver.store.commits
        assert commits is not None
    finally:
        driver.close()
    return commits


def measure(driver: Driver, count: int, window: int) -> CycleResult:
    """(a) to (d) for the driver's cycle, on its fresh data directory under driver.root."""
    commits = drive(driver, count, window)
    root, data, partition = driver.root, driver.data, driver.partition
    apply_rss = peak_rss_kib()
    live = Store(data.projection(partition), read_only=True)
    try:
        digest_live = live.digest()
    finally:
        live.close()

    replay_watch = Stopwatch()
    replay_watch.start()
    replayed = replay(data, partition, root / "replay", progress=False)
    replay_watch.stop()
    last = commits[-1][1]
    if replayed.applied_offset != last:
        raise BenchError(f"replay reached offset {replayed.applied_offset} of {last}")

    batches = batches_of(commits)
    write_bytes = sum(len(key) + len(value or b"") for batch in batches for key, value in batch)
    writes_watch = raw_writes(root / "raw", batches)
    del batches
    offsets = [driver.first_timed - 1] + [applied for _, applied, _ in commits]
    sizes = [end - start for start, end in itertools.pairwise(offsets)]
    reads_watch = read_and_decode(data, partition, driver.first_timed, sizes)
    kinds = {kind: Timing.of(watch) for kind, watch in driver.watches.items()}
    return CycleResult(
        driver.cycle,
        count,
        data.partitions,
        last - driver.first_timed + 1,
        len(commits),
        Timing(sum(t.seconds for t in kinds.values()), sum(t.cpu_seconds for t in kinds.values())),
        kinds,
        Timing.of(replay_watch),
        Timing.of(writes_watch),
        Timing.of(reads_watch),
        trend(driver.round_cpu),
        write_bytes,
        digest_live,
        replayed.digest,
        max(apply_rss, peak_rss_kib()),
    )


def profile_cycle(driver: Driver, count: int, window: int, unit: Unit, lines: int, out: Path | None) -> None:
    """(a) of one cycle again, with cProfile on around the timed loops only; the top functions go to stderr."""
    profiler = cProfile.Profile()
    driver.profiler = profiler
    drive(driver, count, window)
    apply = sum(watch.seconds for watch in driver.watches.values())
    print(
        f"\ncProfile of (a) {driver.cycle.label}: {count} {unit.many}, {apply:.3f} s of step() under the profiler",
        file=sys.stderr,
    )
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.strip_dirs().sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    if out is not None:
        profiler.dump_stats(out)
        print(f"profile written to {out} (pstats format)", file=sys.stderr)


# -- reporting -------------------------------------------------------------------------


def cycles_json(results: list[CycleResult], unit: Unit) -> dict[str, Any]:
    """The per-cycle part of a cycle benchmark's JSON."""

    def timing(t: Timing, count: int) -> dict[str, float]:
        return {
            "seconds": t.seconds,
            "cpu_seconds": t.cpu_seconds,
            f"{unit.many}_per_s": t.rate(count),
            f"{unit.many}_per_cpu_s": t.cpu_rate(count),
        }

    return {
        r.cycle.key: {
            "label": r.cycle.label,
            f"receive_max_{unit.many}": r.cycle.receive_max,
            "ack_batch": r.cycle.settle is Settle.ACK_BATCH,
            "settle": r.cycle.settle.value,
            "records": r.records,
            "groups": r.groups,
            "apply": timing(r.apply, r.count),
            "apply_by_kind": {kind: timing(t, r.count) for kind, t in r.kinds.items()},
            "replay": timing(r.replay, r.count),
            "raw_writes": timing(r.writes, r.count),
            "raw_read_decode": timing(r.reads, r.count),
            "ratios": r.ratios(),
            "cpu_ratios": r.cpu_ratios(),
            f"cpu_us_per_{unit.one}_first_last_tenth": list(r.trend),
            "raw_write_bytes": r.write_bytes,
            "digest_equal": r.digests_equal,
            "digest_live": r.digest_live,
            "digest_replay": r.digest_replay,
            "peak_rss_kib": r.peak_rss_kib,
        }
        for r in results
    }


def cycles_table(results: list[CycleResult], unit: Unit, kind_headings: dict[str, str]) -> list[str]:
    """The two blocks of a cycle benchmark's table: (a) per cycle, then (b) to (d) and the ratios."""
    width = max(LABEL_WIDTH, *(len(r.cycle.label) for r in results))
    kind_widths = {kind: max(7, len(heading)) for kind, heading in kind_headings.items()}
    per_s, per_cpu_s = f"{unit.short}/s", f"{unit.short}/cpu-s"
    lines = [
        f"{'(a) cycle':<{width}} {'records':>7} {'groups':>6} {'wall s':>7} {per_s:>7} {'cpu s':>7} {per_cpu_s:>9}"
        + "".join(f" {heading:>{kind_widths[kind]}}" for kind, heading in kind_headings.items())
        + f" {'µs first→last 10%':>18}",
    ]
    for r in results:
        per = {kind: 1e6 * t.cpu_seconds / r.count for kind, t in r.kinds.items()}
        lines.append(
            f"{r.cycle.label:<{width}} {r.records:>7} {r.groups:>6} {r.apply.seconds:>7.2f}"
            f" {r.apply.rate(r.count):>7,.0f} {r.apply.cpu_seconds:>7.2f} {r.apply.cpu_rate(r.count):>9,.0f}"
            + "".join(f" {per[kind]:>{kind_widths[kind]}.0f}" for kind in kind_headings)
            + f" {f'{r.trend[0]:,.0f} → {r.trend[1]:,.0f}':>18}"
        )
    lines += [
        "",
        f"{f'{per_cpu_s} of':<{width}} {'(b) replay':>10} {'(c) raw wr':>10} {'(d) rd+dec':>10}"
        f"   {'cpu a/c':>7} {'a/d':>6} {'b/c':>6}   {'wall a/c':>8} {'a/d':>6}   digest a==b",
    ]
    for r in results:
        cpu, wall = r.cpu_ratios(), r.ratios()
        lines.append(
            f"{r.cycle.label:<{width}} {r.replay.cpu_rate(r.count):>10,.0f} {r.writes.cpu_rate(r.count):>10,.0f}"
            f" {r.reads.cpu_rate(r.count):>10,.0f}   {cpu['a/c']:>7.3f} {cpu['a/d']:>6.3f} {cpu['b/c']:>6.3f}"
            f"   {wall['a/c']:>8.3f} {wall['a/d']:>6.3f}   {'yes' if r.digests_equal else 'NO'}"
            f" ({r.digest_live[:12]}…)"
        )
    lines.append(
        f"peak RSS of the process: {max(r.peak_rss_kib for r in results) / 1024:.0f} MiB; (c) wrote "
        + ", ".join(f"{r.write_bytes / 2**20:.0f}" for r in results)
        + " MiB of keys+values"
    )
    return lines


# -- the command line --------------------------------------------------------------------


@dataclass(frozen=True)
class Defaults:
    count: int  # items per cycle
    body_bytes: int
    window: int
    warmup: int


def cycle_parser(
    prog: str, description: str, unit: Unit, cycles: Sequence[Cycle], defaults: Defaults, repeat: bool
) -> argparse.ArgumentParser:
    """The options every cycle benchmark takes (`--repeat` when `repeat`); `count` holds --messages or --events."""
    keys = [cycle.key for cycle in cycles]
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        f"--{unit.many}",
        dest="count",
        metavar=unit.many.upper(),
        type=int,
        default=defaults.count,
        help=f"{unit.many} per cycle (default %(default)s)",
    )
    parser.add_argument(
        "--body-bytes", type=int, default=defaults.body_bytes, help=f"{unit.one} body size (default %(default)s)"
    )
    parser.add_argument(
        "--window", type=int, default=defaults.window, help=f"{unit.many} per round (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--feature-level",
        type=int,
        default=limits.FEATURE_LEVEL,
        help="the partition's feature level: the one keyload run serves (default %(default)s), 0 as 0.2.0 logs",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=defaults.warmup,
        help=f"{unit.many} per cycle of an untimed warm-up run first; 0: cold start (default %(default)s)",
    )
    if repeat:
        parser.add_argument(
            "--repeat", type=int, default=1, help="repetitions; per cycle and phase the best is reported"
        )
    parser.add_argument("--cycles", default=",".join(keys), help="which cycles, comma-separated (default %(default)s)")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--profile",
        nargs="?",
        const=keys[0],
        choices=keys,
        default=None,
        help=f"then run (a) of one cycle (default {keys[0]}) once more under cProfile (to stderr)",
    )
    parser.add_argument("--profile-lines", type=int, default=PROFILE_LINES, help="rows per profile listing")
    parser.add_argument("--profile-out", type=Path, default=None, help="also dump that profile (pstats) here")
    return parser


def chosen_cycles(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    cycles: Sequence[Cycle],
    check_sizes: Callable[[int, int, int], None],
) -> list[Cycle]:
    """Check the parsed options (exits with a usage error); the cycles --cycles names, in its order."""
    by_key = {cycle.key: cycle for cycle in cycles}
    try:
        check_sizes(args.count, args.body_bytes, args.window)
        if args.warmup < 0:
            raise BenchError("--warmup must be >= 0")
        if getattr(args, "repeat", 1) < 1:
            raise BenchError("--repeat must be >= 1")
        unknown = [key for key in args.cycles.split(",") if key not in by_key]
        if unknown or not args.cycles:
            raise BenchError(f"--cycles takes some of {', '.join(by_key)}")
    except BenchError as exc:
        parser.error(str(exc))
    return [by_key[key] for key in args.cycles.split(",")]


ToJson = Callable[[list[CycleResult], dict[str, Any]], dict[str, Any]]  # (results, environment) → JSON object
ToTable = Callable[[list[CycleResult], dict[str, Any]], str]


def run_cycles(
    name: str,
    args: argparse.Namespace,
    every: Sequence[Cycle],
    cycles: list[Cycle],
    unit: Unit,
    new_driver: Callable[[Path, Cycle], Driver],
    to_json: ToJson,
    table: ToTable,
) -> int:
    """Warm-up, the chosen cycles (best of --repeat), the report, then the profile (any of `every`); the exit status.

    `name` is the benchmark's (bench.cycle): the temporary directory and error messages carry it.
    """
    repeat: int = getattr(args, "repeat", 1)
    root = Path(tempfile.mkdtemp(prefix=f"keyload-{name.replace('.', '-')}-", dir=args.dir))
    ok = False
    try:
        if args.warmup:
            for cycle in cycles:
                measure(new_driver(root / f"warmup-{cycle.key}", cycle), args.warmup, min(args.window, args.warmup))
        runs: dict[str, list[CycleResult]] = {cycle.key: [] for cycle in cycles}
        for repetition in range(repeat):
            for cycle in cycles:
                path = root / (f"run-{cycle.key}" + (f"-{repetition}" if repetition else ""))
                runs[cycle.key].append(measure(new_driver(path, cycle), args.count, args.window))
                if not args.keep:
                    shutil.rmtree(path)
        results = [best_of(runs[cycle.key]) for cycle in cycles]
        env = environment(args.warmup, root)
        print(json.dumps(to_json(results, env), indent=2) if args.json else table(results, env), flush=True)
        ok = all(result.digests_equal for result in results)
        if args.profile is not None or args.profile_out is not None:
            cycle = {c.key: c for c in every}[args.profile or every[0].key]
            driver = new_driver(root / "profile", cycle)
            profile_cycle(driver, args.count, args.window, unit, args.profile_lines, args.profile_out)
    except BenchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1
