"""The `keyload` command line: run the embedded service, submit commands, operate partitions."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from threading import Event
from typing import Any, Literal, TypeVar

from tqdm import tqdm

from keyload.errors import CommandRejected, KeyloadError
from keyload.log.base import CommandLog, LogCorruption, LogError, partition_for
from keyload.operations.catalog import RecoveryPin
from keyload.operations.checkpoints import (
    DEFAULT_CHECKPOINT_EVERY_RECORDS,
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_RETAINED_CHECKPOINTS,
    CheckpointError,
    CheckpointPolicy,
    Checkpoints,
)
from keyload.operations.gc import DEFAULT_GC_INTERVAL_S, GcWorker, run_worker
from keyload.operations.recovery import drill, replay, restore
from keyload.processors.policy import (
    ENUM_FIELDS,
    GROUP_ENUM_FIELDS,
    GROUP_INTEGER_FIELDS,
    INTEGER_FIELDS,
    SUBLIMIT_FIELDS,
    TOPIC_INTEGER_FIELDS,
)
from keyload.projections.store import NO_OFFSET, Store, StoreError
from keyload.sdk.client import DEFAULT_POISON_LIMIT, DEFAULT_TIMEOUT_S, Client, poison_rows
from keyload.sdk.results import Event as TopicEvent
from keyload.sdk.results import GroupPolicy, QueuePolicy, TopicPolicy
from keyload.service.embedded import ServiceSettings, serve
from keyload.service.halts import Halt, recorded_halts
from keyload.service.kafka import DEFAULT_SESSION_TIMEOUT_MS
from keyload.service.ticker import DEFAULT_TICK_INTERVAL_MS
from keyload.storage import keyring
from keyload.storage.datadir import (
    DEFAULT_PARTITIONS,
    DataDir,
    FileStoreConfig,
    KafkaConfig,
    ObjectStoreConfig,
    S3StoreConfig,
)

DEFAULT_DATA = "keyload-data"
CHECKPOINT_WAIT_S = 30.0
MAX_STATUS_PAGES = 100  # retention pages `gc status` reads per partition
EXIT_FAILED = 1
EXIT_USAGE = 2

P = TypeVar("P")


class UsageError(KeyloadError):
    """Bad command-line input: one line to the user, exit 2."""


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_jsonable(value), indent=2, sort_keys=False))


def _client(args: argparse.Namespace) -> Client:
    return Client(args.data, principal=args.principal, timeout_s=args.timeout)


# -- run ------------------------------------------------------------------------------------


def _stop_on_signals() -> Event:
    stop = Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _object_store(args: argparse.Namespace) -> ObjectStoreConfig | None:
    """`--object-store`: a folder, or s3://BUCKET[/PREFIX] with `--s3-endpoint` / `--s3-region`."""
    store: str | None = args.object_store
    if store is None or not store.startswith("s3://"):
        if args.s3_endpoint is not None or args.s3_region is not None:
            raise UsageError("--s3-endpoint and --s3-region need --object-store s3://BUCKET[/PREFIX]")
        return None if store is None else FileStoreConfig(Path(store))
    bucket, _, prefix = store.removeprefix("s3://").partition("/")
    if not bucket:
        raise UsageError("--object-store s3://BUCKET[/PREFIX] needs a bucket")
    return S3StoreConfig(bucket, prefix.strip("/"), args.s3_endpoint, args.s3_region)


def cmd_run(args: argparse.Namespace) -> int:
    # keyload's own warnings and errors (halts, poison, stalls); libraries' chatter stays out of the output.
    logging.basicConfig(level=logging.WARNING, format="keyload: %(message)s", stream=sys.stderr)
    kafka = None
    if args.kafka is not None:
        kafka = KafkaConfig(args.kafka, args.topic_prefix, args.replication_factor, args.min_insync_replicas)
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
        tick_interval_ms=args.tick_interval_ms,
        gc_interval_s=args.gc_interval_s,
        session_timeout_ms=args.session_timeout_ms,
        until_idle=args.until_idle,
        fail_fast=args.fail_fast,
    )
    halts = serve(data, settings, _stop_on_signals())
    return EXIT_FAILED if halts else 0


# -- queues and messages ---------------------------------------------------------------------


def _policy(args: argparse.Namespace, kind: Callable[..., P], names: Iterable[str]) -> P:
    return kind(**{name: getattr(args, name) for name in names})


def _queue_policy(args: argparse.Namespace) -> QueuePolicy:
    return _policy(args, QueuePolicy, (f.name for f in fields(QueuePolicy)))


def cmd_queue_create(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print_json(client.create_queue(args.domain, args.queue, _queue_policy(args), command_id=args.command_id))
    return 0


def cmd_queue_configure(args: argparse.Namespace) -> int:
    with _client(args) as client:
        view = client.configure_queue(
            args.domain,
            args.queue,
            _queue_policy(args),
            expected_policy_version=args.expected_policy_version,
            command_id=args.command_id,
        )
        _print_json(view)
    return 0


def _headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--header must be NAME=VALUE, got {pair!r}")
        headers[name] = value
    return headers


def _body(args: argparse.Namespace) -> bytes:
    if (args.body is None) == (args.body_file is None):
        raise UsageError("give exactly one of --body or --body-file")
    return args.body.encode("utf-8") if args.body is not None else Path(args.body_file).read_bytes()


def cmd_enqueue(args: argparse.Namespace) -> int:
    body = _body(args)
    with _client(args) as client:
        result = client.enqueue(
            args.domain,
            args.queue,
            body,
            message_id=args.message_id,
            headers=_headers(args.header),
            ordering_key=args.ordering_key,
            not_before_ms=args.not_before_ms,
            expires_at_ms=args.expires_at_ms,
            command_id=args.command_id,
        )
        _print_json(result)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.message is None:
            _print_json(client.inspect_queue(args.domain, args.queue))
        else:
            _print_json(client.inspect_message(args.domain, args.queue, args.message, include_body=args.body))
    return 0


# -- topics ---------------------------------------------------------------------------------


def cmd_topic_create(args: argparse.Namespace) -> int:
    policy = _policy(args, TopicPolicy, TOPIC_INTEGER_FIELDS)
    with _client(args) as client:
        _print_json(client.create_topic(args.domain, args.topic, policy, command_id=args.command_id))
    return 0


def cmd_topic_inspect(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print_json(client.inspect_topic(args.domain, args.topic))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    body = _body(args)
    command_id = args.command_id or str(uuid.uuid4())
    event = TopicEvent(args.event_id or command_id, args.type, body, _headers(args.header))
    with _client(args) as client:
        _print_json(client.publish(args.domain, args.topic, [event], command_id=command_id))
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    with _client(args) as client:
        page = client.read_topic(
            args.domain,
            args.topic,
            args.from_position,
            cursor=args.cursor,
            max_events=args.max_events,
            max_bytes=args.max_bytes,
        )
        _print_json(page)
    return 0


def cmd_topic_purge(args: argparse.Namespace) -> int:
    with _client(args) as client:
        view = client.purge_topic(
            args.domain,
            args.topic,
            args.through,
            expected_generation=args.expected_generation,
            command_id=args.command_id,
        )
        _print_json(view)
    return 0


# -- subscription groups ----------------------------------------------------------------------


def _group_position(text: str) -> Literal["beginning", "end"] | int:
    if text in ("beginning", "end"):
        return "beginning" if text == "beginning" else "end"
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f'expected "beginning", "end" or a position, got {text!r}')
    return int(text)


def _group_policy(args: argparse.Namespace) -> GroupPolicy | None:
    """The policy options given, or None when none is (configure then keeps the group's policy)."""
    policy = _policy(args, GroupPolicy, (*GROUP_INTEGER_FIELDS, *GROUP_ENUM_FIELDS))
    return None if policy == GroupPolicy() else policy


def cmd_group_create(args: argparse.Namespace) -> int:
    with _client(args) as client:
        view = client.create_group(
            args.domain,
            args.topic,
            args.group,
            event_types=args.event_type,
            headers=_headers(args.header),
            start=args.start,
            policy=_group_policy(args),
            command_id=args.command_id,
        )
        _print_json(view)
    return 0


def cmd_group_configure(args: argparse.Namespace) -> int:
    given_filter = bool(args.event_type or args.header)
    with _client(args) as client:
        view = client.configure_group(
            args.domain,
            args.topic,
            args.group,
            expected_generation=args.expected_generation,
            event_types=args.event_type if given_filter else None,
            headers=_headers(args.header) if given_filter else None,
            policy=_group_policy(args),
            command_id=args.command_id,
        )
        _print_json(view)
    return 0


def cmd_group_seek(args: argparse.Namespace) -> int:
    with _client(args) as client:
        view = client.seek_group(
            args.domain,
            args.topic,
            args.group,
            args.to,
            expected_generation=args.expected_generation,
            command_id=args.command_id,
        )
        _print_json(view)
    return 0


def cmd_group_simple(args: argparse.Namespace) -> int:
    """status, pause, resume: name the group, print its view."""
    with _client(args) as client:
        act = {"status": client.group_status, "pause": client.pause_group, "resume": client.resume_group}[args.action]
        _print_json(act(args.domain, args.topic, args.group, command_id=args.command_id))
    return 0


def cmd_group_receive(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.group_receive(
            args.domain,
            args.topic,
            args.group,
            max_events=args.max_events,
            max_bytes=args.max_bytes,
            lease_ms=args.lease_ms,
            wait_ms=args.wait_ms,
            command_id=args.command_id,
        )
        _print_json(result)
    return 0


def cmd_group_ack(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if len(args.token) == 1:
            _print_json(
                client.group_ack(args.domain, args.topic, args.group, args.token[0], command_id=args.command_id)
            )
            return 0
        result = client.group_ack_batch(args.domain, args.topic, args.group, args.token, command_id=args.command_id)
        _print_json(result)
        return 0 if all(r.status == "committed" for r in result.results) else EXIT_FAILED


def cmd_group_nack(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.group_nack(
            args.domain, args.topic, args.group, args.token, delay_ms=args.delay_ms, command_id=args.command_id
        )
        _print_json(result)
    return 0


def cmd_group_renew(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.group_renew(
            args.domain, args.topic, args.group, args.token, lease_ms=args.lease_ms, command_id=args.command_id
        )
        _print_json(result)
    return 0


# -- leases and dead letters -----------------------------------------------------------------


def cmd_receive(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.receive(
            args.domain,
            args.queue,
            max_messages=args.max_messages,
            max_bytes=args.max_bytes,
            lease_ms=args.lease_ms,
            wait_ms=args.wait_ms,
            command_id=args.command_id,
        )
        _print_json(result)
    return 0


def cmd_renew(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print_json(client.renew(args.domain, args.token, lease_ms=args.lease_ms, command_id=args.command_id))
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if len(args.token) == 1:
            _print_json(client.ack(args.domain, args.token[0], command_id=args.command_id))
            return 0
        result = client.ack_batch(args.domain, args.token, command_id=args.command_id)
        _print_json(result)
        return 0 if all(r.status == "committed" for r in result.results) else EXIT_FAILED


def cmd_nack(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print_json(client.nack(args.domain, args.token, delay_ms=args.delay_ms, command_id=args.command_id))
    return 0


def cmd_dlq_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        page = client.list_dead_letters(
            args.domain, args.queue, after_sequence=args.after, limit=args.limit, include_body=args.body
        )
        _print_json(page)
    return 0


def cmd_operate(args: argparse.Namespace) -> int:
    with _client(args) as client:
        operation = {"redrive": client.redrive, "cancel": client.cancel, "park": client.park_pending}[args.operation]
        view = operation(
            args.domain,
            args.queue,
            args.message_id,
            expected_state_version=args.state_version,
            expected_delivery_generation=args.generation,
            command_id=args.command_id,
        )
        _print_json(view)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        view = client.inspect_queue(args.domain, args.queue)
    counters = asdict(view.counters)
    width = max(len(name) for name in counters)
    print(f"{args.domain}/{args.queue} (policy version {view.policy_version})")
    for name, value in counters.items():
        print(f"  {name:<{width}}  {value}")
    return 0


def cmd_keys_add(args: argparse.Namespace) -> int:
    data = DataDir.open(args.data)
    keyring.add(data.root, args.key_id)
    print(f"added key {args.key_id!r} to {data.root / keyring.FILE}; activate it with `keyload keys rotate`")
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    with _client(args) as client:
        partitions = range(client.data.partitions) if args.partition is None else [args.partition]
        for partition in partitions:
            active = client.rotate_keys(partition, token_key_id=args.token_key, jitter_key_id=args.jitter_key)
            print(f"p{partition}: token key {active.token_key_id}, jitter key {active.jitter_key_id}")
    return 0


# -- operations -----------------------------------------------------------------------------


def _partition(args: argparse.Namespace, data: DataDir) -> int:
    if (args.partition is None) == (args.domain is None):
        raise UsageError("give exactly one of --partition or --domain")
    partition: int = args.partition if args.domain is None else partition_for(args.domain, data.partitions)
    data.check_partition(partition)
    return partition


def cmd_checkpoint(args: argparse.Namespace) -> int:
    with _client(args) as client:
        partition = _partition(args, client.data)
        offset = client.request_checkpoint(partition).offset
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
    print(f"checkpoint of partition {partition} at offset {offset}: published as {entry.object_prefix}")
    print(f"digest {entry.manifest.digest}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    data = DataDir.open(args.data)
    partition = _partition(args, data)
    replayed = replay(data, partition, Path(args.into), args.from_offset, args.to_offset, progress=not args.quiet)
    print(
        f"replayed partition {partition} into {args.into}: offset {replayed.applied_offset}, digest {replayed.digest}"
    )
    return 0


def _checkpoint_offset(choice: str | None, data: DataDir, partition: int) -> int | None:
    """The offset named by --from-checkpoint: None (offset 0), 'latest', or a number."""
    if choice is None:
        return None
    if choice == "latest":
        with data.checkpoints() as checkpoints:
            latest = checkpoints.latest(partition)
        if latest is None:
            raise UsageError(f"partition {partition} has no checkpoint; take one with `keyload checkpoint`")
        return latest.offset
    if not choice.isdigit():
        raise UsageError("--from-checkpoint must be 'latest' or a checkpoint offset")
    return int(choice)


def cmd_drill(args: argparse.Namespace) -> int:
    data = DataDir.open(args.data)
    partition = _partition(args, data)
    start = _checkpoint_offset(args.from_checkpoint, data, partition)
    with tempfile.TemporaryDirectory(prefix="keyload-drill-") as scratch:
        report = drill(data, partition, Path(scratch) / "projection", start, progress=not args.quiet)
    verdict = "PASS" if report.passed else "FAIL"
    print(f"drill partition {report.partition} from {report.start}: {verdict}")
    print(f"  live    offset {report.live_offset}  digest {report.live_digest}")
    print(f"  replay  offset {report.replay_offset}  digest {report.replay_digest}")
    return 0 if report.passed else EXIT_FAILED


def cmd_restore(args: argparse.Namespace) -> int:
    data = DataDir.open(args.data)
    partition = _partition(args, data)
    with tempfile.TemporaryDirectory(prefix="keyload-restore-", dir=data.root) as scratch:
        restored = restore(data, partition, Path(scratch), progress=not args.quiet)
    print(f"restored partition {restored.partition} from {restored.start}: applied through {restored.applied_offset}")
    print(f"  digest {restored.digest}")
    if restored.retired:
        print(f"  retired checkpoints the log cannot reproduce: {', '.join(map(str, restored.retired))}")
    if restored.kept_aside is not None:
        print(f"  the replaced projection is kept at {restored.kept_aside}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """One line per partition; a partition that cannot be read is reported as such and the others follow."""
    data = DataDir.open(args.data)
    log = data.command_log()
    checkpoints = data.checkpoints()
    halts = recorded_halts(data.root)
    try:
        print(f"{data.root}: {data.describe_log()}, {data.partitions} partitions, ", end="")
        print(f"{data.outcome_partitions} outcome partitions")
        for partition in range(data.partitions):
            print(f"  p{partition}: {_partition_status(data, log, checkpoints, partition, halts.get(partition))}")
    finally:
        log.close()
        checkpoints.close()
    return 0


def _partition_status(
    data: DataDir, log: CommandLog, checkpoints: Checkpoints, partition: int, halt: Halt | None
) -> str:
    """`log A..B, applied through N, lag L, checkpoints [...], recovery floor F, poison P`, then any trouble."""
    trouble = [] if halt is None else [f"HALTED at offset {halt.offset}: {halt.reason}"]
    end: int | None = None
    try:
        start, end = log.start_offset(partition), log.end_offset(partition)
        span = f"log {start}..{end - 1}" if end > start else "log empty" if start == 0 else f"log empty from {start}"
    except LogError as exc:
        span = "log unreadable"
        trouble.append(f"{'LOG CORRUPT' if isinstance(exc, LogCorruption) else 'LOG UNREADABLE'}: {exc}")
    applied: int | None = NO_OFFSET
    poison: int | None = 0
    if data.projection(partition).is_dir():  # absent until `keyload run` first serves the partition
        try:
            store = Store(data.projection(partition), read_only=True)
        except StoreError as exc:
            applied = poison = None
            trouble.append(f"PROJECTION UNREADABLE: {exc}")
        else:
            try:
                applied = store.applied_offset
                poison = sum(1 for _ in poison_rows(store))
            finally:
                store.close()
    if applied is None:
        parts = [span, "applied unknown", "lag unknown"]
    else:
        parts = [span, "applied nothing" if applied == NO_OFFSET else f"applied through {applied}"]
        behind = None if end is None else end - 1 - applied
        parts.append(
            "lag unknown" if behind is None else f"lag {behind}" if behind >= 0 else f"{-behind} ahead of the log"
        )
    try:
        published = [entry.offset for entry in checkpoints.entries(partition)]
    except KeyloadError as exc:
        parts += ["checkpoints unknown", "recovery floor unknown"]
        trouble.append(f"CATALOG UNREADABLE: {exc}")
    else:
        parts.append(f"checkpoints {published}" if published else "no checkpoints")
        parts.append(f"recovery floor {published[0]}" if published else "recovery floor none")
    parts.append("poison unknown" if poison is None else f"poison {poison}")
    return ", ".join(parts + trouble)


def cmd_poison_list(args: argparse.Namespace) -> int:
    """Records no command could be read from, per partition in offset order: JSON like every listing."""
    with Client(args.data, principal=args.principal, timeout_s=args.timeout) as client:
        entries = client.poison_entries(args.partition, limit=args.limit)
    _print_json(
        [
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
    )
    return 0


def cmd_log_truncate(args: argparse.Namespace) -> int:
    """Delete a partition's records below an offset, never past the recovery floor."""
    data = DataDir.open(args.data)
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
    log = data.command_log()
    try:
        start = log.truncate_before(partition, args.before)
    finally:
        log.close()
    print(f"partition {partition}: log now starts at offset {start} (recovery floor {floor})")
    return 0


# -- parser ---------------------------------------------------------------------------------


def _add_integer_options(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    for name in names:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, metavar="N")


def _add_policy_options(parser: argparse.ArgumentParser) -> None:
    _add_integer_options(parser, (*INTEGER_FIELDS, *SUBLIMIT_FIELDS))
    for name, choices in ENUM_FIELDS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, choices=choices)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


# -- documents and inboxes ------------------------------------------------------------------


def cmd_doc(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "put":
            result: Any = client.put_document(
                args.domain, args.key, _body(args), expected_revision=args.expected_revision, command_id=args.command_id
            )
        elif args.action == "delete":
            result = client.delete_document(
                args.domain, args.key, expected_revision=args.expected_revision, command_id=args.command_id
            )
        elif args.action == "get":
            result = client.get_document(args.domain, args.key)
        else:
            result = client.list_documents(
                args.domain, args.prefix, after=args.after, max_documents=args.max_documents, max_bytes=args.max_bytes
            )
        _print_json(result)
    return 0


def cmd_inbox_configure(args: argparse.Namespace) -> int:
    with _client(args) as client:
        view = client.configure_inbox(
            args.domain, max_receipts=args.max_receipts, max_bytes=args.max_bytes, command_id=args.command_id
        )
        _print_json(view)
    return 0


def cmd_payload_schedule(args: argparse.Namespace) -> int:
    source = Path(args.file)
    with (
        _client(args) as client,
        tqdm(total=source.stat().st_size, unit="B", unit_scale=True, disable=args.quiet) as bar,
    ):

        def progress(done: int, _total: int) -> None:
            bar.update(done - bar.n)

        reservation = client.schedule_large(
            args.domain, args.queue, source, message_id=args.message_id, progress=progress, request_id=args.command_id
        )
    _print_json(reservation)
    return 0


def cmd_payload_get(args: argparse.Namespace) -> int:
    """An operator's read of a message's payload: straight from the object store, no handle."""
    with _client(args) as client:
        view = client.inspect_message(args.domain, args.queue, args.message_id)
        payload = view.meta.payload
        if payload is None:
            raise UsageError("the message has no large payload (inspect shows its inline body)")
        stored = client.data.object_store().get(payload.object_key, Path(args.out), payload.object_version)
    print(f"wrote {stored.length} bytes of {payload.object_key} version {stored.version} to {args.out}")
    return 0


def cmd_gc_status(args: argparse.Namespace) -> int:
    """Each partition's recovery floor (logged and in the catalog), tasks and what blocks them."""
    with _client(args) as client, client.data.checkpoints() as checkpoints:
        partitions = range(client.data.partitions) if args.partition is None else [args.partition]
        report = []
        for partition in partitions:
            client.data.check_partition(partition)
            pages, after = [], None
            for _ in range(MAX_STATUS_PAGES):
                page = client.list_retention(partition, after_task=after)
                pages.append(page)
                after = page.next_after_task
                if after is None:
                    break
            report.append(
                {
                    "partition": partition,
                    "logged_recovery_floor": pages[0].recovery_floor,
                    "catalog_recovery_floor": checkpoints.floor(partition),
                    "pins": [asdict(pin) for pin in checkpoints.catalog.pins(partition)],
                    "retired_identities": pages[0].retired_identities,
                    "tasks": [
                        dict(_jsonable(status.task), blocked_by=status.blocked_by)
                        for page in pages
                        for status in page.tasks
                    ],
                }
            )
    _print_json(report)
    return 0


def cmd_gc_run(args: argparse.Namespace) -> int:
    with _client(args) as client, client.data.checkpoints() as checkpoints, GcWorker(client, checkpoints) as worker:
        if args.once:
            _print_json(worker.run_once())
            return 0
        print(f"keyload gc: collecting {client.data.root} every {args.interval_s:g} s", flush=True)
        run_worker(worker, _stop_on_signals(), args.interval_s, report=lambda done: _print_json(done))
    return 0


def cmd_gc_release_pin(args: argparse.Namespace) -> int:
    """Release a recovery pin a restore left behind (a process killed while restoring keeps its pin)."""
    data = DataDir.open(args.data)
    data.check_partition(args.partition)
    with data.checkpoints() as checkpoints:
        checkpoints.catalog.release(RecoveryPin(args.partition, args.offset, args.session))
    print(f"released the pin of {args.session} on partition {args.partition}'s checkpoint at offset {args.offset}")
    return 0


def _add_payload_parsers(sub: Any, common: argparse.ArgumentParser, command: argparse.ArgumentParser) -> None:
    payload = sub.add_parser("payload", help="large payloads in the object store").add_subparsers(
        dest="action", required=True
    )
    schedule = payload.add_parser(
        "schedule", parents=[common, command], help="enqueue a file of any size: reserve, upload, attest, commit"
    )
    schedule.add_argument("--domain", required=True)
    schedule.add_argument("--message-id", required=True)
    schedule.add_argument("--quiet", action="store_true", help="no progress bar")
    schedule.add_argument("queue")
    schedule.add_argument("file")
    schedule.set_defaults(func=cmd_payload_schedule)
    get = payload.add_parser("get", parents=[common], help="copy a large message's payload into a file")
    get.add_argument("--domain", required=True)
    get.add_argument("--out", required=True)
    get.add_argument("queue")
    get.add_argument("message_id")
    get.set_defaults(func=cmd_payload_get)
    gc = sub.add_parser("gc", help="guarded deletion of payload objects").add_subparsers(dest="action", required=True)
    status = gc.add_parser("status", parents=[common], help="floors, retention tasks and what blocks each deletion")
    status.add_argument("--partition", type=int)
    status.set_defaults(func=cmd_gc_status)
    release = gc.add_parser("release-pin", parents=[common], help="release a recovery pin (see `gc status`)")
    release.add_argument("--partition", type=int, required=True)
    release.add_argument("--offset", type=int, required=True)
    release.add_argument("--session", required=True)
    release.set_defaults(func=cmd_gc_release_pin)
    run = gc.add_parser("run", parents=[common], help="run the GC worker (`keyload run` runs one itself)")
    run.add_argument("--once", action="store_true", help="one pass, then exit")
    run.add_argument("--interval-s", type=float, default=DEFAULT_GC_INTERVAL_S)
    run.set_defaults(func=cmd_gc_run)


def _add_document_parsers(sub: Any, common: argparse.ArgumentParser, command: argparse.ArgumentParser) -> None:
    doc = sub.add_parser("doc", help="documents: key → value with a revision").add_subparsers(
        dest="action", required=True
    )
    put = doc.add_parser("put", parents=[common, command], help="write a document")
    put.add_argument("--body")
    put.add_argument("--body-file")
    delete = doc.add_parser("delete", parents=[common, command], help="delete a document")
    for parser in (put, delete):
        parser.add_argument(
            "--expected-revision", type=int, help="write only at this revision (0: only if absent); default: any"
        )
    get = doc.add_parser("get", parents=[common], help="show a document")
    for parser in (put, delete, get):
        parser.add_argument("--domain", required=True)
        parser.add_argument("key")
    listing = doc.add_parser("list", parents=[common], help="list documents by key prefix, in key order")
    listing.add_argument("--domain", required=True)
    listing.add_argument("prefix", nargs="?", default="")
    listing.add_argument("--after", help="read on: the page's next_after")
    listing.add_argument("--max-documents", type=_positive)
    listing.add_argument("--max-bytes", type=_positive)
    for parser in (put, delete, get, listing):
        parser.set_defaults(func=cmd_doc)
    inbox = sub.add_parser("inbox", help="a domain's target inbox").add_subparsers(dest="action", required=True)
    configure = inbox.add_parser("configure", parents=[common, command], help="accept CommitInbox within a policy")
    configure.add_argument("--domain", required=True)
    configure.add_argument("--max-receipts", type=_positive, required=True)
    configure.add_argument("--max-bytes", type=_positive, required=True)
    configure.set_defaults(func=cmd_inbox_configure)


def _add_group_parsers(sub: Any, common: argparse.ArgumentParser, command: argparse.ArgumentParser) -> None:
    group = sub.add_parser("group", help="subscription groups of a topic").add_subparsers(dest="action", required=True)

    def named(action: str, text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = group.add_parser(action, parents=[common, command], help=text)
        parser.add_argument("--domain", required=True)
        parser.add_argument("--topic", required=True)
        parser.add_argument("group")
        return parser

    def definition(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--event-type", action="append", default=[], help="deliver only these types (repeat)")
        parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="required header")
        _add_integer_options(parser, GROUP_INTEGER_FIELDS)
        for name, choices in GROUP_ENUM_FIELDS.items():
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, choices=choices)

    create = named("create", "create a group")
    definition(create)
    create.add_argument("--start", type=_group_position, default="beginning", help="beginning, end or a position")
    create.set_defaults(func=cmd_group_create)
    configure = named("configure", "change a paused group's filter (replaced whole) or policy")
    definition(configure)
    configure.add_argument("--expected-generation", type=int, required=True)
    configure.set_defaults(func=cmd_group_configure)
    seek = named("seek", "make a position the next delivered; leaves the group paused")
    seek.add_argument("--to", type=_group_position, required=True, help="beginning, end or a position")
    seek.add_argument("--expected-generation", type=int)
    seek.set_defaults(func=cmd_group_seek)
    for action, text in (
        ("status", "checkpoint, issued, outstanding, parked and lag"),
        ("pause", "stop deliveries"),
        ("resume", "resume deliveries"),
    ):
        named(action, text).set_defaults(func=cmd_group_simple)
    receive = named("receive", "lease the next matching events")
    receive.add_argument("--max-events", type=_positive)
    receive.add_argument("--max-bytes", type=_positive)
    receive.add_argument("--lease-ms", type=_positive)
    receive.add_argument("--wait-ms", type=int, help="long poll: wait up to this long (≤ 20000) for an event")
    receive.set_defaults(func=cmd_group_receive)
    ack = named("ack", "complete deliveries (several tokens: one batch)")
    ack.add_argument("token", nargs="+")
    ack.set_defaults(func=cmd_group_ack)
    nack = named("nack", "give a delivery back for retry")
    nack.add_argument("token")
    nack.add_argument("--delay-ms", type=int)
    nack.set_defaults(func=cmd_group_nack)
    renew = named("renew", "extend a delivery's lease")
    renew.add_argument("token")
    renew.add_argument("--lease-ms", type=_positive)
    renew.set_defaults(func=cmd_group_renew)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data",
        default=os.environ.get("KEYLOAD_DATA", DEFAULT_DATA),
        help="data directory (default: $KEYLOAD_DATA or ./keyload-data)",
    )
    common.add_argument("--principal", default="anonymous")
    common.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for an outcome")
    command = argparse.ArgumentParser(add_help=False)
    command.add_argument("--command-id", help="stable id for retries (default: a new UUID)")

    parser = argparse.ArgumentParser(prog="keyload", description="keyload: durable messaging on an event-sourced log")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", parents=[common], help="run the processors (and ticker) over the data directory")
    run.add_argument(
        "--partitions",
        type=_positive,
        default=DEFAULT_PARTITIONS,
        help="partition count when creating a data directory",
    )
    run.add_argument("--tick-interval-ms", type=_positive, default=DEFAULT_TICK_INTERVAL_MS)
    run.add_argument("--until-idle", action="store_true", help="exit once every partition is caught up (embedded)")
    run.add_argument(
        "--fail-fast",
        action="store_true",
        help="exit non-zero when a write fails (a full disk) instead of retrying with back-off until it succeeds",
    )
    run.add_argument("--kafka", metavar="BOOTSTRAP", help="use Kafka as the log (recorded when creating --data)")
    run.add_argument("--topic-prefix", default="keyload", help="Kafka topics PREFIX.commands|outcomes|checkpoints")
    run.add_argument("--replication-factor", type=_positive, default=1, help="of new Kafka topics")
    run.add_argument("--min-insync-replicas", type=_positive, default=1, help="of new Kafka topics")
    run.add_argument(
        "--object-store",
        metavar="FOLDER|s3://BUCKET[/PREFIX]",
        help="object store when creating --data (default DATA/objects); S3 credentials: the AWS_* environment",
    )
    run.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint of an s3:// --object-store (default AWS)")
    run.add_argument("--s3-region", metavar="NAME", help="S3 region of an s3:// --object-store")
    run.add_argument("--keyring-from", type=Path, help="copy this keyring file when creating --data")
    run.add_argument(
        "--segment-bytes",
        type=_positive,
        help="the embedded command log's segment size in bytes, fixed when creating --data (default 64 MiB)",
    )
    run.add_argument(
        "--session-timeout-ms",
        type=_positive,
        default=DEFAULT_SESSION_TIMEOUT_MS,
        help="Kafka group session timeout: how soon a dead processor's partitions move",
    )
    run.add_argument("--checkpoint-every", type=_positive, default=DEFAULT_CHECKPOINT_EVERY_RECORDS, help="records")
    run.add_argument("--checkpoint-interval-s", type=float, default=DEFAULT_CHECKPOINT_INTERVAL_S)
    run.add_argument("--checkpoint-retain", type=_positive, default=DEFAULT_RETAINED_CHECKPOINTS)
    run.add_argument(
        "--gc-interval-s",
        type=float,
        default=DEFAULT_GC_INTERVAL_S,
        help="embedded: run a GC worker pass this often (0: none; run `keyload gc run` instead)",
    )
    run.set_defaults(func=cmd_run)

    queue = sub.add_parser("queue", help="create, configure or inspect queues").add_subparsers(
        dest="action", required=True
    )
    create = queue.add_parser("create", parents=[common, command], help="create a queue")
    create.add_argument("--domain", required=True)
    create.add_argument("queue")
    _add_policy_options(create)
    create.set_defaults(func=cmd_queue_create)
    configure = queue.add_parser("configure", parents=[common, command], help="replace a queue's policy")
    configure.add_argument("--domain", required=True)
    configure.add_argument("queue")
    configure.add_argument("--expected-policy-version", type=int)
    _add_policy_options(configure)
    configure.set_defaults(func=cmd_queue_configure)

    topic = sub.add_parser("topic", help="create or inspect topics").add_subparsers(dest="action", required=True)
    topic_create = topic.add_parser("create", parents=[common, command], help="create a topic")
    topic_create.add_argument("--domain", required=True)
    topic_create.add_argument("topic")
    _add_integer_options(topic_create, TOPIC_INTEGER_FIELDS)
    topic_create.set_defaults(func=cmd_topic_create)
    topic_inspect = topic.add_parser("inspect", parents=[common], help="show a topic's retained range and counters")
    topic_inspect.add_argument("--domain", required=True)
    topic_inspect.add_argument("topic")
    topic_inspect.set_defaults(func=cmd_topic_inspect)

    topic_purge = topic.add_parser("purge", parents=[common, command], help="delete retained events up to a position")
    topic_purge.add_argument("--domain", required=True)
    topic_purge.add_argument("topic")
    topic_purge.add_argument("--through", type=int, required=True, help="last position deleted")
    topic_purge.add_argument("--expected-generation", type=int, required=True, help="the topic's current generation")
    topic_purge.set_defaults(func=cmd_topic_purge)
    _add_group_parsers(sub, common, command)
    _add_document_parsers(sub, common, command)
    _add_payload_parsers(sub, common, command)

    publish = sub.add_parser("publish", parents=[common, command], help="publish one event to a topic")
    publish.add_argument("--domain", required=True)
    publish.add_argument("--topic", required=True)
    publish.add_argument("--event-id", help="unique in the topic (default: the command id)")
    publish.add_argument("--type", required=True)
    publish.add_argument("--body")
    publish.add_argument("--body-file")
    publish.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    publish.set_defaults(func=cmd_publish)
    read = sub.add_parser("read", parents=[common], help="read a page of a topic's events in position order")
    read.add_argument("--domain", required=True)
    read.add_argument("--topic", required=True)
    start = read.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_position", type=int, help="first position (default 1)")
    start.add_argument("--cursor", help="read on where a page ended: its next_cursor")
    read.add_argument("--max-events", type=_positive)
    read.add_argument("--max-bytes", type=_positive)
    read.set_defaults(func=cmd_read)

    enqueue = sub.add_parser("enqueue", parents=[common, command], help="enqueue one message")
    enqueue.add_argument("--domain", required=True)
    enqueue.add_argument("--queue", required=True)
    enqueue.add_argument("--message-id")
    enqueue.add_argument("--body")
    enqueue.add_argument("--body-file")
    enqueue.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    enqueue.add_argument("--ordering-key")
    enqueue.add_argument("--not-before-ms", type=int)
    enqueue.add_argument("--expires-at-ms", type=int)
    enqueue.set_defaults(func=cmd_enqueue)

    inspect = sub.add_parser("inspect", parents=[common], help="show a queue's counters or one message")
    inspect.add_argument("--domain", required=True)
    inspect.add_argument("--queue", required=True)
    inspect.add_argument("--message")
    inspect.add_argument("--body", action="store_true", help="include the message body")
    inspect.set_defaults(func=cmd_inspect)

    receive = sub.add_parser("receive", parents=[common, command], help="lease ready messages")
    receive.add_argument("--domain", required=True)
    receive.add_argument("--queue", required=True)
    receive.add_argument("--max-messages", type=_positive)
    receive.add_argument("--max-bytes", type=_positive)
    receive.add_argument("--lease-ms", type=_positive)
    receive.add_argument("--wait-ms", type=int, help="long poll: wait up to this long (≤ 20000) for a message")
    receive.set_defaults(func=cmd_receive)
    renew = sub.add_parser("renew", parents=[common, command], help="extend a delivery's lease")
    renew.add_argument("--domain", required=True)
    renew.add_argument("token")
    renew.add_argument("--lease-ms", type=_positive)
    renew.set_defaults(func=cmd_renew)
    ack = sub.add_parser("ack", parents=[common, command], help="complete deliveries (several tokens: one batch)")
    ack.add_argument("--domain", required=True)
    ack.add_argument("token", nargs="+")
    ack.set_defaults(func=cmd_ack)
    nack = sub.add_parser("nack", parents=[common, command], help="give a delivery back for retry")
    nack.add_argument("--domain", required=True)
    nack.add_argument("token")
    nack.add_argument("--delay-ms", type=int)
    nack.set_defaults(func=cmd_nack)

    dlq = sub.add_parser("dlq", help="dead letters").add_subparsers(dest="action", required=True)
    dlq_list = dlq.add_parser("list", parents=[common], help="list dead-lettered messages in parked order")
    dlq_list.add_argument("--domain", required=True)
    dlq_list.add_argument("--queue", required=True)
    dlq_list.add_argument("--after", type=int, help="parked sequence to continue after")
    dlq_list.add_argument("--limit", type=_positive, default=100)
    dlq_list.add_argument("--body", action="store_true")
    dlq_list.set_defaults(func=cmd_dlq_list)
    for operation, text in (
        ("redrive", "send a dead letter back to ready"),
        ("cancel", "cancel a message (any non-terminal state)"),
        ("park", "move a pending dead letter into the dead-letter index"),
    ):
        op = sub.add_parser(operation, parents=[common, command], help=text)
        op.add_argument("--domain", required=True)
        op.add_argument("--queue", required=True)
        op.add_argument("message_id")
        op.add_argument("--state-version", type=int, required=True, help="as last seen (inspect or dlq list)")
        op.add_argument("--generation", type=int, required=True, help="delivery generation as last seen")
        op.set_defaults(func=cmd_operate, operation=operation)

    stats = sub.add_parser("stats", parents=[common], help="a queue's counters")
    stats.add_argument("--domain", required=True)
    stats.add_argument("--queue", required=True)
    stats.set_defaults(func=cmd_stats)

    keys = sub.add_parser("keys", help="keyring keys").add_subparsers(dest="action", required=True)
    keys_add = keys.add_parser("add", parents=[common], help="add a new random key to the keyring file")
    keys_add.add_argument("key_id")
    keys_add.set_defaults(func=cmd_keys_add)
    keys_rotate = keys.add_parser("rotate", parents=[common, command], help="activate keys (a logged command)")
    keys_rotate.add_argument("--partition", type=int, help="default: every partition")
    keys_rotate.add_argument("--token-key")
    keys_rotate.add_argument("--jitter-key")
    keys_rotate.set_defaults(func=cmd_keys_rotate)

    for name, func, text in (
        ("checkpoint", cmd_checkpoint, "take a checkpoint of a partition (needs `keyload run`)"),
        ("replay", cmd_replay, "rebuild a partition's projection into a directory"),
        (
            "drill",
            cmd_drill,
            "rebuild a partition in scratch space and compare digests with the live projection",
        ),
        (
            "restore",
            cmd_restore,
            "rebuild a partition's projection from the newest checkpoint the log agrees with, plus replay "
            "(the way out of RecoveryRequired; `keyload run` must be stopped)",
        ),
    ):
        op = sub.add_parser(name, parents=[common], help=text)
        op.add_argument("--partition", type=int)
        op.add_argument("--domain", help="the partition of this domain")
        op.set_defaults(func=func)
        if name == "replay":
            op.add_argument("--from-offset", type=int, default=0)
            op.add_argument("--to-offset", type=int)
            op.add_argument("--into", required=True)
        if name == "drill":
            op.add_argument(
                "--from-checkpoint",
                help="'latest' or a checkpoint offset (default: replay from offset 0)",
            )
        if name in ("replay", "drill", "restore"):
            op.add_argument("--quiet", action="store_true", help="no progress bar")

    status = sub.add_parser(
        "status", parents=[common], help="per partition: log range, applied offset, checkpoints, poison, halts"
    )
    status.set_defaults(func=cmd_status)
    poison = sub.add_parser("poison", help="records no command could be read from").add_subparsers(
        dest="action", required=True
    )
    poison_list = poison.add_parser(
        "list", parents=[common], help="poison entries: offset, reason, size, first bytes as hex (JSON)"
    )
    poison_list.add_argument("--partition", type=int, help="default: every partition")
    poison_list.add_argument("--limit", type=_positive, default=DEFAULT_POISON_LIMIT, help="most entries listed")
    poison_list.set_defaults(func=cmd_poison_list)

    log = sub.add_parser("log", help="the command log").add_subparsers(dest="action", required=True)
    truncate = log.add_parser(
        "truncate", parents=[common], help="delete a partition's records below an offset (not past the recovery floor)"
    )
    truncate.add_argument("--partition", type=int)
    truncate.add_argument("--domain", help="the partition of this domain")
    truncate.add_argument("--before", type=int, required=True, help="first offset to keep")
    truncate.set_defaults(func=cmd_log_truncate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except UsageError as exc:
        print(f"keyload: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CommandRejected as exc:
        print(f"keyload: rejected: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (KeyloadError, OSError, ValueError) as exc:  # KeyloadError: the root of every keyload error
        print(f"keyload: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
