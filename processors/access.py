"""Access control: who sent a command (authentication) and whether they may run it (authorization).

The policy is partition state, changed only by logged admin commands (processors/principals.py):
a `PrincipalRecord` per principal (`A | name`: its key id, whether it is enabled, its grants) and
the partition's policy epoch (`META|policy_epoch`, one more per change). Principal commands are
partition-wide, so every partition holds every principal. A partition whose log has applied no
`EnableAccessControl` has no epoch: it applies every well-formed command as keyload did before
access control (a log written then replays as it did); `keyload run` turns access control on in
every partition before it serves.

With access control on, every command is a `keyload.Signed` record (keyload/credentials.py):
its key id must be the key of the principal the command names, that principal enabled, and the
MAC right under the key the service's keyring holds for the id. The decision depends only on the
projection, the record's bytes and the keyring, so a replay with the same keyring decides alike.
A key the policy names but the keyring lacks is not a refusal (a processor holding the key would
decide otherwise): the runtime reloads the keyring, and halts the partition if it is still missing.

Authorization: the command table names each kind's capability and the body field naming its
resource (keyload/commands.py). A grant allows its capability, or every capability when it is
`admin`, on the domains and resources its patterns match: an exact name, a prefix ending in `*`,
or `*`. A partition-wide command (keys, ticks, checkpoints, retention, principals) is allowed only
by a grant on every domain and resource ("*", "*"). Each mutation of a batch and each effect of a
processing is authorized as the command it is, before any applies (`authorize`, for a repeat of
the command id too), and the queue a delivery token names is checked when the token is read
(processors/queues/leases.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from keyload.bodies import BODY_TYPES
from keyload.commands import BY_BRANCH, Capability, CommandKind, part_refused
from keyload.credentials import SignedRecord
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.key_rotation import MissingKey
from keyload.projections import keys
from keyload.projections.records import Grant, PrincipalRecord
from keyload.projections.store import Readable, Staged

EVERYTHING = "*"
PRINCIPALS_DECODED = 1024  # principal records kept decoded (frozen, so shared safely)


def policy_epoch(stage: Readable) -> int | None:
    """The partition's policy epoch; None while access control is off."""
    raw = stage.get(keys.POLICY_EPOCH)
    return None if raw is None else keys.read_u64(raw)


def denied(detail: str) -> Rejected:
    return Rejected(ErrorCode.PERMISSION_DENIED, detail)


def load_principal(stage: Readable, name: str) -> PrincipalRecord | None:
    """The principal `name`; read on every authenticated command, so its stored bytes are decoded
    once (a principal changes rarely: a new revision is new bytes)."""
    raw = stage.get(keys.principal(name))
    return None if raw is None else _principal(raw)


@functools.lru_cache(maxsize=PRINCIPALS_DECODED)
def _principal(raw: bytes) -> PrincipalRecord:
    return PrincipalRecord.decode(raw)


def authenticate(
    stage: Staged, principal: str, signed: SignedRecord | None, keyring: Mapping[str, bytes]
) -> PrincipalRecord:
    """The principal that sent a command, proven by its signature; PermissionDenied otherwise.
    The refusals do not say which check failed beyond what the sender already knows."""
    record = load_principal(stage, principal)
    if record is None:
        raise denied(UNKNOWN_SIGNER)
    return verify(record, signed, keyring)


UNKNOWN_SIGNER = "no enabled principal of this name signs with this key id"


def verify(record: PrincipalRecord, signed: SignedRecord | None, keyring: Mapping[str, bytes]) -> PrincipalRecord:
    """`record`, when it is enabled and `signed` is signed with its key; PermissionDenied otherwise.
    Whether the principal exists or is disabled is not told apart (the sender is not known yet),
    and the key is looked up only for an enabled principal, so a record naming a principal whose
    key the keyring lacks cannot halt the partition unless that principal may act."""
    if signed is None:
        raise denied("the command is not signed")
    if record.key_id != signed.key_id or not record.enabled:
        raise denied(UNKNOWN_SIGNER)
    if not signed.verify(key_of(keyring, record)):
        raise denied("the signature does not match the command")
    return record


def key_of(keyring: Mapping[str, bytes], record: PrincipalRecord) -> bytes:
    """The key material of a principal's key id. A key the policy names but the keyring lacks is
    not a refusal (a processor holding it would decide otherwise): MissingKey, and the runtime
    reloads the keyring or halts the partition."""
    key = keyring.get(record.key_id)
    if key is None:
        raise MissingKey(f"keyring has no key {record.key_id!r}, the key of principal {record.principal!r}")
    return key


def service_key(stage: Readable, ctx: Context, key_id: str) -> bytes | None:
    """The keyring key `key_id` names when it may have signed something the service issued (a
    delivery token): None for a key that is, or ever was, a principal's, whose holder could sign
    anything with it."""
    return None if is_principal_key(stage, key_id) else ctx.keyring.get(key_id)


def is_principal_key(stage: Readable, key_id: str) -> bool:
    return stage.get(keys.principal_key(key_id)) is not None


def matches(pattern: str, name: str) -> bool:
    """Whether a grant's domain or resource pattern covers `name`."""
    if pattern.endswith(EVERYTHING):
        return name.startswith(pattern[:-1])
    return pattern == name


def allows(grants: Iterable[Grant], capability: Capability, domain: str | None, resource: str | None) -> bool:
    """Whether `grants` allow `capability` on `resource` of `domain`. A domain of None is the whole
    partition, which only a grant on "*" and "*" reaches. A resource is a name, EVERYTHING (a command
    on every resource of its domain: only "*" covers it), or None (a command whose handler checks the
    resource it finds: a grant on any resource of the domain lets it that far)."""
    for grant in grants:
        if grant.capability not in (capability, Capability.admin):
            continue
        if domain is None:
            if grant.domain == EVERYTHING and grant.resource == EVERYTHING:
                return True
        elif matches(grant.domain, domain) and (resource is None or _covers(grant.resource, resource)):
            return True
    return False


def _covers(pattern: str, resource: str) -> bool:
    """A grant's resource pattern covers `resource`; only "*" covers EVERYTHING."""
    return pattern == EVERYTHING if resource == EVERYTHING else matches(pattern, resource)


def may_still(stage: Staged, principal: str, capability: Capability, domain: str, resource: str) -> bool:
    """Whether a principal that asked earlier (a long poll waiting) may still be given `capability`'s
    answer now: access control is off, or it is enabled and holds the grant. The waiter was
    authorized when it was recorded; a disabled principal or a revoked grant since must not get
    messages, or their bodies, afterwards."""
    if policy_epoch(stage) is None:
        return True
    record = load_principal(stage, principal)
    return record is not None and record.enabled and allows(record.grants, capability, domain, resource)


def require(ctx: Context, capability: Capability, resource: str | None, *, every_domain: bool = False) -> None:
    """PermissionDenied, naming the capability, unless the command's principal holds it here (with
    `every_domain`, on every domain: a partition-wide or an operator's command). Nothing is checked
    while access control is off (`ctx.caller` is None)."""
    if ctx.caller is None:
        return
    domain = None if every_domain else ctx.domain
    if not allows(ctx.caller.grants, capability, domain, resource):
        where = (
            "every domain"
            if domain is None
            else "this domain"
            if resource is None
            else "every resource of this domain"
            if resource == EVERYTHING
            else "this resource"
        )
        raise denied(f"the principal holds no {capability.value} grant on {where}")


def authorize(ctx: Context, kind: CommandKind, body: Any) -> None:
    """Check the capability the table names for `kind` on the resource its body names, and each of
    its parts (a Batch's mutations, a processing's effects) as the command it is: a refused part
    rejects the whole command with its index. A self-service kind (InspectPrincipal) naming the
    caller needs no capability of its own."""
    if kind.capability is not None and not (kind.self_service and body.principal in (None, ctx.principal)):
        if kind.resource is not None:
            resource: str | None = getattr(body, kind.resource)
        else:
            resource = None if kind.resource_in_handler else EVERYTHING
        require(ctx, kind.capability, resource, every_domain=kind.partition_wide or kind.operator)
    if kind.parts is None or ctx.caller is None:
        return
    for index, part in enumerate(getattr(body, kind.parts)):
        branch, mutation = part.mutation
        try:
            authorize(ctx, BY_BRANCH[branch], BODY_TYPES[branch].from_avro(mutation))
        except Rejected as refusal:
            raise Rejected(refusal.code, part_refused(index, refusal.detail), index) from None
