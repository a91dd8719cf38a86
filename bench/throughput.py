"""Processor throughput against raw references, measured in one run on one machine.

    python -m bench.throughput [--commands N] [--body-bytes B] [--json]

A fresh temporary data directory gets one CreateQueue and N Enqueue commands (one
domain, reply_to set as clients do) appended to its command log. Then, timing only
the loop named in each line:

(a) apply:  PartitionProcessor.step() until caught up, publishing outcomes.
(b) replay: recovery.replay() of the same log into an empty directory (no outcomes;
            includes the digest pass replay() ends with).
(c) raw writes: the exact key/value pairs of (a)'s projection, written with rocksdict
            WriteBatches of 512 commands' worth into a fresh Rdict with the Store's options.
(d) raw read + decode: FileLog.read() of the same records, REGISTRY.decode of each value.
(e) apply, access control on: (a) over a second directory whose log first turns access control
            on and makes the bench principal (granted resource_manage and enqueue on the queue),
            then holds the same commands, each signed with that principal's credential: every
            record is verified (HMAC-SHA256), authorized and its outcome sealed. The line after
            the ratios is the cost, CPU per record of (e) over (a). The two processors are stepped in
            turns (one group each), before (b)-(d) grow the heap, so both apply in the same conditions.

bench/README.md explains how to read the ratios a/c, a/d and b/c.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyload import limits
from keyload.credentials import ADMIN_PRINCIPAL, contents
from keyload.log.base import CommandLog, partition_for
from keyload.log.codec import REGISTRY
from keyload.operations.recovery import replay
from keyload.processors.policy import INTEGER_FIELDS, default_spec
from keyload.projections.store import Store
from keyload.service.access_control import enable_command
from keyload.service.runtime import MAX_GROUP_RECORDS, PartitionProcessor
from keyload.storage.datadir import DataDir
from keyload.storage.principals import new_credential, system_credential

from .common import (
    DOMAIN,
    OUTCOME,
    PRINCIPAL,
    QUEUE,
    REPLY_TO,
    SEED,
    BenchError,
    Stopwatch,
    encode_command,
    environment,
    peak_rss_kib,
    raw_writes,
    read_and_decode,
)

CREATE_QUEUE = "keyload.command.CreateQueue"
ENQUEUE = "keyload.command.Enqueue"
PUT_PRINCIPAL = "keyload.command.PutPrincipal"

ID_CHARS = 36  # len(str(uuid4())): command ids and message ids, as the SDK makes them

DEFAULT_COMMANDS = 50_000
DEFAULT_BODY_BYTES = 1024
DEFAULT_WARMUP = 2_000
PROFILE_LINES = 30
MAX_SHARED_PAIRS = 16  # per-group pairs (queue record, offsets, allocators) that no command id names


# -- workload --------------------------------------------------------------------------


def _check_sizes(commands: int, body_bytes: int) -> None:
    if commands < 1:
        raise BenchError("--commands must be >= 1")
    if not 0 <= body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        raise BenchError(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    if commands > INTEGER_FIELDS["max_stored_messages"].maximum:
        raise BenchError("--commands exceeds the largest max_stored_messages a queue may have")
    if commands * body_bytes > INTEGER_FIELDS["max_stored_bytes"].maximum:
        raise BenchError("--commands x --body-bytes exceeds the largest max_stored_bytes a queue may have")


def generate(commands: int, body_bytes: int, ids: list[str]) -> Iterator[bytes]:
    """CreateQueue (quotas large enough for everything), then `commands` Enqueues.

    Ids are UUID4 strings from a seeded generator (the SDK uses uuid4, and
    message_id = command_id); bodies are seeded random bytes, so RocksDB cannot
    compress them away. Each command's id is appended to `ids` (index = offset).
    """
    rng = random.Random(SEED)

    def new_id() -> str:
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        ids.append(value)
        return value

    policy = {
        **default_spec(),
        "max_stored_messages": commands,
        "max_stored_bytes": max(commands * body_bytes, 1),
    }
    yield encode_command(new_id(), CREATE_QUEUE, {"queue": QUEUE, "policy": policy})
    for _ in range(commands):
        command_id = new_id()
        body: dict[str, Any] = {
            "queue": QUEUE,
            "message_id": command_id,
            "body": rng.randbytes(body_bytes),
            "headers": {},
            "ordering_key": None,
            "not_before_ms": None,
            "expires_at_ms": None,
        }
        yield encode_command(command_id, ENQUEUE, body)


def signed(data: DataDir, partition: int, values: Iterator[bytes], ids: list[str]) -> Iterator[bytes]:
    """(e)'s log: access control turned on, the bench principal made, then `values` signed by it."""
    ids.append("enable-access-control")
    yield enable_command(data.root, partition, data.partitions)
    credential = new_credential(data.root, PRINCIPAL)
    grants = [
        {"capability": capability, "domain": DOMAIN, "resource": QUEUE} for capability in ("resource_manage", "enqueue")
    ]
    body: dict[str, Any] = {"principal": PRINCIPAL, "key_id": credential.key_id, "grants": grants}
    body |= {"enabled": None, "expected_revision": None}
    ids.append("bench-principal")
    yield system_credential(data.root, ADMIN_PRINCIPAL).sign(
        encode_command(ids[-1], PUT_PRINCIPAL, body, principal=ADMIN_PRINCIPAL)
    )
    for value in values:
        yield credential.sign(value)


@dataclass(frozen=True)
class Workload:
    root: Path
    data: DataDir
    partition: int
    records: int  # CreateQueue + the Enqueues (and, with access control, the two commands turning it on)
    ids: list[str]  # command id of each offset
    unanswered: int = 0  # records whose outcome is not published (EnableAccessControl has no reply partition)


def prepare(root: Path, commands: int, body_bytes: int, access_control: bool = False) -> Workload:
    """Append the workload to a fresh data directory, one group's worth per append()."""
    data = DataDir.create(root / ("data-signed" if access_control else "data"))
    partition = partition_for(DOMAIN, data.partitions)
    ids: list[str] = []
    # The default fsync policy, as producers append: one fsync per append call. The
    # records are durable before (a) starts, so the processor's sync_through before
    # each commit finds nothing left to flush, as in a live deployment.
    log = data.command_log()
    try:
        chunk: list[bytes] = []
        values = generate(commands, body_bytes, ids)
        for value in signed(data, partition, values, ids) if access_control else values:
            chunk.append(value)
            if len(chunk) == MAX_GROUP_RECORDS:
                log.append(partition, chunk)
                chunk = []
        if chunk:
            log.append(partition, chunk)
        if log.end_offset(partition) != len(ids):
            raise BenchError("the command log does not hold the workload")
    finally:
        log.close()
    return Workload(root, data, partition, len(ids), ids, 1 if access_control else 0)


# -- measurements ----------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    records: int
    seconds: float  # wall clock
    cpu_seconds: float  # CPU time of the measuring thread (RocksDB's background threads excluded)
    peak_rss_kib: int  # process peak so far, read right after the phase

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_rate(self) -> float:
        return self.records / self.cpu_seconds if self.cpu_seconds > 0 else math.inf


def apply_logs(
    works: Sequence[Workload], outcomes: Sequence[CommandLog], profiler: cProfile.Profile | None = None
) -> list[tuple[Stopwatch, Store]]:
    """(a), and (e) beside it: a processor per workload, stepped in turn (one group of records each)
    until every one has caught up, each step timed on its own workload's Stopwatch. In turns, the
    machine's drift (this one's speed varies by tens of percent from one run to the next) falls on
    every workload alike. Returns each one's apply time and open store."""
    logs = [work.data.command_log() for work in works]
    stores: list[Store] = []
    try:
        for work in works:
            stores.append(Store(work.data.projection(work.partition)))
        processors = [
            PartitionProcessor(work.partition, work.data.partitions, log, store, out, keyring=work.data.keyring())
            for work, log, store, out in zip(works, logs, stores, outcomes, strict=True)
        ]
        watches = [Stopwatch() for _ in works]
        pending = list(range(len(works)))
        if profiler is not None:
            profiler.enable()
        while pending:
            for index in list(pending):
                processor, watch = processors[index], watches[index]
                watch.start()
                stepped = processor.step()
                watch.stop()
                if processor.applied_offset >= works[index].records - 1 or stepped == 0:
                    pending.remove(index)
        if profiler is not None:
            profiler.disable()
        for work, processor in zip(works, processors, strict=True):
            target = work.records - 1
            if processor.halt is not None or processor.applied_offset != target:
                raise BenchError(f"apply stopped at offset {processor.applied_offset} of {target}: {processor.halt}")
    except BaseException:
        for store in stores:
            store.close()
        raise
    finally:
        for log in logs:
            log.close()
    return list(zip(watches, stores, strict=True))


def check_outcomes(outcomes: CommandLog, work: Workload) -> None:
    """Every command's outcome was published and says committed (not timed)."""
    seen, offset = 0, 0
    while records := outcomes.read(REPLY_TO, offset, 4096):
        for record in records:
            outcome = REGISTRY.decode(OUTCOME, contents(record.value))
            if outcome["status"] != "committed":
                raise BenchError(f"command at offset {outcome['offset']} was {outcome['status']}: {outcome['detail']}")
        seen += len(records)
        offset = records[-1].offset + 1
    if seen != work.records - work.unanswered:
        raise BenchError(f"{seen} outcomes published for {work.records - work.unanswered} commands")


def replay_log(work: Workload) -> tuple[Stopwatch, str]:
    """(b): recovery.replay from offset 0 into an empty directory."""
    watch = Stopwatch()
    watch.start()
    replayed = replay(work.data, work.partition, work.root / "replay", progress=False)
    watch.stop()
    if replayed.applied_offset != work.records - 1:
        raise BenchError(f"replay reached offset {replayed.applied_offset} of {work.records - 1}")
    return watch, replayed.digest


Pair = tuple[bytes, bytes]


def group_sizes(records: int) -> list[int]:
    """Record counts of the processor's groups over `records` records: 512 each, then the rest."""
    return [min(MAX_GROUP_RECORDS, records - first) for first in range(0, records, MAX_GROUP_RECORDS)]


def group_pairs(store: Store, work: Workload) -> tuple[list[list[Pair]], int, int]:
    """(a)'s projection cut into one batch per apply group, in command order.

    A pair belongs to the command whose id ends its key (message, body, outcome)
    or is its value (ready index); the rest (queue record, allocators, applied
    offset, last time) the processor rewrites with every group, so every batch
    gets them. Returns (batches, distinct pairs, their key+value bytes).
    """
    owner = {command_id.encode("utf-8"): offset for offset, command_id in enumerate(work.ids)}
    per_command: list[list[Pair]] = [[] for _ in range(work.records)]
    shared: list[Pair] = []
    pairs = size = 0
    for key, value in store.scan(b"", b"\xff"):
        pairs += 1
        size += len(key) + len(value)
        offset = owner.get(key[-ID_CHARS:])
        if offset is None:
            offset = owner.get(value)
        (shared if offset is None else per_command[offset]).append((key, value))
    if len(shared) > MAX_SHARED_PAIRS:
        raise BenchError(
            f"{len(shared)} projection pairs name no command id: the key layout changed, fix group_pairs() "
            "(they would be rewritten in every batch and inflate (c))"
        )
    batches = []
    for first in range(0, work.records, MAX_GROUP_RECORDS):
        batch = [pair for command in per_command[first : first + MAX_GROUP_RECORDS] for pair in command]
        batches.append(batch + shared)
    return batches, pairs, size


LABELS = {
    "a": "processor apply (outcomes on)",
    "b": "replay into empty projection",
    "c": "raw rocksdict WriteBatch puts",
    "d": "raw file-log read + Avro decode",
    "e": "processor apply, access control on",
}
RATIOS = (("a", "c"), ("a", "d"), ("b", "c"))


@dataclass(frozen=True)
class Result:
    commands: int
    records: int
    body_bytes: int
    partitions: int
    repeats: int
    phases: dict[str, Phase]
    digest_a: str
    digest_b: str
    digest_seconds: float  # one Store.digest() pass over (a)'s projection; (b) includes one
    raw_pairs: int
    raw_bytes: int
    # Per repetition, CPU per record of its (e) over its own (a), less one: paired runs side by side,
    # so that a machine whose speed drifts between repetitions still compares like with like.
    access_control_costs: tuple[float, ...]

    @property
    def digests_equal(self) -> bool:
        return self.digest_a == self.digest_b

    @property
    def ratios(self) -> dict[str, float]:
        return {f"{top}/{bottom}": self.phases[top].rate / self.phases[bottom].rate for top, bottom in RATIOS}

    @property
    def cpu_ratios(self) -> dict[str, float]:
        return {f"{top}/{bottom}": self.phases[top].cpu_rate / self.phases[bottom].cpu_rate for top, bottom in RATIOS}

    @property
    def peak_rss_kib(self) -> int:
        return max(phase.peak_rss_kib for phase in self.phases.values())

    @property
    def access_control_cost(self) -> float:
        """What verifying, authorizing and sealing add: the median over repetitions of (e)'s CPU per
        record over (a)'s in the same repetition, less one."""
        return statistics.median(self.access_control_costs)


def measure(root: Path, commands: int, body_bytes: int) -> Result:
    """One repetition of (a) to (d) on a fresh workload under `root`."""
    work = prepare(root, commands, body_bytes)
    phases: dict[str, Phase] = {}

    def record(key: str, watch: Stopwatch) -> None:
        phases[key] = Phase(key, LABELS[key], work.records, watch.seconds, watch.cpu_seconds, peak_rss_kib())

    guarded = prepare(root, commands, body_bytes, access_control=True)
    # (e) beside (a), in turns, before (b)-(d) grow the heap: their ratio is the cost of access control.
    outcomes = [work.data.outcome_log(), guarded.data.outcome_log()]
    try:
        applied = apply_logs([work, guarded], outcomes)
        for (watch, store), key, workload in zip(applied, "ae", (work, guarded), strict=True):
            store.close()
            phases[key] = Phase(key, LABELS[key], workload.records, watch.seconds, watch.cpu_seconds, peak_rss_kib())
        check_outcomes(outcomes[0], work)
        check_outcomes(outcomes[1], guarded)
    finally:
        for out in outcomes:
            out.close()
    store = Store(work.data.projection(work.partition))  # (a)'s projection again
    try:
        digest_watch = Stopwatch()
        digest_watch.start()
        digest_a = store.digest()
        digest_watch.stop()
        watch, digest_b = replay_log(work)
        record("b", watch)
        batches, pairs, size = group_pairs(store, work)
    finally:
        store.close()
    record("c", raw_writes(root / "raw", batches))
    del batches
    record("d", read_and_decode(work.data, work.partition, 0, group_sizes(work.records)))
    return Result(
        commands,
        work.records,
        body_bytes,
        work.data.partitions,
        1,
        phases,
        digest_a,
        digest_b,
        digest_watch.seconds,
        pairs,
        size,
        (phases["a"].cpu_rate / phases["e"].cpu_rate - 1,),
    )


def best_of(results: list[Result]) -> Result:
    """Per phase the fastest wall time and the smallest CPU time over the repetitions."""
    first = results[0]
    phases = {}
    for key, phase in first.phases.items():
        runs = [result.phases[key] for result in results]
        phases[key] = Phase(
            key,
            phase.label,
            phase.records,
            min(run.seconds for run in runs),
            min(run.cpu_seconds for run in runs),
            max(run.peak_rss_kib for run in runs),
        )
    unequal = [result for result in results if not result.digests_equal]
    worst = unequal[0] if unequal else first
    return Result(
        first.commands,
        first.records,
        first.body_bytes,
        first.partitions,
        len(results),
        phases,
        worst.digest_a,
        worst.digest_b,
        min(result.digest_seconds for result in results),
        first.raw_pairs,
        first.raw_bytes,
        tuple(cost for result in results for cost in result.access_control_costs),
    )


def profile_apply(root: Path, commands: int, body_bytes: int, lines: int, out: Path | None) -> None:
    """(a) again on a fresh workload under cProfile; the top functions go to stderr."""
    work = prepare(root, commands, body_bytes)
    outcomes = work.data.outcome_log()
    profiler = cProfile.Profile()
    try:
        [(watch, store)] = apply_logs([work], [outcomes], profiler)
        store.close()
    finally:
        outcomes.close()
    print(f"\ncProfile of (a): {work.records} records in {watch.seconds:.3f} s under the profiler", file=sys.stderr)
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.strip_dirs().sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    if out is not None:
        profiler.dump_stats(out)
        print(f"profile written to {out} (pstats format)", file=sys.stderr)


# -- reporting -------------------------------------------------------------------------


def to_json(result: Result, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "bench.throughput",
        "commands": result.commands,
        "records": result.records,
        "body_bytes": result.body_bytes,
        "group_records": MAX_GROUP_RECORDS,
        "partitions": result.partitions,
        "repeats": result.repeats,
        "phases": {
            key: {
                "label": phase.label,
                "records": phase.records,
                "seconds": phase.seconds,
                "cpu_seconds": phase.cpu_seconds,
                "commands_per_s": phase.rate,
                "commands_per_cpu_s": phase.cpu_rate,
                "peak_rss_kib": phase.peak_rss_kib,
            }
            for key, phase in result.phases.items()
        },
        "ratios": result.ratios,
        "cpu_ratios": result.cpu_ratios,
        "access_control_cpu_cost": result.access_control_cost,
        "access_control_cpu_costs": list(result.access_control_costs),
        "digest_equal": result.digests_equal,
        "digest_a": result.digest_a,
        "digest_b": result.digest_b,
        "digest_seconds": result.digest_seconds,
        "raw_pairs": result.raw_pairs,
        "raw_bytes": result.raw_bytes,
        "peak_rss_kib": result.peak_rss_kib,
        "environment": env,
    }


def table(result: Result, env: dict[str, Any]) -> str:
    warmup = env["warmup_commands"]
    repeats = f"best of {result.repeats}" if result.repeats > 1 else "1 run"
    runs = ", ".join(f"{cost:+.1%}" for cost in result.access_control_costs)
    lines = [
        f"keyload bench.throughput: {result.commands} Enqueue + 1 CreateQueue = {result.records} records, "
        f"body {result.body_bytes} B, group {MAX_GROUP_RECORDS}, 1 domain (1 of {result.partitions} partitions)",
        f"python {env['python']}, fastavro {env['fastavro']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus, "
        f"load {env['load_average_1m']:.2f}; {repeats}; "
        + (f"warm-up of {warmup} commands excluded" if warmup else "COLD START (no warm-up)"),
        "",
        f"{'phase':<38} {'wall s':>8} {'cmd/s':>9} {'cpu s':>8} {'cmd/cpu-s':>10} {'peak RSS':>9}",
    ]
    for phase in result.phases.values():
        lines.append(
            f"({phase.key}) {phase.label:<34} {phase.seconds:>8.3f} {phase.rate:>9,.0f} "
            f"{phase.cpu_seconds:>8.3f} {phase.cpu_rate:>10,.0f} {phase.peak_rss_kib / 1024:>5.0f} MiB"
        )
    lines += [
        "",
        "ratios, wall:  " + "   ".join(f"{name} = {value:.3f}" for name, value in result.ratios.items()),
        "ratios, cpu:   " + "   ".join(f"{name} = {value:.3f}" for name, value in result.cpu_ratios.items()),
        f"access control (e over a, CPU per record, median of {len(result.access_control_costs)} paired runs): "
        f"{result.access_control_cost:+.1%}  (runs: {runs})",
        f"digest (a) == (b): {'yes' if result.digests_equal else 'NO'}  ({result.digest_a[:16]}…; "
        f"one digest pass = {result.digest_seconds:.3f} s, included in (b))",
        f"(c) wrote {result.raw_pairs} distinct pairs, {result.raw_bytes / 2**20:.1f} MiB of keys+values",
        f"peak RSS of the process: {result.peak_rss_kib / 1024:.0f} MiB",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=DEFAULT_COMMANDS, help="Enqueue commands (default %(default)s)")
    parser.add_argument(
        "--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="message body size (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help="commands of an untimed warm-up repetition first; 0: cold start (default %(default)s)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions; per phase the best is reported")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--profile", action="store_true", help="then run (a) once more under cProfile (to stderr)")
    parser.add_argument("--profile-lines", type=int, default=PROFILE_LINES, help="rows per profile listing")
    parser.add_argument("--profile-out", type=Path, default=None, help="also dump that profile (pstats) here")
    args = parser.parse_args(argv)
    try:
        _check_sizes(args.commands, args.body_bytes)
        if args.warmup < 0 or args.repeat < 1:
            raise BenchError("--warmup must be >= 0 and --repeat >= 1")
    except BenchError as exc:
        parser.error(str(exc))

    root = Path(tempfile.mkdtemp(prefix="keyload-bench-", dir=args.dir))
    try:
        if args.warmup:
            measure(root / "warmup", args.warmup, args.body_bytes)
        results = []
        for repetition in range(args.repeat):
            results.append(measure(root / f"run-{repetition}", args.commands, args.body_bytes))
            if not args.keep:
                shutil.rmtree(root / f"run-{repetition}")
        result = best_of(results)
        env = environment(args.warmup, root)
        print(json.dumps(to_json(result, env), indent=2) if args.json else table(result, env), flush=True)
        if args.profile or args.profile_out is not None:
            profile_apply(root / "profile", args.commands, args.body_bytes, args.profile_lines, args.profile_out)
    except BenchError as exc:
        print(f"bench.throughput: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if result.digests_equal else 1


if __name__ == "__main__":
    sys.exit(main())
