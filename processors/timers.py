"""Firing due timers before every record: log time reaching a timer's due time is what fires it.

Queues and subscription groups keep timers the same way (processors/queues/state.py):
rows under their incarnation and one due-index entry each at their earliest. A topic
has at most one timer, its retention's next look at its front, kept in its record
(processors/topics/retention.py). The partition's horizon sweep has one entry too, under an id
no resource has (processors/horizons.py), and so has the count of what domains hold while it runs
(processors/usage.py). Otherwise the due index names an incarnation; the resource key
it maps to says which kind of resource to hand the firing to: a queue, a group, a topic,
or a deleted queue, group or topic whose rows are being reclaimed (processors/reclamation.py).
"""

from __future__ import annotations

from typing import Any

from keyload import limits
from keyload.bodies import Checkpoint, Tick
from keyload.log.codec import Record
from keyload.processors import horizons, reclamation, usage
from keyload.processors.context import Context
from keyload.processors.errors import Corruption
from keyload.processors.groups import leases as group_leases
from keyload.processors.queues.lifecycle import fire_queue_timers
from keyload.processors.queues.state import next_due_ms
from keyload.processors.topics import deletion
from keyload.processors.topics import topic as topics
from keyload.projections import keys
from keyload.projections.records import GroupRecord, QueueRecord, TopicRecord, load
from keyload.projections.store import Staged

# How a deleted resource is reclaimed, by the family of the key its `i` row names.
RETIREMENTS: dict[bytes | None, reclamation.Retirement[Any]] = {
    keys.RETIRED: reclamation.QUEUE_RETIREMENT,
    keys.RETIRED_GROUP: deletion.GROUP_RETIREMENT,
    keys.RETIRED_TOPIC: deletion.TOPIC_RETIREMENT,
}
# The record kept under each kind of live resource key the due index may name.
TIMED_RECORDS: dict[bytes | None, type[QueueRecord | GroupRecord | TopicRecord]] = {
    keys.QUEUE: QueueRecord,
    keys.GROUP: GroupRecord,
    keys.TOPIC: TopicRecord,
}


def fire_due(stage: Staged, ctx: Context) -> Record:
    """Fire due timers across the partition's queues, groups and topics, earliest first, within one budget.

    A Tick command is just a record that does nothing else. `ctx.command_id` names
    the record for deterministic retry jitter.
    """
    budget = limits.TICK_EXAMINATION_BUDGET
    examined = transitions = 0
    while examined < budget:
        next_due = next_due_ms(stage)
        if next_due is None or next_due > ctx.now_ms:
            break
        first = stage.first(keys.due_queue(next_due, 0), keys.prefix_end(keys.DUE_QUEUE))
        if first is None or keys.parse_due_queue(first[0])[0] != next_due:
            raise Corruption("the partition's next due time disagrees with its due index")
        due_ms, incarnation = keys.parse_due_queue(first[0])
        if incarnation == keys.HORIZON_SWEEP:  # outcomes, receipts and finished work past their horizons
            swept = horizons.sweep(stage, due_ms, ctx, budget - examined)
            examined += swept
            transitions += swept
            continue
        if incarnation == keys.USAGE_COUNT:  # counting what domains held when the partition reached level 5
            examined += usage.count_step(stage, due_ms, ctx, budget - examined)
            continue
        resource_key = stage.get(keys.resource_key(incarnation))
        kind = None if resource_key is None else resource_key[:1]
        retirement = RETIREMENTS.get(kind)
        if retirement is not None:  # a deleted resource whose rows are being reclaimed
            examined += reclamation.reclaim_step(stage, retirement, incarnation, due_ms, ctx, budget - examined)
            continue
        if kind not in TIMED_RECORDS:
            raise Corruption(f"due index names {incarnation}, which is neither a queue, a group nor a topic")
        assert resource_key is not None
        record = load(stage, resource_key, TIMED_RECORDS[kind])
        if record is None:
            raise Corruption(f"due index names missing resource {incarnation}")
        if record.next_timer_ms != due_ms:
            raise Corruption(f"due index of resource {incarnation} disagrees with its record")
        # Each fires its resource's timers and saves the resource.
        if isinstance(record, QueueRecord):
            seen, moved = fire_queue_timers(stage, record, ctx, budget - examined)
        elif isinstance(record, TopicRecord):
            seen, moved = topics.fire_retention(stage, record, ctx, budget - examined)
        else:
            seen, moved = group_leases.fire_group_timers(stage, record, ctx, budget - examined)
        if seen == 0:
            raise Corruption(f"due index of resource {incarnation} names no due timer")
        examined += seen
        transitions += moved
    return {"transitions": transitions, "budget_exhausted": examined >= budget, "next_due_ms": next_due_ms(stage)}


def tick(stage: Staged, body: Tick, ctx: Context) -> Record:
    """A Tick does nothing but let log time advance: its result is what fired before it."""
    return ctx.fired


def checkpoint(stage: Staged, body: Checkpoint, ctx: Context) -> Record:
    """A Checkpoint asks the runtime for a checkpoint at its own offset (keyload/service/runtime.py)."""
    return {"offset": ctx.offset}
