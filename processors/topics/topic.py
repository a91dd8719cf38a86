"""Topics: retained events at dense positions 1..tail, deduplicated by event id, read in bounded pages.

A topic record holds the policy, the retained range first_available..tail and
authoritative counters. Each event is one immutable row keyed by (topic id,
position) with its body inline. A separate event-id index maps (topic id, event
id) to the event's position and a digest of its content: a repeat is told apart
from a conflicting reuse without reading the event, and dedup outlives the events
a purge removes. From feature level 6 an event id is kept for its domain's receipt
horizon from its publish (processors/horizons.py), then it is new. Events leave
only from the front, by purge, age or the caps under `discard: old`
(processors/topics/retention.py).
"""

from __future__ import annotations

import hashlib
import struct

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import CloseTopic, ConfigureTopic, CreateTopic, Event, InspectTopic, Publish, PurgeTopic, ReadTopic
from keyload.log.codec import REGISTRY, Record
from keyload.processors import usage, validation
from keyload.processors.context import Context
from keyload.processors.counters import adjusted
from keyload.processors.declare import declared
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import EVENT_IDS_KEPT, PURGES_NAME_LOWEST, feature_level
from keyload.processors.horizons import keep_until_receipt_horizon
from keyload.processors.policy import resolve_topic_policy
from keyload.processors.queues.state import allocate_incarnation, bounded, check_headers, check_name
from keyload.processors.topics import retention
from keyload.processors.topics.cursors import cursor, cursor_position
from keyload.projections import keys
from keyload.projections.records import (
    EventRecord,
    TopicDiscard,
    TopicRecord,
    TopicView,
    load,
    save,
)
from keyload.projections.store import Staged

EVENT_RECORD = EventRecord.SCHEMA

_U32 = struct.Struct(">I")


def content_digest(event: Event) -> bytes:
    """SHA-256 over an event's content: its type, its header count and headers in name order,
    and its body; every string and the body u32-length-prefixed, so no two contents share bytes."""
    digest = hashlib.sha256()

    def part(data: bytes) -> None:
        digest.update(_U32.pack(len(data)))
        digest.update(data)

    headers = event.headers
    part(event.type.encode("utf-8"))
    digest.update(_U32.pack(len(headers)))
    for name in sorted(headers):
        part(name.encode("utf-8"))
        part(headers[name].encode("utf-8"))
    part(event.body)
    return digest.digest()


def _check_retained(incarnation: int, retained_events: int, first_available: int, tail: int) -> None:
    if retained_events != tail - first_available + 1:
        raise Corruption(f"topic {incarnation} counts {retained_events} retained events")


def topic_record(stage: Staged, domain: str, name: str) -> TopicRecord:
    """The named topic; its retained range is checked against its count."""
    check_name("topic name", name, limits.MAX_TOPIC_NAME_CHARS, limits.TOPIC_NAME_PATTERN)
    record = load(stage, keys.topic(domain, name), TopicRecord)
    if record is None:
        raise Rejected(ErrorCode.NOT_FOUND, "topic does not exist")
    topic = record.view
    _check_retained(topic.incarnation, topic.retained_events, topic.first_available, topic.tail)
    return record


def save_topic(stage: Staged, record: TopicRecord) -> None:
    save(stage, keys.topic(record.view.domain, record.view.topic), record)


def create_topic(stage: Staged, body: CreateTopic, ctx: Context) -> Record:
    name = body.topic
    check_name("topic name", name, limits.MAX_TOPIC_NAME_CHARS, limits.TOPIC_NAME_PATTERN)
    policy = resolve_topic_policy(body.policy)
    row = keys.topic(ctx.domain, name)
    existing = load(stage, row, TopicRecord)
    if existing is not None:
        current = existing.view
        return declared(stage, "topic", lambda: ["policy"] if current.policy != policy else [], current.to_avro)
    usage.charge(stage, ctx.domain, row, topics=1)
    record = TopicRecord(
        view=TopicView(
            domain=ctx.domain,
            topic=name,
            incarnation=allocate_incarnation(stage),
            created_at_ms=ctx.now_ms,
            policy=policy,
            first_available=1,
            tail=0,
            generation=1,
            retained_events=0,
            retained_bytes=0,
            published_total=0,
        )
    )
    save_topic(stage, record)
    return record.view.to_avro()


def inspect_topic(stage: Staged, body: InspectTopic, ctx: Context) -> Record:
    return topic_record(stage, ctx.domain, body.topic).view.to_avro()


def configure_topic(stage: Staged, body: ConfigureTopic, ctx: Context) -> Record:
    """Replace the topic's whole policy, fenced by an optional expected policy version.

    Nothing is removed here: a shorter age or (under discard old) a lower cap is applied by the
    retention timer, in bounded steps from the next record on; under discard new a topic over a
    lowered cap refuses publishes until purges or age bring it under.
    """
    record = topic_record(stage, ctx.domain, body.topic)
    current = record.view
    expected = body.expected_policy_version
    detail = f"policy version is {current.policy_version}, expected {expected}"
    validation.check_fence("ConfigureTopic.expected_policy_version", expected, current.policy_version, detail)
    topic = replace(current, policy=resolve_topic_policy(body.policy), policy_version=current.policy_version + 1)
    record = retention.with_timer(stage, replace(record, view=topic), retention.due_ms(stage, topic, ctx.now_ms))
    save_topic(stage, record)
    return topic.to_avro()


def close_topic(stage: Staged, body: CloseTopic, ctx: Context) -> Record:
    """No new events from now on; reads, groups, purges and retention go on. One-way; closing a
    closed topic changes nothing."""
    record = topic_record(stage, ctx.domain, body.topic)
    if not record.view.closed:
        record = replace(record, view=replace(record.view, closed=True))
        save_topic(stage, record)
    return record.view.to_avro()


def _check_event(index: int, event: Event) -> int:
    """Validate one event of a Publish; its charge against retained_bytes (body, type, headers)."""
    try:
        check_name("event id", event.event_id, limits.MAX_EVENT_ID_CHARS, limits.ID_PATTERN)
        check_name("event type", event.type, limits.MAX_EVENT_TYPE_CHARS, limits.ID_PATTERN)
        header_bytes = check_headers(event.headers)
        if len(event.body) > limits.MAX_INLINE_BODY_BYTES:
            raise Rejected(ErrorCode.VALIDATION, f"body exceeds {limits.MAX_INLINE_BODY_BYTES} bytes")
    except Rejected as rejection:
        raise Rejected(rejection.code, f"event {index}: {rejection.detail}") from None
    return len(event.body) + len(event.type.encode("utf-8")) + header_bytes


def _check_events(events: list[Event]) -> list[int]:
    """Validate a Publish's events as a whole; each event's charge."""
    if not 1 <= len(events) <= limits.MAX_PUBLISH_EVENTS:
        raise Rejected(ErrorCode.VALIDATION, f"a publish carries 1..{limits.MAX_PUBLISH_EVENTS} events")
    charges = [_check_event(index, event) for index, event in enumerate(events)]
    if sum(len(event.body) for event in events) > limits.MAX_PUBLISH_BODY_BYTES:
        raise Rejected(ErrorCode.VALIDATION, f"the bodies together exceed {limits.MAX_PUBLISH_BODY_BYTES} bytes")
    first_of: dict[str, int] = {}
    for index, event in enumerate(events):
        first = first_of.setdefault(event.event_id, index)
        if first != index:
            raise Rejected(ErrorCode.VALIDATION, f"events {first} and {index} have the same event id")
    return charges


def _check_unpublished(stage: Staged, topic_id: int, events: list[Event], digests: list[bytes]) -> None:
    """Refuse the whole command when any event id was published before.

    Other content under a used id is a Conflict, reported before any duplicate:
    a DuplicateEventId answer tells the publisher its event is safely in, which
    must never hide a conflicting one. Details name indexes and positions only.
    """
    duplicate: tuple[int, int] | None = None
    for index, (event, digest) in enumerate(zip(events, digests, strict=True)):
        row = stage.get(keys.event_id(topic_id, event.event_id))
        if row is None:
            continue
        position, original = keys.parse_event_id_value(row)
        if original != digest:
            detail = f"event {index}: its id was published at position {position} with other content"
            raise Rejected(ErrorCode.CONFLICT, detail)
        duplicate = duplicate or (index, position)
    if duplicate is not None:
        index, position = duplicate
        raise Rejected(ErrorCode.DUPLICATE_EVENT_ID, f"event {index} was already published at position {position}")


def publish(stage: Staged, body: Publish, ctx: Context) -> Record:
    """Append every event at the next positions, or none of them."""
    record = topic_record(stage, ctx.domain, body.topic)
    topic = record.view
    if topic.closed:
        raise Rejected(ErrorCode.CONFLICT, f"topic {topic.topic} is closed: it takes no new events")
    events = body.events
    charges = _check_events(events)
    topic_id = topic.incarnation
    digests = [content_digest(event) for event in events]
    _check_unpublished(stage, topic_id, events, digests)
    was_empty, first_available = topic.retained_events == 0, topic.first_available
    topic = _make_room(stage, topic, len(events), sum(charges))

    tail, retained_events, retained_bytes, published_total = (
        topic.tail,
        topic.retained_events,
        topic.retained_bytes,
        topic.published_total,
    )
    ids_kept = feature_level(stage) >= EVENT_IDS_KEPT
    published: list[Record] = []
    for event, charge, digest in zip(events, charges, digests, strict=True):
        position = tail + 1
        stored = EventRecord(
            event_id=event.event_id,
            type=event.type,
            headers=dict(sorted(event.headers.items())),
            body=event.body,
            published_at_ms=ctx.now_ms,
            charged_bytes=charge,
        )
        save(stage, keys.event(topic_id, position), stored)
        id_row = keys.event_id(topic_id, event.event_id)
        stage.put(id_row, keys.event_id_value(position, digest))
        if ids_kept:
            keep_until_receipt_horizon(stage, id_row, ctx.domain, ctx.now_ms)
        tail = position
        retained_events = adjusted("retained_events", retained_events, 1)
        retained_bytes = adjusted("retained_bytes", retained_bytes, charge)
        published_total = adjusted("published_total", published_total, 1)
        published.append({"event_id": event.event_id, "position": position})
    topic = replace(
        topic,
        tail=tail,
        retained_events=retained_events,
        retained_bytes=retained_bytes,
        published_total=published_total,
    )
    record = replace(record, view=topic)
    if was_empty or topic.first_available != first_available:  # a new front event: a new expiry
        record = retention.with_timer(stage, record, retention.due_ms(stage, topic, ctx.now_ms))
    save_topic(stage, record)
    return {
        "topic": topic.topic,
        "events": published,
        "retained_events": topic.retained_events,
        "retained_bytes": topic.retained_bytes,
    }


def _make_room(stage: Staged, topic: TopicView, events: int, charged: int) -> TopicView:
    """The topic with room for `events` more events of `charged` bytes: as it is when both caps
    hold, or under discard old without its oldest events (at most MAX_PURGE_EVENTS of them, never
    past the purge limit). Refused (ResourceExhausted) when no such room can be made."""
    policy = topic.policy
    excess_events = topic.retained_events + events - policy.max_retained_events
    excess_bytes = topic.retained_bytes + charged - policy.max_retained_bytes
    if excess_events <= 0 and excess_bytes <= 0:
        return topic
    cap = "max_retained_events" if excess_events > 0 else "max_retained_bytes"
    if policy.discard == TopicDiscard.new:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, f"the topic would exceed {cap}")
    if retention.over_caps(policy, events, charged):
        alone = "max_retained_events" if events > policy.max_retained_events else "max_retained_bytes"
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, f"the events alone exceed {alone}")
    pinning = retention.pinning_groups(stage, topic)
    limit = retention.purge_limit(stage, topic, pinning)
    removed: list[retention.FrontEvent] = []
    furthest = topic.first_available + limits.MAX_PURGE_EVENTS - 1
    stop = min(limit, furthest)
    for event in retention.front_events(stage, topic, stop):
        removed.append(event)
        excess_events -= 1
        excess_bytes -= event.charged_bytes
        if excess_events <= 0 and excess_bytes <= 0:
            return retention.remove_front(stage, topic, pinning, removed)
    if limit < furthest:  # the events alone fit, so a group pins what would have to go
        raise Rejected(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"the topic would exceed {cap}, and a group has not completed position {limit + 1}",
        )
    raise Rejected(
        ErrorCode.RESOURCE_EXHAUSTED,
        f"the topic would exceed {cap} unless more than {limits.MAX_PURGE_EVENTS} events were discarded",
    )


def read_topic(stage: Staged, body: ReadTopic, ctx: Context) -> Record:
    """A page of events from `from_position` (or where `cursor` points) in position order.

    The page ends at `max_events`, at `max_bytes` of charged bytes (the first
    event is always returned, so one large event never wedges a reader), at the
    tail, or after READ_EXAMINATION_BUDGET rows (`budget_exhausted`).
    """
    topic = topic_record(stage, ctx.domain, body.topic).view
    max_events = bounded("max_events", body.max_events, limits.DEFAULT_READ_EVENTS, 1, limits.MAX_READ_EVENTS)
    max_bytes = bounded("max_bytes", body.max_bytes, limits.DEFAULT_READ_BYTES, 1, limits.MAX_READ_BYTES)
    if body.from_position is not None and body.cursor is None:
        start = body.from_position
    elif body.from_position is None and body.cursor is not None:
        start = cursor_position(body.cursor)
    else:
        raise Rejected(ErrorCode.VALIDATION, "a read starts from a position or from a cursor: exactly one of them")
    first, tail = topic.first_available, topic.tail
    if start < 0:
        raise Rejected(ErrorCode.VALIDATION, "from_position must not be negative")
    if start < first:
        raise Rejected(ErrorCode.HISTORY_UNAVAILABLE, f"position {start} is before first_available {first}")
    if start > tail + 1:
        raise Rejected(ErrorCode.VALIDATION, f"from_position is past the tail + 1 ({tail + 1})")
    topic_id = topic.incarnation
    events: list[Record] = []
    size = 0
    budget_hit = False
    rows = stage.scan(keys.event(topic_id, start), keys.event(topic_id, tail + 1))
    for examined, (key, value) in enumerate(rows):
        if len(events) == max_events:
            break
        if examined == limits.READ_EXAMINATION_BUDGET:
            budget_hit = True
            break
        position = start + examined
        if keys.event_position(key) != position:
            raise Corruption(f"topic {topic_id} has no event at retained position {position}")
        # A dict, not an EventRecord: a page decodes up to MAX_READ_EVENTS events and returns their fields.
        event = REGISTRY.decode(EVENT_RECORD, value)
        if events and size + event["charged_bytes"] > max_bytes:
            break
        size += event["charged_bytes"]
        events.append(event_item(position, event))
    else:
        if start + len(events) != tail + 1:
            raise Corruption(f"topic {topic_id} has no event at retained position {start + len(events)}")
    return {
        "events": events,
        "next_position": start + len(events),
        "first_available": first,
        "tail": tail,
        "budget_exhausted": budget_hit,
        "next_cursor": cursor(start + len(events)),
    }


def event_item(position: int, event: Record) -> Record:
    """A stored event as a result returns it (a TopicEvent; a group delivery adds its lease)."""
    return {
        "position": position,
        "event_id": event["event_id"],
        "type": event["type"],
        "headers": event["headers"],
        "body": event["body"],
        "published_at_ms": event["published_at_ms"],
    }


# -- purge ---------------------------------------------------------------------------------


def purge_topic(stage: Staged, body: PurgeTopic, ctx: Context) -> Record:
    """Delete the retained events first_available..through and release their bytes.

    Refused (ResourceExhausted) past the tail or past any group's purge limit,
    paused groups included; a stale generation is RevisionConflict, as a stale
    expected revision is everywhere else. Event-id rows stay, so a re-published old
    id is still recognised.
    """
    validation.check_integer("PurgeTopic.through", body.through)
    validation.check_integer("PurgeTopic.expected_generation", body.expected_generation)
    stored = topic_record(stage, ctx.domain, body.topic)
    topic = stored.view
    through, first = body.through, topic.first_available
    if body.expected_generation != topic.generation:
        raise Rejected(ErrorCode.REVISION_CONFLICT, f"the topic is at generation {topic.generation}")
    if through < first:
        raise Rejected(ErrorCode.VALIDATION, f"through must be at least first_available ({first})")
    if through > topic.tail:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, f"through is past the tail ({topic.tail})")
    if through - first + 1 > limits.MAX_PURGE_EVENTS:
        raise Rejected(
            ErrorCode.VALIDATION, f"a purge deletes at most {limits.MAX_PURGE_EVENTS} events: purge in steps"
        )
    pinning = retention.pinning_groups(stage, topic)  # at most MAX_GROUPS_PER_TOPIC; purges are rare
    if feature_level(stage) >= PURGES_NAME_LOWEST:
        limit = retention.purge_limit(stage, topic, pinning)
    else:  # the first group (in name order) whose limit the purge passes
        passed = (retention.group_limit(stage, topic, group.view) for group in pinning)
        limit = next((limit for limit in passed if through > limit), topic.tail)
    if through > limit:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, f"a group has not completed position {limit + 1}")
    removed = list(retention.front_events(stage, topic, through))
    if len(removed) != through - first + 1:
        raise Corruption(f"topic {topic.incarnation} has no event at some retained position up to {through}")
    topic = retention.remove_front(stage, topic, pinning, removed)
    record = replace(stored, view=topic)
    save_topic(stage, retention.with_timer(stage, record, retention.due_ms(stage, topic, ctx.now_ms)))
    return topic.to_avro()


def fire_retention(stage: Staged, record: TopicRecord, ctx: Context, budget: int) -> tuple[int, int]:
    """Fire the topic's retention timer (processors/timers.py): (events examined, events removed)."""
    step = retention.retention_step(stage, record, ctx.now_ms, budget)
    updated = retention.with_timer(stage, replace(record, view=step.topic), step.next_due_ms)
    if updated != record:  # a recheck that finds the front still pinned changes nothing but the timer
        save_topic(stage, updated)
    return step.examined, step.removed
