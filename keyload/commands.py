"""The command table: every command kind keyload accepts, declared once.

A row says everything the layers around the processor need to know about a command:
its branch of the `keyload.Command` body union, the processor function that applies it,
the Avro record its outcome carries, whether that outcome is stored for idempotent
repeats, whether it only reads state (from feature level 1 a read keeps no outcome), whether it
may be a mutation of a Batch or a CompleteProcessing, the capability
a principal needs for it, the SDK method that sends it, its CLI noun and verb, and its
HTTP route. Dispatch (`keyload.processors.apply`), batch membership
(`keyload.processors.batch`), outcome typing (`keyload.sdk.results`), the SDK and the CLI
are derived from this table or checked against it (tests/test_command_table.py), so
adding a command is a schema branch, a handler, a row here, and tests.

This module imports nothing of the engine: the SDK and the CLI read it without loading
a processor, RocksDB or Kafka. Handlers are therefore named, not imported: a row's
`handler` is `"<module>:<function>"` under `keyload.processors`, resolved once by the
processor when it is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

COMMAND_NAMESPACE = "keyload.command"


class Capability(StrEnum):
    """What a principal may be granted per domain and resource (DESIGN.md §9), the symbols of the
    schema's `keyload.Capability`; `admin` implies every other."""

    enqueue = "enqueue"  # enqueue messages, schedule large payloads
    consume = "consume"  # receive, renew, ack, nack, complete processing (queues and groups)
    inspect = "inspect"  # views of queues, messages (with bodies), topics, groups, reservations
    dead_letter_read = "dead_letter_read"
    redrive = "redrive"  # redrive dead letters, park pending messages
    cancel = "cancel"
    topic_read = "topic_read"
    topic_publish = "topic_publish"
    subscription_manage = "subscription_manage"  # create, seek, configure, pause, resume groups
    resource_manage = "resource_manage"  # create, configure, purge queues, topics, inboxes
    inbox_write = "inbox_write"
    documents_read = "documents_read"
    documents_write = "documents_write"
    tick = "tick"  # the ticker: advance log time
    checkpoint = "checkpoint"  # the checkpoint publisher: record a published checkpoint
    recovery = "recovery"  # the GC worker: retention, recovery floor, deletions and their confirmation
    admin = "admin"  # principals, grants, keys, checkpoints, and every capability above


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTP route: method and path template; `{name}` segments are body fields (or the
    command's `domain`, or a partition for partition-scoped commands)."""

    method: str
    path: str

    @property
    def fields(self) -> tuple[str, ...]:
        """The `{name}` segments of the path, in order."""
        return tuple(segment[1:-1] for segment in self.path.split("/") if segment.startswith("{"))


class _TheCommandId:
    """The value of a RequestDefault that is the command's own id (an Enqueue's message id)."""

    def __repr__(self) -> str:
        return "the command id"


COMMAND_ID = _TheCommandId()


@dataclass(frozen=True, slots=True)
class RequestDefault:
    """A default the clients' side fills in before a command is encoded: `field` takes `value` (or,
    for COMMAND_ID, the command's id) when neither it nor any field of `unless` is given (null). The
    SDK's `Client.send` (every typed method, both transports, the CLI) and the HTTP route apply it, so
    each of them sends the same command; the processor does not, so a command written to the log
    without the field is refused as before (and replay of any log is unchanged)."""

    field: str
    value: Any
    unless: tuple[str, ...] = ()

    def filled(self, body: dict[str, Any], command_id: str) -> dict[str, Any]:
        """`body`, or a copy of it with the default filled in when it applies."""
        if any(body.get(name) is not None for name in (self.field, *self.unless)):
            return body
        return {**body, self.field: command_id if self.value is COMMAND_ID else self.value}


@dataclass(frozen=True, slots=True)
class CommandKind:
    name: str  # the body union branch is keyload.command.<name>
    handler: str  # "<module>:<function>" under keyload.processors
    result: str  # the Avro record of the outcome's result
    capability: Capability | None  # None: only its parts' (Batch)
    sdk: str | None  # the keyload.Client method that sends it
    cli: tuple[str, str] | None  # noun, verb
    route: Route | None
    stored: bool = True  # the outcome is kept for repeats of the command id
    reads: bool = False  # changes no state: from feature level 1 a repeat is answered afresh (processors/features.py)
    batchable: bool = False  # may be a mutation of a Batch or a CompleteProcessing
    partition_wide: bool = False  # acts on the partition, not a domain: only grants on every domain ("*") allow it
    parts: str | None = None  # the body field of mutations each authorized as the command it is (Batch, effects)
    self_service: bool = False  # naming the caller itself (its `principal` field null or its own) needs no capability
    resource_in_handler: bool = False  # its resource (a token's queue, a reservation's) is checked by its handler
    # An operator's: it bounds a domain's own administrators, so only grants on every domain ("*") allow
    # it, though it acts on one domain (ConfigureDomainCaps)
    operator: bool = False
    # The body field naming the resource a grant's resource pattern is matched against: the first of
    # RESOURCE_FIELDS in the route (`_kind` finds it). None: the command names no resource, so only a
    # grant on every resource ("*") allows it, unless its handler checks the resource it finds
    # (`resource_in_handler`: a grant on any resource lets it that far).
    resource: str | None = None
    request_default: RequestDefault | None = None  # filled in by the clients' side (`RequestDefault`)
    # The body fields naming keys of the service's keyring. The processor halts on a key its keyring
    # lacks (whether a key exists is configuration, not a refusal), so the HTTP API refuses one
    # before appending (keyload/server/app.py, Engine.submit_all).
    keyring_fields: tuple[str, ...] = ()
    # The body field naming the key a principal will sign with, which no partition may be signing
    # tokens, jitter or proofs with: partitions' keys may differ, so the clients' side checks every
    # partition before a partition-wide send could be applied by some and refused by others.
    principal_key_field: str | None = None

    @property
    def branch(self) -> str:
        return f"{COMMAND_NAMESPACE}.{self.name}"

    def resolve(self, package: str = "keyload.processors") -> Callable[..., Any]:
        """The handler function, imported (only now) from `<package>.<module>`."""
        module, function = self.handler.split(":")
        found = getattr(importlib.import_module(f"{package}.{module}"), function)
        if not callable(found):
            raise TypeError(f"{self.name}'s handler {self.handler} is not a function")
        handler: Callable[..., Any] = found
        return handler

    def keys_missing(self, body: Mapping[str, Any], keyring: Container[str]) -> list[str]:
        """The fields of `keyring_fields` whose key id `body` gives and `keyring` lacks: what the
        clients' side refuses before appending (the processor would halt on it)."""
        return [name for name in self.keyring_fields if body.get(name) is not None and body[name] not in keyring]

    def filled(self, body: dict[str, Any], command_id: str) -> dict[str, Any]:
        """`body` with this kind's request-side default filled in (`RequestDefault`)."""
        return body if self.request_default is None else self.request_default.filled(body, command_id)


def _kind(
    name: str,
    handler: str,
    result: str,
    capability: Capability | None,
    sdk: str | None,
    cli: str | None,
    route: str | None,
    *,
    stored: bool = True,
    reads: bool = False,
    batchable: bool = False,
    partition_wide: bool = False,
    parts: str | None = None,
    self_service: bool = False,
    resource_in_handler: bool = False,
    operator: bool = False,
    request_default: RequestDefault | None = None,
    keyring_fields: tuple[str, ...] = (),
    principal_key_field: str | None = None,
) -> CommandKind:
    """A row, written compactly: `cli` as "noun verb", `route` as "METHOD /path"."""
    noun_verb = None if cli is None else tuple(cli.split())
    assert noun_verb is None or len(noun_verb) == 2, cli
    method_path = None if route is None else Route(*route.split(" ", 1))
    fields = () if method_path is None else method_path.fields
    return CommandKind(
        name,
        handler,
        result,
        capability,
        sdk,
        noun_verb,
        method_path,
        stored,
        reads,
        batchable,
        partition_wide,
        parts,
        self_service,
        resource_in_handler,
        operator,
        next((name for name in RESOURCE_FIELDS if name in fields), None),
        request_default,
        keyring_fields,
        principal_key_field,
    )


RESOURCE_FIELDS = ("queue", "topic", "key")  # queues and their messages; topics and their groups; documents


C = Capability
Q = "/v1/domains/{domain}/queues/{queue}"
T = "/v1/domains/{domain}/topics/{topic}"
G = T + "/groups/{group}"
P = "/v1/partitions/{partition}"

COMMANDS: tuple[CommandKind, ...] = (
    # Queues
    _kind("CreateQueue", "queues.resource:create_queue", "keyload.QueueView", C.resource_manage, "create_queue", "queue create", f"PUT {Q}"),
    _kind("ConfigureQueue", "queues.resource:configure_queue", "keyload.QueueView", C.resource_manage, "configure_queue", "queue configure", f"PUT {Q}/policy"),
    _kind("PauseQueue", "queues.resource:pause_queue", "keyload.QueueView", C.resource_manage, "pause_queue", "queue pause", f"POST {Q}/pause"),
    _kind("ResumeQueue", "queues.resource:resume_queue", "keyload.QueueView", C.resource_manage, "resume_queue", "queue resume", f"POST {Q}/resume"),
    _kind("CloseQueue", "queues.resource:close_queue", "keyload.QueueView", C.resource_manage, "close_queue", "queue close", f"POST {Q}/close"),
    _kind("DeleteQueue", "queues.resource:delete_queue", "keyload.QueueView", C.resource_manage, "delete_queue", "queue delete", f"DELETE {Q}"),
    _kind("PurgeQueue", "queues.resource:purge_queue", "keyload.QueueView", C.resource_manage, "purge_queue", "queue purge", f"POST {Q}/purge"),
    _kind("InspectQueue", "queues.resource:inspect_queue", "keyload.QueueView", C.inspect, "inspect_queue", "queue inspect", f"GET {Q}", reads=True),
    _kind("ListQueues", "listing:list_queues", "keyload.result.QueueList", C.inspect, "list_queues", "queue list", "GET /v1/domains/{domain}/queues", reads=True),
    _kind("InspectMessage", "queues.resource:inspect_message", "keyload.MessageView", C.inspect, "inspect_message", "message inspect", f"GET {Q}/messages/{{message_id}}", reads=True),
    _kind("Enqueue", "queues.resource:enqueue", "keyload.result.EnqueueResult", C.enqueue, "enqueue", "queue enqueue", f"POST {Q}/messages", batchable=True, request_default=RequestDefault("message_id", COMMAND_ID)),
    _kind("Receive", "queues.leases:receive", "keyload.result.ReceiveResult", C.consume, "receive", "queue receive", f"POST {Q}/receive"),
    _kind("Renew", "queues.leases:renew", "keyload.result.LeaseResult", C.consume, "renew", "lease renew", "POST /v1/domains/{domain}/leases/renew", resource_in_handler=True),
    _kind("Ack", "queues.leases:ack", "keyload.result.LeaseResult", C.consume, "ack", "lease ack", "POST /v1/domains/{domain}/leases/ack", resource_in_handler=True),
    _kind("AckBatch", "queues.leases:ack_batch", "keyload.result.AckBatchResult", C.consume, "ack_batch", "lease ack-batch", "POST /v1/domains/{domain}/leases/ack-batch", resource_in_handler=True),
    _kind("Nack", "queues.leases:nack", "keyload.result.LeaseResult", C.consume, "nack", "lease nack", "POST /v1/domains/{domain}/leases/nack", resource_in_handler=True),
    _kind("ListDeadLetters", "queues.dead_letters:list_dead_letters", "keyload.result.DeadLetterPage", C.dead_letter_read, "list_dead_letters", "dlq list", f"GET {Q}/dead-letters", reads=True),
    _kind("Redrive", "queues.dead_letters:redrive", "keyload.MessageView", C.redrive, "redrive", "message redrive", f"POST {Q}/messages/{{message_id}}/redrive", batchable=True),
    _kind("Cancel", "queues.dead_letters:cancel", "keyload.MessageView", C.cancel, "cancel", "message cancel", f"POST {Q}/messages/{{message_id}}/cancel", batchable=True),
    _kind("ParkPending", "queues.dead_letters:park_pending", "keyload.MessageView", C.redrive, "park_pending", "message park", f"POST {Q}/messages/{{message_id}}/park", batchable=True),
    # Topics
    _kind("CreateTopic", "topics.topic:create_topic", "keyload.TopicView", C.resource_manage, "create_topic", "topic create", f"PUT {T}"),
    _kind("Publish", "topics.topic:publish", "keyload.result.PublishResult", C.topic_publish, "publish", "topic publish", f"POST {T}/events", batchable=True),
    _kind("ReadTopic", "topics.topic:read_topic", "keyload.result.TopicPage", C.topic_read, "read_topic", "topic read", f"GET {T}/events", reads=True, request_default=RequestDefault("from_position", 1, unless=("cursor",))),
    _kind("ListTopics", "listing:list_topics", "keyload.result.TopicList", C.inspect, "list_topics", "topic list", "GET /v1/domains/{domain}/topics", reads=True),
    _kind("InspectTopic", "topics.topic:inspect_topic", "keyload.TopicView", C.inspect, "inspect_topic", "topic inspect", f"GET {T}", reads=True),
    _kind("ConfigureTopic", "topics.topic:configure_topic", "keyload.TopicView", C.resource_manage, "configure_topic", "topic configure", f"PUT {T}/policy"),
    _kind("CloseTopic", "topics.topic:close_topic", "keyload.TopicView", C.resource_manage, "close_topic", "topic close", f"POST {T}/close"),
    _kind("DeleteTopic", "topics.deletion:delete_topic", "keyload.TopicView", C.resource_manage, "delete_topic", "topic delete", f"DELETE {T}"),
    _kind("PurgeTopic", "topics.topic:purge_topic", "keyload.TopicView", C.resource_manage, "purge_topic", "topic purge", f"POST {T}/purge"),
    # Subscription groups
    _kind("CreateGroup", "groups.group:create_group", "keyload.GroupView", C.subscription_manage, "create_group", "group create", f"PUT {G}"),
    _kind("GroupReceive", "groups.leases:group_receive", "keyload.result.GroupReceiveResult", C.consume, "group_receive", "group receive", f"POST {G}/receive"),
    _kind("GroupAck", "groups.leases:group_ack", "keyload.result.GroupLeaseResult", C.consume, "group_ack", "group ack", f"POST {G}/ack"),
    _kind("GroupAckBatch", "groups.leases:group_ack_batch", "keyload.result.GroupAckBatchResult", C.consume, "group_ack_batch", "group ack-batch", f"POST {G}/ack-batch"),
    _kind("GroupNack", "groups.leases:group_nack", "keyload.result.GroupLeaseResult", C.consume, "group_nack", "group nack", f"POST {G}/nack"),
    _kind("GroupRenew", "groups.leases:group_renew", "keyload.result.GroupLeaseResult", C.consume, "group_renew", "group renew", f"POST {G}/renew"),
    _kind("GroupStatus", "groups.group:group_status", "keyload.GroupView", C.inspect, "group_status", "group status", f"GET {G}", reads=True),
    _kind("SeekGroup", "groups.group:seek_group", "keyload.GroupView", C.subscription_manage, "seek_group", "group seek", f"POST {G}/seek"),
    _kind("ConfigureGroup", "groups.group:configure_group", "keyload.GroupView", C.subscription_manage, "configure_group", "group configure", f"PUT {G}/policy"),
    _kind("DeleteGroup", "topics.deletion:delete_group", "keyload.GroupView", C.subscription_manage, "delete_group", "group delete", f"DELETE {G}"),
    _kind("PauseGroup", "groups.group:pause_group", "keyload.GroupView", C.subscription_manage, "pause_group", "group pause", f"POST {G}/pause"),
    _kind("ResumeGroup", "groups.group:resume_group", "keyload.GroupView", C.subscription_manage, "resume_group", "group resume", f"POST {G}/resume"),
    # Documents, batches, inboxes
    _kind("PutDocument", "documents.document:put_document", "keyload.result.DocumentResult", C.documents_write, "put_document", "doc put", "PUT /v1/domains/{domain}/documents/{key}", batchable=True),
    _kind("DeleteDocument", "documents.document:delete_document", "keyload.result.DocumentResult", C.documents_write, "delete_document", "doc delete", "DELETE /v1/domains/{domain}/documents/{key}", batchable=True),
    _kind("GetDocument", "documents.document:get_document", "keyload.result.Document", C.documents_read, "get_document", "doc get", "GET /v1/domains/{domain}/documents/{key}", reads=True),
    _kind("ListDocuments", "documents.document:list_documents", "keyload.result.DocumentPage", C.documents_read, "list_documents", "doc list", "GET /v1/domains/{domain}/documents", reads=True),
    _kind("Batch", "batch:batch", "keyload.result.BatchResult", None, "batch", None, "POST /v1/domains/{domain}/batch", parts="mutations"),
    _kind("CompleteProcessing", "documents.inbox:complete_processing", "keyload.result.ProcessingResult", C.consume, "complete_processing", None, "POST /v1/domains/{domain}/leases/complete", parts="effects", resource_in_handler=True),
    _kind("ConfigureInbox", "documents.inbox:configure_inbox", "keyload.result.InboxView", C.resource_manage, "configure_inbox", "inbox configure", "PUT /v1/domains/{domain}/inbox"),
    _kind("CommitInbox", "documents.inbox:commit_inbox", "keyload.result.ProcessingResult", C.inbox_write, "commit_inbox", None, "POST /v1/domains/{domain}/inbox/commits", parts="effects"),
    # Domains: the idempotency horizons of their command ids (processors/domains.py, horizons.py)
    _kind("ConfigureDomain", "domains:configure_domain", "keyload.result.DomainView", C.resource_manage, "configure_domain", "domain configure", "PUT /v1/domains/{domain}/policy"),
    _kind("InspectDomain", "domains:inspect_domain", "keyload.result.DomainView", C.inspect, "inspect_domain", "domain inspect", "GET /v1/domains/{domain}", reads=True),
    # ... and what they may hold (processors/usage.py): an operator's, or the caps would not bound a domain's own administrators
    _kind("ConfigureDomainCaps", "domains:configure_domain_caps", "keyload.result.DomainView", C.admin, "configure_domain_caps", "domain caps", "PUT /v1/domains/{domain}/caps", operator=True),
    # Large payloads
    _kind("PrepareLargeSchedule", "payloads.schedule:prepare_large_schedule", "keyload.PayloadReservation", C.enqueue, "prepare_large_schedule", None, f"POST {Q}/reservations"),
    _kind("CommitLargeSchedule", "payloads.schedule:commit_large_schedule", "keyload.PayloadReservation", C.enqueue, "commit_large_schedule", None, "POST /v1/domains/{domain}/reservations/{reservation_id}/commit", resource_in_handler=True),
    _kind("CancelLargeSchedule", "payloads.reservations:cancel_large_schedule", "keyload.PayloadReservation", C.enqueue, "cancel_large_schedule", None, "POST /v1/domains/{domain}/reservations/{reservation_id}/cancel", resource_in_handler=True),
    _kind("InspectReservation", "payloads.reservations:inspect_reservation", "keyload.PayloadReservation", C.inspect, "inspect_reservation", None, "GET /v1/domains/{domain}/reservations/{reservation_id}", resource_in_handler=True, reads=True),
    # Administration (partition-scoped commands name the partition, not a domain)
    _kind("RotateKeys", "key_rotation:rotate_keys", "keyload.result.ActiveKeys", C.admin, "rotate_keys", "keys rotate", "POST /v1/domains/{domain}/keys/rotate", partition_wide=True, keyring_fields=("token_key_id", "jitter_key_id", "proof_key_id")),
    _kind("Tick", "timers:tick", "keyload.result.TickResult", C.tick, None, None, None, stored=False, partition_wide=True),
    _kind("Checkpoint", "timers:checkpoint", "keyload.result.CheckpointResult", C.admin, "request_checkpoint", None, f"POST {P}/checkpoints", stored=False, partition_wide=True),
    _kind("ListRetention", "payloads.retention:list_retention", "keyload.result.RetentionPage", C.recovery, "list_retention", None, f"GET {P}/retention", stored=False, partition_wide=True),
    _kind("AdvanceRecoveryFloor", "payloads.retention:advance_recovery_floor", "keyload.result.RetentionPage", C.recovery, "advance_recovery_floor", None, f"POST {P}/recovery-floor", stored=False, partition_wide=True),
    _kind("BeginDelete", "payloads.retention:begin_delete", "keyload.result.RetentionStatus", C.recovery, "begin_delete", None, f"POST {P}/retention/{{task_id}}/begin-delete", stored=False, partition_wide=True),
    _kind("DeleteConfirmed", "payloads.retention:delete_confirmed", "keyload.result.RetentionStatus", C.recovery, "delete_confirmed", None, f"POST {P}/retention/{{task_id}}/deleted", stored=False, partition_wide=True),
    # Access control (partition-wide: the SDK sends each to every partition, under one command id)
    _kind("EnableAccessControl", "principals:enable_access_control", "keyload.result.PrincipalView", C.admin, None, None, None, stored=False, partition_wide=True),
    _kind("PutPrincipal", "principals:put_principal", "keyload.result.PrincipalView", C.admin, "put_principal", None, "PUT /v1/principals/{principal}", partition_wide=True, keyring_fields=("key_id",), principal_key_field="key_id"),
    _kind("GrantCapability", "principals:grant_capability", "keyload.result.PrincipalView", C.admin, "grant", None, "POST /v1/principals/{principal}/grants", partition_wide=True),
    _kind("RevokeCapability", "principals:revoke_capability", "keyload.result.PrincipalView", C.admin, "revoke", None, "POST /v1/principals/{principal}/revoke", partition_wide=True),
    _kind("CheckpointPublished", "payloads.retention:checkpoint_published", "keyload.result.CheckpointResult", C.checkpoint, None, None, None, stored=False, partition_wide=True),
    _kind("RaiseFeatureLevel", "features:raise_feature_level", "keyload.result.FeatureLevelResult", C.admin, None, None, None, stored=False, partition_wide=True),
    _kind("InspectPrincipal", "principals:inspect_principal", "keyload.result.PrincipalView", C.admin, "inspect_principal", None, "GET /v1/principals/{principal}", partition_wide=True, self_service=True, reads=True),
)  # fmt: skip

BY_BRANCH: dict[str, CommandKind] = {kind.branch: kind for kind in COMMANDS}
BY_NAME: dict[str, CommandKind] = {kind.name: kind for kind in COMMANDS}
assert len(BY_BRANCH) == len(COMMANDS), "a command kind is declared twice"
assert all(kind.capability is not None or kind.parts is not None for kind in COMMANDS), "a row allows nothing"
assert all(kind.partition_wide for kind in COMMANDS if kind.keyring_fields), "keys are named on every partition"


def part_refused(index: int, detail: str) -> str:
    """The detail of a command refused for one of its parts (a Batch's mutation, a processing's effect,
    `CommandKind.parts`), whose index the outcome's `failed_index` holds too: a contract of outcomes."""
    return f"mutation {index}: {detail}"


def part_detail(index: int, detail: str) -> str:
    """The part's own detail, out of the detail of a command refused for it (`part_refused`): what the
    part alone would have been refused with (coalescing answers each part so)."""
    return detail.removeprefix(part_refused(index, ""))
