"""What the usage count of feature level 5 costs (processors/usage.py): counting what a partition held.

    python -m bench.usage_count [--documents N] [--json]

One data directory, one domain, the embedded file log and a PartitionProcessor with the outcome
stream on (bench/reclamation.py's Deployment). At feature level 4, N documents of 64 bytes are
written by Batches of 100 PutDocuments: the reference, in thread-CPU µs per document written. Then
RaiseFeatureLevel(5) and Ticks until the count is done: the records it took (each counts at most
the tick examination budget of rows), and thread-CPU µs per document counted, also as a ratio to
the write. The run fails unless the domain's usage then holds exactly the N documents.
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
from keyload.projections import keys

from .common import BenchError, Stopwatch, environment
from .reclamation import Deployment

DEFAULT_DOCUMENTS = 100_000
VALUE = b"v" * 64


def measure(root: Path, documents: int) -> dict[str, Any]:
    run = Deployment(root)
    try:
        run.apply("RaiseFeatureLevel", {"level": 4})
        written = Stopwatch()
        for start in range(0, documents, limits.MAX_BATCH_MUTATIONS):
            puts = [
                {"mutation": ("keyload.command.PutDocument", {"key": f"doc{n:09}", "value": VALUE}), "domain": None}
                for n in range(start, min(start + limits.MAX_BATCH_MUTATIONS, documents))
            ]
            run.apply("Batch", {"mutations": puts}, written)
        run.apply("RaiseFeatureLevel", {"level": 5})
        counted, records = Stopwatch(), 0
        while run.store.get(keys.USAGE_COUNT_CURSOR) is not None:
            run.apply("Tick", {}, counted)
            records += 1
        usage = run.apply("InspectDomain", {})["usage"]
    finally:
        run.close()
    if (usage["documents"], usage["document_bytes"]) != (documents, documents * len(VALUE)):
        raise BenchError(f"the count found {usage}, not {documents} documents of {len(VALUE)} bytes")
    write_us = written.cpu_seconds / documents * 1e6
    count_us = counted.cpu_seconds / documents * 1e6
    return {
        "documents": documents,
        "write_cpu_us_per_document": write_us,
        "count_records": records,
        "count_cpu_us_per_document": count_us,
        "count_to_write": count_us / write_us,
    }


def table(result: dict[str, Any], env: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"bench.usage_count: {result['documents']:,} documents of {len(VALUE)} bytes; {env['cpus']} CPUs, "
            f"load {env['load_average_1m']:.2f}",
            "",
            "| | CPU µs per document | records |",
            "|---|---:|---:|",
            f"| written (reference: Batches of {limits.MAX_BATCH_MUTATIONS} PutDocuments) "
            f"| {result['write_cpu_us_per_document']:,.1f} | |",
            f"| counted after the raise to level 5 | {result['count_cpu_us_per_document']:,.1f} "
            f"| {result['count_records']:,} |",
            "",
            f"count / write: {result['count_to_write']:.3f}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.usage_count", description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=DEFAULT_DOCUMENTS, help="documents (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="keyload-usage-count-", dir=args.dir))
    try:
        result = measure(root, args.documents)
        env = environment(0, root)
    except BenchError as exc:
        print(f"bench.usage_count: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps({"benchmark": "bench.usage_count", **result, "environment": env}, indent=2)
        if args.json
        else table(result, env)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
