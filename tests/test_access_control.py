"""Access control (processors/access.py, processors/principals.py, processors/apply.py): who sent a
command (its `keyload.Signed` record), whether its principal holds the capability the command table
names on the domain and resource, and outcomes sealed with the caller's key.

Most tests drive the processors in-process (`Secured`: an `Embedded` deployment whose partitions all
applied the EnableAccessControl command `keyload run` appends first). Each refusal is checked for its
error code and for leaving every partition's state as it was, and, where it matters, for whether its
command id was taken: a refusal by authentication or by the table row's capability check (each of a
batch's mutations and a processing's effects included) is published, never stored, so the id stays
unused; a refusal raised inside a handler (the queue a delivery token or a reservation names, a token
issued to another principal) is stored like any rejection. The last tests run a real `keyload run`
and the SDK's `Client`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from keyload import limits
from keyload.commands import BY_NAME, Capability
from keyload.credentials import (
    ADMIN_PRINCIPAL,
    SIGNED,
    Credential,
    CredentialError,
    contents,
    credential_path,
    unwrap,
)
from keyload.errors import (
    CommandRejected,
    ConflictError,
    InvalidCommand,
    NotFoundError,
    OutcomeTimeout,
    PermissionDeniedError,
    RevisionConflictError,
)
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.operations.checkpoints import Announcer
from keyload.operations.recovery import drill
from keyload.processors import tokens
from keyload.processors.access import policy_epoch
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.features import PRINCIPALS_CHECKED, RETIRED_KEYS_REFUSED, SERVICE_ACTORS_KEPT
from keyload.processors.outcomes import OUTCOME, new_outcome, reject
from keyload.processors.payloads import proofs
from keyload.projections import keys
from keyload.projections.records import MessageMeta, QueueView
from keyload.sdk.client import Client
from keyload.sdk.results import (
    ActiveKeys,
    CheckpointResult,
    DeadLetterPage,
    Delivery,
    DocumentPage,
    EnqueueResult,
    Grant,
    GroupReceiveResult,
    MessageView,
    Outcome,
    PayloadReservation,
    PrincipalView,
    ProcessingResult,
    ReceiveResult,
    RetentionPage,
)
from keyload.service.access_control import enable_command
from keyload.service.halts import Halt
from keyload.service.runtime import PartitionProcessor
from keyload.service.system_commands import domain_for_partition
from keyload.storage import keyring
from keyload.storage.datadir import DataDir
from keyload.storage.principals import (
    CHECKPOINTER_PRINCIPAL,
    GC_PRINCIPAL,
    SERVICE_ACTORS,
    TICKER_PRINCIPAL,
    issued_credential,
    new_credential,
    system_credential,
    system_key_id,
)

from .payloads import CANCEL_LARGE, COMMIT, INSPECT_RESERVATION, PREPARE, prepare_body
from .support import (
    ACK,
    BATCH,
    COMPLETE_PROCESSING,
    CONFIGURE_INBOX,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    GET_DOCUMENT,
    GROUP_ACK,
    GROUP_RECEIVE,
    INSPECT_MESSAGE,
    INSPECT_QUEUE,
    LIST_DOCUMENTS,
    NACK,
    PUBLISH,
    PUT_DOCUMENT,
    RECEIVE,
    TICK,
    Embedded,
    assert_replay_equals_live,
    batch_body,
    bearer,
    command,
    create_group_body,
    create_queue_body,
    create_topic_body,
    enqueue_body,
    event,
    group_receive_body,
    list_documents_body,
    message_fence,
    mutation,
    publish_body,
    put_document_body,
    read_body,
    receive_body,
    run_keyload,
    served_url,
    start_service,
    stop_service,
    wide_command,
)

A = "acme"  # the domain grants name
B = "globex"  # another tenant's domain
PARTITIONS = 2
DENIED = "PermissionDenied"
# The one refusal of an unknown principal, a key id not its own and a disabled principal alike.
UNKNOWN_SIGNER = "no enabled principal of this name signs with this key id"
RENEW = BY_NAME["Renew"].branch
ROTATE_KEYS = BY_NAME["RotateKeys"].branch
CHECKPOINT = BY_NAME["Checkpoint"].branch
INSPECT_PRINCIPAL = BY_NAME["InspectPrincipal"].branch
GRANT_CAPABILITY = BY_NAME["GrantCapability"].branch
PUT_PRINCIPAL = BY_NAME["PutPrincipal"].branch
REVOKE_CAPABILITY = BY_NAME["RevokeCapability"].branch

R = TypeVar("R")


def can(capability: Capability, domain: str = A, resource: str = "*") -> Grant:
    return Grant(capability=capability, domain=domain, resource=resource)


def typed(value: Any, kind: type[R]) -> R:
    assert isinstance(value, kind), value
    return value


class Secured:
    """An embedded deployment with access control on in every partition, driven synchronously."""

    def __init__(self, root: Path, partitions: int = PARTITIONS) -> None:
        self.root = root
        self.partitions = partitions
        self.embedded = Embedded(root, partitions)
        # As `keyload run` builds its processors: a key added to the keyring file while serving (a
        # new principal's) is found by reloading the file.
        for processor in self.embedded.processors:
            processor.keyring_loader = self.embedded.data.keyring
        for partition in range(partitions):
            self.embedded.log.append(partition, [enable_command(root, partition, partitions)])
        self.embedded.run()
        assert [policy_epoch(store) for store in self.embedded.stores] == [1] * partitions
        self.admin = system_credential(root, ADMIN_PRINCIPAL)
        self.gc = system_credential(root, GC_PRINCIPAL)
        self.published = b""  # the outcome record `deliver` last found, as it was published

    def close(self) -> None:
        self.embedded.close()

    # -- sending -------------------------------------------------------------------------------

    def system_domain(self, partition: int) -> str:
        return domain_for_partition(partition, self.partitions)

    def halts(self) -> list[Halt]:
        return [p.halt for p in self.embedded.processors if p.halt is not None]

    def signed(
        self,
        credential: Credential | None,
        domain: str,
        kind: str,
        body: dict[str, Any],
        command_id: str,
        principal: str | None = None,
    ) -> bytes:
        """The log record of a command: signed with `credential` (unsigned when None), naming
        `principal` in its envelope (default: the credential's)."""
        if principal is None:
            principal = "anonymous" if credential is None else credential.principal
        raw = command(domain, kind, body, command_id, principal=principal, reply_to=0)
        return raw if credential is None else credential.sign(raw)

    def deliver(
        self, value: bytes, domain: str, command_id: str, credential: Credential | None
    ) -> tuple[Outcome, bool]:
        """Append a record, apply it, and return its outcome as published to reply partition 0 and
        whether it is sealed with `credential`'s key. No partition may halt on the way."""
        halted = self.halts()
        cursor = self.embedded.outcomes.end_offset(0)
        self.embedded.append(domain, value)
        self.embedded.run()
        assert self.halts() == halted
        for record in self.embedded.outcomes.read(0, cursor, 1_000):
            decoded = REGISTRY.decode("keyload.Outcome", contents(record.value))
            if decoded["command_id"] == command_id and decoded["domain"] == domain:
                self.published = record.value
                sealed = credential is not None and credential.seals(record.value)
                return Outcome.from_record(decoded), sealed
        raise AssertionError(f"no outcome published for {command_id}")

    def submit_as(
        self,
        credential: Credential | None,
        domain: str,
        kind: str,
        body: dict[str, Any],
        command_id: str | None = None,
        principal: str | None = None,
    ) -> tuple[Outcome, bool]:
        command_id = command_id or str(uuid.uuid4())
        value = self.signed(credential, domain, kind, body, command_id, principal)
        return self.deliver(value, domain, command_id, credential)

    def ok(
        self, credential: Credential, domain: str, kind: str, body: dict[str, Any], command_id: str | None = None
    ) -> Any:
        """The result of a command that must commit; its outcome sealed for the caller."""
        outcome, sealed = self.submit_as(credential, domain, kind, body, command_id)
        assert outcome.status == "committed", outcome
        assert sealed
        return outcome.result

    def refused(
        self,
        credential: Credential | None,
        domain: str,
        kind: str,
        body: dict[str, Any],
        code: str = DENIED,
        command_id: str | None = None,
        principal: str | None = None,
        *,
        stored: bool | None = None,
    ) -> Outcome:
        """The outcome of a command refused with `code` that leaves every partition's state as it was;
        with `stored`, whether the refusal took its command id (a handler's refusal) or not (the table
        row's), and either way sealed for its authenticated sender."""
        command_id = command_id or str(uuid.uuid4())
        had = self.embedded.stored_outcome(domain, command_id)
        before = self.state()
        outcome, sealed = self.submit_as(credential, domain, kind, body, command_id, principal)
        assert (outcome.status, outcome.error_code) == ("rejected", code), outcome
        assert self.state() == before
        if stored is not None:
            assert sealed, outcome
            found = self.embedded.stored_outcome(domain, command_id)
            if stored:
                assert found is not None and (had is None or found == had), outcome
            else:
                assert found == had, outcome  # nothing stored, or the stored outcome as it was
        return outcome

    def unauthenticated(self, value: bytes, domain: str, command_id: str, credential: Credential | None) -> Outcome:
        """A record refused by authentication: PermissionDenied, published unsealed, not stored,
        nothing changed and no partition halted (`deliver` checks that)."""
        before = self.state()
        outcome, sealed = self.deliver(value, domain, command_id, credential)
        assert (outcome.status, outcome.error_code) == ("rejected", DENIED), outcome
        assert not sealed and unwrap(self.published) is None  # no key sealed it: a plain Outcome record
        assert self.embedded.stored_outcome(domain, command_id) is None
        assert self.state() == before and self.halts() == []
        return outcome

    def state(self) -> list[str]:
        """Every partition's state but what every command moves (offsets, log time, stored outcomes)."""
        return [self.embedded.state_digest(self.system_domain(p)) for p in range(self.partitions)]

    # -- the policy ------------------------------------------------------------------------------

    def everywhere(
        self, name: str, body: dict[str, Any], credential: Credential | None = None, command_id: str | None = None
    ) -> list[Any]:
        """A partition-wide command sent to every partition under one command id, as the SDK does."""
        credential = credential or self.admin
        command_id = command_id or str(uuid.uuid4())
        return [
            self.ok(credential, self.system_domain(p), BY_NAME[name].branch, body, command_id)
            for p in range(self.partitions)
        ]

    def put(
        self,
        name: str,
        *,
        key_id: str | None = None,
        enabled: bool | None = None,
        grants: list[Grant] | None = None,
    ) -> None:
        body = {
            "principal": name,
            "key_id": key_id,
            "enabled": enabled,
            "grants": None if grants is None else [grant.to_avro() for grant in grants],
            "expected_revision": None,
        }
        self.everywhere("PutPrincipal", body)

    def principal(self, name: str, *grants: Grant) -> Credential:
        """A new principal: a keyring key, its credential file, and a PutPrincipal in every partition."""
        credential = new_credential(self.root, name)
        self.put(name, key_id=credential.key_id, grants=list(grants))
        return credential

    def grant(self, name: str, grant: Grant) -> None:
        self.everywhere("GrantCapability", {"principal": name, "grant": grant.to_avro()})

    def revoke(self, name: str, grant: Grant) -> None:
        self.everywhere("RevokeCapability", {"principal": name, "grant": grant.to_avro()})

    # -- resources (made by the administrator) ---------------------------------------------------

    def queue(self, domain: str, queue: str, *message_ids: str, **policy: Any) -> None:
        self.ok(self.admin, domain, CREATE_QUEUE, create_queue_body(queue, **policy))
        for message_id in message_ids:
            self.ok(self.admin, domain, ENQUEUE, enqueue_body(queue, message_id, f"body of {message_id}".encode()))

    def message(self, domain: str, queue: str, message_id: str) -> MessageView:
        body = {"queue": queue, "message_id": message_id, "include_body": True}
        return typed(self.ok(self.admin, domain, INSPECT_MESSAGE, body), MessageView)

    def meta(self, domain: str, queue: str, message_id: str) -> MessageMeta:
        return self.message(domain, queue, message_id).meta

    def receive(self, credential: Credential, domain: str, queue: str) -> Delivery:
        result = typed(self.ok(credential, domain, RECEIVE, receive_body(queue, max_messages=1)), ReceiveResult)
        [delivery] = result.deliveries
        return delivery


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    deployment = Secured(tmp_path / "data")
    yield deployment
    deployment.close()


def lease_commands(token: str) -> list[tuple[str, dict[str, Any]]]:
    return [(ACK, {"token": token}), (NACK, {"token": token, "delay_ms": None}), (RENEW, {"token": token})]


# -- 1. spoofing the owner of a delivery ----------------------------------------------------------------


def test_a_command_naming_another_principal_is_refused_and_not_stored(secured: Secured) -> None:
    """Mallory signs with her own key a command naming alice: authentication refuses it, publishes the
    refusal unsealed and stores nothing, so alice's own command under the same id still applies."""
    secured.queue(A, "jobs")
    alice = secured.principal("alice", can(Capability.enqueue))
    mallory = secured.principal("mallory", can(Capability.enqueue))
    body = enqueue_body("jobs", "m1", b"from alice")
    value = secured.signed(mallory, A, ENQUEUE, body, "x-1", principal="alice")
    outcome = secured.unauthenticated(value, A, "x-1", mallory)
    assert not alice.seals(secured.published)
    assert outcome.detail == UNKNOWN_SIGNER

    outcome, sealed = secured.submit_as(alice, A, ENQUEUE, body, "x-1")
    assert outcome.status == "committed" and sealed, outcome
    assert secured.message(A, "jobs", "m1").body == b"from alice"


def test_a_delivery_token_serves_only_the_principal_it_was_issued_to(secured: Secured) -> None:
    """Mallory, holding consume on the domain herself, presents alice's token: Ack, Nack and Renew are
    each PermissionDenied, and the lease stays alice's."""
    secured.queue(A, "jobs", "m1")
    alice = secured.principal("alice", can(Capability.consume))
    mallory = secured.principal("mallory", can(Capability.consume))
    delivery = secured.receive(alice, A, "jobs")
    leased = secured.meta(A, "jobs", "m1")
    assert (leased.state, leased.lease_owner) == ("leased", "alice")
    for kind, body in lease_commands(delivery.token):
        # Refused by the handler, once it read the token: stored like any rejection.
        outcome = secured.refused(mallory, A, kind, body, stored=True)
        assert outcome.detail == "the delivery was issued to another principal"
        assert delivery.token not in outcome.detail
    assert secured.meta(A, "jobs", "m1") == leased
    settled = secured.ok(alice, A, ACK, {"token": delivery.token})
    assert settled.state == "acked"


# -- 2. cross-domain reads --------------------------------------------------------------------------------


def test_reads_reach_only_the_granted_domain(secured: Secured) -> None:
    """Inspect and dead_letter_read on domain A: InspectMessage (with its body) and ListDeadLetters are
    refused on domain B (and on a domain A is a prefix of: an exact pattern is not a prefix) and
    answered on A."""
    for domain in (A, B, "acme-eu"):
        secured.queue(domain, "jobs", "m1")
    auditor = secured.principal("auditor", can(Capability.inspect), can(Capability.dead_letter_read))
    inspect = {"queue": "jobs", "message_id": "m1", "include_body": True}
    dead_letters = {"queue": "jobs", "after_sequence": None, "limit": 10, "include_body": True}
    for domain in (B, "acme-eu"):
        assert "inspect" in secured.refused(auditor, domain, INSPECT_MESSAGE, inspect, stored=False).detail
        listed = secured.refused(auditor, domain, BY_NAME["ListDeadLetters"].branch, dead_letters, stored=False)
        assert "dead_letter_read" in listed.detail
    assert typed(secured.ok(auditor, A, INSPECT_MESSAGE, inspect), MessageView).body == b"body of m1"
    page = typed(secured.ok(auditor, A, BY_NAME["ListDeadLetters"].branch, dead_letters), DeadLetterPage)
    assert page.messages == []


# -- 3. commands without their capability -------------------------------------------------------------------

Builder = Callable[[Secured], dict[str, Any]]


def _empty_queue(secured: Secured) -> dict[str, Any]:
    """A queue the administrator creates empty, so that deleting it is allowed."""
    secured.ok(secured.admin, A, CREATE_QUEUE, create_queue_body("empty"))
    return {"queue": "empty"}


UNGRANTED: dict[str, Builder] = {
    "PurgeTopic": lambda s: {"topic": "news", "through": 1, "expected_generation": 1},
    "SeekGroup": lambda s: {"topic": "news", "group": "g", "to": "end", "position": None, "expected_generation": None},
    "PauseGroup": lambda s: {"topic": "news", "group": "g"},
    "ConfigureGroup": lambda s: {
        "topic": "news",
        "group": "g",
        "expected_generation": 1,
        "filter": {"event_types": ["t"], "headers": {}},
        "policy": None,
    },
    "Redrive": lambda s: message_fence(
        "jobs", "m1", (m := s.meta(A, "jobs", "m1")).state_version, m.delivery_generation
    ),
    "ConfigureQueue": lambda s: {
        "queue": "jobs",
        "policy": create_queue_body("jobs", max_stored_messages=1)["policy"],
        "expected_policy_version": None,
    },
    "CreateQueue": lambda s: create_queue_body("new-queue"),
    "PauseQueue": lambda s: {"queue": "jobs"},
    "CloseQueue": lambda s: {"queue": "jobs"},
    "DeleteQueue": _empty_queue,
    "CloseTopic": lambda s: {"topic": "news"},
    "DeleteTopic": lambda s: {"topic": "news", "force": True, "expected_incarnation": None},
    "DeleteGroup": lambda s: {"topic": "news", "group": "g", "force": False, "expected_incarnation": None},
    "ConfigureTopic": lambda s: {
        "topic": "news",
        "policy": {**create_topic_body("news")["policy"], "max_age_ms": 60_000},
        "expected_policy_version": 1,
    },
}


@pytest.mark.parametrize("name", sorted(UNGRANTED))
def test_a_command_needs_the_capability_its_table_row_names(secured: Secured, name: str) -> None:
    """A worker holding consume and enqueue (and topic_read) on the domain is refused the management
    commands, each naming the capability it lacks. The refusal is published, not stored: once granted
    the capability, the worker's very command under the same id applies, fresh, at a new offset."""
    secured.queue(A, "jobs", "m1", "m2", max_attempts=1)
    secured.ok(secured.admin, A, CREATE_TOPIC, create_topic_body("news"))
    secured.ok(secured.admin, A, PUBLISH, publish_body("news", event("e1"), event("e2")))
    secured.ok(secured.admin, A, CREATE_GROUP, create_group_body("news", "g", start="end"))  # purging is not blocked
    worker = secured.principal("worker", can(Capability.consume), can(Capability.enqueue), can(Capability.topic_read))
    dead = secured.receive(worker, A, "jobs")  # m1, with max_attempts 1: its nack dead-letters it
    assert secured.ok(worker, A, NACK, {"token": dead.token, "delay_ms": None}).state == "dead_lettered"
    if name == "ConfigureGroup":
        secured.ok(secured.admin, A, BY_NAME["PauseGroup"].branch, {"topic": "news", "group": "g"})  # it needs that
    row = BY_NAME[name]
    assert row.capability is not None
    body = UNGRANTED[name](secured)
    command_id = f"{name}-1"
    outcome = secured.refused(worker, A, row.branch, body, command_id=command_id, stored=False)
    assert outcome.detail.startswith(f"the principal holds no {row.capability.value} grant")
    assert secured.ok(worker, A, ENQUEUE, enqueue_body("jobs", "m3")).state == "ready"  # what it holds, it may
    secured.grant("worker", can(row.capability))
    before = secured.state()
    again, sealed = secured.submit_as(worker, A, row.branch, body, command_id)  # a command that does something
    assert (again.status, sealed) == ("committed", True), again
    assert again.offset > outcome.offset and secured.state() != before


# -- 4. resource patterns -----------------------------------------------------------------------------------


def test_a_resource_pattern_covers_the_names_it_matches(secured: Secured) -> None:
    for queue in ("jobs-a", "jobs", "other"):
        secured.queue(A, queue, "m1")
    bob = secured.principal("bob", can(Capability.consume, resource="jobs-*"))
    assert secured.receive(bob, A, "jobs-a").message_id == "m1"
    for queue in ("other", "jobs"):  # "jobs-*" is a prefix "jobs-", which "jobs" lacks
        outcome = secured.refused(bob, A, RECEIVE, receive_body(queue), stored=False)
        assert outcome.detail == "the principal holds no consume grant on this resource"
        assert secured.meta(A, queue, "m1").state == "ready"
    secured.refused(bob, B, RECEIVE, receive_body("jobs-a"), stored=False)  # the domain pattern is "acme" exactly


def test_a_token_of_a_queue_outside_the_grants_is_refused_when_it_is_read(secured: Secured) -> None:
    """Ack, Nack and Renew name no queue (the token does): the table lets any consume grant on the
    domain through (`resource_in_handler`), and the handler checks the queue the token names
    (processors/queues/leases.py). That refusal is the handler's, so it is stored: a repeat of its
    command id after the grant is back is answered with it."""
    secured.queue(A, "jobs-a", "m1")
    secured.queue(A, "other", "m1")
    on_other = can(Capability.consume, resource="other")
    bob = secured.principal("bob", can(Capability.consume, resource="jobs-*"), on_other)
    mine = secured.receive(bob, A, "jobs-a")
    theirs = secured.receive(bob, A, "other")
    secured.revoke("bob", on_other)
    leased = secured.meta(A, "other", "m1")
    refusals = {}
    for kind, body in lease_commands(theirs.token):
        outcome = secured.refused(bob, A, kind, body, command_id=f"{kind}-other", stored=True)
        assert outcome.detail == "the principal holds no consume grant on this resource"
        refusals[kind] = outcome
    batch = secured.ok(bob, A, BY_NAME["AckBatch"].branch, {"tokens": [theirs.token, mine.token]})
    assert [(r.status, r.error_code) for r in batch.results] == [("rejected", DENIED), ("committed", None)]
    assert secured.meta(A, "other", "m1") == leased
    assert secured.meta(A, "jobs-a", "m1").state == "acked"
    secured.grant("bob", on_other)
    for kind, body in lease_commands(theirs.token):
        repeat, sealed = secured.submit_as(bob, A, kind, body, f"{kind}-other")
        assert repeat == refusals[kind] and sealed  # the stored refusal, at its first offset
    assert secured.meta(A, "other", "m1") == leased


def test_completing_a_group_delivery_needs_consume_on_its_topic(secured: Secured) -> None:
    """The group counterpart of the test above: once bob's consume grant on topic "news" is revoked,
    GroupAck of its token is refused (by the table row: GroupAck names its topic), and so is
    CompleteProcessing naming the same topic, group and token (it acks that delivery). The table row of
    CompleteProcessing names no resource, so only its handler can check the topic: a refusal it stores."""
    secured.ok(secured.admin, A, CREATE_TOPIC, create_topic_body("news"))
    secured.ok(secured.admin, A, PUBLISH, publish_body("news", event("e1")))
    secured.ok(secured.admin, A, CREATE_GROUP, create_group_body("news", "g"))
    on_news = can(Capability.consume, resource="news")
    bob = secured.principal("bob", can(Capability.consume, resource="jobs"), on_news)
    received = typed(secured.ok(bob, A, GROUP_RECEIVE, group_receive_body("news", "g")), GroupReceiveResult)
    [delivery] = received.deliveries
    secured.revoke("bob", on_news)
    secured.refused(bob, A, GROUP_ACK, {"topic": "news", "group": "g", "token": delivery.token}, stored=False)
    complete = {
        "token": delivery.token,
        "handler_scope": "billing",
        "execution_generation": 0,
        "effects": [],
        "topic": "news",
        "group": "g",
    }
    secured.refused(bob, A, COMPLETE_PROCESSING, complete, stored=True)


WHOLE_DOMAIN: dict[str, tuple[Capability, dict[str, Any]]] = {
    # Rows naming no resource, whose handler checks none: their capability on every resource ("*").
    "ListDocuments": (Capability.documents_read, list_documents_body(prefix="public-")),
    "ConfigureInbox": (Capability.resource_manage, {"max_receipts": 10, "max_bytes": 100_000}),
    "ConfigureDomain": (
        Capability.resource_manage,
        {"outcome_horizon_ms": 60_000, "receipt_horizon_ms": None, "expected_policy_version": None},
    ),
    "InspectDomain": (Capability.inspect, {}),
    "ListQueues": (Capability.inspect, {"prefix": "public", "after": None, "max_queues": None}),
    "ListTopics": (Capability.inspect, {"prefix": "", "after": None, "max_topics": None}),
    "CommitInbox": (
        Capability.inbox_write,
        {
            "source": {"domain": B, "queue": "jobs", "message_id": "m1", "delivery_generation": 1},
            "handler_scope": "billing",
            "execution_generation": 0,
            "effects": [],
        },
    ),
}


@pytest.mark.parametrize("name", sorted(WHOLE_DOMAIN))
def test_a_command_naming_no_resource_needs_its_capability_on_every_resource(secured: Secured, name: str) -> None:
    """A grant of the capability on some resources of the domain does not reach a command of the
    whole domain (ListDocuments reads every key; an inbox is the domain's): refused by the table row,
    not stored; with the capability on "*" the same command under the same id applies."""
    capability, body = WHOLE_DOMAIN[name]
    branch = BY_NAME[name].branch
    assert BY_NAME[name].resource is None and not BY_NAME[name].resource_in_handler
    secured.ok(secured.admin, A, PUT_DOCUMENT, put_document_body("public-1", b"open"))
    secured.ok(secured.admin, A, CONFIGURE_INBOX, {"max_receipts": 10, "max_bytes": 100_000})
    some = can(capability, resource="public-*")
    reader = secured.principal("reader", some, can(capability, domain="*", resource="public*"))
    outcome = secured.refused(reader, A, branch, body, command_id=f"{name}-1", stored=False)
    assert outcome.detail == f"the principal holds no {capability.value} grant on every resource of this domain"
    secured.grant("reader", can(capability, domain="acme*"))
    applied, sealed = secured.submit_as(reader, A, branch, body, f"{name}-1")
    assert (applied.status, sealed) == ("committed", True) and applied.offset > outcome.offset, applied
    if name == "ListDocuments":
        page = typed(applied.result, DocumentPage)
        assert [document.key for document in page.documents] == ["public-1"], page


def test_a_documents_read_grant_on_some_keys_reads_them_but_lists_none(secured: Secured) -> None:
    """documents_read on "public-*": GetDocument of a public key is answered, of another refused, and
    ListDocuments refused whatever its prefix (it names no key a grant could be matched against)."""
    for key in ("public-1", "secret-1"):
        secured.ok(secured.admin, A, PUT_DOCUMENT, put_document_body(key, key.encode()))
    reader = secured.principal("reader", can(Capability.documents_read, resource="public-*"))
    assert secured.ok(reader, A, GET_DOCUMENT, {"key": "public-1"}).value == b"public-1"
    secured.refused(reader, A, GET_DOCUMENT, {"key": "secret-1"}, stored=False)
    for prefix in ("public-", "", "secret-"):
        listed = secured.refused(reader, A, LIST_DOCUMENTS, list_documents_body(prefix=prefix), stored=False)
        assert listed.detail == "the principal holds no documents_read grant on every resource of this domain"


def bogus_proof(reservation_id: int) -> dict[str, Any]:
    """A commit proof of the right shape, signed by nobody: a commit checks its sender first."""
    return {
        "domain": A,
        "reservation_id": reservation_id,
        "object_key": "payloads/none",
        "object_version": "v1",
        "length": 4,
        "sha256": bytes(32),
        "trust_set_version": 1,
        "key_id": "k0",
        "attested_at_ms": 0,
        "signature": bytes(64),
    }


def test_a_reservation_command_checks_the_queue_of_the_reservation(secured: Secured) -> None:
    """CommitLargeSchedule, CancelLargeSchedule and InspectReservation name a reservation, not a queue:
    any grant of their capability on the domain lets them reach the handler, which checks the
    reservation's queue (enqueue to commit or cancel, inspect to inspect) and stores its refusal. Without
    the capability anywhere in the domain, the table row refuses (not stored)."""
    reserved: dict[str, int] = {}
    for queue in ("media", "other"):
        secured.queue(A, queue)
        receipt = secured.ok(secured.admin, A, PREPARE, prepare_body(f"big-{queue}", b"data", queue=queue))
        reserved[queue] = typed(receipt, PayloadReservation).reservation_id
    on_media = [can(Capability.enqueue, resource="media"), can(Capability.inspect, resource="media")]
    bob = secured.principal("bob", *on_media)
    theirs = reserved["other"]
    refusals = {
        INSPECT_RESERVATION: ({"reservation_id": theirs}, "inspect"),
        CANCEL_LARGE: ({"reservation_id": theirs}, "enqueue"),
        COMMIT: ({"reservation_id": theirs, "proof": bogus_proof(theirs)}, "enqueue"),
    }
    for kind, (body, capability) in refusals.items():
        outcome = secured.refused(bob, A, kind, body, stored=True)
        assert outcome.detail == f"the principal holds no {capability} grant on this resource"
    mine = {"reservation_id": reserved["media"]}
    assert typed(secured.ok(bob, A, INSPECT_RESERVATION, mine), PayloadReservation).state == "reserved"
    assert typed(secured.ok(bob, A, CANCEL_LARGE, mine), PayloadReservation).state == "cancelled"
    untouched = secured.ok(secured.admin, A, INSPECT_RESERVATION, {"reservation_id": theirs})
    assert typed(untouched, PayloadReservation).state == "reserved"

    carol = secured.principal("carol", can(Capability.consume))
    for kind, (body, capability) in refusals.items():
        outcome = secured.refused(carol, A, kind, body, stored=False)
        assert outcome.detail == f"the principal holds no {capability} grant on this domain"


# -- 5. system commands -----------------------------------------------------------------------------------


def retention_bodies(floor: int) -> dict[str, dict[str, Any]]:
    return {
        "AdvanceRecoveryFloor": {"floor_offset": floor},
        "DeleteConfirmed": {"task_id": 1, "deleted_versions": []},
        "BeginDelete": {"task_id": 1},
        "ListRetention": {"after_task": None, "limit": None},
    }


def published_checkpoint(secured: Secured, partition: int) -> int:
    """The offset of a checkpoint of `partition` taken and recorded as published (CheckpointPublished,
    signed by the checkpoint publisher, as `keyload run` records each): a floor may be set there."""
    taken = typed(secured.ok(secured.admin, secured.system_domain(partition), CHECKPOINT, {}), CheckpointResult)
    entry = secured.embedded.processors[partition].last_checkpoint
    assert entry is not None and entry.offset == taken.offset
    Announcer(secured.embedded.log, system_credential(secured.root, CHECKPOINTER_PRINCIPAL))(partition, entry)
    secured.embedded.run()
    assert secured.halts() == []
    return entry.offset


def test_retention_commands_need_recovery_on_every_domain(secured: Secured) -> None:
    """An administrator of one domain (holding recovery on it too) is refused the GC worker's
    commands, and the recovery floor stays; keyload-gc's pass authorization (BeginDelete and
    DeleteConfirmed then find no task 1)."""
    ops = secured.principal("ops", can(Capability.admin), can(Capability.recovery, domain="acme*"))
    secured.ok(ops, A, CREATE_QUEUE, create_queue_body("jobs"))  # it administers its domain
    partition = secured.embedded.partition(A)
    system = secured.system_domain(partition)
    store = secured.embedded.stores[partition]
    floor = published_checkpoint(secured, partition)
    for name, body in retention_bodies(floor).items():
        outcome = secured.refused(ops, system, BY_NAME[name].branch, body, stored=False)
        assert outcome.detail == "the principal holds no recovery grant on every domain"
        assert store.get(keys.RECOVERY_FLOOR) is None

    advanced = secured.ok(secured.gc, system, BY_NAME["AdvanceRecoveryFloor"].branch, {"floor_offset": floor})
    assert keys.read_u64(typed(store.get(keys.RECOVERY_FLOOR), bytes)) == floor
    listed = secured.ok(secured.gc, system, BY_NAME["ListRetention"].branch, retention_bodies(floor)["ListRetention"])
    assert typed(listed, RetentionPage) == advanced
    for name in ("BeginDelete", "DeleteConfirmed"):
        secured.refused(secured.gc, system, BY_NAME[name].branch, retention_bodies(floor)[name], code="NotFound")
    secured.refused(secured.gc, A, CREATE_QUEUE, create_queue_body("mine"))  # recovery is all it holds


def test_an_administrator_of_one_domain_cannot_change_principals(secured: Secured) -> None:
    """Principal commands are partition-wide: admin on one domain neither grants itself more nor reads
    another principal (whoami it may)."""
    ops = secured.principal("ops", can(Capability.admin))
    system = secured.system_domain(0)
    escalate = {"principal": "ops", "grant": can(Capability.admin, domain="*").to_avro()}
    assert secured.refused(ops, system, GRANT_CAPABILITY, escalate, stored=False).detail.endswith("on every domain")
    secured.refused(ops, system, INSPECT_PRINCIPAL, {"principal": ADMIN_PRINCIPAL}, stored=False)
    me = typed(secured.ok(ops, system, INSPECT_PRINCIPAL, {"principal": None}), PrincipalView)
    assert me.principal.grants == [can(Capability.admin)]


def test_from_level_11_a_change_to_a_missing_principal_is_not_found_and_patterns_hold_no_control_character(
    secured: Secured,
) -> None:
    """`keyload principal disable ghost` was a Validation ("a new principal needs a key_id") while a
    grant to ghost was NotFound; a pattern with a NUL was taken, and a revoke of a pattern no grant
    can hold passed quietly. Level 11 (processors/features.py) makes them NotFound and Validation;
    below it a log replays as it was written."""
    system = secured.system_domain(0)
    disable = {"principal": "ghost", "key_id": None, "enabled": False, "grants": None, "expected_revision": None}
    nul_grant = {"capability": "consume", "domain": "a\x00", "resource": "*"}
    alice = secured.principal("alice")
    odd_grant = {"principal": "alice", "grant": nul_grant}
    starred = {"principal": "alice", "grant": {"capability": "consume", "domain": "*a*", "resource": "*"}}
    before = secured.refused(secured.admin, system, PUT_PRINCIPAL, disable, "Validation")
    assert before.detail == "a new principal needs a key_id"
    secured.ok(secured.admin, system, GRANT_CAPABILITY, odd_grant)  # level 0: taken as given
    secured.ok(secured.admin, system, REVOKE_CAPABILITY, starred)  # level 0: held by nobody, a quiet no-op

    secured.everywhere("RaiseFeatureLevel", {"level": PRINCIPALS_CHECKED})

    def epochs() -> list[int | None]:
        return [policy_epoch(secured.embedded.store(secured.system_domain(p))) for p in range(PARTITIONS)]

    policy = epochs()

    def refused(kind: str, body: dict[str, Any], code: str) -> str:
        outcome, _ = secured.submit_as(secured.admin, system, kind, body)
        assert (outcome.status, outcome.error_code) == ("rejected", code), outcome
        return outcome.detail or ""

    assert refused(PUT_PRINCIPAL, disable, "NotFound") == "no such principal (creating one takes a key_id)"
    new_odd = {"principal": "alice", "grant": nul_grant | {"domain": "b\x01"}}
    assert refused(GRANT_CAPABILITY, new_odd, "Validation") == "a grant pattern has no control characters"
    assert refused(REVOKE_CAPABILITY, starred, "Validation") == "a grant pattern has '*' only at its end"
    ghost = {"principal": "gh\tost", "key_id": alice.key_id, "enabled": None, "grants": [], "expected_revision": 0}
    assert refused(PUT_PRINCIPAL, ghost, "Validation") == "a principal's name has no control characters"
    assert epochs() == policy  # nothing refused changed the policy
    # The grant taken before the raise stays: other grants are added beside it, and it can be revoked.
    clean = {"principal": "alice", "grant": nul_grant | {"domain": "a"}}
    secured.ok(secured.admin, system, GRANT_CAPABILITY, clean)
    view = typed(secured.ok(secured.admin, system, REVOKE_CAPABILITY, odd_grant), PrincipalView)
    assert [grant.domain for grant in view.principal.grants] == ["a"]
    keyring.add(secured.root, "k-zoe")  # a name beyond ASCII but without a control character is taken
    assert secured.ok(secured.admin, system, PUT_PRINCIPAL, disable | {"principal": "Zoë\u00a0", "key_id": "k-zoe"})


def test_from_level_17_a_principal_never_takes_back_a_key_it_was_rotated_from(secured: Secured) -> None:
    """A rotation may retire a key because it leaked; a rotation repeated by its command id past the
    receipt horizon (its id new again) named the key derived from that id, one the principal had been
    rotated from, and took it back. Level 17 refuses it; below it a log replays as written."""
    system = secured.system_domain(0)
    alice = secured.principal("alice")
    keyring.add(secured.root, "k-alice-2")
    put = {"principal": "alice", "key_id": None, "enabled": None, "grants": None, "expected_revision": None}
    for key_id in ("k-alice-2", alice.key_id, "k-alice-2"):  # below level 17: taken back
        secured.ok(secured.admin, system, PUT_PRINCIPAL, put | {"key_id": key_id})
    secured.everywhere("RaiseFeatureLevel", {"level": RETIRED_KEYS_REFUSED})
    refused, _ = secured.submit_as(secured.admin, system, PUT_PRINCIPAL, put | {"key_id": alice.key_id})
    assert (refused.status, refused.error_code, refused.detail) == (
        "rejected",
        "Conflict",
        "the key id is one the principal held before: retired keys never return",
    )
    view = typed(secured.ok(secured.admin, system, PUT_PRINCIPAL, put | {"key_id": "k-alice-2"}), PrincipalView)
    assert view.principal.key_id == "k-alice-2"  # the key in force is no retired one


@pytest.mark.parametrize(("actor", "capability"), list(SERVICE_ACTORS.items()))
def test_from_level_18_the_services_actors_keep_acting(secured: Secured, actor: str, capability: Capability) -> None:
    """The service signs its Ticks, GC passes and checkpoint records as its actors, with fixed keys: a
    change of an actor's key, a disable, or the loss of its capability on every domain would have its
    commands refused for good (no lease, delay or long poll would run out). Level 18 refuses each,
    Conflict, and nothing moves; another grant beside it is a change like any other. Below it a log
    replays as written: the disable applies."""
    system = secured.system_domain(0)
    keyring.add(secured.root, f"k-{actor}-2")
    everything = can(capability, domain="*")
    put = {"principal": actor, "key_id": None, "enabled": None, "grants": None, "expected_revision": None}
    changes = [
        (PUT_PRINCIPAL, put | {"key_id": f"k-{actor}-2"}),
        (PUT_PRINCIPAL, put | {"enabled": False}),
        (PUT_PRINCIPAL, put | {"grants": [can(capability, domain="shop").to_avro()]}),
        (REVOKE_CAPABILITY, {"principal": actor, "grant": everything.to_avro()}),
    ]
    secured.everywhere("RaiseFeatureLevel", {"level": SERVICE_ACTORS_KEPT})
    inspect = BY_NAME["InspectPrincipal"].branch
    before = secured.ok(secured.admin, system, inspect, {"principal": actor})
    for kind, body in changes:
        outcome, _ = secured.submit_as(secured.admin, system, kind, body)
        assert (outcome.status, outcome.error_code, outcome.detail) == (
            "rejected",
            "Conflict",
            f"the service signs its {capability.value} commands as {actor}: it keeps its key, stays enabled "
            f"and keeps {capability.value} on every domain",
        )
    assert secured.ok(secured.admin, system, inspect, {"principal": actor}) == before
    extra = can(Capability.inspect, domain="*").to_avro()
    view = typed(
        secured.ok(secured.admin, system, BY_NAME["GrantCapability"].branch, {"principal": actor, "grant": extra}),
        PrincipalView,
    )
    assert (view.principal.key_id, view.principal.enabled) == (system_key_id(actor), True)


def test_from_level_18_an_actor_given_another_key_below_it_takes_its_fixed_key_back(secured: Secured) -> None:
    """The mend for what level 18 prevents: an actor given another key below it (its commands refused
    since) may take its fixed key back, though it held it before (retired keys return for no one
    else), and may not take a third; its commands are taken again."""
    system = secured.system_domain(0)
    for key_id in ("k-ticker-2", "k-ticker-3"):
        keyring.add(secured.root, key_id)
    put = {"principal": TICKER_PRINCIPAL, "key_id": "k-ticker-2", "enabled": None, "grants": None}
    secured.ok(secured.admin, system, PUT_PRINCIPAL, put | {"expected_revision": None})
    ticker, tick = system_credential(secured.root, TICKER_PRINCIPAL), BY_NAME["Tick"].branch
    refused_tick, _ = secured.submit_as(ticker, system, tick, {})
    assert (refused_tick.status, refused_tick.error_code) == ("rejected", "PermissionDenied")
    secured.everywhere("RaiseFeatureLevel", {"level": SERVICE_ACTORS_KEPT})
    refused, _ = secured.submit_as(
        secured.admin, system, PUT_PRINCIPAL, put | {"key_id": "k-ticker-3", "expected_revision": None}
    )
    assert (refused.status, refused.error_code) == ("rejected", "Conflict")
    fixed = system_key_id(TICKER_PRINCIPAL)
    mended = typed(
        secured.ok(secured.admin, system, PUT_PRINCIPAL, put | {"key_id": fixed, "expected_revision": None}),
        PrincipalView,
    )
    assert mended.principal.key_id == fixed
    taken, _ = secured.submit_as(ticker, system, tick, {})
    assert taken.status == "committed"


def test_below_level_18_an_actor_disabled_stops_acting(secured: Secured) -> None:
    """What level 18 prevents: below it the ticker can be disabled, and its next Tick is refused."""
    system = secured.system_domain(0)
    put = {"principal": TICKER_PRINCIPAL, "key_id": None, "enabled": False, "grants": None, "expected_revision": None}
    view = typed(secured.ok(secured.admin, system, PUT_PRINCIPAL, put), PrincipalView)
    assert view.principal.enabled is False
    ticker = system_credential(secured.root, TICKER_PRINCIPAL)
    tick, _ = secured.submit_as(ticker, system, BY_NAME["Tick"].branch, {})
    assert (tick.status, tick.error_code) == ("rejected", "PermissionDenied")


def test_the_last_administrator_cannot_be_disabled_or_lose_admin(secured: Secured) -> None:
    """Nobody could change the policy again: disabling it, revoking its grant or replacing its grants is
    a Conflict and nothing moves, while no other enabled principal holds admin on every domain (an
    admin of one domain does not count, nor a disabled one); then the first one may go, and the
    other administers."""
    system = secured.system_domain(0)
    everything = can(Capability.admin, domain="*")
    put = {"principal": ADMIN_PRINCIPAL, "key_id": None, "enabled": None, "grants": None, "expected_revision": None}
    changes = [
        (PUT_PRINCIPAL, put | {"enabled": False}),
        (PUT_PRINCIPAL, put | {"grants": [can(Capability.admin).to_avro()]}),
        (REVOKE_CAPABILITY, {"principal": ADMIN_PRINCIPAL, "grant": everything.to_avro()}),
    ]

    def all_refused() -> None:
        for kind, body in changes:
            outcome = secured.refused(secured.admin, system, kind, body, "Conflict", stored=True)
            assert "no enabled principal with admin on every domain" in (outcome.detail or "")

    all_refused()
    secured.principal("tenant-admin", can(Capability.admin))  # admin of domain A only
    root = secured.principal("root", everything)
    secured.put("root", enabled=False)
    all_refused()
    secured.put("root", enabled=True)
    secured.put(ADMIN_PRINCIPAL, enabled=False)
    secured.refused(secured.admin, A, ENQUEUE, enqueue_body("jobs", "m1"), DENIED)
    secured.everywhere("PutPrincipal", put | {"enabled": True}, credential=root)  # root administers
    secured.ok(secured.admin, system, INSPECT_PRINCIPAL, {"principal": "root"})


def test_rotate_keys_needs_admin_on_every_domain(secured: Secured) -> None:
    ops = secured.principal("ops", can(Capability.admin))
    worker = secured.principal("worker", can(Capability.consume, domain="*"), can(Capability.enqueue, domain="*"))
    rotate = {"token_key_id": "k-missing", "jitter_key_id": None, "proof_key_id": None}
    for caller in (ops, worker):
        for partition in range(PARTITIONS):
            # Refused before the handler looks for the key: the partition does not halt.
            secured.refused(caller, secured.system_domain(partition), ROTATE_KEYS, rotate, stored=False)


def test_rotate_keys_refuses_a_key_that_is_or_was_a_principals(secured: Secured) -> None:
    """A principal's key (its holder could sign tokens with it) never becomes a service key, nor does
    one it was rotated away from: Validation, and the active keys stay."""
    alice = secured.principal("alice", can(Capability.consume))
    old = alice.key_id
    new = new_credential(secured.root, "alice")
    secured.put("alice", key_id=new.key_id)
    system = secured.system_domain(0)
    keep = {"token_key_id": None, "jitter_key_id": None, "proof_key_id": None}
    active = typed(secured.ok(secured.admin, system, ROTATE_KEYS, keep), ActiveKeys)
    for key_id in (old, new.key_id, secured.admin.key_id):
        for purpose in ("token_key_id", "jitter_key_id", "proof_key_id"):
            outcome = secured.refused(secured.admin, system, ROTATE_KEYS, {**keep, purpose: key_id}, code="Validation")
            assert outcome.detail == f"{purpose} names a principal's key: its holder could sign with it"
    assert typed(secured.ok(secured.admin, system, ROTATE_KEYS, keep), ActiveKeys) == active


def test_enable_access_control_naming_a_key_the_keyring_lacks_is_refused_not_a_halt(tmp_path: Path) -> None:
    """Before access control anyone may append: EnableAccessControl signed for a principal whose key id
    the keyring lacks is PermissionDenied (published, unsealed), the partition serves on with access
    control off, and the service's own EnableAccessControl then applies. It is not stored: a repeat
    is applied again (Conflict once on) and takes no command id either."""
    embedded = Embedded(tmp_path / "data", partitions=1)
    try:
        system = domain_for_partition(0, 1)
        stranger = Credential("root", "p-not-in-the-keyring", os.urandom(32))
        spec = {"principal": "root", "key_id": stranger.key_id, "grants": [can(Capability.admin, "*").to_avro()]}
        enable = BY_NAME["EnableAccessControl"].branch
        outcome = embedded.submit(system, enable, {"principals": [spec]}, "enable-1", credential=stranger)
        assert (outcome.status, outcome.error_code) == ("rejected", DENIED), outcome
        assert outcome.detail == "the signer must be a principal the command installs, with a key of the keyring"
        assert [p.halt for p in embedded.processors] == [None]
        assert policy_epoch(embedded.stores[0]) is None and embedded.stored_outcome(system, "enable-1") is None

        # The service's own command, as enable_command makes it, but replied to on partition 0.
        genuine = REGISTRY.decode("keyload.Command", contents(enable_command(embedded.data.root, 0, 1)))
        admin = system_credential(embedded.data.root, ADMIN_PRINCIPAL)
        answers = [embedded.submit(system, enable, genuine["body"][1], "enable-2", credential=admin) for _ in range(2)]
        assert [(o.status, o.error_code) for o in answers] == [("committed", None), ("rejected", "Conflict")]
        assert answers[1].detail == "access control is already on in this partition"
        assert [p.halt for p in embedded.processors] == [None]
        assert policy_epoch(embedded.stores[0]) == 1 and embedded.stored_outcome(system, "enable-2") is None
    finally:
        embedded.close()


def test_a_principal_command_naming_a_key_the_keyring_lacks_halts_until_the_key_is_added(secured: Secured) -> None:
    """PutPrincipal (as GrantCapability or RevokeCapability would, for a principal whose key is gone)
    naming a key id the keyring lacks is not refused: the processor reloads the keyring, still finds no
    key, and halts the partition with RecoveryRequired naming the key, at the command's offset: the
    commands before it in the same group commit, as before any halt. Once the key is in the keyring,
    a restarted processor applies it."""
    partition = 0
    system = secured.system_domain(partition)
    processor = secured.embedded.processors[partition]
    applied = processor.applied_offset
    for n in range(2):  # read in one group with the command that halts
        look = secured.signed(secured.admin, system, INSPECT_PRINCIPAL, {"principal": ADMIN_PRINCIPAL}, f"look-{n}")
        secured.embedded.append(system, look)
    body = {"principal": "late", "key_id": "p-missing", "enabled": None, "grants": [], "expected_revision": None}
    put = secured.signed(secured.admin, system, BY_NAME["PutPrincipal"].branch, body, "put-1")
    secured.embedded.append(system, put)
    secured.embedded.run()
    assert processor.halt is not None
    assert (processor.halt.offset, processor.halt.reason) == (
        applied + 3,
        "RecoveryRequired: keyring has no key 'p-missing'",
    )
    assert processor.applied_offset == applied + 2
    assert secured.embedded.processors[1 - partition].halt is None

    keyring.add(secured.root, "p-missing")
    data = secured.embedded.data
    secured.embedded.processors[partition] = PartitionProcessor(
        partition,
        PARTITIONS,
        secured.embedded.log,
        secured.embedded.stores[partition],
        secured.embedded.outcomes,
        checkpoints=secured.embedded.checkpoints,
        keyring=data.keyring(),
        keyring_loader=data.keyring,
    )
    secured.embedded.run()
    assert secured.halts() == []
    view = typed(secured.ok(secured.admin, system, INSPECT_PRINCIPAL, {"principal": "late"}), PrincipalView)
    assert (view.principal.key_id, view.principal.revision) == ("p-missing", 1)


def test_rotating_to_a_key_the_keyring_lacks_halts_the_partition_until_the_key_is_added(secured: Secured) -> None:
    """What happens: RotateKeys from the administrator naming a key the keyring lacks is not refused
    (whether a key exists is configuration: a processor holding it would decide otherwise). The
    processor reloads the keyring, still finds no key, and halts the partition with RecoveryRequired
    at the command's offset: no outcome is published, the command and everything after it in that
    partition wait, the other partition serves on. The halted processor stays halted when the key is
    then added; a restart (a new processor over the same projection) applies them
    (processors/key_rotation.py; keyload/service/runtime.py, PartitionProcessor.step)."""
    partition = 0
    system = secured.system_domain(partition)
    domain = next(d for d in (A, B, "initech", "umbrella") if secured.embedded.partition(d) == partition)
    other = next(d for d in (A, B, "initech", "umbrella") if secured.embedded.partition(d) != partition)
    secured.queue(domain, "jobs")
    secured.queue(other, "jobs")
    processor = secured.embedded.processors[partition]
    applied = processor.applied_offset
    cursor = secured.embedded.outcomes.end_offset(0)
    rotate = {"token_key_id": "k-missing", "jitter_key_id": None, "proof_key_id": None}
    secured.embedded.append(system, secured.signed(secured.admin, system, ROTATE_KEYS, rotate, "rotate-1"))
    secured.embedded.append(
        domain, secured.signed(secured.admin, domain, ENQUEUE, enqueue_body("jobs", "m1"), "after-1")
    )
    secured.embedded.run()
    halt = processor.halt
    assert halt is not None
    assert (halt.partition, halt.offset) == (partition, applied + 1)
    assert halt.reason == "RecoveryRequired: keyring has no key 'k-missing'"
    assert processor.applied_offset == applied
    published = [REGISTRY.decode(OUTCOME, contents(r.value)) for r in secured.embedded.outcomes.read(0, cursor, 100)]
    assert [o for o in published if o["command_id"] in ("rotate-1", "after-1")] == []
    assert secured.embedded.processors[1 - partition].halt is None
    assert typed(secured.ok(secured.admin, other, ENQUEUE, enqueue_body("jobs", "m1")), EnqueueResult).state == "ready"

    keyring.add(secured.root, "k-missing")
    secured.embedded.run()
    assert processor.halt == halt  # a halted processor tries nothing more: adding the key takes a restart
    data = secured.embedded.data
    restarted = PartitionProcessor(
        partition,
        PARTITIONS,
        secured.embedded.log,
        secured.embedded.stores[partition],
        secured.embedded.outcomes,
        checkpoints=secured.embedded.checkpoints,
        keyring=data.keyring(),
        keyring_loader=data.keyring,
    )
    secured.embedded.processors[partition] = restarted
    secured.embedded.run()
    assert secured.halts() == []
    answered = {
        o["command_id"]: o
        for o in (REGISTRY.decode(OUTCOME, contents(r.value)) for r in secured.embedded.outcomes.read(0, cursor, 100))
    }
    assert answered["rotate-1"]["status"] == answered["after-1"]["status"] == "committed"
    active = typed(secured.ok(secured.admin, system, ROTATE_KEYS, {**rotate, "token_key_id": None}), ActiveKeys)
    assert active.token_key_id == "k-missing"


# -- 6. authentication failures ------------------------------------------------------------------------------


def tampered(value: bytes, old: bytes, new: bytes) -> bytes:
    """A signed record whose command bytes were changed after signing (`old` to `new`, same length)."""
    signed = REGISTRY.decode(SIGNED, value)
    assert len(old) == len(new) and signed["record"].count(old) == 1
    return REGISTRY.encode(SIGNED, dict(signed, record=signed["record"].replace(old, new)))


FORGERIES: dict[str, Callable[[Secured, Credential, bytes], tuple[bytes, Credential | None]]] = {
    # (the record as appended, the credential its sender would check the outcome's seal with)
    "unsigned": lambda s, alice, raw: (raw, None),
    "tampered": lambda s, alice, raw: (tampered(alice.sign(raw), b"pay 10", b"pay 99"), alice),
    "unknown key id": lambda s, alice, raw: (Credential("alice", "p-unknown", os.urandom(32)).sign(raw), None),
    "right key id, wrong secret": lambda s, alice, raw: (
        Credential("alice", alice.key_id, os.urandom(32)).sign(raw),
        alice,
    ),
    "another principal's key": lambda s, alice, raw: (s.admin.sign(raw), s.admin),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_command_that_fails_authentication_is_refused_unsealed_and_unstored(secured: Secured, forgery: str) -> None:
    """Each refused with PermissionDenied, published unsealed, not stored (the id stays alice's to use),
    with no partition halted."""
    secured.queue(A, "jobs")
    alice = secured.principal("alice", can(Capability.enqueue))
    body = enqueue_body("jobs", "m1", b"pay 10")
    raw = command(A, ENQUEUE, body, "pay-1", principal="alice", reply_to=0)
    value, checker = FORGERIES[forgery](secured, alice, raw)
    secured.unauthenticated(value, A, "pay-1", checker)
    outcome, sealed = secured.deliver(alice.sign(raw), A, "pay-1", alice)
    assert outcome.status == "committed" and sealed, outcome
    assert secured.message(A, "jobs", "m1").body == b"pay 10"


def test_an_unknown_principal_is_refused(secured: Secured) -> None:
    """A key in the keyring (a credential file made) for a principal the policy never installed."""
    secured.queue(A, "jobs")
    ghost = new_credential(secured.root, "ghost")
    value = secured.signed(ghost, A, ENQUEUE, enqueue_body("jobs", "m1"), "ghost-1")
    assert secured.unauthenticated(value, A, "ghost-1", ghost).detail == UNKNOWN_SIGNER


def test_a_disabled_principal_is_refused_until_it_is_enabled_again(secured: Secured) -> None:
    """Refused as an unknown principal is (the detail does not tell them apart), and not stored."""
    secured.queue(A, "jobs")
    alice = secured.principal("alice", can(Capability.enqueue))
    secured.put("alice", enabled=False)
    value = secured.signed(alice, A, ENQUEUE, enqueue_body("jobs", "m1"), "while-disabled")
    assert secured.unauthenticated(value, A, "while-disabled", alice).detail == UNKNOWN_SIGNER
    secured.put("alice", enabled=True)
    outcome, sealed = secured.deliver(value, A, "while-disabled", alice)  # the very record, appended again
    assert outcome.status == "committed" and sealed, outcome


def test_a_disabled_principal_whose_key_the_keyring_lacks_is_refused_without_a_halt(secured: Secured) -> None:
    """Enabled is checked before the key is looked up: a disabled principal's command is refused even
    where the keyring (reloaded too) lacks its key, while an enabled principal's command there is not
    refused but halts the partition (a processor holding the key would decide otherwise)."""
    secured.queue(A, "jobs")
    alice = secured.principal("alice", can(Capability.enqueue))
    bob = secured.principal("bob", can(Capability.enqueue))
    secured.put("alice", enabled=False)
    full = secured.embedded.data.keyring()
    lacking = {key_id: key for key_id, key in full.items() if key_id not in (alice.key_id, bob.key_id)}
    for processor in secured.embedded.processors:
        processor.keyring = dict(lacking)
        processor.keyring_loader = lambda: lacking
    value = secured.signed(alice, A, ENQUEUE, enqueue_body("jobs", "m1"), "disabled-1")
    assert secured.unauthenticated(value, A, "disabled-1", alice).detail == UNKNOWN_SIGNER
    wrong = Credential("bob", alice.key_id, alice.secret)  # bob, enabled, but not with this key id
    value = secured.signed(wrong, A, ENQUEUE, enqueue_body("jobs", "m1"), "wrong-1")
    assert secured.unauthenticated(value, A, "wrong-1", None).detail == UNKNOWN_SIGNER

    processor = secured.embedded.processors[secured.embedded.partition(A)]
    applied = processor.applied_offset
    secured.embedded.append(A, secured.signed(bob, A, ENQUEUE, enqueue_body("jobs", "m1"), "enabled-1"))
    secured.embedded.run()
    assert processor.halt is not None
    assert (processor.halt.offset, processor.halt.reason) == (
        applied + 1,
        f"RecoveryRequired: keyring has no key {bob.key_id!r}, the key of principal 'bob'",
    )


def test_after_a_credential_rotation_the_old_key_is_refused(secured: Secured) -> None:
    secured.queue(A, "jobs")
    old = secured.principal("alice", can(Capability.enqueue))
    new = new_credential(secured.root, "alice")
    secured.put("alice", key_id=new.key_id)
    value = secured.signed(old, A, ENQUEUE, enqueue_body("jobs", "m1"), "rotated-1")
    secured.unauthenticated(value, A, "rotated-1", old)
    outcome, sealed = secured.submit_as(new, A, ENQUEUE, enqueue_body("jobs", "m1"), "rotated-1")
    assert outcome.status == "committed" and sealed, outcome
    assert not old.seals(secured.published)


def test_a_bad_domain_of_an_authenticated_sender_is_refused_sealed(secured: Secured) -> None:
    """A domain the rules refuse is checked before any handler runs, yet after authentication, so the
    Validation refusal is sealed for its sender (a client accepts no other) and takes no command id."""
    alice = secured.principal("alice", can(Capability.enqueue))
    outcome = secured.refused(alice, "Not A Domain!", ENQUEUE, enqueue_body("jobs", "m1"), "Validation", stored=False)
    assert (outcome.detail or "").startswith("domain must be")


def test_an_int_past_its_avro_type_from_an_authenticated_sender_is_refused_sealed(secured: Secured) -> None:
    """A foreign writer's 64-bit value in an int field of a kind whose canonical bytes are rebuilt (a
    ReadTopic's max_events) has no fingerprint: Validation, sealed for its sender, nothing stored."""
    alice = secured.principal("alice", can(Capability.topic_read))
    envelope = {
        "command_id": "wide-1",
        "domain": A,
        "principal": "alice",
        "body": (BY_NAME["ReadTopic"].branch, read_body("events", max_events=2**40)),
        "reply_to": 0,
        "client_time_ms": None,
    }
    outcome, sealed = secured.deliver(alice.sign(wide_command(envelope)), A, "wide-1", alice)
    assert (outcome.status, outcome.error_code, sealed) == ("rejected", "Validation", True), outcome
    assert "outside the range of its Avro type" in (outcome.detail or "")
    assert secured.embedded.stored_outcome(A, "wide-1") is None


# -- 7. repeats of stored outcomes -------------------------------------------------------------------------------


def test_a_repeat_is_answered_only_while_the_policy_allows_it(secured: Secured) -> None:
    """A stored outcome is re-authorized against the policy of now: refused (published, sealed, not
    stored) once the grant is revoked, the same stored outcome again once it is back."""
    secured.queue(A, "jobs", "m1")
    inspect = can(Capability.inspect)
    alice = secured.principal("alice", inspect)
    first, sealed = secured.submit_as(alice, A, INSPECT_QUEUE, {"queue": "jobs"}, "look-1")
    assert first.status == "committed" and sealed
    stored = secured.embedded.stored_outcome(A, "look-1")
    assert stored is not None
    secured.revoke("alice", inspect)
    refused, sealed = secured.submit_as(alice, A, INSPECT_QUEUE, {"queue": "jobs"}, "look-1")
    assert (refused.status, refused.error_code, sealed) == ("rejected", DENIED, True)
    assert secured.embedded.stored_outcome(A, "look-1") == stored
    secured.grant("alice", inspect)
    again, sealed = secured.submit_as(alice, A, INSPECT_QUEUE, {"queue": "jobs"}, "look-1")
    assert again == first and sealed
    assert again.offset == first.offset


def test_a_command_id_refused_for_lack_of_a_capability_is_still_unused(secured: Secured) -> None:
    """A principal without the capability cannot take a command id: its refusal is published (sealed
    for it) and not stored, so a later send under the id, once granted, applies fresh at a new offset,
    and only that outcome is stored and repeated."""
    secured.queue(A, "jobs")
    alice = secured.principal("alice", can(Capability.inspect))
    body = enqueue_body("jobs", "m1", b"once")
    first = secured.refused(alice, A, ENQUEUE, body, command_id="put-1", stored=False)
    assert first.detail == "the principal holds no enqueue grant on this resource"
    again = secured.refused(alice, A, ENQUEUE, body, command_id="put-1", stored=False)  # refused afresh
    assert again.offset > first.offset
    secured.grant("alice", can(Capability.enqueue, resource="jobs"))
    applied, sealed = secured.submit_as(alice, A, ENQUEUE, body, "put-1")
    assert (applied.status, sealed) == ("committed", True) and applied.offset > again.offset, applied
    assert secured.embedded.stored_outcome(A, "put-1") is not None
    assert secured.message(A, "jobs", "m1").body == b"once"
    repeat, sealed = secured.submit_as(alice, A, ENQUEUE, body, "put-1")
    assert repeat == applied and sealed


def test_a_used_command_id_is_authorized_before_it_is_compared(secured: Secured) -> None:
    """A repeat of a stored command id by a principal without the capability for the command it sends
    is PermissionDenied, not Conflict, even when the id was used for a different command: it learns
    nothing of the id's use. Holding the capability, it gets the Conflict."""
    secured.queue(A, "jobs")
    secured.queue(A, "other")
    alice = secured.principal("alice", can(Capability.inspect, resource="jobs"))
    mallory = secured.principal("mallory", can(Capability.enqueue))
    secured.ok(alice, A, INSPECT_QUEUE, {"queue": "jobs"}, "used-1")
    stored = secured.embedded.stored_outcome(A, "used-1")
    assert stored is not None
    attempts: list[tuple[Credential, dict[str, Any]]] = [
        (alice, {"queue": "other"}),  # alice, another queue she may not inspect
        (mallory, {"queue": "jobs"}),  # another principal, the very body: another command
    ]
    for credential, body in attempts:
        outcome = secured.refused(credential, A, INSPECT_QUEUE, body, command_id="used-1", stored=False)
        assert outcome.detail == "the principal holds no inspect grant on this resource"
        assert secured.embedded.stored_outcome(A, "used-1") == stored
    secured.grant("alice", can(Capability.inspect, resource="other"))
    secured.grant("mallory", can(Capability.inspect, resource="jobs"))
    for credential, body in attempts:
        conflict = secured.refused(credential, A, INSPECT_QUEUE, body, code="Conflict", command_id="used-1")
        assert conflict.detail == "command id was used for a different command"
        assert secured.embedded.stored_outcome(A, "used-1") == stored


def test_a_repeated_batch_is_reauthorized_like_its_mutations(secured: Secured) -> None:
    """The same rule for a Batch, whose table row names no capability (each mutation is checked as
    the command it is): once the principal lost enqueue, a repeat of its batch must not be answered
    with the stored outcome."""
    secured.queue(A, "jobs")
    enqueue = can(Capability.enqueue)
    alice = secured.principal("alice", enqueue)
    body = batch_body(mutation(ENQUEUE, enqueue_body("jobs", "m1")))
    first, _ = secured.submit_as(alice, A, BATCH, body, "batch-1")
    assert first.status == "committed"
    secured.revoke("alice", enqueue)
    repeat, _ = secured.submit_as(alice, A, BATCH, body, "batch-1")
    assert (repeat.status, repeat.error_code) == ("rejected", DENIED), repeat


def test_a_repeated_inspect_principal_is_reauthorized(secured: Secured) -> None:
    """InspectPrincipal's row names no capability either (its handler asks admin on every domain to read
    another principal): a repeat must not hand the stored view of the administrator to a principal
    that is no longer one."""
    ops = secured.principal("ops", can(Capability.admin, domain="*"))
    system = secured.system_domain(0)
    first, _ = secured.submit_as(ops, system, INSPECT_PRINCIPAL, {"principal": ADMIN_PRINCIPAL}, "who-1")
    assert first.status == "committed"
    secured.put("ops", grants=[])
    repeat, _ = secured.submit_as(ops, system, INSPECT_PRINCIPAL, {"principal": ADMIN_PRINCIPAL}, "who-1")
    assert (repeat.status, repeat.error_code) == ("rejected", DENIED), repeat


@pytest.mark.parametrize("change", ["disabled", "revoked"])
def test_a_waiting_receive_is_not_served_once_its_principal_may_no_longer_receive(
    secured: Secured, change: str
) -> None:
    """PRODUCT BUG (fails): a long-poll Receive authorized at its log position waits; then its principal
    is disabled (or loses its consume grant). A message enqueued later must not be leased to it nor its
    body published to it: the policy of now refuses it everything. processors/queues/leases.py
    `serve_waiters` claims for `waiter.principal` without looking at the policy (so does
    processors/groups/leases.py `serve_waiters` for a group's waiters)."""
    secured.queue(A, "jobs")
    consume = can(Capability.consume, resource="jobs")
    alice = secured.principal("alice", consume)
    cursor = secured.embedded.outcomes.end_offset(0)
    body = {"queue": "jobs", "max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": 10_000}
    secured.embedded.append(A, secured.signed(alice, A, RECEIVE, body, "wait-1"))
    secured.embedded.run()
    assert secured.embedded.stored_outcome(A, "wait-1") is not None  # waiting: its fingerprint only
    if change == "disabled":
        secured.put("alice", enabled=False)
    else:
        secured.revoke("alice", consume)
    secured.ok(secured.admin, A, ENQUEUE, enqueue_body("jobs", "m1", b"secret"))
    served = [
        decoded
        for decoded in (
            REGISTRY.decode(OUTCOME, contents(r.value)) for r in secured.embedded.outcomes.read(0, cursor, 1_000)
        )
        if decoded["command_id"] == "wait-1" and decoded["result"] is not None
    ]
    delivered = [d["message_id"] for o in served for d in o["result"][1]["deliveries"]]
    meta = secured.meta(A, "jobs", "m1")
    assert (delivered, meta.state, meta.lease_owner) == ([], "ready", None), (delivered, meta)


def test_waiters_answered_empty_count_against_serving_and_the_rest_are_served_next(secured: Secured) -> None:
    """Serving examines at most 64 waiters a pass. One whose principal lost its grant is answered empty
    and still counts, so a pass that examined 64 leaves a serve timer: the waiters behind are served
    by the next record, not left to their deadline beside ready messages."""
    secured.queue(A, "jobs")
    consume = can(Capability.consume, resource="jobs")
    alice = secured.principal("alice", consume)
    bob = secured.principal("bob", consume)
    body = {"queue": "jobs", "max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": 10_000}
    cursor = secured.embedded.outcomes.end_offset(0)
    secured.embedded.append(A, secured.signed(alice, A, RECEIVE, body, "alice-wait"))
    count = limits.MAX_WAITERS_SERVED + 6
    for i in range(count):
        secured.embedded.append(A, secured.signed(bob, A, RECEIVE, body, f"bob-wait-{i}"))
    secured.embedded.run()
    secured.revoke("alice", consume)
    enqueues = [mutation(ENQUEUE, enqueue_body("jobs", f"m{i}")) for i in range(count)]
    secured.ok(secured.admin, A, BATCH, batch_body(*enqueues))

    def served() -> int:
        answered = (
            REGISTRY.decode(OUTCOME, contents(r.value)) for r in secured.embedded.outcomes.read(0, cursor, 1_000)
        )
        return sum(1 for o in answered if o["command_id"].startswith("bob-wait-") and o["result"][1]["deliveries"])

    assert served() == limits.MAX_WAITERS_SERVED - 1  # alice's empty answer took a place
    secured.ok(secured.admin, A, TICK, {})
    assert served() == count


# -- 8. batches and processings ---------------------------------------------------------------------------------


def test_a_batch_mutation_without_its_capability_rejects_the_whole_batch(secured: Secured) -> None:
    """Refused as the authorization of its table row is (each mutation as the command it is): the
    refusal is not stored, and once the grant is there the same batch under the same id applies."""
    secured.queue(A, "jobs")
    secured.ok(secured.admin, A, CREATE_TOPIC, create_topic_body("news"))
    worker = secured.principal("worker", can(Capability.enqueue))
    body = batch_body(
        mutation(ENQUEUE, enqueue_body("jobs", "m1")),
        mutation(PUBLISH, publish_body("news", event("e1"))),
    )
    outcome = secured.refused(worker, A, BATCH, body, command_id="batch-1", stored=False)
    assert outcome.failed_index == 1
    assert outcome.detail == "mutation 1: the principal holds no topic_publish grant on this resource"
    secured.grant("worker", can(Capability.topic_publish, resource="news"))
    again, sealed = secured.submit_as(worker, A, BATCH, body, "batch-1")  # the same batch, now allowed
    assert (again.status, sealed) == ("committed", True) and again.offset > outcome.offset, again
    assert secured.meta(A, "jobs", "m1").state == "ready"


def test_a_processing_effect_without_its_capability_refuses_the_processing(secured: Secured) -> None:
    """The effect is authorized before the handler runs; its refusal is not stored, so the command id
    stays unused: another processing of the delivery under it applies."""
    secured.queue(A, "jobs", "m1")
    worker = secured.principal("worker", can(Capability.consume), can(Capability.enqueue))
    delivery = secured.receive(worker, A, "jobs")
    leased = secured.meta(A, "jobs", "m1")
    complete = {
        "token": delivery.token,
        "handler_scope": "billing",
        "execution_generation": 0,
        "effects": [mutation(PUT_DOCUMENT, put_document_body("invoice-1"))],
        "topic": None,
        "group": None,
    }
    outcome = secured.refused(worker, A, COMPLETE_PROCESSING, complete, command_id="complete-1", stored=False)
    assert (outcome.failed_index, outcome.detail) == (
        0,
        "mutation 0: the principal holds no documents_write grant on this resource",
    )
    assert secured.meta(A, "jobs", "m1") == leased
    secured.refused(secured.admin, A, GET_DOCUMENT, {"key": "invoice-1"}, code="NotFound")
    allowed = {**complete, "effects": [mutation(ENQUEUE, enqueue_body("jobs", "m2"))]}
    receipt = typed(secured.ok(worker, A, COMPLETE_PROCESSING, allowed, "complete-1"), ProcessingResult)
    assert not receipt.already_processed
    assert secured.meta(A, "jobs", "m1").state == "acked"


# -- 9. tokens minted by a client -------------------------------------------------------------------------------


def minted(credential: Credential, queue: str, message_id: str, like: str) -> str:
    """A delivery token for `credential`'s principal, signed with its own credential secret (a client
    has no token key), naming the lease `like` (a token the service issued) names."""
    genuine = tokens.parse(like)
    return tokens.issue(
        {credential.key_id: credential.secret},
        credential.key_id,
        domain=A,
        queue=queue,
        incarnation=genuine.incarnation,
        message_id=message_id,
        principal=credential.principal,
        delivery_generation=genuine.delivery_generation,
        lease_version=genuine.lease_version,
    )


def test_a_token_minted_with_a_credential_secret_is_invalid(secured: Secured) -> None:
    secured.queue(A, "jobs", "m1")
    worker = secured.principal("worker", can(Capability.consume))
    delivery = secured.receive(worker, A, "jobs")
    forged = minted(worker, "jobs", "m1", delivery.token)
    secured.refused(worker, A, ACK, {"token": forged}, code="TokenInvalidated")
    assert secured.meta(A, "jobs", "m1").state == "leased"


def test_a_minted_token_cannot_settle_another_principals_lease(secured: Secured) -> None:
    """The same forgery aimed at alice's lease: mallory needs only what she can guess (the queue's
    incarnation, generation 1, lease version 1) and her own credential."""
    secured.queue(A, "jobs", "m1")
    alice = secured.principal("alice", can(Capability.consume))
    mallory = secured.principal("mallory", can(Capability.consume))
    delivery = secured.receive(alice, A, "jobs")
    assert tokens.parse(delivery.token).incarnation == 1 and tokens.parse(delivery.token).lease_version == 1
    forged = minted(mallory, "jobs", "m1", delivery.token)
    secured.refused(mallory, A, ACK, {"token": forged}, code="TokenInvalidated")
    assert secured.meta(A, "jobs", "m1").lease_owner == "alice"


def test_a_payload_proof_minted_by_a_client_cannot_commit(secured: Secured) -> None:
    """A producer that uploaded nothing signs a PayloadCommitProof itself, with the only secret it has
    (its credential's): under its own key id, and under the reservation's trust-set key id. Both are
    TokenInvalidated, and the reservation stays reserved, its quota held."""
    secured.queue(A, "media")
    producer = secured.principal("producer", can(Capability.enqueue), can(Capability.inspect))
    body = prepare_body("ghost", b"never uploaded", queue="media")
    receipt = typed(secured.ok(producer, A, PREPARE, body), PayloadReservation)
    refusals = {
        producer.key_id: "the proof is not signed by the reservation's trust set",
        receipt.trust_key_id: "the proof's signature is not valid",
    }
    for key_id, detail in refusals.items():
        proof: dict[str, Any] = {
            "domain": A,
            "reservation_id": receipt.reservation_id,
            "object_key": receipt.object_key,
            "object_version": "v1",
            "length": receipt.length,
            "sha256": receipt.sha256,
            "trust_set_version": receipt.trust_set_version,
            "key_id": key_id,
            "attested_at_ms": 0,
        }
        proof["signature"] = proofs.sign(producer.secret, proof)
        commit = {"reservation_id": receipt.reservation_id, "proof": proof}
        assert secured.refused(producer, A, COMMIT, commit, "TokenInvalidated", stored=True).detail == detail
    inspect = {"reservation_id": receipt.reservation_id}
    assert typed(secured.ok(producer, A, INSPECT_RESERVATION, inspect), PayloadReservation).state == "reserved"
    counters = typed(secured.ok(secured.admin, A, INSPECT_QUEUE, {"queue": "media"}), QueueView).counters
    assert (counters.stored_messages, counters.reserved_messages, counters.reserved_bytes) == (
        0,
        1,
        len(b"never uploaded"),
    )


# -- 10. replay determinism ---------------------------------------------------------------------------------


def test_replay_and_a_drill_from_a_checkpoint_reproduce_a_workload_with_refusals(
    secured: Secured, tmp_path: Path
) -> None:
    secured.queue(A, "jobs", "m1", "m2")
    secured.queue(B, "jobs", "m1")
    alice = secured.principal("alice", can(Capability.consume), can(Capability.inspect))
    mallory = secured.principal("mallory", can(Capability.consume))
    delivery = secured.receive(alice, A, "jobs")
    secured.refused(mallory, A, ACK, {"token": delivery.token})
    secured.refused(alice, B, RECEIVE, receive_body("jobs"))
    secured.unauthenticated(secured.signed(None, A, RECEIVE, receive_body("jobs"), "anon-1"), A, "anon-1", None)
    spoof = secured.signed(mallory, A, RECEIVE, receive_body("jobs"), "spoof-1", principal="alice")
    secured.unauthenticated(spoof, A, "spoof-1", mallory)

    partition = secured.embedded.partition(A)
    checkpoint = typed(secured.ok(secured.admin, secured.system_domain(partition), CHECKPOINT, {}), CheckpointResult)
    taken = secured.embedded.processors[partition].last_checkpoint
    assert taken is not None and taken.offset == checkpoint.offset

    secured.ok(alice, A, ACK, {"token": delivery.token})
    secured.ok(alice, A, INSPECT_QUEUE, {"queue": "jobs"}, "look-1")
    secured.revoke("alice", can(Capability.inspect))
    secured.refused(alice, A, INSPECT_QUEUE, {"queue": "jobs"}, command_id="look-1")
    secured.put("alice", enabled=False)
    secured.unauthenticated(secured.signed(alice, A, RECEIVE, receive_body("jobs"), "off-1"), A, "off-1", alice)
    secured.refused(secured.gc, A, CREATE_QUEUE, create_queue_body("other"))

    for domain in (A, B):
        assert_replay_equals_live(secured.embedded, domain, tmp_path / domain)
    report = drill(secured.embedded.data, partition, tmp_path / "drill", taken.offset, progress=False)
    assert report.passed and report.start == f"checkpoint at offset {taken.offset}", report


# -- 11. a real service and the SDK's client ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data directory of one `keyload run` shared by the service tests."""
    root = tmp_path_factory.mktemp("served") / "data"
    process = start_service(root, "--tick-interval-ms", "50")
    try:
        yield root
    finally:
        assert stop_service(process) == 0


def test_a_service_principal_acts_where_it_is_granted_and_nowhere_else(served: Path) -> None:
    grants = [can(Capability.enqueue, "shop", "jobs"), can(Capability.consume, "shop", "jobs")]
    with Client(served) as admin:
        admin.create_queue("shop", "jobs")
        admin.create_queue("shop", "other")
        admin.create_principal("worker", grants)
    with Client(served, principal="worker") as worker:
        worker.enqueue("shop", "jobs", b"w1", message_id="w1")
        [delivery] = worker.receive("shop", "jobs").deliveries
        assert delivery.message_id == "w1"
        assert worker.ack("shop", delivery.token).state == "acked"
        refusals: list[Callable[[], object]] = [
            lambda: worker.enqueue("shop", "other", b"x"),
            lambda: worker.receive("shop", "other"),
            lambda: worker.create_queue("shop", "mine"),
            lambda: worker.inspect_queue("shop", "jobs"),
            lambda: worker.enqueue("elsewhere", "jobs", b"x"),
            lambda: worker.inspect_principal(ADMIN_PRINCIPAL),
        ]
        for attempt in refusals:
            with pytest.raises(CommandRejected) as refused:
                attempt()
            assert isinstance(refused.value, PermissionDeniedError)
            assert refused.value.outcome.error_code == DENIED
        me = worker.whoami()
        assert me.principal.principal == "worker" and me.principal.enabled
        assert me.principal.grants == sorted(grants)


def test_creating_an_existing_principal_keeps_its_credential_file(served: Path) -> None:
    """create_principal of a name that exists is RevisionConflict; the principal's file, its key and
    its policy stay as they were, and its client works on."""
    with Client(served) as admin:
        first = admin.create_principal("twice", [can(Capability.inspect, "shop")])
        path = credential_path(served, "twice")
        written = path.read_bytes()
        with pytest.raises(RevisionConflictError):
            admin.create_principal("twice", [can(Capability.admin, "*")])
        assert path.read_bytes() == written and Credential.load(path) == first
        view = admin.inspect_principal("twice").principal
        assert (view.key_id, view.revision, view.grants) == (first.key_id, 1, [can(Capability.inspect, "shop")])
    with Client(served, principal="twice") as twice:
        assert twice.whoami().principal.key_id == first.key_id


def test_a_principal_can_sign_with_a_keyring_key_added_beforehand(served: Path) -> None:
    """Kafka's way (section 5a): the key is added (`keyload keys add`) and copied to every processor
    before any command names it, so no processor halts for lack of it; create and rotate then take
    it by id, and the credential file holds that key. A key the keyring lacks is refused before
    anything is appended; a server makes its keys itself."""
    keyring.add(served, "p-carol-1")
    keyring.add(served, "p-carol-2")
    with Client(served) as admin:
        carol = admin.create_principal("carol", [can(Capability.inspect, "shop")], key_id="p-carol-1")
        assert (carol.key_id, carol.secret) == ("p-carol-1", keyring.load(served)["p-carol-1"])
        assert Credential.load(credential_path(served, "carol")) == carol
        assert admin.rotate_credential("carol", key_id="p-carol-2").key_id == "p-carol-2"
        # To the key in force again, as a new command (no id to repeat): applied, not taken for a repeat.
        assert admin.rotate_credential("carol", key_id="p-carol-2").key_id == "p-carol-2"
        # Back to the key it was rotated from: a retired key never returns (it may have leaked).
        with pytest.raises(ConflictError, match="retired keys never return"):
            admin.rotate_credential("carol", key_id="p-carol-1")
        with pytest.raises(CredentialError, match="keyload keys add p-nowhere"):
            admin.create_principal("dave", key_id="p-nowhere")
        with pytest.raises(NotFoundError):
            admin.inspect_principal("dave")
    with Client(served, principal="carol") as client:
        assert client.whoami().principal.key_id == "p-carol-2"
    admin_credential = system_credential(served, ADMIN_PRINCIPAL)
    with (
        Client(served_url(served), credential=admin_credential) as remote,
        pytest.raises(InvalidCommand, match="a server makes the principal's key itself"),
    ):
        remote.create_principal("erin", key_id="p-carol-1")


def test_a_principal_is_given_its_file_only_once_every_partition_has_it(served: Path) -> None:
    """A name that one partition already holds: the other partitions accept the new principal, that
    one refuses it (RevisionConflict), and no credential file is written."""
    last = DataDir.open(served).partitions - 1
    assert last > 0
    with Client(served) as admin:
        squatter = new_credential(served, "half")
        body = {"principal": "half", "key_id": squatter.key_id, "enabled": None, "grants": [], "expected_revision": 0}
        admin.send("PutPrincipal", admin.partition_domain(last), body)
        with pytest.raises(RevisionConflictError):
            admin.create_principal("half")
        assert not credential_path(served, "half").exists()
        assert admin.inspect_principal("half", partition=last).principal.key_id == squatter.key_id


def test_a_creation_that_failed_part_way_is_completed_by_sending_it_again_with_its_command_id(
    served: Path,
) -> None:
    """On Kafka a processor without the key halts its partition, and `principal create` times out
    after the partitions before it applied the principal (section 5a). Sent again with its command
    id, the creation makes the same key: partition 0 answers its stored outcome, the others apply
    it, and the file is written. A rotation sent again rotates nothing twice."""
    grants = [can(Capability.inspect, "shop")]
    with Client(served) as admin:
        first_try = issued_credential(served, ADMIN_PRINCIPAL, "mended", "create-mended")
        body = {
            "principal": "mended",
            "key_id": first_try.key_id,
            "enabled": None,
            "grants": [grant.to_avro() for grant in grants],
            "expected_revision": 0,
        }
        admin.send("PutPrincipal", admin.partition_domain(0), body, command_id="create-mended")  # then it failed
        assert not credential_path(served, "mended").exists()
        created = admin.create_principal("mended", grants, command_id="create-mended")
        assert created == first_try == Credential.load(credential_path(served, "mended"))
        rotated = issued_credential(served, ADMIN_PRINCIPAL, "mended", "rotate-mended")  # its first try:
        body = {**body, "key_id": rotated.key_id, "grants": None, "expected_revision": 1}
        admin.send("PutPrincipal", admin.partition_domain(0), body, command_id="rotate-mended")  # then it failed
        assert admin.rotate_credential("mended", command_id="rotate-mended") == rotated
        assert admin.rotate_credential("mended", command_id="rotate-mended") == rotated
        assert admin.create_principal("mended", grants, command_id="create-mended") == created  # its stored answer
        assert Credential.load(credential_path(served, "mended")) == rotated  # the file keeps the key in force
        for partition in range(admin.data.partitions):
            view = admin.inspect_principal("mended", partition=partition).principal
            assert (view.key_id, view.revision, view.grants) == (rotated.key_id, 2, grants)
    with Client(served, principal="mended") as mended:
        assert mended.whoami().principal.key_id == rotated.key_id
    command = ("principal", "create", "cli-mended", "--data", str(served), "--command-id", "create-cli", "--json")
    answers = [run_keyload(*command) for _ in range(2)]  # the same command sent again: the same answer
    assert [answer.returncode for answer in answers] == [0, 0], answers[1].stderr
    assert answers[0].stdout == answers[1].stdout


def test_rotating_a_credential_needs_an_existing_principal_and_takes_its_current_revision(served: Path) -> None:
    with Client(served) as admin:
        keys_before = set(keyring.load(served))
        for bad_id in ("has spaces", 5):  # refused before a key is made for it
            with pytest.raises(InvalidCommand, match="command id must be"):
                admin.create_principal("badly-named", command_id=bad_id)  # type: ignore[arg-type]
        assert set(keyring.load(served)) == keys_before
        with pytest.raises(NotFoundError):
            admin.rotate_credential("nobody")
        assert not credential_path(served, "nobody").exists()
        first = admin.create_principal("rotor", [can(Capability.inspect, "shop")])
        admin.grant("rotor", can(Capability.enqueue, "shop"))  # revision 2
        rotated = admin.rotate_credential("rotor")
        assert rotated.key_id != first.key_id
        assert Credential.load(credential_path(served, "rotor")) == rotated
        for partition in range(admin.data.partitions):
            view = admin.inspect_principal("rotor", partition=partition).principal
            assert (view.key_id, view.revision) == (rotated.key_id, 3)
    with Client(served, principal="rotor") as rotor:
        assert rotor.whoami().principal.key_id == rotated.key_id


@pytest.mark.parametrize("actor", sorted(SERVICE_ACTORS))
def test_a_local_operator_cannot_rotate_the_services_own_actors(served: Path, actor: str) -> None:
    """The service signs its ticker's, GC's and checkpointer's commands with their fixed keys: a
    rotated actor would be refused for good (its GC passes would fail forever), so a local operator
    is refused as a server's client is, and nothing changes; the administrator's key may rotate."""
    with Client(served) as admin:
        before = admin.inspect_principal(actor).principal
        with pytest.raises(InvalidCommand, match="one of the service's own principals"):
            admin.rotate_credential(actor)
        assert admin.inspect_principal(actor).principal == before
    assert not credential_path(served, actor).exists()


def test_a_principal_key_one_partition_signs_tokens_with_is_refused_before_any_partition_applies_it(
    served: Path,
) -> None:
    """Token keys may differ between partitions (RotateKeys names one). A PutPrincipal of a key the
    last partition signs tokens with was applied by partition 0 and refused by that one, for good
    (its refusal is stored): the principal was left on partition 0 only. A local operator and the
    HTTP API now refuse it before anything is appended, naming the partition."""
    key_id = f"k-serving-{uuid.uuid4().hex[:8]}"
    keyring.add(served, key_id)
    with Client(served) as admin:
        last = admin.partitions - 1
        before = admin.rotate_keys(last).token_key_id
        admin.rotate_keys(last, token_key_id=key_id)
        try:
            with pytest.raises(InvalidCommand, match=f"signs tokens, jitter or proofs with \\(partition {last}\\)"):
                admin.put_principal("taker", key_id=key_id, grants=[], expected_revision=0)
            refused = httpx.put(
                f"{served_url(served)}/v1/principals/taker",
                json={"key_id": key_id, "grants": [], "expected_revision": 0},
                headers=bearer(served),
                timeout=30,
            )
            assert refused.status_code == 400 and f"(partition {last})" in refused.json()["detail"], refused.text
            for partition in range(admin.partitions):
                with pytest.raises(NotFoundError):
                    admin.inspect_principal("taker", partition=partition)
        finally:
            admin.rotate_keys(last, token_key_id=before)


def test_a_service_client_ignores_an_unsealed_outcome_forged_for_its_command(served: Path) -> None:
    with Client(served) as admin:
        admin.create_queue("shop", "forged")
        admin.create_principal("producer", [can(Capability.enqueue, "shop", "forged")])
    with Client(served, principal="producer") as producer:
        producer.whoami()  # the client now reads its reply partition on from here
        command_id = f"forged-{uuid.uuid4().hex}"
        forgery = new_outcome(
            command_id, "shop", partition_for("shop", producer.data.partitions), 0, time.time_ns() // 1_000_000
        )
        reject(forgery, Rejected(ErrorCode.RESOURCE_EXHAUSTED, "the queue is full"))
        outcomes = DataDir.open(served).outcome_log()
        try:
            outcomes.append(producer.reply_partition, [REGISTRY.encode(OUTCOME, forgery)])
        finally:
            outcomes.close()
        result = producer.enqueue("shop", "forged", b"real", command_id=command_id)
        assert (result.message_id, result.state) == (command_id, "ready")
        found = []
        log = DataDir.open(served).outcome_log()
        try:
            for record in log.read(producer.reply_partition, 0, 10_000):
                decoded = REGISTRY.decode(OUTCOME, contents(record.value))
                if decoded["command_id"] == command_id:
                    found.append((decoded["status"], decoded["error_code"], producer.credential.seals(record.value)))
        finally:
            log.close()
        assert found == [("rejected", "ResourceExhausted", False), ("committed", None, True)]


def test_a_service_client_whose_command_is_not_authenticated_times_out_naming_the_unsealed_refusal(
    served: Path,
) -> None:
    impostor = Credential("impostor", "p-not-in-the-keyring", os.urandom(32))
    with Client(served, credential=impostor, timeout_s=1.0) as client, pytest.raises(OutcomeTimeout) as timeout:
        client.enqueue("shop", "jobs", b"x")
    assert "were not sealed with this client's key" in str(timeout.value)
    assert "PermissionDenied" in str(timeout.value)
