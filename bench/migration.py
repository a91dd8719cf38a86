"""Migration on open: how fast a writable open re-encodes a projection an older processor wrote.

    python -m bench.migration [--commands N] [--body-bytes B] [--dir PARENT]

bench.throughput's workload (a CreateQueue, N Enqueues) is replayed into a projection
of about 4N rows (message, body, ready row and stored outcome per Enqueue). Its rows
are copied into fresh RocksDB directories without the schema-set mark, as a processor
from before an upgrade left them: once with every stored outcome under the oldest
released Outcome version (an Outcome upgrade: every row scanned, the outcomes
rewritten), once as they are (an upgrade of a type nothing stores: a scan alone).
Timed: the writable `Store` open that migrates, then a second open that finds the
mark. Each migrated digest must equal the replayed one (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from keyload.log.codec import REGISTRY, Released
from keyload.operations.recovery import replay
from keyload.projections import keys
from keyload.projections.store import Store

from .common import OUTCOME, Stopwatch, Write, raw_writes
from .throughput import prepare

DEFAULT_COMMANDS = 25_000  # about 100,000 rows
DEFAULT_BODY_BYTES = 256
COPY_BATCH_ROWS = 10_000


def unmarked(store: Store, outcomes: Released | None) -> tuple[list[list[Write]], int]:
    """The store's rows in batches without the mark, stored outcomes under `outcomes` when given;
    and how many outcomes that re-encoded."""
    batches: list[list[Write]] = [[]]
    outdated = 0
    for key, value in store.scan(b"", b"\xff"):
        if key == keys.SCHEMA_SET:
            continue
        if outcomes is not None and key[:1] == keys.OUTCOME and len(value) > keys.SHA256_BYTES:
            outcome = REGISTRY.decode(OUTCOME, value[keys.SHA256_BYTES :])
            value = value[: keys.SHA256_BYTES] + outcomes.header + REGISTRY.encode_body_under(outcomes.schema, outcome)
            outdated += 1
        if len(batches[-1]) == COPY_BATCH_ROWS:
            batches.append([])
        batches[-1].append((key, value))
    return batches, outdated


def timed_open(path: Path) -> tuple[Stopwatch, int, str]:
    """(time of a writable open, rows, digest)."""
    watch = Stopwatch()
    watch.start()
    store = Store(path)
    watch.stop()
    try:
        return watch, sum(1 for _ in store.scan(b"", b"\xff")), store.digest()
    finally:
        store.close()


def run(root: Path, commands: int, body_bytes: int) -> bool:
    work = prepare(root, commands, body_bytes)
    replayed = replay(work.data, work.partition, root / "replay", progress=False)
    print(f"{commands:,} Enqueues with {body_bytes}-byte bodies replayed")
    equal = True
    store = Store(root / "replay", read_only=True)
    try:
        cases = (("outcomes under Outcome v1", REGISTRY.released(OUTCOME)[0]), ("every record current", None))
        for label, outcomes in cases:
            batches, outdated = unmarked(store, outcomes)
            path = root / f"unmarked-{outdated}"
            raw_writes(path, batches)
            migration, rows, digest = timed_open(path)
            again, _, _ = timed_open(path)
            equal = equal and digest == replayed.digest
            print(
                f"{label:<26} {rows:>9,} rows, {outdated:>7,} rewritten: migrating open {migration.seconds:6.3f} s "
                f"({rows / migration.seconds:>9,.0f} rows/s, CPU {migration.cpu_seconds:.3f} s), "
                f"marked open {again.seconds:.3f} s, digest {'equal' if digest == replayed.digest else 'DIFFERS'}"
            )
    finally:
        store.close()
    return equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.migration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=DEFAULT_COMMANDS, help="Enqueue commands (default %(default)s)")
    parser.add_argument("--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="default %(default)s")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="keyload-bench-migration-", dir=args.dir))
    try:
        return 0 if run(root, args.commands, args.body_bytes) else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
