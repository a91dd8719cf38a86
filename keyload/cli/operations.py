"""Hand-written operational commands: run, checkpoint, replay, drill, restore, status, poison,
log truncate, keys add, payload schedule/get, gc status/run/release-pin, and the old `inspect`.

Each imports the engine inside its handler, so `keyload --help` loads none of it. They print
through `keyload.cli.output` (`--json` for machine output where a command has a result to
show) and raise `KeyloadError`s to the one error path in `keyload.cli.main`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING, Any

from keyload.cli.commands import domain_name, offset, partition_number, positive, positive_seconds, seconds
from keyload.cli.output import UsageError, emit, jsonable, print_json, wants_json
from keyload.errors import KeyloadError

if TYPE_CHECKING:
    from keyload.log.base import CommandLog
    from keyload.operations.catalog import CheckpointCatalog
    from keyload.sdk.client import Client
    from keyload.sdk.results import Census
    from keyload.service.halts import Halt
    from keyload.storage.datadir import DataDir, KafkaConfig, ObjectStoreConfig


CHECKPOINT_WAIT_S = 30.0
MAX_STATUS_PAGES = 100  # retention pages `gc status` reads per partition
EXIT_FAILED = 1

# The engine's defaults, stated here so that the parser (and its help) needs no engine import;
# tests/test_cli_grammar.py checks each against the constant it mirrors.
DEFAULTS: dict[str, Any] = {
    "partitions": 4,  # keyload.storage.datadir.DEFAULT_PARTITIONS
    "tick_interval_ms": 100,  # keyload.service.ticker.DEFAULT_TICK_INTERVAL_MS
    "session_timeout_ms": 10_000,  # keyload.service.kafka.DEFAULT_SESSION_TIMEOUT_MS
    "checkpoint_every": 100_000,  # keyload.operations.checkpoints.DEFAULT_CHECKPOINT_EVERY_RECORDS
    "checkpoint_interval_s": 600.0,  # keyload.operations.checkpoints.DEFAULT_CHECKPOINT_INTERVAL_S
    "checkpoint_retain": 3,  # keyload.operations.checkpoints.DEFAULT_RETAINED_CHECKPOINTS
    "gc_interval_s": 10.0,  # keyload.operations.gc.DEFAULT_GC_INTERVAL_S
    "projection_cache_mib": 128,  # keyload.projections.store.DEFAULT_PROJECTION_CACHE_BYTES
    "projection_memtable_mib": 16,  # keyload.projections.store.DEFAULT_PROJECTION_WRITE_BUFFER_BYTES
    "timeout": 10.0,  # keyload.sdk.client.DEFAULT_TIMEOUT_S
    "poison_limit": 100,  # keyload.sdk.client.DEFAULT_POISON_LIMIT
    "listen": "127.0.0.1:7411",  # keyload.server.runner.DEFAULT_HOST, DEFAULT_PORT
    "listen_env": "KEYLOAD_LISTEN",  # keyload.server.runner.LISTEN_ENV
    "workers": 1,  # keyload.service.workers.DEFAULT_WORKERS
}


def _stop_on_signals() -> Event:
    stop = Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _data(args: argparse.Namespace) -> DataDir:
    from keyload.storage.datadir import DataDir

    return DataDir.open(args.data)


def _partition(args: argparse.Namespace, data: DataDir) -> int:
    if (args.partition is None) == (args.domain is None):
        raise UsageError("give exactly one of --partition or --domain")
    from keyload.log.base import partition_for

    partition: int = args.partition if args.domain is None else partition_for(args.domain, data.partitions)
    data.check_partition(partition)
    return partition


def _report(args: argparse.Namespace, value: dict[str, Any], lines: list[str]) -> None:
    """An operational command's result: its lines for people, the record with --json."""
    if getattr(args, "output", "auto") == "json":
        print_json(value)
    else:
        print("\n".join(lines))


# -- run ------------------------------------------------------------------------------------


def _object_store(args: argparse.Namespace) -> ObjectStoreConfig | None:
    """`--object-store`: a folder, or s3://BUCKET[/PREFIX] with `--s3-endpoint` / `--s3-region`."""
    from keyload.storage.datadir import FileStoreConfig, S3StoreConfig

    store: str | None = args.object_store
    if store is None or not store.startswith("s3://"):
        if args.s3_endpoint is not None or args.s3_region is not None:
            raise UsageError("--s3-endpoint and --s3-region need --object-store s3://BUCKET[/PREFIX]")
        return None if store is None else FileStoreConfig(Path(store))
    bucket, _, prefix = store.removeprefix("s3://").partition("/")
    if not bucket:
        raise UsageError("--object-store s3://BUCKET[/PREFIX] needs a bucket")
    return S3StoreConfig(bucket, prefix.strip("/"), args.s3_endpoint, args.s3_region)


def _check_against_the_log(args: argparse.Namespace) -> None:
    """`--workers` and `--gc-interval-s` against the partitions and log the directory has, or will
    have once created: both are the embedded service's, and a Kafka processor given them would
    ignore them silently (no GC would run)."""
    from keyload.storage.datadir import CONFIG, DataDir

    existing = DataDir.open(args.data) if (Path(args.data) / CONFIG).exists() else None
    partitions = args.partitions if existing is None else existing.partitions
    on_kafka = args.kafka is not None if existing is None else existing.kafka is not None
    if args.workers > 1 and on_kafka:
        raise UsageError("--workers is for the embedded log: on Kafka, run more `keyload run` in the consumer group")
    if args.gc_interval_s and on_kafka:  # 0 (none) is what a Kafka processor runs anyway
        raise UsageError(
            "--gc-interval-s is for the embedded log: on Kafka, run `keyload gc run --interval-s N` beside the "
            "processors (one for the deployment)"
        )
    if args.workers > partitions:
        raise UsageError(f"--workers must be 1..{partitions} (the partitions of {args.data}), not {args.workers}")


def run(args: argparse.Namespace) -> int:
    from keyload.operations.checkpoints import CheckpointPolicy
    from keyload.projections.store import MIB, ProjectionMemory
    from keyload.service.embedded import ServiceSettings, serve
    from keyload.storage.datadir import CONFIG, DataDir, KafkaConfig, check_layout

    try:
        memory = ProjectionMemory(args.projection_cache_mib * MIB, args.projection_memtable_mib * MIB)
        check_layout(args.partitions, segment_bytes=args.segment_bytes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    listen = None
    if args.listen != "none":
        from keyload.server.connections import raise_open_file_limit
        from keyload.server.runner import Listen

        raise_open_file_limit()  # before anything opens files: connections are bounded by a share of it

        try:
            listen = Listen.parse(args.listen, args.tls_cert, args.tls_key, args.max_connections)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        listen = listen.bound()  # a port in use fails here, before the data directory is created
    _check_against_the_log(args)
    kafka = None
    if args.kafka is not None:
        if args.min_insync_replicas > args.replication_factor:  # before the data directory records them
            raise UsageError("--min-insync-replicas must be in 1..--replication-factor")
        kafka = KafkaConfig(args.kafka, args.topic_prefix, args.replication_factor, args.min_insync_replicas)
        if args.keyring_from is None and not (Path(args.data) / CONFIG).exists():
            _refuse_a_second_keyring(kafka, args.data)
    data = DataDir.create(
        args.data,
        args.partitions,
        kafka=kafka,
        object_store=_object_store(args),
        keyring_from=args.keyring_from,
        segment_bytes=args.segment_bytes,
    )
    settings = ServiceSettings(
        checkpoints=CheckpointPolicy(args.checkpoint_every, args.checkpoint_interval_s, args.checkpoint_retain),
        memory=memory,
        listen=listen,
        tick_interval_ms=args.tick_interval_ms,
        gc_interval_s=DEFAULTS["gc_interval_s"] if args.gc_interval_s is None else args.gc_interval_s,
        session_timeout_ms=args.session_timeout_ms,
        until_idle=args.until_idle,
        fail_fast=args.fail_fast,
        workers=args.workers,
    )
    halts = serve(data, settings, _stop_on_signals())
    return EXIT_FAILED if halts else 0


def _refuse_a_second_keyring(kafka: KafkaConfig, data: Path) -> None:
    """A new processor's data directory gets a keyring of its own unless --keyring-from copies one.
    Joining a deployment that has run with it would split the group quietly: each processor would
    refuse the commands, tokens and outcomes of the other's keys. So it is a usage error."""
    from keyload.log.kafka_log import KafkaSettings, holds_commands
    from keyload.storage.datadir import kafka_client_config

    settings = KafkaSettings(kafka.bootstrap, kafka.topic_prefix, client_config=kafka_client_config())
    if holds_commands(settings):
        raise UsageError(
            f"the topics {kafka.topic_prefix}.* already hold a deployment's commands: every processor of it needs "
            f"the same keyring, so create {data} with --keyring-from another processor's keyring.json "
            "(or give a --topic-prefix of its own)"
        )


# -- checkpoints and recovery ----------------------------------------------------------------


def checkpoint(args: argparse.Namespace) -> int:
    from keyload.cli.main import client_of
    from keyload.operations.checkpoints import CheckpointError

    with client_of(args) as client:
        partition = _partition(args, client.data)
        offset = client.request_checkpoint(partition).offset
    # Finding it reads the catalog alone: the object store the service uploads to is never opened here.
    with client.data.checkpoints() as checkpoints:
        deadline = time.monotonic() + CHECKPOINT_WAIT_S
        while True:
            try:
                entry = checkpoints.find(partition, offset)
                break
            except CheckpointError:
                if time.monotonic() > deadline:
                    raise KeyloadError(
                        f"checkpoint at offset {offset} was not published within {CHECKPOINT_WAIT_S:g}s"
                    ) from None
                time.sleep(0.05)
    _report(
        args,
        {
            "partition": partition,
            "offset": offset,
            "object_prefix": entry.object_prefix,
            "digest": entry.manifest.digest,
        },
        [
            f"checkpoint of partition {partition} at offset {offset}: published as {entry.object_prefix}",
            f"digest {entry.manifest.digest}",
        ],
    )
    return 0


def replay(args: argparse.Namespace) -> int:
    from keyload.operations.recovery import replay as replay_partition

    data = _data(args)
    partition = _partition(args, data)
    replayed = replay_partition(
        data, partition, Path(args.into), args.from_offset, args.to_offset, progress=not args.quiet
    )
    _report(
        args,
        {
            "partition": partition,
            "into": args.into,
            "applied_offset": replayed.applied_offset,
            "digest": replayed.digest,
        },
        [
            f"replayed partition {partition} into {args.into}: "
            f"offset {replayed.applied_offset}, digest {replayed.digest}"
        ],
    )
    return 0


def _checkpoint_offset(choice: str | None, data: DataDir, partition: int) -> int | None:
    """The offset named by --from-checkpoint: None (offset 0), 'latest', or a number."""
    if choice is None:
        return None
    if choice == "latest":
        from keyload.operations.recovery import RecoveryError

        with data.checkpoints() as checkpoints:
            latest = checkpoints.latest(partition)
        if latest is None:  # the directory's state, not the command line: exit 1, as a missing offset is
            raise RecoveryError(f"partition {partition} has no checkpoint; take one with `keyload checkpoint`")
        return latest.offset
    if not choice.isdigit():
        raise UsageError("--from-checkpoint must be 'latest' or a checkpoint offset")
    return int(choice)


def drill(args: argparse.Namespace) -> int:
    from keyload.operations.recovery import drill as drill_partition

    data = _data(args)
    partition = _partition(args, data)
    start = _checkpoint_offset(args.from_checkpoint, data, partition)
    with tempfile.TemporaryDirectory(prefix="keyload-drill-") as scratch:
        report = drill_partition(data, partition, Path(scratch) / "projection", start, progress=not args.quiet)
    verdict = "PASS" if report.passed else "FAIL"
    _report(
        args,
        dict(jsonable(report), verdict=verdict),
        [
            f"drill partition {report.partition} from {report.start}: {verdict}",
            f"  live    offset {report.live_offset}  digest {report.live_digest}",
            f"  replay  offset {report.replay_offset}  digest {report.replay_digest}",
        ],
    )
    return 0 if report.passed else EXIT_FAILED


def restore(args: argparse.Namespace) -> int:
    from keyload.operations.recovery import restore as restore_partition

    data = _data(args)
    partition = _partition(args, data)
    with tempfile.TemporaryDirectory(prefix="keyload-restore-", dir=data.root) as scratch:
        restored = restore_partition(data, partition, Path(scratch), progress=not args.quiet)
    applied = f"applied through {restored.applied_offset}" if restored.applied_offset >= 0 else "applied nothing"
    lines = [f"restored partition {restored.partition} from {restored.start}: {applied}", f"  digest {restored.digest}"]
    lines += [f"  passed over {reason}" for reason in restored.passed_over]
    if restored.retired:
        retired = ", ".join(map(str, restored.retired))
        lines.append(f"  retired checkpoints the log cannot reproduce or that are damaged: {retired}")
    if restored.kept_aside is not None:
        lines.append(f"  the replaced projection is kept at {restored.kept_aside}")
    _report(args, jsonable(restored), lines)
    return 0


# -- status and poison ---------------------------------------------------------------------------


def status(args: argparse.Namespace) -> int:
    """One line per partition; a partition that cannot be read is reported as such and the others follow."""
    from keyload.service.halts import recorded_halts

    data = _data(args)
    log_ = data.command_log()
    catalog = data.catalog()  # not the object store: status reads what is local while a store is down
    halts = recorded_halts(data.root)
    try:
        rows = [
            (partition, _partition_status(data, log_, catalog, partition, halts.get(partition)))
            for partition in range(data.partitions)
        ]
    finally:
        log_.close()
        catalog.close()
    head = f"{data.root}: {data.describe_log()}, {data.partitions} partitions, "
    head += f"{data.outcome_partitions} outcome partitions"
    _report(
        args,
        {
            "data": str(data.root),
            "log": data.describe_log(),
            "partitions": data.partitions,
            "outcome_partitions": data.outcome_partitions,
            "status": {f"p{partition}": line for partition, line in rows},
        },
        [head, *(f"  p{partition}: {line}" for partition, line in rows)],
    )
    return 0


def _partition_status(
    data: DataDir, log_: CommandLog, catalog: CheckpointCatalog, partition: int, halt: Halt | None
) -> str:
    """`log A..B, applied through N, lag L, checkpoints [...], recovery floor F, poison P[, reclaiming Q
    deleted queues, G deleted groups, T deleted topics][, counting domain usage]`, then any trouble."""
    from keyload.log.base import LogCorruption, LogError
    from keyload.processors import usage
    from keyload.projections import keys
    from keyload.projections.store import NO_OFFSET, Store, StoreError, poison_count

    trouble = [] if halt is None else [f"HALTED at offset {halt.offset}: {halt.reason}"]
    projection_trouble: list[str] = []
    applied: int | None = NO_OFFSET
    poison: int | None = 0
    reclaiming: dict[str, int] = {}
    counting = False
    if data.projection(partition).is_dir():  # absent until `keyload run` first serves the partition
        try:
            store = Store(data.projection(partition), read_only=True)
        except StoreError as exc:
            applied = poison = None
            projection_trouble.append(f"PROJECTION UNREADABLE: {exc}")
        else:
            try:
                applied = store.applied_offset
                poison = poison_count(store)
                retired = {keys.RETIRED: "queue", keys.RETIRED_GROUP: "group", keys.RETIRED_TOPIC: "topic"}
                for family, kind in retired.items():
                    reclaiming[kind] = sum(1 for _ in store.scan(family, keys.prefix_end(family)))
                counting = usage.counting(store)
            finally:
                store.close()
    # The log after the projection: a running service appends and applies meanwhile, and an end read
    # first could be behind what the projection applied by the time it is opened.
    end: int | None = None
    try:
        start, end = log_.start_offset(partition), log_.end_offset(partition)
        span = f"log {start}..{end - 1}" if end > start else "log empty" if start == 0 else f"log empty from {start}"
    except LogError as exc:
        span = "log unreadable"
        trouble.append(f"{'LOG CORRUPT' if isinstance(exc, LogCorruption) else 'LOG UNREADABLE'}: {exc}")
    trouble += projection_trouble
    if applied is None:
        parts = [span, "applied unknown", "lag unknown"]
    else:
        parts = [span, "applied nothing" if applied == NO_OFFSET else f"applied through {applied}"]
        behind = None if end is None else end - 1 - applied
        parts.append(
            "lag unknown" if behind is None else f"lag {behind}" if behind >= 0 else f"{-behind} ahead of the log"
        )
    try:
        published = [entry.offset for entry in catalog.entries(partition)]
    except KeyloadError as exc:
        parts += ["checkpoints unknown", "recovery floor unknown"]
        trouble.append(f"CATALOG UNREADABLE: {exc}")
    else:
        parts.append(f"checkpoints {published}" if published else "no checkpoints")
        parts.append(f"recovery floor {published[0]}" if published else "recovery floor none")
    parts.append("poison unknown" if poison is None else f"poison {poison}")
    # Deleted resources whose rows are still being reclaimed (processors/reclamation.py).
    being_reclaimed = [f"{n} deleted {kind}{'' if n == 1 else 's'}" for kind, n in reclaiming.items() if n]
    if being_reclaimed:
        parts.append("reclaiming " + ", ".join(being_reclaimed))
    if counting:  # what domains held when the partition reached feature level 5 (processors/usage.py)
        parts.append("counting domain usage")
    return ", ".join(parts + trouble)


def census(args: argparse.Namespace) -> int:
    """Rows and bytes by key family, and the bounded work left, per partition (all, or the one named)."""
    from dataclasses import asdict

    from keyload.operations.census import censuses

    data = _data(args)
    named = args.partition is not None or args.domain is not None
    counted = censuses(data, _partition(args, data) if named else None)
    lines: list[str] = []
    for found in counted:
        applied = "applied nothing" if found.applied_offset is None else f"applied through {found.applied_offset}"
        left = [f"{n} deleted {kind}" for kind, n in found.reclaiming.items() if n]
        # Outcomes stored before the partition reached feature level 2 have no horizon: they are kept forever.
        forever = found.outcomes_without_horizon
        lines.append(
            f"p{found.partition}: {applied}, {found.rows:,} rows, {found.bytes:,} bytes; "
            f"reclaiming {', '.join(left) or 'nothing'}; {found.retention_tasks} retention tasks; "
            f"{found.timers_due} timers due; {found.horizon_due} horizon rows due"
            + (f"; {forever:,} outcomes kept without a horizon" if forever else "")
            + ("; counting domain usage" if found.usage_counting else "")
            + ("; indexing retention tasks" if found.retention_indexing else "")
            + _at_cap_text(found)
        )
        lines.append(f"  {'family':<22} tag {'rows':>12} {'key bytes':>14} {'value bytes':>14}")
        for f in found.families:
            lines.append(f"  {f.family:<22} {f.tag:<3} {f.rows:>12,} {f.key_bytes:>14,} {f.value_bytes:>14,}")
        if found.horizons:
            lines.append(f"  {'kept to a horizon':<22} {'within horizon':>16} {'past horizon':>14}")
            for h in found.horizons:
                lines.append(f"  {h.family:<22} {h.kept:>16,} {h.due:>14,}")
    _report(args, {"partitions": [asdict(found) for found in counted]}, lines or ["no partition has a projection yet"])
    return 0


def _at_cap_text(found: Census) -> str:
    """`; at a cap: acme queues 100/100, …` (and how many more than are listed), or nothing."""
    if not found.at_cap_total:
        return ""
    listed = ", ".join(f"{entry.domain} {entry.kind} {entry.held:,}/{entry.cap:,}" for entry in found.at_cap)
    more = found.at_cap_total - len(found.at_cap)
    return f"; at a cap: {listed}" + (f" and {more:,} more" if more else "")


def poison_list(args: argparse.Namespace) -> int:
    """Records no command could be read from, per partition in offset order (JSON unless --output text)."""
    from keyload.cli.main import client_of

    with client_of(args) as client:
        entries = client.poison_entries(args.partition, limit=args.limit)
    rows = [
        {
            "partition": entry.partition,
            "offset": entry.offset,
            "timestamp_ms": entry.timestamp_ms,
            "reason": entry.reason,
            "size": entry.size,
            "sha256": entry.sha256,
            "first_bytes_hex": None if entry.first_bytes is None else entry.first_bytes.hex(),
        }
        for entry in entries
    ]
    if getattr(args, "output", "auto") == "text":
        emit(args, rows)
    else:
        print_json(rows)
    return 0


def log_truncate(args: argparse.Namespace) -> int:
    """Delete a partition's records below an offset, never past the recovery floor."""
    data = _data(args)
    partition = _partition(args, data)
    with data.checkpoints() as checkpoints:
        floor = checkpoints.floor(partition)
    if floor is None:
        raise KeyloadError(f"partition {partition} has no published checkpoint: its log cannot be truncated")
    if args.before > floor + 1:
        raise KeyloadError(
            f"refused: truncating partition {partition} before offset {args.before} would pass its recovery floor "
            f"(the oldest published checkpoint is at offset {floor}; truncate before {floor + 1} at most)"
        )
    command_log = data.command_log()
    try:
        start = command_log.truncate_before(partition, args.before)
    finally:
        command_log.close()
    _report(
        args,
        {"partition": partition, "start_offset": start, "recovery_floor": floor},
        [f"partition {partition}: log now starts at offset {start} (recovery floor {floor})"],
    )
    return 0


# -- keys, payloads, GC --------------------------------------------------------------------------


def keys_add(args: argparse.Namespace) -> int:
    from keyload.storage import keyring

    data = _data(args)
    keyring.add(data.root, args.key_id)
    path = data.root / keyring.FILE
    _report(
        args,
        {"key_id": args.key_id, "keyring": str(path)},
        [f"added key {args.key_id!r} to {path}; activate it with `keyload keys rotate`"],
    )
    return 0


def payload_schedule(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from keyload.cli.main import client_of

    source = Path(args.file)
    with (
        client_of(args) as client,
        tqdm(total=source.stat().st_size, unit="B", unit_scale=True, disable=args.quiet) as bar,
    ):

        def progress(done: int, _total: int) -> None:
            bar.update(done - bar.n)

        reservation = client.schedule_large(
            args.domain, args.queue, source, message_id=args.message_id, progress=progress, request_id=args.command_id
        )
    emit(args, reservation)
    return 0


def payload_get(args: argparse.Namespace) -> int:
    """An operator's read of a message's payload: straight from the object store, no handle."""
    from keyload.cli.main import client_of

    with client_of(args) as client:
        view = client.inspect_message(args.domain, args.queue, args.message_id)
        payload = view.meta.payload
        if payload is None:
            # The arguments are right; the message is not one with a payload: a failure, not usage.
            raise KeyloadError("the message has no large payload (inspect shows its inline body)")
        stored = client.data.object_store().get(payload.object_key, Path(args.out), payload.object_version)
    _report(
        args,
        {"bytes": stored.length, "object_key": payload.object_key, "version": stored.version, "out": args.out},
        [f"wrote {stored.length} bytes of {payload.object_key} version {stored.version} to {args.out}"],
    )
    return 0


def gc_status(args: argparse.Namespace) -> int:
    """Each partition's recovery floor (logged and in the catalog), tasks and what blocks them; a
    partition that cannot be read (a halted one's log) is reported as such, the others follow, and
    the exit status is then 1."""
    from keyload.cli.main import client_of
    from keyload.service.embedded import is_served

    data = _data(args)
    if data.kafka is None and not is_served(data.root):  # the retention tasks are read by the service
        raise KeyloadError(f"gc status asks the running service: start `keyload run --data {data.root}` first")
    with client_of(args) as client, contextlib.closing(client.data.catalog()) as catalog:
        partitions = range(client.data.partitions) if args.partition is None else [args.partition]
        report = []
        for partition in partitions:
            client.data.check_partition(partition)
            try:
                report.append(_gc_status(client, catalog, partition))
            except KeyloadError as exc:
                report.append({"partition": partition, "error": str(exc)})
    emit(args, report)
    return EXIT_FAILED if any("error" in row for row in report) else 0


def _gc_status(client: Client, catalog: CheckpointCatalog, partition: int) -> dict[str, Any]:
    from keyload.operations.catalog import recovery_floor

    pages, after = [], None
    for _ in range(MAX_STATUS_PAGES):
        page = client.list_retention(partition, after_task=after)
        pages.append(page)
        after = page.next_after_task
        if after is None:
            break
    return {
        "partition": partition,
        "logged_recovery_floor": pages[0].recovery_floor,
        "catalog_recovery_floor": recovery_floor(catalog, partition),
        "pins": jsonable(catalog.pins(partition)),
        "retired_identities": pages[0].retired_identities,
        "tasks": [dict(jsonable(status.task), blocked_by=status.blocked_by) for page in pages for status in page.tasks],
    }


def gc_run(args: argparse.Namespace) -> int:
    from keyload.cli.main import client_of
    from keyload.operations.gc import GcWorker, run_worker
    from keyload.sdk.client import Client
    from keyload.storage.principals import GC_PRINCIPAL, system_credential

    root = _data(args).root
    if args.acting_as is None and args.credential is None:  # the GC worker's own principal: only `recovery`
        opened = Client(root, credential=system_credential(root, GC_PRINCIPAL), timeout_s=args.timeout)
    else:
        opened = client_of(args)
    with (
        opened as client,
        client.data.checkpoints() as checkpoints,
        GcWorker(client, checkpoints) as worker,
    ):
        if args.once:
            emit(args, worker.run_once())
            return 0
        print(f"keyload gc: collecting {client.data.root} every {args.interval_s:g} s", flush=True)
        run_worker(worker, _stop_on_signals(), args.interval_s, report=lambda done: emit(args, done))
    return 0


def gc_release_pin(args: argparse.Namespace) -> int:
    """Release a recovery pin a restore left behind (a process killed while restoring keeps its pin)."""
    from keyload.operations.catalog import RecoveryPin

    data = _data(args)
    data.check_partition(args.partition)
    with data.checkpoints() as checkpoints:
        checkpoints.catalog.release(RecoveryPin(args.partition, args.offset, args.session))
    _report(
        args,
        {"partition": args.partition, "offset": args.offset, "session": args.session, "released": True},
        [f"released the pin of {args.session} on partition {args.partition}'s checkpoint at offset {args.offset}"],
    )
    return 0


def inspect(args: argparse.Namespace) -> int:
    """The old `inspect`: a queue (`queue inspect`), or one message with --message (`message inspect`)."""
    from keyload.cli.commands import named_once, show
    from keyload.cli.main import client_of

    queue = named_once("queue", args.queue_positional, args.queue)
    with client_of(args) as client:
        if args.message is None:
            result: Any = client.inspect_queue(args.domain, queue)
        else:
            result = client.inspect_message(args.domain, queue, args.message, include_body=args.body)

    show(args, result)
    return 0


# -- parsers ---------------------------------------------------------------------------------


def add_parsers(sub: Any, common: argparse.ArgumentParser, command: argparse.ArgumentParser) -> None:
    """The operational subcommands (and the `keys add`, `payload`, `gc`, `poison`, `log` nouns' verbs
    that are not commands of the table); `nouns` are the noun parsers the table already made."""
    _add_run(sub, common)
    locate = argparse.ArgumentParser(add_help=False)
    locate.add_argument("--partition", type=partition_number, metavar="N", help="the partition (or --domain)")
    locate.add_argument("--domain", type=domain_name, help="the partition of this domain (or --partition)")
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument("--quiet", action="store_true", help="no progress bar")

    op = sub.add_parser(
        "checkpoint", parents=[common, locate], help="take a checkpoint of a partition (needs `keyload run`)"
    )
    op.set_defaults(func=checkpoint)
    op = sub.add_parser(
        "replay", parents=[common, locate, quiet], help="rebuild a partition's projection into a directory"
    )
    op.add_argument("--from-offset", type=offset, default=0, metavar="N", help="first log offset replayed (default 0)")
    op.add_argument("--to-offset", type=offset, metavar="N", help="last log offset replayed (default: the log's end)")
    op.add_argument("--into", required=True, metavar="DIR", help="the directory the projection is rebuilt into")
    op.set_defaults(func=replay)
    op = sub.add_parser(
        "drill",
        parents=[common, locate, quiet],
        help="rebuild a partition in scratch space and compare digests with the live projection",
    )
    op.add_argument("--from-checkpoint", help="'latest' or a checkpoint offset (default: replay from offset 0)")
    op.set_defaults(func=drill)
    op = sub.add_parser(
        "restore",
        parents=[common, locate, quiet],
        help="rebuild a partition's projection from the newest checkpoint the log agrees with, plus replay "
        "(the way out of RecoveryRequired; `keyload run` must be stopped)",
    )
    op.set_defaults(func=restore)
    op = sub.add_parser(
        "status", parents=[common], help="per partition: log range, applied offset, checkpoints, poison, halts"
    )
    op.set_defaults(func=status)
    op = sub.add_parser(
        "census",
        parents=[common],
        help="per partition: rows and bytes by key family, deleted resources being reclaimed, retention tasks, "
        "timers due, rows within and past their horizon (reads every row)",
    )
    op.add_argument("--partition", type=partition_number, help="only this partition")
    op.add_argument("--domain", type=domain_name, help="only the partition of this domain")
    op.set_defaults(func=census)
    inspect_ = sub.add_parser(
        "inspect",
        parents=[common],
        help="show a queue's counters (as `queue inspect`), or one message with --message (as `message inspect`)",
    )
    inspect_.add_argument("--domain", required=True, help="the domain (partition key) of the command")
    inspect_.add_argument("queue_positional", nargs="?", metavar="QUEUE", help="the queue (or --queue)")
    inspect_.add_argument("--queue", help="the queue (or QUEUE)")
    inspect_.add_argument("--message", help="a message id: show this message instead of the queue")
    inspect_.add_argument("--body", action="store_true", help="with --message: include the message body")
    inspect_.set_defaults(func=inspect)

    poison = sub.add_parser("poison", help="records no command could be read from").add_subparsers(
        dest="action", required=True, metavar="VERB"
    )
    op = poison.add_parser(
        "list", parents=[common], help="poison entries: offset, reason, size, first bytes as hex (JSON)"
    )
    op.add_argument("--partition", type=partition_number, metavar="N", help="the partition (default: every partition)")
    op.add_argument(
        "--limit", type=positive, default=DEFAULTS["poison_limit"], help="most entries listed (default 100)"
    )
    op.set_defaults(func=poison_list)

    log_ = sub.add_parser("log", help="the command log").add_subparsers(dest="action", required=True, metavar="VERB")
    op = log_.add_parser(
        "truncate",
        parents=[common, locate],
        help="delete a partition's records below an offset (not past the recovery floor)",
    )
    op.add_argument("--before", type=offset, required=True, metavar="OFFSET", help="first offset to keep")
    op.set_defaults(func=log_truncate)

    payload = sub.add_parser("payload", help="large payloads in the object store").add_subparsers(
        dest="action", required=True, metavar="VERB"
    )
    op = payload.add_parser(
        "schedule", parents=[common, command], help="enqueue a file of any size: reserve, upload, attest, commit"
    )
    op.add_argument("--domain", required=True, help="the domain (partition key) of the command")
    op.add_argument("--message-id", required=True, help="the message's id, unique in the queue")
    op.add_argument("--quiet", action="store_true", help="no progress bar")
    op.add_argument("queue", help="the queue")
    op.add_argument("file", help="the file whose bytes are the message body")
    op.set_defaults(func=payload_schedule)
    op = payload.add_parser("get", parents=[common], help="copy a large message's payload into a file")
    op.add_argument("--domain", required=True, help="the domain (partition key) of the message")
    op.add_argument("--out", required=True, metavar="PATH", help="the file written")
    op.add_argument("queue", help="the queue")
    op.add_argument("message_id", help="the message's id")
    op.set_defaults(func=payload_get)

    gc = sub.add_parser("gc", help="guarded deletion of payload objects").add_subparsers(
        dest="action", required=True, metavar="VERB"
    )
    op = gc.add_parser("status", parents=[common], help="floors, retention tasks and what blocks each deletion")
    op.add_argument("--partition", type=partition_number, metavar="N", help="the partition (default: every partition)")
    op.set_defaults(func=gc_status)
    op = gc.add_parser("release-pin", parents=[common], help="release a recovery pin (see `gc status`)")
    op.add_argument("--partition", type=partition_number, required=True, metavar="N", help="the pin's partition")
    op.add_argument("--offset", type=offset, required=True, metavar="N", help="the pinned checkpoint's offset")
    op.add_argument("--session", required=True, help="the pin's session (see `gc status`)")
    op.set_defaults(func=gc_release_pin)
    op = gc.add_parser("run", parents=[common], help="run the GC worker (`keyload run` runs one itself)")
    op.add_argument("--once", action="store_true", help="one pass, then exit")
    op.add_argument(
        "--interval-s",
        type=positive_seconds,
        default=DEFAULTS["gc_interval_s"],
        help="seconds between passes (default 10)",
    )
    op.set_defaults(func=gc_run)


def add_keys_add(keys: Any, common: argparse.ArgumentParser) -> None:
    op = keys.add_parser("add", parents=[common], help="add a new random key to the keyring file")
    op.add_argument("key_id", help="the new key's id")
    op.set_defaults(func=keys_add)


def _add_run(sub: Any, common: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    run_ = sub.add_parser("run", parents=[common], help="run the processors (and ticker) over the data directory")
    run_.add_argument(
        "--partitions",
        type=positive,
        default=d["partitions"],
        help=f"partition count when creating a data directory (default {d['partitions']})",
    )
    run_.add_argument(
        "--tick-interval-ms",
        type=positive,
        default=d["tick_interval_ms"],
        help=f"milliseconds between ticks that fire due timers (default {d['tick_interval_ms']})",
    )
    run_.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=os.environ.get(d["listen_env"], d["listen"]),
        help=f"serve the HTTP API here (port 0 picks a free one, written to DATA/server.json), "
        f"or 'none' (default ${d['listen_env']}, else {d['listen']})",
    )
    run_.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate (and --tls-key)")
    run_.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert")
    run_.add_argument(
        "--max-connections",
        type=positive,
        metavar="N",
        help="HTTP connections served at once, one more answered 503 (default and highest: the lesser of "
        "10,000 and half the open-file limit)",
    )
    run_.add_argument(
        "--workers",
        type=positive,
        default=d["workers"],
        help=f"processes serving the embedded log's partitions, 1..partitions: worker w serves partitions "
        f"p %% N == w, worker 0 is this one, with the HTTP API (default {d['workers']})",
    )
    run_.add_argument("--until-idle", action="store_true", help="exit once every partition is caught up (embedded)")
    run_.add_argument(
        "--fail-fast",
        action="store_true",
        help="exit non-zero when a write fails (a full disk) instead of retrying with back-off until it succeeds",
    )
    run_.add_argument("--kafka", metavar="BOOTSTRAP", help="use Kafka as the log (recorded when creating --data)")
    run_.add_argument(
        "--topic-prefix", default="keyload", help="Kafka topics PREFIX.commands|outcomes|checkpoints (default keyload)"
    )
    run_.add_argument("--replication-factor", type=positive, default=1, help="of new Kafka topics (default 1)")
    run_.add_argument("--min-insync-replicas", type=positive, default=1, help="of new Kafka topics (default 1)")
    run_.add_argument(
        "--object-store",
        metavar="FOLDER|s3://BUCKET[/PREFIX]",
        help="object store when creating --data (default DATA/objects); S3 credentials: the AWS_* environment",
    )
    run_.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint of an s3:// --object-store (default AWS)")
    run_.add_argument("--s3-region", metavar="NAME", help="S3 region of an s3:// --object-store")
    run_.add_argument("--keyring-from", type=Path, metavar="PATH", help="copy this keyring file when creating --data")
    run_.add_argument(
        "--segment-bytes",
        type=positive,
        help="the embedded command log's segment size in bytes, fixed when creating --data (default 64 MiB)",
    )
    run_.add_argument(
        "--session-timeout-ms",
        type=positive,
        default=d["session_timeout_ms"],
        help="Kafka group session timeout in milliseconds: how soon a dead processor's partitions move "
        f"(default {d['session_timeout_ms']})",
    )
    run_.add_argument(
        "--checkpoint-every",
        type=positive,
        default=d["checkpoint_every"],
        help=f"checkpoint after this many records applied since the newest published checkpoint "
        f"(default {d['checkpoint_every']})",
    )
    run_.add_argument(
        "--checkpoint-interval-s",
        type=positive_seconds,
        default=d["checkpoint_interval_s"],
        help=f"or this many seconds after the last checkpoint (default {d['checkpoint_interval_s']:g})",
    )
    run_.add_argument(
        "--checkpoint-retain",
        type=positive,
        default=d["checkpoint_retain"],
        help=f"checkpoints kept per partition (default {d['checkpoint_retain']})",
    )
    run_.add_argument(
        "--gc-interval-s",
        type=seconds,
        help=f"embedded: run a GC worker pass this often, in seconds (default {d['gc_interval_s']:g}; 0: none, run "
        "`keyload gc run` instead; on Kafka only 0: run `keyload gc run` beside the processors)",
    )
    run_.add_argument(
        "--projection-cache-mib",
        type=positive,
        default=d["projection_cache_mib"],
        help=f"the block cache every projection of the process shares, in MiB (default {d['projection_cache_mib']})",
    )
    run_.add_argument(
        "--projection-memtable-mib",
        type=positive,
        default=d["projection_memtable_mib"],
        help="a projection's memtable, in MiB; each open projection holds at most two "
        f"(default {d['projection_memtable_mib']})",
    )
    run_.set_defaults(func=run)


def env_data() -> str:
    return os.environ.get("KEYLOAD_DATA", "keyload-data")


__all__ = ["add_keys_add", "add_parsers", "env_data", "wants_json"]
