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
from keyload.bodies import BODY_TYPES, EnableAccessControl, GroupReceive, Receive
from keyload.commands import CommandKind
from keyload.credentials import SignedRecord, signed, unwrap
from keyload.log.base import MAX_LOG_TIME_MS, MIN_LOG_TIME_MS, partition_for
from keyload.log.codec import REGISTRY, CodecError, Record
from keyload.processors import repeats, timers
from keyload.processors.access import authenticate, authorize, denied, key_of, load_principal, policy_epoch, verify
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.features import (
    LEASES_KEPT,
    OUTCOME_HORIZONS,
    READS_UNSTORED,
    WAITERS_FOLLOW_REPEATS,
    feature_level,
)
from keyload.processors.fingerprints import COMMAND, FINGERPRINT_BYTES, fingerprint
from keyload.processors.groups import leases as group_leases
from keyload.processors.horizons import repeat_past_horizon, store_outcome
from keyload.processors.outcomes import OUTCOME, new_outcome, reject
from keyload.processors.queues import leases
from keyload.projections import keys
from keyload.projections.records import AvroRecord, PrincipalRecord
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
    rows: Mapping[str, CommandKind]

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
        by_branch = {row.branch: row for row in rows}
        return cls(handlers, unstored, {branch: bodies[branch] for branch in handlers}, by_branch)

    def stored(self, kind: str) -> bool:
        return kind not in self.unstored

    def typed(self, kind: str, body: Record) -> AvroRecord:
        """The decoded body read into its kind's class."""
        return self.bodies[kind].from_avro(body)

    def apply(self, stage: Staged, kind: str, body: AvroRecord, ctx: Context) -> tuple[str, Record] | None:
        """Run the kind's handler on its typed body: its (result branch, result), or None while it is deferred."""
        handler, result_type = self.handlers[kind]
        result = handler(stage, body, ctx)
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

    A record is a Command, or a Signed record holding one (processors/access.py). Every outcome
    published for a principal the policy knows is sealed with that principal's key.
    """
    signed: SignedRecord | None = None
    try:
        signed = unwrap(value)
        command_bytes = value if signed is None else signed.record
        command: Record | None = REGISTRY.decode(COMMAND, command_bytes)
        poison = None
    except CodecError as exc:
        command, command_bytes, poison = None, value, str(exc)
    if command is not None and not _valid_command_id(command["command_id"]):
        command, poison = None, "command id is not 1..128 printable ASCII characters"
    trigger = f"@{offset}" if command is None else command["command_id"]
    ctx = Context(partition, offset, now_ms, trigger, "", "", keyring)
    fired = _advance_time(stage, ctx)
    if command is None:
        assert poison is not None
        _record_poison(stage, value, offset, now_ms, poison)
        return Applied(_sealed(stage, keyring, ctx.outbox.published), None, False, poison)
    own, kind, committed = _apply_command(stage, command, command_bytes, signed, ctx, fired, partitions, dispatch)
    published = ((command["reply_to"], own),) if own is not None else ()
    return Applied(published + _sealed(stage, keyring, ctx.outbox.published), kind, committed)


def _sealed(
    stage: Staged, keyring: Mapping[str, bytes], outcomes: Iterable[tuple[int | None, str, bytes]]
) -> tuple[tuple[int | None, bytes], ...]:
    """The outcomes of served long polls, each sealed for the principal that waits (published as
    they are while access control is off)."""
    found: dict[str, PrincipalRecord | None] = {}
    published = []
    for reply_to, principal, encoded in outcomes:
        if principal not in found:
            found[principal] = load_principal(stage, principal)
        published.append((reply_to, sealed(found[principal], keyring, encoded)))
    return tuple(published)


def sealed(caller: PrincipalRecord | None, keyring: Mapping[str, bytes], encoded: bytes) -> bytes:
    """An encoded outcome sealed with `caller`'s key (as it is when there is no caller)."""
    return encoded if caller is None else signed(caller.key_id, key_of(keyring, caller), encoded)


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
    if len(moved):  # most records find no timer due: nothing to merge, nobody to serve
        moved.merge_into(stage)
        _serve_waiters(stage, ctx, moved)
    return fired


def _serve_waiters(stage: Staged, ctx: Context, changed: Staged) -> None:
    """Long-poll receives waiting on what `changed` wrote get their deliveries now."""
    leases.serve_waiters(stage, ctx, changed.written(keys.QUEUE))
    group_leases.serve_waiters(stage, ctx, changed.written(keys.TOPIC), changed.written(keys.GROUP))


def _follow_repeat(stage: Staged, typed: AvroRecord, ctx: Context) -> None:
    """A repeat of a Receive or GroupReceive still waiting: its answer goes to the reply partition
    the repeat names (feature level 13). Its queue or group is there, as deleting or purging one
    answers its waiters; were it not, nothing waits there to follow."""
    try:
        if isinstance(typed, GroupReceive):
            group_leases.follow_repeat(stage, typed, ctx)
        elif isinstance(typed, Receive):  # the only kinds that wait
            leases.follow_repeat(stage, typed, ctx)
    except Rejected:
        pass


def _apply_command(
    stage: Staged,
    command: Record,
    value: bytes,
    signed: SignedRecord | None,
    moment: Context,
    fired: Record,
    partitions: int,
    dispatch: Dispatch,
) -> tuple[bytes | None, str, bool]:
    """(own outcome to publish, sealed for the command's principal once it is authenticated, or
    None while deferred; kind; committed) of one decoded command."""
    command_id: str = command["command_id"]
    kind, body = command["body"]
    domain: str = command["domain"]
    principal: str = command["principal"]
    outcome = new_outcome(command_id, domain, moment.partition, moment.offset, moment.now_ms)

    def refused(rejection: Rejected, caller: PrincipalRecord | None = None) -> tuple[bytes, str, bool]:
        """An outcome that is published, never stored: there is no key to store it under, or
        storing it would let a sender block a command id it does not own."""
        reject(outcome, rejection)
        return sealed(caller, moment.keyring, REGISTRY.encode(OUTCOME, outcome)), kind, False

    typed = dispatch.typed(kind, body)
    try:
        # First, so that every later refusal reaches the sender sealed (an SDK accepts no other).
        caller = _caller(stage, kind, typed, principal, signed, moment.keyring)
    except Rejected as rejection:
        return refused(rejection)
    if not valid_domain(domain):
        return refused(Rejected(ErrorCode.VALIDATION, DOMAIN_RULE), caller)
    try:
        print_ = fingerprint(command, value)
    except (ValueError, TypeError, OverflowError):
        # A writer that does not check put a value its schema's type cannot hold (an int past 32
        # bits): the canonical bytes cannot be written, so there is no fingerprint to store it under.
        fields = REGISTRY.mismatched_fields(COMMAND, command)
        where = f": {', '.join(fields[:MAX_FIELDS_NAMED])}" if fields else ""
        return refused(Rejected(ErrorCode.VALIDATION, OUT_OF_TYPE_RULE + where), caller)
    ctx = Context(
        moment.partition,
        moment.offset,
        moment.now_ms,
        command_id,
        domain,
        principal,
        moment.keyring,
        fired,
        command["reply_to"],
        print_,
        moment.outbox,  # shared: outcomes of waiters this command serves go out with the record's
        caller,
    )
    row = dispatch.rows[kind]

    try:
        # Before the command id is looked up, so a principal without the capability learns nothing
        # of the id's use and cannot take an id; a repeat is decided by the policy of now.
        authorize(ctx, row, typed)
    except Rejected as rejection:
        return refused(rejection, caller)
    # A read keeps no outcome from feature level 1 on (processors/features.py): nothing to look up.
    level = feature_level(stage)
    kept = dispatch.stored(kind) and not (row.reads and level >= READS_UNSTORED)
    stored = stage.get(keys.outcome(domain, command_id)) if kept else None
    if kept and stored is None and level >= OUTCOME_HORIZONS:
        past = repeat_past_horizon(stage, domain, command_id, print_)
        if past is not None:
            return refused(past, caller)
    if stored is not None:
        if stored[:FINGERPRINT_BYTES] != print_:
            return refused(Rejected(ErrorCode.CONFLICT, "command id was used for a different command"), caller)
        previous = stored[FINGERPRINT_BYTES:]
        if not previous:  # a long-poll receive still waiting
            if level >= WAITERS_FOLLOW_REPEATS:
                _follow_repeat(stage, typed, ctx)
            return None, kind, False
        if kind in repeats.RECEIVES and level >= LEASES_KEPT:
            previous = repeats.answer(stage, ctx, previous)
        return sealed(caller, moment.keyring, previous), kind, False

    child = Staged(stage)
    try:
        _check_envelope(ctx, partitions)
        result = dispatch.apply(child, kind, typed, ctx)
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
    if kept:
        store_outcome(stage, outcome, print_, encoded, level)
    return sealed(caller, moment.keyring, encoded), kind, outcome["status"] == "committed"


def _caller(
    stage: Staged,
    kind: str,
    body: AvroRecord,
    principal: str,
    signed: SignedRecord | None,
    keyring: Mapping[str, bytes],
) -> PrincipalRecord | None:
    """The authenticated principal of a command; None while access control is off. The one
    command that needs a signature then is EnableAccessControl, signed by a principal it installs."""
    if policy_epoch(stage) is not None:
        return authenticate(stage, principal, signed, keyring)
    if isinstance(body, EnableAccessControl):
        signer = next((spec for spec in body.principals if spec.principal == principal), None)
        if signer is None or signer.key_id not in keyring:
            # Before access control anyone may append: naming a key this service lacks is refused,
            # not a halt (the service's own EnableAccessControl names keys it added itself).
            raise denied("the signer must be a principal the command installs, with a key of the keyring")
        record = PrincipalRecord(
            principal=principal, key_id=signer.key_id, enabled=True, revision=0, grants=signer.grants
        )
        return verify(record, signed, keyring)
    return None


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
