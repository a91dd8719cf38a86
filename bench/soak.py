"""A soak that shows the projection bounded: finished work leaves nothing behind past the horizons.

    python -m bench.soak [--cycles N] [--workload queue|topic] [--json]

One data directory, one domain, the embedded file log and a PartitionProcessor with the outcome
stream on (bench/reclamation.py's Deployment), in real time, at the processor's feature level
(limits.FEATURE_LEVEL); the domain's horizons are 1 s for outcomes and 2 s for receipts. The
reference is the empty resource: the projection just after CreateQueue (or CreateTopic), once the
horizons have passed. Then N cycles: of the queue workload Enqueue (1 KiB), Receive(1) and Ack; of
the topic workload one Publish of one event (1 KiB, a new event id each) to a topic that keeps events
for 1 s. At N/10, N/2 and N: a wait past both horizons
and Ticks until the sweep has caught up, then the projection's live rows and bytes (keyload census),
the bytes of its SST files after a manual compaction of a RocksDB checkpoint of it, and whether a
replay of the log from offset 0 reaches the live projection's offset and digest. Also thread-CPU µs
per cycle of each stretch (step() only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from keyload import limits
from keyload.operations.census import census
from keyload.operations.recovery import replay
from keyload.processors.policy import default_spec, default_topic_spec

from .common import BenchError, Stopwatch, environment
from .reclamation import Deployment, enqueue

DEFAULT_CYCLES = 500_000
OUTCOME_HORIZON_MS, RECEIPT_HORIZON_MS = 1_000, 2_000
CHECKPOINTS = (10, 2, 1)  # at N / 10, N / 2 and N cycles


def _settled(run: Deployment) -> None:
    """Wait past both horizons of everything applied so far, then Tick until the sweep is done."""
    time.sleep(RECEIPT_HORIZON_MS / 1000 + 0.2)
    while run.apply("Tick", {})["budget_exhausted"]:
        pass


def _sst_bytes(run: Deployment, scratch: Path) -> int:
    """The SST bytes of a checkpoint of the projection after a manual compaction of all of it."""
    run.store.snapshot(scratch)
    db = Rdict(str(scratch / "db"), Options(raw_mode=True))
    try:
        db.compact_range(None, None)
    finally:
        db.close()
    size = sum(path.stat().st_size for path in (scratch / "db").glob("*.sst"))
    shutil.rmtree(scratch)
    return size


def _measure(run: Deployment, root: Path, name: str, cycles: int, watch: Stopwatch | None) -> dict[str, Any]:
    _settled(run)
    counted = census(run.data, run.partition)
    replayed = replay(run.data, run.partition, root / f"replay-{name}", progress=False)
    shutil.rmtree(root / f"replay-{name}")
    return {
        "cycles": cycles,
        "rows": counted.rows,
        "bytes": counted.bytes,
        "sst_bytes": _sst_bytes(run, root / f"checkpoint-{name}"),
        "replay_equals_live": (replayed.applied_offset, replayed.digest)
        == (run.store.applied_offset, run.store.digest()),
        "cpu_us_per_cycle": None if watch is None else watch.cpu_seconds / max(cycles, 1) * 1e6,
    }


RECEIVE = {"queue": "jobs", "max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": None}


def _queue_cycle(run: Deployment, n: int, watch: Stopwatch) -> None:
    run.apply("Enqueue", enqueue("jobs", f"m{n}"), watch)
    [delivery] = run.apply("Receive", RECEIVE, watch)["deliveries"]
    run.apply("Ack", {"token": delivery["token"]}, watch)


def _topic_cycle(run: Deployment, n: int, watch: Stopwatch) -> None:
    event = {"event_id": f"e{n}", "type": "t", "headers": {}, "body": b"x" * 1024}
    run.apply("Publish", {"topic": "news", "events": [event]}, watch)


# Each workload: the command creating its resource, that command's body, and one cycle.
WORKLOADS = {
    "queue": ("CreateQueue", {"queue": "jobs", "policy": default_spec()}, _queue_cycle),
    "topic": (
        "CreateTopic",
        {"topic": "news", "policy": dict(default_topic_spec(), max_age_ms=OUTCOME_HORIZON_MS)},
        _topic_cycle,
    ),
}


def soak(root: Path, cycles: int, workload: str = "queue") -> dict[str, Any]:
    create, resource, cycle = WORKLOADS[workload]
    run = Deployment(root / "data")
    try:
        run.apply("RaiseFeatureLevel", {"level": limits.FEATURE_LEVEL})
        horizons = {"outcome_horizon_ms": OUTCOME_HORIZON_MS, "receipt_horizon_ms": RECEIPT_HORIZON_MS}
        run.apply("ConfigureDomain", dict(horizons, expected_policy_version=None))
        run.apply(create, resource)
        empty = _measure(run, root, "empty", 0, None)
        marks = sorted({cycles // share for share in CHECKPOINTS if cycles // share})
        points, done = [], 0
        for mark in marks:
            watch = Stopwatch()
            for n in range(done, mark):
                cycle(run, n, watch)
            point = _measure(run, root, str(mark), mark - done, watch)
            points.append(dict(point, cycles=mark))
            done = mark
    finally:
        run.close()
    return {"feature_level": limits.FEATURE_LEVEL, "workload": workload, "empty": empty, "checkpoints": points}


CYCLES = {"queue": "enqueue (1 KiB) / receive / ack", "topic": "publish (1 KiB, events kept 1 s)"}


def table(result: dict[str, Any], env: dict[str, Any]) -> str:
    empty = result["empty"]
    lines = [
        f"bench.soak: {CYCLES[result['workload']]} at feature level {result['feature_level']}, horizons "
        f"{OUTCOME_HORIZON_MS} / {RECEIPT_HORIZON_MS} ms; {env['cpus']} CPUs, load {env['load_average_1m']:.2f}",
        "",
        "| after cycles | live rows | live bytes | SST bytes (compacted) | replay = live | CPU µs / cycle |",
        "|---:|---:|---:|---:|---|---:|",
    ]
    for point in [empty, *result["checkpoints"]]:
        cpu = "" if point["cpu_us_per_cycle"] is None else f"{point['cpu_us_per_cycle']:,.0f}"
        lines.append(
            f"| {point['cycles']:,} | {point['rows']:,} | {point['bytes']:,} | {point['sst_bytes']:,} "
            f"| {'yes' if point['replay_equals_live'] else 'NO'} | {cpu} |"
        )
    last = result["checkpoints"][-1]
    lines += [
        "",
        f"past the empty {result['workload']} after {last['cycles']:,} cycles: {last['rows'] - empty['rows']:+,} rows, "
        f"{last['bytes'] - empty['bytes']:+,} bytes, {last['sst_bytes'] - empty['sst_bytes']:+,} SST bytes",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=DEFAULT_CYCLES, help="cycles in all (default %(default)s)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="queue", help="(default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="keyload-soak-", dir=args.dir))
    try:
        result = soak(root, args.cycles, args.workload)
        env = environment(0, root)
    except BenchError as exc:
        print(f"bench.soak: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps({"benchmark": "bench.soak", **result, "environment": env}, indent=2)
        if args.json
        else table(result, env)
    )
    if not all(point["replay_equals_live"] for point in [result["empty"], *result["checkpoints"]]):
        print("bench.soak: a replay did not reach the live projection's digest", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
