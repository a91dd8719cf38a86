"""The server's side of the embedded log: it appends the commands of HTTP requests and answers
each request when the processor publishes its outcome.

Why it is fast where a local client is slow: a local client fsyncs its own append, rings the
doorbell and polls the outcome stream. The server appends without an fsync (the processor's
`sync_through` makes the records durable before any outcome is published, so one fsync covers
every request appended meanwhile: group commit), gathers the appends of all requests that arrive
in one turn of the event loop into one write per partition, and is told of each published outcome
in-process (`OutcomeWaiters.published`, called by the runtime), so nothing polls.

Threads: requests run on the server's event loop; the processors run on the service's main thread
and call `published` from there. Waiters are added and removed on the event loop only; the
processor thread hands outcomes over with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

from keyload.credentials import contents
from keyload.log.codec import REGISTRY, Record
from keyload.log.file_log import FileLog
from keyload.service.doorbell import Doorbell

OUTCOME = "keyload.Outcome"
_Key = tuple[str, str]  # (domain, command id): command ids are scoped by domain


@dataclass(frozen=True, slots=True)
class Answer:
    """A published outcome, decoded."""

    record: Record


class OutcomeWaiters:
    """Requests waiting for their outcome, by (domain, command id)."""

    def __init__(self, reply_partition: int) -> None:
        self.reply_partition = reply_partition
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[_Key, list[asyncio.Future[Answer]]] = defaultdict(list)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the waiting requests run on (the server's, once it starts)."""
        self._loop = loop

    def expect(self, domain: str, command_id: str) -> asyncio.Future[Answer]:
        """A future the outcome of (domain, command id) resolves; register before appending."""
        assert self._loop is not None, "attach the event loop first"
        future: asyncio.Future[Answer] = self._loop.create_future()
        self._waiting[(domain, command_id)].append(future)
        return future

    def forget(self, domain: str, command_id: str, future: asyncio.Future[Answer]) -> None:
        """Stop waiting (the request timed out or its client went away)."""
        waiting = self._waiting.get((domain, command_id))
        if waiting is not None and future in waiting:
            waiting.remove(future)
            if not waiting:
                del self._waiting[(domain, command_id)]

    def published(self, reply_partition: int, outcomes: list[bytes]) -> None:
        """Called by the runtime (processor thread) with outcomes it has published: those for the
        server's reply partition are handed to the event loop. Cheap when nobody waits."""
        loop = self._loop
        if reply_partition == self.reply_partition and self._waiting and loop is not None:
            loop.call_soon_threadsafe(self._deliver, outcomes)

    def _deliver(self, outcomes: list[bytes]) -> None:
        for value in outcomes:
            if not self._waiting:
                return
            record = REGISTRY.decode(OUTCOME, contents(value))
            waiting = self._waiting.pop((record["domain"], record["command_id"]), None)
            for future in waiting or ():
                if not future.done():
                    future.set_result(Answer(record))


class CommandWriter:
    """Appends the commands of concurrent requests: those submitted in one turn of the event loop go
    out together, one write per partition, then the processor is rung."""

    def __init__(self, log: FileLog, doorbell: Doorbell, loop: asyncio.AbstractEventLoop) -> None:
        self.log = log
        self.doorbell = doorbell
        self.loop = loop
        self._pending: dict[int, list[tuple[bytes, asyncio.Future[None]]]] = defaultdict(list)
        self._scheduled = False

    def append(self, partition: int, value: bytes) -> asyncio.Future[None]:
        """A future that completes when `value` is written to `partition` (not yet durable: the
        processor makes it so before publishing anything that depends on it)."""
        future: asyncio.Future[None] = self.loop.create_future()
        self._pending[partition].append((value, future))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, defaultdict(list)
        for partition, entries in pending.items():
            try:
                self.log.append(partition, [value for value, _ in entries])
            except Exception as exc:  # a full disk, a damaged tail: these requests fail, others go on
                for _, future in entries:
                    future.set_exception(exc)
                continue
            for _, future in entries:
                future.set_result(None)
        self.doorbell.ring()

    def close(self) -> None:
        self.log.close()
        self.doorbell.close()
