"""Enqueue → receive → ack cycle throughput, with receive batches of 1 and 100, against raw references.

    python -m bench.cycle [--messages N] [--body-bytes B] [--window W] [--json]

For each cycle (receive 1 + Ack each; receive 100 + one AckBatch per receive;
receive 100 + Ack each), a fresh data directory and one queue. In rounds of W
messages, the harness plays producers and consumers against the file log (default
fsync policy) while a PartitionProcessor applies it with the outcome stream on:

    append W Enqueues            → step the processor until caught up   [timed]
    append ceil(W / k) Receives  → step                                 [timed]
    read the tokens from the Receive outcomes on the outcome stream
    append the Acks / AckBatches → step                                 [timed]

Only the step() loops are timed (thread CPU and wall). Command encoding, appends and
their fsyncs, outcome reading and every check are the harness's and are not. Then:

(b) replay: recovery.replay() of the cycle's log into an empty directory (digest must equal (a)'s).
(c) raw writes: the exact WriteBatches (a) committed, rebuilt as Store.commit builds them,
            written with rocksdict alone into a fresh Rdict with the Store's options.
(d) raw read + decode: FileLog.read() of the same records in (a)'s groups, REGISTRY.decode of each.

Every rate is messages per second: a message's share of its enqueue, receive and ack.
bench/README.md explains the columns and ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import math
import pstats
import random
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyload.datadir import DataDir
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.processors import limits
from keyload.processors.policy import INTEGER_FIELDS, default_spec
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.recovery import replay
from keyload.runtime import PartitionProcessor

from .common import (
    DOMAIN,
    OUTCOME,
    QUEUE,
    REPLY_TO,
    SEED,
    BenchError,
    Stopwatch,
    Write,
    encode_command,
    environment,
    peak_rss_kib,
    raw_writes,
    read_and_decode,
)

CREATE_QUEUE = "keyload.command.CreateQueue"
ENQUEUE = "keyload.command.Enqueue"
RECEIVE = "keyload.command.Receive"
ACK = "keyload.command.Ack"
ACK_BATCH = "keyload.command.AckBatch"
QUEUE_RECORD = "keyload.QueueRecord"

DEFAULT_MESSAGES = 20_000
DEFAULT_BODY_BYTES = 1024
DEFAULT_WINDOW = 500
DEFAULT_WARMUP = 1_000
LEASE_MS = 600_000  # no lease may expire mid-round, even under the profiler
PROFILE_LINES = 30
KINDS = ("enqueue", "receive", "ack")

Record = dict[str, Any]
Commit = tuple[dict[bytes, bytes | None], int, int]  # (writes, applied offset, last time), as Store.commit gets them


@dataclass(frozen=True)
class Cycle:
    key: str
    label: str
    receive_max: int  # Receive.max_messages
    ack_batch: bool  # one AckBatch per Receive rather than one Ack per token


CYCLES = (
    Cycle("1", "receive 1, Ack each", 1, False),
    Cycle("100", "receive 100, AckBatch", 100, True),
    Cycle("100-ack", "receive 100, Ack each", 100, False),
)
BY_KEY = {cycle.key: cycle for cycle in CYCLES}


class RecordingStore(Store):
    """A Store that keeps every commit's writes while `commits` is a list; (c) writes them again.

    The cost inside the timed loop is one list append per group commit.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits: list[Commit] | None = None

    def commit(self, writes: dict[bytes, bytes | None], applied_offset: int, last_time_ms: int) -> None:
        super().commit(writes, applied_offset, last_time_ms)
        if self.commits is not None:
            self.commits.append((writes, applied_offset, last_time_ms))


def policy_for(messages: int, body_bytes: int, window: int) -> Record:
    return {
        **default_spec(),
        "max_stored_messages": messages,
        "max_stored_bytes": max(messages * body_bytes, 1),
        "max_in_flight": window,  # a round's messages are the most that are ever leased
        "receive_max_messages": max(cycle.receive_max for cycle in CYCLES),
        "receive_max_bytes": INTEGER_FIELDS["receive_max_bytes"].maximum,
        "lease_ms": LEASE_MS,
    }


class Driver:
    """Producers, consumers and the processor of one partition, for one cycle."""

    def __init__(self, root: Path, cycle: Cycle, body_bytes: int, profiler: cProfile.Profile | None = None) -> None:
        self.cycle = cycle
        self.body_bytes = body_bytes
        self.profiler = profiler
        self.data = DataDir.create(root / "data")
        self.partition = partition_for(DOMAIN, self.data.partitions)
        self.watches = {kind: Stopwatch() for kind in KINDS}
        self.first_timed = 0  # offset of the first record applied in a timed loop
        self.round_cpu: list[tuple[int, float]] = []  # (messages, apply CPU seconds) of each round
        self._rng = random.Random(SEED)
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

    def close(self) -> None:
        self._producer.close()
        self._log.close()
        self._outcomes.close()
        self.store.close()

    def _new_id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def submit(self, kind: str | None, commands: list[tuple[str, Record]]) -> list[Record]:
        """Append (kind, body) commands in one append(), apply them (timed unless kind is None),
        and return their outcomes from the outcome stream, each checked to be committed."""
        ids = [self._new_id() for _ in commands]
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
        while records := self._outcomes.read(REPLY_TO, self._cursor, 4096):
            decoded += [REGISTRY.decode(OUTCOME, record.value) for record in records]
            self._cursor = records[-1].offset + 1
        return decoded

    def create_queue(self, messages: int, window: int) -> None:
        policy = policy_for(messages, self.body_bytes, window)
        self.submit(None, [(CREATE_QUEUE, {"queue": QUEUE, "policy": policy})])
        self.first_timed = self.processor.applied_offset + 1
        self.store.commits = []  # record from the first timed commit on

    def round(self, count: int) -> None:
        """One round: `count` messages enqueued, received and acked; its apply CPU time goes to `round_cpu`."""
        cpu_before = sum(watch.cpu_seconds for watch in self.watches.values())
        self._round(count)
        self.round_cpu.append((count, sum(watch.cpu_seconds for watch in self.watches.values()) - cpu_before))

    def _round(self, count: int) -> None:
        enqueues = []
        for _ in range(count):
            message_id = self._new_id()
            enqueues.append((ENQUEUE, enqueue_body(message_id, self._rng.randbytes(self.body_bytes))))
        self.submit("enqueue", enqueues)
        expected = [body["message_id"] for _, body in enqueues]

        batches: list[list[str]] = []  # the tokens of each Receive that delivered any
        delivered: list[str] = []
        while len(delivered) < count:
            wanted = count - len(delivered)
            receives = -(-wanted // self.cycle.receive_max)
            body = {
                "queue": QUEUE,
                "max_messages": self.cycle.receive_max,
                "max_bytes": None,
                "lease_ms": None,
                "wait_ms": None,  # no long poll: the round's messages are ready
            }
            before = len(delivered)
            for outcome in self.submit("receive", [(RECEIVE, body)] * receives):
                deliveries = outcome["result"][1]["deliveries"]
                if deliveries:
                    batches.append([delivery["token"] for delivery in deliveries])
                    delivered += [delivery["message_id"] for delivery in deliveries]
            if len(delivered) == before:
                raise BenchError(f"receives delivered nothing with {wanted} messages ready")
        if delivered != expected:
            raise BenchError("the round's messages were not delivered once each in FIFO order")

        acks: list[tuple[str, Record]]
        if self.cycle.ack_batch:
            acks = [
                (ACK_BATCH, {"tokens": tokens[first : first + limits.MAX_ACK_BATCH]})
                for tokens in batches
                for first in range(0, len(tokens), limits.MAX_ACK_BATCH)
            ]
        else:
            acks = [(ACK, {"token": token}) for tokens in batches for token in tokens]
        for outcome in self.submit("ack", acks):
            result = outcome["result"][1]
            if self.cycle.ack_batch:
                refused = [item for item in result["results"] if item["status"] != "committed"]
                if refused:
                    raise BenchError(f"AckBatch refused {len(refused)} tokens: {refused[0]['error_code']}")
            elif result["state"] != "acked":
                raise BenchError(f"an Ack left its message {result['state']}")

    def check_drained(self, messages: int) -> None:
        """Every message acked, nothing stored, leased or ready (not timed)."""
        raw = self.store.get(keys.queue(DOMAIN, QUEUE))
        if raw is None:
            raise BenchError("the queue record is missing")
        counters = REGISTRY.decode(QUEUE_RECORD, raw)["view"]["counters"]
        drained = {"acked_total": messages, "stored_messages": 0, "stored_bytes": 0, "leased": 0, "ready": 0}
        wrong = {name: counters[name] for name, value in drained.items() if counters[name] != value}
        if wrong:
            raise BenchError(f"queue counters after the run: {wrong}, expected {drained}")


def enqueue_body(message_id: str, payload: bytes) -> Record:
    return {
        "queue": QUEUE,
        "message_id": message_id,
        "body": payload,
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }


def rounds(messages: int, window: int) -> Iterator[int]:
    for first in range(0, messages, window):
        yield min(window, messages - first)


# -- measurements ----------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    seconds: float
    cpu_seconds: float

    @staticmethod
    def of(watch: Stopwatch) -> Timing:
        return Timing(watch.seconds, watch.cpu_seconds)

    def rate(self, messages: int) -> float:
        return messages / self.seconds if self.seconds > 0 else math.inf

    def cpu_rate(self, messages: int) -> float:
        return messages / self.cpu_seconds if self.cpu_seconds > 0 else math.inf


@dataclass(frozen=True)
class CycleResult:
    cycle: Cycle
    messages: int
    partitions: int
    records: int  # commands applied in the timed loops (all but the CreateQueue)
    groups: int  # group commits (WriteBatches) of the timed loops
    apply: Timing  # (a): the sum of the kinds
    kinds: dict[str, Timing]  # (a) split by the round's command kind
    replay: Timing  # (b)
    writes: Timing  # (c)
    reads: Timing  # (d)
    trend: tuple[float, float]  # (a)'s CPU µs per message over the first and the last tenth of the rounds
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


def trend(round_cpu: list[tuple[int, float]]) -> tuple[float, float]:
    """CPU µs per message over the first and the last tenth of the rounds (at least one round each)."""
    tenth = max(1, len(round_cpu) // 10)

    def per_message(part: list[tuple[int, float]]) -> float:
        return 1e6 * sum(cpu for _, cpu in part) / sum(count for count, _ in part)

    return per_message(round_cpu[:tenth]), per_message(round_cpu[-tenth:])


def batches_of(commits: list[Commit]) -> list[list[Write]]:
    """Each commit's WriteBatch as Store.commit builds it: the staged writes, then the two position keys."""
    return [
        [*writes.items(), (keys.APPLIED_OFFSET, keys.u64(applied)), (keys.LAST_TIME, keys.u64(last_time))]
        for writes, applied, last_time in commits
    ]


def drive(
    root: Path, cycle: Cycle, messages: int, body_bytes: int, window: int, profiler: cProfile.Profile | None = None
) -> tuple[Driver, list[Commit]]:
    """(a): every round of the cycle; returns the closed driver and the commits it recorded."""
    driver = Driver(root, cycle, body_bytes, profiler)
    try:
        driver.create_queue(messages, window)
        for count in rounds(messages, window):
            driver.round(count)
        driver.check_drained(messages)
        commits = driver.store.commits
        assert commits is not None
    finally:
        driver.close()
    return driver, commits


def measure(root: Path, cycle: Cycle, messages: int, body_bytes: int, window: int) -> CycleResult:
    """(a) to (d) for one cycle on a fresh data directory under `root`."""
    driver, commits = drive(root, cycle, messages, body_bytes, window)
    data, partition = driver.data, driver.partition
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
        cycle,
        messages,
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


def profile_cycle(
    root: Path, cycle: Cycle, messages: int, body_bytes: int, window: int, lines: int, out: Path | None
) -> None:
    """(a) of one cycle again, with cProfile on around the timed loops only; the top functions go to stderr."""
    profiler = cProfile.Profile()
    driver, _ = drive(root, cycle, messages, body_bytes, window, profiler)
    apply = sum(watch.seconds for watch in driver.watches.values())
    print(
        f"\ncProfile of (a) {cycle.label}: {messages} messages, {apply:.3f} s of step() under the profiler",
        file=sys.stderr,
    )
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.strip_dirs().sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    if out is not None:
        profiler.dump_stats(out)
        print(f"profile written to {out} (pstats format)", file=sys.stderr)


# -- reporting -------------------------------------------------------------------------


def to_json(results: list[CycleResult], body_bytes: int, window: int, env: dict[str, Any]) -> dict[str, Any]:
    def timing(t: Timing, messages: int) -> dict[str, float]:
        return {
            "seconds": t.seconds,
            "cpu_seconds": t.cpu_seconds,
            "messages_per_s": t.rate(messages),
            "messages_per_cpu_s": t.cpu_rate(messages),
        }

    return {
        "benchmark": "bench.cycle",
        "messages": results[0].messages,
        "partitions": results[0].partitions,
        "body_bytes": body_bytes,
        "window": window,
        "cycles": {
            r.cycle.key: {
                "label": r.cycle.label,
                "receive_max_messages": r.cycle.receive_max,
                "ack_batch": r.cycle.ack_batch,
                "records": r.records,
                "groups": r.groups,
                "apply": timing(r.apply, r.messages),
                "apply_by_kind": {kind: timing(t, r.messages) for kind, t in r.kinds.items()},
                "replay": timing(r.replay, r.messages),
                "raw_writes": timing(r.writes, r.messages),
                "raw_read_decode": timing(r.reads, r.messages),
                "ratios": r.ratios(),
                "cpu_ratios": r.cpu_ratios(),
                "cpu_us_per_message_first_last_tenth": list(r.trend),
                "raw_write_bytes": r.write_bytes,
                "digest_equal": r.digests_equal,
                "digest_live": r.digest_live,
                "digest_replay": r.digest_replay,
                "peak_rss_kib": r.peak_rss_kib,
            }
            for r in results
        },
        "environment": env,
    }


def table(results: list[CycleResult], body_bytes: int, window: int, env: dict[str, Any]) -> str:
    first = results[0]
    warmup = env["warmup_commands"]
    lines = [
        f"keyload bench.cycle: {first.messages} messages per cycle, body {body_bytes} B, rounds of {window} messages, "
        f"1 domain (1 of {first.partitions} partitions)",
        f"python {env['python']}, fastavro {env['fastavro']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus, "
        f"load {env['load_average_1m']:.2f}; "
        + (f"warm-up of {warmup} messages per cycle excluded" if warmup else "COLD START (no warm-up)"),
        "(a) = PartitionProcessor.step() loops only; rates are messages/s; µs = thread CPU per message",
        "",
        f"{'(a) cycle':<24} {'records':>7} {'groups':>6} {'wall s':>7} {'msg/s':>7} {'cpu s':>7} {'msg/cpu-s':>9}"
        f" {'enq µs':>7} {'recv µs':>7} {'ack µs':>7} {'µs first→last 10%':>18}",
    ]
    for r in results:
        per = {kind: 1e6 * t.cpu_seconds / r.messages for kind, t in r.kinds.items()}
        lines.append(
            f"{r.cycle.label:<24} {r.records:>7} {r.groups:>6} {r.apply.seconds:>7.2f}"
            f" {r.apply.rate(r.messages):>7,.0f} {r.apply.cpu_seconds:>7.2f} {r.apply.cpu_rate(r.messages):>9,.0f}"
            f" {per['enqueue']:>7.0f} {per['receive']:>7.0f} {per['ack']:>7.0f}"
            f" {f'{r.trend[0]:,.0f} → {r.trend[1]:,.0f}':>18}"
        )
    lines += [
        "",
        f"{'msg/cpu-s of':<24} {'(b) replay':>10} {'(c) raw wr':>10} {'(d) rd+dec':>10}"
        f"   {'cpu a/c':>7} {'a/d':>6} {'b/c':>6}   {'wall a/c':>8} {'a/d':>6}   digest a==b",
    ]
    for r in results:
        cpu, wall = r.cpu_ratios(), r.ratios()
        lines.append(
            f"{r.cycle.label:<24} {r.replay.cpu_rate(r.messages):>10,.0f} {r.writes.cpu_rate(r.messages):>10,.0f}"
            f" {r.reads.cpu_rate(r.messages):>10,.0f}   {cpu['a/c']:>7.3f} {cpu['a/d']:>6.3f} {cpu['b/c']:>6.3f}"
            f"   {wall['a/c']:>8.3f} {wall['a/d']:>6.3f}   {'yes' if r.digests_equal else 'NO'}"
            f" ({r.digest_live[:12]}…)"
        )
    lines.append(
        f"peak RSS of the process: {max(r.peak_rss_kib for r in results) / 1024:.0f} MiB; (c) wrote "
        + ", ".join(f"{r.write_bytes / 2**20:.0f}" for r in results)
        + " MiB of keys+values"
    )
    return "\n".join(lines)


def _check_sizes(messages: int, body_bytes: int, window: int) -> None:
    if messages < 1:
        raise BenchError("--messages must be >= 1")
    if not 0 <= body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        raise BenchError(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    if messages > INTEGER_FIELDS["max_stored_messages"].maximum:
        raise BenchError("--messages exceeds the largest max_stored_messages a queue may have")
    if messages * body_bytes > INTEGER_FIELDS["max_stored_bytes"].maximum:
        raise BenchError("--messages x --body-bytes exceeds the largest max_stored_bytes a queue may have")
    if not 1 <= window <= INTEGER_FIELDS["max_in_flight"].maximum:
        raise BenchError(f"--window must be 1..{INTEGER_FIELDS['max_in_flight'].maximum} (the largest max_in_flight)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cycle", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=DEFAULT_MESSAGES, help="messages per cycle (default %(default)s)"
    )
    parser.add_argument(
        "--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="message body size (default %(default)s)"
    )
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="messages per round (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help="messages per cycle of an untimed warm-up run first; 0: cold start (default %(default)s)",
    )
    parser.add_argument(
        "--cycles", default=",".join(BY_KEY), help="which cycles, comma-separated (default %(default)s)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--profile",
        nargs="?",
        const="1",
        choices=list(BY_KEY),
        default=None,
        help="then run (a) of one cycle (default 1) once more under cProfile (to stderr)",
    )
    parser.add_argument("--profile-lines", type=int, default=PROFILE_LINES, help="rows per profile listing")
    parser.add_argument("--profile-out", type=Path, default=None, help="also dump that profile (pstats) here")
    args = parser.parse_args(argv)
    try:
        _check_sizes(args.messages, args.body_bytes, args.window)
        if args.warmup < 0:
            raise BenchError("--warmup must be >= 0")
        unknown = [key for key in args.cycles.split(",") if key not in BY_KEY]
        if unknown or not args.cycles:
            raise BenchError(f"--cycles takes some of {', '.join(BY_KEY)}")
    except BenchError as exc:
        parser.error(str(exc))
    cycles = [BY_KEY[key] for key in args.cycles.split(",")]

    root = Path(tempfile.mkdtemp(prefix="keyload-bench-cycle-", dir=args.dir))
    ok = False
    try:
        if args.warmup:
            for cycle in cycles:
                measure(
                    root / f"warmup-{cycle.key}", cycle, args.warmup, args.body_bytes, min(args.window, args.warmup)
                )
        results = []
        for cycle in cycles:
            results.append(measure(root / f"run-{cycle.key}", cycle, args.messages, args.body_bytes, args.window))
            if not args.keep:
                shutil.rmtree(root / f"run-{cycle.key}")
        env = environment(args.warmup, root)
        print(
            json.dumps(to_json(results, args.body_bytes, args.window, env), indent=2)
            if args.json
            else table(results, args.body_bytes, args.window, env),
            flush=True,
        )
        ok = all(result.digests_equal for result in results)
        if args.profile is not None or args.profile_out is not None:
            cycle = BY_KEY[args.profile or "1"]
            profile_cycle(
                root / "profile",
                cycle,
                args.messages,
                args.body_bytes,
                args.window,
                args.profile_lines,
                args.profile_out,
            )
    except BenchError as exc:
        print(f"bench.cycle: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
