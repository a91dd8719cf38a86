"""Apply one log record to a partition's staged projection.

The only entry point the runtime calls. It decodes the envelope, enforces
command-id idempotency by fingerprint (processors/fingerprints.py), authorizes,
dispatches to the command's handler inside its own child stage (so a rejection
leaves nothing behind), and stores the outcome. Undecodable records become poison
entries. Dispatch is built from the command table (keyload/commands.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from keyload import commands, limits
from keyload.bodies import BODY_TYPES
from keyload.commands import CommandKind
from keyload.log.base import MAX_LOG_TIME_MS, MIN_LOG_TIME_MS, partition_for
from keyload.log.codec import REGISTRY, CodecError, Record
from keyload.processors import timers
from keyload.processors.access import authorize
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.fingerprints import COMMAND, FINGERPRINT_BYTES, fingerprint
from keyload.processors.groups import leases as group_leases
from keyload.processors.outcomes import OUTCOME, new_outcome, reject
from keyload.processors.queues import leases
from keyload.projections import keys
from keyload.projections.records import AvroRecord
from keyload.projections.store import Staged

Handler = Callable[[Staged, Any, Context], Record | None]

POISON = "keyload.PoisonEntry"
PROCESSORS = "keyload.processors"  # the package a table row's handler is named under
CHECKPOINT_KIND = "keyload.command.Checkpoint"


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What the processor needs of a command table: per command kind (its body branch) the
    handler, the class its body is read as (keyload/bodies.py) and the Outcome result branch it
    returns, and the kinds whose outcomes are not stored. Those are idempotent by nature: their
    outcomes are published, not stored, so a ticker running for months does not grow the
    projection; the GC worker's commands too (it polls ListRetention, and a repeat of the others
    changes nothing)."""

    handlers: Mapping[str, tuple[Handler, str]]
    unstored: frozenset[str]
    bodies: Mapping[str, type[AvroRecord]]

    @classmethod
    def from_table(
        cls,
        table: Iterable[CommandKind],
        package: str = PROCESSORS,
        bodies: Mapping[str, type[AvroRecord]] = BODY_TYPES,
    ) -> Dispatch:
        """Resolve every row's handler ("module:function" under `package`) once; `bodies` holds the
        class of each row's body record, by branch."""
        rows = tuple(table)
        handlers = {row.branch: (cast(Handler, row.resolve(package)), row.result) for row in rows}
        assert len(handlers) == len(rows), "a command kind is declared twice"
        unstored = frozenset(row.branch for row in rows if not row.stored)
        return cls(handlers, unstored, {branch: bodies[branch] for branch in handlers})

    def stored(self, kind: str) -> bool:
        return kind not in self.unstored

    def apply(self, stage: Staged, kind: str, body: Record, ctx: Context) -> tuple[str, Record] | None:
        """Run the kind's handler on its typed body: its (result branch, result), or None while it is deferred."""
        handler, result_type = self.handlers[kind]
        result = handler(stage, self.bodies[kind].from_avro(body), ctx)
        return None if result is None else (result_type, result)


DISPATCH = Dispatch.from_table(commands.COMMANDS)
# Each command kind: its handler and the Outcome result branch it returns.
COMMANDS: Mapping[str, tuple[Handler, str]] = DISPATCH.handlers
UNSTORED_KINDS = DISPATCH.unstored


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one record produced: outcomes to publish (reply partition, bytes), the
    record's own first when it has one; its command kind; whether it committed."""

    published: tuple[tuple[int | None, bytes], ...]
    kind: str | None
    committed: bool
    poison: str | None = None  # why the record was recorded as poison instead of applied


def apply_record(
    stage: Staged,
    value: bytes,
    partition: int,
    partitions: int,
    offset: int,
    now_ms: int,
    keyring: Mapping[str, bytes],
    dispatch: Dispatch = DISPATCH,
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
    own, kind, committed = _apply_command(stage, command, value, ctx, fired, partitions, dispatch)
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
    stage: Staged,
    command: Record,
    value: bytes,
    moment: Context,
    fired: Record,
    partitions: int,
    dispatch: Dispatch,
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

    stored = None if not dispatch.stored(kind) else stage.get(keys.outcome(domain, command_id))
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
        result = dispatch.apply(child, kind, body, ctx)
        encoded = None
        if result is not None:
            outcome["result"] = result
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
    if dispatch.stored(kind):
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
