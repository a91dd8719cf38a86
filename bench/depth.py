"""Per-command cost as one queue grows: Enqueue, Receive(1) and Ack at depths up to a million messages.

    python -m bench.depth [--depths 10000,100000,1000000] [--probe P] [--body-bytes B] [--group-records G] [--json]

A fresh data directory, one domain and one queue, the embedded file log and a PartitionProcessor
with the outcome stream on (bench.cycle's driver), at the feature level `keyload run` serves
(limits.FEATURE_LEVEL). The queue is filled with Enqueues of B-byte bodies (appends of 500, applied
in groups) until it holds the first depth; there a probe, then it is filled on to the next depth,
and so on. A probe plays P of each, appended together and applied in groups (one fsync per append,
untimed):

    enqueue  P Enqueues: the queue now holds depth + P
    receive  P Receives of one message each: the P oldest are leased
    ack      P Acks of those deliveries: the queue holds depth again

With --group-records G the probes are applied G records per group (the fill stays at 512): G = 1 is
a sparse service's shape, every command a group of its own, with its own read, fsync and commit.

Only PartitionProcessor.step() loops are timed (thread CPU). Reported per depth: µs of processor CPU
per command of each kind, µs per Enqueue of the fill that led there, the process's peak RSS so far and
the projection's size on disk (its SST and log files); then each kind's µs at the deepest depth over
the first. Issue 17's target: per-command cost flat (1.0) from 10k to 1M messages, RSS bounded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from keyload import limits
from keyload.log.codec import REGISTRY, Record
from keyload.processors.policy import INTEGER_FIELDS, default_spec
from keyload.projections import keys
from keyload.service.runtime import MAX_GROUP_RECORDS

from .common import DOMAIN, QUEUE, BenchError, Cycle, Driver, Settle, environment, peak_rss_kib
from .cycle import ACK, CREATE_QUEUE, ENQUEUE, LEASE_MS, QUEUE_RECORD, RECEIVE, enqueue_body

DEFAULT_DEPTHS = (10_000, 100_000, 1_000_000)
DEFAULT_PROBE = 2_000
DEFAULT_BODY_BYTES = 256
FILL_APPEND = 500  # Enqueues per append while filling
KINDS = ("fill", "enqueue", "receive", "ack")
PROBE_KINDS = KINDS[1:]


class DepthDriver(Driver):
    """One queue that only grows, probed at each depth."""

    kinds = KINDS

    def setup(self, count: int, window: int) -> None:
        policy = {
            **default_spec(),
            "max_stored_messages": count,
            "max_stored_bytes": max(count * self.body_bytes, 1),
            "max_in_flight": window,
            "lease_ms": LEASE_MS,
        }
        self.submit(None, [(CREATE_QUEUE, {"queue": QUEUE, "policy": policy})])
        self.held = 0  # messages the queue holds

    def fill(self, depth: int) -> None:
        while self.held < depth:
            count = min(FILL_APPEND, depth - self.held)
            self.submit("fill", [self._enqueue() for _ in range(count)])
            self.held += count

    def _enqueue(self) -> tuple[str, Record]:
        return ENQUEUE, enqueue_body(self.new_id(), self.rng.randbytes(self.body_bytes))

    def _round(self, count: int) -> None:
        """A probe: `count` Enqueues, Receives of one and Acks, the queue as deep afterwards."""
        self.submit("enqueue", [self._enqueue() for _ in range(count)])
        receive = {"queue": QUEUE, "max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": None}
        tokens = []
        for outcome in self.submit("receive", [(RECEIVE, receive)] * count):
            deliveries = outcome["result"][1]["deliveries"]
            if len(deliveries) != 1:
                raise BenchError(f"a Receive of one at depth {self.held + count} delivered {len(deliveries)}")
            tokens.append(deliveries[0]["token"])
        for outcome in self.submit("ack", [(ACK, {"token": token}) for token in tokens]):
            if outcome["result"][1]["state"] != "acked":
                raise BenchError(f"an Ack left its message {outcome['result'][1]['state']}")

    def check_drained(self, count: int) -> None:
        """The queue holds what was filled, nothing leased; every probe's messages acked."""
        raw = self.store.get(keys.queue(DOMAIN, QUEUE))
        if raw is None:
            raise BenchError("the queue record is missing")
        counters = REGISTRY.decode(QUEUE_RECORD, raw)["view"]["counters"]
        expected = {"stored_messages": self.held, "leased": 0, "ready": self.held, "acked_total": count}
        wrong = {name: counters[name] for name, value in expected.items() if counters[name] != value}
        if wrong:
            raise BenchError(f"queue counters after the run: {wrong}, expected {expected}")

    def cpu(self) -> dict[str, float]:
        return {kind: watch.cpu_seconds for kind, watch in self.watches.items()}


def projection_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.iterdir() if entry.is_file())


def run(root: Path, depths: list[int], probe: int, body_bytes: int, group_records: int) -> dict[str, Any]:
    deepest = depths[-1]
    driver = DepthDriver(root, Cycle("depth", "depth", 1, Settle.ACK), body_bytes, feature_level=limits.FEATURE_LEVEL)
    fill_group = driver.processor.group_records
    try:
        driver.setup(deepest + probe, probe)
        points = []
        filled_from = 0
        for depth in depths:
            before = driver.cpu()
            driver.fill(depth)
            fill_cpu = driver.cpu()["fill"] - before["fill"]
            before = driver.cpu()
            driver.processor.group_records = group_records
            driver.round(probe)
            driver.processor.group_records = fill_group
            after = driver.cpu()
            points.append(
                {
                    "depth": depth,
                    "fill_us": fill_cpu / (depth - filled_from) * 1e6,
                    **{f"{kind}_us": (after[kind] - before[kind]) / probe * 1e6 for kind in PROBE_KINDS},
                    "peak_rss_mib": peak_rss_kib() / 1024,
                    "projection_mib": projection_bytes(driver.data.projection(driver.partition)) / 2**20,
                }
            )
            filled_from = depth
        driver.check_drained(probe * len(depths))
    finally:
        driver.close()
    first, last = points[0], points[-1]
    ratios = {kind: last[f"{kind}_us"] / first[f"{kind}_us"] for kind in PROBE_KINDS}
    return {
        "depths": points,
        "probe": probe,
        "body_bytes": body_bytes,
        "group_records": group_records,
        "last_over_first": ratios,
    }


def table(result: dict[str, Any], env: dict[str, Any]) -> str:
    points = result["depths"]
    lines = [
        f"keyload bench.depth: one queue filled to {points[-1]['depth']:,} messages of {result['body_bytes']} B, "
        f"probed with {result['probe']:,} Enqueues, Receives of one and Acks at each depth, applied "
        f"{result['group_records']} records per group",
        f"python {env['python']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus, load {env['load_average_1m']:.2f}; "
        f"feature level {limits.FEATURE_LEVEL}; µs = processor thread CPU per command (step() only)",
        "",
        f"{'depth':>10} {'fill enq µs':>12} {'enqueue µs':>11} {'receive µs':>11} {'ack µs':>9} "
        f"{'peak RSS MiB':>13} {'projection MiB':>15}",
    ]
    for point in points:
        lines.append(
            f"{point['depth']:>10,} {point['fill_us']:>12,.0f} {point['enqueue_us']:>11,.0f} "
            f"{point['receive_us']:>11,.0f} {point['ack_us']:>9,.0f} {point['peak_rss_mib']:>13,.0f} "
            f"{point['projection_mib']:>15,.1f}"
        )
    ratios = result["last_over_first"]
    lines += [
        "",
        f"µs at {points[-1]['depth']:,} over µs at {points[0]['depth']:,} (target: flat, 1.0): "
        + ", ".join(f"{kind} {ratios[kind]:.2f}" for kind in PROBE_KINDS),
    ]
    return "\n".join(lines)


def _depths(text: str) -> list[int]:
    try:
        depths = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--depths takes increasing integers, comma-separated, not {text!r}") from None
    if not depths or depths[0] < 1 or depths != sorted(set(depths)):
        raise argparse.ArgumentTypeError(f"--depths takes increasing integers >= 1, not {text!r}")
    return depths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.depth", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--depths",
        type=_depths,
        default=list(DEFAULT_DEPTHS),
        help="the depths probed, comma-separated (default %(default)s)",
    )
    parser.add_argument("--probe", type=int, default=DEFAULT_PROBE, help="commands of each kind a probe (%(default)s)")
    parser.add_argument("--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="body size (default %(default)s)")
    parser.add_argument(
        "--group-records",
        type=int,
        default=MAX_GROUP_RECORDS,
        help="records per group while probing; 1: a sparse service (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    if not 1 <= args.group_records <= MAX_GROUP_RECORDS:
        parser.error(f"--group-records must be 1..{MAX_GROUP_RECORDS}")
    capacity = args.depths[-1] + args.probe
    if not 1 <= args.probe <= INTEGER_FIELDS["max_in_flight"].maximum:
        parser.error(f"--probe must be 1..{INTEGER_FIELDS['max_in_flight'].maximum} (the largest max_in_flight)")
    if not 0 <= args.body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        parser.error(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    if capacity > INTEGER_FIELDS["max_stored_messages"].maximum:
        parser.error("the deepest depth and a probe exceed the largest max_stored_messages a queue may have")
    root = Path(tempfile.mkdtemp(prefix="keyload-depth-", dir=args.dir))
    try:
        result = run(root, args.depths, args.probe, args.body_bytes, args.group_records)
        env = environment(0, root)
    except BenchError as exc:
        print(f"bench.depth: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {"benchmark": "bench.depth", **result, "environment": env}
    print(json.dumps(report, indent=2) if args.json else table(result, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
