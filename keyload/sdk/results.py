"""Typed views of outcomes and results, as the SDK returns them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Self

Record = dict[str, Any]


def _build(cls: Any, record: Record) -> Any:
    return cls(**{f.name: record[f.name] for f in fields(cls)})


def _with_payload(cls: Any, record: Record) -> Any:
    """A MessageMeta or a Delivery, its optional large payload typed too."""
    payload = record["payload"]
    return _build(cls, dict(record, payload=None if payload is None else _build(LargePayload, payload)))


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
    state: str
    enqueue_sequence: int
    stored_messages: int
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class MessageMeta:
    state: str
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
        built: MessageMeta = _with_payload(cls, record)
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
    state: str
    lease_until_ms: int | None
    not_before_ms: int | None
    retry_delay_ms: int | None


@dataclass(frozen=True, slots=True)
class TokenResult:
    status: Literal["committed", "rejected"]
    error_code: str | None
    message_id: str | None


@dataclass(frozen=True, slots=True)
class AckBatchResult:
    results: list[TokenResult]

    @classmethod
    def from_record(cls, record: Record) -> AckBatchResult:
        return cls([_build(TokenResult, r) for r in record["results"]])


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
    state: Literal["leased", "retrying", "acked", "parked"]
    checkpoint: int
    lease_until_ms: int | None
    not_before_ms: int | None
    retry_delay_ms: int | None


@dataclass(frozen=True, slots=True)
class GroupTokenResult:
    status: Literal["committed", "rejected"]
    error_code: str | None
    position: int | None


@dataclass(frozen=True, slots=True)
class GroupAckBatchResult:
    results: list[GroupTokenResult]
    checkpoint: int

    @classmethod
    def from_record(cls, record: Record) -> GroupAckBatchResult:
        return cls([_build(GroupTokenResult, r) for r in record["results"]], record["checkpoint"])


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
        return cls([_RESULTS[kind](value) for kind, value in record["results"]])


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

_RESULTS: dict[str, Any] = {
    "keyload.QueueView": QueueView.from_record,
    "keyload.MessageView": MessageView.from_record,
    "keyload.result.EnqueueResult": lambda r: _build(EnqueueResult, r),
    "keyload.result.TickResult": lambda r: _build(TickResult, r),
    "keyload.result.CheckpointResult": lambda r: _build(CheckpointResult, r),
    "keyload.result.ReceiveResult": ReceiveResult.from_record,
    "keyload.result.LeaseResult": lambda r: _build(LeaseResult, r),
    "keyload.result.AckBatchResult": AckBatchResult.from_record,
    "keyload.result.DeadLetterPage": DeadLetterPage.from_record,
    "keyload.result.ActiveKeys": lambda r: _build(ActiveKeys, r),
    "keyload.TopicView": TopicView.from_record,
    "keyload.result.PublishResult": PublishResult.from_record,
    "keyload.result.TopicPage": TopicPage.from_record,
    "keyload.GroupView": GroupView.from_record,
    "keyload.result.GroupReceiveResult": GroupReceiveResult.from_record,
    "keyload.result.GroupLeaseResult": lambda r: _build(GroupLeaseResult, r),
    "keyload.result.GroupAckBatchResult": GroupAckBatchResult.from_record,
    "keyload.result.DocumentResult": lambda r: _build(DocumentResult, r),
    "keyload.result.Document": lambda r: _build(Document, r),
    "keyload.result.DocumentPage": DocumentPage.from_record,
    "keyload.result.BatchResult": BatchResult.from_record,
    "keyload.result.ProcessingResult": ProcessingResult.from_record,
    "keyload.result.InboxView": lambda r: _build(InboxView, r),
    "keyload.PayloadReservation": lambda r: _build(PayloadReservation, r),
    "keyload.result.RetentionStatus": RetentionStatus.from_record,
    "keyload.result.RetentionPage": RetentionPage.from_record,
}


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
    error_code: str | None
    detail: str
    result: Result | None
    failed_index: int | None = None  # a rejected batch or processing: the mutation that failed

    @classmethod
    def from_record(cls, record: Record) -> Outcome:
        result = record["result"]
        typed = None if result is None else _RESULTS[result[0]](result[1])
        return cls(
            command_id=record["command_id"],
            domain=record["domain"],
            partition=record["partition"],
            offset=record["offset"],
            eval_time_ms=record["eval_time_ms"],
            status=record["status"],
            error_code=record["error_code"],
            detail=record["detail"],
            result=typed,
            failed_index=record["failed_index"],
        )
