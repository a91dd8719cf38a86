"""The command line of a benchmark that measures one workload at several feature levels.

bench.reads and bench.horizons each run their workload once per level in a fresh data directory
(processors/features.py: what a level changes is what they show) and print a table or one JSON
object; this is that shared part.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import BenchError, environment

Result = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Workload:
    """What one benchmark over levels measures: `measure(directory, level, count)` gives one level's
    result; `table(results, environment, count)` renders them all."""

    name: str  # the module: bench.reads
    description: str
    count_option: str  # the option naming the workload's size: --reads
    default_count: int
    count_help: str
    levels: Sequence[int]
    measure: Callable[[Path, int, int], Result]
    table: Callable[[list[Result], dict[str, Any], int], str]


def run(workload: Workload, argv: list[str] | None = None) -> int:
    """Parse the options, measure every level, print the report; the exit status."""
    parser = argparse.ArgumentParser(prog=f"python -m {workload.name}", description=workload.description)
    parser.add_argument(
        f"--{workload.count_option}",
        dest="count",
        type=int,
        default=workload.default_count,
        help=f"{workload.count_help} (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="keyload-bench-", dir=args.dir))
    try:
        results = [workload.measure(root / f"level-{level}", level, args.count) for level in workload.levels]
        env = environment(0, root)
        if args.json:
            print(json.dumps({"benchmark": workload.name, "levels": results, "environment": env}, indent=2))
        else:
            print(workload.table(results, env, args.count))
    except BenchError as exc:
        print(f"{workload.name}: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0
