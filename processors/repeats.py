"""A repeated Receive or GroupReceive, from feature level 3: its leases as they stand now.

A client that lost the answer to a receive sends it again under the same command id. Its stored
outcome keeps each delivery's token and lease but not its body (processors/outcomes.py,
`without_bodies`): a body belongs to a lease, and a projection that kept every body ever delivered
would grow with every message ever received. So a repeat is answered with each delivery re-checked
against the projection of then: a lease still held comes back with its body and its current
deadline (a renewal may have moved it); one settled, expired or invalidated since comes back with
that error code, no body and no payload read handle, so a repeat never hands out what its lease
no longer covers. The rest of the outcome (its offset, evaluation time, flags) is the stored one.
"""

from __future__ import annotations

from collections.abc import Callable

from keyload.commands import COMMANDS
from keyload.log.codec import REGISTRY, Record
from keyload.processors import tokens
from keyload.processors.context import Context
from keyload.processors.errors import Rejected
from keyload.processors.groups import leases as group_leases
from keyload.processors.outcomes import OUTCOME, RECEIVE_RESULTS
from keyload.processors.queues import leases
from keyload.projections.store import Staged

HeldLease = Callable[[Staged, Context, tokens.Token], tuple[bytes, int | None]]

# How a delivery's lease is found held, by the result record its receive returns.
HELD: dict[str, HeldLease] = {
    "keyload.result.ReceiveResult": leases.held_lease,
    "keyload.result.GroupReceiveResult": group_leases.held_lease,
}
assert set(HELD) == RECEIVE_RESULTS

RECEIVES = frozenset(kind.branch for kind in COMMANDS if kind.result in RECEIVE_RESULTS)
"""The command kinds whose repeats are re-checked: those returning a receive's result."""


def answer(stage: Staged, ctx: Context, stored: bytes) -> bytes:
    """The encoded answer to a repeated receive from its stored outcome: each delivery as it stands."""
    outcome = REGISTRY.decode(OUTCOME, stored)
    result = outcome["result"]
    if result is None or not result[1]["deliveries"]:
        return stored
    branch, value = result
    held = HELD[branch]
    deliveries = [_as_it_stands(stage, ctx, held, delivery) for delivery in value["deliveries"]]
    return REGISTRY.encode(OUTCOME, dict(outcome, result=(branch, dict(value, deliveries=deliveries))))


def _as_it_stands(stage: Staged, ctx: Context, held: HeldLease, delivery: Record) -> Record:
    try:
        body, lease_until_ms = held(stage, ctx, tokens.parse(delivery["token"]))
    except Rejected as refusal:
        refused = dict(delivery, body=b"", error_code=str(refusal.code))
        if "payload" in refused:  # a large message's read handle goes with its lease
            refused["payload"] = None
        return refused
    return dict(delivery, body=body, lease_until_ms=lease_until_ms)
