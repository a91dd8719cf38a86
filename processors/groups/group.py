"""Subscription groups: independent, checkpointed consumers of a topic (DESIGN.md §6).

A group's progress is two positions. `checkpoint`: every position at or below it
is resolved — acked, filtered (the event does not match the group's filter) or
parked (its attempts ran out). `issued`: the highest position claimed or filtered.
Between them lie the outstanding deliveries (leased, waiting for a retry, or due
again), each one row keyed by position, and resolved positions, which need no row:
the checkpoint is simply one below the lowest outstanding row (or `issued` when
none is). So an ack of a position in a gap moves nothing, and an ack of the lowest
one moves the checkpoint across every resolved position above it at once.

Parked positions keep a row of their own, listed by Status, and pin purges until a
seek releases them (`pin_floor`). This module holds the group's definition, its
position transitions, seek, configure and pause/resume; processors/groups/leases.py
holds receive, ack, nack, renew and lease timers. Removal of a topic's events (purge, age,
discard old), which groups pin, is in processors/topics/retention.py.
"""

from __future__ import annotations

import itertools
from typing import Any

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import (
    ConfigureGroup,
    CreateGroup,
    GroupStart,
    GroupStatus,
    PauseGroup,
    ResumeGroup,
    SeekGroup,
)
from keyload.log.codec import REGISTRY, Record
from keyload.processors import usage, validation
from keyload.processors.context import Context
from keyload.processors.counters import adjusted
from keyload.processors.declare import declared
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import DECLARES_UNSTARTED, feature_level
from keyload.processors.policy import resolve_group_policy
from keyload.processors.queues.state import (
    add_index_row,
    allocate_incarnation,
    check_headers,
    check_name,
    refreshed_due,
    remove_index_row,
    with_timer,
)
from keyload.processors.topics.topic import topic_record
from keyload.projections import keys
from keyload.projections.records import (
    GroupFilter,
    GroupRecord,
    GroupState,
    PositionMeta,
    PositionState,
    TopicView,
    load,
    save,
)
from keyload.projections.store import Readable, Staged

GROUP_RECORD = "keyload.GroupRecord"
POSITION_META = "keyload.PositionMeta"
GROUP_RECEIVE_RESULT = "keyload.result.GroupReceiveResult"


def empty_receive_result(window_full: bool = False) -> tuple[str, Record]:
    """A GroupReceive result that delivers nothing (its Outcome branch and value): a paused group's,
    or what a waiting one completes with at its deadline or when its group is deleted."""
    return GROUP_RECEIVE_RESULT, {"deliveries": [], "window_full": window_full, "budget_exhausted": False}


# -- loading and saving -------------------------------------------------------------------


class Working:
    """A group record that one command changes; `store_group` saves it.

    The records are frozen: `record` is replaced as positions move, and by the timer
    and waiter code that queues share (processors/queues/state.py timers,
    processors/waiters.py), which returns the record it changed.
    """

    __slots__ = ("record",)

    def __init__(self, record: GroupRecord) -> None:
        self.record = record

    @property
    def view(self) -> GroupState:
        return self.record.view

    def update(self, **changes: Any) -> None:
        """Replace fields of the group's state."""
        self.record = replace(self.record, view=replace(self.record.view, **changes))


def topic_view(stage: Staged, domain: str, topic_name: str) -> TopicView:
    """The state of a named topic."""
    return topic_record(stage, domain, topic_name).view


def load_group(stage: Staged, domain: str, topic_name: str, group_name: str) -> tuple[TopicView, Working]:
    """(topic state, group) of a named group; its counters are checked against each other."""
    topic = topic_view(stage, domain, topic_name)
    check_name("group name", group_name, limits.MAX_GROUP_NAME_CHARS, limits.GROUP_NAME_PATTERN)
    record = load(stage, keys.group(topic.incarnation, group_name), GroupRecord)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "group does not exist")
    _check_consistent(topic, record.view)
    return topic, Working(record)


def _check_consistent(topic: TopicView, group: GroupState) -> None:
    checkpoint, issued, outstanding = group.checkpoint, group.issued, group.outstanding
    if not topic.first_available - 1 <= checkpoint <= issued <= topic.tail:
        raise Corruption(f"group {group.incarnation} has checkpoint {checkpoint} and issued {issued}")
    if not 0 <= group.redeliverable <= outstanding <= issued - checkpoint or (outstanding == 0) != (
        checkpoint == issued
    ):
        raise Corruption(f"group {group.incarnation} counts {outstanding} outstanding positions")


def store_group(stage: Staged, work: Working) -> None:
    save_group(stage, work.record)


def save_group(stage: Staged, record: GroupRecord) -> None:
    """Store the group record, first bringing its entry in the due index up to date."""
    stored = refreshed_due(stage, record)
    save(stage, keys.group(stored.view.topic_incarnation, stored.view.group), stored)


def token_scope(group: GroupState) -> str:
    """What a group's delivery tokens are signed for: no queue name contains NUL, so a queue token
    never verifies as a group's and a group token never as a queue's."""
    return f"{group.topic}\x00{group.group}"


def group_view(stage: Staged, topic: TopicView, group: GroupState) -> Record:
    """The GroupView of a group: its state, the lowest parked positions, gaps and lag."""
    start = keys.parked(group.incarnation, topic.first_available)
    parked: list[int] = []
    for key, _ in stage.scan(start, keys.group_row_end(start)):
        if len(parked) == limits.MAX_STATUS_PARKED:
            break
        parked.append(keys.row_position(key))
    return {
        "state": group.to_avro(),
        "parked": parked,
        "gaps": group.issued - group.checkpoint - group.outstanding,
        "tail": topic.tail,
        "lag": topic.tail - group.checkpoint,
    }


# -- position transitions ------------------------------------------------------------------
#
# An outstanding position is in exactly one state, held by one index row: leased (a
# lease timer), retrying (a retry timer), due (a `v` row, redelivered first). `leave`
# and `enter` are the only code that moves one, so rows and counters change together.


def load_position(stage: Staged, group_id: int, position: int) -> PositionMeta | None:
    return load(stage, keys.position(group_id, position), PositionMeta)


def _state_row(
    group_id: int, position: int, state: str, lease_until_ms: int | None, not_before_ms: int | None
) -> bytes:
    if state == PositionState.leased:
        assert lease_until_ms is not None
        return keys.timer(group_id, lease_until_ms, keys.TIMER_LEASE, position)
    if state == PositionState.retrying:
        assert not_before_ms is not None
        return keys.timer(group_id, not_before_ms, keys.TIMER_NOT_BEFORE, position)
    if state == PositionState.due:
        return keys.due_position(group_id, position)
    raise Corruption(f"position {position} is outstanding in state {state}")


def _leave_row(
    stage: Staged, work: Working, position: int, state: str, lease_until_ms: int | None, not_before_ms: int | None
) -> None:
    """Take an outstanding position, given by its state's fields, out of its state's index row."""
    group = work.view
    remove_index_row(
        stage, _state_row(group.incarnation, position, state, lease_until_ms, not_before_ms), str(position)
    )
    if state == PositionState.due:
        work.update(redeliverable=adjusted("redeliverable", group.redeliverable, -1))


def leave(stage: Staged, work: Working, position: int, meta: PositionMeta) -> PositionMeta:
    """Take an outstanding position out of its state's index row; the meta without its lease."""
    _leave_row(stage, work, position, meta.state, meta.lease_until_ms, meta.not_before_ms)
    return replace(meta, lease_until_ms=None, lease_owner=None)


def enter(
    stage: Staged,
    work: Working,
    position: int,
    meta: PositionMeta,
    state: PositionState,
    *,
    until_ms: int | None = None,
    lease_owner: str | None = None,
) -> PositionMeta:
    """Put an outstanding position (new, or just out of `leave`) into `state` and save it; the saved meta.

    `until_ms` is the lease deadline (leased) or the retry time (retrying).
    """
    group_id = work.view.incarnation
    if state == PositionState.leased:
        assert until_ms is not None and lease_owner is not None
        meta = replace(meta, state=state, lease_until_ms=until_ms, lease_owner=lease_owner)
        work.record = with_timer(stage, work.record, until_ms, keys.TIMER_LEASE, position, str(position))
    elif state == PositionState.retrying:
        assert until_ms is not None
        meta = replace(meta, state=state, not_before_ms=until_ms)
        work.record = with_timer(stage, work.record, until_ms, keys.TIMER_NOT_BEFORE, position, str(position))
    elif state == PositionState.due:
        meta = replace(meta, state=state)
        add_index_row(stage, keys.due_position(group_id, position), str(position))
        work.update(redeliverable=work.view.redeliverable + 1)
    else:
        raise AssertionError(f"{state} is not an outstanding state")
    save(stage, keys.position(group_id, position), meta)
    return meta


def resolve(
    stage: Staged, work: Working, position: int, meta: PositionMeta, state: PositionState, now_ms: int
) -> PositionMeta:
    """An outstanding position is acked or parked: its row goes, and the checkpoint moves over
    every resolved position above it when it was the lowest outstanding one. The resolved meta."""
    group_id = work.view.incarnation
    meta = leave(stage, work, position, meta)
    stage.delete(keys.position(group_id, position))
    group = work.view
    outstanding = adjusted("outstanding", group.outstanding, -1)
    if state == PositionState.parked:
        meta = replace(meta, state=state, parked_at_ms=now_ms)
        save(stage, keys.parked(group_id, position), meta)
        work.update(outstanding=outstanding, parked_count=group.parked_count + 1, parked_total=group.parked_total + 1)
    else:
        assert state == PositionState.acked
        meta = replace(meta, state=state)
        work.update(outstanding=outstanding, acked_total=group.acked_total + 1)
    if position == group.checkpoint + 1:
        advance_checkpoint(stage, work)
    return meta


def advance_checkpoint(stage: Staged, work: Working) -> None:
    """Checkpoint = one below the lowest outstanding position, or `issued` when none is outstanding.

    Acked positions above the old checkpoint leave tombstones that this seek steps
    over once; MAX_GROUP_SPAN bounds how many there can be.
    """
    group = work.view
    if group.outstanding == 0:
        work.update(checkpoint=group.issued)
        return
    start = keys.position(group.incarnation, group.checkpoint + 1)
    lowest = stage.first(start, keys.group_row_end(start))
    if lowest is None or keys.row_position(lowest[0]) > group.issued:
        raise Corruption(f"group {group.incarnation} counts outstanding positions it has no row for")
    work.update(checkpoint=keys.row_position(lowest[0]) - 1)


# -- definition ----------------------------------------------------------------------------


def _check_filter(spec: GroupFilter) -> GroupFilter:
    """A validated filter, event types and headers in order: an event matches when its type is
    listed (or none are) and every header named carries exactly the value given."""
    event_types = spec.event_types
    if len(event_types) > limits.MAX_FILTER_EVENT_TYPES:
        raise Rejected(ErrorCode.VALIDATION, f"a filter lists at most {limits.MAX_FILTER_EVENT_TYPES} event types")
    for event_type in event_types:
        check_name("event type", event_type, limits.MAX_EVENT_TYPE_CHARS, limits.ID_PATTERN)
    if len(set(event_types)) != len(event_types):
        raise Rejected(ErrorCode.VALIDATION, "a filter lists an event type twice")
    check_headers(spec.headers)
    return GroupFilter(event_types=sorted(event_types), headers=dict(sorted(spec.headers.items())))


def matches(group_filter: GroupFilter, event: Record) -> bool:
    """Whether an event (a decoded EventRecord dict: receives read many, see leases.py) matches."""
    if group_filter.event_types and event["type"] not in group_filter.event_types:
        return False
    headers = event["headers"]
    return all(headers.get(name) == value for name, value in group_filter.headers.items())


def _check_start(to: GroupStart, position: int | None, kind: str) -> None:
    """Validation of a start's form, whatever the topic holds: a position given with `position`
    only, and then within the integer range, for a `kind` command (CreateGroup, SeekGroup)."""
    if to != GroupStart.position:
        if position is not None:
            raise Rejected(ErrorCode.VALIDATION, f"a position is given only when starting at a position, not {to}")
    elif position is None:
        raise Rejected(ErrorCode.VALIDATION, "starting at a position needs the position")
    else:
        validation.check_integer(f"{kind}.position", position)


def _target_checkpoint(topic: TopicView, to: GroupStart, position: int | None, kind: str) -> int:
    """The checkpoint that makes `to` the next position delivered (first_available..tail + 1) for a
    `kind` command (CreateGroup, SeekGroup)."""
    _check_start(to, position, kind)
    first = topic.first_available
    tail = topic.tail
    if to != GroupStart.position:
        return first - 1 if to == GroupStart.beginning else tail
    assert position is not None  # _check_start refused a position start without one
    if position < first:
        raise Rejected(ErrorCode.HISTORY_UNAVAILABLE, f"position {position} is before first_available {first}")
    if position > tail + 1:
        raise Rejected(ErrorCode.VALIDATION, f"position is past the tail + 1 ({tail + 1})")
    return position - 1


def groups_of(stage: Staged, topic_id: int) -> list[GroupRecord]:
    """Every group of a topic (at most MAX_GROUPS_PER_TOPIC), for removals (processors/topics/retention.py)."""
    prefix = keys.group_prefix(topic_id)
    found: list[GroupRecord] = []
    for _, value in stage.scan(prefix, keys.prefix_end(prefix)):
        if len(found) == limits.MAX_GROUPS_PER_TOPIC:
            raise Corruption(f"topic {topic_id} has more than {limits.MAX_GROUPS_PER_TOPIC} groups")
        found.append(GroupRecord.decode(value))
    return found


def count_groups(stage: Readable, topic_id: int) -> int:
    """How many groups a topic has (at most MAX_GROUPS_PER_TOPIC); their records are not decoded."""
    prefix = keys.group_prefix(topic_id)
    found = 0
    for _ in stage.scan(prefix, keys.prefix_end(prefix)):
        if found == limits.MAX_GROUPS_PER_TOPIC:
            raise Corruption(f"topic {topic_id} has more than {limits.MAX_GROUPS_PER_TOPIC} groups")
        found += 1
    return found


def create_group(stage: Staged, body: CreateGroup, ctx: Context) -> Record:
    topic = topic_view(stage, ctx.domain, body.topic)
    name = body.group
    check_name("group name", name, limits.MAX_GROUP_NAME_CHARS, limits.GROUP_NAME_PATTERN)
    group_filter = _check_filter(body.filter)
    policy = resolve_group_policy(body.policy)
    topic_id = topic.incarnation
    existing = load(stage, keys.group(topic_id, name), GroupRecord)
    if existing is not None:
        # The start is for a new group only (Kafka's auto.offset.reset): from level 12 a declare is
        # not held to where the topic has moved since (a purge past a fixed start position).
        if feature_level(stage) >= DECLARES_UNSTARTED:
            _check_start(body.start, body.position, "CreateGroup")
        else:
            _target_checkpoint(topic, body.start, body.position, "CreateGroup")
        current = existing.view

        def differing() -> list[str]:
            compared = (("filter", current.filter == group_filter), ("policy", current.policy == policy))
            return [what for what, same in compared if not same]

        return declared(stage, "group", differing, lambda: group_view(stage, topic, current))
    checkpoint = _target_checkpoint(topic, body.start, body.position, "CreateGroup")
    if count_groups(stage, topic_id) == limits.MAX_GROUPS_PER_TOPIC:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, f"a topic has at most {limits.MAX_GROUPS_PER_TOPIC} groups")
    usage.charge(stage, ctx.domain, keys.topic(ctx.domain, topic.topic), groups=1)
    group_id = allocate_incarnation(stage)
    stage.put(keys.resource_key(group_id), keys.group(topic_id, name))
    group = GroupState(
        domain=ctx.domain,
        topic=topic.topic,
        topic_incarnation=topic_id,
        group=name,
        incarnation=group_id,
        created_at_ms=ctx.now_ms,
        filter=group_filter,
        policy=policy,
        generation=1,
        paused=False,
        checkpoint=checkpoint,
        issued=checkpoint,
        outstanding=0,
        redeliverable=0,
        parked_count=0,
        pin_floor=checkpoint,
        delivered_total=0,
        acked_total=0,
        filtered_total=0,
        parked_total=0,
    )
    work = Working(GroupRecord(view=group))
    store_group(stage, work)
    return group_view(stage, topic, work.view)


def group_status(stage: Staged, body: GroupStatus, ctx: Context) -> Record:
    topic, work = load_group(stage, ctx.domain, body.topic, body.group)
    return group_view(stage, topic, work.view)


def _set_paused(stage: Staged, body: PauseGroup | ResumeGroup, ctx: Context, paused: bool) -> Record:
    """Pause or resume; doing it again changes nothing (idempotent by state)."""
    topic, work = load_group(stage, ctx.domain, body.topic, body.group)
    if work.view.paused != paused:
        work.update(paused=paused)
        store_group(stage, work)
    return group_view(stage, topic, work.view)


def pause_group(stage: Staged, body: PauseGroup, ctx: Context) -> Record:
    """Receives are refused (DispatchPaused); leases already given out can still be settled."""
    return _set_paused(stage, body, ctx, True)


def resume_group(stage: Staged, body: ResumeGroup, ctx: Context) -> Record:
    return _set_paused(stage, body, ctx, False)


# -- seek and configure --------------------------------------------------------------------


def _reposition(stage: Staged, work: Working, checkpoint: int) -> None:
    """Restart the group after `checkpoint`, paused, in a new generation (older tokens are invalid).

    Outstanding deliveries and their timers go; parked positions above the new
    checkpoint go too (they will be evaluated again), those at or below it stay listed.
    """
    group = work.view
    group_id = group.incarnation
    start = keys.position(group_id, group.checkpoint + 1)
    dropped = 0
    for key, value in stage.scan(start, keys.group_row_end(start)):
        if dropped == group.outstanding:
            raise Corruption(f"group {group_id} has more position rows than outstanding positions")
        position = keys.row_position(key)
        # Possibly many rows, each read once for the index row it names: a dict read suffices.
        meta = REGISTRY.decode(POSITION_META, value)
        _leave_row(stage, work, position, meta["state"], meta["lease_until_ms"], meta["not_before_ms"])
        stage.delete(key)
        dropped += 1
    if dropped != group.outstanding:
        raise Corruption(f"group {group_id} counts {group.outstanding} outstanding positions, has {dropped}")
    start = keys.parked(group_id, checkpoint + 1)
    above = list(itertools.islice(stage.scan(start, keys.group_row_end(start)), limits.MAX_REPOSITION_PARKED + 1))
    if len(above) > limits.MAX_REPOSITION_PARKED:
        raise Rejected(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"more than {limits.MAX_REPOSITION_PARKED} parked positions lie after the target",
        )
    for key, _ in above:
        stage.delete(key)
    group = work.view
    work.update(
        parked_count=adjusted("parked_count", group.parked_count, -len(above)),
        checkpoint=checkpoint,
        issued=checkpoint,
        outstanding=0,
        paused=True,
        generation=group.generation + 1,
    )
    assert work.view.redeliverable == 0


def _check_generation(group: GroupState, expected: int | None, kind: str) -> None:
    detail = f"the group is at generation {group.generation}"
    validation.check_fence(f"{kind}.expected_generation", expected, group.generation, detail)


def seek_group(stage: Staged, body: SeekGroup, ctx: Context) -> Record:
    """Make `to` the next position delivered; the group stays paused until resumed.

    A seek is the operator saying where the group stands: parked positions at or
    below the new checkpoint stop pinning purges (they stay listed until a purge
    passes them); those above it are delivered again.
    """
    topic, work = load_group(stage, ctx.domain, body.topic, body.group)
    _check_generation(work.view, body.expected_generation, "SeekGroup")
    checkpoint = _target_checkpoint(topic, body.to, body.position, "SeekGroup")
    _reposition(stage, work, checkpoint)
    work.update(pin_floor=checkpoint)
    store_group(stage, work)
    return group_view(stage, topic, work.view)


def configure_group(stage: Staged, body: ConfigureGroup, ctx: Context) -> Record:
    """Replace a paused group's filter and/or policy (null: unchanged), fenced by its generation.

    Nothing retained is skipped: every position after the checkpoint is evaluated
    again under the new definition once the group is resumed.
    """
    topic, work = load_group(stage, ctx.domain, body.topic, body.group)
    _check_generation(work.view, body.expected_generation, "ConfigureGroup")
    if not work.view.paused:
        raise Rejected(ErrorCode.CONFLICT, "a group is configured only while paused")
    if body.filter is not None:
        work.update(filter=_check_filter(body.filter))
    if body.policy is not None:
        work.update(policy=resolve_group_policy(body.policy))
    _reposition(stage, work, work.view.checkpoint)
    store_group(stage, work)
    return group_view(stage, topic, work.view)
