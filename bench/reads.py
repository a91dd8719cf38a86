"""What reads leave in the projection, at feature level 0 and at level 1 (processors/features.py).

    python -m bench.reads [--reads N] [--json]

One data directory, one domain, the embedded file log and a PartitionProcessor with the outcome
stream on (bench/reclamation.py's Deployment). A topic gets 1,000 events of 1 KiB; then N reads
alternate a ReadTopic page of 100 events and an InspectTopic. Measured with keyload census
(keyload/operations/census.py): the projection's bytes and outcome rows before and after the reads,
at level 0 (as 0.2.0 logs replay) and after a RaiseFeatureLevel to 1 (what `keyload run` does).
Also the CPU µs per read (thread CPU of step()).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from keyload.operations.census import Census, census
from keyload.processors.policy import default_topic_spec

from . import levels
from .common import Stopwatch
from .reclamation import Deployment

DEFAULT_READS = 400
EVENTS, PAGE = 1_000, 100


def _outcomes(counted: Census) -> tuple[int, int]:
    found = next((f for f in counted.families if f.family == "outcome"), None)
    return (0, 0) if found is None else (found.rows, found.key_bytes + found.value_bytes)


def measure(root: Path, level: int, reads: int) -> dict[str, Any]:
    run = Deployment(root)
    try:
        if level:
            run.apply("RaiseFeatureLevel", {"level": level})
        run.apply("CreateTopic", {"topic": "news", "policy": default_topic_spec()})
        for first in range(0, EVENTS, PAGE):
            ids = range(first, first + PAGE)
            events = [{"event_id": f"e{i}", "type": "t", "headers": {}, "body": b"x" * 1024} for i in ids]
            run.apply("Publish", {"topic": "news", "events": events})
        before = census(run.data, run.partition)
        watch = Stopwatch()
        for r in range(reads):
            if r % 2:
                run.apply("InspectTopic", {"topic": "news"}, watch)
                continue
            start = 1 + (r // 2 * PAGE) % EVENTS
            page = {"topic": "news", "from_position": start, "max_events": PAGE, "max_bytes": None, "cursor": None}
            run.apply("ReadTopic", page, watch)
        after = census(run.data, run.partition)
    finally:
        run.close()
    rows_before, bytes_before = _outcomes(before)
    rows_after, bytes_after = _outcomes(after)
    return {
        "feature_level": level,
        "reads": reads,
        "projection_bytes_grown": after.bytes - before.bytes,
        "outcome_rows_grown": rows_after - rows_before,
        "outcome_bytes_grown": bytes_after - bytes_before,
        "cpu_us_per_read": watch.cpu_seconds / reads * 1e6,
    }


def table(results: list[dict[str, Any]], env: dict[str, Any], reads: int) -> str:
    lines = [
        f"bench.reads: {reads} reads (ReadTopic pages of {PAGE} 1 KiB events and InspectTopics); "
        f"{env['cpus']} CPUs, load {env['load_average_1m']:.2f}",
        "",
        "| feature level | projection bytes grown | outcome rows grown | CPU µs per read |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['feature_level']} | {r['projection_bytes_grown']:,} | {r['outcome_rows_grown']:,} "
        f"| {r['cpu_us_per_read']:,.0f} |"
        for r in results
    ]
    return "\n".join(lines)


WORKLOAD = levels.Workload(
    "bench.reads", __doc__.split("\n\n")[0], "reads", DEFAULT_READS, "reads at each level", (0, 1), measure, table
)

if __name__ == "__main__":
    sys.exit(levels.run(WORKLOAD))
