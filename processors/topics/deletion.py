"""Deleting subscription groups and topics: the name is free at once, the rows are reclaimed later.

DeleteGroup removes a group's row, and with it the group's pins on its topic: the topic's retention
looks at its front again at the next record. DeleteTopic removes the topic's row and every group
of the topic. Either is refused (Conflict) while it would drop work in progress, unless forced:
a group's outstanding deliveries (leased, waiting for a retry or due again), or, for a topic, a
retained event some group has not completed. The rows each leaves behind — a group's positions,
parked positions, timers, waiting receives and inbox entries; a topic's events and event ids —
are reclaimed in bounded steps fired like timers (processors/reclamation.py). A waiting
GroupReceive is answered empty when reclamation reaches it, within the records that follow the
delete (a deleted topic's own rows, due at the same time with a lower id, may come first).
"""

from __future__ import annotations

from keyload.bodies import DeleteGroup, DeleteTopic
from keyload.log.codec import Record
from keyload.processors import reclamation, usage, validation, waiters
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.groups.group import empty_receive_result, group_view, groups_of, load_group
from keyload.processors.topics import retention
from keyload.processors.topics.topic import save_topic, topic_record
from keyload.projections import keys
from keyload.projections.records import GroupRecord, TopicRecord, Waiter
from keyload.projections.store import Staged


def _check_incarnation(kind: str, name: str, incarnation: int, expected: int | None) -> None:
    detail = f"{name} is incarnation {incarnation}, expected {expected}"
    validation.check_fence(f"{kind}.expected_incarnation", expected, incarnation, detail)


def delete_group(stage: Staged, body: DeleteGroup, ctx: Context) -> Record:
    """Delete a group with no outstanding delivery, or with `force` whatever it has outstanding;
    fenced by an optional expected incarnation. Returns its last view."""
    topic, work = load_group(stage, ctx.domain, body.topic, body.group)
    group = work.view
    _check_incarnation("DeleteGroup", f"group {body.group}", group.incarnation, body.expected_incarnation)
    if group.outstanding and not body.force:
        count = group.outstanding
        raise Rejected(
            ErrorCode.CONFLICT,
            f"group {body.group} has {count} outstanding deliver{'y' if count == 1 else 'ies'}: settle them, "
            "seek the group, or delete it by force",
        )
    view = group_view(stage, topic, group)
    stage.delete(keys.group(topic.incarnation, body.group))
    usage.charge(stage, ctx.domain, keys.topic(ctx.domain, body.topic), groups=-1)
    reclamation.retire(stage, GROUP_RETIREMENT, work.record, ctx.now_ms)
    stored = topic_record(stage, ctx.domain, body.topic)
    due = stored.next_timer_ms
    if due is not None and due > ctx.now_ms:  # its pins are gone: retention looks again now
        save_topic(stage, retention.with_timer(stage, stored, ctx.now_ms))
    return view


def delete_topic(stage: Staged, body: DeleteTopic, ctx: Context) -> Record:
    """Delete a topic and its groups when no group has anything retained left to complete, or with
    `force` whatever they have; fenced by an optional expected incarnation. Returns its last view."""
    record = topic_record(stage, ctx.domain, body.topic)
    topic = record.view
    _check_incarnation("DeleteTopic", f"topic {body.topic}", topic.incarnation, body.expected_incarnation)
    groups = groups_of(stage, topic.incarnation)  # at most MAX_GROUPS_PER_TOPIC
    for group in groups if not body.force else ():
        limit = retention.group_limit(stage, topic, group.view)
        if limit < topic.tail:
            raise Rejected(
                ErrorCode.CONFLICT,
                f"group {group.view.group} has not completed position {limit + 1} of topic {body.topic}: let it "
                "catch up, seek it or delete it first, or delete the topic by force",
            )
    for group in groups:
        stage.delete(keys.group(topic.incarnation, group.view.group))
        reclamation.retire(stage, GROUP_RETIREMENT, group, ctx.now_ms)
    row = keys.topic(ctx.domain, body.topic)
    stage.delete(row)
    usage.charge(stage, ctx.domain, row, topics=-1, groups=-len(groups))
    reclamation.retire(stage, TOPIC_RETIREMENT, record, ctx.now_ms)
    return topic.to_avro()


# -- how their rows are reclaimed ---------------------------------------------------------------


def _group_starts(record: GroupRecord) -> dict[bytes, bytes | None]:
    """Each family from its first live row, past the tombstones a working group leaves: waiting
    receives from the waiter floor, timers from the timer floor, outstanding and due positions from
    the checkpoint. Parked positions (from the start: purges, seeks and retention leave tombstones
    there, a few) and inbox entries (only the horizon sweep deletes them before this, from feature
    level 4) are walked whole."""
    group = record.view
    incarnation = group.incarnation
    floor = record.timer_floor
    return {
        keys.WAITER: keys.waiter(incarnation, record.waiter_floor) if record.waiting_receives else None,
        keys.TIMER: None if floor is None else keys.timer_prefix(incarnation) + floor,
        keys.POSITION: keys.position(incarnation, group.checkpoint + 1) if group.outstanding else None,
        keys.DUE_POSITION: keys.due_position(incarnation, group.checkpoint + 1) if group.redeliverable else None,
        keys.PARKED: keys.parked(incarnation, 0) if group.parked_count else None,
        keys.INBOX_ENTRY: keys.INBOX_ENTRY + keys.u64(incarnation),
    }


def _reclaim_group_row(stage: Staged, record: GroupRecord, key: bytes, value: bytes, ctx: Context) -> GroupRecord:
    """Delete one row; a waiting receive is answered empty first (its deadline timer goes with it)."""
    if key[:1] == keys.WAITER:
        sequence = keys.read_u64(key, 9)
        return waiters.complete(stage, record, ctx, sequence, Waiter.decode(value), empty_receive_result())
    stage.delete(key)
    return record


def _topic_starts(record: TopicRecord) -> dict[bytes, bytes | None]:
    """Events from the first retained one (those before it were removed); event ids from the first."""
    topic = record.view
    incarnation = topic.incarnation
    return {
        keys.EVENT: keys.event(incarnation, topic.first_available) if topic.retained_events else None,
        keys.EVENT_ID: keys.EVENT_ID + keys.u64(incarnation) if topic.published_total else None,
    }


def _delete_row(stage: Staged, record: TopicRecord, key: bytes, value: bytes, ctx: Context) -> TopicRecord:
    stage.delete(key)
    return record


# Walked in this order: waiting receives first, while their deadline timers are still there.
GROUP_FAMILIES = (keys.WAITER, keys.TIMER, keys.POSITION, keys.DUE_POSITION, keys.PARKED, keys.INBOX_ENTRY)
GROUP_RETIREMENT = reclamation.Retirement(
    GroupRecord, keys.RETIRED_GROUP, GROUP_FAMILIES, _group_starts, _reclaim_group_row
)
TOPIC_FAMILIES = (keys.EVENT, keys.EVENT_ID)
TOPIC_RETIREMENT = reclamation.Retirement(TopicRecord, keys.RETIRED_TOPIC, TOPIC_FAMILIES, _topic_starts, _delete_row)
