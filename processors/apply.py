"""Apply one log record to a partition's staged projection.

The only entry point the runtime calls. It decodes the envelope, enforces
command-id idempotency by fingerprint, authorizes, dispatches to the command's
handler inside its own child stage (so a rejection leaves nothing behind), and
stores the outcome. Undecodable records become poison entries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from keyload.log.base import partition_for
from keyload.log.codec import HEADER_BYTES, REGISTRY, CodecError, encoded_optional_long
from keyload.projections import keys
from keyload.projections.store import Staged

from . import dead_letters, key_rotation, leases, lifecycle, limits, queues
from .access import authorize
from .context import Context
from .errors import ErrorCode, Rejected

Record = dict[str, Any]
Handler = Callable[[Staged, Record, Context], Record | None]

COMMAND = "keyload.Command"
OUTCOME = "keyload.Outcome"
POISON = "keyload.PoisonEntry"
FINGERPRINT_BYTES = 32
INFORMATIONAL_TAIL = ("reply_to", "client_time_ms")
assert tuple(f["name"] for f in REGISTRY.schema(COMMAND)["fields"][-2:]) == INFORMATIONAL_TAIL


def _map_fields(schema: Any) -> dict[str, tuple[str, ...]]:
    """Per command kind, its body's map fields: Avro maps have no order, so the fingerprint sorts them."""
    [body] = [f for f in schema["fields"] if f["name"] == "body"]
    found = {}
    for branch in body["type"]:
        names = tuple(f["name"] for f in branch["fields"] if isinstance(f["type"], dict) and f["type"]["type"] == "map")
        if names:
            found[branch["name"]] = names
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
}


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one record produced. `outcome` is None for a poison record."""

    outcome: bytes | None
    reply_to: int | None
    kind: str | None
    committed: bool


POISON_APPLIED = Applied(None, None, None, False)


def fingerprint(command: Record, value: bytes) -> bytes:
    """SHA-256 over the command's canonical bytes: its Avro encoding under the current
    schema, maps in key order, up to the informational tail (reply-to, client time)
    that retries may change.

    The tail fields are the envelope's last ones, so the canonical bytes are a prefix
    of the record as written whenever it was written under the current schema with
    its maps in key order: the common case needs no re-encoding.
    """
    kind, body = command["body"]
    maps = MAP_FIELDS.get(kind, ())
    if REGISTRY.is_current(COMMAND, value) and all(_in_key_order(body[name]) for name in maps):
        encoded = value[HEADER_BYTES:]
    else:
        canonical_body = dict(body, **{name: dict(sorted(body[name].items())) for name in maps})
        encoded = REGISTRY.encode_body(COMMAND, dict(command, body=(kind, canonical_body)))
    tail = sum(len(encoded_optional_long(command[field])) for field in INFORMATIONAL_TAIL)
    return hashlib.sha256(encoded[: len(encoded) - tail]).digest()


def _in_key_order(mapping: dict[str, Any]) -> bool:
    return all(a < b for a, b in itertools.pairwise(mapping))


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
    the tick budget) whatever the record turns out to be.
    """
    try:
        command: Record | None = REGISTRY.decode(COMMAND, value)
        poison = None
    except CodecError as exc:
        command, poison = None, str(exc)
    if command is not None and not _valid_command_id(command["command_id"]):
        command, poison = None, "command id is not 1..128 printable ASCII characters"
    moment = Context(partition, offset, now_ms, f"@{offset}", "", "", keyring)
    if command is None:
        lifecycle.fire_due(stage, moment)
        assert poison is not None
        _record_poison(stage, value, offset, now_ms, poison)
        return POISON_APPLIED
    command_id: str = command["command_id"]
    fired = lifecycle.fire_due(stage, dataclasses.replace(moment, command_id=command_id))
    kind, body = command["body"]
    domain: str = command["domain"]
    reply_to = command["reply_to"]
    outcome = _outcome(command_id, domain, partition, offset, now_ms)
    if not valid_domain(domain):
        # Without a valid domain there is no key to store the outcome under: it is published only.
        _reject(outcome, Rejected(ErrorCode.VALIDATION, DOMAIN_RULE))
        return Applied(REGISTRY.encode(OUTCOME, outcome), reply_to, kind, False)
    print_ = fingerprint(command, value)

    stored = None if kind in UNSTORED_KINDS else stage.get(keys.outcome(domain, command_id))
    if stored is not None:
        if stored[:FINGERPRINT_BYTES] == print_:
            return Applied(stored[FINGERPRINT_BYTES:], reply_to, kind, False)
        _reject(outcome, Rejected(ErrorCode.CONFLICT, "command id was used for a different command"))
        return Applied(REGISTRY.encode(OUTCOME, outcome), reply_to, kind, False)

    ctx = dataclasses.replace(moment, command_id=command_id, domain=domain, principal=command["principal"], fired=fired)
    child = Staged(stage)
    try:
        _check_envelope(ctx, partitions)
        authorize(ctx, kind)
        handler, result_type = COMMANDS[kind]
        result = handler(child, body, ctx)
        if result is not None:
            outcome["result"] = (result_type, result)
        child.merge_into(stage)
    except Rejected as rejection:
        _reject(outcome, rejection)
    encoded = REGISTRY.encode(OUTCOME, outcome)
    if kind not in UNSTORED_KINDS:
        stage.put(keys.outcome(domain, command_id), print_ + encoded)
    return Applied(encoded, reply_to, kind, outcome["status"] == "committed")


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


def _outcome(command_id: str, domain: str, partition: int, offset: int, now_ms: int) -> Record:
    return {
        "command_id": command_id,
        "domain": domain,
        "partition": partition,
        "offset": offset,
        "eval_time_ms": now_ms,
        "status": "committed",
        "error_code": None,
        "detail": "",
        "result": None,
    }


def _reject(outcome: Record, rejection: Rejected) -> None:
    detail = rejection.detail[: limits.MAX_DETAIL_CHARS]
    outcome.update(status="rejected", error_code=str(rejection.code), detail=detail, result=None)


def _record_poison(stage: Staged, value: bytes, offset: int, now_ms: int, reason: str) -> None:
    entry = {
        "offset": offset,
        "timestamp_ms": now_ms,
        "length": len(value),
        "sha256": hashlib.sha256(value).digest(),
        "reason": reason,
    }
    stage.put(keys.poison(offset), REGISTRY.encode(POISON, entry))
