"""Apply one log record to a partition's staged projection.

The only entry point the runtime calls. It decodes the envelope, enforces
command-id idempotency by fingerprint, authorizes, dispatches to the command's
handler inside its own child stage (so a rejection leaves nothing behind), and
stores the outcome. Undecodable records become poison entries.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from keyload import limits
from keyload.log.base import MAX_LOG_TIME_MS, MIN_LOG_TIME_MS, partition_for
from keyload.log.codec import (
    HEADER_BYTES,
    REGISTRY,
    CodecError,
    Released,
    encoded_optional_long,
    expanded_current,
    history,
)
from keyload.processors import batch, key_rotation, timers
from keyload.processors.access import authorize
from keyload.processors.context import Context
from keyload.processors.documents import document as documents
from keyload.processors.documents import inbox
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.groups import group as groups
from keyload.processors.groups import leases as group_leases
from keyload.processors.outcomes import OUTCOME, new_outcome, reject
from keyload.processors.payloads import reservations, retention
from keyload.processors.payloads import schedule as payloads
from keyload.processors.payloads.retention import RESERVATION
from keyload.processors.queues import dead_letters, leases
from keyload.processors.queues import resource as queues
from keyload.processors.topics import topic as topics
from keyload.projections import keys
from keyload.projections.store import Staged

Record = dict[str, Any]
Handler = Callable[[Staged, Record, Context], Record | None]

COMMAND = "keyload.Command"
POISON = "keyload.PoisonEntry"
FINGERPRINT_BYTES = 32
INFORMATIONAL_TAIL = ("reply_to", "client_time_ms")
OPTIONAL_VARINTS = (["null", "int"], ["null", "long"])  # encoded alike: how long the tail is


def _ends_in_informational_tail(schema: Any) -> bool:
    tail = schema["fields"][-len(INFORMATIONAL_TAIL) :]
    names = tuple(f["name"] for f in tail)
    return names == INFORMATIONAL_TAIL and all(f["type"] in OPTIONAL_VARINTS for f in tail)


# Every version's fingerprint leaves out the same tail, measured the same way.
assert all(
    _ends_in_informational_tail(schema)
    for schema in (REGISTRY.schema(COMMAND), *(released.schema for released in REGISTRY.released(COMMAND)))
)


# Where a map sits in a command body: field names, ITEMS stepping into every item of an array,
# PRESENT into the value of an optional (["null", X]) field when it is not null, BRANCH + a
# record's full name into the value of a union of several records when it is that branch
# (decoded as a (name, value) pair: a Batch's mutations).
MapPath = tuple[str, ...]
ITEMS = "[]"
PRESENT = "?"
BRANCH = "|"


def _map_paths(schema: Any, named: dict[str, Any], path: MapPath = ()) -> list[MapPath]:
    """Every map inside `schema` (a parsed schema), following records, arrays and optional values."""
    if isinstance(schema, str) and schema in named:
        return _map_paths(named[schema], named, path)
    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        if len(branches) == 1:
            return _map_paths(branches[0], named, (*path, PRESENT))
        found = []
        for branch in branches:
            name = branch if isinstance(branch, str) else branch.get("name")
            paths = _map_paths(branch, named, (*path, BRANCH + str(name)))
            assert not paths or name in named, "map inside a union branch that is not a named record"
            found += paths
        return found
    if not isinstance(schema, dict):
        return []
    if schema["type"] == "map":
        return [path]
    if schema["type"] == "array":
        return _map_paths(schema["items"], named, (*path, ITEMS))
    if schema["type"] != "record":
        return []
    named[schema["name"]] = schema
    return [found for f in schema["fields"] for found in _map_paths(f["type"], named, (*path, f["name"]))]


def _map_fields(schema: Any) -> dict[str, tuple[MapPath, ...]]:
    """Per command kind, where its body holds maps: Avro maps have no order, so the fingerprint sorts them."""
    [body] = [f for f in schema["fields"] if f["name"] == "body"]
    named: dict[str, Any] = {}
    found = {}
    for branch in body["type"]:
        paths = tuple(_map_paths(branch, named))
        if paths:
            found[branch["name"]] = paths
    return found


MAP_FIELDS = _map_fields(REGISTRY.schema(COMMAND))
CHECKPOINT_KIND = "keyload.command.Checkpoint"
TICK_KIND = "keyload.command.Tick"
# Commands that are idempotent by nature: their outcomes are published, not stored,
# so a ticker running for months does not grow the projection.
# The GC worker's commands are too: it polls ListRetention, and a repeat of the others
# changes nothing.
UNSTORED_KINDS = frozenset(
    {
        TICK_KIND,
        CHECKPOINT_KIND,
        "keyload.command.ListRetention",
        "keyload.command.AdvanceRecoveryFloor",
        "keyload.command.BeginDelete",
        "keyload.command.DeleteConfirmed",
    }
)

# Each command kind: its handler and the Outcome result branch it returns.
# The mutations a batch may hold are commands of their own too (processors/batch.py).
COMMANDS: dict[str, tuple[Handler, str]] = {
    **batch.MUTATIONS,
    "keyload.command.CreateQueue": (queues.create_queue, "keyload.QueueView"),
    "keyload.command.ConfigureQueue": (queues.configure_queue, "keyload.QueueView"),
    "keyload.command.InspectQueue": (queues.inspect_queue, "keyload.QueueView"),
    "keyload.command.InspectMessage": (queues.inspect_message, "keyload.MessageView"),
    TICK_KIND: (lambda stage, body, ctx: ctx.fired, "keyload.result.TickResult"),
    CHECKPOINT_KIND: (lambda stage, body, ctx: {"offset": ctx.offset}, "keyload.result.CheckpointResult"),
    "keyload.command.Receive": (leases.receive, "keyload.result.ReceiveResult"),
    "keyload.command.Renew": (leases.renew, "keyload.result.LeaseResult"),
    "keyload.command.Ack": (leases.ack, "keyload.result.LeaseResult"),
    "keyload.command.AckBatch": (leases.ack_batch, "keyload.result.AckBatchResult"),
    "keyload.command.Nack": (leases.nack, "keyload.result.LeaseResult"),
    "keyload.command.ListDeadLetters": (dead_letters.list_dead_letters, "keyload.result.DeadLetterPage"),
    "keyload.command.RotateKeys": (key_rotation.rotate_keys, "keyload.result.ActiveKeys"),
    "keyload.command.CreateTopic": (topics.create_topic, "keyload.TopicView"),
    "keyload.command.ReadTopic": (topics.read_topic, "keyload.result.TopicPage"),
    "keyload.command.InspectTopic": (topics.inspect_topic, "keyload.TopicView"),
    "keyload.command.CreateGroup": (groups.create_group, "keyload.GroupView"),
    "keyload.command.GroupReceive": (group_leases.group_receive, "keyload.result.GroupReceiveResult"),
    "keyload.command.GroupAck": (group_leases.group_ack, "keyload.result.GroupLeaseResult"),
    "keyload.command.GroupAckBatch": (group_leases.group_ack_batch, "keyload.result.GroupAckBatchResult"),
    "keyload.command.GroupNack": (group_leases.group_nack, "keyload.result.GroupLeaseResult"),
    "keyload.command.GroupRenew": (group_leases.group_renew, "keyload.result.GroupLeaseResult"),
    "keyload.command.GroupStatus": (groups.group_status, "keyload.GroupView"),
    "keyload.command.SeekGroup": (groups.seek_group, "keyload.GroupView"),
    "keyload.command.ConfigureGroup": (groups.configure_group, "keyload.GroupView"),
    "keyload.command.PauseGroup": (groups.pause_group, "keyload.GroupView"),
    "keyload.command.ResumeGroup": (groups.resume_group, "keyload.GroupView"),
    "keyload.command.PurgeTopic": (groups.purge_topic, "keyload.TopicView"),
    "keyload.command.GetDocument": (documents.get_document, "keyload.result.Document"),
    "keyload.command.ListDocuments": (documents.list_documents, "keyload.result.DocumentPage"),
    "keyload.command.Batch": (batch.batch, "keyload.result.BatchResult"),
    "keyload.command.CompleteProcessing": (inbox.complete_processing, "keyload.result.ProcessingResult"),
    "keyload.command.ConfigureInbox": (inbox.configure_inbox, "keyload.result.InboxView"),
    "keyload.command.CommitInbox": (inbox.commit_inbox, "keyload.result.ProcessingResult"),
    "keyload.command.PrepareLargeSchedule": (payloads.prepare_large_schedule, RESERVATION),
    "keyload.command.CommitLargeSchedule": (payloads.commit_large_schedule, RESERVATION),
    "keyload.command.CancelLargeSchedule": (reservations.cancel_large_schedule, RESERVATION),
    "keyload.command.InspectReservation": (reservations.inspect_reservation, RESERVATION),
    "keyload.command.AdvanceRecoveryFloor": (retention.advance_recovery_floor, "keyload.result.RetentionPage"),
    "keyload.command.ListRetention": (retention.list_retention, "keyload.result.RetentionPage"),
    "keyload.command.BeginDelete": (retention.begin_delete, "keyload.result.RetentionStatus"),
    "keyload.command.DeleteConfirmed": (retention.delete_confirmed, "keyload.result.RetentionStatus"),
}


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one record produced: outcomes to publish (reply partition, bytes), the
    record's own first when it has one; its command kind; whether it committed."""

    published: tuple[tuple[int | None, bytes], ...]
    kind: str | None
    committed: bool
    poison: str | None = None  # why the record was recorded as poison instead of applied


def fingerprint(command: Record, value: bytes) -> bytes:
    """SHA-256 over the command's canonical bytes, up to the informational tail (reply-to,
    client time) that retries may change: its Avro encoding, maps in key order, under the
    oldest released Command version that represents it losslessly.

    The oldest, so that a command keeps its fingerprint across upgrades: a processor
    stores the fingerprint with the outcome, and neither a retry after an upgrade nor a
    replay by the new processor may see another one. For a kind whose record never
    changed every version encodes alike, so the current one is used; and the canonical
    bytes are then a prefix of the record as written whenever it was written under the
    current schema with its maps in key order: the common case needs no re-encoding.
    """
    kind, body = command["body"]
    if kind in CHANGED_KINDS:
        return _prefix_digest(command, _oldest_lossless_encoding(_canonical(command), CHANGED_KINDS[kind]))
    paths = MAP_FIELDS.get(kind, ())
    if REGISTRY.is_current(COMMAND, value) and all(_in_key_order(m) for path in paths for m in _maps_at(body, path)):
        encoded = value[HEADER_BYTES:]
    else:
        encoded = REGISTRY.encode_body(COMMAND, _canonical(command))
    return _prefix_digest(command, encoded)


def _oldest_lossless_encoding(canonical: Record, candidates: tuple[Released, ...]) -> bytes:
    """The command's body under the oldest of `candidates` (its kind's older shapes) that writes it
    and reads it back unchanged; a command setting a field older versions lack gets a newer (or the
    current) one."""
    for released in candidates:
        try:
            encoded = REGISTRY.encode_body_under(released.schema, canonical)
            if REGISTRY.decode(COMMAND, released.header + encoded) == canonical:
                return encoded
        except CodecError:
            continue  # a kind, union branch or enum symbol that version lacks
    return REGISTRY.encode_body(COMMAND, canonical)


NAMING_KEYS = frozenset({"name", "namespace", "aliases", "symbols", "default"})  # strings that are not type references


def _branch_shapes(schema: Any) -> dict[str, str]:
    """Per command kind of an (expanded, unparsed) Command schema, its body record with every
    named type it references written out, docs left out: equal shapes encode alike."""
    named: dict[str, Any] = {}

    def collect(node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for item in node:
                collect(item, namespace)
        elif isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed"):
                space = node.get("namespace", namespace)
                named[node["name"] if "." in node["name"] else f"{space}.{node['name']}"] = node
                namespace = space
            for value in node.values():
                collect(value, namespace)

    def expand(node: Any) -> Any:
        if isinstance(node, str):
            return expand(named[node]) if node in named else node
        if isinstance(node, list):
            return [expand(item) for item in node]
        if isinstance(node, dict):
            return {key: value if key in NAMING_KEYS else expand(value) for key, value in node.items() if key != "doc"}
        return node

    collect(schema, "")
    [body] = [f for f in schema["fields"] if f["name"] == "body"]
    shapes = {}
    for branch in body["type"]:
        name = branch if isinstance(branch, str) else branch["name"]
        full = name if "." in name else f"{branch['namespace']}.{name}"
        shapes[full] = json.dumps(expand(branch), sort_keys=True)
    return shapes


def _changed_kinds() -> dict[str, tuple[Released, ...]]:
    """Command kinds whose record differs between released versions (or the current one), each with
    the oldest released version of every shape it had before the current one: the only versions
    worth trying (one lacking the kind cannot write it, and equal shapes encode alike)."""
    released = {r.version: r for r in REGISTRY.released(COMMAND)}
    current = _branch_shapes(expanded_current(COMMAND))
    older: dict[str, dict[str, Released]] = {}  # kind -> shape -> its oldest version
    for version, schema in history(COMMAND):
        for kind, shape in _branch_shapes(schema).items():
            if shape != current.get(kind):
                older.setdefault(kind, {}).setdefault(shape, released[version])
    return {kind: tuple(shapes.values()) for kind, shapes in older.items()}


# ReadTopic and GroupReceive since Command v4: these fingerprint under their oldest lossless version.
CHANGED_KINDS = _changed_kinds()


def _canonical(command: Record) -> Record:
    """The command with every map in key order."""
    kind, body = command["body"]
    for path in MAP_FIELDS.get(kind, ()):
        body = _sorting_maps(body, path)
    return dict(command, body=(kind, body))


def _prefix_digest(command: Record, encoded: bytes) -> bytes:
    """SHA-256 over an encoding of `command` (under any Command version) up to the informational tail."""
    tail = sum(len(encoded_optional_long(command[field])) for field in INFORMATIONAL_TAIL)
    return hashlib.sha256(encoded[: len(encoded) - tail]).digest()


def _in_key_order(mapping: dict[str, Any]) -> bool:
    return all(a < b for a, b in itertools.pairwise(mapping))


def _maps_at(value: Any, path: MapPath) -> Iterator[dict[str, Any]]:
    if not path:
        yield value
        return
    if path[0] == PRESENT:
        if value is not None:
            yield from _maps_at(value, path[1:])
        return
    if path[0].startswith(BRANCH):
        if value[0] == path[0][1:]:
            yield from _maps_at(value[1], path[1:])
        return
    for item in value if path[0] == ITEMS else (value[path[0]],):
        yield from _maps_at(item, path[1:])


def _sorting_maps(value: Any, path: MapPath) -> Any:
    """A copy of `value` whose maps at `path` are in key order."""
    if not path:
        return dict(sorted(value.items()))
    if path[0] == PRESENT:
        return None if value is None else _sorting_maps(value, path[1:])
    if path[0].startswith(BRANCH):
        return (value[0], _sorting_maps(value[1], path[1:])) if value[0] == path[0][1:] else value
    if path[0] == ITEMS:
        return [_sorting_maps(item, path[1:]) for item in value]
    return dict(value, **{path[0]: _sorting_maps(value[path[0]], path[1:])})


def apply_record(
    stage: Staged,
    value: bytes,
    partition: int,
    partitions: int,
    offset: int,
    now_ms: int,
    keyring: Mapping[str, bytes],
) -> Applied:
    """Apply one record at evaluation time `now_ms`.

    Every record first lets log time advance: timers due by `now_ms` fire (within
    the tick budget) whatever the record turns out to be. After the record, queues
    and groups it changed serve their waiting long-poll receives.
    """
    try:
        command: Record | None = REGISTRY.decode(COMMAND, value)
        poison = None
    except CodecError as exc:
        command, poison = None, str(exc)
    if command is not None and not _valid_command_id(command["command_id"]):
        command, poison = None, "command id is not 1..128 printable ASCII characters"
    trigger = f"@{offset}" if command is None else command["command_id"]
    ctx = Context(partition, offset, now_ms, trigger, "", "", keyring)
    fired = _advance_time(stage, ctx)
    if command is None:
        assert poison is not None
        _record_poison(stage, value, offset, now_ms, poison)
        return Applied(tuple(ctx.outbox.published), None, False, poison)
    own, kind, committed = _apply_command(stage, command, value, ctx, fired, partitions)
    published = ((command["reply_to"], own),) if own is not None else ()
    return Applied(published + tuple(ctx.outbox.published), kind, committed)


def apply_out_of_range(stage: Staged, value: bytes, offset: int, now_ms: int, timestamp_ms: int) -> Applied:
    """A record whose log time is outside MIN_LOG_TIME_MS..MAX_LOG_TIME_MS: poison, not applied.

    It is evaluated at `now_ms`, the partition's last time: such a time moves
    nothing (no timer fires, log time stays), and its command id stays unused,
    so a retry of the command at a good time applies as usual.
    """
    reason = f"log time {timestamp_ms} is outside {MIN_LOG_TIME_MS}..{MAX_LOG_TIME_MS}"
    _record_poison(stage, value, offset, now_ms, reason)
    return Applied((), None, False, reason)


def _advance_time(stage: Staged, ctx: Context) -> Record:
    moved = Staged(stage)
    fired = timers.fire_due(moved, ctx)
    moved.merge_into(stage)
    _serve_waiters(stage, ctx, moved)
    return fired


def _serve_waiters(stage: Staged, ctx: Context, changed: Staged) -> None:
    """Long-poll receives waiting on what `changed` wrote get their deliveries now."""
    leases.serve_waiters(stage, ctx, changed.written(keys.QUEUE))
    group_leases.serve_waiters(stage, ctx, changed.written(keys.TOPIC), changed.written(keys.GROUP))


def _apply_command(
    stage: Staged, command: Record, value: bytes, moment: Context, fired: Record, partitions: int
) -> tuple[bytes | None, str, bool]:
    """(own outcome to publish, or None while deferred; kind; committed) of one decoded command."""
    command_id: str = command["command_id"]
    kind, body = command["body"]
    domain: str = command["domain"]
    outcome = new_outcome(command_id, domain, moment.partition, moment.offset, moment.now_ms)
    if not valid_domain(domain):
        # Without a valid domain there is no key to store the outcome under: it is published only.
        reject(outcome, Rejected(ErrorCode.VALIDATION, DOMAIN_RULE))
        return REGISTRY.encode(OUTCOME, outcome), kind, False
    try:
        print_ = fingerprint(command, value)
    except (ValueError, TypeError, OverflowError):
        # A writer that does not check put a value its schema's type cannot hold (an int past 32
        # bits): the canonical bytes cannot be written, so there is no fingerprint to store it under.
        fields = REGISTRY.mismatched_fields(COMMAND, command)
        where = f": {', '.join(fields[:MAX_FIELDS_NAMED])}" if fields else ""
        reject(outcome, Rejected(ErrorCode.VALIDATION, OUT_OF_TYPE_RULE + where))
        return REGISTRY.encode(OUTCOME, outcome), kind, False

    stored = None if kind in UNSTORED_KINDS else stage.get(keys.outcome(domain, command_id))
    if stored is not None:
        if stored[:FINGERPRINT_BYTES] != print_:
            reject(outcome, Rejected(ErrorCode.CONFLICT, "command id was used for a different command"))
            return REGISTRY.encode(OUTCOME, outcome), kind, False
        previous = stored[FINGERPRINT_BYTES:]
        return (previous or None), kind, False  # empty: a long-poll receive still waiting

    ctx = Context(
        moment.partition,
        moment.offset,
        moment.now_ms,
        command_id,
        domain,
        command["principal"],
        moment.keyring,
        fired,
        command["reply_to"],
        print_,
        moment.outbox,  # shared: outcomes of waiters this command serves go out with the record's
    )
    child = Staged(stage)
    try:
        _check_envelope(ctx, partitions)
        authorize(ctx, kind)
        handler, result_type = COMMANDS[kind]
        result = handler(child, body, ctx)
        encoded = None
        if result is not None:
            outcome["result"] = (result_type, result)
            encoded = REGISTRY.encode(OUTCOME, outcome)
            if len(encoded) > limits.MAX_OUTCOME_BYTES:
                # Publishing it would fail on every replay and wedge the partition.
                raise Rejected(
                    ErrorCode.BUDGET_EXCEEDED,
                    f"the result takes {len(encoded)} bytes, over the {limits.MAX_OUTCOME_BYTES}-byte outcome limit",
                )
        child.merge_into(stage)
    except Rejected as rejection:
        reject(outcome, rejection)
        encoded = None
    else:
        _serve_waiters(stage, ctx, child)
    if ctx.outbox.deferred:
        stage.put(keys.outcome(domain, command_id), print_)
        return None, kind, True
    encoded = encoded or REGISTRY.encode(OUTCOME, outcome)
    if kind not in UNSTORED_KINDS:
        stage.put(keys.outcome(domain, command_id), print_ + encoded)
    return encoded, kind, outcome["status"] == "committed"


def _valid_command_id(command_id: str) -> bool:
    return 1 <= len(command_id) <= limits.MAX_COMMAND_ID_CHARS and limits.ID_PATTERN.fullmatch(command_id) is not None


OUT_OF_TYPE_RULE = "a field holds a value outside the range of its Avro type (an int is 32 bits)"
MAX_FIELDS_NAMED = 3  # schema paths an out-of-type rejection names
DOMAIN_RULE = f"domain must be 1..{limits.MAX_DOMAIN_CHARS} characters matching {limits.DOMAIN_PATTERN.pattern}"


def valid_domain(domain: str) -> bool:
    return 1 <= len(domain) <= limits.MAX_DOMAIN_CHARS and limits.DOMAIN_PATTERN.fullmatch(domain) is not None


def _check_envelope(ctx: Context, partitions: int) -> None:
    if partition_for(ctx.domain, partitions) != ctx.partition:
        raise Rejected(ErrorCode.VALIDATION, "domain does not belong to this partition")
    if not 1 <= len(ctx.principal) <= limits.MAX_PRINCIPAL_CHARS:
        raise Rejected(ErrorCode.VALIDATION, f"principal must be 1..{limits.MAX_PRINCIPAL_CHARS} characters")


def _record_poison(stage: Staged, value: bytes, offset: int, now_ms: int, reason: str) -> None:
    entry = {
        "offset": offset,
        "timestamp_ms": now_ms,
        "length": len(value),
        "sha256": hashlib.sha256(value).digest(),
        "reason": reason,
    }
    stage.put(keys.poison(offset), REGISTRY.encode(POISON, entry))
