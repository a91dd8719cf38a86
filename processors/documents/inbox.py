"""Inboxes: exactly-once effects of processing a delivery (DESIGN.md §7).

CompleteProcessing is the consumer's side: one command validates the delivery's
lease, applies the handler's effects (processors/batch.py), records an inbox entry
and acks, all or nothing. The entry is keyed by what identifies one execution of
one handler on one delivery — the queue or group, the message id or position, the
delivery generation, the handler scope and the execution generation — so a repeat
(a retried command, or the same effects under a new command id after a crash) is
recognised: same effects → `already_processed` with the first receipt, other
effects → Conflict. The entry names the command that applied the effects; that
command's stored outcome is the receipt.

CommitInbox is the target's side: a domain that receives effects on behalf of a
delivery in another domain keeps its own entries, keyed by the source reference,
within a configured policy (ConfigureInbox); the source ack is a separate command.

Entries are kept until feature level 4 forever; from it until the domain's receipt horizon
(processors/horizons.py), a target inbox's giving its room back. A queue's entry goes just before
the identity of the message it completed; a target's receipt keeps to the target domain's horizon,
which is why a target's should not be longer than its sources' (docs/ARCHITECTURE.md §11). The
outcome an entry names keeps to its domain's horizons from feature level 2: a repeat after it is
gone answers `already_processed` with the entry's command, offset and time, without the first
results.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import CommitInbox, CompleteProcessing, ConfigureInbox
from keyload.log.codec import REGISTRY, Record
from keyload.processors import horizons, validation
from keyload.processors.batch import apply_mutations, check_domains, effects_digest
from keyload.processors.context import Context
from keyload.processors.counters import adjusted
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import OUTCOME_HORIZONS, WORK_COMPACTED, feature_level
from keyload.processors.fingerprints import FINGERPRINT_BYTES
from keyload.processors.groups import leases as group_leases
from keyload.processors.outcomes import OUTCOME
from keyload.processors.queues import leases
from keyload.processors.queues.state import check_message_id, check_name
from keyload.projections import keys
from keyload.projections.records import InboxEntry, InboxRecord, load, save
from keyload.projections.store import Staged

PROCESSING_RESULT = "keyload.result.ProcessingResult"


def _check_execution(body: CompleteProcessing | CommitInbox, kind: str) -> None:
    check_name("handler scope", body.handler_scope, limits.MAX_HANDLER_SCOPE_CHARS, limits.ID_PATTERN)
    validation.check_integer(f"{kind}.execution_generation", body.execution_generation)


def _repeat(stage: Staged, ctx: Context, row: bytes, digest: bytes) -> Record | None:
    """The first receipt when `row` holds an entry with these effects; Conflict for other effects;
    None when the key was never processed."""
    entry = load(stage, row, InboxEntry)
    if entry is None:
        return None
    if entry.effects_sha256 != digest:
        raise Rejected(ErrorCode.CONFLICT, "this delivery was already processed with other effects")
    first = _first_outcome(stage, ctx, entry)
    if first is None:
        # Its outcome is past the domain's horizon (its command id may even be in use again): the
        # entry still says the effects were applied.
        return {
            "already_processed": True,
            "command_id": entry.command_id,
            "offset": entry.offset,
            "completed_at_ms": entry.completed_at_ms,
            "results": {"results": []},
        }
    # The outcome and its result are not typed records yet (projections/records.py).
    kind, result = first["result"]
    if kind != PROCESSING_RESULT:
        raise Corruption(f"an inbox entry names command {entry.command_id!r}, which did not process effects")
    return dict(result, already_processed=True)


def _first_outcome(stage: Staged, ctx: Context, entry: InboxEntry) -> Record | None:
    """The stored outcome of the command an inbox entry names; None from level 2 when it is gone:
    past its horizon, its row is absent, or holds a later command under the same id (another
    offset, or only the fingerprint of a long poll still waiting)."""
    stored = stage.get(keys.outcome(ctx.domain, entry.command_id))
    outcome = None
    if stored is not None and len(stored) > FINGERPRINT_BYTES:
        outcome = REGISTRY.decode(OUTCOME, stored[FINGERPRINT_BYTES:])
    if outcome is not None and outcome["offset"] == entry.offset:
        return outcome
    if feature_level(stage) < OUTCOME_HORIZONS:
        raise Corruption(f"an inbox entry names command {entry.command_id!r}, which has no stored outcome")
    return None


def _entry(ctx: Context, digest: bytes) -> InboxEntry:
    """The inbox entry this command writes: it names the command, whose outcome is the receipt."""
    return InboxEntry(command_id=ctx.command_id, offset=ctx.offset, completed_at_ms=ctx.now_ms, effects_sha256=digest)


def _receipt(ctx: Context, results: Record) -> Record:
    return {
        "already_processed": False,
        "command_id": ctx.command_id,
        "offset": ctx.offset,
        "completed_at_ms": ctx.now_ms,
        "results": results,
    }


def complete_processing(stage: Staged, body: CompleteProcessing, ctx: Context) -> Record:
    """Effects, inbox entry and ack of one delivery of a queue, or of a group when `topic` and
    `group` are given; the lease is checked before and the ack made after the effects."""
    _check_execution(body, "CompleteProcessing")
    check_domains(body.effects, ctx, at_least=0)
    digest = effects_digest(body.effects)
    topic, group = body.topic, body.group
    if (topic is None) != (group is None):
        raise Rejected(ErrorCode.VALIDATION, "a group's delivery names both its topic and its group")
    # The token's signature is verified once; the lease is checked before the effects and
    # again by the ack after them (they may have touched the delivery's queue or message).
    if topic is None or group is None:  # a queue's delivery (the check above makes both None)
        queue, token = leases.verified_token(stage, ctx, body.token)
        incarnation = queue.view.incarnation
        check_live: Callable[[], object] = partial(leases.live_lease, stage, ctx, token)
        ack: Callable[[], object] = partial(leases.ack_lease, stage, ctx, token)
    else:
        subscription, token = group_leases.verified_group_token(stage, ctx, topic, group, body.token)
        incarnation = subscription.view.incarnation
        check_live = partial(group_leases.live_group_lease, stage, ctx, topic, group, token)
        ack = partial(group_leases.group_ack_lease, stage, ctx, topic, group, token)
    row = keys.inbox_entry(
        incarnation,
        token.delivery_generation,
        body.execution_generation,
        body.handler_scope,
        token.message_id,
    )
    first = _repeat(stage, ctx, row, digest)
    if first is not None:
        return first
    check_live()
    results = apply_mutations(stage, body.effects, ctx)
    ack()
    _keep_entry(stage, ctx, row, _entry(ctx, digest))
    return _receipt(ctx, results)


def _keep_entry(stage: Staged, ctx: Context, row: bytes, entry: InboxEntry, charge: int = 0) -> None:
    """Store an inbox entry: from level 4 until the domain's receipt horizon, when a command id
    applied now would become new (the identity of the queue message it completed goes then too,
    just after it); a target inbox entry's `charge` goes back to the inbox then."""
    save(stage, row, entry)
    if feature_level(stage) >= WORK_COMPACTED:
        horizons.keep_until_receipt_horizon(stage, row, ctx.domain, ctx.now_ms, charge)


def _inbox_view(domain: str, inbox: InboxRecord) -> Record:
    return dict(inbox.to_avro(), domain=domain)


def configure_inbox(stage: Staged, body: ConfigureInbox, ctx: Context) -> Record:
    """Create or change the domain's target inbox policy; a policy below current use refuses new receipts."""
    validation.check_integer("ConfigureInbox.max_receipts", body.max_receipts)
    validation.check_integer("ConfigureInbox.max_bytes", body.max_bytes)
    row = keys.inbox_config(ctx.domain)
    stored = load(stage, row, InboxRecord)
    receipts, used = (0, 0) if stored is None else (stored.receipts, stored.bytes)
    inbox = InboxRecord(max_receipts=body.max_receipts, max_bytes=body.max_bytes, receipts=receipts, bytes=used)
    save(stage, row, inbox)
    return _inbox_view(ctx.domain, inbox)


def commit_inbox(stage: Staged, body: CommitInbox, ctx: Context) -> Record:
    """Apply effects once per source delivery, handler scope and execution generation."""
    config_row = keys.inbox_config(ctx.domain)
    inbox = load(stage, config_row, InboxRecord)
    if inbox is None:
        raise Rejected(ErrorCode.UNSUPPORTED_CAPABILITY, "the domain has no inbox: configure one with ConfigureInbox")
    _check_execution(body, "CommitInbox")
    source = body.source
    check_name("source domain", source.domain, limits.MAX_DOMAIN_CHARS, limits.DOMAIN_PATTERN)
    check_name("source queue", source.queue, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    check_message_id(source.message_id)
    validation.check_integer("InboxSource.delivery_generation", source.delivery_generation)
    check_domains(body.effects, ctx, at_least=0)
    digest = effects_digest(body.effects)
    row = keys.target_inbox_entry(
        ctx.domain,
        source.domain,
        source.queue,
        source.delivery_generation,
        body.execution_generation,
        body.handler_scope,
        source.message_id,
    )
    first = _repeat(stage, ctx, row, digest)
    if first is not None:
        return first
    entry = _entry(ctx, digest)
    charge = len(row) + len(entry.encode())
    if inbox.receipts + 1 > inbox.max_receipts or inbox.bytes + charge > inbox.max_bytes:
        raise Rejected(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"the inbox holds {inbox.receipts} receipts in {inbox.bytes} bytes: no room for one more",
        )
    results = apply_mutations(stage, body.effects, ctx)
    _keep_entry(stage, ctx, row, entry, charge)
    receipts = adjusted("receipts", inbox.receipts, 1)
    used = adjusted("bytes", inbox.bytes, charge)
    save(stage, config_row, replace(inbox, receipts=receipts, bytes=used))
    return _receipt(ctx, results)
