"""What outcomes leave in the projection at feature levels 1 to 4 (processors/horizons.py, repeats.py).

    python -m bench.horizons [--cycles N] [--json]

One data directory, one domain, the embedded file log and a PartitionProcessor with the outcome
stream on (bench/reclamation.py's Deployment), in real time: the domain's horizons are 1 s for
outcomes and 2 s for receipts. N cycles of Enqueue (1 KiB), Receive(1) and Ack, then a wait past
both horizons and Ticks until the sweep has caught up. Measured with keyload census
(keyload/operations/census.py) halfway, at the end of the cycles and after the wait: the rows and
bytes of stored outcomes, receipts and the horizon index, and the projection's bytes. Also the CPU
µs per cycle (thread CPU of step()), the horizon bookkeeping and sweep included from level 2, the
receive outcome stored without bodies at level 3, the finished messages compacted at level 4.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from keyload.operations.census import Census, census
from keyload.processors.policy import default_spec

from . import levels
from .common import Stopwatch
from .reclamation import Deployment, enqueue

DEFAULT_CYCLES = 5_000
OUTCOME_HORIZON_MS, RECEIPT_HORIZON_MS = 1_000, 2_000
FAMILIES = ("outcome", "receipt", "horizon")
LEVELS = (1, 2, 3, 4)  # before horizons; horizons; receives keep leases, not bodies; finished work compacted


def _snapshot(counted: Census) -> dict[str, int]:
    """Rows and bytes of the outcome families, and of the whole projection."""
    found = {f.family: f for f in counted.families}
    taken = {"projection_bytes": counted.bytes}
    for name in FAMILIES:
        family = found.get(name)
        taken[f"{name}_rows"] = 0 if family is None else family.rows
        taken[f"{name}_bytes"] = 0 if family is None else family.key_bytes + family.value_bytes
    return taken


def measure(root: Path, level: int, cycles: int) -> dict[str, Any]:
    run = Deployment(root)
    snapshots: dict[str, dict[str, int]] = {}
    try:
        run.apply("RaiseFeatureLevel", {"level": level})
        horizons = {"outcome_horizon_ms": OUTCOME_HORIZON_MS, "receipt_horizon_ms": RECEIPT_HORIZON_MS}
        run.apply("ConfigureDomain", dict(horizons, expected_policy_version=None))
        run.apply("CreateQueue", {"queue": "jobs", "policy": default_spec()})
        receive = {"queue": "jobs", "max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": None}
        watch = Stopwatch()
        for n in range(cycles):
            run.apply("Enqueue", enqueue("jobs", f"m{n}"), watch)
            [delivery] = run.apply("Receive", receive, watch)["deliveries"]
            run.apply("Ack", {"token": delivery["token"]}, watch)
            if n + 1 == cycles // 2:
                snapshots["halfway"] = _snapshot(census(run.data, run.partition))
        snapshots["end"] = _snapshot(census(run.data, run.partition))
        time.sleep(RECEIPT_HORIZON_MS / 1000 + 0.2)
        while run.apply("Tick", {})["budget_exhausted"]:
            pass
        snapshots["after_horizons"] = _snapshot(census(run.data, run.partition))
    finally:
        run.close()
    return {"feature_level": level, "cycles": cycles, "cpu_us_per_cycle": watch.cpu_seconds / cycles * 1e6, **snapshots}


def table(results: list[dict[str, Any]], env: dict[str, Any], cycles: int) -> str:
    lines = [
        f"bench.horizons: {cycles} enqueue (1 KiB) / receive / ack cycles, horizons "
        f"{OUTCOME_HORIZON_MS} / {RECEIPT_HORIZON_MS} ms; {env['cpus']} CPUs, load {env['load_average_1m']:.2f}",
        "",
        "| level | when | outcome rows | outcome bytes | receipt rows | horizon rows | projection bytes |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for when in ("halfway", "end", "after_horizons"):
            s = r[when]
            lines.append(
                f"| {r['feature_level']} | {when} | {s['outcome_rows']:,} | {s['outcome_bytes']:,} "
                f"| {s['receipt_rows']:,} | {s['horizon_rows']:,} | {s['projection_bytes']:,} |"
            )
    lines += [""] + [f"level {r['feature_level']}: {r['cpu_us_per_cycle']:,.0f} CPU µs per cycle" for r in results]
    return "\n".join(lines)


WORKLOAD = levels.Workload(
    "bench.horizons", __doc__.split("\n\n")[0], "cycles", DEFAULT_CYCLES, "cycles at each level", LEVELS, measure, table
)

if __name__ == "__main__":
    sys.exit(levels.run(WORKLOAD))
