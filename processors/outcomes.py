"""Outcome records, and the outbox of outcomes a record publishes besides its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from keyload import limits
from keyload.log.codec import REGISTRY, Record
from keyload.processors.errors import Rejected

OUTCOME = "keyload.Outcome"
# The results of the commands that lease: from feature level 3 their stored outcome keeps the leases
# and not the bodies (processors/repeats.py answers a repeat from it).
RECEIVE_RESULTS = frozenset({"keyload.result.ReceiveResult", "keyload.result.GroupReceiveResult"})


@dataclass
class Outbox:
    """What applying one record publishes beyond its own outcome, and whether that is deferred.

    A long-poll Receive that finds nothing defers its outcome; a later record that
    serves it (or reaches its deadline) publishes that outcome from here.
    """

    published: list[tuple[int | None, str, bytes]] = field(default_factory=list)  # reply partition, principal, outcome
    deferred: bool = False


def new_outcome(command_id: str, domain: str, partition: int, offset: int, now_ms: int) -> Record:
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
        "failed_index": None,
    }


def without_bodies(outcome: Record, encoded: bytes) -> bytes:
    """What is stored of an outcome (`encoded`) from feature level 3: a receive's deliveries keep
    their tokens and leases but not their bodies; any other outcome as it is."""
    result = outcome["result"]
    if result is None or result[0] not in RECEIVE_RESULTS or not result[1]["deliveries"]:
        return encoded
    branch, value = result
    deliveries = [dict(delivery, body=b"") for delivery in value["deliveries"]]
    return REGISTRY.encode(OUTCOME, dict(outcome, result=(branch, dict(value, deliveries=deliveries))))


def reject(outcome: Record, rejection: Rejected) -> None:
    detail = rejection.detail[: limits.MAX_DETAIL_CHARS]
    outcome.update(
        status="rejected",
        error_code=str(rejection.code),
        detail=detail,
        result=None,
        failed_index=rejection.failed_index,
    )
