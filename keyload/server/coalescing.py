"""Coalesced Enqueues: concurrent requests that allow it are appended as Batch commands.

A request to enqueue one message that carries `Keyload-Coalesce: true` and no `Idempotency-Key`
joins the other such requests of its caller (principal and credential key) to its domain: one Batch
command carries them, up to MAX_BATCH_MUTATIONS messages and COALESCED_BATCH_BYTES of bodies,
headers and ids (a larger message goes alone). The requests arriving while a Batch of their line is
in flight, or in the same turn of the event loop as the first, go together in the next one; nothing
waits on a clock. A command costs the processor a fixed share of its work whatever it carries, so a
Batch of many messages costs it less per message than as many Enqueues (bench/README.md,
bench.coalesce).

Each request is answered as a lone Enqueue would be, with its own result or its own refusal:

- A Batch is all or nothing. When the service refuses one message (its queue is full or missing,
  its id is used), nothing of the Batch applied: that request gets the refusal (its detail without
  the `mutation i: ` prefix, `failed_index` null) and the rest go again, in order, as a new Batch.
  A Batch the server cannot encode (over the log's record limit: CommandTooLarge) goes again
  message by message, so only a message that cannot go alone fails.
- A message's id defaults to the command id the server gave its request, as a lone Enqueue's does;
  its outcome's `command_id` (and the `Keyload-Command-Id` header) names the Batch that carried it.
- A Batch without an answer answers each of its requests with that error: a halted partition or a
  stopping service 503, a log that cannot be written 503, no outcome in time 504 (`UnknownOutcome`,
  naming the Batch and the message id to enqueue again by). Such a request has no command id of its
  own to send again, which is why coalescing is for requests without an Idempotency-Key: a producer
  that must retry by id coalesces in its own process (keyload/sdk/coalescer.py), where the Batch's id
  is kept.

Everything runs on the event loop: a line is a list, and no await comes between the checks and the
changes of one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keyload.bodies import Branch
from keyload.commands import BY_NAME, part_detail
from keyload.credentials import Credential
from keyload.errors import InvalidCommand
from keyload.limits import COALESCED_BATCH_BYTES, MAX_BATCH_MUTATIONS
from keyload.log.codec import Record
from keyload.server.writer import Answer, Halted

COALESCED_KIND = "Enqueue"  # the one kind a request may ask to coalesce: a Batch's result holds its own
BATCH = BY_NAME["Batch"].branch
ENQUEUE = BY_NAME[COALESCED_KIND].branch

# Sign a command for a credential, append it, await its outcome: Engine.submit.
Submit = Callable[[Credential, str, str, int, Branch], Awaitable[Answer]]
_Request = tuple[Record, "asyncio.Future[Answer]"]  # an Enqueue's datum, and its request's answer

log = logging.getLogger("keyload.server")


class UnknownOutcome(TimeoutError):
    """The Batch that carried a coalesced message had no outcome in time (HTTP 504): the message may
    or may not be enqueued, and the request has no command id to learn it by."""

    def __init__(self, batch_id: str, message_id: str, waited_s: str) -> None:
        super().__init__(
            f"no outcome within {waited_s} for Batch {batch_id!r}, which carried message {message_id!r}: it may "
            "still apply; enqueue the message again under that message_id (409 Conflict then means it is enqueued)"
        )


@dataclass
class _Line:
    """The requests of one caller to one domain waiting for a Batch, in the order they came."""

    waiting: list[_Request] = field(default_factory=list)
    sending: bool = False


class Coalescing:
    def __init__(self, submit: Submit, outcome_wait: str) -> None:
        self._submit = submit
        self._outcome_wait = outcome_wait  # how long a request waits for an outcome, as the 504 says it
        self._lines: dict[tuple[str, str, str], _Line] = {}  # by (principal, key id, domain)
        self._tasks: set[asyncio.Task[None]] = set()  # the sending tasks, held until done

    async def enqueue(self, credential: Credential, domain: str, partition: int, enqueue: Record) -> Answer:
        """The outcome of one Enqueue (its datum, filled as the request's own command would be), as a
        lone Enqueue's would read, carried in a Batch with the caller's other coalesced requests."""
        key = (credential.principal, credential.key_id, domain)
        line = self._lines.setdefault(key, _Line())
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        line.waiting.append((enqueue, answer))
        if not line.sending:
            line.sending = True
            task = asyncio.create_task(self._send(key, line, credential, partition))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await answer

    async def _send(self, key: tuple[str, str, str], line: _Line, credential: Credential, partition: int) -> None:
        taken: list[_Request] = []
        try:
            while line.waiting:
                taken = _taken(line.waiting)
                del line.waiting[: len(taken)]
                await self._send_batch(credential, key[2], partition, [r for r in taken if not r[1].cancelled()])
        except asyncio.CancelledError:  # the service is stopping: no request is left waiting on the task
            _fail([*taken, *line.waiting], Halted("the service is stopping"))
            line.waiting.clear()
            raise
        except Exception as defect:  # of the coalescing itself: each request fails alone, as it would (500)
            log.exception("coalesced enqueues to %s failed", key[2][:64])
            _fail([*taken, *line.waiting], defect)
            line.waiting.clear()
        finally:
            line.sending = False
            if not line.waiting:
                del self._lines[key]

    async def _send_batch(self, credential: Credential, domain: str, partition: int, requests: list[_Request]) -> None:
        """One Batch of the requests' messages. A message the service refuses is answered with its
        refusal and the rest go again; a Batch that cannot be encoded goes again message by message."""
        while requests:
            batch_id = str(uuid.uuid4())
            mutations = [{"domain": None, "mutation": (ENQUEUE, enqueue)} for enqueue, _ in requests]
            batch = (BATCH, {"mutations": mutations})
            try:
                outcome = await self._submit(credential, batch_id, domain, partition, batch)
            except InvalidCommand as error:
                if len(requests) == 1:
                    _fail(requests, error)
                    return
                for request in requests:
                    await self._send_batch(credential, domain, partition, [request])
                return
            except TimeoutError:
                for enqueue, answer in requests:
                    _fail([(enqueue, answer)], UnknownOutcome(batch_id, enqueue["message_id"], self._outcome_wait))
                return
            except Exception as error:  # no outcome (a halted partition, a log that cannot be written)
                _fail(requests, error)
                return
            record = outcome.record
            if record["status"] == "committed":
                _, carried = record["result"]
                for (_, answer), result in zip(requests, carried["results"], strict=True):
                    _answer(answer, {**record, "result": result})
                return
            failed = record["failed_index"]
            if failed is None or not 0 <= failed < len(requests):  # the Batch as a whole: each its refusal
                for _, answer in requests:
                    _answer(answer, record)
                return
            _answer(requests.pop(failed)[1], {**record, "detail": part_detail(failed, record["detail"])})


def _taken(waiting: list[_Request]) -> list[_Request]:
    """The next Batch's requests: the first ones, up to the count and the bytes (the first always)."""
    size = 0
    for index, (enqueue, _) in enumerate(waiting[:MAX_BATCH_MUTATIONS]):
        size += _size(enqueue)
        if index and size > COALESCED_BATCH_BYTES:
            return waiting[:index]
    return waiting[:MAX_BATCH_MUTATIONS]


def _size(enqueue: Record) -> int:
    """What a message adds to its Batch: body, header names and values, ids (UTF-8 bytes)."""
    texts = [enqueue["message_id"], enqueue["ordering_key"] or "", *enqueue["headers"], *enqueue["headers"].values()]
    return len(enqueue["body"]) + sum(len(text.encode()) for text in texts)


def _answer(answer: asyncio.Future[Answer], record: Record) -> None:
    if not answer.done():
        answer.set_result(Answer({**record, "failed_index": None}))


def _fail(requests: list[_Request], error: BaseException) -> None:
    for _, answer in requests:
        if not answer.done():
            answer.set_exception(error)
