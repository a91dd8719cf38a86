"""Queue resources: create, configure, pause, resume, close, delete, enqueue, inspect."""

from __future__ import annotations

from typing import Protocol

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import (
    CloseQueue,
    ConfigureQueue,
    CreateQueue,
    DeleteQueue,
    Enqueue,
    InspectMessage,
    InspectQueue,
    PauseQueue,
    PrepareLargeSchedule,
    PurgeQueue,
    ResumeQueue,
)
from keyload.log.codec import Record
from keyload.processors import reclamation, usage, validation, waiters
from keyload.processors.context import Context
from keyload.processors.declare import declared
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.horizons import read_identity_tombstone
from keyload.processors.policy import resolve_policy
from keyload.processors.queues.lifecycle import add_expiry, enter, receive_result
from keyload.processors.queues.state import (
    LIVE_STATES,
    Working,
    allocate_incarnation,
    check_headers,
    check_message_id,
    check_name,
    load_message,
    load_queue,
    save_queue,
    timers_from_floor,
)
from keyload.projections import keys
from keyload.projections.records import (
    LargePayload,
    MessageMeta,
    MessageState,
    QueueCounters,
    QueueRecord,
    QueueView,
    load,
    save,
)
from keyload.projections.store import Staged

_ZERO_COUNTERS = QueueCounters(
    stored_messages=0,
    stored_bytes=0,
    scheduled=0,
    ready=0,
    leased=0,
    dead_lettered=0,
    pending_dead_letter=0,
    dead_letter_bytes=0,
    enqueued_total=0,
    acked_total=0,
    expired_total=0,
    cancelled_total=0,
    reserved_messages=0,
    reserved_bytes=0,
    payload_object_bytes=0,
)


class NewMessage(Protocol):
    """What admitting a message reads of what asked for it: an Enqueue, or a large message's
    PrepareLargeSchedule and, at its commit, its PayloadReservation."""

    @property
    def message_id(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]: ...

    @property
    def ordering_key(self) -> str | None: ...

    @property
    def not_before_ms(self) -> int | None: ...

    @property
    def expires_at_ms(self) -> int | None: ...


def create_queue(stage: Staged, body: CreateQueue, ctx: Context) -> Record:
    name = body.queue
    check_name("queue name", name, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
    policy = resolve_policy(body.policy)
    row = keys.queue(ctx.domain, name)
    existing = load(stage, row, QueueRecord)
    if existing is not None:
        current = existing.view
        return declared(stage, "queue", lambda: ["policy"] if current.policy != policy else [], current.to_avro)
    view = QueueView(
        domain=ctx.domain,
        queue=name,
        incarnation=0,  # _install allocates it
        created_at_ms=ctx.now_ms,
        policy_version=1,
        policy=policy,
        counters=_ZERO_COUNTERS,
    )
    return _install(stage, ctx.domain, view).view.to_avro()


def _install(stage: Staged, domain: str, view: QueueView) -> QueueRecord:
    """A new incarnation of the queue `view` names, configured as `view` says and holding nothing,
    charged to its domain: a created queue, or a purged one's successor."""
    row = keys.queue(domain, view.queue)
    usage.charge(stage, domain, row, queues=1)
    queue_id = allocate_incarnation(stage)
    stage.put(keys.resource_key(queue_id), row)
    record = QueueRecord(
        view=replace(view, incarnation=queue_id, counters=_ZERO_COUNTERS),
        next_enqueue_sequence=1,
        next_ready_sequence=1,
        next_parked_sequence=1,
        next_timer_ms=None,
        waiting_receives=0,
        next_waiter_sequence=1,
        ready_floor=1,
        timer_floor=None,
        waiter_floor=1,
    )
    save(stage, row, record)
    return record


def configure_queue(stage: Staged, body: ConfigureQueue, ctx: Context) -> Record:
    record = load_queue(stage, ctx.domain, body.queue)
    current = record.view
    expected = body.expected_policy_version
    detail = f"policy version is {current.policy_version}, expected {expected}"
    validation.check_fence("ConfigureQueue.expected_policy_version", expected, current.policy_version, detail)
    policy = resolve_policy(body.policy)
    if current.counters.stored_messages > 0:
        for name, changed in (
            ("ordering", policy.ordering != current.policy.ordering),
            ("parked_head", policy.parked_head != current.policy.parked_head),
        ):
            if changed:
                raise Rejected(
                    ErrorCode.CONFLICT,
                    f"policy.{name} cannot change while the queue holds messages",
                )
    configured = replace(record, view=replace(current, policy=policy, policy_version=current.policy_version + 1))
    save_queue(stage, configured)
    return configured.view.to_avro()


def pause_queue(stage: Staged, body: PauseQueue, ctx: Context) -> Record:
    """Receives are refused (DispatchPaused) or wait; leases in hand can still be settled, renewed
    or run out, and enqueues go on."""
    return _set_flags(stage, body.queue, ctx, paused=True)


def resume_queue(stage: Staged, body: ResumeQueue, ctx: Context) -> Record:
    """Dispatch again; saving the queue lets the record's waiters be served (processors/apply.py)."""
    return _set_flags(stage, body.queue, ctx, paused=False)


def close_queue(stage: Staged, body: CloseQueue, ctx: Context) -> Record:
    """No new messages from now on (`check_open`); what the queue holds is delivered and settled as before."""
    return _set_flags(stage, body.queue, ctx, closed=True)


def delete_queue(stage: Staged, body: DeleteQueue, ctx: Context) -> Record:
    """Delete a queue that holds nothing (no message in any live state, no open reservation), or,
    with `force`, whatever it holds; fenced by an optional expected incarnation.

    Its name is free at once (a new queue of that name is a new incarnation, so the old tokens stay
    invalid); receives waiting on it are answered empty; its rows are reclaimed afterwards, in
    bounded steps, and what a forced deletion drops releases its objects to the GC as it goes
    (processors/reclamation.py). Returns its last view.
    """
    record = _fenced(stage, ctx, body.queue, "DeleteQueue.expected_incarnation", body.expected_incarnation)
    held = record.view.counters.stored_messages
    if not body.force and held:
        raise Rejected(
            ErrorCode.CONFLICT,
            f"queue {body.queue} holds {held} message{'' if held == 1 else 's'}: settle, cancel or wait for "
            "them first, or delete it by force",
        )
    if not body.force and _holds_open_reservation(stage, record, ctx.now_ms):
        raise Rejected(
            ErrorCode.CONFLICT,
            f"queue {body.queue} holds open large-payload reservations: commit, cancel or let them expire "
            "first, or delete it by force",
        )
    return _retire(stage, ctx, record).view.to_avro()


def purge_queue(stage: Staged, body: PurgeQueue, ctx: Context) -> Record:
    """Drop every message, in any state, as SQS's PurgeQueue does; fenced by an optional expected
    incarnation.

    The incarnation is retired as a forced deletion's (its leases invalid, waiting receives answered
    empty, its rows reclaimed in bounded steps, its large messages' objects released to the GC) and a
    new one takes the name at once, with the same policy, policy version, flags and creation time:
    one command, so no enqueue can fall between the two. Returns the new incarnation's view."""
    record = _fenced(stage, ctx, body.queue, "PurgeQueue.expected_incarnation", body.expected_incarnation)
    return _install(stage, ctx.domain, _retire(stage, ctx, record).view).view.to_avro()


def _fenced(stage: Staged, ctx: Context, queue: str, field: str, expected: int | None) -> QueueRecord:
    """The named queue, when it is the `expected` incarnation (None: any); RevisionConflict otherwise."""
    record = load_queue(stage, ctx.domain, queue)
    incarnation = record.view.incarnation
    detail = f"queue {queue} is incarnation {incarnation}, expected {expected}"
    validation.check_fence(field, expected, incarnation, detail)
    return record


def _retire(stage: Staged, ctx: Context, record: QueueRecord) -> QueueRecord:
    """Retire the queue's incarnation: receives waiting on it are answered empty, its name is free,
    its domain uncharged, and its rows go to reclamation (processors/reclamation.py). Its last state."""
    record, waiting = waiters.oldest(stage, record, limits.MAX_WAITERS_PER_RESOURCE)
    for sequence, waiter in waiting:
        record = waiters.complete(stage, record, ctx, sequence, waiter, receive_result([]))
    row = keys.queue(ctx.domain, record.view.queue)
    stage.delete(row)
    usage.charge(stage, ctx.domain, row, queues=-1)
    reclamation.retire(stage, reclamation.QUEUE_RETIREMENT, record, ctx.now_ms)
    return record


def _holds_open_reservation(stage: Staged, record: QueueRecord, now_ms: int) -> bool:
    """Whether the queue has a reservation still open at `now_ms`: a deadline timer not yet due (one
    due has expired by log time, fired or not). Reservations that ended keep their quota until the
    GC confirms their object's deletion; they do not count. Asked only of a queue that holds no
    message: its timers are then waiter deadlines (at most MAX_WAITERS_PER_RESOURCE), serve timers
    and reservation deadlines, so the walk stops at the first open one or after those."""
    for key, _ in timers_from_floor(stage, record):
        due_ms, kind, _ = keys.parse_timer(key)
        if kind == keys.TIMER_RESERVATION and due_ms > now_ms:
            return True
    return False


def _set_flags(stage: Staged, queue: str, ctx: Context, **flags: bool) -> Record:
    """Set the queue's dispatch flags; doing it again changes nothing (idempotent by state)."""
    record = load_queue(stage, ctx.domain, queue)
    if any(getattr(record.view, name) != value for name, value in flags.items()):
        record = replace(record, view=replace(record.view, **flags))
        save_queue(stage, record)
    return record.view.to_avro()


def check_open(queue: QueueView) -> None:
    """Conflict when the queue is closed: it admits no new message (Enqueue, PrepareLargeSchedule,
    CommitLargeSchedule)."""
    if queue.closed:
        raise Rejected(ErrorCode.CONFLICT, f"queue {queue.queue} is closed: it takes no new messages")


def check_new_message(stage: Staged, queue: QueueView, body: Enqueue | PrepareLargeSchedule, ctx: Context) -> None:
    """What Enqueue and PrepareLargeSchedule check alike: the queue is open; the id is unused (and
    never retired) in the queue; headers, ordering key and times are valid."""
    check_open(queue)
    kind = type(body).__name__
    message_id = body.message_id
    check_message_id(message_id)
    check_headers(body.headers)
    ordering_key = body.ordering_key
    if ordering_key is not None:
        check_name("ordering key", ordering_key, limits.MAX_ORDERING_KEY_CHARS, limits.ID_PATTERN)
    # Absolute times are log times (MIN_LOG_TIME_MS..MAX_LOG_TIME_MS): one past it would never fire.
    not_before, expires_at = body.not_before_ms, body.expires_at_ms
    if not_before is not None:
        if not_before > ctx.now_ms + limits.MAX_SCHEDULE_AHEAD_MS:
            raise Rejected(ErrorCode.VALIDATION, "not_before_ms is more than 365 days ahead")
        validation.check_integer(f"{kind}.not_before_ms", not_before)
    if expires_at is not None:
        if expires_at <= ctx.now_ms:
            raise Rejected(ErrorCode.VALIDATION, "expires_at_ms is not in the future")
        validation.check_integer(f"{kind}.expires_at_ms", expires_at)
        if not_before is not None and expires_at <= not_before:
            raise Rejected(ErrorCode.VALIDATION, "expires_at_ms must be after not_before_ms")
    queue_id = queue.incarnation
    if stage.get(keys.message(queue_id, message_id)) is not None:
        raise Rejected(ErrorCode.CONFLICT, "message id is already used in this queue")
    if stage.get(keys.identity(queue_id, message_id)) is not None:
        raise Rejected(ErrorCode.CONFLICT, "message id is reserved or retired in this queue")


def check_room(queue: QueueView, messages: int, size: int) -> None:
    """ResourceExhausted unless the queue's grant holds `messages` more messages of `size` bytes,
    counting what reservations hold."""
    counters, policy = queue.counters, queue.policy
    if counters.stored_messages + counters.reserved_messages + messages > policy.max_stored_messages:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, "queue is at max_stored_messages")
    if counters.stored_bytes + counters.reserved_bytes + size > policy.max_stored_bytes:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, "queue is at max_stored_bytes")


def enqueue(stage: Staged, body: Enqueue, ctx: Context) -> Record:
    work = Working(load_queue(stage, ctx.domain, body.queue))
    check_new_message(stage, work.view, body, ctx)
    payload: bytes = body.body
    if len(payload) > limits.MAX_INLINE_BODY_BYTES:
        raise Rejected(ErrorCode.VALIDATION, f"body exceeds {limits.MAX_INLINE_BODY_BYTES} bytes")
    check_room(work.view, 1, len(payload))
    result = admit(stage, work, body, ctx, payload, None)
    save_queue(stage, work.record)
    return result


def admit(
    stage: Staged, work: Working, message: NewMessage, ctx: Context, inline: bytes, large: LargePayload | None
) -> Record:
    """Store a checked new message: its body (empty for a large one, whose bytes are the `large`
    payload's object), metadata, quota and first state. Returns the EnqueueResult."""
    queue_id = work.view.incarnation
    message_id = message.message_id
    size = len(inline) if large is None else large.length
    not_before = message.not_before_ms
    first = MessageState.scheduled if not_before is not None and not_before > ctx.now_ms else MessageState.ready
    sequence = work.record.next_enqueue_sequence
    work.update(next_enqueue_sequence=sequence + 1)
    meta = MessageMeta(
        state=first,
        state_version=0,  # `enter` puts the message in its first state as version 1
        attempts=0,
        lease_version=0,
        delivery_generation=1,
        enqueue_sequence=sequence,
        ready_sequence=None,
        parked_sequence=None,
        enqueued_at_ms=ctx.now_ms,
        not_before_ms=not_before,
        expires_at_ms=message.expires_at_ms,
        lease_owner=None,
        lease_until_ms=None,
        body_bytes=size,
        headers=dict(sorted(message.headers.items())),
        ordering_key=message.ordering_key,
        terminal_at_ms=None,
        last_retry_delay_ms=None,
        dead_lettered_at_ms=None,
        payload=large,
        read_until_ms=None,
    )
    work.adjust(stored_messages=1, stored_bytes=size, enqueued_total=1)
    stage.put(keys.body(queue_id, message_id), inline)
    meta = enter(stage, work, message_id, meta, first, ctx, not_before_ms=not_before)
    add_expiry(stage, work, message_id, meta)
    counters = work.view.counters
    return {
        "queue": work.view.queue,
        "message_id": message_id,
        "state": str(meta.state),
        "enqueue_sequence": sequence,
        "stored_messages": counters.stored_messages,
        "stored_bytes": counters.stored_bytes,
    }


def inspect_queue(stage: Staged, body: InspectQueue, ctx: Context) -> Record:
    return load_queue(stage, ctx.domain, body.queue).view.to_avro()


def inspect_message(stage: Staged, body: InspectMessage, ctx: Context) -> Record:
    queue_id = load_queue(stage, ctx.domain, body.queue).view.incarnation
    check_message_id(body.message_id)
    meta = load_message(stage, queue_id, body.message_id)
    if meta is None:
        identity = stage.get(keys.identity(queue_id, body.message_id))
        if identity is None:
            raise Rejected(ErrorCode.NOT_FOUND, "message does not exist")
        tombstone = read_identity_tombstone(identity)
        if tombstone is None:
            raise Rejected(ErrorCode.NOT_FOUND, "message is reserved, or its history was reclaimed (the id stays used)")
        finished_ms, state = tombstone
        raise Rejected(
            ErrorCode.HISTORY_UNAVAILABLE,
            f"message was {state} at {finished_ms} ms; its history is past the domain's outcome horizon "
            "(the id stays used until its receipt horizon)",
        )
    payload = stage.get(keys.body(queue_id, body.message_id)) if body.include_body else None
    if meta.state in LIVE_STATES and payload is None and body.include_body:
        raise Corruption(f"live message {meta.enqueue_sequence} of queue {queue_id} has no body")
    return {"queue": body.queue, "message_id": body.message_id, "meta": meta.to_avro(), "body": payload}
