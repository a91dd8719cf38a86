"""A domain's policy: its idempotency horizons and, from feature level 5, its caps.

The policy is one record (`D | domain` → DomainRecord; absent: the defaults of keyload/limits.py,
policy version 0) with two writers. ConfigureDomain sets the horizons (processors/horizons.py says
what they bound) and is a tenant's to use (`resource_manage`). ConfigureDomainCaps sets the caps
(processors/usage.py says what they bound) and is an operator's, `admin` on every domain: a tenant,
or a domain's own administrator, that could raise its caps would not be bounded by them. Each
replaces its part whole (a null field: the default), keeps the other's, and moves the one policy
version both are fenced by.
"""

from __future__ import annotations

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import ConfigureDomain, ConfigureDomainCaps, InspectDomain
from keyload.log.codec import Record
from keyload.processors import usage, validation
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.features import DOMAIN_CAPS, feature_level
from keyload.projections import keys
from keyload.projections.records import DomainRecord, load, save
from keyload.projections.store import Readable, Staged

DEFAULT_POLICY = DomainRecord(
    outcome_horizon_ms=limits.DEFAULT_OUTCOME_HORIZON_MS,
    receipt_horizon_ms=limits.DEFAULT_RECEIPT_HORIZON_MS,
    policy_version=0,
)


def domain_policy(stage: Staged, domain: str) -> DomainRecord:
    """The domain's policy: as ConfigureDomain and ConfigureDomainCaps last set it, else the defaults
    (policy version 0)."""
    return load(stage, keys.domain_policy(domain), DomainRecord) or DEFAULT_POLICY


def _fenced(stage: Staged, kind: str, expected: int | None, domain: str) -> DomainRecord:
    """The current policy, when `expected` (a `kind` command's expected_policy_version) allows the change."""
    current = domain_policy(stage, domain)
    detail = f"policy version is {current.policy_version}, expected {expected}"
    validation.check_fence(f"{kind}.expected_policy_version", expected, current.policy_version, detail)
    return current


def _view(stage: Readable, domain: str, policy: DomainRecord) -> Record:
    """The DomainView: the horizons, and from level 5 the caps and what the domain holds."""
    return dict(policy.to_avro(), domain=domain) | usage.view(stage, domain, policy)


def configure_domain(stage: Staged, body: ConfigureDomain, ctx: Context) -> Record:
    """Replace the domain's horizons, fenced by an optional expected policy version. A null receipt
    horizon is the default, or the outcome horizon when that is longer."""
    current = _fenced(stage, "ConfigureDomain", body.expected_policy_version, ctx.domain)
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
    policy = replace(
        current, outcome_horizon_ms=outcome_ms, receipt_horizon_ms=receipt_ms, policy_version=current.policy_version + 1
    )
    save(stage, keys.domain_policy(ctx.domain), policy)
    return _view(stage, ctx.domain, policy)


def configure_domain_caps(stage: Staged, body: ConfigureDomainCaps, ctx: Context) -> Record:
    """Replace the domain's caps, each given or its default, fenced by an optional expected policy
    version; from level 5. A cap below what the domain holds removes nothing (processors/usage.py)."""
    caps: dict[str, int] = {}
    for kind in usage.CAPPED:
        given: int | None = getattr(body, kind.cap)
        caps[kind.cap] = kind.default if given is None else given
        validation.check_integer(f"ConfigureDomainCaps.{kind.cap}", caps[kind.cap])
    current = _fenced(stage, "ConfigureDomainCaps", body.expected_policy_version, ctx.domain)
    level = feature_level(stage)
    if level < DOMAIN_CAPS:
        detail = f"per-domain caps apply from feature level {DOMAIN_CAPS}; the partition is at level {level}"
        raise Rejected(ErrorCode.VALIDATION, detail)
    policy = replace(current, policy_version=current.policy_version + 1, **caps)
    save(stage, keys.domain_policy(ctx.domain), policy)
    return _view(stage, ctx.domain, policy)


def inspect_domain(stage: Staged, body: InspectDomain, ctx: Context) -> Record:
    return _view(stage, ctx.domain, domain_policy(stage, ctx.domain))
