"""Typed command bodies: one msgspec Struct per record of the Command's body union, declared once.

Each class mirrors its record of `schemas/keyload.Command.avsc` field for field, in schema order, by
the rules of projections/records.py (tests/test_record_drift.py fails on any difference); a record
the body shares with stored state (`GroupFilter`) is the stored record's class. The one union of
several records, a batch mutation's, is a `Branch`: the (record name, body) pair as fastavro decodes
it, read by branch name (processors/batch.py) because msgspec has no untagged union of records.

Avro `int` and `long` fields are plain `int` here, with no range: decoding checks none, so a writer
that does not check can put a value past 32 bits into an Avro `int`, and the handler refuses it by
the field's named range (keyload/limits.py INTEGER_FIELD_RANGES) exactly as it did before bodies
were typed. Every other value a decoded body holds already has its class's type, so reading a
body into its class cannot fail.

The processor's dispatch reads a decoded body into its class once (`BODY_TYPES`, by branch name),
so handlers read attributes. The fingerprint and a processing's effects digest are computed over
the decoded command itself, not over these classes, so typing the bodies changes no stored byte.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from keyload.projections.records import AvroRecord, Grant, GroupFilter, Sha256

Branch = tuple[str, dict[str, Any]]
"""A value of a union of records: (the record's full name, its decoded body)."""


class GroupCommand(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command addressed to one subscription group: its topic and its name come first."""

    topic: str
    group: str


class FencedMessageCommand(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An operator's move of one message (Redrive, Cancel, ParkPending), fenced by the state
    version and delivery generation the operator last saw."""

    queue: str
    message_id: str
    expected_state_version: int
    expected_delivery_generation: int


class QueuePolicySpec(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A policy as a client asks for it: every null field takes its documented default."""

    AVRO_NAME = "keyload.QueuePolicySpec"

    max_stored_messages: int | None = None
    max_stored_bytes: int | None = None
    max_in_flight: int | None = None
    max_attempts: int | None = None
    lease_ms: int | None = None
    max_lease_ms: int | None = None
    retry_base_ms: int | None = None
    retry_max_ms: int | None = None
    retry_factor: int | None = None
    retry_jitter: str | None = None
    max_dead_letter_messages: int | None = None
    max_dead_letter_bytes: int | None = None
    ordering: str | None = None
    parked_head: str | None = None
    receive_max_messages: int | None = None
    receive_max_bytes: int | None = None
    payload_request_horizon_ms: int | None = None


class CreateQueue(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.CreateQueue"

    queue: str
    policy: QueuePolicySpec


class ConfigureQueue(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replaces the whole policy; null fields take their defaults."""

    AVRO_NAME = "keyload.command.ConfigureQueue"

    queue: str
    policy: QueuePolicySpec
    expected_policy_version: int | None = None


class Enqueue(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Enqueue"

    queue: str
    message_id: str
    body: bytes
    headers: dict[str, str] = {}
    ordering_key: str | None = None
    not_before_ms: int | None = None
    expires_at_ms: int | None = None


class QueueCommand(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command that names one queue and nothing else."""

    queue: str


class InspectQueue(QueueCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.InspectQueue"


class PauseQueue(QueueCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.PauseQueue"


class ResumeQueue(QueueCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.ResumeQueue"


class CloseQueue(QueueCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.CloseQueue"


class DeleteQueue(QueueCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.DeleteQueue"

    force: bool = False
    expected_incarnation: int | None = None


class PurgeQueue(QueueCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Drop every message: the queue becomes a new incarnation, configured as it was."""

    AVRO_NAME = "keyload.command.PurgeQueue"

    expected_incarnation: int | None = None


class InspectMessage(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.InspectMessage"

    queue: str
    message_id: str
    include_body: bool = False


class Tick(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Advances log time so due timers fire without traffic."""

    AVRO_NAME = "keyload.command.Tick"


class Checkpoint(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Asks the partition's runtime to take a checkpoint at this command's offset."""

    AVRO_NAME = "keyload.command.Checkpoint"


class Receive(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Lease up to max_messages ready messages in FIFO order; null fields take the queue's policy."""

    AVRO_NAME = "keyload.command.Receive"

    queue: str
    max_messages: int | None = None
    max_bytes: int | None = None
    lease_ms: int | None = None
    wait_ms: int | None = None


class Renew(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Renew"

    token: str
    lease_ms: int | None = None


class Ack(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Ack"

    token: str


class AckBatch(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Acks each token independently; the result reports every token's outcome."""

    AVRO_NAME = "keyload.command.AckBatch"

    tokens: list[str]


class Nack(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Nack"

    token: str
    delay_ms: int | None = None


class Redrive(FencedMessageCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Redrive"


class Cancel(FencedMessageCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Cancel"


class ParkPending(FencedMessageCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.ParkPending"


class ListDeadLetters(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.ListDeadLetters"

    queue: str
    after_sequence: int | None = None
    limit: int = 100
    include_body: bool = False


class RotateKeys(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Makes keyring key ids active for signing tokens and for retry jitter in this partition; null keeps the current
    one."""

    AVRO_NAME = "keyload.command.RotateKeys"

    token_key_id: str | None = None
    jitter_key_id: str | None = None
    proof_key_id: str | None = None


class TopicPolicySpec(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A topic policy as a client asks for it: every null field takes its documented default."""

    AVRO_NAME = "keyload.TopicPolicySpec"

    max_retained_events: int | None = None
    max_retained_bytes: int | None = None
    max_age_ms: int | None = None
    discard: str | None = None


class CreateTopic(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.CreateTopic"

    topic: str
    policy: TopicPolicySpec


class ConfigureTopic(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Replaces the whole policy; null fields take their defaults."""

    AVRO_NAME = "keyload.command.ConfigureTopic"

    topic: str
    policy: TopicPolicySpec
    expected_policy_version: int | None = None


class DeleteTopic(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.DeleteTopic"

    topic: str
    force: bool = False
    expected_incarnation: int | None = None


class RaiseFeatureLevel(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.RaiseFeatureLevel"

    level: int


class ConfigureDomain(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The domain's horizons (null fields take their defaults), fenced by its policy version."""

    AVRO_NAME = "keyload.command.ConfigureDomain"

    outcome_horizon_ms: int | None = None
    receipt_horizon_ms: int | None = None
    expected_policy_version: int | None = None


class InspectDomain(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.InspectDomain"


class ConfigureDomainCaps(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The domain's caps (null fields take their defaults), fenced by its policy version: an
    operator's (admin on every domain), since a tenant that could raise them would not be bounded
    by them."""

    AVRO_NAME = "keyload.command.ConfigureDomainCaps"

    max_queues: int | None = None
    max_topics: int | None = None
    max_groups: int | None = None
    max_documents: int | None = None
    max_document_bytes: int | None = None
    expected_policy_version: int | None = None


class NameListing(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A page of a domain's queues or topics: those whose name starts with prefix, in name order
    after `after`; its limit (a null one takes its default) follows in each kind's record."""

    prefix: str = ""
    after: str | None = None


class ListQueues(NameListing, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.ListQueues"

    max_queues: int | None = None


class ListTopics(NameListing, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.ListTopics"

    max_topics: int | None = None


class DeleteGroup(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.DeleteGroup"

    topic: str
    group: str
    force: bool = False
    expected_incarnation: int | None = None


class Event(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.Event"

    event_id: str
    type: str
    headers: dict[str, str] = {}
    body: bytes


class Publish(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Appends 1..100 events at the topic's next positions, all or none."""

    AVRO_NAME = "keyload.command.Publish"

    topic: str
    events: list[Event]


class ReadTopic(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A page of retained events in position order, from from_position or from where a cursor points (exactly one of
    them); null limits take their defaults."""

    AVRO_NAME = "keyload.command.ReadTopic"

    topic: str
    from_position: int | None = None
    max_events: int | None = None
    max_bytes: int | None = None
    cursor: str | None = None


class TopicCommand(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command that names one topic and nothing else."""

    topic: str


class InspectTopic(TopicCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.InspectTopic"


class CloseTopic(TopicCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.CloseTopic"


class GroupStart(StrEnum):
    beginning = "beginning"
    end = "end"
    position = "position"


class GroupPolicySpec(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A group policy as a client asks for it: every null field takes its documented default."""

    AVRO_NAME = "keyload.GroupPolicySpec"

    max_window: int | None = None
    lease_ms: int | None = None
    max_lease_ms: int | None = None
    max_attempts: int | None = None
    retry_base_ms: int | None = None
    retry_max_ms: int | None = None
    retry_factor: int | None = None
    retry_jitter: str | None = None


class CreateGroup(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A subscription group on a topic, starting after the checkpoint its start names."""

    AVRO_NAME = "keyload.command.CreateGroup"

    filter: GroupFilter
    start: GroupStart
    position: int | None = None
    policy: GroupPolicySpec


class GroupReceive(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Due redeliveries first, then the next matching positions; null limits take their defaults."""

    AVRO_NAME = "keyload.command.GroupReceive"

    max_events: int | None = None
    max_bytes: int | None = None
    lease_ms: int | None = None
    wait_ms: int | None = None


class GroupAck(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.GroupAck"

    token: str


class GroupAckBatch(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Acks each token independently; the result reports every token's outcome."""

    AVRO_NAME = "keyload.command.GroupAckBatch"

    tokens: list[str]


class GroupNack(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.GroupNack"

    token: str
    delay_ms: int | None = None


class GroupRenew(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.GroupRenew"

    token: str
    lease_ms: int | None = None


class GroupStatus(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.GroupStatus"


class SeekGroup(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Moves the checkpoint to just before `to`, drops outstanding deliveries, leaves the group paused."""

    AVRO_NAME = "keyload.command.SeekGroup"

    to: GroupStart
    position: int | None = None
    expected_generation: int | None = None


class ConfigureGroup(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """While paused: replaces the filter and/or the whole policy (null: unchanged); positions after the checkpoint are
    evaluated again."""

    AVRO_NAME = "keyload.command.ConfigureGroup"

    expected_generation: int
    filter: GroupFilter | None = None
    policy: GroupPolicySpec | None = None


class PauseGroup(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.PauseGroup"


class ResumeGroup(GroupCommand, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.ResumeGroup"


class PurgeTopic(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Deletes the retained events first_available..through; refused past any group's purge limit."""

    AVRO_NAME = "keyload.command.PurgeTopic"

    topic: str
    through: int
    expected_generation: int


class PutDocument(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Write a document; expected_revision null: unconditional, 0: only if absent, n: only at revision n."""

    AVRO_NAME = "keyload.command.PutDocument"

    key: str
    value: bytes
    expected_revision: int | None = None


class DeleteDocument(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Delete a document; expected_revision null: unconditional, n: only at revision n."""

    AVRO_NAME = "keyload.command.DeleteDocument"

    key: str
    expected_revision: int | None = None


class GetDocument(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.GetDocument"

    key: str


class ListDocuments(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Live documents whose key starts with prefix, in key order after `after`; null limits take their defaults."""

    AVRO_NAME = "keyload.command.ListDocuments"

    prefix: str = ""
    after: str | None = None
    max_documents: int | None = None
    max_bytes: int | None = None


class BatchMutation(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.BatchMutation"

    domain: str | None = None
    mutation: Branch


class Batch(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Mutations applied in order, all or nothing; a failing one rejects the whole batch with its index."""

    AVRO_NAME = "keyload.command.Batch"

    mutations: list[BatchMutation]


class CompleteProcessing(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Apply a delivery's effects, record its inbox entry and ack it, atomically; a repeat of the inbox key returns the
    first receipt."""

    AVRO_NAME = "keyload.command.CompleteProcessing"

    token: str
    handler_scope: str
    execution_generation: int
    effects: list[BatchMutation]
    topic: str | None = None
    group: str | None = None


class ConfigureInbox(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The domain's target inbox policy: how many receipts and bytes CommitInbox may keep."""

    AVRO_NAME = "keyload.command.ConfigureInbox"

    max_receipts: int
    max_bytes: int


class InboxSource(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.InboxSource"

    domain: str
    queue: str
    message_id: str
    delivery_generation: int


class CommitInbox(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Apply effects once per source delivery, handler scope and execution generation (target-side dedup)."""

    AVRO_NAME = "keyload.command.CommitInbox"

    source: InboxSource
    handler_scope: str
    execution_generation: int
    effects: list[BatchMutation]


class PrepareLargeSchedule(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Reserve a large message: its identity in the queue, a service-chosen object key, the expected length and
    SHA-256, an upload deadline (log time) and quota."""

    AVRO_NAME = "keyload.command.PrepareLargeSchedule"

    queue: str
    message_id: str
    length: int
    sha256: Sha256
    upload_window_ms: int | None = None
    headers: dict[str, str]
    ordering_key: str | None = None
    not_before_ms: int | None = None
    expires_at_ms: int | None = None


class CancelLargeSchedule(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Abandon a reservation before its commit; log order decides a race with CommitLargeSchedule."""

    AVRO_NAME = "keyload.command.CancelLargeSchedule"

    reservation_id: int


class PayloadCommitProof(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An attestation that the reserved object exists with the reserved length and SHA-256, signed (Ed25519) by a key
    of the reservation's trust set. Not a secret."""

    AVRO_NAME = "keyload.PayloadCommitProof"

    domain: str
    reservation_id: int
    object_key: str
    object_version: str
    length: int
    sha256: Sha256
    trust_set_version: int
    key_id: str
    attested_at_ms: int
    signature: bytes


class CommitLargeSchedule(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Create the reserved message from an attested object, verified by its proof alone (no object-store call)."""

    AVRO_NAME = "keyload.command.CommitLargeSchedule"

    reservation_id: int
    proof: PayloadCommitProof


class InspectReservation(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    AVRO_NAME = "keyload.command.InspectReservation"

    reservation_id: int


class AdvanceRecoveryFloor(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The partition's recovery floor (its oldest retained checkpoint's offset) has reached this offset; also compacts
    finished retention tasks below it."""

    AVRO_NAME = "keyload.command.AdvanceRecoveryFloor"

    floor_offset: int


class ListRetention(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Retention tasks in task order, each with what still blocks its deletion at this log time."""

    AVRO_NAME = "keyload.command.ListRetention"

    after_task: int | None = None
    limit: int | None = None


class BeginDelete(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A GC worker asks to delete a task's object; refused while anything blocks it."""

    AVRO_NAME = "keyload.command.BeginDelete"

    task_id: int


class DeleteConfirmed(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A GC worker deleted the task's object and an exact HEAD found no version left: the quota is released."""

    AVRO_NAME = "keyload.command.DeleteConfirmed"

    task_id: int
    deleted_versions: list[str]


class PrincipalSpec(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A principal EnableAccessControl installs."""

    AVRO_NAME = "keyload.command.PrincipalSpec"

    principal: str
    key_id: str
    grants: list[Grant]


class EnableAccessControl(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Turn access control on in this partition with its first principals (an administrator and the service's
    own). Signed with the key it installs for a principal holding admin on every domain; refused once access
    control is on."""

    AVRO_NAME = "keyload.command.EnableAccessControl"

    principals: list[PrincipalSpec]


class PutPrincipal(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Create a principal (key_id required) or change one: each non-null field replaces its value, grants replace
    every grant. Partition-wide: the SDK sends it to every partition."""

    AVRO_NAME = "keyload.command.PutPrincipal"

    principal: str
    key_id: str | None = None
    enabled: bool | None = None
    grants: list[Grant] | None = None
    expected_revision: int | None = None


class GrantCapability(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Add one grant to a principal (no change when it holds it already)."""

    AVRO_NAME = "keyload.command.GrantCapability"

    principal: str
    grant: Grant


class RevokeCapability(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Remove one grant, exactly as granted (no change when the principal does not hold it)."""

    AVRO_NAME = "keyload.command.RevokeCapability"

    principal: str
    grant: Grant


class InspectPrincipal(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A principal's record and the partition's policy epoch; null: the caller's own (whoami), which needs no
    capability."""

    AVRO_NAME = "keyload.command.InspectPrincipal"

    principal: str | None = None


class CheckpointPublished(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The checkpoint publisher published a checkpoint of this partition at `offset` to the catalog: with access
    control on, AdvanceRecoveryFloor may name only such an offset."""

    AVRO_NAME = "keyload.command.CheckpointPublished"

    offset: int
    manifest_sha256: Sha256


BODY_TYPES: dict[str, type[AvroRecord]] = {
    cls.AVRO_NAME: cls
    for cls in (
        CreateQueue,
        ConfigureQueue,
        Enqueue,
        InspectQueue,
        InspectMessage,
        Tick,
        Checkpoint,
        Receive,
        Renew,
        Ack,
        AckBatch,
        Nack,
        Redrive,
        Cancel,
        ParkPending,
        ListDeadLetters,
        RotateKeys,
        CreateTopic,
        Publish,
        ReadTopic,
        InspectTopic,
        CreateGroup,
        GroupReceive,
        GroupAck,
        GroupAckBatch,
        GroupNack,
        GroupRenew,
        GroupStatus,
        SeekGroup,
        ConfigureGroup,
        PauseGroup,
        ResumeGroup,
        PurgeTopic,
        PutDocument,
        DeleteDocument,
        GetDocument,
        ListDocuments,
        Batch,
        CompleteProcessing,
        ConfigureInbox,
        CommitInbox,
        PrepareLargeSchedule,
        CancelLargeSchedule,
        CommitLargeSchedule,
        InspectReservation,
        AdvanceRecoveryFloor,
        ListRetention,
        BeginDelete,
        DeleteConfirmed,
        EnableAccessControl,
        PutPrincipal,
        GrantCapability,
        RevokeCapability,
        InspectPrincipal,
        CheckpointPublished,
        PauseQueue,
        ResumeQueue,
        CloseQueue,
        DeleteQueue,
        ConfigureTopic,
        CloseTopic,
        DeleteTopic,
        DeleteGroup,
        RaiseFeatureLevel,
        ConfigureDomain,
        InspectDomain,
        ConfigureDomainCaps,
        ListQueues,
        ListTopics,
        PurgeQueue,
    )
}
"""The class of every command kind's body, by its branch name (keyload/commands.py's `branch`)."""
