"""Coalesced Enqueues: concurrent requests that allow it are appended as Batch commands.

A request to enqueue one message that carries `Keyload-Coalesce: true` and no `Idempotency-Key`
joins the other such requests of its caller (the credential's key) to its domain: one Batch command
carries them, up to MAX_BATCH_MUTATIONS messages and MAX_COALESCED_BYTES of bodies (a larger message
goes alone). The requests arriving while a Batch of their line is in flight, or in the same turn of
the event loop as the first, go together in the next one; nothing waits on a clock. A command costs
the processor a fixed share of its work whatever it carries, so a Batch of many messages costs it
less per message than as many Enqueues (bench/README.md, bench.coalesce).

Each request is answered as a lone Enqueue would be, with its own result or its own refusal:

- A Batch is all or nothing. When the service refuses one message (its queue is full or missing,
  its id is used), nothing of the Batch applied: that request gets the refusal (its detail without
  the `mutation i: ` prefix, `failed_index` null) and the rest go again, in order, as a new Batch.
- A message's id defaults to the command id the server gave its request, as a lone Enqueue's does;
  its outcome's `command_id` (and the `Keyload-Command-Id` header) names the Batch that carried it.
- A Batch without an answer (a halted partition, a full disk, no outcome in time) answers each of its
  requests with that error. Such a request has no command id of its own to send again, which is why
  coalescing is for requests without an Idempotency-Key: a producer that must retry by id sends them
  one by one, or coalesces in its own process (keyload/sdk/coalescer.py), where the Batch's id is kept.

Everything runs on the event loop: a line is a list, and no await comes between the checks and the
changes of one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keyload.bodies import Branch
from keyload.commands import BY_NAME
from keyload.credentials import Credential
from keyload.limits import MAX_BATCH_MUTATIONS
from keyload.log.codec import Record
from keyload.server.writer import Answer

COALESCED_KIND = "Enqueue"  # the one kind a request may ask to coalesce: a Batch's result holds its own
MAX_COALESCED_BYTES = 1024 * 1024  # bodies of one Batch (one log record of at most 4 MiB)
BATCH = BY_NAME["Batch"].branch
ENQUEUE = BY_NAME[COALESCED_KIND].branch

# Sign a command for a credential, append it, await its outcome: Engine.submit.
Submit = Callable[[Credential, str, str, int, Branch], Awaitable[Answer]]


@dataclass
class _Line:
    """The requests of one caller to one domain waiting for a Batch, in the order they came."""

    waiting: list[tuple[Record, asyncio.Future[Answer]]] = field(default_factory=list)
    sending: bool = False


class Coalescing:
    def __init__(self, submit: Submit) -> None:
        self._submit = submit
        self._lines: dict[tuple[str, str], _Line] = {}  # by (key id, domain)
        self._tasks: set[asyncio.Task[None]] = set()  # the sending tasks, held until done

    async def enqueue(self, credential: Credential, domain: str, partition: int, enqueue: Record) -> Answer:
        """The outcome of one Enqueue (its datum, filled as the request's own command would be), as a
        lone Enqueue's would read, carried in a Batch with the caller's other coalesced requests."""
        key = (credential.key_id, domain)
        line = self._lines.setdefault(key, _Line())
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        line.waiting.append((enqueue, answer))
        if not line.sending:
            line.sending = True
            task = asyncio.create_task(self._send(key, line, credential, partition))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await answer

    async def _send(self, key: tuple[str, str], line: _Line, credential: Credential, partition: int) -> None:
        try:
            while line.waiting:
                taken = _taken(line.waiting)
                del line.waiting[: len(taken)]
                await self._send_batch(credential, key[1], partition, taken)
        finally:
            line.sending = False
            if not line.waiting:
                del self._lines[key]

    async def _send_batch(
        self, credential: Credential, domain: str, partition: int, calls: list[tuple[Record, asyncio.Future[Answer]]]
    ) -> None:
        """One Batch of the messages; a message the service refuses is answered with its refusal and
        the rest go again. Every request's future is settled (a cancelled one, its request gone, is
        left alone)."""
        while calls:
            mutations = [{"domain": None, "mutation": (ENQUEUE, enqueue)} for enqueue, _ in calls]
            try:
                outcome = await self._submit(
                    credential, str(uuid.uuid4()), domain, partition, (BATCH, {"mutations": mutations})
                )
            except Exception as error:  # no outcome: each request answers with the error
                for _, answer in calls:
                    if not answer.done():
                        answer.set_exception(error)
                return
            record = outcome.record
            if record["status"] == "committed":
                _, batch = record["result"]
                for (_, answer), result in zip(calls, batch["results"], strict=True):
                    _settle(answer, {**record, "result": result})
                return
            failed = record["failed_index"]
            if failed is None or not 0 <= failed < len(calls):  # the Batch as a whole: each its refusal
                for _, answer in calls:
                    _settle(answer, record)
                return
            detail = record["detail"].removeprefix(f"mutation {failed}: ")
            _settle(calls.pop(failed)[1], {**record, "detail": detail})


def _taken(waiting: list[tuple[Record, asyncio.Future[Answer]]]) -> list[tuple[Record, asyncio.Future[Answer]]]:
    """The next Batch's requests: the first ones, up to the count and the bytes (the first always)."""
    size = 0
    for index, (enqueue, _) in enumerate(waiting[:MAX_BATCH_MUTATIONS]):
        size += len(enqueue["body"])
        if index and size > MAX_COALESCED_BYTES:
            return waiting[:index]
    return waiting[:MAX_BATCH_MUTATIONS]


def _settle(answer: asyncio.Future[Answer], record: Record) -> None:
    if not answer.done():
        answer.set_result(Answer({**record, "failed_index": None}))
