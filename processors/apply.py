"""Apply one log record to a partition's staged projection.

The only entry point the runtime calls. It decodes the envelope, enforces
command-id idempotency by fingerprint, authorizes, dispatches to the command's
handler inside its own child stage (so a rejection leaves nothing behind), and
stores the outcome. Undecodable records become poison entries.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from keyload.log.base import partition_for
from keyload.log.codec import HEADER_BYTES, REGISTRY, CodecError, encoded_optional_long
from keyload.projections import keys
from keyload.projections.store import Staged

from . import dead_letters, group_leases, groups, key_rotation, leases, limits, queues, timers, topics
from .access import authorize
from .context import Context
from .errors import ErrorCode, Rejected
from .outcomes import OUTCOME, new_outcome, reject

Record = dict[str, Any]
Handler = Callable[[Staged, Record, Context], Record | None]

COMMAND = "keyload.Command"
POISON = "keyload.PoisonEntry"
FINGERPRINT_BYTES = 32
INFORMATIONAL_TAIL = ("reply_to", "client_time_ms")
assert tuple(f["name"] for f in REGISTRY.schema(COMMAND)["fields"][-2:]) == INFORMATIONAL_TAIL


# Where a map sits in a command body: field names, ITEMS stepping into every item of an array,
# PRESENT into the value of an optional (["null", X]) field when it is not null.
MapPath = tuple[str, ...]
ITEMS = "[]"
PRESENT = "?"


def _map_paths(schema: Any, named: dict[str, Any], path: MapPath = ()) -> list[MapPath]:
    """Every map inside `schema` (a parsed schema), following records, arrays and optional values."""
    if isinstance(schema, str) and schema in named:
        return _map_paths(named[schema], named, path)
    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        found = [p for branch in branches for p in _map_paths(branch, named, (*path, PRESENT))]
        assert not found or len(branches) == 1, "map inside a union of several types"
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
UNSTORED_KINDS = frozenset({TICK_KIND, CHECKPOINT_KIND})

# Each command kind: its handler and the Outcome result branch it returns.
COMMANDS: dict[str, tuple[Handler, str]] = {
    "keyload.command.CreateQueue": (queues.create_queue, "keyload.QueueView"),
    "keyload.command.ConfigureQueue": (queues.configure_queue, "keyload.QueueView"),
    "keyload.command.Enqueue": (queues.enqueue, "keyload.result.EnqueueResult"),
    "keyload.command.InspectQueue": (queues.inspect_queue, "keyload.QueueView"),
    "keyload.command.InspectMessage": (queues.inspect_message, "keyload.MessageView"),
    TICK_KIND: (lambda stage, body, ctx: ctx.fired, "keyload.result.TickResult"),
    CHECKPOINT_KIND: (lambda stage, body, ctx: {"offset": ctx.offset}, "keyload.result.CheckpointResult"),
    "keyload.command.Receive": (leases.receive, "keyload.result.ReceiveResult"),
    "keyload.command.Renew": (leases.renew, "keyload.result.LeaseResult"),
    "keyload.command.Ack": (leases.ack, "keyload.result.LeaseResult"),
    "keyload.command.AckBatch": (leases.ack_batch, "keyload.result.AckBatchResult"),
    "keyload.command.Nack": (leases.nack, "keyload.result.LeaseResult"),
    "keyload.command.Redrive": (dead_letters.redrive, "keyload.MessageView"),
    "keyload.command.Cancel": (dead_letters.cancel, "keyload.MessageView"),
    "keyload.command.ParkPending": (dead_letters.park_pending, "keyload.MessageView"),
    "keyload.command.ListDeadLetters": (dead_letters.list_dead_letters, "keyload.result.DeadLetterPage"),
    "keyload.command.RotateKeys": (key_rotation.rotate_keys, "keyload.result.ActiveKeys"),
    "keyload.command.CreateTopic": (topics.create_topic, "keyload.TopicView"),
    "keyload.command.Publish": (topics.publish, "keyload.result.PublishResult"),
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
}


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one record produced: outcomes to publish (reply partition, bytes), the
    record's own first when it has one; its command kind; whether it committed."""

    published: tuple[tuple[int | None, bytes], ...]
    kind: str | None
    committed: bool


def fingerprint(command: Record, value: bytes) -> bytes:
    """SHA-256 over the command's canonical bytes: its Avro encoding under the current
    schema, maps in key order, up to the informational tail (reply-to, client time)
    that retries may change.

    The tail fields are the envelope's last ones, so the canonical bytes are a prefix
    of the record as written whenever it was written under the current schema with
    its maps in key order: the common case needs no re-encoding.
    """
    kind, body = command["body"]
    paths = MAP_FIELDS.get(kind, ())
    if REGISTRY.is_current(COMMAND, value) and all(_in_key_order(m) for path in paths for m in _maps_at(body, path)):
        encoded = value[HEADER_BYTES:]
    else:
        canonical_body = body
        for path in paths:
            canonical_body = _sorting_maps(canonical_body, path)
        encoded = REGISTRY.encode_body(COMMAND, dict(command, body=(kind, canonical_body)))
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
    for item in value if path[0] == ITEMS else (value[path[0]],):
        yield from _maps_at(item, path[1:])


def _sorting_maps(value: Any, path: MapPath) -> Any:
    """A copy of `value` whose maps at `path` are in key order."""
    if not path:
        return dict(sorted(value.items()))
    if path[0] == PRESENT:
        return None if value is None else _sorting_maps(value, path[1:])
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
    it changed serve their waiting long-poll receives.
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
        return Applied(tuple(ctx.outbox.published), None, False)
    own, kind, committed = _apply_command(stage, command, value, ctx, fired, partitions)
    published = ((command["reply_to"], own),) if own is not None else ()
    return Applied(published + tuple(ctx.outbox.published), kind, committed)


def _advance_time(stage: Staged, ctx: Context) -> Record:
    moved = Staged(stage)
    fired = timers.fire_due(moved, ctx)
    moved.merge_into(stage)
    leases.serve_waiters(stage, ctx, moved.written(keys.QUEUE))
    return fired


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
    print_ = fingerprint(command, value)

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
        leases.serve_waiters(stage, ctx, child.written(keys.QUEUE))
    if ctx.outbox.deferred:
        stage.put(keys.outcome(domain, command_id), print_)
        return None, kind, True
    encoded = encoded or REGISTRY.encode(OUTCOME, outcome)
    if kind not in UNSTORED_KINDS:
        stage.put(keys.outcome(domain, command_id), print_ + encoded)
    return encoded, kind, outcome["status"] == "committed"


def _valid_command_id(command_id: str) -> bool:
    return 1 <= len(command_id) <= limits.MAX_COMMAND_ID_CHARS and limits.ID_PATTERN.fullmatch(command_id) is not None


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
