"""Typed views of outcomes and results, as the SDK returns them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, Literal, Self

from keyload.commands import COMMANDS, CommandKind
from keyload.errors import ErrorCode
from keyload.log.codec import Record
from keyload.projections.records import MessageState, PositionState  # the schema enums, declared once


def _build(cls: Any, record: Record) -> Any:
    return cls(**{f.name: record[f.name] for f in fields(cls)})


def _with_payload(cls: Any, record: Record) -> Any:
    """A MessageMeta or a Delivery, its optional large payload typed too."""
    payload = record["payload"]
    return _build(cls, dict(record, payload=None if payload is None else _build(LargePayload, payload)))


def _with_state(cls: Any, record: Record, states: type[StrEnum]) -> Any:
    return _build(cls, dict(record, state=states(record["state"])))


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """A queue's policy. Every field has a documented default (docs/ARCHITECTURE.md)."""

    max_stored_messages: int | None = None
    max_stored_bytes: int | None = None
    max_in_flight: int | None = None
    max_attempts: int | None = None
    lease_ms: int | None = None
    max_lease_ms: int | None = None
    retry_base_ms: int | None = None
    retry_max_ms: int | None = None
    retry_factor: int | None = None
    retry_jitter: Literal["none", "full"] | None = None
    max_dead_letter_messages: int | None = None
    max_dead_letter_bytes: int | None = None
    ordering: Literal["competing", "strict_per_key"] | None = None
    parked_head: Literal["continue", "block"] | None = None
    receive_max_messages: int | None = None
    receive_max_bytes: int | None = None
    payload_request_horizon_ms: int | None = None

    def to_record(self) -> Record:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls, record: Record) -> Self:
        built: Self = _build(cls, record)
        return built


@dataclass(frozen=True, slots=True)
class QueueCounters:
    stored_messages: int
    stored_bytes: int
    scheduled: int
    ready: int
    leased: int
    dead_lettered: int
    pending_dead_letter: int
    dead_letter_bytes: int
    enqueued_total: int
    acked_total: int
    expired_total: int
    cancelled_total: int
    reserved_messages: int
    reserved_bytes: int
    payload_object_bytes: int


@dataclass(frozen=True, slots=True)
class QueueView:
    domain: str
    queue: str
    incarnation: int
    created_at_ms: int
    policy_version: int
    policy: QueuePolicy
    counters: QueueCounters

    @classmethod
    def from_record(cls, record: Record) -> QueueView:
        return cls(
            domain=record["domain"],
            queue=record["queue"],
            incarnation=record["incarnation"],
            created_at_ms=record["created_at_ms"],
            policy_version=record["policy_version"],
            policy=QueuePolicy.from_record(record["policy"]),
            counters=_build(QueueCounters, record["counters"]),
        )


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    queue: str
    message_id: str
    state: MessageState
    enqueue_sequence: int
    stored_messages: int
    stored_bytes: int

    @classmethod
    def from_record(cls, record: Record) -> EnqueueResult:
        built: EnqueueResult = _with_state(cls, record, MessageState)
        return built


@dataclass(frozen=True, slots=True)
class MessageMeta:
    state: MessageState
    state_version: int
    attempts: int
    lease_version: int
    delivery_generation: int
    enqueue_sequence: int
    ready_sequence: int | None
    parked_sequence: int | None
    enqueued_at_ms: int
    not_before_ms: int | None
    expires_at_ms: int | None
    lease_owner: str | None
    lease_until_ms: int | None
    body_bytes: int
    headers: dict[str, str]
    ordering_key: str | None
    terminal_at_ms: int | None
    last_retry_delay_ms: int | None
    dead_lettered_at_ms: int | None
    payload: LargePayload | None
    read_until_ms: int | None

    @classmethod
    def from_record(cls, record: Record) -> MessageMeta:
        built: MessageMeta = _with_payload(cls, dict(record, state=MessageState(record["state"])))
        return built


@dataclass(frozen=True, slots=True)
class LargePayload:
    """Where a large message's bytes are: read them with `Client.read_payload(delivery)`."""

    reservation_id: int
    object_key: str
    object_version: str
    length: int
    sha256: bytes
    read_handle: str | None  # in a delivery: valid until its lease ends


@dataclass(frozen=True, slots=True)
class MessageView:
    queue: str
    message_id: str
    meta: MessageMeta
    body: bytes | None

    @classmethod
    def from_record(cls, record: Record) -> MessageView:
        return cls(
            record["queue"],
            record["message_id"],
            MessageMeta.from_record(record["meta"]),
            record["body"],
        )


@dataclass(frozen=True, slots=True)
class TickResult:
    transitions: int
    budget_exhausted: bool
    next_due_ms: int | None


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    offset: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """One leased message. Present `token` to renew, ack or nack it."""

    message_id: str
    token: str
    body: bytes
    headers: dict[str, str]
    ordering_key: str | None
    attempts: int
    delivery_generation: int
    lease_until_ms: int
    enqueued_at_ms: int
    payload: LargePayload | None = None  # a large message: `body` is empty, fetch the bytes with the SDK

    @classmethod
    def from_record(cls, record: Record) -> Delivery:
        built: Delivery = _with_payload(cls, record)
        return built


@dataclass(frozen=True, slots=True)
class ReceiveResult:
    deliveries: list[Delivery]
    budget_exhausted: bool

    @classmethod
    def from_record(cls, record: Record) -> ReceiveResult:
        return cls([Delivery.from_record(d) for d in record["deliveries"]], record["budget_exhausted"])


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """A delivery's state after renew (leased), ack (acked) or nack (scheduled, dead-lettered, expired)."""

    message_id: str
    state: MessageState
    lease_until_ms: int | None
    not_before_ms: int | None
    retry_delay_ms: int | None

    @classmethod
    def from_record(cls, record: Record) -> LeaseResult:
        built: LeaseResult = _with_state(cls, record, MessageState)
        return built


@dataclass(frozen=True, slots=True)
class _Settled:
    """One token's result in an ack batch, queue or group alike."""

    status: Literal["committed", "rejected"]
    error_code: ErrorCode | None


@dataclass(frozen=True, slots=True)
class TokenResult(_Settled):
    message_id: str | None


def _settled(cls: type[_Settled], record: Record) -> list[Any]:
    """An ack batch's per-token results."""
    return [_build(cls, dict(r, error_code=_error_code(r["error_code"]))) for r in record["results"]]


def _error_code(code: str | None) -> ErrorCode | None:
    return None if code is None else ErrorCode(code)


@dataclass(frozen=True, slots=True)
class AckBatchResult:
    results: list[TokenResult]

    @classmethod
    def from_record(cls, record: Record) -> AckBatchResult:
        return cls(_settled(TokenResult, record))


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    messages: list[MessageView]
    next_after_sequence: int | None

    @classmethod
    def from_record(cls, record: Record) -> DeadLetterPage:
        return cls([MessageView.from_record(m) for m in record["messages"]], record["next_after_sequence"])


@dataclass(frozen=True, slots=True)
class ActiveKeys:
    token_key_id: str
    jitter_key_id: str
    proof_key_id: str
    trust_set_version: int


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """A topic's policy. Every field has a documented default (docs/ARCHITECTURE.md)."""

    max_retained_events: int | None = None
    max_retained_bytes: int | None = None

    def to_record(self) -> Record:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic: events first_available..tail are retained (none when tail < first_available)."""

    domain: str
    topic: str
    incarnation: int
    created_at_ms: int
    policy: TopicPolicy
    first_available: int
    tail: int
    generation: int
    retained_events: int
    retained_bytes: int
    published_total: int

    @classmethod
    def from_record(cls, record: Record) -> TopicView:
        return cls(**dict(record, policy=_build(TopicPolicy, record["policy"])))


@dataclass(frozen=True, slots=True)
class Event:
    """One event to publish. Its id is unique in the topic: publishing it again is refused."""

    event_id: str
    type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> Record:
        return {"event_id": self.event_id, "type": self.type, "headers": self.headers, "body": self.body}


@dataclass(frozen=True, slots=True)
class PublishedEvent:
    event_id: str
    position: int


@dataclass(frozen=True, slots=True)
class PublishResult:
    topic: str
    events: list[PublishedEvent]
    retained_events: int
    retained_bytes: int

    @classmethod
    def from_record(cls, record: Record) -> PublishResult:
        events = [_build(PublishedEvent, e) for e in record["events"]]
        return cls(record["topic"], events, record["retained_events"], record["retained_bytes"])


@dataclass(frozen=True, slots=True)
class TopicEvent:
    """One retained event as a read returns it."""

    position: int
    event_id: str
    type: str
    headers: dict[str, str]
    body: bytes
    published_at_ms: int


@dataclass(frozen=True, slots=True)
class TopicPage:
    """Events in position order; read on from `next_cursor` (or `next_position`: tail + 1 when
    nothing more is there yet)."""

    events: list[TopicEvent]
    next_position: int
    first_available: int
    tail: int
    budget_exhausted: bool
    next_cursor: str

    @classmethod
    def from_record(cls, record: Record) -> TopicPage:
        return cls(**dict(record, events=[_build(TopicEvent, e) for e in record["events"]]))


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """A subscription group's policy. Every field has a documented default (docs/ARCHITECTURE.md)."""

    max_window: int | None = None
    lease_ms: int | None = None
    max_lease_ms: int | None = None
    max_attempts: int | None = None
    retry_base_ms: int | None = None
    retry_max_ms: int | None = None
    retry_factor: int | None = None
    retry_jitter: Literal["none", "full"] | None = None

    def to_record(self) -> Record:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class GroupView:
    """A subscription group: every position up to `checkpoint` is acked, filtered or parked.

    `issued` is the highest position claimed or filtered; `outstanding` counts
    deliveries not yet resolved (leased or waiting for a retry); `gaps` counts
    positions above the checkpoint already resolved; `parked` lists the lowest
    parked positions (at most 100) of `parked_count`; `lag` = tail - checkpoint.
    """

    domain: str
    topic: str
    group: str
    incarnation: int
    created_at_ms: int
    event_types: list[str]
    headers: dict[str, str]
    policy: GroupPolicy
    generation: int
    paused: bool
    checkpoint: int
    issued: int
    outstanding: int
    parked: list[int]
    parked_count: int
    gaps: int
    tail: int
    lag: int
    delivered_total: int
    acked_total: int
    filtered_total: int
    parked_total: int

    @classmethod
    def from_record(cls, record: Record) -> GroupView:
        state = record["state"]
        return cls(
            domain=state["domain"],
            topic=state["topic"],
            group=state["group"],
            incarnation=state["incarnation"],
            created_at_ms=state["created_at_ms"],
            event_types=state["filter"]["event_types"],
            headers=state["filter"]["headers"],
            policy=_build(GroupPolicy, state["policy"]),
            generation=state["generation"],
            paused=state["paused"],
            checkpoint=state["checkpoint"],
            issued=state["issued"],
            outstanding=state["outstanding"],
            parked=record["parked"],
            parked_count=state["parked_count"],
            gaps=record["gaps"],
            tail=record["tail"],
            lag=record["lag"],
            delivered_total=state["delivered_total"],
            acked_total=state["acked_total"],
            filtered_total=state["filtered_total"],
            parked_total=state["parked_total"],
        )


@dataclass(frozen=True, slots=True)
class GroupDelivery:
    """One leased position of a group. Present `token` to renew, ack or nack it."""

    position: int
    event_id: str
    type: str
    headers: dict[str, str]
    body: bytes
    published_at_ms: int
    token: str
    attempts: int
    lease_until_ms: int


@dataclass(frozen=True, slots=True)
class GroupReceiveResult:
    """Deliveries in position order (due redeliveries first). `window_full`: new positions wait for
    acks; `budget_exhausted`: the receive stopped at a budget, so receive again."""

    deliveries: list[GroupDelivery]
    window_full: bool
    budget_exhausted: bool

    @classmethod
    def from_record(cls, record: Record) -> GroupReceiveResult:
        deliveries = [_build(GroupDelivery, d) for d in record["deliveries"]]
        return cls(deliveries, record["window_full"], record["budget_exhausted"])


@dataclass(frozen=True, slots=True)
class GroupLeaseResult:
    """A position after renew (leased), ack (acked) or nack (retrying or parked), and the group's checkpoint."""

    position: int
    state: PositionState
    checkpoint: int
    lease_until_ms: int | None
    not_before_ms: int | None
    retry_delay_ms: int | None

    @classmethod
    def from_record(cls, record: Record) -> GroupLeaseResult:
        built: GroupLeaseResult = _with_state(cls, record, PositionState)
        return built


@dataclass(frozen=True, slots=True)
class GroupTokenResult(_Settled):
    position: int | None


@dataclass(frozen=True, slots=True)
class GroupAckBatchResult:
    results: list[GroupTokenResult]
    checkpoint: int

    @classmethod
    def from_record(cls, record: Record) -> GroupAckBatchResult:
        return cls(_settled(GroupTokenResult, record), record["checkpoint"])


# -- documents, batches and inboxes ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutDocument:
    """A batch mutation or processing effect: write a document. `expected_revision`: None writes
    whatever is there, 0 only if the document is absent, n only at revision n."""

    KIND: ClassVar[str] = "keyload.command.PutDocument"
    key: str
    value: bytes
    expected_revision: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteDocument:
    """A batch mutation or processing effect: delete a document (at `expected_revision`, if given)."""

    KIND: ClassVar[str] = "keyload.command.DeleteDocument"
    key: str
    expected_revision: int | None = None


@dataclass(frozen=True, slots=True)
class EnqueueMessage:
    """A batch mutation or processing effect: enqueue a message. The id is required: an effect
    must be the same every time its handler runs, or a re-run is a Conflict."""

    KIND: ClassVar[str] = "keyload.command.Enqueue"
    queue: str
    message_id: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    ordering_key: str | None = None
    not_before_ms: int | None = None
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PublishEvents:
    """A batch mutation or processing effect: publish events to a topic."""

    KIND: ClassVar[str] = "keyload.command.Publish"
    topic: str
    events: list[Event]


@dataclass(frozen=True, slots=True)
class _MessageOperation:
    queue: str
    message_id: str
    expected_state_version: int
    expected_delivery_generation: int


@dataclass(frozen=True, slots=True)
class CancelMessage(_MessageOperation):
    KIND: ClassVar[str] = "keyload.command.Cancel"


@dataclass(frozen=True, slots=True)
class RedriveMessage(_MessageOperation):
    KIND: ClassVar[str] = "keyload.command.Redrive"


@dataclass(frozen=True, slots=True)
class ParkPendingMessage(_MessageOperation):
    KIND: ClassVar[str] = "keyload.command.ParkPending"


Mutation = (
    PutDocument | DeleteDocument | EnqueueMessage | PublishEvents | CancelMessage | RedriveMessage | ParkPendingMessage
)


def mutation_record(mutation: Mutation) -> Record:
    """A BatchMutation record (in the command's own domain)."""
    if isinstance(mutation, PublishEvents):
        body = {"topic": mutation.topic, "events": [e.to_record() for e in mutation.events]}
    else:
        body = {f.name: getattr(mutation, f.name) for f in fields(mutation)}
    return {"domain": None, "mutation": (mutation.KIND, body)}


@dataclass(frozen=True, slots=True)
class DocumentResult:
    """What a put wrote (`revision`) or a delete removed (`deleted`, the revision it had)."""

    key: str
    revision: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class Document:
    key: str
    value: bytes
    revision: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class DocumentPage:
    """Documents in key order; read on with `after=next_after` (None: no more)."""

    documents: list[Document]
    next_after: str | None
    budget_exhausted: bool

    @classmethod
    def from_record(cls, record: Record) -> DocumentPage:
        return cls([_build(Document, d) for d in record["documents"]], record["next_after"], record["budget_exhausted"])


MutationResult = DocumentResult | EnqueueResult | PublishResult | MessageView


@dataclass(frozen=True, slots=True)
class BatchResult:
    """One result per mutation, in order."""

    results: list[MutationResult]

    @classmethod
    def from_record(cls, record: Record) -> BatchResult:
        return cls([decode_result(kind, value) for kind, value in record["results"]])


@dataclass(frozen=True, slots=True)
class ProcessingResult:
    """The receipt of a processing: this command's, or, when `already_processed`, that of the
    command that first applied these effects (`command_id`, `offset`, its `results`)."""

    already_processed: bool
    command_id: str
    offset: int
    completed_at_ms: int
    results: BatchResult

    @classmethod
    def from_record(cls, record: Record) -> ProcessingResult:
        return cls(**dict(record, results=BatchResult.from_record(record["results"])))


@dataclass(frozen=True, slots=True)
class InboxSource:
    """The delivery a CommitInbox applies effects for: the source queue's message and delivery generation."""

    domain: str
    queue: str
    message_id: str
    delivery_generation: int


@dataclass(frozen=True, slots=True)
class InboxView:
    domain: str
    max_receipts: int
    max_bytes: int
    receipts: int
    bytes: int


@dataclass(frozen=True, slots=True)
class PayloadReservation:
    """A large message's reservation (the receipt of PrepareLargeSchedule and its successors).

    `state` is as of the command's log time: a reserved one past `upload_deadline_ms` is expired."""

    reservation_id: int
    domain: str
    queue: str
    queue_id: int
    message_id: str
    object_key: str
    length: int
    sha256: bytes
    headers: dict[str, str]
    ordering_key: str | None
    not_before_ms: int | None
    expires_at_ms: int | None
    upload_deadline_ms: int
    trust_set_version: int
    trust_key_id: str
    state: Literal["reserved", "committed", "cancelled", "expired"]
    reserved_at_ms: int
    closed_at_ms: int | None
    object_version: str | None


@dataclass(frozen=True, slots=True)
class RetentionTask:
    task_id: int
    kind: Literal["message_payload", "abandoned_reservation"]
    domain: str
    queue: str
    queue_id: int
    message_id: str
    reservation_id: int
    object_key: str
    object_version: str | None
    length: int
    retire_offset: int
    retired_at_ms: int
    protect_until_ms: int
    state: Literal["waiting", "deleting", "confirmed"]
    delete_offset: int | None
    confirmed_offset: int | None
    confirmed_at_ms: int | None
    deleted_versions: list[str]


@dataclass(frozen=True, slots=True)
class RetentionStatus:
    task: RetentionTask
    blocked_by: list[str]  # empty: deletable now

    @classmethod
    def from_record(cls, record: Record) -> RetentionStatus:
        return cls(_build(RetentionTask, record["task"]), record["blocked_by"])


@dataclass(frozen=True, slots=True)
class RetentionPage:
    recovery_floor: int | None
    tasks: list[RetentionStatus]
    next_after_task: int | None
    retired_identities: int

    @classmethod
    def from_record(cls, record: Record) -> RetentionPage:
        tasks = [RetentionStatus.from_record(t) for t in record["tasks"]]
        return cls(record["recovery_floor"], tasks, record["next_after_task"], record["retired_identities"])


Result = (
    QueueView
    | EnqueueResult
    | MessageView
    | TickResult
    | CheckpointResult
    | ReceiveResult
    | LeaseResult
    | AckBatchResult
    | DeadLetterPage
    | ActiveKeys
    | TopicView
    | PublishResult
    | TopicPage
    | GroupView
    | GroupReceiveResult
    | GroupLeaseResult
    | GroupAckBatchResult
    | DocumentResult
    | Document
    | DocumentPage
    | BatchResult
    | ProcessingResult
    | InboxView
    | PayloadReservation
    | RetentionStatus
    | RetentionPage
)

# Each result record of the command table (keyload/commands.py), and so every branch of the Outcome's
# result union, as the class the SDK returns it as; a BatchResult's mutation results are among them.
RESULT_TYPES: dict[str, type[Any]] = {
    "keyload.QueueView": QueueView,
    "keyload.MessageView": MessageView,
    "keyload.result.EnqueueResult": EnqueueResult,
    "keyload.result.TickResult": TickResult,
    "keyload.result.CheckpointResult": CheckpointResult,
    "keyload.result.ReceiveResult": ReceiveResult,
    "keyload.result.LeaseResult": LeaseResult,
    "keyload.result.AckBatchResult": AckBatchResult,
    "keyload.result.DeadLetterPage": DeadLetterPage,
    "keyload.result.ActiveKeys": ActiveKeys,
    "keyload.TopicView": TopicView,
    "keyload.result.PublishResult": PublishResult,
    "keyload.result.TopicPage": TopicPage,
    "keyload.GroupView": GroupView,
    "keyload.result.GroupReceiveResult": GroupReceiveResult,
    "keyload.result.GroupLeaseResult": GroupLeaseResult,
    "keyload.result.GroupAckBatchResult": GroupAckBatchResult,
    "keyload.result.DocumentResult": DocumentResult,
    "keyload.result.Document": Document,
    "keyload.result.DocumentPage": DocumentPage,
    "keyload.result.BatchResult": BatchResult,
    "keyload.result.ProcessingResult": ProcessingResult,
    "keyload.result.InboxView": InboxView,
    "keyload.PayloadReservation": PayloadReservation,
    "keyload.result.RetentionStatus": RetentionStatus,
    "keyload.result.RetentionPage": RetentionPage,
}

Decoder = Callable[[Record], Any]


def decoder(cls: type[Any]) -> Decoder:
    """How a result class is read from its record: its `from_record`, or field by field."""
    from_record: Decoder | None = getattr(cls, "from_record", None)
    return from_record if from_record is not None else lambda record: _build(cls, record)


def decoders(table: Iterable[CommandKind], types: Mapping[str, type[Any]]) -> dict[str, Decoder]:
    """The decoder of every result record `table` names, from `types`: exactly those (KeyError on
    a record without a class; ValueError on a class no row returns)."""
    named = {kind.result for kind in table}
    unused = set(types) - named
    if unused:
        raise ValueError(f"result classes no command returns: {sorted(unused)}")
    return {name: decoder(types[name]) for name in sorted(named)}


_RESULTS = decoders(COMMANDS, RESULT_TYPES)


def decode_result(name: str, record: Record, results: Mapping[str, Decoder] = _RESULTS) -> Any:
    """The typed result of an Outcome's result branch `name`."""
    return results[name](record)


@dataclass(frozen=True, slots=True)
class PoisonEntry:
    """A command-log record no command could be read from: recorded by its partition's processor,
    skipped, never retried and never answered (there was no command id to answer).

    `size` is the record's length in bytes, `sha256` its SHA-256 (hex), `reason` why it could not be
    read; `first_bytes` are its first bytes (up to 32) while the log still holds it, else None.
    """

    partition: int
    offset: int
    timestamp_ms: int
    size: int
    sha256: str
    reason: str
    first_bytes: bytes | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """The durable receipt of one command."""

    command_id: str
    domain: str
    partition: int
    offset: int
    eval_time_ms: int
    status: Literal["committed", "rejected"]
    error_code: ErrorCode | None
    detail: str
    result: Result | None
    failed_index: int | None = None  # a rejected batch or processing: the mutation that failed

    @classmethod
    def from_record(cls, record: Record) -> Outcome:
        result = record["result"]
        typed = None if result is None else decode_result(result[0], result[1])
        return cls(
            command_id=record["command_id"],
            domain=record["domain"],
            partition=record["partition"],
            offset=record["offset"],
            eval_time_ms=record["eval_time_ms"],
            status=record["status"],
            error_code=_error_code(record["error_code"]),
            detail=record["detail"],
            result=typed,
            failed_index=record["failed_index"],
        )
