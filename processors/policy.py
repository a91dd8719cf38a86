"""Queue, topic and subscription group policies: defaults, bounds and cross-field rules (DESIGN.md §5, §6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keyload import limits
from keyload.bodies import GroupPolicySpec, QueuePolicySpec, TopicPolicySpec
from keyload.limits import GIB, HOUR_MS, MIB
from keyload.processors.errors import ErrorCode, Rejected
from keyload.projections.records import AvroRecord, GroupPolicy, QueuePolicy, TopicPolicy


@dataclass(frozen=True, slots=True)
class Bound:
    default: int
    minimum: int
    maximum: int


INTEGER_FIELDS: dict[str, Bound] = {
    "max_stored_messages": Bound(100_000, 1, limits.MAX_STORED_MESSAGES),
    "max_stored_bytes": Bound(256 * MIB, 1, limits.MAX_STORED_BYTES),
    "max_in_flight": Bound(1_000, 1, limits.MAX_IN_FLIGHT),
    "max_attempts": Bound(5, 1, limits.MAX_ATTEMPTS),
    "lease_ms": Bound(30_000, limits.MIN_LEASE_MS, limits.MAX_LEASE_MS),
    "max_lease_ms": Bound(12 * HOUR_MS, limits.MIN_LEASE_MS, limits.MAX_LEASE_MS),
    "retry_base_ms": Bound(1_000, 0, limits.MAX_RETRY_MS),
    "retry_max_ms": Bound(300_000, 0, limits.MAX_RETRY_MS),
    "retry_factor": Bound(2, 1, limits.MAX_RETRY_FACTOR),
    "receive_max_messages": Bound(10, 1, limits.MAX_RECEIVE_MESSAGES),
    "receive_max_bytes": Bound(4 * MIB, 1, limits.MAX_RECEIVE_BYTES),
    "payload_request_horizon_ms": Bound(60_000, 0, limits.MAX_PAYLOAD_REQUEST_HORIZON_MS),
}
# Dead-letter sublimits: null inherits the stored grant, a value may not exceed it.
SUBLIMIT_FIELDS = {
    "max_dead_letter_messages": "max_stored_messages",
    "max_dead_letter_bytes": "max_stored_bytes",
}
ENUM_FIELDS: dict[str, tuple[str, ...]] = {
    "retry_jitter": ("none", "full"),
    "ordering": ("competing", "strict_per_key"),
    "parked_head": ("continue", "block"),
}
GROUP_INTEGER_FIELDS: dict[str, Bound] = {
    "max_window": Bound(1_000, 1, limits.MAX_GROUP_WINDOW),
    # Leases and retries work as a queue's do, with the same defaults and bounds.
    **{
        name: INTEGER_FIELDS[name]
        for name in ("lease_ms", "max_lease_ms", "max_attempts", "retry_base_ms", "retry_max_ms", "retry_factor")
    },
}
GROUP_ENUM_FIELDS = {"retry_jitter": ENUM_FIELDS["retry_jitter"]}
TOPIC_INTEGER_FIELDS: dict[str, Bound] = {
    "max_retained_events": Bound(1_000_000, 1, limits.MAX_RETAINED_EVENTS),
    "max_retained_bytes": Bound(GIB, 1, limits.MAX_RETAINED_BYTES),
    "max_age_ms": Bound(0, 0, limits.MAX_TOPIC_AGE_MS),
}
TOPIC_ENUM_FIELDS: dict[str, tuple[str, ...]] = {"discard": ("new", "old")}


def _bounds_are_the_named_ranges() -> bool:
    """Every bound is its field's range in limits.INTEGER_FIELD_RANGES, and every default lies inside."""
    specs = (("QueuePolicySpec", INTEGER_FIELDS), ("GroupPolicySpec", GROUP_INTEGER_FIELDS))
    for record, bounds in (*specs, ("TopicPolicySpec", TOPIC_INTEGER_FIELDS)):
        for name, bound in bounds.items():
            named = limits.INTEGER_FIELD_RANGES[f"{record}.{name}"]
            if (named.minimum, named.maximum) != (bound.minimum, bound.maximum):
                return False
            if not bound.minimum <= bound.default <= bound.maximum:
                return False
    return True


assert _bounds_are_the_named_ranges()


def _resolve_integers(spec: AvroRecord, bounds: dict[str, Bound]) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    for name, bound in bounds.items():
        value = getattr(spec, name)
        value = bound.default if value is None else value
        if not bound.minimum <= value <= bound.maximum:
            raise Rejected(
                ErrorCode.VALIDATION,
                f"policy.{name} must be between {bound.minimum} and {bound.maximum}",
            )
        policy[name] = value
    return policy


def _resolve_enums(spec: AvroRecord, policy: dict[str, Any], enums: dict[str, tuple[str, ...]]) -> None:
    for name, choices in enums.items():
        value = getattr(spec, name)
        value = choices[0] if value is None else value
        if value not in choices:
            raise Rejected(ErrorCode.VALIDATION, f"policy.{name} must be one of {', '.join(choices)}")
        policy[name] = value


def _check_lease_and_retry(policy: dict[str, Any]) -> None:
    """Cross-field rules shared by queue and group policies."""
    if policy["lease_ms"] > policy["max_lease_ms"]:
        raise Rejected(ErrorCode.VALIDATION, "policy.lease_ms must not exceed policy.max_lease_ms")
    if policy["retry_base_ms"] > policy["retry_max_ms"]:
        raise Rejected(ErrorCode.VALIDATION, "policy.retry_base_ms must not exceed policy.retry_max_ms")


def resolve_policy(spec: QueuePolicySpec) -> QueuePolicy:
    """A complete, validated QueuePolicy from a QueuePolicySpec (nulls take defaults)."""
    policy = _resolve_integers(spec, INTEGER_FIELDS)
    _resolve_enums(spec, policy, ENUM_FIELDS)
    for name, grant in SUBLIMIT_FIELDS.items():
        value = getattr(spec, name)
        if value is not None and not 0 <= value <= policy[grant]:
            raise Rejected(ErrorCode.VALIDATION, f"policy.{name} must be between 0 and {grant}")
        policy[name] = value
    _check_lease_and_retry(policy)
    return QueuePolicy.from_avro(policy)


def resolve_group_policy(spec: GroupPolicySpec) -> GroupPolicy:
    """A complete, validated GroupPolicy from a GroupPolicySpec (nulls take defaults)."""
    policy = _resolve_integers(spec, GROUP_INTEGER_FIELDS)
    _resolve_enums(spec, policy, GROUP_ENUM_FIELDS)
    _check_lease_and_retry(policy)
    return GroupPolicy.from_avro(policy)


def default_group_spec() -> dict[str, Any]:
    """A GroupPolicySpec asking for every default."""
    return dict.fromkeys((*GROUP_INTEGER_FIELDS, *GROUP_ENUM_FIELDS))


def default_spec() -> dict[str, Any]:
    """A QueuePolicySpec asking for every default."""
    return {name: None for name in (*INTEGER_FIELDS, *ENUM_FIELDS, *SUBLIMIT_FIELDS)}


def resolve_topic_policy(spec: TopicPolicySpec) -> TopicPolicy:
    """A complete, validated TopicPolicy from a TopicPolicySpec (nulls take defaults)."""
    policy = _resolve_integers(spec, TOPIC_INTEGER_FIELDS)
    _resolve_enums(spec, policy, TOPIC_ENUM_FIELDS)
    return TopicPolicy.from_avro(policy)


def default_topic_spec() -> dict[str, Any]:
    """A TopicPolicySpec asking for every default."""
    return dict.fromkeys((*TOPIC_INTEGER_FIELDS, *TOPIC_ENUM_FIELDS))
