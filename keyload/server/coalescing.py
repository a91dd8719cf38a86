"""Coalesced requests: concurrent Enqueues and acks that allow it are appended as batch commands.

A request to enqueue one message (`POST …/queues/{q}/messages`), to ack one lease (`POST
…/leases/ack`) or to ack one position of a subscription group (`POST …/groups/{g}/ack`) that carries
`Keyload-Coalesce: true` and no `Idempotency-Key` joins the other such requests of its kind from its
caller (principal and credential key) to its domain (and a group's acks, to their group): one
command carries them, a Batch of their Enqueues, an AckBatch or a GroupAckBatch of their tokens, up
to MAX_BATCH_MUTATIONS (MAX_ACK_BATCH) requests and COALESCED_BATCH_BYTES of bodies, headers, ids
and tokens (a larger request is carried by itself). The requests arriving while a command of their
line is in flight, or in the same turn of the event loop as the first, go together in the next one;
nothing waits on a clock. A command costs the processor a fixed share of its work whatever it
carries, so a command of many requests costs it less per request than as many lone commands
(bench/README.md, bench.coalesce).

Each request is answered as it would be without the header, with its own result or its own refusal:

- A Batch is all or nothing. When the service refuses one message (its queue is full or missing,
  its id is used), nothing of the Batch applied: that request gets the refusal (its detail without
  the `mutation i: ` prefix, `failed_index` null) and the rest go again, in order, as a new Batch.
- An AckBatch or GroupAckBatch settles each token on its own. An acked token's request is answered
  with the LeaseResult (GroupLeaseResult) a lone Ack (GroupAck) gives: the message or position
  acked, no lease left, and a group's checkpoint right after that token's ack, which the token's
  result holds from feature level 10 (processors/features.py; on a partition below it, where a raise
  was refused or an older processor applies, the checkpoint after the GroupAckBatch's last token,
  which may be later than a lone GroupAck's). A refused token's result holds only its error code, so
  its request goes again alone, under the request's own command id, and is answered with that
  command's outcome: the refusal with its detail (or, if the token has become good since, the ack).
  The refused acks of one command go alone together, not one after another: each settles its own
  lease, so their order does not matter.
- A command the server cannot encode (over the log's record limit: CommandTooLarge) is sent again
  request by request, each alone under its own command id, so only a request that cannot go alone
  fails, as it would have without the header.
- A message's id defaults to the command id the server gave its request, as a lone Enqueue's does.
  The outcome's `command_id` (and the `Keyload-Command-Id` header) names the command that carried
  the request: the Batch, AckBatch or GroupAckBatch, or the request's own when it went alone.
- A command without an answer answers each of its requests with that error: a halted partition or
  a stopping service 503, a log that cannot be written 503, no outcome in time 504
  (`UnknownOutcome`, naming the command and what to do). Such a request has no command id of its
  own to send again, which is why coalescing is for requests without an Idempotency-Key: a client
  that must retry by id coalesces in its own process (keyload/sdk/coalescer.py), where the
  command's id is kept.

Everything runs on the event loop: a line is a list, and no await comes between the checks and the
changes of one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keyload.bodies import Branch
from keyload.commands import BY_NAME, part_detail
from keyload.credentials import Credential
from keyload.errors import InvalidCommand
from keyload.limits import COALESCED_BATCH_BYTES, MAX_ACK_BATCH, MAX_BATCH_MUTATIONS
from keyload.log.codec import Record
from keyload.server.writer import Answer, Halted

# Sign a command for a credential, append it, await its outcome: Engine.submit.
Submit = Callable[[Credential, str, str, int, Branch], Awaitable[Answer]]

log = logging.getLogger("keyload.server")


class UnknownOutcome(TimeoutError):
    """The command that carried a coalesced request had no outcome in time (HTTP 504): the request
    may or may not have applied, and it has no command id of its own to learn it by."""

    def __init__(self, kind: str, command_id: str, carried: str, waited_s: str, learn: str) -> None:
        super().__init__(f"no outcome within {waited_s} for {kind} {command_id!r}, which carried {carried}: {learn}")


@dataclass(slots=True)
class _Request:
    command_id: str  # the request's own, which it goes alone under
    datum: Record  # the body of its own command
    answer: asyncio.Future[Answer]


class _Carrier(ABC):
    """How the requests of one command kind ride together in one command of another."""

    kind: str  # the requests' own command kind
    batch: str  # the kind of the command that carries them
    joins: str = "domain"  # what a caller's requests must share to ride together, beyond their kind
    most: int  # requests one command carries at most
    # Whether the requests apply in the order they came (a queue's messages): then those that go
    # alone go one after another; else (acks, each settling its own lease) all at once.
    ordered: bool

    def line(self, datum: Record) -> tuple[str, ...]:
        """What a request's line is keyed by beyond its caller and domain: what the carrying command
        names once for all it carries (a group's acks: the topic and the group)."""
        return ()

    @abstractmethod
    def body(self, data: list[Record]) -> Record:
        """The carrying command's body, of the requests' own commands' bodies in order (one line's)."""

    @abstractmethod
    def size(self, datum: Record) -> int:
        """What a request adds to its carrying command (UTF-8 bytes), against COALESCED_BATCH_BYTES."""

    @abstractmethod
    def answered(self, outcome: Record, requests: list[_Request]) -> list[_Request]:
        """Answer each request the carrying command's committed outcome answers as its own command's
        would; the requests it cannot answer so, to go alone."""

    @abstractmethod
    def unknown(self, command_id: str, datum: Record, waited_s: str) -> UnknownOutcome:
        """The error of a request whose carrying command had no outcome in time."""


class _Enqueues(_Carrier):
    """Enqueues in a Batch: each mutation's result is its Enqueue's."""

    kind, batch, most, ordered = "Enqueue", "Batch", MAX_BATCH_MUTATIONS, True

    def body(self, data: list[Record]) -> Record:
        return {"mutations": [{"domain": None, "mutation": (BY_NAME[self.kind].branch, datum)} for datum in data]}

    def size(self, datum: Record) -> int:
        texts = [datum["message_id"], datum["ordering_key"] or "", *datum["headers"], *datum["headers"].values()]
        return len(datum["body"]) + sum(len(text.encode()) for text in texts)

    def answered(self, outcome: Record, requests: list[_Request]) -> list[_Request]:
        _, carried = outcome["result"]
        for request, result in zip(requests, carried["results"], strict=True):
            _answer(request, {**outcome, "result": result})
        return []

    def unknown(self, command_id: str, datum: Record, waited_s: str) -> UnknownOutcome:
        learn = (
            "it may still apply; enqueue the message again under that message_id "
            "(409 Conflict then means it is enqueued)"
        )
        return UnknownOutcome(self.batch, command_id, f"message {datum['message_id']!r}", waited_s, learn)


class _Settles(_Carrier):
    """Acks in a command of tokens: an acked token's request gets the result of its lone ack; a refused
    token's result holds only its error code, so its request goes alone for its own refusal."""

    most, ordered = MAX_ACK_BATCH, False

    @abstractmethod
    def acked(self, result: Record, carried: Record) -> Record:
        """A lone ack's result for a token the carrying command acked (`result`, of its `carried` result)."""

    def size(self, datum: Record) -> int:
        return len(datum["token"].encode())

    def answered(self, outcome: Record, requests: list[_Request]) -> list[_Request]:
        _, carried = outcome["result"]
        refused = []
        for request, result in zip(requests, carried["results"], strict=True):
            if result["status"] != "committed":
                refused.append(request)
                continue
            _answer(request, {**outcome, "result": (BY_NAME[self.kind].result, self.acked(result, carried))})
        return refused

    def unknown(self, command_id: str, datum: Record, waited_s: str) -> UnknownOutcome:
        learn = (
            "it may still apply; ack again with the same token "
            "(a 409 StaleLease or 410 LeaseExpired then means the lease is no longer held: acked, or ended)"
        )
        return UnknownOutcome(self.batch, command_id, "this ack", waited_s, learn)


class _Acks(_Settles):
    """A queue's acks in an AckBatch."""

    kind, batch = "Ack", "AckBatch"

    def body(self, data: list[Record]) -> Record:
        return {"tokens": [datum["token"] for datum in data]}

    def acked(self, result: Record, carried: Record) -> Record:
        # What processors/queues/leases.py's `_lease_result` gives for a lease it acked.
        return {
            "message_id": result["message_id"],
            "state": "acked",
            "lease_until_ms": None,
            "not_before_ms": None,
            "retry_delay_ms": None,
        }


class _GroupAcks(_Settles):
    """A subscription group's acks in a GroupAckBatch, which names the topic and group once."""

    kind, batch, joins = "GroupAck", "GroupAckBatch", "group"

    def line(self, datum: Record) -> tuple[str, ...]:
        return (datum["topic"], datum["group"])

    def body(self, data: list[Record]) -> Record:
        return {"topic": data[0]["topic"], "group": data[0]["group"], "tokens": [datum["token"] for datum in data]}

    def acked(self, result: Record, carried: Record) -> Record:
        # What processors/groups/leases.py's `_lease_result` gives for a position it acked. Below
        # feature level 10 the token's result has no checkpoint of its own: the batch's (after its
        # last token) is the nearest the outcome holds, and the ack has applied, so it cannot go again.
        checkpoint = result["checkpoint"]
        return {
            "position": result["position"],
            "state": "acked",
            "checkpoint": carried["checkpoint"] if checkpoint is None else checkpoint,
            "lease_until_ms": None,
            "not_before_ms": None,
            "retry_delay_ms": None,
        }


CARRIERS: dict[str, _Carrier] = {carrier.kind: carrier for carrier in (_Enqueues(), _Acks(), _GroupAcks())}
COALESCED_KINDS = tuple(CARRIERS)  # the kinds a request may ask to coalesce


@dataclass
class _Line:
    """The requests of one kind from one caller to one domain (a group's acks: to one group) waiting for a
    command, in the order they came."""

    waiting: list[_Request] = field(default_factory=list)
    sending: bool = False


_LineKey = tuple[str, ...]  # (kind, principal, key id, domain, *what the carrier keys by)


class Coalescing:
    def __init__(self, submit: Submit, outcome_wait: str) -> None:
        self._submit = submit
        self._outcome_wait = outcome_wait  # how long a request waits for an outcome, as the 504 says it
        self._lines: dict[_LineKey, _Line] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # the sending tasks, held until done

    async def submit(
        self, kind: str, credential: Credential, command_id: str, domain: str, partition: int, datum: Record
    ) -> Answer:
        """The outcome of one request's command of `kind` (its body `datum`, filled under the request's
        `command_id`), as a lone command's would read, carried with the caller's other coalesced
        requests of that kind."""
        carrier = CARRIERS[kind]
        key = (kind, credential.principal, credential.key_id, domain, *carrier.line(datum))
        line = self._lines.setdefault(key, _Line())
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        line.waiting.append(_Request(command_id, datum, answer))
        if not line.sending:
            line.sending = True
            task = asyncio.create_task(self._send(carrier, key, line, credential, domain, partition))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await answer

    async def _send(
        self, carrier: _Carrier, key: _LineKey, line: _Line, credential: Credential, domain: str, partition: int
    ) -> None:
        taken: list[_Request] = []
        try:
            while line.waiting:
                taken = _taken(carrier, line.waiting)
                del line.waiting[: len(taken)]
                live = [request for request in taken if not request.answer.cancelled()]
                alone = await self._carry(carrier, credential, domain, partition, live)
                if carrier.ordered:
                    for request in alone:
                        await self._alone(carrier, credential, domain, partition, request)
                else:
                    await asyncio.gather(*(self._alone(carrier, credential, domain, partition, r) for r in alone))
        except asyncio.CancelledError:  # the service is stopping: no request is left waiting on the task
            _fail([*taken, *line.waiting], Halted("the service is stopping"))
            line.waiting.clear()
            raise
        except Exception as defect:  # of the coalescing itself: each request fails alone, as it would (500)
            log.exception("coalesced %s requests to %s failed", carrier.kind, domain[:64])
            _fail([*taken, *line.waiting], defect)
            line.waiting.clear()
        finally:
            line.sending = False
            if not line.waiting:
                del self._lines[key]

    async def _carry(
        self, carrier: _Carrier, credential: Credential, domain: str, partition: int, requests: list[_Request]
    ) -> list[_Request]:
        """Carry the requests in one command; a request it refuses is answered with its refusal and the
        rest carried again. The requests left to go alone: those the carrying command could not answer,
        or all when it could not be encoded."""
        while requests:
            command_id = str(uuid.uuid4())
            body = (BY_NAME[carrier.batch].branch, carrier.body([request.datum for request in requests]))
            try:
                outcome = (await self._submit(credential, command_id, domain, partition, body)).record
            except InvalidCommand:
                return requests
            except TimeoutError:
                for request in requests:
                    _fail([request], carrier.unknown(command_id, request.datum, self._outcome_wait))
                return []
            except Exception as error:  # no outcome (a halted partition, a log that cannot be written)
                _fail(requests, error)
                return []
            if outcome["status"] == "committed":
                return carrier.answered(outcome, requests)
            failed = outcome["failed_index"]
            if failed is None or not 0 <= failed < len(requests):  # the command as a whole: each its refusal
                for request in requests:
                    _answer(request, outcome)
                return []
            _answer(requests.pop(failed), {**outcome, "detail": part_detail(failed, outcome["detail"])})
        return []

    async def _alone(
        self, carrier: _Carrier, credential: Credential, domain: str, partition: int, request: _Request
    ) -> None:
        """Send the request's own command under its own id, as without the header (unless its client
        has gone: then nothing is sent)."""
        if request.answer.done():
            return
        body = (BY_NAME[carrier.kind].branch, request.datum)
        try:
            answer = await self._submit(credential, request.command_id, domain, partition, body)
        except Exception as error:  # answered as the request alone would have been: a 400, 503 or 504
            _fail([request], error)
            return
        _settle(request, answer)


def _taken(carrier: _Carrier, waiting: list[_Request]) -> list[_Request]:
    """The next command's requests: the first ones, up to the count and the bytes (the first always)."""
    size = 0
    for index, request in enumerate(waiting[: carrier.most]):
        size += carrier.size(request.datum)
        if index and size > COALESCED_BATCH_BYTES:
            return waiting[:index]
    return waiting[: carrier.most]


def _answer(request: _Request, record: Record) -> None:
    """Answer with an outcome of the carrying command, made the request's own."""
    _settle(request, Answer({**record, "failed_index": None}))


def _settle(request: _Request, answer: Answer) -> None:
    if not request.answer.done():  # not given up on by its client
        request.answer.set_result(answer)


def _fail(requests: list[_Request], error: BaseException) -> None:
    for request in requests:
        if not request.answer.done():
            request.answer.set_exception(error)
