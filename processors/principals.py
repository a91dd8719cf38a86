"""Principals and grants: the logged policy that processors/access.py enforces.

Each change (EnableAccessControl, PutPrincipal, a grant or revoke that changes something) bumps
the principal's revision and the partition's policy epoch. Principal commands are partition-wide
(the SDK sends each to every partition under one command id), so each partition holds every
principal; a grant's patterns say which domains it reaches. Key material never enters the log:
a principal names its key by id, and the keyring of the service holds the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from keyload import limits
from keyload.bodies import EnableAccessControl, GrantCapability, InspectPrincipal, PutPrincipal, RevokeCapability
from keyload.commands import Capability
from keyload.log.codec import Record
from keyload.processors import validation
from keyload.processors.access import EVERYTHING, allows, load_principal, policy_epoch
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.features import PRINCIPALS_CHECKED, RETIRED_KEYS_REFUSED, SERVICE_ACTORS_KEPT, feature_level
from keyload.processors.key_rotation import JITTER, PROOF, TOKEN, MissingKey, active_key_id
from keyload.projections import keys
from keyload.projections.records import Grant, PrincipalRecord, save
from keyload.projections.store import Readable, Staged

FIRST_REVISION = 1
TICKER_PRINCIPAL = "keyload-ticker"
GC_PRINCIPAL = "keyload-gc"
CHECKPOINTER_PRINCIPAL = "keyload-checkpointer"
# The service's actors, with the capability each acts with on every domain: the service signs their
# commands with their fixed keys (keyload/storage/principals.py), so from SERVICE_ACTORS_KEPT each
# keeps its key, stays enabled and keeps that capability (`_keeps_acting`).
SERVICE_ACTORS: Mapping[str, Capability] = {
    TICKER_PRINCIPAL: Capability.tick,
    GC_PRINCIPAL: Capability.recovery,
    CHECKPOINTER_PRINCIPAL: Capability.checkpoint,
}


def system_key_id(principal: str) -> str:
    """The fixed keyring key id of the service's own principals (the administrator's first key, an
    actor's only one)."""
    return f"{principal}-1"


SERVICE_KEYS = (TOKEN, JITTER, PROOF)  # the purposes the partition's own keys serve (processors/key_rotation.py)


def _check_name(principal: str) -> None:
    if not 1 <= len(principal) <= limits.MAX_PRINCIPAL_CHARS:
        raise Rejected(ErrorCode.VALIDATION, f"a principal is 1..{limits.MAX_PRINCIPAL_CHARS} characters")


def _check_key_id(key_id: str) -> None:
    if not limits.KEY_ID_PATTERN.fullmatch(key_id):
        raise Rejected(ErrorCode.VALIDATION, limits.KEY_ID_RULE)


def _has_control(text: str) -> bool:
    """Whether `text` holds a control character: Unicode category Cc, the same set in every Unicode
    version (str.isprintable follows the interpreter's Unicode, and a replay must not)."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


def _check_new_name(stage: Staged, principal: str) -> None:
    """A principal about to be created: from feature level 11 its name has no control character
    (it travels in paths, credential files and bearer tokens)."""
    if feature_level(stage) >= PRINCIPALS_CHECKED and _has_control(principal):
        raise Rejected(ErrorCode.VALIDATION, "a principal's name has no control characters")


def _check_new_grants(stage: Staged, grants: Iterable[Grant]) -> None:
    """Grants given anew: from feature level 11 their patterns hold no control character (one held
    from before stays, and may be revoked or listed again)."""
    patterns = (pattern for grant in grants for pattern in (grant.domain, grant.resource))
    if feature_level(stage) >= PRINCIPALS_CHECKED and any(_has_control(pattern) for pattern in patterns):
        raise Rejected(ErrorCode.VALIDATION, "a grant pattern has no control characters")


def _grants(grants: Iterable[Grant]) -> list[Grant]:
    """Grants checked and in key order, each once."""
    found = sorted(set(grants))
    if len(found) > limits.MAX_GRANTS:
        raise Rejected(ErrorCode.VALIDATION, f"a principal holds at most {limits.MAX_GRANTS} grants")
    for grant in found:
        for pattern in (grant.domain, grant.resource):
            if not 1 <= len(pattern) <= limits.MAX_GRANT_PATTERN_CHARS:
                raise Rejected(
                    ErrorCode.VALIDATION, f"a grant pattern is 1..{limits.MAX_GRANT_PATTERN_CHARS} characters"
                )
            if EVERYTHING in pattern[:-1]:
                raise Rejected(ErrorCode.VALIDATION, "a grant pattern has '*' only at its end")
    return found


def _bump_epoch(stage: Staged) -> None:
    """One more policy change; the policy can change only once access control is on (the epoch's
    presence is what turns it on: processors/access.py)."""
    epoch = policy_epoch(stage)
    if epoch is None:
        raise Rejected(ErrorCode.CONFLICT, "access control is off in this partition; EnableAccessControl turns it on")
    stage.put(keys.POLICY_EPOCH, keys.u64(epoch + 1))


def _view(stage: Staged, record: PrincipalRecord) -> Record:
    return {"principal": record.to_avro(), "policy_epoch": policy_epoch(stage) or 0}


def _save(stage: Staged, record: PrincipalRecord, previous: PrincipalRecord | None, ctx: Context) -> Record:
    """Store `record`, which replaces `previous` (None: a new principal), as one policy change."""
    _bump_epoch(stage)
    if previous is not None:
        _keeps_acting(stage, previous, record)
    taken = previous is not None and _administers(previous) and not _administers(record)
    if taken and not _another_administrator(stage, record.principal):
        # Nobody could change the policy again: principals, grants and keys would stay as they are.
        raise Rejected(
            ErrorCode.CONFLICT,
            "it would leave no enabled principal with admin on every domain: grant another principal that first",
        )
    _install(stage, record, ctx)
    return _view(stage, record)


def _keeps_acting(stage: Staged, previous: PrincipalRecord, record: PrincipalRecord) -> None:
    """Refuse a change that would stop one of the service's actors acting (feature level 18): its
    Ticks, GC passes or checkpoint records, signed with its fixed key, would be refused for good
    (leases and delays would never run out, nothing would be collected). A change back to its fixed
    key is taken: below the level its key could be changed, and this mends it."""
    capability = SERVICE_ACTORS.get(record.principal)
    if capability is None or feature_level(stage) < SERVICE_ACTORS_KEPT:
        return
    if (
        record.key_id not in (previous.key_id, system_key_id(record.principal))
        or not record.enabled
        or not allows(record.grants, capability, None, EVERYTHING)
    ):
        raise Rejected(
            ErrorCode.CONFLICT,
            f"the service signs its {capability.value} commands as {record.principal}: it keeps its key, "
            f"stays enabled and keeps {capability.value} on every domain",
        )


def _administers(record: PrincipalRecord) -> bool:
    """Whether `record` may change the policy: enabled, with admin on every domain and resource."""
    return record.enabled and allows(record.grants, Capability.admin, None, EVERYTHING)


def _another_administrator(stage: Staged, principal: str) -> bool:
    """Whether a principal other than `principal` administers the partition: a scan of every
    principal, made only for a change that takes an administrator's admin away (a rare command)."""
    for _key, value in stage.scan(keys.PRINCIPAL, keys.prefix_end(keys.PRINCIPAL)):
        other = PrincipalRecord.decode(value)
        if other.principal != principal and _administers(other):
            return True
    return False


def _install(stage: Staged, record: PrincipalRecord, ctx: Context) -> None:
    """Save `record`, its key id claimed for it for good (`B | key id`): a key that is or was a
    principal's never verifies a delivery token (access.service_key) nor becomes a service key
    (RotateKeys), and no other principal may sign with it."""
    if record.key_id not in ctx.keyring:
        # As RotateKeys: whether a key exists is configuration, so not a refusal; the runtime
        # reloads the keyring, else halts here, on the administrator's own command.
        raise MissingKey(f"keyring has no key {record.key_id!r}")
    owner = stage.get(keys.principal_key(record.key_id))
    if owner is not None and owner.decode("utf-8") != record.principal:
        raise Rejected(ErrorCode.CONFLICT, "the key id is another principal's")
    if signs_for_the_partition(stage, record.key_id):
        raise Rejected(ErrorCode.VALIDATION, SERVICE_KEY_RULE)
    stage.put(keys.principal_key(record.key_id), record.principal.encode("utf-8"))
    save(stage, keys.principal(record.principal), record)


SERVICE_KEY_RULE = "the key id is one the partition signs tokens, jitter or proofs with"


def signs_for_the_partition(stage: Readable, key_id: str) -> bool:
    """Whether the partition signs tokens, jitter or proofs with `key_id` now (RotateKeys moves
    each), which no principal may hold. The partitions' keys may differ (RotateKeys can name one
    partition), so a partition-wide PutPrincipal is checked against each before it is sent."""
    return key_id in {active_key_id(stage, purpose) for purpose in SERVICE_KEYS}


def _existing(stage: Staged, principal: str) -> PrincipalRecord:
    _check_name(principal)
    record = load_principal(stage, principal)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "no such principal")
    return record


def enable_access_control(stage: Staged, body: EnableAccessControl, ctx: Context) -> Record:
    """Install the first principals and turn enforcement on. The signature was checked against
    the principal among them the command names, and its admin grant on every domain, before this
    ran (processors/apply.py)."""
    if policy_epoch(stage) is not None:
        raise Rejected(ErrorCode.CONFLICT, "access control is already on in this partition")
    if not 1 <= len(body.principals) <= limits.MAX_BOOTSTRAP_PRINCIPALS:
        raise Rejected(ErrorCode.VALIDATION, f"1..{limits.MAX_BOOTSTRAP_PRINCIPALS} principals are installed")
    if len({spec.principal for spec in body.principals}) != len(body.principals):
        raise Rejected(ErrorCode.VALIDATION, "a principal is installed twice")
    for spec in body.principals:
        _check_name(spec.principal)
        _check_new_name(stage, spec.principal)
        _check_key_id(spec.key_id)
        _check_new_grants(stage, spec.grants)
        record = PrincipalRecord(
            principal=spec.principal,
            key_id=spec.key_id,
            enabled=True,
            revision=FIRST_REVISION,
            grants=_grants(spec.grants),
        )
        _install(stage, record, ctx)
    stage.put(keys.POLICY_EPOCH, keys.u64(1))
    signer = load_principal(stage, ctx.principal)
    assert signer is not None, "apply.py authenticated the signer among the principals installed"
    return _view(stage, signer)


def put_principal(stage: Staged, body: PutPrincipal, ctx: Context) -> Record:
    _check_name(body.principal)
    existing = load_principal(stage, body.principal)
    if existing is None and body.key_id is None and feature_level(stage) >= PRINCIPALS_CHECKED:
        # A change (enable, disable, grants) to a principal that is not there, not a failed create.
        raise Rejected(ErrorCode.NOT_FOUND, "no such principal (creating one takes a key_id)")
    if body.expected_revision is not None:
        validation.check_integer("PutPrincipal.expected_revision", body.expected_revision)
        live = 0 if existing is None else existing.revision
        if live != body.expected_revision:
            raise Rejected(ErrorCode.REVISION_CONFLICT, f"the principal is at revision {live}")
    if body.key_id is not None:
        _check_key_id(body.key_id)
        if existing is not None and _retired(stage, existing, body.key_id):
            raise Rejected(ErrorCode.CONFLICT, "the key id is one the principal held before: retired keys never return")
    grants = None if body.grants is None else _grants(body.grants)
    if grants is not None:
        _check_new_grants(stage, [grant for grant in grants if existing is None or grant not in existing.grants])
    if existing is None:
        _check_new_name(stage, body.principal)
        if body.key_id is None:
            raise Rejected(ErrorCode.VALIDATION, "a new principal needs a key_id")
        record = PrincipalRecord(
            principal=body.principal,
            key_id=body.key_id,
            enabled=True if body.enabled is None else body.enabled,
            revision=FIRST_REVISION,
            grants=grants or [],
        )
    else:
        record = msgspec.structs.replace(
            existing,
            key_id=existing.key_id if body.key_id is None else body.key_id,
            enabled=existing.enabled if body.enabled is None else body.enabled,
            grants=existing.grants if grants is None else grants,
            revision=existing.revision + 1,
        )
    return _save(stage, record, existing, ctx)


def _retired(stage: Staged, principal: PrincipalRecord, key_id: str) -> bool:
    """Whether `key_id` is a key the principal held and was rotated away from (feature level 17): a
    rotation may retire a key because it leaked, so none brings it back (a repeat of the rotation
    that made it is answered its stored outcome before this is asked)."""
    level = feature_level(stage)
    if key_id == principal.key_id or level < RETIRED_KEYS_REFUSED:
        return False
    actor = level >= SERVICE_ACTORS_KEPT and principal.principal in SERVICE_ACTORS
    if actor and key_id == system_key_id(principal.principal):
        return False  # an actor's fixed key may return (`_keeps_acting`)
    owner = stage.get(keys.principal_key(key_id))
    return owner is not None and owner.decode("utf-8") == principal.principal


def grant_capability(stage: Staged, body: GrantCapability, ctx: Context) -> Record:
    record = _existing(stage, body.principal)
    if body.grant in record.grants:
        return _view(stage, record)
    _check_new_grants(stage, [body.grant])
    grants = _grants([*record.grants, body.grant])
    return _save(stage, msgspec.structs.replace(record, grants=grants, revision=record.revision + 1), record, ctx)


def revoke_capability(stage: Staged, body: RevokeCapability, ctx: Context) -> Record:
    record = _existing(stage, body.principal)
    if body.grant not in record.grants:
        if feature_level(stage) >= PRINCIPALS_CHECKED:  # a pattern no grant can hold is refused
            _grants([body.grant])
            _check_new_grants(stage, [body.grant])
        return _view(stage, record)
    grants = [grant for grant in record.grants if grant != body.grant]
    return _save(stage, msgspec.structs.replace(record, grants=grants, revision=record.revision + 1), record, ctx)


def inspect_principal(stage: Staged, body: InspectPrincipal, ctx: Context) -> Record:
    """Anyone may inspect itself (whoami); another principal takes admin on every domain (the
    table's row: self-service)."""
    return _view(stage, _existing(stage, ctx.principal if body.principal is None else body.principal))
