"""Idempotency horizons: how long a command id's stored outcome, and then its receipt, is kept.

A stored outcome answers every repeat of its command id, so kept forever it makes the projection
grow with every command ever applied. From feature level 2 (processors/features.py) a domain's
policy (ConfigureDomain; absent: the defaults of keyload/limits.py) bounds that in log time:

- within the outcome horizon of the command's evaluation, a repeat gets the stored outcome;
- then the outcome shrinks to a receipt (`O`: its fingerprint, offset, time and error code), and a
  repeat until the receipt horizon is refused with HistoryUnavailable, naming the offset and how
  the command ended: the id stays taken, and nothing is applied twice;
- after the receipt horizon the command id is new.

The horizons in force when an outcome is stored are the ones it keeps: a ConfigureDomain applies
to outcomes stored after it. Outcomes stored before the partition reached level 2 are kept as they
were. Each stored outcome has an entry in the horizon index (`H`, by expiry). The partition's
horizon sweep is one entry of the due index (keys.HORIZON_SWEEP, due at the earliest expiry), so
it fires before a record like any timer, within the record's timer budget, and looks at nothing
that is not due: a replay removes exactly the same rows at the same records.
"""

from __future__ import annotations

from itertools import islice

from keyload import limits
from keyload.bodies import ConfigureDomain, InspectDomain
from keyload.log.codec import Record
from keyload.processors import validation
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import LEASES_KEPT, OUTCOME_HORIZONS
from keyload.processors.fingerprints import FINGERPRINT_BYTES
from keyload.processors.outcomes import without_bodies
from keyload.processors.queues.state import move_due_entry
from keyload.projections import keys
from keyload.projections.records import DomainRecord, load, save
from keyload.projections.store import Readable, Staged

# The first byte of a horizon index entry: what the row it names is (projections/keys.py, `H`).
NAMES_OUTCOME, NAMES_RECEIPT = b"o", b"r"

DEFAULT_POLICY = DomainRecord(
    outcome_horizon_ms=limits.DEFAULT_OUTCOME_HORIZON_MS,
    receipt_horizon_ms=limits.DEFAULT_RECEIPT_HORIZON_MS,
    policy_version=0,
)


def domain_policy(stage: Staged, domain: str) -> DomainRecord:
    """The domain's policy: as ConfigureDomain last set it, else the defaults (policy version 0)."""
    return load(stage, keys.domain_policy(domain), DomainRecord) or DEFAULT_POLICY


def _view(domain: str, policy: DomainRecord) -> Record:
    return dict(policy.to_avro(), domain=domain)


def configure_domain(stage: Staged, body: ConfigureDomain, ctx: Context) -> Record:
    """Replace the domain's whole policy, fenced by an optional expected policy version. A null
    receipt horizon is the default, or the outcome horizon when that is longer."""
    current = domain_policy(stage, ctx.domain)
    expected = body.expected_policy_version
    detail = f"policy version is {current.policy_version}, expected {expected}"
    validation.check_fence("ConfigureDomain.expected_policy_version", expected, current.policy_version, detail)
    outcome_ms = body.outcome_horizon_ms
    if outcome_ms is None:
        outcome_ms = limits.DEFAULT_OUTCOME_HORIZON_MS
    validation.check_integer("ConfigureDomain.outcome_horizon_ms", outcome_ms)
    receipt_ms = body.receipt_horizon_ms
    if receipt_ms is None:
        receipt_ms = max(limits.DEFAULT_RECEIPT_HORIZON_MS, outcome_ms)
    validation.check_integer("ConfigureDomain.receipt_horizon_ms", receipt_ms)
    if receipt_ms < outcome_ms:
        raise Rejected(ErrorCode.VALIDATION, "receipt_horizon_ms must be at least outcome_horizon_ms")
    policy = DomainRecord(
        outcome_horizon_ms=outcome_ms, receipt_horizon_ms=receipt_ms, policy_version=current.policy_version + 1
    )
    save(stage, keys.domain_policy(ctx.domain), policy)
    return _view(ctx.domain, policy)


def inspect_domain(stage: Staged, body: InspectDomain, ctx: Context) -> Record:
    return _view(ctx.domain, domain_policy(stage, ctx.domain))


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
    stage.put(keys.horizon(expires_ms, domain, command_id), entry)
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
    """Let at most `budget` expired outcomes and receipts go, earliest first: an outcome leaves its
    receipt when it has a receipt horizon. The rows it removed."""
    end = keys.HORIZON + keys.u64(ctx.now_ms + 1)
    due = list(islice(stage.scan(keys.HORIZON + keys.u64(due_ms), end), budget))
    if not due:
        raise Corruption("the horizon sweep is due but no outcome or receipt expires")
    receipts: list[int] = []  # the expiries of the receipts written: one may fall before the last row swept
    for key, entry in due:
        _, domain, command_id = keys.parse_horizon(key)
        stage.delete(key)
        row = keys.outcome(domain, command_id) if entry[:1] == NAMES_OUTCOME else keys.receipt(domain, command_id)
        stored = stage.get(row)
        if stored is None:
            raise Corruption(f"the horizon index names command {command_id!r}, which has no such row")
        stage.delete(row)
        if len(entry) > 1:  # an outcome's receipt: expiry | offset | evaluation time | error code
            receipts.append(keys.read_u64(entry, 1))
            stage.put(keys.receipt(domain, command_id), stored[:FINGERPRINT_BYTES] + entry[9:])
            stage.put(keys.horizon(receipts[-1], domain, command_id), NAMES_RECEIPT)
    # Past the rows swept (deleted here, so not walked again), and the receipts written before them.
    following = stage.first(due[-1][0] + b"\x00", keys.prefix_end(keys.HORIZON))
    expiries = receipts + ([] if following is None else [keys.parse_horizon(following[0])[0]])
    _arm(stage, due_ms, min(expiries, default=None))
    return len(due)


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
