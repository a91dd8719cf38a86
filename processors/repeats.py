"""A repeated Receive or GroupReceive, from feature level 3: its leases as they stand now.

A client that lost the answer to a receive sends it again under the same command id. Its stored
outcome keeps each delivery's token and lease but not its body (processors/outcomes.py,
`without_bodies`): a body belongs to a lease, and a projection that kept every body ever delivered
would grow with every message ever received. So a repeat is answered with each delivery re-checked
against the projection of then: a lease still held comes back with its body and its current
deadline (a renewal may have moved it); one settled, expired or invalidated since comes back with
that error code and no body, so a repeat never hands out a body its lease no longer covers. The
rest of the outcome (its offset, evaluation time, flags) is the stored one.
"""

from __future__ import annotations

from collections.abc import Callable

from keyload.log.codec import REGISTRY, Record
from keyload.processors.context import Context
from keyload.processors.groups import leases as group_leases
from keyload.processors.outcomes import OUTCOME, RECEIVE_RESULTS
from keyload.processors.queues import leases
from keyload.projections.store import Staged

RECEIVES = frozenset({"keyload.command.Receive", "keyload.command.GroupReceive"})
"""The command kinds whose repeats are re-checked (their outcomes are RECEIVE_RESULTS)."""

CURRENT: dict[str, Callable[[Staged, Context, Record], Record]] = {
    "keyload.result.ReceiveResult": leases.current_delivery,
    "keyload.result.GroupReceiveResult": group_leases.current_delivery,
}
assert set(CURRENT) == RECEIVE_RESULTS


def answer(stage: Staged, ctx: Context, stored: bytes) -> bytes:
    """The encoded answer to a repeated receive from its stored outcome: each delivery as it stands."""
    outcome = REGISTRY.decode(OUTCOME, stored)
    result = outcome["result"]
    if result is None or not result[1]["deliveries"]:
        return stored
    branch, value = result
    current = CURRENT[branch]
    deliveries = [current(stage, ctx, delivery) for delivery in value["deliveries"]]
    return REGISTRY.encode(OUTCOME, dict(outcome, result=(branch, dict(value, deliveries=deliveries))))
