"""The Python SDK: append commands to the embedded log and wait for their outcomes."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeGuard, TypeVar, Unpack

from keyload.commands import BY_NAME, CommandKind, part_refused
from keyload.credentials import ADMIN_PRINCIPAL, Credential, CredentialError, credential_path
from keyload.errors import CommandRejected, InvalidCommand, KeyloadError, NotFoundError, OutcomeTimeout, rejection
from keyload.log.base import LogError, partition_for
from keyload.log.codec import REGISTRY
from keyload.sdk.consumer import DEFAULT_WAIT_MS, ConsumeStats, Handled, WorkOptions, consume, subscribe
from keyload.sdk.envelope import check_command_id, shown
from keyload.sdk.log_transport import LogTransport
from keyload.sdk.results import (
    RESULT_TYPES,
    AckBatchResult,
    ActiveKeys,
    BatchResult,
    Census,
    CheckpointResult,
    DeadLetterPage,
    Delivery,
    Document,
    DocumentPage,
    DocumentResult,
    DomainView,
    EnqueueResult,
    Event,
    Grant,
    GroupAckBatchResult,
    GroupDelivery,
    GroupLeaseResult,
    GroupPolicySpec,
    GroupReceiveResult,
    GroupView,
    InboxSource,
    InboxView,
    LeaseResult,
    MessageView,
    Mutation,
    Outcome,
    PayloadReservation,
    PoisonEntry,
    PrincipalView,
    ProcessingResult,
    PublishResult,
    QueueList,
    QueuePolicySpec,
    QueueView,
    ReceiveResult,
    Result,
    RetentionPage,
    RetentionStatus,
    TopicList,
    TopicPage,
    TopicPolicySpec,
    TopicView,
    mutation_record,
)
from keyload.service.system_commands import domain_for_partition
from keyload.storage.datadir import DataDir

# The SDK does not load the engine: RocksDB (read by `poison_entries` and `census`) and the payload gateway (which
# signs with the processors' proofs and handles) are imported where they are used.
if TYPE_CHECKING:
    from keyload.sdk.http_transport import HttpTransport, Verify
    from keyload.sdk.payloads import PayloadGateway, Progress

DEFAULT_TIMEOUT_S = 10.0

T = TypeVar("T")
MAX_LANES = 8
POISON_PREVIEW_BYTES = 32  # how much of a poison record `poison_entries` returns
DEFAULT_POISON_LIMIT = 100
# A publish's refusal names events by index (a stored detail never echoes client-chosen strings);
# the client maps them back to the ids it was given.
_EVENT_INDEXES = re.compile(r"(?P<word>events?) (?P<first>\d+)(?: and (?P<second>\d+))?\b")


def _naming_events(outcome: Outcome, events: Sequence[dict[str, Any]], prefix: str = "") -> CommandRejected:
    """The rejection of a publish, its message naming events by the ids the caller gave rather than by
    their index in the command; `prefix` is where the detail names them (a batch's "mutation N: ")."""
    detail = outcome.detail
    match = _EVENT_INDEXES.match(detail, len(prefix)) if detail.startswith(prefix) else None
    if match is not None:
        indexes = [int(found) for found in (match["first"], match["second"]) if found is not None]
        if all(index < len(events) for index in indexes):
            named = " and ".join(shown(events[index]["event_id"]) for index in indexes)
            detail = f"{detail[: match.start()]}{match['word']} {named}{detail[match.end() :]}"
    return rejection(outcome, f"{outcome.error_code}: {detail}")


def _refusal(kind: CommandKind, body: dict[str, Any], outcome: Outcome) -> CommandRejected:
    """The error of a refused command; a publish's (a batch's publish mutation's too) names events by
    the ids the caller gave rather than by their index in the command."""
    if kind.name == "Publish":
        return _naming_events(outcome, body["events"])
    failed = outcome.failed_index
    if kind.name == "Batch" and failed is not None and failed < len(body["mutations"]):
        branch, mutation = body["mutations"][failed]["mutation"]
        if branch == BY_NAME["Publish"].branch:
            return _naming_events(outcome, mutation["events"], part_refused(failed, ""))
    return rejection(outcome)


def _local_credential(root: Path, principal: str) -> Credential:
    """The credential file of `principal` in the data directory; CredentialError saying how to make it."""
    path = credential_path(root, principal)
    if not path.exists():
        how = "`keyload run` writes it" if principal == ADMIN_PRINCIPAL else f"`keyload principal create {principal}`"
        raise CredentialError(f"no credential for principal {principal!r} at {path}: {how}, or pass a credential")
    return Credential.load(path)


@dataclass(frozen=True, slots=True)
class Lane:
    """One queue of a multi-lane receive (`Client.receive_across`), with that lane's Receive options."""

    domain: str
    queue: str
    max_messages: int | None = None
    max_bytes: int | None = None
    lease_ms: int | None = None


@dataclass(frozen=True, slots=True)
class LaneOutcome:
    lane: Lane
    command_id: str
    status: Literal["committed", "rejected", "unknown", "not_attempted"]
    result: ReceiveResult | None
    error: CommandRejected | None


def _group_start(start: Literal["beginning", "end"] | int) -> tuple[str, int | None]:
    """The (GroupStart, position) pair of a start or seek target."""
    if isinstance(start, int):
        return "position", start
    if start not in ("beginning", "end"):
        raise InvalidCommand('a group start is "beginning", "end" or a position')
    return start, None


class Transport(Protocol):
    """How a client's commands reach the service: `LogTransport` appends to the log itself,
    `HttpTransport` sends them to a keyload server."""

    @property
    def partitions(self) -> int: ...

    def submit(self, domain: str, kind: str, body: dict[str, Any], command_id: str, timeout_s: float) -> Outcome: ...

    def close(self) -> None: ...


def _issuance_id(command_id: str | None) -> str:
    """The command id a credential's issuance goes by, checked before a key is made for it."""
    if command_id is None:
        return str(uuid.uuid4())
    check_command_id(command_id)
    return command_id


def is_server_url(target: str | os.PathLike[str]) -> TypeGuard[str]:
    return isinstance(target, str) and target.startswith(("http://", "https://"))


class Client:
    """Submits commands to keyload: to a keyload server (`Client("http://host:7411", credential=...)`)
    or, for local operators, straight into the log of a data directory that `keyload run` serves
    (`Client("./keyload-data")`).

    Every command has a command id (generated unless given). Submitting the same
    command id again, with the same content, returns the original outcome and
    applies nothing twice; with different content it is rejected with `Conflict`.

    A client acts as one principal. Over HTTP it presents `credential` to the server, which signs
    its commands with it; it trusts the outcomes the server answers with (use https:// off this
    machine). Locally it signs every command with the principal's credential itself: `credential`,
    else the credential file of `principal` in the data directory (DATA/credentials/<principal>.json),
    else the administrator's (the local operator's client), and accepts only outcomes sealed with
    the same key (keyload/credentials.py). `verify` is the TLS verification of an https:// server
    (True, False, a CA bundle's path, a str or a Path, or an ssl.SSLContext).
    """

    # The command table by row name and the result classes it is typed by (keyload/commands.py).
    commands: ClassVar[Mapping[str, CommandKind]] = BY_NAME
    result_types: ClassVar[Mapping[str, type[Any]]] = RESULT_TYPES

    def __init__(
        self,
        target: str | os.PathLike[str],
        principal: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        reply_partition: int | None = None,
        *,
        credential: Credential | None = None,
        verify: Verify = True,
    ) -> None:
        self.timeout_s = timeout_s
        self._payloads: PayloadGateway | None = None
        self._transport: Transport
        if is_server_url(target):
            if credential is None:
                raise CredentialError("a client of a keyload server needs its credential: Client(url, credential=...)")
            if reply_partition is not None:
                raise InvalidCommand("reply_partition is for a client of a data directory; a server answers directly")
            from keyload.sdk.http_transport import HttpTransport  # lazily: httpx is for clients of a server

            self._transport = HttpTransport(target, credential, verify=verify)
        else:
            data = DataDir.open(target)
            if credential is None:
                credential = _local_credential(data.root, principal or ADMIN_PRINCIPAL)
            self._transport = LogTransport(data, credential, reply_partition)
        if principal is not None and credential.principal != principal:
            self._transport.close()
            raise CredentialError(f"the credential given is {credential.principal!r}'s, not {principal!r}'s")
        self.credential = credential
        self.principal = credential.principal

    @property
    def reply_partition(self) -> int | None:
        """The outcome partition a local client waits on (None over HTTP)."""
        return self._transport.reply_partition if isinstance(self._transport, LogTransport) else None

    @property
    def data(self) -> DataDir:
        """The data directory of a local client (KeyloadError for a client of a server)."""
        return self._local("the data directory").data

    @property
    def partitions(self) -> int:
        """The service's partition count."""
        return self._transport.partitions

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _local(self, what: str) -> LogTransport:
        """The local transport, for calls that need the data directory itself."""
        if not isinstance(self._transport, LogTransport):
            raise KeyloadError(f"{what} needs a local data directory: Client(DATA), not a server URL")
        return self._transport

    def _http(self, what: str) -> HttpTransport:
        """The HTTP transport, for calls a server answers outside commands."""
        from keyload.sdk.http_transport import HttpTransport  # lazily: httpx is for clients of a server

        if not isinstance(self._transport, HttpTransport):
            raise KeyloadError(f"{what} over HTTP needs a client of a server")
        return self._transport

    # -- the generic path -------------------------------------------------------------

    def submit(
        self,
        domain: str,
        kind: str,
        body: dict[str, Any],
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Outcome:
        """Send one command and wait for its outcome (committed or rejected): `timeout_s` (default the
        client's) after a long poll's `wait_ms`, whichever path sent it (a typed method, `send`, the CLI).

        A command that cannot be sent as given (unknown `kind`, a `body` that does not match the
        kind's schema, over the log's record limit, a bad command id) raises `InvalidCommand` and
        nothing is appended."""
        command_id = str(uuid.uuid4()) if command_id is None else command_id
        check_command_id(command_id)
        return self._transport.submit(
            domain, kind, body, command_id, self.timeout_s if timeout_s is None else timeout_s
        )

    def send(
        self,
        name: str,
        domain: str,
        body: dict[str, Any],
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Result:
        """Submit a command of the table row `name` (keyload/commands.py: "CreateQueue", ...) and return
        its typed result; `CommandRejected` when it is refused. Every typed method below goes through here."""
        return self._sent(name, domain, body, command_id, timeout_s)[0]

    def _sent(
        self,
        name: str,
        domain: str,
        body: dict[str, Any],
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[Result, int]:
        """`send`, and the log time its outcome was evaluated at (`Outcome.eval_time_ms`): a lease's
        `lease_until_ms` less it is the lease's length, known without reading this machine's clock."""
        kind = self.commands.get(name)
        if kind is None:
            raise InvalidCommand(f"unknown command {shown(name)}; nothing was appended")
        command_id = str(uuid.uuid4()) if command_id is None else command_id
        outcome = self.submit(domain, kind.branch, kind.filled(body, command_id), command_id, timeout_s)
        if outcome.status != "committed":
            raise _refusal(kind, body, outcome)
        typed: Result = self._result(outcome, self.result_types[kind.result])
        return typed, outcome.eval_time_ms

    def _send(
        self,
        result: type[T],
        name: str,
        domain: str,
        body: dict[str, Any],
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """`send`, typed: `result` is the class the table row's result record is read as (checked)."""
        return self._send_timed(result, name, domain, body, command_id, timeout_s)[0]

    def _send_timed(
        self,
        result: type[T],
        name: str,
        domain: str,
        body: dict[str, Any],
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[T, int]:
        """`_send`, and the log time its outcome was evaluated at (`_sent`)."""
        typed, at = self._sent(name, domain, body, command_id, timeout_s)
        assert isinstance(typed, result), (name, result)
        return typed, at

    def _result(self, outcome: Outcome, kind: type[T]) -> T:
        if outcome.status != "committed":
            raise rejection(outcome)
        if not isinstance(outcome.result, kind):
            # Only a client bug gets here: the same command id used for two kinds of command.
            raise KeyloadError(f"command {outcome.command_id!r} produced {type(outcome.result).__name__}")
        return outcome.result

    # -- queues ---------------------------------------------------------------------------

    def create_queue(
        self,
        domain: str,
        queue: str,
        policy: QueuePolicySpec | None = None,
        *,
        command_id: str | None = None,
    ) -> QueueView:
        """The queue, created; or, when it exists with this policy, as it stands (a declare: a service
        may call this at every start). It existing with another policy is `ConflictError`."""
        body = {"queue": queue, "policy": (policy or QueuePolicySpec()).to_avro()}
        return self._send(QueueView, "CreateQueue", domain, body, command_id)

    def configure_queue(
        self,
        domain: str,
        queue: str,
        policy: QueuePolicySpec,
        *,
        expected_policy_version: int | None = None,
        command_id: str | None = None,
    ) -> QueueView:
        """Replace the queue's whole policy; fields left None take their defaults."""
        body = {
            "queue": queue,
            "policy": policy.to_avro(),
            "expected_policy_version": expected_policy_version,
        }
        return self._send(QueueView, "ConfigureQueue", domain, body, command_id)

    def enqueue(
        self,
        domain: str,
        queue: str,
        body: bytes,
        *,
        message_id: str | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
        not_before_ms: int | None = None,
        expires_at_ms: int | None = None,
        command_id: str | None = None,
    ) -> EnqueueResult:
        """Enqueue one message; `message_id` (unique in the queue) defaults to the command id."""
        record = {
            "queue": queue,
            "message_id": message_id,
            "body": body,
            "headers": headers or {},
            "ordering_key": ordering_key,
            "not_before_ms": not_before_ms,
            "expires_at_ms": expires_at_ms,
        }
        return self._send(EnqueueResult, "Enqueue", domain, record, command_id)

    def inspect_queue(self, domain: str, queue: str, *, command_id: str | None = None) -> QueueView:
        return self._queue_command("InspectQueue", domain, queue, command_id)

    def list_queues(
        self,
        domain: str,
        prefix: str = "",
        *,
        after: str | None = None,
        max_queues: int | None = None,
        command_id: str | None = None,
    ) -> QueueList:
        """The domain's queues whose name starts with `prefix`, in name order, each as `inspect_queue`
        shows it; read on with `after=page.next_after`."""
        body = {"prefix": prefix, "after": after, "max_queues": max_queues}
        return self._send(QueueList, "ListQueues", domain, body, command_id)

    def pause_queue(self, domain: str, queue: str, *, command_id: str | None = None) -> QueueView:
        """Stop dispatch: receives are refused with `DispatchPausedError` (a waiting receive waits for
        the resume); enqueues go on and leases in hand stay valid."""
        return self._queue_command("PauseQueue", domain, queue, command_id)

    def resume_queue(self, domain: str, queue: str, *, command_id: str | None = None) -> QueueView:
        return self._queue_command("ResumeQueue", domain, queue, command_id)

    def close_queue(self, domain: str, queue: str, *, command_id: str | None = None) -> QueueView:
        """Take no new messages (enqueues are refused with `ConflictError`); what the queue holds is
        still delivered and settled. There is no reopening."""
        return self._queue_command("CloseQueue", domain, queue, command_id)

    def _queue_command(self, kind: str, domain: str, queue: str, command_id: str | None) -> QueueView:
        """A command that names one queue and nothing else (keyload.bodies.QueueCommand)."""
        return self._send(QueueView, kind, domain, {"queue": queue}, command_id)

    def delete_queue(
        self,
        domain: str,
        queue: str,
        *,
        force: bool = False,
        expected_incarnation: int | None = None,
        command_id: str | None = None,
    ) -> QueueView:
        """Delete a queue that holds no message and no open reservation (else `ConflictError`), or
        with `force` whatever it holds (its messages are dropped); its name is free at once and its
        tokens are invalid. `expected_incarnation` (a QueueView's `incarnation`) fences it: another
        incarnation is `RevisionConflictError`. Returns its last view."""
        body = {"queue": queue, "force": force, "expected_incarnation": expected_incarnation}
        return self._send(QueueView, "DeleteQueue", domain, body, command_id)

    def purge_queue(
        self, domain: str, queue: str, *, expected_incarnation: int | None = None, command_id: str | None = None
    ) -> QueueView:
        """Drop every message, in any state: the queue becomes a new incarnation with its policy, flags
        and creation time (tokens in hand are invalid). `expected_incarnation` fences it as for
        `delete_queue`. Returns the new incarnation's view."""
        body = {"queue": queue, "expected_incarnation": expected_incarnation}
        return self._send(QueueView, "PurgeQueue", domain, body, command_id)

    def inspect_message(
        self,
        domain: str,
        queue: str,
        message_id: str,
        *,
        include_body: bool = False,
        command_id: str | None = None,
    ) -> MessageView:
        body = {"queue": queue, "message_id": message_id, "include_body": include_body}
        return self._send(MessageView, "InspectMessage", domain, body, command_id)

    # -- leases ---------------------------------------------------------------------------

    def receive(
        self,
        domain: str,
        queue: str,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        lease_ms: int | None = None,
        wait_ms: int | None = None,
        command_id: str | None = None,
    ) -> ReceiveResult:
        """Lease up to `max_messages` ready messages; an empty result is normal.

        With `wait_ms` (≤ 20 s) and nothing ready, the receive waits in the log for a
        message (one command, however long the wait) and returns when one arrives or
        the wait ends; the client waits that long plus its own timeout.
        """
        body = {
            "queue": queue,
            "max_messages": max_messages,
            "max_bytes": max_bytes,
            "lease_ms": lease_ms,
            "wait_ms": wait_ms,
        }
        return self._send(ReceiveResult, "Receive", domain, body, command_id)

    def receive_across(
        self, lanes: list[Lane], *, request_id: str | None = None, timeout_s: float | None = None
    ) -> list[LaneOutcome]:
        """Receive from up to 8 queues in order, one independent Receive per lane.

        Lane i's command id is "<request_id>.<i>": calling again with the same
        request id and unchanged lanes returns the original per-lane receipts,
        each delivery as it stands then (feature level 3): one whose lease is no
        longer held has `error_code` set and no body.
        No atomicity across lanes is claimed: each lane is committed, rejected,
        unknown (no outcome in time: retry with the same request id), or
        not_attempted (the overall timeout ran out before its turn).
        """
        if not 1 <= len(lanes) <= MAX_LANES:
            raise InvalidCommand(f"receive_across takes 1..{MAX_LANES} lanes")
        if not all(isinstance(lane, Lane) for lane in lanes):
            raise InvalidCommand("each lane is a keyload.Lane(domain, queue, max_messages=, max_bytes=, lease_ms=)")
        request_id = str(uuid.uuid4()) if request_id is None else request_id
        check_command_id(f"{request_id}.{len(lanes) - 1}")
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        outcomes: list[LaneOutcome] = []
        for index, lane in enumerate(lanes):
            command_id = f"{request_id}.{index}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcomes.append(LaneOutcome(lane, command_id, "not_attempted", None, None))
                continue
            body = {
                "queue": lane.queue,
                "max_messages": lane.max_messages,
                "max_bytes": lane.max_bytes,
                "lease_ms": lane.lease_ms,
                "wait_ms": None,
            }
            try:
                outcome = self.submit(lane.domain, self.commands["Receive"].branch, body, command_id, remaining)
            except OutcomeTimeout:
                outcomes.append(LaneOutcome(lane, command_id, "unknown", None, None))
                continue
            if outcome.status == "committed":
                assert isinstance(outcome.result, ReceiveResult)
                outcomes.append(LaneOutcome(lane, command_id, "committed", outcome.result, None))
            else:
                outcomes.append(LaneOutcome(lane, command_id, "rejected", None, rejection(outcome)))
        return outcomes

    def renew(
        self, domain: str, token: str, *, lease_ms: int | None = None, command_id: str | None = None
    ) -> LeaseResult:
        body = {"token": token, "lease_ms": lease_ms}
        return self._send(LeaseResult, "Renew", domain, body, command_id)

    def ack(self, domain: str, token: str, *, command_id: str | None = None) -> LeaseResult:
        return self._send(LeaseResult, "Ack", domain, {"token": token}, command_id)

    def ack_batch(self, domain: str, tokens: list[str], *, command_id: str | None = None) -> AckBatchResult:
        """Ack many deliveries in one command; each token's result is reported separately."""
        return self._send(AckBatchResult, "AckBatch", domain, {"tokens": tokens}, command_id)

    def nack(
        self, domain: str, token: str, *, delay_ms: int | None = None, command_id: str | None = None
    ) -> LeaseResult:
        """Give a delivery back: retried after `delay_ms` (default: the queue's backoff) or dead-lettered."""
        body = {"token": token, "delay_ms": delay_ms}
        return self._send(LeaseResult, "Nack", domain, body, command_id)

    def consume(
        self,
        domain: str,
        queue: str,
        handler: Callable[[Delivery], Handled],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        **options: Unpack[WorkOptions],
    ) -> ConsumeStats:
        """Run `handler` on every delivery until `stop` is set: ack on return, nack on exception,
        renewing leases while handlers run, long-polling while idle; `options` are
        keyload.sdk.consumer.WorkOptions. With `exactly_once`, the handler returns its effects and
        they commit with the ack (see keyload/sdk/consumer.py)."""
        return consume(self, domain, queue, handler, wait_ms=wait_ms, **options)

    def subscribe(
        self,
        domain: str,
        topic: str,
        group: str,
        handler: Callable[[GroupDelivery], Handled],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        **options: Unpack[WorkOptions],
    ) -> ConsumeStats:
        """`consume` for a subscription group's deliveries."""
        return subscribe(self, domain, topic, group, handler, wait_ms=wait_ms, **options)

    # -- dead letters -----------------------------------------------------------------------

    def list_dead_letters(
        self,
        domain: str,
        queue: str,
        *,
        after_sequence: int | None = None,
        limit: int = 100,
        include_body: bool = False,
    ) -> DeadLetterPage:
        body = {"queue": queue, "after_sequence": after_sequence, "limit": limit, "include_body": include_body}
        return self._send(DeadLetterPage, "ListDeadLetters", domain, body)

    def redrive(self, domain: str, message: MessageView, *, command_id: str | None = None) -> MessageView:
        """Send a dead letter back to ready with fresh attempts; its old tokens go stale."""
        return self._fenced("Redrive", domain, message, command_id)

    def cancel(self, domain: str, message: MessageView, *, command_id: str | None = None) -> MessageView:
        """Cancel any non-terminal message: its body and quota are released."""
        return self._fenced("Cancel", domain, message, command_id)

    def park_pending(self, domain: str, message: MessageView, *, command_id: str | None = None) -> MessageView:
        """Move a pending dead letter into the dead-letter index once the sublimit has room."""
        return self._fenced("ParkPending", domain, message, command_id)

    def _fenced(self, name: str, domain: str, message: MessageView, command_id: str | None) -> MessageView:
        """An operator's move of one message, fenced by the view it was decided on (from `inspect_message`
        or `list_dead_letters`): refused with `RevisionConflictError` when the message has moved since
        (another state version) or is another delivery (another delivery generation)."""
        body = {
            "queue": message.queue,
            "message_id": message.message_id,
            "expected_state_version": message.meta.state_version,
            "expected_delivery_generation": message.meta.delivery_generation,
        }
        return self._send(MessageView, name, domain, body, command_id)

    # -- topics ---------------------------------------------------------------------------

    def create_topic(
        self,
        domain: str,
        topic: str,
        policy: TopicPolicySpec | None = None,
        *,
        command_id: str | None = None,
    ) -> TopicView:
        """The topic, created; or, when it exists with this policy, as it stands (a declare, as for
        queues). It existing with another policy is `ConflictError`."""
        body = {"topic": topic, "policy": (policy or TopicPolicySpec()).to_avro()}
        return self._send(TopicView, "CreateTopic", domain, body, command_id)

    def configure_topic(
        self,
        domain: str,
        topic: str,
        policy: TopicPolicySpec,
        *,
        expected_policy_version: int | None = None,
        command_id: str | None = None,
    ) -> TopicView:
        """Replace the topic's whole policy; fields left None take their defaults. A stale
        `expected_policy_version` is `RevisionConflictError`. Removes nothing itself: retention
        applies a shorter `max_age_ms`, or lower caps under `discard="old"`, from the front in
        bounded steps, never past what a group has not completed."""
        body = {"topic": topic, "policy": policy.to_avro(), "expected_policy_version": expected_policy_version}
        return self._send(TopicView, "ConfigureTopic", domain, body, command_id)

    def close_topic(self, domain: str, topic: str, *, command_id: str | None = None) -> TopicView:
        """Take no new events (publishes are refused with `ConflictError`); reads, groups and retention
        go on. There is no reopening."""
        return self._send(TopicView, "CloseTopic", domain, {"topic": topic}, command_id)

    def delete_topic(
        self,
        domain: str,
        topic: str,
        *,
        force: bool = False,
        expected_incarnation: int | None = None,
        command_id: str | None = None,
    ) -> TopicView:
        """Delete a topic and its subscription groups. Refused (`ConflictError`) while a group has not
        completed every retained event, unless `force`. The name is free at once (a new topic of
        that name dedups event ids afresh); `expected_incarnation` fences it like delete_queue's.
        Returns its last view."""
        body = {"topic": topic, "force": force, "expected_incarnation": expected_incarnation}
        return self._send(TopicView, "DeleteTopic", domain, body, command_id)

    def publish(
        self, domain: str, topic: str, events: Sequence[Event], *, command_id: str | None = None
    ) -> PublishResult:
        """Append 1..100 events at the topic's next positions, all or none.

        An event id already published to the topic (from feature level 6: within its
        domain's receipt horizon) refuses the whole command: with the same
        content `DuplicateEventIdError` (its detail names the original position),
        with other content `ConflictError`. The exception's message names the event by the id
        given here (`outcome.detail`, as stored, by its index in `events`).
        """
        body = {"topic": topic, "events": [event.to_record() for event in events]}
        return self._send(PublishResult, "Publish", domain, body, command_id)

    def read_topic(
        self,
        domain: str,
        topic: str,
        from_position: int | None = None,
        *,
        cursor: str | None = None,
        max_events: int | None = None,
        max_bytes: int | None = None,
        command_id: str | None = None,
    ) -> TopicPage:
        """A page of events from `from_position` (default 1, the table's request default), or from
        `cursor`: a page's `next_cursor`, to read on where it ended."""
        body = {
            "topic": topic,
            "from_position": from_position,
            "cursor": cursor,
            "max_events": max_events,
            "max_bytes": max_bytes,
        }
        return self._send(TopicPage, "ReadTopic", domain, body, command_id)

    def inspect_topic(self, domain: str, topic: str, *, command_id: str | None = None) -> TopicView:
        return self._send(TopicView, "InspectTopic", domain, {"topic": topic}, command_id)

    def list_topics(
        self,
        domain: str,
        prefix: str = "",
        *,
        after: str | None = None,
        max_topics: int | None = None,
        command_id: str | None = None,
    ) -> TopicList:
        """The domain's topics whose name starts with `prefix`, in name order, each as `inspect_topic`
        shows it; read on with `after=page.next_after`."""
        body = {"prefix": prefix, "after": after, "max_topics": max_topics}
        return self._send(TopicList, "ListTopics", domain, body, command_id)

    def purge_topic(
        self, domain: str, topic: str, through: int, *, expected_generation: int, command_id: str | None = None
    ) -> TopicView:
        """Delete the retained events first_available..through. Refused (`ResourceExhaustedError`) past
        the tail or past any group's checkpoint or lowest pinning parked position; a stale
        `expected_generation` is `RevisionConflictError`. Event ids stay known: re-publishing one is refused."""
        body = {"topic": topic, "through": through, "expected_generation": expected_generation}
        return self._send(TopicView, "PurgeTopic", domain, body, command_id)

    # -- subscription groups ----------------------------------------------------------------

    def create_group(
        self,
        domain: str,
        topic: str,
        group: str,
        *,
        event_types: list[str] | None = None,
        headers: dict[str, str] | None = None,
        start: Literal["beginning", "end"] | int = "beginning",
        policy: GroupPolicySpec | None = None,
        command_id: str | None = None,
    ) -> GroupView:
        """A group delivering the topic's matching events from `start`: "beginning" (first_available),
        "end" (only events published from now on), or a position (first_available..tail + 1). When
        the group exists with this filter and policy it is returned as it stands, `start` unused (a
        declare); with another filter or policy, `ConflictError`."""
        to, position = _group_start(start)
        body = {
            "topic": topic,
            "group": group,
            "filter": {"event_types": event_types or [], "headers": headers or {}},
            "start": to,
            "position": position,
            "policy": (policy or GroupPolicySpec()).to_avro(),
        }
        return self._send(GroupView, "CreateGroup", domain, body, command_id)

    def group_receive(
        self,
        domain: str,
        topic: str,
        group: str,
        *,
        max_events: int | None = None,
        max_bytes: int | None = None,
        lease_ms: int | None = None,
        wait_ms: int | None = None,
        command_id: str | None = None,
    ) -> GroupReceiveResult:
        """Lease due redeliveries, then the next matching positions; an empty result is normal.

        With `wait_ms` (≤ 20 s) and nothing to deliver, the receive waits in the log (one
        command, however long the wait) for a publish, an ack that opens the window, a
        retry coming due or a resume of the paused group; the client waits that long
        plus its own timeout.
        """
        body = {
            "topic": topic,
            "group": group,
            "max_events": max_events,
            "max_bytes": max_bytes,
            "lease_ms": lease_ms,
            "wait_ms": wait_ms,
        }
        return self._send(GroupReceiveResult, "GroupReceive", domain, body, command_id)

    def group_ack(
        self, domain: str, topic: str, group: str, token: str, *, command_id: str | None = None
    ) -> GroupLeaseResult:
        body = {"topic": topic, "group": group, "token": token}
        return self._send(GroupLeaseResult, "GroupAck", domain, body, command_id)

    def group_ack_batch(
        self, domain: str, topic: str, group: str, tokens: list[str], *, command_id: str | None = None
    ) -> GroupAckBatchResult:
        """Ack 1..100 deliveries in one command; each token's result is reported separately."""
        body = {"topic": topic, "group": group, "tokens": tokens}
        return self._send(GroupAckBatchResult, "GroupAckBatch", domain, body, command_id)

    def group_nack(
        self,
        domain: str,
        topic: str,
        group: str,
        token: str,
        *,
        delay_ms: int | None = None,
        command_id: str | None = None,
    ) -> GroupLeaseResult:
        """Give a delivery back: retried after `delay_ms` (default: the group's backoff) or parked."""
        body = {"topic": topic, "group": group, "token": token, "delay_ms": delay_ms}
        return self._send(GroupLeaseResult, "GroupNack", domain, body, command_id)

    def group_renew(
        self,
        domain: str,
        topic: str,
        group: str,
        token: str,
        *,
        lease_ms: int | None = None,
        command_id: str | None = None,
    ) -> GroupLeaseResult:
        body = {"topic": topic, "group": group, "token": token, "lease_ms": lease_ms}
        return self._send(GroupLeaseResult, "GroupRenew", domain, body, command_id)

    def group_status(self, domain: str, topic: str, group: str, *, command_id: str | None = None) -> GroupView:
        return self._group_command("GroupStatus", domain, topic, group, command_id)

    def seek_group(
        self,
        domain: str,
        topic: str,
        group: str,
        to: Literal["beginning", "end"] | int,
        *,
        expected_generation: int | None = None,
        command_id: str | None = None,
    ) -> GroupView:
        """Move the group so that `to` is the next position delivered; outstanding deliveries are dropped
        (their tokens become invalid) and the group stays paused until `resume_group`."""
        where, position = _group_start(to)
        body = {
            "topic": topic,
            "group": group,
            "to": where,
            "position": position,
            "expected_generation": expected_generation,
        }
        return self._send(GroupView, "SeekGroup", domain, body, command_id)

    def configure_group(
        self,
        domain: str,
        topic: str,
        group: str,
        *,
        expected_generation: int,
        event_types: list[str] | None = None,
        headers: dict[str, str] | None = None,
        policy: GroupPolicySpec | None = None,
        command_id: str | None = None,
    ) -> GroupView:
        """Change a paused group's filter and/or policy. Giving `event_types` or `headers` replaces the
        whole filter (the other one empty); a `policy` replaces the whole policy (None fields take
        defaults); what is not given stays. Positions after the checkpoint are evaluated again."""
        no_filter = event_types is None and headers is None
        body = {
            "topic": topic,
            "group": group,
            "expected_generation": expected_generation,
            "filter": None if no_filter else {"event_types": event_types or [], "headers": headers or {}},
            "policy": None if policy is None else policy.to_avro(),
        }
        return self._send(GroupView, "ConfigureGroup", domain, body, command_id)

    def delete_group(
        self,
        domain: str,
        topic: str,
        group: str,
        *,
        force: bool = False,
        expected_incarnation: int | None = None,
        command_id: str | None = None,
    ) -> GroupView:
        """Delete a group with no outstanding delivery (else `ConflictError`), or with `force` whatever
        it has outstanding; its pins on the topic go at once, its tokens are invalid, and its waiting
        receives are answered empty. `expected_incarnation` (a GroupView's `incarnation`) fences it:
        another incarnation is `RevisionConflictError`. Returns its last view."""
        body = {"topic": topic, "group": group, "force": force, "expected_incarnation": expected_incarnation}
        return self._send(GroupView, "DeleteGroup", domain, body, command_id)

    def pause_group(self, domain: str, topic: str, group: str, *, command_id: str | None = None) -> GroupView:
        """Stop deliveries (receives are refused with `DispatchPausedError`); leases in hand stay valid."""
        return self._group_command("PauseGroup", domain, topic, group, command_id)

    def resume_group(self, domain: str, topic: str, group: str, *, command_id: str | None = None) -> GroupView:
        return self._group_command("ResumeGroup", domain, topic, group, command_id)

    def _group_command(self, kind: str, domain: str, topic: str, group: str, command_id: str | None) -> GroupView:
        return self._send(GroupView, kind, domain, {"topic": topic, "group": group}, command_id)

    # -- documents, batches and inboxes ----------------------------------------------------

    def put_document(
        self,
        domain: str,
        key: str,
        value: bytes,
        *,
        expected_revision: int | None = None,
        command_id: str | None = None,
    ) -> DocumentResult:
        """Write a document. `expected_revision`: None writes whatever is there, 0 only if absent,
        n only at revision n (else `RevisionConflictError`)."""
        body = {"key": key, "value": value, "expected_revision": expected_revision}
        return self._send(DocumentResult, "PutDocument", domain, body, command_id)

    def delete_document(
        self, domain: str, key: str, *, expected_revision: int | None = None, command_id: str | None = None
    ) -> DocumentResult:
        body = {"key": key, "expected_revision": expected_revision}
        return self._send(DocumentResult, "DeleteDocument", domain, body, command_id)

    def get_document(self, domain: str, key: str, *, command_id: str | None = None) -> Document:
        """The live document (`NotFoundError` when absent or deleted)."""
        return self._send(Document, "GetDocument", domain, {"key": key}, command_id)

    def list_documents(
        self,
        domain: str,
        prefix: str = "",
        *,
        after: str | None = None,
        max_documents: int | None = None,
        max_bytes: int | None = None,
        command_id: str | None = None,
    ) -> DocumentPage:
        """Live documents whose key starts with `prefix`, in key order; read on with `after=page.next_after`."""
        body = {"prefix": prefix, "after": after, "max_documents": max_documents, "max_bytes": max_bytes}
        return self._send(DocumentPage, "ListDocuments", domain, body, command_id)

    def batch(self, domain: str, mutations: Sequence[Mutation], *, command_id: str | None = None) -> BatchResult:
        """Apply `mutations` in order, all or nothing; a refusal names the failing one (`failed_index`)."""
        body = {"mutations": [mutation_record(m) for m in mutations]}
        return self._send(BatchResult, "Batch", domain, body, command_id)

    def complete_processing(
        self,
        domain: str,
        token: str,
        effects: Sequence[Mutation],
        *,
        handler_scope: str,
        execution_generation: int = 0,
        topic: str | None = None,
        group: str | None = None,
        command_id: str | None = None,
    ) -> ProcessingResult:
        """Apply a delivery's effects, record its inbox entry and ack it, atomically. A repeat of the
        same delivery, scope and execution generation returns the first receipt (`already_processed`);
        other effects are `ConflictError`. Pass `topic` and `group` for a subscription group's delivery."""
        body = {
            "token": token,
            "handler_scope": handler_scope,
            "execution_generation": execution_generation,
            "effects": [mutation_record(m) for m in effects],
            "topic": topic,
            "group": group,
        }
        return self._send(ProcessingResult, "CompleteProcessing", domain, body, command_id)

    def configure_inbox(
        self, domain: str, *, max_receipts: int, max_bytes: int, command_id: str | None = None
    ) -> InboxView:
        """Give the domain a target inbox (or change its policy) so it accepts CommitInbox."""
        body = {"max_receipts": max_receipts, "max_bytes": max_bytes}
        return self._send(InboxView, "ConfigureInbox", domain, body, command_id)

    def configure_domain(
        self,
        domain: str,
        *,
        outcome_horizon_ms: int | None = None,
        receipt_horizon_ms: int | None = None,
        expected_policy_version: int | None = None,
        command_id: str | None = None,
    ) -> DomainView:
        """Replace the domain's horizons: how long, in log time, outcomes stored from now on answer
        repeats of their command ids, and then how long their receipts keep the ids taken (None:
        the defaults, a day and a week). A stale `expected_policy_version`: RevisionConflict."""
        body = {
            "outcome_horizon_ms": outcome_horizon_ms,
            "receipt_horizon_ms": receipt_horizon_ms,
            "expected_policy_version": expected_policy_version,
        }
        return self._send(DomainView, "ConfigureDomain", domain, body, command_id)

    def configure_domain_caps(
        self,
        domain: str,
        *,
        max_queues: int | None = None,
        max_topics: int | None = None,
        max_groups: int | None = None,
        max_documents: int | None = None,
        max_document_bytes: int | None = None,
        expected_policy_version: int | None = None,
        command_id: str | None = None,
    ) -> DomainView:
        """Replace the most the domain may hold (an operator's: admin on every domain; from feature level 5): queues,
        topics, subscription groups, live documents and their values' bytes (None: the defaults,
        10,000 each of the first three, a million documents, 10 GiB). A create or document write
        past a cap is then ResourceExhausted. A stale `expected_policy_version`: RevisionConflict."""
        body = {
            "max_queues": max_queues,
            "max_topics": max_topics,
            "max_groups": max_groups,
            "max_documents": max_documents,
            "max_document_bytes": max_document_bytes,
            "expected_policy_version": expected_policy_version,
        }
        return self._send(DomainView, "ConfigureDomainCaps", domain, body, command_id)

    def inspect_domain(self, domain: str, *, command_id: str | None = None) -> DomainView:
        """The domain's policy (its horizons, caps and policy version) and what it holds."""
        return self._send(DomainView, "InspectDomain", domain, {}, command_id)

    def commit_inbox(
        self,
        domain: str,
        source: InboxSource,
        effects: Sequence[Mutation],
        *,
        handler_scope: str,
        execution_generation: int = 0,
        command_id: str | None = None,
    ) -> ProcessingResult:
        """Apply effects in `domain` once per source delivery, handler scope and execution generation;
        the source's ack is a separate command."""
        body = {
            "source": {
                "domain": source.domain,
                "queue": source.queue,
                "message_id": source.message_id,
                "delivery_generation": source.delivery_generation,
            },
            "handler_scope": handler_scope,
            "execution_generation": execution_generation,
            "effects": [mutation_record(m) for m in effects],
        }
        return self._send(ProcessingResult, "CommitInbox", domain, body, command_id)

    # -- large payloads ---------------------------------------------------------------------

    @property
    def payloads(self) -> PayloadGateway:
        """The payload gateway over this data directory's object store and keyring."""
        if self._payloads is None:
            from keyload.sdk.payloads import PayloadGateway  # lazily: see the imports

            data = self._local("the payload gateway").data
            self._payloads = PayloadGateway(data.object_store(), data.keyring())
        return self._payloads

    def prepare_large_schedule(
        self,
        domain: str,
        queue: str,
        message_id: str,
        length: int,
        sha256: bytes,
        *,
        upload_window_ms: int | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
        not_before_ms: int | None = None,
        expires_at_ms: int | None = None,
        command_id: str | None = None,
    ) -> PayloadReservation:
        """Reserve a large message (identity, object key, length, SHA-256, deadline, quota)."""
        body = {
            "queue": queue,
            "message_id": message_id,
            "length": length,
            "sha256": sha256,
            "upload_window_ms": upload_window_ms,
            "headers": headers or {},
            "ordering_key": ordering_key,
            "not_before_ms": not_before_ms,
            "expires_at_ms": expires_at_ms,
        }
        return self._send(PayloadReservation, "PrepareLargeSchedule", domain, body, command_id)

    def commit_large_schedule(
        self, domain: str, reservation_id: int, proof: dict[str, Any], *, command_id: str | None = None
    ) -> PayloadReservation:
        """Create the reserved message from an attested object (an equivalent proof again is idempotent)."""
        body = {"reservation_id": reservation_id, "proof": proof}
        return self._send(PayloadReservation, "CommitLargeSchedule", domain, body, command_id)

    def cancel_large_schedule(
        self, domain: str, reservation_id: int, *, command_id: str | None = None
    ) -> PayloadReservation:
        """Abandon an uncommitted reservation; whatever was uploaded is deleted by retention."""
        body = {"reservation_id": reservation_id}
        return self._send(PayloadReservation, "CancelLargeSchedule", domain, body, command_id)

    def inspect_reservation(self, domain: str, reservation_id: int) -> PayloadReservation:
        body = {"reservation_id": reservation_id}
        return self._send(PayloadReservation, "InspectReservation", domain, body)

    def schedule_large(
        self,
        domain: str,
        queue: str,
        source: bytes | os.PathLike[str],
        *,
        message_id: str,
        upload_window_ms: int | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
        not_before_ms: int | None = None,
        expires_at_ms: int | None = None,
        progress: Progress | None = None,
        request_id: str | None = None,
    ) -> PayloadReservation:
        """Enqueue a payload of any size up to 5 TiB: reserve, upload, attest, commit.

        `source` is bytes or a file path (streamed: never read into memory whole).
        `progress(done, total)` is called as bytes go up. Calling again with the same
        `request_id` after a failure resumes: the reservation is the same command, an
        upload of the same bytes is idempotent, and so is a commit of an equivalent proof.
        """
        from keyload.sdk.payloads import digest_of, staged_source  # lazily: see the imports

        resuming = request_id is not None
        request_id = str(uuid.uuid4()) if request_id is None else request_id
        local = isinstance(self._transport, LogTransport)
        scratch = self.data.root / "scratch" / "payloads" if local else Path(tempfile.gettempdir())
        with staged_source(source, scratch) as path:
            digest = digest_of(path)
            receipt = self.prepare_large_schedule(
                domain,
                queue,
                message_id,
                digest.length,
                digest.sha256,
                upload_window_ms=upload_window_ms,
                headers=headers,
                ordering_key=ordering_key,
                not_before_ms=not_before_ms,
                expires_at_ms=expires_at_ms,
                command_id=f"{request_id}.prepare",
            )
            if resuming:
                # A resumed request whose commit already landed: nothing to upload (its receipt,
                # as stored, still says reserved). A new request id cannot have one.
                current = self.inspect_reservation(domain, receipt.reservation_id)
                if current.state == "committed":
                    return current
            if not local:  # the server uploads, attests and commits (keyload/server/payloads.py)
                outcome = self._http("schedule_large").upload_payload(
                    domain, receipt.reservation_id, path, progress, self.timeout_s
                )
                return self._result(outcome, PayloadReservation)
            handle = self.payloads.upload_handle(receipt, partition_for(domain, self.partitions))
            self.payloads.upload(handle, path, progress)
            proof = self.payloads.attest(handle)
        # A new command id each time: the proof (its attestation time) differs between attempts.
        return self.commit_large_schedule(domain, receipt.reservation_id, proof)

    def read_payload(self, delivery: Delivery, into: os.PathLike[str] | None = None) -> bytes | None:
        """A large delivery's bytes (verified against its SHA-256); with `into`, written to that file."""
        if delivery.payload is None or delivery.payload.read_handle is None:
            raise InvalidCommand("the delivery has no large payload: its bytes are in `body`")
        handle, sha256 = delivery.payload.read_handle, delivery.payload.sha256
        local = isinstance(self._transport, LogTransport)
        read: Callable[[Path], object] = (
            functools.partial(self.payloads.read, handle)
            if local
            else functools.partial(self._http("read_payload").read_payload, handle, sha256, timeout_s=self.timeout_s)
        )
        if into is not None:
            read(Path(into))
            return None
        scratch = self.data.root / "scratch" if local else Path(tempfile.gettempdir())
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=scratch) as folder:
            target = Path(folder) / "payload"
            read(target)
            return target.read_bytes()

    # -- operations -----------------------------------------------------------------------

    def rotate_keys(
        self,
        partition: int,
        *,
        token_key_id: str | None = None,
        jitter_key_id: str | None = None,
        proof_key_id: str | None = None,
        command_id: str | None = None,
    ) -> ActiveKeys:
        """Make keyring keys active for token signing, retry jitter and payload proofs in one partition.

        A new proof key starts a new trust-set version: reservations made before keep theirs."""
        body = {"token_key_id": token_key_id, "jitter_key_id": jitter_key_id, "proof_key_id": proof_key_id}
        return self._send_to(ActiveKeys, "RotateKeys", partition, body, command_id)

    # -- principals and grants ----------------------------------------------------------------

    def put_principal(
        self,
        principal: str,
        *,
        key_id: str | None = None,
        enabled: bool | None = None,
        grants: Sequence[Grant] | None = None,
        expected_revision: int | None = None,
        command_id: str | None = None,
    ) -> PrincipalView:
        """Create a principal (`key_id` required: a keyring key) or change it; None leaves a field as
        it is, `grants` replaces every grant. Sent to every partition under one command id: the view
        returned is partition 0's, and a failure part-way is mended by sending it again with the id."""
        body = {
            "principal": principal,
            "key_id": key_id,
            "enabled": enabled,
            "grants": None if grants is None else [grant.to_avro() for grant in grants],
            "expected_revision": expected_revision,
        }
        return self._send_everywhere("PutPrincipal", body, command_id)

    def grant(self, principal: str, grant: Grant, *, command_id: str | None = None) -> PrincipalView:
        """Add one grant to a principal, in every partition."""
        return self._send_everywhere("GrantCapability", {"principal": principal, "grant": grant.to_avro()}, command_id)

    def revoke(self, principal: str, grant: Grant, *, command_id: str | None = None) -> PrincipalView:
        """Remove one grant, exactly as it was granted, in every partition."""
        body = {"principal": principal, "grant": grant.to_avro()}
        return self._send_everywhere("RevokeCapability", body, command_id)

    def inspect_principal(
        self, principal: str | None = None, *, partition: int = 0, command_id: str | None = None
    ) -> PrincipalView:
        """A principal as one partition's policy has it (admin), or this client's own (None: whoami)."""
        return self._send_to(PrincipalView, "InspectPrincipal", partition, {"principal": principal}, command_id)

    def whoami(self) -> PrincipalView:
        """This client's principal, its grants and the policy epoch, as partition 0 has them."""
        return self.inspect_principal()

    def create_principal(
        self, principal: str, grants: Sequence[Grant] = (), *, key_id: str | None = None, command_id: str | None = None
    ) -> Credential:
        """A new principal with a new keyring key; its credential is returned, and a local client
        also writes its file DATA/credentials/<principal>.json (0600) once every partition has the
        principal: give that file (or the credential) to the principal's client. A local operator
        writes the keyring of this data directory; a client of a server asks the server, which makes
        the key (admin on every domain). An existing principal is refused (RevisionConflict) and its
        credential left as it is.

        `key_id` (a local operator's only): sign with that keyring key instead, added beforehand with
        `keyload keys add`. In Kafka mode every processor must hold the key before the principal
        command reaches it (a processor without it halts the partition until it has it): add the
        key, copy the keyring to every processor, then create.

        `command_id`: sent again with the same id and arguments, a creation that failed part-way (an
        OutcomeTimeout, a partition that could not apply it yet) is completed with the same key, and
        one that committed is answered the same credential."""
        command_id = _issuance_id(command_id)
        if isinstance(self._transport, LogTransport):
            from keyload.storage.principals import write_credential  # lazily: it writes the keyring

            root = self._transport.data.root
            credential = self._new_credential(root, principal, key_id, command_id)
            self.put_principal(
                principal, key_id=credential.key_id, grants=grants, expected_revision=0, command_id=command_id
            )
            # A repeat answered its stored outcome after a later rotation: the file keeps the key in force.
            if self.inspect_principal(principal).principal.key_id == credential.key_id:
                write_credential(root, credential)
            return credential
        self._server_makes_the_key(key_id)
        return self._http("create_principal").issue_credential(
            principal, [grant.to_avro() for grant in grants], command_id, self.timeout_s
        )

    def rotate_credential(
        self, principal: str, *, key_id: str | None = None, command_id: str | None = None
    ) -> Credential:
        """A new key and credential for an existing principal (a local client also replaces its file);
        commands signed with the old key are refused from the log position of the change on (the old
        key stays in the keyring for replays). For a principal that does not exist: NotFound or
        RevisionConflict from a local client; from a server, which refuses before appending anything
        (so there is no outcome to carry), KeyloadError naming its 404. `key_id` and `command_id`: as
        for `create_principal` (a repeat of a rotation that committed rotates nothing again)."""
        repeatable = command_id is not None  # only an id the caller chose can be sent again
        command_id = _issuance_id(command_id)
        if isinstance(self._transport, LogTransport):
            from keyload.storage.principals import SERVICE_ACTORS, write_credential  # lazily: it writes the keyring

            if principal in SERVICE_ACTORS:  # a server refuses them too (403)
                raise InvalidCommand(
                    f"{principal} is one of the service's own principals, which sign with the keys the service "
                    "holds: it keeps its key (the administrator's may be rotated); nothing was appended"
                )
            root = self._transport.data.root
            current = self.inspect_principal(principal).principal
            credential = self._new_credential(root, principal, key_id, command_id)
            # A repeat of a rotation that committed finds its key in force: sent as first sent (at the
            # revision before it), it is answered the stored outcome, as a server's repeat is.
            repeat = repeatable and current.key_id == credential.key_id
            revision = current.revision - 1 if repeat else current.revision
            self.put_principal(principal, key_id=credential.key_id, expected_revision=revision, command_id=command_id)
            write_credential(root, credential)
            return credential
        self._server_makes_the_key(key_id)
        return self._http("rotate_credential").issue_credential(principal, None, command_id, self.timeout_s)

    def _new_credential(self, root: Path, principal: str, key_id: str | None, command_id: str) -> Credential:
        """The credential a local operator's creation or rotation gives: on the keyring's `key_id`, or
        on the key of this issuance (the same again when the command is sent again by its id). A key
        of this issuance that a partition's principal holds but this keyring lacks was made by another
        node's keyring (Kafka): making it here would give the key id another secret."""
        from keyload.storage import keyring
        from keyload.storage.principals import issued_credential, issued_key_id, new_credential  # lazily

        if key_id is not None:
            return new_credential(root, principal, key_id)
        issued = issued_key_id(self.principal, principal, command_id)
        if issued not in keyring.load(root) and issued in self._principal_keys(principal):
            raise CredentialError(
                f"{principal} holds key {issued}, which another keyring made for this command: send it again "
                "where it was first sent, or copy that keyring here first"
            )
        return issued_credential(root, self.principal, principal, command_id)

    def _principal_keys(self, principal: str) -> set[str]:
        """The key ids the partitions' policies give `principal` (none where it does not exist)."""
        held = set()
        for partition in range(self.partitions):
            with contextlib.suppress(NotFoundError):
                held.add(self.inspect_principal(principal, partition=partition).principal.key_id)
        return held

    @staticmethod
    def _server_makes_the_key(key_id: str | None) -> None:
        if key_id is not None:
            raise InvalidCommand("a server makes the principal's key itself: key_id is for a local client's keyring")

    def _send_everywhere(self, name: str, body: dict[str, Any], command_id: str | None) -> PrincipalView:
        """Send a principal command to every partition under one command id; partition 0's view."""
        command_id = str(uuid.uuid4()) if command_id is None else command_id
        key_field = self.commands[name].principal_key_field
        if key_field is not None and isinstance(self._transport, LogTransport):  # a server checks it itself
            self._transport.refuse_signing_key(body.get(key_field))
        views = [self._send_to(PrincipalView, name, p, body, command_id) for p in range(self.partitions)]
        return views[0]

    def _send_to(
        self, result: type[T], name: str, partition: int, body: dict[str, Any], command_id: str | None = None
    ) -> T:
        """`_send` of a partition-wide command."""
        return self._send(result, name, self.partition_domain(partition), body, command_id)

    def partition_domain(self, partition: int) -> str:
        """The system domain partition-wide commands (`send` of Checkpoint, ListRetention, ...) are sent under."""
        self._check_partition(partition)
        return domain_for_partition(partition, self.partitions)

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise InvalidCommand(f"partition must be 0..{self.partitions - 1}")

    def poison_entries(self, partition: int | None = None, *, limit: int = DEFAULT_POISON_LIMIT) -> list[PoisonEntry]:
        """Command-log records no command could be read from (undecodable bytes, an unknown schema, a
        bad command id), as the processors recorded them: skipped, never retried, never answered.

        In partition then offset order, at most `limit`; every partition, or one. Read straight from
        this data directory's projections (read-only: `keyload run` may be serving them), so in Kafka
        mode only the partitions whose projections live here. Each entry carries the record's first
        bytes while the log still holds it.
        """
        from keyload.projections.store import Store, poison_rows  # lazily: see the imports

        if limit < 1:
            raise InvalidCommand("limit must be >= 1")
        data = self._local("poison_entries").data
        if partition is not None:
            self._check_partition(partition)
        entries: list[PoisonEntry] = []
        for number in data.projected_partitions():  # a partition never served yet has recorded nothing
            if partition not in (None, number):
                continue
            if len(entries) == limit:
                break
            store = Store(data.projection(number), read_only=True)
            try:
                rows = list(itertools.islice(poison_rows(store), limit - len(entries)))
            finally:
                store.close()
            for _, value in rows:
                record = REGISTRY.decode("keyload.PoisonEntry", value)
                entries.append(
                    PoisonEntry(
                        partition=number,
                        offset=record["offset"],
                        timestamp_ms=record["timestamp_ms"],
                        size=record["length"],
                        sha256=record["sha256"].hex(),
                        reason=record["reason"],
                        first_bytes=self._record_start(number, record["offset"]),
                    )
                )
        return entries

    def census(self, partition: int | None = None) -> list[Census]:
        """What each partition's projection holds by key family, the bounded work it has left, and the
        rows kept to a horizon, within it and past it (`keyload census`; keyload/operations/census.py):
        for every partition with a projection, or the one named (CensusError when it has none yet).

        Locally it reads this data directory's projections read-only (`keyload run` may be serving
        them; in Kafka mode only the partitions whose projections live here); over HTTP the server
        reads its own (`GET /v1/census`, for a principal that may inspect every domain). It reads
        every row: about a second per million rows, with no time limit."""
        if partition is not None:
            self._check_partition(partition)
        if isinstance(self._transport, LogTransport):
            from keyload.operations.census import censuses  # lazily: see the imports

            return censuses(self._transport.data, partition)
        return self._http("census").census(partition)

    def _record_start(self, partition: int, offset: int) -> bytes | None:
        """The first bytes of a command-log record; None once it is truncated away or unreadable."""
        try:
            records = self._local("poison_entries").commands.read(partition, offset, 1)
        except LogError:
            return None
        if not records or records[0].offset != offset:
            return None
        return records[0].value[:POISON_PREVIEW_BYTES]

    # -- retention (the GC worker's commands, keyload/operations/gc.py) ---------------------------------

    def list_retention(
        self, partition: int, *, after_task: int | None = None, limit: int | None = None
    ) -> RetentionPage:
        """Retention tasks in task order, each with what blocks its deletion now; the recovery floor."""
        body = {"after_task": after_task, "limit": limit}
        return self._send_to(RetentionPage, "ListRetention", partition, body, None)

    def advance_recovery_floor(self, partition: int, floor_offset: int) -> RetentionPage:
        """Log the partition's recovery floor (never lowers it); compacts finished tasks below it."""
        body = {"floor_offset": floor_offset}
        return self._send_to(RetentionPage, "AdvanceRecoveryFloor", partition, body, None)

    def begin_delete(self, partition: int, task_id: int) -> RetentionStatus:
        """Ask to delete a task's object; CommandRejected (Conflict) says what still blocks it."""
        return self._send_to(RetentionStatus, "BeginDelete", partition, {"task_id": task_id}, None)

    def delete_confirmed(self, partition: int, task_id: int, deleted_versions: list[str]) -> RetentionStatus:
        """Report a finished deletion (no version of the object is left); releases its quota."""
        body = {"task_id": task_id, "deleted_versions": deleted_versions}
        return self._send_to(RetentionStatus, "DeleteConfirmed", partition, body, None)

    def request_checkpoint(self, partition: int, *, command_id: str | None = None) -> CheckpointResult:
        """Ask the partition's runtime for a checkpoint at this command's offset."""
        return self._send_to(CheckpointResult, "Checkpoint", partition, {}, command_id)
