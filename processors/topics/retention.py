"""How events leave a topic: only from its front, and never past what a subscription group pins.

Three things remove events: PurgeTopic (an operator names the last one), age (`max_age_ms`: an
event older than that, in log time since its publish, goes), and the caps under `discard: old` (a
Publish, or the retention timer after ConfigureTopic lowered a cap, removes the oldest events until
both caps hold). Every one of them stops at the topic's *purge limit*: the lowest, over the topic's
groups, of a group's checkpoint and the position below its lowest parked position that still pins.
So no group ever finds an event it has not completed gone, paused groups included; to let a slow
group's backlog go, seek it forward. Event-id rows stay, so an old id is still recognised.

Age and lowered caps are applied by the topic's retention timer, one entry in the partition's due
index like a queue's earliest timer (processors/timers.py), due when the front event's age runs
out. Firing it removes what may go, within the tick examination budget, and sets the next due
time: the new front event's expiry, the current log time when the budget ran out, or
TOPIC_RETENTION_RECHECK_MS later when a group pins the front. Every removal is decided by log time
and log order, so a replay removes exactly the same events.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from msgspec.structs import replace

from keyload import limits
from keyload.log.codec import REGISTRY, Record
from keyload.processors.counters import adjusted
from keyload.processors.errors import Corruption
from keyload.processors.queues.state import move_due_entry
from keyload.projections import keys
from keyload.projections.records import (
    EventRecord,
    GroupRecord,
    GroupState,
    TopicDiscard,
    TopicPolicy,
    TopicRecord,
    TopicView,
)
from keyload.projections.store import Staged

EVENT_RECORD = EventRecord.SCHEMA


class FrontEvent(NamedTuple):
    position: int
    key: bytes
    charged_bytes: int
    published_at_ms: int


def front_events(stage: Staged, topic: TopicView, through: int) -> Iterator[FrontEvent]:
    """The retained events first_available..through in position order (a missing one is corruption)."""
    topic_id = topic.incarnation
    rows = stage.scan(keys.event(topic_id, topic.first_available), keys.event(topic_id, through + 1))
    for expected, (key, value) in enumerate(rows, start=topic.first_available):
        if keys.event_position(key) != expected:
            raise Corruption(f"topic {topic_id} has no event at retained position {expected}")
        # A dict read, not an EventRecord: a removal decodes many events for two fields.
        event: Record = REGISTRY.decode(EVENT_RECORD, value)
        yield FrontEvent(expected, key, event["charged_bytes"], event["published_at_ms"])


def pinning_groups(stage: Staged, topic: TopicView) -> list[GroupRecord]:
    """Every group of the topic (at most MAX_GROUPS_PER_TOPIC)."""
    # Imported here: groups read topics, and processors/topics/topic.py imports this module.
    from keyload.processors.groups.group import groups_of

    return groups_of(stage, topic.incarnation)


def group_limit(stage: Staged, topic: TopicView, group: GroupState) -> int:
    """The highest position a removal may reach for this group: its checkpoint, and below its
    lowest parked position that still pins (above pin_floor)."""
    start = keys.parked(group.incarnation, max(group.pin_floor + 1, topic.first_available))
    lowest = stage.first(start, keys.group_row_end(start))
    checkpoint = group.checkpoint
    return checkpoint if lowest is None else min(checkpoint, keys.row_position(lowest[0]) - 1)


def purge_limit(stage: Staged, topic: TopicView, pinning: list[GroupRecord]) -> int:
    """The highest position any removal may reach: the tail, or below what a group pins."""
    return min((group_limit(stage, topic, group.view) for group in pinning), default=topic.tail)


def remove_front(stage: Staged, topic: TopicView, pinning: list[GroupRecord], removed: list[FrontEvent]) -> TopicView:
    """Delete `removed` — the front events first_available.., in order — and release their bytes;
    released parked rows they pass go with them. A new generation: retained history changed."""
    assert removed and removed[0].position == topic.first_available
    through = removed[-1].position
    assert through - topic.first_available + 1 == len(removed)
    retained_events, retained_bytes = topic.retained_events, topic.retained_bytes
    for event in removed:
        retained_bytes = adjusted("retained_bytes", retained_bytes, -event.charged_bytes)
        retained_events = adjusted("retained_events", retained_events, -1)
        stage.delete(event.key)
    if retained_events != topic.tail - through:
        raise Corruption(f"topic {topic.incarnation} has no event at some retained position up to {through}")
    # Imported here, as in pinning_groups.
    from keyload.processors.groups.group import save_group

    for group in pinning:
        dropped = _drop_parked_through(stage, group.view, topic.first_available, through)
        if dropped is not None:
            save_group(stage, replace(group, view=dropped))
    return replace(
        topic,
        first_available=through + 1,
        retained_events=retained_events,
        retained_bytes=retained_bytes,
        generation=topic.generation + 1,
    )


def _drop_parked_through(stage: Staged, group: GroupState, first: int, through: int) -> GroupState | None:
    """Released parked rows a removal passes go with their events (pinning ones cannot be passed);
    the group without them, None when it had none there."""
    start = keys.parked(group.incarnation, first)
    parked_count = group.parked_count
    dropped = 0
    for key, _ in stage.scan(start, keys.parked(group.incarnation, through + 1)):
        if keys.row_position(key) > group.pin_floor:
            raise Corruption(f"a removal passed a pinning parked position of group {group.incarnation}")
        stage.delete(key)
        parked_count = adjusted("parked_count", parked_count, -1)
        dropped += 1
    return replace(group, parked_count=parked_count) if dropped else None


def over_caps(policy: TopicPolicy, events: int, charged_bytes: int) -> bool:
    """Whether `events` retained events of `charged_bytes` pass a cap (a ConfigureTopic lowered it)."""
    return events > policy.max_retained_events or charged_bytes > policy.max_retained_bytes


def _expired(topic: TopicView, event: FrontEvent, now_ms: int) -> bool:
    max_age = topic.policy.max_age_ms
    return max_age > 0 and event.published_at_ms + max_age <= now_ms


def due_ms(stage: Staged, topic: TopicView, now_ms: int) -> int | None:
    """When retention must look at the topic's front next: now when a cap under discard old no
    longer holds, the front event's expiry under an age limit, never (None) otherwise."""
    if topic.retained_events == 0:
        return None
    policy = topic.policy
    if policy.discard == TopicDiscard.old and over_caps(policy, topic.retained_events, topic.retained_bytes):
        return now_ms
    if policy.max_age_ms == 0:
        return None
    front = next(front_events(stage, topic, topic.first_available), None)
    if front is None:
        raise Corruption(f"topic {topic.incarnation} has no event at retained position {topic.first_available}")
    return front.published_at_ms + policy.max_age_ms


def with_timer(stage: Staged, record: TopicRecord, due: int | None) -> TopicRecord:
    """The topic with its retention timer at `due`, its due-index entry moved there. The topic's `i`
    row, naming its key for the due index, is written when it first has a timer, and stays."""
    previous = record.next_timer_ms
    if due == previous:
        return record
    topic_id = record.view.incarnation
    if previous is None:
        stage.put(keys.resource_key(topic_id), keys.topic(record.view.domain, record.view.topic))
    move_due_entry(stage, topic_id, previous, due)
    return replace(record, next_timer_ms=due)


class Step(NamedTuple):
    topic: TopicView
    examined: int
    removed: int
    next_due_ms: int | None


def retention_step(stage: Staged, record: TopicRecord, now_ms: int, budget: int) -> Step:
    """Remove from the front what age and the caps (under discard old) let go, never past the purge
    limit, examining at most `budget` (≥ 1) rows: each group's limit counts as one, each event as
    one (at least one event is looked at). When to look again."""
    topic = record.view
    pinning = pinning_groups(stage, topic)
    limit = purge_limit(stage, topic, pinning)
    allowance = max(budget - len(pinning), 1)
    discard_old = topic.policy.discard == TopicDiscard.old
    events, size = topic.retained_events, topic.retained_bytes
    policy = topic.policy
    removed: list[FrontEvent] = []
    due: int | None = None
    examined = 0
    for event in front_events(stage, topic, topic.tail):
        if len(removed) == allowance:
            due = now_ms  # more may go: behind the timers due by now
            break
        examined += 1
        over = discard_old and over_caps(policy, events, size)
        if not (over or _expired(topic, event, now_ms)):
            due = event.published_at_ms + policy.max_age_ms if policy.max_age_ms else None
            break
        if event.position > limit:
            due = now_ms + limits.TOPIC_RETENTION_RECHECK_MS  # a group pins it
            break
        removed.append(event)
        events, size = events - 1, size - event.charged_bytes
    if removed:
        topic = remove_front(stage, topic, pinning, removed)
    return Step(topic, max(examined, 1) + len(pinning), len(removed), due)
