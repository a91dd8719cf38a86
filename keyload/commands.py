"""The command table: every command kind keyload accepts, declared once.

A row says everything the layers around the processor need to know about a command:
its branch of the `keyload.Command` body union, the processor function that applies it,
the Avro record its outcome carries, whether that outcome is stored for idempotent
repeats, whether it may be a mutation of a Batch or a CompleteProcessing, the capability
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
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

COMMAND_NAMESPACE = "keyload.command"


class Capability(StrEnum):
    """What a principal may be granted per domain and resource (DESIGN.md §9)."""

    ENQUEUE = "enqueue"  # enqueue messages, schedule large payloads
    CONSUME = "consume"  # receive, renew, ack, nack, complete processing (queues and groups)
    INSPECT = "inspect"  # views of queues, messages (with bodies), topics, groups, reservations
    DEAD_LETTER_READ = "dead-letter-read"
    REDRIVE = "redrive"  # redrive dead letters, park pending messages
    CANCEL = "cancel"
    TOPIC_READ = "topic-read"
    TOPIC_PUBLISH = "topic-publish"
    SUBSCRIPTION_MANAGE = "subscription-manage"  # create, seek, configure, pause, resume groups
    RESOURCE_MANAGE = "resource-manage"  # create, configure, purge queues, topics, inboxes
    INBOX_WRITE = "inbox-write"
    DOCUMENTS_READ = "documents-read"
    DOCUMENTS_WRITE = "documents-write"
    ADMIN = "admin"  # keys, retention, recovery floor, GC confirmations, ticks, checkpoints


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTP route: method and path template; `{name}` segments are body fields (or the
    command's `domain`, or a partition for partition-scoped commands)."""

    method: str
    path: str


@dataclass(frozen=True, slots=True)
class CommandKind:
    name: str  # the body union branch is keyload.command.<name>
    handler: str  # "<module>:<function>" under keyload.processors
    result: str  # the Avro record of the outcome's result
    capability: Capability | None  # None: each mutation's own (Batch)
    sdk: str | None  # the keyload.Client method that sends it
    cli: tuple[str, str] | None  # noun, verb
    route: Route | None
    stored: bool = True  # the outcome is kept for repeats of the command id
    batchable: bool = False  # may be a mutation of a Batch or a CompleteProcessing

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
    batchable: bool = False,
) -> CommandKind:
    """A row, written compactly: `cli` as "noun verb", `route` as "METHOD /path"."""
    noun_verb = None if cli is None else tuple(cli.split())
    assert noun_verb is None or len(noun_verb) == 2, cli
    method_path = None if route is None else Route(*route.split(" ", 1))
    return CommandKind(name, handler, result, capability, sdk, noun_verb, method_path, stored, batchable)


C = Capability
Q = "/v1/domains/{domain}/queues/{queue}"
T = "/v1/domains/{domain}/topics/{topic}"
G = T + "/groups/{group}"
P = "/v1/partitions/{partition}"

COMMANDS: tuple[CommandKind, ...] = (
    # Queues
    _kind("CreateQueue", "queues.resource:create_queue", "keyload.QueueView", C.RESOURCE_MANAGE, "create_queue", "queue create", f"PUT {Q}"),
    _kind("ConfigureQueue", "queues.resource:configure_queue", "keyload.QueueView", C.RESOURCE_MANAGE, "configure_queue", "queue configure", f"PUT {Q}/policy"),
    _kind("InspectQueue", "queues.resource:inspect_queue", "keyload.QueueView", C.INSPECT, "inspect_queue", "queue inspect", f"GET {Q}"),
    _kind("InspectMessage", "queues.resource:inspect_message", "keyload.MessageView", C.INSPECT, "inspect_message", "message inspect", f"GET {Q}/messages/{{message_id}}"),
    _kind("Enqueue", "queues.resource:enqueue", "keyload.result.EnqueueResult", C.ENQUEUE, "enqueue", "queue enqueue", f"POST {Q}/messages", batchable=True),
    _kind("Receive", "queues.leases:receive", "keyload.result.ReceiveResult", C.CONSUME, "receive", "queue receive", f"POST {Q}/receive"),
    _kind("Renew", "queues.leases:renew", "keyload.result.LeaseResult", C.CONSUME, "renew", "lease renew", "POST /v1/domains/{domain}/leases/renew"),
    _kind("Ack", "queues.leases:ack", "keyload.result.LeaseResult", C.CONSUME, "ack", "lease ack", "POST /v1/domains/{domain}/leases/ack"),
    _kind("AckBatch", "queues.leases:ack_batch", "keyload.result.AckBatchResult", C.CONSUME, "ack_batch", "lease ack-batch", "POST /v1/domains/{domain}/leases/ack-batch"),
    _kind("Nack", "queues.leases:nack", "keyload.result.LeaseResult", C.CONSUME, "nack", "lease nack", "POST /v1/domains/{domain}/leases/nack"),
    _kind("ListDeadLetters", "queues.dead_letters:list_dead_letters", "keyload.result.DeadLetterPage", C.DEAD_LETTER_READ, "list_dead_letters", "dlq list", f"GET {Q}/dead-letters"),
    _kind("Redrive", "queues.dead_letters:redrive", "keyload.MessageView", C.REDRIVE, "redrive", "message redrive", f"POST {Q}/messages/{{message_id}}/redrive", batchable=True),
    _kind("Cancel", "queues.dead_letters:cancel", "keyload.MessageView", C.CANCEL, "cancel", "message cancel", f"POST {Q}/messages/{{message_id}}/cancel", batchable=True),
    _kind("ParkPending", "queues.dead_letters:park_pending", "keyload.MessageView", C.REDRIVE, "park_pending", "message park", f"POST {Q}/messages/{{message_id}}/park", batchable=True),
    # Topics
    _kind("CreateTopic", "topics.topic:create_topic", "keyload.TopicView", C.RESOURCE_MANAGE, "create_topic", "topic create", f"PUT {T}"),
    _kind("Publish", "topics.topic:publish", "keyload.result.PublishResult", C.TOPIC_PUBLISH, "publish", "topic publish", f"POST {T}/events", batchable=True),
    _kind("ReadTopic", "topics.topic:read_topic", "keyload.result.TopicPage", C.TOPIC_READ, "read_topic", "topic read", f"GET {T}/events"),
    _kind("InspectTopic", "topics.topic:inspect_topic", "keyload.TopicView", C.INSPECT, "inspect_topic", "topic inspect", f"GET {T}"),
    _kind("PurgeTopic", "topics.topic:purge_topic", "keyload.TopicView", C.RESOURCE_MANAGE, "purge_topic", "topic purge", f"POST {T}/purge"),
    # Subscription groups
    _kind("CreateGroup", "groups.group:create_group", "keyload.GroupView", C.SUBSCRIPTION_MANAGE, "create_group", "group create", f"PUT {G}"),
    _kind("GroupReceive", "groups.leases:group_receive", "keyload.result.GroupReceiveResult", C.CONSUME, "group_receive", "group receive", f"POST {G}/receive"),
    _kind("GroupAck", "groups.leases:group_ack", "keyload.result.GroupLeaseResult", C.CONSUME, "group_ack", "group ack", f"POST {G}/ack"),
    _kind("GroupAckBatch", "groups.leases:group_ack_batch", "keyload.result.GroupAckBatchResult", C.CONSUME, "group_ack_batch", "group ack-batch", f"POST {G}/ack-batch"),
    _kind("GroupNack", "groups.leases:group_nack", "keyload.result.GroupLeaseResult", C.CONSUME, "group_nack", "group nack", f"POST {G}/nack"),
    _kind("GroupRenew", "groups.leases:group_renew", "keyload.result.GroupLeaseResult", C.CONSUME, "group_renew", "group renew", f"POST {G}/renew"),
    _kind("GroupStatus", "groups.group:group_status", "keyload.GroupView", C.INSPECT, "group_status", "group status", f"GET {G}"),
    _kind("SeekGroup", "groups.group:seek_group", "keyload.GroupView", C.SUBSCRIPTION_MANAGE, "seek_group", "group seek", f"POST {G}/seek"),
    _kind("ConfigureGroup", "groups.group:configure_group", "keyload.GroupView", C.SUBSCRIPTION_MANAGE, "configure_group", "group configure", f"PUT {G}/policy"),
    _kind("PauseGroup", "groups.group:pause_group", "keyload.GroupView", C.SUBSCRIPTION_MANAGE, "pause_group", "group pause", f"POST {G}/pause"),
    _kind("ResumeGroup", "groups.group:resume_group", "keyload.GroupView", C.SUBSCRIPTION_MANAGE, "resume_group", "group resume", f"POST {G}/resume"),
    # Documents, batches, inboxes
    _kind("PutDocument", "documents.document:put_document", "keyload.result.DocumentResult", C.DOCUMENTS_WRITE, "put_document", "doc put", "PUT /v1/domains/{domain}/documents/{key}", batchable=True),
    _kind("DeleteDocument", "documents.document:delete_document", "keyload.result.DocumentResult", C.DOCUMENTS_WRITE, "delete_document", "doc delete", "DELETE /v1/domains/{domain}/documents/{key}", batchable=True),
    _kind("GetDocument", "documents.document:get_document", "keyload.result.Document", C.DOCUMENTS_READ, "get_document", "doc get", "GET /v1/domains/{domain}/documents/{key}"),
    _kind("ListDocuments", "documents.document:list_documents", "keyload.result.DocumentPage", C.DOCUMENTS_READ, "list_documents", "doc list", "GET /v1/domains/{domain}/documents"),
    _kind("Batch", "batch:batch", "keyload.result.BatchResult", None, "batch", None, "POST /v1/domains/{domain}/batch"),
    _kind("CompleteProcessing", "documents.inbox:complete_processing", "keyload.result.ProcessingResult", C.CONSUME, "complete_processing", None, "POST /v1/domains/{domain}/leases/complete"),
    _kind("ConfigureInbox", "documents.inbox:configure_inbox", "keyload.result.InboxView", C.RESOURCE_MANAGE, "configure_inbox", "inbox configure", "PUT /v1/domains/{domain}/inbox"),
    _kind("CommitInbox", "documents.inbox:commit_inbox", "keyload.result.ProcessingResult", C.INBOX_WRITE, "commit_inbox", None, "POST /v1/domains/{domain}/inbox/commits"),
    # Large payloads
    _kind("PrepareLargeSchedule", "payloads.schedule:prepare_large_schedule", "keyload.PayloadReservation", C.ENQUEUE, "prepare_large_schedule", None, f"POST {Q}/reservations"),
    _kind("CommitLargeSchedule", "payloads.schedule:commit_large_schedule", "keyload.PayloadReservation", C.ENQUEUE, "commit_large_schedule", None, "POST /v1/domains/{domain}/reservations/{reservation_id}/commit"),
    _kind("CancelLargeSchedule", "payloads.reservations:cancel_large_schedule", "keyload.PayloadReservation", C.ENQUEUE, "cancel_large_schedule", None, "POST /v1/domains/{domain}/reservations/{reservation_id}/cancel"),
    _kind("InspectReservation", "payloads.reservations:inspect_reservation", "keyload.PayloadReservation", C.INSPECT, "inspect_reservation", None, "GET /v1/domains/{domain}/reservations/{reservation_id}"),
    # Administration (partition-scoped commands name the partition, not a domain)
    _kind("RotateKeys", "key_rotation:rotate_keys", "keyload.result.ActiveKeys", C.ADMIN, "rotate_keys", "keys rotate", "POST /v1/domains/{domain}/keys/rotate"),
    _kind("Tick", "timers:tick", "keyload.result.TickResult", C.ADMIN, None, None, None, stored=False),
    _kind("Checkpoint", "timers:checkpoint", "keyload.result.CheckpointResult", C.ADMIN, "request_checkpoint", None, f"POST {P}/checkpoints", stored=False),
    _kind("ListRetention", "payloads.retention:list_retention", "keyload.result.RetentionPage", C.ADMIN, "list_retention", None, f"GET {P}/retention", stored=False),
    _kind("AdvanceRecoveryFloor", "payloads.retention:advance_recovery_floor", "keyload.result.RetentionPage", C.ADMIN, "advance_recovery_floor", None, f"POST {P}/recovery-floor", stored=False),
    _kind("BeginDelete", "payloads.retention:begin_delete", "keyload.result.RetentionStatus", C.ADMIN, "begin_delete", None, f"POST {P}/retention/{{task_id}}/begin-delete", stored=False),
    _kind("DeleteConfirmed", "payloads.retention:delete_confirmed", "keyload.result.RetentionStatus", C.ADMIN, "delete_confirmed", None, f"POST {P}/retention/{{task_id}}/deleted", stored=False),
)  # fmt: skip

BY_BRANCH: dict[str, CommandKind] = {kind.branch: kind for kind in COMMANDS}
BY_NAME: dict[str, CommandKind] = {kind.name: kind for kind in COMMANDS}
assert len(BY_BRANCH) == len(COMMANDS), "a command kind is declared twice"
assert all(kind.capability is not None or kind.name == "Batch" for kind in COMMANDS)
