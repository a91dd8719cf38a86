"""What the projections of one process hold in memory as the partitions it serves fill up.

    python -m bench.memory [--partitions P] [--mib M] [--value-bytes V] [--reads R]
                           [--cache-mib C] [--memtable-mib W] [--json]

Two child processes, one after the other, each on a fresh directory, each doing the same work: open P
projections, write M MiB of rows to each (commits of 1,000 rows of V seeded-random bytes, taking turns
across the partitions, so every projection is written all along), then R point reads of random
written keys in each. Reported per child: peak RSS (the child's ru_maxrss), CPU µs per row written and
per read.

  keyload    projections/store.py's Store: every projection of the process shares one block cache of
             C MiB, and each holds at most PROJECTION_WRITE_BUFFERS memtables of W MiB (`keyload run
             --projection-cache-mib`, `--projection-memtable-mib`; by default theirs).
  reference  the same rows through a bare rocksdict Rdict per partition with RocksDB's defaults and the
             projections' bloom filter: what Store opened before (a block cache and up to two 64 MiB
             memtables of its own per projection).

The ratios keyload / reference are the figures to compare.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch

from keyload.projections.store import (
    BLOOM_BITS_PER_KEY,
    DEFAULT_PROJECTION_CACHE_BYTES,
    DEFAULT_PROJECTION_WRITE_BUFFER_BYTES,
    MIB,
    PROJECTION_WRITE_BUFFERS,
    ProjectionMemory,
    Store,
    use_projection_memory,
)

from .common import SEED, BenchError, environment, peak_rss_kib

DEFAULT_PARTITIONS = 8
DEFAULT_MIB = 96  # per partition: past two of RocksDB's default 64 MiB memtables
DEFAULT_VALUE_BYTES = 1024
DEFAULT_READS = 20_000  # per partition
ROWS_PER_COMMIT = 1_000
KINDS = ("keyload", "reference")
CHILD_TIMEOUT_S = 1800.0


def _key(partition: int, row: int) -> bytes:
    return b"%04d/%012d" % (partition, row)


class Reference:
    """A bare Rdict with RocksDB's defaults and the projections' bloom filter, written as Store writes."""

    def __init__(self, path: Path) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        tables = BlockBasedOptions()
        tables.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
        options.set_block_based_table_factory(tables)
        self.db = Rdict(str(path), options)

    def commit(self, writes: dict[bytes, bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            batch.put(key, value)
        self.db.write(batch)

    def get(self, key: bytes) -> bytes | None:
        value = self.db.get(key)
        return None if value is None else bytes(value)

    def close(self) -> None:
        self.db.close()


class Projection:
    """projections/store.py's Store, the product's configuration."""

    def __init__(self, path: Path) -> None:
        self.store = Store(path)
        self.offset = -1

    def commit(self, writes: dict[bytes, bytes]) -> None:
        self.offset += 1
        self.store.commit(dict(writes), self.offset, 0)

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(key)

    def close(self) -> None:
        self.store.close()


def memory_of(args: argparse.Namespace) -> ProjectionMemory:
    return ProjectionMemory(args.cache_mib * MIB, args.memtable_mib * MIB)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One child's run: write, then read, then the figures."""
    kind, directory, partitions, mib, value_bytes, reads = (
        args.child,
        args.dir,
        args.partitions,
        args.mib,
        args.value_bytes,
        args.reads,
    )
    use_projection_memory(memory_of(args))
    opened = [(Projection if kind == "keyload" else Reference)(directory / f"p-{p:04d}") for p in range(partitions)]
    rng = random.Random(SEED)
    values = [rng.randbytes(value_bytes) for _ in range(64)]
    rows = mib * 1024 * 1024 // value_bytes
    try:
        cpu = _cpu_s()
        for start in range(0, rows, ROWS_PER_COMMIT):
            for partition, projection in enumerate(opened):
                batch = range(start, min(rows, start + ROWS_PER_COMMIT))
                projection.commit({_key(partition, row): values[row % len(values)] for row in batch})
        write_cpu = _cpu_s() - cpu
        cpu = _cpu_s()
        for partition, projection in enumerate(opened):
            for _ in range(reads):
                row = rng.randrange(rows)
                if projection.get(_key(partition, row)) != values[row % len(values)]:
                    raise BenchError(f"{kind}: partition {partition} row {row} reads back wrong")
        read_cpu = _cpu_s() - cpu
    finally:
        for projection in opened:
            projection.close()
    return {
        "kind": kind,
        "peak_rss_mib": peak_rss_kib() / 1024,
        "write_us_per_row": write_cpu / (rows * partitions) * 1e6,
        "read_us_per_get": read_cpu / (reads * partitions) * 1e6,
        "rows_per_partition": rows,
    }


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    results = {}
    for kind in KINDS:
        directory = root / kind
        directory.mkdir()
        command = [
            sys.executable,
            "-m",
            "bench.memory",
            "--child",
            kind,
            "--dir",
            str(directory),
            *("--partitions", str(args.partitions), "--mib", str(args.mib)),
            *("--value-bytes", str(args.value_bytes), "--reads", str(args.reads)),
            *("--cache-mib", str(args.cache_mib), "--memtable-mib", str(args.memtable_mib)),
        ]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise BenchError(f"the {kind} child failed:\n{done.stderr[-4000:]}")
        results[kind] = {**json.loads(done.stdout), "wall_s": time.monotonic() - started}
        shutil.rmtree(directory, ignore_errors=True)
    keyload, reference = results["keyload"], results["reference"]
    ratios = {
        figure: keyload[figure] / reference[figure]
        for figure in ("peak_rss_mib", "write_us_per_row", "read_us_per_get")
    }
    return {
        "benchmark": "bench.memory",
        "partitions": args.partitions,
        "mib_per_partition": args.mib,
        "value_bytes": args.value_bytes,
        "reads_per_partition": args.reads,
        "budget": {
            "cache_bytes": args.cache_mib * MIB,
            "write_buffer_bytes": args.memtable_mib * MIB,
            "write_buffers": PROJECTION_WRITE_BUFFERS,
        },
        "results": results,
        "keyload_over_reference": ratios,
    }


def table(result: dict[str, Any], env: dict[str, Any]) -> str:
    keyload, reference = result["results"]["keyload"], result["results"]["reference"]
    ratios = result["keyload_over_reference"]
    budget = result["budget"]
    rows = [
        ("peak RSS MiB", "peak_rss_mib", ".0f"),
        ("cpu µs per row written", "write_us_per_row", ".2f"),
        ("cpu µs per read", "read_us_per_get", ".2f"),
        ("wall s", "wall_s", ".1f"),
    ]
    lines = [
        f"keyload bench.memory: {result['partitions']} projections in one process, {result['mib_per_partition']} MiB "
        f"of {result['value_bytes']} B rows written to each, then {result['reads_per_partition']:,} random reads each",
        f"keyload: a {budget['cache_bytes'] // 2**20} MiB block cache shared by every projection, at most "
        f"{budget['write_buffers']} memtables of {budget['write_buffer_bytes'] // 2**20} MiB each; "
        f"python {env['python']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus",
        "",
        f"{'':<26}{'keyload':>12}{'reference':>12}{'ratio':>8}",
    ]
    for label, figure, spec in rows:
        ratio = f"{ratios[figure]:.2f}" if figure in ratios else ""
        lines.append(f"{label:<26}{keyload[figure]:>12{spec}}{reference[figure]:>12{spec}}{ratio:>8}")
    lines.append(
        "(reference: a bare Rdict per projection with RocksDB's defaults and the same bloom filter, what Store "
        "opened before; each side is a child process of its own, so peak RSS is its own)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS, help="default %(default)s")
    parser.add_argument("--mib", type=int, default=DEFAULT_MIB, help="MiB written per partition (default %(default)s)")
    parser.add_argument("--value-bytes", type=int, default=DEFAULT_VALUE_BYTES, help="default %(default)s")
    parser.add_argument("--reads", type=int, default=DEFAULT_READS, help="reads per partition (default %(default)s)")
    parser.add_argument(
        "--cache-mib",
        type=int,
        default=DEFAULT_PROJECTION_CACHE_BYTES // MIB,
        help="keyload's shared block cache, as `keyload run --projection-cache-mib` (default %(default)s)",
    )
    parser.add_argument(
        "--memtable-mib",
        type=int,
        default=DEFAULT_PROJECTION_WRITE_BUFFER_BYTES // MIB,
        help="keyload's memtable per projection, as `keyload run --projection-memtable-mib` (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    if min(args.partitions, args.mib, args.value_bytes, args.reads) < 1:
        parser.error("--partitions, --mib, --value-bytes and --reads must be >= 1")
    try:
        memory_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.child is not None:
        figures = child(args)
        print(json.dumps(figures))
        return 0
    root = Path(tempfile.mkdtemp(prefix="keyload-bench-memory-", dir=args.dir))
    try:
        result = run(root, args)
        env = environment(0, root)
        print(json.dumps({**result, "environment": env}, indent=2) if args.json else table(result, env), flush=True)
    except BenchError as exc:
        print(f"bench.memory: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
