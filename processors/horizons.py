"""Idempotency horizons: how long a command id's stored outcome, and then its receipt, is kept.

A stored outcome answers every repeat of its command id, so kept forever it makes the projection
grow with every command ever applied. From feature level 2 (processors/features.py) a domain's
policy (ConfigureDomain; absent: the defaults of keyload/limits.py) bounds that in log time:

- within the outcome horizon of the command's evaluation, a repeat gets the stored outcome;
- then the outcome shrinks to a receipt (`O`: its fingerprint, offset, time and error code), and a
  repeat until the receipt horizon is refused with HistoryUnavailable, naming the offset and how
  the command ended: the id stays taken, and nothing is applied twice;
- after the receipt horizon the command id is new.

From feature level 4 finished work keeps to the same horizons, counted from when it finished: a
finished inline message's metadata for the outcome horizon, then an identity tombstone (`u`: when and
how it ended) until the receipt horizon, so its id is not used again until then; inbox entries,
target-inbox receipts and deleted documents' tombstones until the receipt horizon.

The horizons in force when an outcome is stored (a message finishes, an entry is written) are the
ones it keeps: a ConfigureDomain applies to what is stored after it. What was stored before the
partition reached the level is kept as it was. Each row kept to a horizon has an entry in the
horizon index (`H`, by expiry). The partition's horizon sweep is one entry of the due index
(keys.HORIZON_SWEEP, due at the earliest expiry), so it fires before a record like any timer,
within the record's timer budget, and looks at nothing that is not due: a replay removes exactly
the same rows at the same records.
"""

from __future__ import annotations

from itertools import islice

from msgspec.structs import replace

from keyload.log.codec import Record
from keyload.processors.context import Context
from keyload.processors.counters import adjusted
from keyload.processors.domains import domain_policy
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import LEASES_KEPT, OUTCOME_HORIZONS
from keyload.processors.fingerprints import FINGERPRINT_BYTES
from keyload.processors.outcomes import without_bodies
from keyload.processors.queues.state import move_due_entry
from keyload.projections import keys
from keyload.projections.records import (
    DocumentRecord,
    InboxRecord,
    MessageMeta,
    MessageState,
    QueueView,
    load,
    save,
)
from keyload.projections.store import Readable, Staged

# The first byte of a horizon index entry: what the row it names is (projections/keys.py, `H`). A command's
# outcome or receipt; from level 4 a finished message's metadata, a deleted document's tombstone (then u64
# its revision and u64 its deletion time), or a row that just goes (an identity tombstone, an inbox entry;
# a target inbox's then u64 what it was charged).
NAMES_OUTCOME, NAMES_RECEIPT, NAMES_HISTORY, NAMES_TOMBSTONE, NAMES_EXPIRING = b"o", b"r", b"m", b"t", b"d"


def store_outcome(stage: Staged, outcome: Record, fingerprint: bytes, encoded: bytes, level: int) -> None:
    """Keep a command's outcome (`encoded`) for repeats of its id: from level 2, until its domain's
    horizons, counted from the outcome's evaluation time; from level 3 a receive's without the
    bodies. `level` is the partition's feature level (the caller has read it). The index entry
    holds what the receipt will, so the sweep never decodes an outcome."""
    domain, command_id = outcome["domain"], outcome["command_id"]
    kept = without_bodies(outcome, encoded) if level >= LEASES_KEPT else encoded
    stage.put(keys.outcome(domain, command_id), fingerprint + kept)
    if level < OUTCOME_HORIZONS:
        return
    policy = domain_policy(stage, domain)
    stored_ms = outcome["eval_time_ms"]
    expires_ms = stored_ms + policy.outcome_horizon_ms
    receipt_until_ms = stored_ms + policy.receipt_horizon_ms
    entry = NAMES_OUTCOME
    if receipt_until_ms > expires_ms:
        error_code = (outcome["error_code"] or "").encode("utf-8")
        entry += keys.u64(receipt_until_ms) + keys.u64(outcome["offset"]) + keys.u64(stored_ms) + error_code
    _index(stage, keys.horizon(expires_ms, domain, command_id), entry, expires_ms)


def retire_message(stage: Staged, queue: QueueView, message_id: str, meta: MessageMeta) -> None:
    """From level 4, a finished inline message's history (its MessageMeta) is kept for its domain's
    outcome horizon from when it finished, then an identity tombstone until the receipt horizon, so
    its id is not used again until then; then the id is new. (A large message's history goes with
    its object's retention task, processors/payloads/retention.py, and from level 8 its identity
    keeps to the receipt horizon from there.)"""
    assert meta.terminal_at_ms is not None and meta.payload is None
    policy = domain_policy(stage, queue.domain)
    finished_ms = meta.terminal_at_ms
    expires_ms = finished_ms + policy.outcome_horizon_ms
    identity_until_ms = finished_ms + policy.receipt_horizon_ms
    entry = NAMES_HISTORY
    if identity_until_ms > expires_ms:
        entry += keys.u64(identity_until_ms) + identity_tombstone(finished_ms, meta.state)
    _index(stage, keys.horizon_of_row(expires_ms, keys.message(queue.incarnation, message_id)), entry, expires_ms)


def identity_tombstone(finished_ms: int, state: MessageState) -> bytes:
    """What a finished message's identity row holds (keys.IDENTITY): when and how it ended."""
    return keys.u64(finished_ms) + state.value.encode("utf-8")


def read_identity_tombstone(value: bytes) -> tuple[int, str] | None:
    """(finished ms, terminal state) of an identity tombstone; None for a large message's identity
    row (its reservation id)."""
    if len(value) == 8:
        return None
    return keys.read_u64(value), value[8:].decode("utf-8")


def keep_until_receipt_horizon(stage: Staged, row: bytes, domain: str, since_ms: int, charge: int = 0) -> None:
    """Let `row` go at its domain's receipt horizon from `since_ms`, as the horizon is now: an inbox
    entry (from level 4), a topic's event id (from level 6) or a large message's identity (from
    level 8) when a command id applied now would become new. A target inbox entry's `charge` then
    goes back to its inbox."""
    expires_ms = since_ms + domain_policy(stage, domain).receipt_horizon_ms
    entry = NAMES_EXPIRING + (keys.u64(charge) if row[:1] == keys.TARGET_INBOX_ENTRY else b"")
    _index(stage, keys.horizon_of_row(expires_ms, row), entry, expires_ms)


def keep_tombstone_until_receipt_horizon(stage: Staged, row: bytes, tombstone: DocumentRecord, domain: str) -> None:
    """Let a deleted document's tombstone (from level 4) go at the domain's receipt horizon, unless
    the document is written again first. After it the key's revisions restart at 1, so the entry
    names the tombstone by its revision and its deletion time, which together no later one has."""
    deleted_ms = tombstone.updated_at_ms
    expires_ms = deleted_ms + domain_policy(stage, domain).receipt_horizon_ms
    entry = NAMES_TOMBSTONE + keys.u64(tombstone.revision) + keys.u64(deleted_ms)
    _index(stage, keys.horizon_of_row(expires_ms, row), entry, expires_ms)


def _index(stage: Staged, key: bytes, entry: bytes, expires_ms: int) -> None:
    stage.put(key, entry)
    armed = _sweep_due(stage)
    if armed is None or expires_ms < armed:
        _arm(stage, armed, expires_ms)


def repeat_past_horizon(stage: Readable, domain: str, command_id: str, fingerprint: bytes) -> Rejected | None:
    """Why a repeat of a command id whose outcome left only a receipt is refused; None when the id
    has no receipt (it is new, or its outcome is still stored)."""
    receipt = stage.get(keys.receipt(domain, command_id))
    if receipt is None:
        return None
    if receipt[:FINGERPRINT_BYTES] != fingerprint:
        return Rejected(ErrorCode.CONFLICT, "command id was used for a different command")
    offset = keys.read_u64(receipt, FINGERPRINT_BYTES)
    error_code = receipt[FINGERPRINT_BYTES + 16 :].decode("utf-8")
    ended = f"rejected with {error_code}" if error_code else "committed"
    return Rejected(
        ErrorCode.HISTORY_UNAVAILABLE,
        f"command id was applied at offset {offset} ({ended}); its outcome is past the domain's outcome horizon",
    )


def sweep(stage: Staged, due_ms: int, ctx: Context, budget: int) -> int:
    """Let at most `budget` expired rows go, earliest first: an outcome leaves its receipt, and a
    finished message's metadata its identity tombstone, when they have a receipt horizon. The
    horizon index entries it removed."""
    end = keys.HORIZON + keys.u64(ctx.now_ms + 1)
    due = list(islice(stage.scan(keys.HORIZON + keys.u64(due_ms), end), budget))
    if not due:
        raise Corruption("the horizon sweep is due but nothing in the horizon index expires")
    followers: list[int] = []  # the expiries of the rows left behind: one may fall before the last row swept
    for key, entry in due:
        stage.delete(key)
        row = keys.horizon_row(key)
        if row is None:
            _sweep_command(stage, key, entry, followers)
        else:
            _sweep_row(stage, row, entry, followers)
    # Past the rows swept (deleted here, so not walked again), and the rows left behind by them.
    following = stage.first(due[-1][0] + b"\x00", keys.prefix_end(keys.HORIZON))
    expiries = followers + ([] if following is None else [keys.horizon_expiry(following[0])])
    _arm(stage, due_ms, min(expiries, default=None))
    return len(due)


def _sweep_command(stage: Staged, key: bytes, entry: bytes, followers: list[int]) -> None:
    """An outcome goes, leaving its receipt when it has a receipt horizon; or a receipt goes."""
    domain, command_id = keys.parse_horizon(key)
    row = keys.outcome(domain, command_id) if entry[:1] == NAMES_OUTCOME else keys.receipt(domain, command_id)
    stored = stage.get(row)
    if stored is None:
        raise Corruption(f"the horizon index names command {command_id!r}, which has no such row")
    stage.delete(row)
    if len(entry) > 1:  # an outcome's receipt: expiry | offset | evaluation time | error code
        followers.append(keys.read_u64(entry, 1))
        stage.put(keys.receipt(domain, command_id), stored[:FINGERPRINT_BYTES] + entry[9:])
        stage.put(keys.horizon(followers[-1], domain, command_id), NAMES_RECEIPT)


def _sweep_row(stage: Staged, row: bytes, entry: bytes, followers: list[int]) -> None:
    """A finished message's history goes, leaving its identity tombstone when it has one; a deleted
    document's tombstone goes unless it was written again since; or a row goes. A deleted queue,
    group or topic reclaims its rows on its own (processors/reclamation.py), maybe first: its rows may be
    gone, and leave nothing behind. So may a document's later tombstone, under a shorter horizon. (A
    topic that never had a retention timer has no `i` row and counts as deleted here: a missing
    event-id row of a live topic goes unnoticed, where a missing row of a queue or group is
    Corruption.)"""
    tombstone = entry[:1] == NAMES_TOMBSTONE
    retired = _owner_retired(stage, row)
    stored = stage.get(row)
    if stored is None:
        if not (retired or tombstone):
            raise Corruption(f"the horizon index names row {row.hex()}, which is missing")
        return
    if tombstone:
        document = DocumentRecord.decode(stored)
        named = (keys.read_u64(entry, 1), keys.read_u64(entry, 9))
        if not document.deleted or (document.revision, document.updated_at_ms) != named:
            return  # written again since: live, or another tombstone with an entry of its own
    stage.delete(row)
    if row[:1] == keys.TARGET_INBOX_ENTRY:
        _release_receipt(stage, row, keys.read_u64(entry, 1))
    if entry[:1] == NAMES_HISTORY and len(entry) > 1 and not retired:  # expiry | identity tombstone
        followers.append(keys.read_u64(entry, 1))
        identity = keys.IDENTITY + row[1:]  # the same queue id | message id
        stage.put(identity, entry[9:])
        stage.put(keys.horizon_of_row(followers[-1], identity), NAMES_EXPIRING)


def _release_receipt(stage: Staged, row: bytes, charge: int) -> None:
    """A target inbox entry's room goes back to its domain's inbox: what CommitInbox charged (a
    schema migration may re-encode the entry since, so its bytes now are not the measure)."""
    config_row = keys.inbox_config(keys.domain_of(row))
    inbox = load(stage, config_row, InboxRecord)
    if inbox is None:
        raise Corruption(f"inbox entry {row.hex()} has no inbox")
    receipts = adjusted("receipts", inbox.receipts, -1)
    used = adjusted("bytes", inbox.bytes, -charge)
    save(stage, config_row, replace(inbox, receipts=receipts, bytes=used))


def _owner_retired(stage: Readable, row: bytes) -> bool:
    """Whether the queue, group or topic a row is kept under (its first u64) is deleted; the domain
    of a target inbox entry or a document never is. A topic has an `i` row only once it has had a
    retention timer, so one without counts as deleted: its event-id rows are only ever deleted."""
    if row[:1] in (keys.TARGET_INBOX_ENTRY, keys.DOCUMENT):
        return False
    resource = stage.get(keys.resource_key(keys.read_u64(row, 1)))
    return resource is None or resource[:1] in (keys.RETIRED, keys.RETIRED_GROUP, keys.RETIRED_TOPIC)


def _sweep_due(stage: Readable) -> int | None:
    raw = stage.get(keys.HORIZON_DUE)
    return None if raw is None else keys.read_u64(raw)


def _arm(stage: Staged, previous: int | None, earliest: int | None) -> None:
    """Move the horizon sweep's due-index entry (and HORIZON_DUE) from `previous` to `earliest`."""
    move_due_entry(stage, keys.HORIZON_SWEEP, previous, earliest)
    if earliest is None:
        stage.delete(keys.HORIZON_DUE)
    else:
        stage.put(keys.HORIZON_DUE, keys.u64(earliest))
