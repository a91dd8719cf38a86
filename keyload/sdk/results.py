"""Typed views of outcomes and results, as the SDK returns them.

Every record an Outcome's result can hold is a msgspec Struct mirroring its schema record field for
field, declared once: the result records (`keyload.result.*`) here, and where a result holds a stored
record (a queue's view, policy and counters, a message's metadata, a topic's view, a group's policy,
a payload reservation, a retention task) the stored record's own class from projections/records.py.
tests/test_record_drift.py checks both against the schemas, so a field added to a result schema is
a failing test until its class has it. A result is read from the decoded outcome in one
`msgspec.convert` (`AvroRecord.from_avro`); the three classes that hold a union of records
(`BatchResult`, `ProcessingResult`, `Outcome`) read theirs by branch name, and `GroupView` flattens
its record for people (below).

The policies a client asks for (`QueuePolicySpec`, `GroupPolicySpec`, `TopicPolicySpec`: every
field None takes its documented default) are command-body records (keyload/bodies.py), re-exported
here; the policies a view reports (`QueuePolicy`, ...) are the resolved ones, every default filled
in. Command inputs that are not schema records as given (`Event`, the batch mutations,
`InboxSource`) are dataclasses that build their record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, Protocol, Self, TypeVar

from keyload.bodies import GroupPolicySpec as GroupPolicySpec
from keyload.bodies import QueuePolicySpec as QueuePolicySpec
from keyload.bodies import TopicPolicySpec as TopicPolicySpec
from keyload.commands import COMMANDS, CommandKind
from keyload.commands import Capability as Capability
from keyload.errors import ErrorCode, InvalidCommand
from keyload.log.codec import Record
from keyload.projections.records import AvroRecord, GroupState, Int, Long

# The stored records a result holds, re-exported as results (declared once, in projections/records.py).
from keyload.projections.records import (
    Grant as Grant,
)
from keyload.projections.records import (
    GroupPolicy as GroupPolicy,
)
from keyload.projections.records import (
    LargePayload as LargePayload,
)
from keyload.projections.records import (
    MessageMeta as MessageMeta,
)
from keyload.projections.records import (
    MessageState as MessageState,
)
from keyload.projections.records import (
    PayloadReservation as PayloadReservation,
)
from keyload.projections.records import (
    PositionState as PositionState,
)
from keyload.projections.records import (
    PrincipalRecord as PrincipalRecord,
)
from keyload.projections.records import (
    QueueCounters as QueueCounters,
)
from keyload.projections.records import (
    QueuePolicy as QueuePolicy,
)
from keyload.projections.records import (
    QueueView as QueueView,
)
from keyload.projections.records import (
    RetentionTask as RetentionTask,
)
from keyload.projections.records import (
    TopicPolicy as TopicPolicy,
)
from keyload.projections.records import (
    TopicView as TopicView,
)


class OutcomeStatus(StrEnum):
    committed = "committed"
    rejected = "rejected"


# -- queues --------------------------------------------------------------------------------------


class EnqueueResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.EnqueueResult"

    queue: str
    message_id: str
    state: MessageState
    enqueue_sequence: Long
    stored_messages: Long
    stored_bytes: Long


class MessageView(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A message as inspected; `body` only when asked for. Redrive, cancel and park it by this view:
    they are fenced by what it shows (`meta.state_version`, `meta.delivery_generation`)."""

    AVRO_NAME = "keyload.MessageView"

    queue: str
    message_id: str
    meta: MessageMeta
    body: bytes | None = None


class TickResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.TickResult"

    transitions: Int
    budget_exhausted: bool
    next_due_ms: Long | None = None


class CheckpointResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.CheckpointResult"

    offset: Long


class FeatureLevelResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.FeatureLevelResult"

    feature_level: Long


class Delivery(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One leased message. Present `token` to renew, ack or nack it."""

    AVRO_NAME = "keyload.result.Delivery"

    message_id: str
    token: str
    body: bytes
    headers: dict[str, str]
    ordering_key: str | None = None
    attempts: Int
    delivery_generation: Long
    lease_until_ms: Long
    enqueued_at_ms: Long
    payload: LargePayload | None = None  # a large message: `body` is empty, fetch the bytes with the SDK
    # A repeated Receive (feature level 3): why this lease is no longer held (StaleLease, LeaseExpired,
    # TokenInvalidated); `body` is then empty. None: the lease is held.
    error_code: ErrorCode | None = None


class ReceiveResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.ReceiveResult"

    deliveries: list[Delivery]
    budget_exhausted: bool


class LeaseResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A delivery's state after renew (leased), ack (acked) or nack (scheduled, dead-lettered, expired)."""

    AVRO_NAME = "keyload.result.LeaseResult"

    message_id: str
    state: MessageState
    lease_until_ms: Long | None = None
    not_before_ms: Long | None = None
    retry_delay_ms: Long | None = None


class _Settled(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One token's result in an ack batch, queue or group alike."""

    status: OutcomeStatus
    error_code: ErrorCode | None = None


class TokenResult(_Settled, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.TokenResult"

    message_id: str | None = None


class AckBatchResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.AckBatchResult"

    results: list[TokenResult]


class DeadLetterPage(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.DeadLetterPage"

    messages: list[MessageView]
    next_after_sequence: Long | None = None


class ActiveKeys(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.ActiveKeys"

    token_key_id: str
    jitter_key_id: str
    proof_key_id: str = "k0"
    trust_set_version: Long = 1


# -- topics and subscription groups -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One event to publish. Its id is unique in the topic: publishing it again is refused."""

    event_id: str
    type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> Record:
        return {"event_id": self.event_id, "type": self.type, "headers": self.headers, "body": self.body}


class PublishedEvent(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.PublishedEvent"

    event_id: str
    position: Long


class PublishResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.PublishResult"

    topic: str
    events: list[PublishedEvent]
    retained_events: Long
    retained_bytes: Long


class TopicEvent(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One retained event as a read returns it."""

    AVRO_NAME = "keyload.result.TopicEvent"

    position: Long
    event_id: str
    type: str
    headers: dict[str, str]
    body: bytes
    published_at_ms: Long


class TopicPage(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Events in position order; read on from `next_cursor` (or `next_position`: tail + 1 when
    nothing more is there yet)."""

    AVRO_NAME = "keyload.result.TopicPage"

    events: list[TopicEvent]
    next_position: Long
    first_available: Long
    tail: Long
    budget_exhausted: bool
    next_cursor: str = ""


@dataclass(frozen=True, slots=True)
class GroupView:
    """A subscription group: every position up to `checkpoint` is acked, filtered or parked.

    The record (`keyload.GroupView`: the group's state, its lowest parked positions, gaps, tail,
    lag) flattened for people, the state's bookkeeping (topic incarnation, pins, redeliverable
    count) left out. `issued` is the highest position claimed or filtered; `outstanding` counts
    deliveries not yet resolved (leased or waiting for a retry); `gaps` counts positions above the
    checkpoint already resolved; `parked` lists the lowest parked positions (at most 100) of
    `parked_count`; `lag` = tail - checkpoint.
    """

    AVRO_NAME: ClassVar[str] = "keyload.GroupView"

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
    def from_avro(cls, record: Record) -> Self:
        state = GroupState.from_avro(record["state"])
        shown = {
            **{name: getattr(state, name) for name in state.__struct_fields__},
            "event_types": state.filter.event_types,
            "headers": state.filter.headers,
            **record,
        }
        return cls(**{f.name: shown[f.name] for f in fields(cls)})


class GroupDelivery(TopicEvent, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One leased position of a group: the event, and the `token` to renew, ack or nack it."""

    AVRO_NAME = "keyload.result.GroupDelivery"

    token: str
    attempts: Int
    lease_until_ms: Long
    error_code: ErrorCode | None = None  # as Delivery's: a repeated GroupReceive's lease no longer held


class GroupReceiveResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Deliveries in position order (due redeliveries first). `window_full`: new positions wait for
    acks; `budget_exhausted`: the receive stopped at a budget, so receive again."""

    AVRO_NAME = "keyload.result.GroupReceiveResult"

    deliveries: list[GroupDelivery]
    window_full: bool
    budget_exhausted: bool


class GroupLeaseResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A position after renew (leased), ack (acked) or nack (retrying or parked), and the group's checkpoint."""

    AVRO_NAME = "keyload.result.GroupLeaseResult"

    position: Long
    state: PositionState
    checkpoint: Long
    lease_until_ms: Long | None = None
    not_before_ms: Long | None = None
    retry_delay_ms: Long | None = None


class GroupTokenResult(_Settled, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.GroupTokenResult"

    position: Long | None = None
    checkpoint: Long | None = None  # an acked token's: the group's checkpoint right after it (feature level 10)


class GroupAckBatchResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.GroupAckBatchResult"

    results: list[GroupTokenResult]
    checkpoint: Long


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
    if not isinstance(mutation, Mutation):
        raise InvalidCommand(
            "each mutation is one of keyload.sdk.results' PutDocument, DeleteDocument, EnqueueMessage, PublishEvents, "
            f"CancelMessage, RedriveMessage, ParkPendingMessage, not {type(mutation).__name__}; nothing was sent"
        )
    if isinstance(mutation, PublishEvents):
        body = {"topic": mutation.topic, "events": [e.to_record() for e in mutation.events]}
    else:
        body = {f.name: getattr(mutation, f.name) for f in fields(mutation)}
    return {"domain": None, "mutation": (mutation.KIND, body)}


class DocumentResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a put wrote (`revision`) or a delete removed (`deleted`, the revision it had)."""

    AVRO_NAME = "keyload.result.DocumentResult"

    key: str
    revision: Long
    deleted: bool


class Document(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.Document"

    key: str
    value: bytes
    revision: Long
    updated_at_ms: Long


class DocumentPage(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Documents in key order; read on with `after=next_after` (None: no more)."""

    AVRO_NAME = "keyload.result.DocumentPage"

    documents: list[Document]
    next_after: str | None = None
    budget_exhausted: bool


class QueueList(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A page of the domain's queues in name order; read on with `after=next_after` (None: no more)."""

    AVRO_NAME = "keyload.result.QueueList"

    queues: list[QueueView]
    next_after: str | None = None


class TopicList(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A page of the domain's topics in name order; read on with `after=next_after` (None: no more)."""

    AVRO_NAME = "keyload.result.TopicList"

    topics: list[TopicView]
    next_after: str | None = None


MutationResult = DocumentResult | EnqueueResult | PublishResult | MessageView


@dataclass(frozen=True, slots=True)
class BatchResult:
    """One result per mutation, in order (a union of result records, read by branch name)."""

    AVRO_NAME: ClassVar[str] = "keyload.result.BatchResult"

    results: list[MutationResult]

    @classmethod
    def from_avro(cls, record: Record) -> Self:
        return cls([decode_result(kind, value) for kind, value in record["results"]])


@dataclass(frozen=True, slots=True)
class ProcessingResult:
    """The receipt of a processing: this command's, or, when `already_processed`, that of the
    command that first applied these effects (`command_id`, `offset`, its `results`)."""

    AVRO_NAME: ClassVar[str] = "keyload.result.ProcessingResult"

    already_processed: bool
    command_id: str
    offset: int
    completed_at_ms: int
    results: BatchResult

    @classmethod
    def from_avro(cls, record: Record) -> Self:
        return cls(**dict(record, results=BatchResult.from_avro(record["results"])))


@dataclass(frozen=True, slots=True)
class InboxSource:
    """The delivery a CommitInbox applies effects for: the source queue's message and delivery generation."""

    domain: str
    queue: str
    message_id: str
    delivery_generation: int


class InboxView(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.InboxView"

    domain: str
    max_receipts: Long
    max_bytes: Long
    receipts: Long
    bytes: Long


class DomainUsage(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a domain holds of each kind its caps bound. Until `counted`, the partition is still
    counting what it held when it reached feature level 5, and the caps do not apply yet."""

    AVRO_NAME = "keyload.result.DomainUsage"

    queues: Long
    topics: Long
    groups: Long
    documents: Long  # live documents: tombstones do not count
    document_bytes: Long  # their values together
    counted: bool


class DomainView(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A domain's policy: how long its commands' outcomes, then their receipts, are kept (log time);
    from feature level 5 its caps and what it holds of each (None below it)."""

    AVRO_NAME = "keyload.result.DomainView"

    domain: str
    outcome_horizon_ms: Long
    receipt_horizon_ms: Long
    policy_version: Long
    max_queues: Long | None = None
    max_topics: Long | None = None
    max_groups: Long | None = None
    max_documents: Long | None = None
    max_document_bytes: Long | None = None
    usage: DomainUsage | None = None


# -- retention ----------------------------------------------------------------------------------


class RetentionStatus(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.RetentionStatus"

    task: RetentionTask
    blocked_by: list[str]  # empty: deletable now


class RetentionPage(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.RetentionPage"

    recovery_floor: Long | None = None
    tasks: list[RetentionStatus]
    next_after_task: Long | None = None
    retired_identities: Long


class PrincipalView(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.result.PrincipalView"

    principal: PrincipalRecord
    policy_epoch: Long


# -- reading results ----------------------------------------------------------------------------


class ResultClass(Protocol):
    """What the SDK needs of a result class: the record it reads and how."""

    AVRO_NAME: ClassVar[str]

    @classmethod
    def from_avro(cls, record: Record) -> Any: ...


RESULT_CLASSES: tuple[type[ResultClass], ...] = (
    QueueView,
    MessageView,
    EnqueueResult,
    TickResult,
    CheckpointResult,
    ReceiveResult,
    LeaseResult,
    AckBatchResult,
    DeadLetterPage,
    ActiveKeys,
    TopicView,
    PublishResult,
    TopicPage,
    GroupView,
    GroupReceiveResult,
    GroupLeaseResult,
    GroupAckBatchResult,
    DocumentResult,
    Document,
    DocumentPage,
    BatchResult,
    ProcessingResult,
    InboxView,
    DomainView,
    PayloadReservation,
    RetentionStatus,
    RetentionPage,
    PrincipalView,
    FeatureLevelResult,
    QueueList,
    TopicList,
)
"""The class of each result record of the command table (keyload/commands.py), and so of every
branch of the Outcome's result union; a BatchResult's mutation results are among them."""

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
    | DomainView
    | PayloadReservation
    | RetentionStatus
    | RetentionPage
    | PrincipalView
    | FeatureLevelResult
    | QueueList
    | TopicList
)

RESULT_TYPES: dict[str, type[Any]] = {cls.AVRO_NAME: cls for cls in RESULT_CLASSES}
"""Each result record's class, by the record's full name."""

Decoder = Callable[[Record], Any]


def decoders(table: Iterable[CommandKind], types: Mapping[str, type[Any]]) -> dict[str, Decoder]:
    """The decoder (`from_avro`) of every result record `table` names, from `types`: exactly those
    (KeyError on a record without a class; ValueError on a class no row returns)."""
    named = {kind.result for kind in table}
    unused = set(types) - named
    if unused:
        raise ValueError(f"result classes no command returns: {sorted(unused)}")
    return {name: types[name].from_avro for name in sorted(named)}


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
class FamilyCount:
    """The rows of one key family of a projection (projections/keys.py) and their bytes, keys and
    values as stored."""

    family: str
    tag: str
    rows: int
    key_bytes: int
    value_bytes: int


@dataclass(frozen=True, slots=True)
class HorizonCount:
    """The rows of one key family kept to a horizon (processors/horizons.py), by their horizon index
    entries: `kept` still within their horizon at the partition's last applied record's time, `due`
    past it, left for the horizon sweep to remove (it removes a bounded number per record)."""

    family: str
    kept: int
    due: int


@dataclass(frozen=True, slots=True)
class DomainAtCap:
    """A domain that holds as much of one kind as its cap allows (processors/usage.py): the next
    create of that kind (a document write, for `document_bytes`: one that would pass it) is
    ResourceExhausted until deletes make room or an administrator raises the cap (ConfigureDomainCaps).
    `kind` is the cap's usage name: queues, topics, groups, documents or document_bytes."""

    domain: str
    kind: str
    held: int
    cap: int


@dataclass(frozen=True, slots=True)
class Census:
    """A partition's census (`keyload census`, `Client.census`): what its projection holds by key
    family, and the bounded work it has left, so an operator sees whether state grows with what is
    live rather than with everything ever processed (keyload/operations/census.py counts it).

    `horizons` are the families kept to a horizon that have rows now, in family-name order; an
    outcome stored before the partition reached feature level 2 has no horizon and is kept forever:
    `outcomes_without_horizon` counts those (a long-poll receive still waiting holds a row that is
    not an outcome yet, and is not counted).
    """

    partition: int
    applied_offset: int | None  # None: nothing applied yet
    families: tuple[FamilyCount, ...]  # the families holding rows, in tag order
    rows: int
    bytes: int  # keys and values
    reclaiming: dict[str, int]  # deleted queues, groups and topics whose rows are still being reclaimed
    retention_tasks: int  # guarded object deletions not yet compacted (processors/payloads/retention.py)
    # queues, groups, topics, reclamations and the horizon sweep due at the last applied record's time or before
    timers_due: int
    # horizon index rows due by then (the sum of `horizons`' due): what the sweep has still to remove
    horizon_due: int
    horizons: tuple[HorizonCount, ...]
    outcomes_without_horizon: int
    # the partition is still counting what its domains held when it reached feature level 5 (their caps wait)
    usage_counting: bool
    # the tasks of before the raise to feature level 7 are still being indexed (their compaction waits)
    retention_indexing: bool
    # (domain, kind) pairs at or past their cap, in domain order (at most MAX_CENSUS_AT_CAP listed),
    # and how many there are; none while `usage_counting` (the caps wait for the count)
    at_cap: tuple[DomainAtCap, ...] = ()
    at_cap_total: int = 0

    @classmethod
    def from_json(cls, census: Mapping[str, Any]) -> Census:
        """A census as the HTTP API answers it (`GET /v1/census`: the dataclass's fields as JSON). A
        field this SDK does not know (a newer server's) is left out, as an outcome's are; the domains
        at a cap, which a server before them does not answer, read as none."""
        return _known(
            cls,
            census,
            families=tuple(_known(FamilyCount, family) for family in census["families"]),
            horizons=tuple(_known(HorizonCount, horizon) for horizon in census["horizons"]),
            at_cap=tuple(_known(DomainAtCap, entry) for entry in census.get("at_cap", ())),
        )


_D = TypeVar("_D")


def _known(kind: type[_D], given: Mapping[str, Any], **converted: Any) -> _D:
    """A dataclass `kind` of the JSON members it has a field for (`converted` in place of the member)."""
    names = {field.name for field in fields(kind)}  # type: ignore[arg-type]
    return kind(**{name: converted.get(name, value) for name, value in given.items() if name in names})


@dataclass(frozen=True, slots=True)
class Outcome:
    """The durable receipt of one command (its result read by branch name)."""

    command_id: str
    domain: str
    partition: int
    offset: int
    eval_time_ms: int
    status: OutcomeStatus
    # Rejected: its code; one this SDK does not know (a newer server's) is kept as its string.
    error_code: ErrorCode | str | None
    detail: str
    result: Result | None
    failed_index: int | None = None  # a rejected batch or processing: the mutation that failed

    @classmethod
    def from_record(cls, record: Record) -> Outcome:
        result = record["result"]
        error_code = record["error_code"]
        return cls(
            **dict(
                record,
                status=OutcomeStatus(record["status"]),
                error_code=None if error_code is None else _error_code(error_code),
                result=None if result is None else decode_result(result[0], result[1]),
            )
        )


_ERROR_CODES = frozenset(ErrorCode)


def _error_code(code: str) -> ErrorCode | str:
    """The ErrorCode of `code`, or `code` itself when this SDK does not know it (a newer server's)."""
    return ErrorCode(code) if code in _ERROR_CODES else code
