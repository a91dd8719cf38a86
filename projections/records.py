"""Typed stored records: one msgspec Struct per Avro record of `schemas/`, declared once.

Each class mirrors its `.avsc` record field for field, in schema order
(tests/test_record_drift.py fails on any difference):

- Avro `long` / `int` are `Long` / `Int` (ints with the Avro range as a constraint),
  `boolean` is `bool`, `string` is `str`, `bytes` is `bytes`, the fixed
  `keyload.Sha256` is `Sha256` (32 bytes);
- an enum is a `StrEnum` named like it, whose values are its symbols in order;
- `["null", X]` is `X | None`; a map is `dict[str, V]`, an array `list[T]`;
- a nested record is the nested class named like it;
- a field with an Avro default has that default here too.

The classes are frozen: change one with `msgspec.structs.replace`. Frozen is
shallow: never mutate a map or array of a record in place, build a new one (a
stage may share the record with its parent).

A top-level record (one of `log/codec.py`'s TOP_LEVEL) also names its schema
(`SCHEMA`) and has `decode(bytes) -> Self` and `encode() -> bytes`, both through
`REGISTRY`, so the bytes are exactly those of the dict-based code. `to_avro` /
`from_avro` are the only places where a record meets the dict form fastavro
reads and writes: a specialised encoder (or decoder) replaces them, or `encode`
and `decode` as a whole, without touching a handler.

`load` / `save` read and write a typed record through a `Staged` projection
overlay, whose staged records are still decoded dicts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Protocol, Self, TypeVar

import msgspec

from keyload.commands import Capability
from keyload.log.codec import REGISTRY

Int = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
"""Avro `int`."""
Long = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""Avro `long`."""
Sha256 = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
"""The Avro fixed `keyload.Sha256`."""

_BUILTIN_TYPES = (bytes,)


class AvroRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A record of the schemas, nested or top-level."""

    AVRO_NAME: ClassVar[str]
    """The record's full Avro name."""

    @classmethod
    def from_avro(cls, record: dict[str, Any]) -> Self:
        """The typed record of a dict as fastavro decodes it (maps, enums as str, bytes)."""
        return msgspec.convert(record, cls)

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro encodes: nested records as dicts, enums as their symbols."""
        record: dict[str, Any] = msgspec.to_builtins(self, builtin_types=_BUILTIN_TYPES)
        return record


class StoredRecord(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A top-level record, written as a single-object encoded value."""

    SCHEMA: ClassVar[str]
    """Its name in REGISTRY (the same as AVRO_NAME)."""

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """A value written under any registered version of the schema; CodecError otherwise."""
        return cls.from_avro(REGISTRY.decode(cls.SCHEMA, data))

    def encode(self) -> bytes:
        """The single-object encoding, byte for byte what REGISTRY.encode writes for its dict."""
        return REGISTRY.encode(self.SCHEMA, self.to_avro())


# ---------------------------------------------------------------------------------------------
# Enums


class RetryJitter(StrEnum):
    none = "none"
    full = "full"


class Ordering(StrEnum):
    competing = "competing"
    strict_per_key = "strict_per_key"


class ParkedHead(StrEnum):
    continue_ = "continue"
    block = "block"


class TopicDiscard(StrEnum):
    new = "new"
    old = "old"


class MessageState(StrEnum):
    scheduled = "scheduled"
    ready = "ready"
    leased = "leased"
    acked = "acked"
    dead_lettered = "dead_lettered"
    pending_dead_letter = "pending_dead_letter"
    cancelled = "cancelled"
    expired = "expired"


class PositionState(StrEnum):
    leased = "leased"
    retrying = "retrying"
    due = "due"
    acked = "acked"
    parked = "parked"


class ReservationState(StrEnum):
    reserved = "reserved"
    committed = "committed"
    cancelled = "cancelled"
    expired = "expired"


class RetentionKind(StrEnum):
    message_payload = "message_payload"
    abandoned_reservation = "abandoned_reservation"


class RetentionState(StrEnum):
    waiting = "waiting"
    deleting = "deleting"
    confirmed = "confirmed"


# ---------------------------------------------------------------------------------------------
# Documents and inboxes


class DocumentRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A stored document; a deleted one stays as a tombstone so revisions never repeat."""

    AVRO_NAME = SCHEMA = "keyload.DocumentRecord"

    value: bytes
    revision: Long
    updated_at_ms: Long
    deleted: bool


class InboxRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A domain's target inbox: its policy and what its receipts use."""

    AVRO_NAME = SCHEMA = "keyload.InboxRecord"

    max_receipts: Long
    max_bytes: Long
    receipts: Long
    bytes: Long


class DomainRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A domain's policy, once ConfigureDomain or ConfigureDomainCaps set it: its idempotency
    horizons and, from feature level 5, its caps (null: the defaults, processors/usage.py)."""

    AVRO_NAME = SCHEMA = "keyload.DomainRecord"

    outcome_horizon_ms: Long
    receipt_horizon_ms: Long
    policy_version: Long
    max_queues: Long | None = None
    max_topics: Long | None = None
    max_groups: Long | None = None
    max_documents: Long | None = None
    max_document_bytes: Long | None = None


class InboxEntry(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A processed delivery: the command that applied its effects, and their digest."""

    AVRO_NAME = SCHEMA = "keyload.InboxEntry"

    command_id: str
    offset: Long
    completed_at_ms: Long
    effects_sha256: Sha256


# ---------------------------------------------------------------------------------------------
# Queues and messages


class QueuePolicy(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.QueuePolicy"

    max_stored_messages: Long
    max_stored_bytes: Long
    max_in_flight: Long
    max_attempts: Int
    lease_ms: Long
    max_lease_ms: Long
    retry_base_ms: Long
    retry_max_ms: Long
    retry_factor: Int
    retry_jitter: RetryJitter
    max_dead_letter_messages: Long | None = None
    max_dead_letter_bytes: Long | None = None
    ordering: Ordering
    parked_head: ParkedHead
    receive_max_messages: Int
    receive_max_bytes: Long
    payload_request_horizon_ms: Long = 60000


class QueueCounters(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.QueueCounters"

    stored_messages: Long
    stored_bytes: Long
    scheduled: Long
    ready: Long
    leased: Long
    dead_lettered: Long
    pending_dead_letter: Long
    dead_letter_bytes: Long
    enqueued_total: Long
    acked_total: Long
    expired_total: Long
    cancelled_total: Long
    reserved_messages: Long = 0
    reserved_bytes: Long = 0
    payload_object_bytes: Long = 0


class QueueView(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.QueueView"

    domain: str
    queue: str
    incarnation: Long
    created_at_ms: Long
    policy_version: Long
    policy: QueuePolicy
    counters: QueueCounters
    paused: bool = False  # PauseQueue: receives are refused with DispatchPaused
    closed: bool = False  # CloseQueue: no new messages


class QueueRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A stored queue: policy, authoritative counters and the queue's sequence allocators."""

    AVRO_NAME = SCHEMA = "keyload.QueueRecord"

    view: QueueView
    next_enqueue_sequence: Long
    next_ready_sequence: Long
    next_parked_sequence: Long
    next_timer_ms: Long | None = None
    waiting_receives: Long = 0
    next_waiter_sequence: Long = 1
    ready_floor: Long = 1
    timer_floor: bytes | None = None
    waiter_floor: Long = 1
    reclaim_from: bytes | None = None  # deleted: the next row to reclaim (processors/reclamation.py)


class LargePayload(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.LargePayload"

    reservation_id: Long
    object_key: str
    object_version: str
    length: Long
    sha256: Sha256
    read_handle: str | None = None


class MessageMeta(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A message's metadata; its body is stored under its own key."""

    AVRO_NAME = SCHEMA = "keyload.MessageMeta"

    state: MessageState
    state_version: Long
    attempts: Int
    lease_version: Long
    delivery_generation: Long
    enqueue_sequence: Long
    ready_sequence: Long | None = None
    parked_sequence: Long | None = None
    enqueued_at_ms: Long
    not_before_ms: Long | None = None
    expires_at_ms: Long | None = None
    lease_owner: str | None = None
    lease_until_ms: Long | None = None
    body_bytes: Long
    headers: dict[str, str]
    ordering_key: str | None = None
    terminal_at_ms: Long | None = None
    last_retry_delay_ms: Long | None = None
    dead_lettered_at_ms: Long | None = None
    payload: LargePayload | None = None
    read_until_ms: Long | None = None


class PoisonEntry(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.PoisonEntry"

    offset: Long
    timestamp_ms: Long
    length: Long
    sha256: Sha256
    reason: str


class Waiter(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.Waiter"

    command_id: str
    domain: str
    principal: str
    reply_to: Int | None = None
    offset: Long
    fingerprint: Sha256
    max_messages: Int
    max_bytes: Long
    lease_ms: Long
    deadline_ms: Long


# ---------------------------------------------------------------------------------------------
# Topics and groups


class TopicPolicy(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.TopicPolicy"

    max_retained_events: Long
    max_retained_bytes: Long
    max_age_ms: Long = 0  # 0: no age limit
    discard: TopicDiscard = TopicDiscard.new


class TopicView(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.TopicView"

    domain: str
    topic: str
    incarnation: Long
    created_at_ms: Long
    policy: TopicPolicy
    first_available: Long
    tail: Long
    generation: Long
    retained_events: Long
    retained_bytes: Long
    published_total: Long
    policy_version: Long = 1
    closed: bool = False  # CloseTopic: no new events


class TopicRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.TopicRecord"

    view: TopicView
    next_timer_ms: Long | None = None  # retention's next look at the front (the due index names it)
    reclaim_from: bytes | None = None  # deleted: the next row to reclaim (processors/reclamation.py)


class EventRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.EventRecord"

    event_id: str
    type: str
    headers: dict[str, str]
    body: bytes
    published_at_ms: Long
    charged_bytes: Long


class GroupFilter(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.GroupFilter"

    event_types: list[str] = []
    headers: dict[str, str] = {}


class GroupPolicy(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.GroupPolicy"

    max_window: Long
    lease_ms: Long
    max_lease_ms: Long
    max_attempts: Int
    retry_base_ms: Long
    retry_max_ms: Long
    retry_factor: Int
    retry_jitter: RetryJitter


class GroupState(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.GroupState"

    domain: str
    topic: str
    topic_incarnation: Long
    group: str
    incarnation: Long
    created_at_ms: Long
    filter: GroupFilter
    policy: GroupPolicy
    generation: Long
    paused: bool
    checkpoint: Long
    issued: Long
    outstanding: Long
    redeliverable: Long
    parked_count: Long
    pin_floor: Long
    delivered_total: Long
    acked_total: Long
    filtered_total: Long
    parked_total: Long


class GroupRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.GroupRecord"

    view: GroupState
    next_timer_ms: Long | None = None
    timer_floor: bytes | None = None
    waiting_receives: Long = 0
    next_waiter_sequence: Long = 1
    waiter_floor: Long = 1
    reclaim_from: bytes | None = None  # deleted: the next row to reclaim (processors/reclamation.py)


class PositionMeta(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.PositionMeta"

    state: PositionState
    attempts: Int
    lease_version: Long
    lease_owner: str | None = None
    lease_until_ms: Long | None = None
    not_before_ms: Long | None = None
    last_retry_delay_ms: Long | None = None
    parked_at_ms: Long | None = None


# ---------------------------------------------------------------------------------------------
# Large payloads


class PayloadReservation(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.PayloadReservation"

    reservation_id: Long
    domain: str
    queue: str
    queue_id: Long
    message_id: str
    object_key: str
    length: Long
    sha256: Sha256
    headers: dict[str, str]
    ordering_key: str | None = None
    not_before_ms: Long | None = None
    expires_at_ms: Long | None = None
    upload_deadline_ms: Long
    trust_set_version: Long
    trust_key_id: str
    state: ReservationState
    reserved_at_ms: Long
    closed_at_ms: Long | None = None
    object_version: str | None = None


class RetentionTask(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.RetentionTask"

    task_id: Long
    kind: RetentionKind
    domain: str
    queue: str
    queue_id: Long
    message_id: str
    reservation_id: Long
    object_key: str
    object_version: str | None = None
    length: Long
    retire_offset: Long
    retired_at_ms: Long
    protect_until_ms: Long
    state: RetentionState
    delete_offset: Long | None = None
    confirmed_offset: Long | None = None
    confirmed_at_ms: Long | None = None
    deleted_versions: list[str] = []


class Grant(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True, order=True):
    """A capability on the domains and resources its patterns match (processors/access.py)."""

    AVRO_NAME = "keyload.Grant"

    capability: Capability
    domain: str
    resource: str = "*"


class PrincipalRecord(StoredRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = SCHEMA = "keyload.PrincipalRecord"

    principal: str
    key_id: str
    enabled: bool
    revision: Long
    grants: list[Grant]


STORED_RECORDS: tuple[type[StoredRecord], ...] = (
    DocumentRecord,
    InboxRecord,
    DomainRecord,
    InboxEntry,
    QueueRecord,
    MessageMeta,
    PoisonEntry,
    Waiter,
    TopicRecord,
    EventRecord,
    GroupRecord,
    PositionMeta,
    PayloadReservation,
    RetentionTask,
    PrincipalRecord,
)
"""Every typed top-level record; the drift test checks each against its schema."""


# ---------------------------------------------------------------------------------------------
# Through a projection overlay


class RecordStage(Protocol):
    """What `load` / `save` need of `projections.store.Staged`."""

    def peek_record(self, key: bytes, name: str) -> dict[str, Any] | None: ...

    def put_record(self, key: bytes, name: str, record: dict[str, Any]) -> None: ...


R = TypeVar("R", bound=StoredRecord)


def load(stage: RecordStage, key: bytes, kind: type[R]) -> R | None:
    """The record of type `kind` at `key`, or None when there is none."""
    record = stage.peek_record(key, kind.SCHEMA)
    return None if record is None else kind.from_avro(record)


def save(stage: RecordStage, key: bytes, record: StoredRecord) -> None:
    """Stage `record` at `key`; it is encoded once, when the stage's group commits."""
    stage.put_record(key, record.SCHEMA, record.to_avro())
