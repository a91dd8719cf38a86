"""The server's side of the log: it appends the commands of HTTP requests and answers each request
when its outcome is published.

Why it is fast where a local client is slow: a local client fsyncs its own append, rings the
doorbell and polls the outcome stream. On the embedded log the server appends without an fsync
(the processor's `sync_through` makes the records durable before any outcome is published, so one
fsync covers every request appended meanwhile: group commit), gathers the appends of all requests
that arrive in one turn of the event loop into one write per partition, and is told of each
outcome in-process (`OutcomeWaiters.published`, called by the runtime), so nothing polls. Its
commands name no reply partition (`reply_to` null), so their outcomes are not appended to the
outcome stream either: nothing but the server waits for them. On Kafka it produces to the command
topic and tails its reply partition of the outcomes topic (`OutcomeTail`), since another process
may own the command's partition.

Threads: requests run on the server's event loop; the processors call `published` from their
thread, which embedded is the loop's own (the service thread turns the loop between processor
steps) and on Kafka is not (the main thread). Waiters are added and removed on the event loop only;
`published` hands outcomes over with `call_soon_threadsafe`, right from either thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from keyload.credentials import Credential, SignedRecord, unwrap
from keyload.log.base import CommandLog, LogError, LogTruncated
from keyload.log.codec import REGISTRY, CodecError, Record
from keyload.service.doorbell import Listener

OUTCOME = "keyload.Outcome"
TAIL_READ_RECORDS = 256  # outcomes the Kafka outcome tail reads at a time
TAIL_RETRY_S = 1.0  # after a failed read of the outcomes topic
TAIL_CLOSE_S = 35.0  # a read in progress waits for the broker up to its fetch timeout (30 s)
FEED_POLL_S = 0.1  # the embedded outcome feed reads its reply partition at least this often
MAX_ECHOES = 65_536  # outcomes handed over in process whose copies the Kafka tail has yet to read
# Unsealed refusals under a waiter's command id kept until its append is acknowledged (`Waiter.unplaced`):
# more come only from a producer appending unsigned records under that id in that moment.
MAX_UNPLACED = 16
T = TypeVar("T")
_Key = tuple[str, str]  # (domain, command id): command ids are scoped by domain
# The key id and secret a principal signs with now, as a partition's policy has it; None where not known.
KeyInForce = Callable[[str, int], tuple[str, bytes] | None]
_Pending = dict[int, list[tuple[bytes, "asyncio.Future[int]"]]]

log = logging.getLogger("keyload.server")


class Halted(Exception):
    """The partition a request goes to is halted, or the service is stopping (HTTP 503)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A published outcome, decoded."""

    record: Record


@dataclass(slots=True)
class Waiter:
    """A request waiting for the outcome of its command: the credential it was sent under, the
    command's record, and its log position once it is appended. A copy (`copy_of`) is a request
    for the same record as a waiter before it, sent while that one still waits: it appends nothing
    and is answered by that record's outcome (`OutcomeWaiters.expect`)."""

    credential: Credential
    value: bytes
    future: asyncio.Future[Answer]
    copy_of: Waiter | None = None
    position: tuple[int, int] | None = None  # (partition, offset)
    followers: list[asyncio.Future[None]] | None = None  # requests waiting for this one to be done (`turn`)
    # Unsealed refusals that came before the position was known (a Kafka processor in this process
    # may answer before the broker acknowledges the append): decided once it is (`appended`).
    unplaced: list[Record] | None = None

    def finished(self) -> asyncio.Future[None]:
        """A future this waiter's request settles once it stops waiting (`OutcomeWaiters.forget`)."""
        finished = self.future.get_loop().create_future()
        if self.followers is None:
            self.followers = []
        self.followers.append(finished)
        return finished

    def release(self) -> None:
        """The request stopped waiting: the requests waiting their turn behind it go on."""
        for finished in self.followers or ():
            if not finished.done():
                finished.set_result(None)

    async def answer(self, timeout_s: float) -> Answer:
        """The outcome once it is published; TimeoutError after `timeout_s`. One timer on the future
        (`_deliver` skips a future already done), where asyncio.wait_for and shield would add two
        futures and their callbacks to every request."""
        timer = self.future.get_loop().call_later(timeout_s, _expire, self.future)
        try:
            return await self.future
        finally:
            timer.cancel()

    def answered_by(self, value: bytes, signed: SignedRecord | None, record: Record, key_in_force: KeyInForce) -> bool:
        """An outcome sealed with the waiter's key answers it (the reply to that principal's
        command); so does one of its own record sealed with the key its principal holds now
        (`key_in_force`: a long poll served after the principal's credential was rotated is sealed
        with the new key), and an unsealed refusal of its own record (the processor could not
        authenticate it: a principal disabled since the server checked it); nothing else: two
        principals sending one command id to one domain are each answered with their own outcome
        (the second one's a Conflict, §5), and an outcome someone else appended, unsealed or sealed
        with another principal's key, cannot answer anyone."""
        if signed is None:
            return self.refused_by(record)
        if self.credential.seals(value):
            return True
        if signed.key_id == self.credential.key_id or not self.placed_at(record):
            return False
        held = key_in_force(self.credential.principal, record["partition"])
        return held is not None and held[0] == signed.key_id and signed.verify(held[1])

    def refused_by(self, record: Record) -> bool:
        """Whether the unsealed outcome `record` is the refusal of this waiter's own record."""
        return self.placed_at(record) and record["status"] != "committed"

    def placed_at(self, record: Record) -> bool:
        """Whether the outcome `record` is of this waiter's own record: of the command at its position."""
        return self.position == (record["partition"], record["offset"])


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _no_key(principal: str, partition: int) -> None:
    """No key is known to be in force (before `attach`)."""


def _expire(future: asyncio.Future[Answer]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class OutcomeWaiters:
    """Requests waiting for their outcome, by (domain, command id) (`Waiter` says which outcome
    answers which)."""

    def __init__(self, reply_partition: int | None, in_process: Collection[int] = ()) -> None:
        self.reply_partition = reply_partition  # what the server's commands name as reply_to
        # Partitions whose processors run in this process and answer in process (their commands name
        # no reply partition): the embedded server's own (with `--workers`, worker 0's).
        self._in_process = frozenset(in_process)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._abandoned = asyncio.Event()  # set by `abandon`: the service is stopping
        self._stopping: Exception | None = None  # why, once `abandon` ran: later requests fail with it too
        self._key_in_force: KeyInForce = _no_key  # set by `attach` (`Waiter.answered_by`)
        self._waiting: dict[_Key, list[Waiter]] = defaultdict(list)
        # Kafka: outcomes this process's processors published to the reply partition and handed over
        # in process, whose copies `OutcomeTail` reads back: each copy is passed over, so it cannot
        # answer a later request under the same command id (another command's, maybe a Conflict).
        # None while no tail reads the reply partition.
        self._echoes: dict[bytes, int] | None = None

    def attach(self, loop: asyncio.AbstractEventLoop, key_in_force: KeyInForce) -> None:
        """The event loop the waiting requests run on (the server's, once it starts), and where the
        key each principal holds now is read from (on that loop)."""
        self._loop, self._key_in_force = loop, key_in_force

    def reply_to(self, partition: int) -> int | None:
        """The reply partition a command to `partition` names: none when its processor answers in
        process, else the one this server reads (`OutcomeTail`, `OutcomeFeed`)."""
        return None if partition in self._in_process else self.reply_partition

    async def turn(self, domain: str, command_id: str, credential: Credential, value: bytes) -> None:
        """Return once no request of `credential`'s principal waits under (domain, command id) with a
        command other than `value`; register (`expect`) right after.

        A waiter is answered by any outcome sealed for its principal under its command id (`Waiter`),
        so two commands of one principal under one id must not wait at once: the first's outcome
        would answer both, and the second's Conflict would answer a third request with the first's
        content. Requests under one id with another command wait their turn, so that each is
        appended after the records before it are answered, and is answered as the log decides."""
        key = (domain, command_id)
        while key in self._waiting:
            ahead = [
                waiter.finished()
                for waiter in self._waiting.get(key, ())
                if waiter.value != value and waiter.credential.principal == credential.principal
            ]
            if not ahead:
                return
            await asyncio.wait(ahead)

    def expect(self, domain: str, command_id: str, credential: Credential, value: bytes) -> Waiter:
        """A waiter the outcome of the command `value`, (domain, command id) sent under `credential`,
        answers; register before appending (after `turn`). While a request for the same record waits
        unanswered, this one is its copy: appending the record again would publish its stored outcome
        once more, later, where it could answer the request after them (another command's)."""
        assert self._loop is not None, "attach the event loop first"
        if self._stopping is not None:  # a request that came after the abandon (coalesced, pipelined, a turn's)
            raise self._stopping
        waiting = self._waiting[(domain, command_id)]
        leader = None
        if waiting:
            leader = next((w for w in waiting if w.copy_of is None and w.value == value and not w.future.done()), None)
        waiter = Waiter(credential, value, self._loop.create_future(), leader)
        waiting.append(waiter)
        return waiter

    def appended(self, domain: str, command_id: str, waiter: Waiter, position: tuple[int, int]) -> None:
        """The waiter's record is appended at `position`: its copies' record too. A refusal of that
        record that came first answers them now."""
        for entry in self._waiting.get((domain, command_id), ()):
            if entry is waiter or entry.copy_of is waiter:
                entry.position = position
                for record in entry.unplaced or ():
                    if not entry.future.done() and entry.refused_by(record):
                        entry.future.set_result(Answer(record))
                entry.unplaced = None

    def not_appended(self, domain: str, command_id: str, waiter: Waiter, reason: BaseException) -> None:
        """The waiter's record could not be appended: its copies fail with `reason` too."""
        for entry in self._waiting.get((domain, command_id), ()):
            if entry.copy_of is waiter and not entry.future.done():
                entry.future.set_exception(reason)

    def forget(self, domain: str, command_id: str, waiter: Waiter) -> None:
        """Stop waiting (answered, timed out, or its client went away)."""
        waiter.release()
        if waiter.future.done() and not waiter.future.cancelled():
            waiter.future.exception()  # retrieved: one abandoned while its append failed is not logged as lost
        key = (domain, command_id)
        remaining = [entry for entry in self._waiting.get(key, ()) if entry is not waiter]
        if remaining:
            self._waiting[key] = remaining
        else:
            self._waiting.pop(key, None)

    def abandon(self, reason: Exception) -> None:
        """Fail every waiting request with `reason` (the service is stopping): thread-safe."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._abandon, reason)

    def _abandon(self, reason: Exception) -> None:
        self._stopping = reason
        self._abandoned.set()
        for waiters in self._waiting.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(reason)

    async def unless_abandoned(self, work: Awaitable[T], reason: Exception) -> T:
        """`work`'s result, or `reason` raised once the waiting requests are abandoned (the service
        is stopping) while it runs, `work` then cancelled: a request that waits for something other
        than an outcome (an upload streaming its body or storing it) is answered with the others,
        before the server closes its connection without an answer."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(_retrieved)  # its exception is read even when nobody awaits it any more
        abandoned = asyncio.ensure_future(self._abandoned.wait())
        try:
            await asyncio.wait((task, abandoned), return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the request itself is cancelled (its client went away): `work` goes with it
            abandoned.cancel()
            unfinished = not task.done()
            if unfinished:
                task.cancel()
        if unfinished:
            raise reason
        return task.result()

    def published(self, reply_partition: int | None, outcomes: list[bytes]) -> None:
        """Called by the runtime (processor thread) with outcomes it is publishing: those for the
        server's reply partition are handed to the event loop. Cheap when nobody waits (while a
        tail reads them back, each is also noted as an echo). The embedded server names none, so it
        is also handed those of the service's own actors (Ticks, checkpoint announcements), which
        name none either: `_deliver` matches no waiter to them."""
        loop = self._loop
        if loop is None:
            return
        if self._echoes is not None and reply_partition == self.reply_partition:
            loop.call_soon_threadsafe(self._deliver_echoed, outcomes)
            return
        answered = reply_partition == self.reply_partition or (reply_partition is None and self._in_process)
        if answered and self._waiting:
            loop.call_soon_threadsafe(self._deliver, outcomes)

    def read_back(self) -> None:
        """A tail reads the reply partition from now on (`tailed`): outcomes published in process
        are noted as echoes to pass over there."""
        self._echoes = {}

    def tailed(self, outcomes: list[bytes]) -> None:
        """Called by the tail (its thread) with the reply partition's records, in order."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver_tailed, outcomes)

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def awaits(self, record: Record) -> bool:
        """Whether a request waits for the command this outcome answers."""
        return (record["domain"], record["command_id"]) in self._waiting

    def _deliver_echoed(self, outcomes: list[bytes]) -> None:
        """Answer with outcomes published in process, noting each as an echo the tail will read."""
        echoes = self._echoes
        assert echoes is not None
        for value in outcomes:
            echoes[value] = echoes.get(value, 0) + 1
        while len(echoes) > MAX_ECHOES:  # copies the tail never read (a failed append): the oldest go
            del echoes[next(iter(echoes))]
        self._deliver(outcomes)

    def _deliver_tailed(self, outcomes: list[bytes]) -> None:
        """Answer with the tail's records, each echo of an outcome already handed over passed over
        (its request was answered; a later one under the command id waits for its own)."""
        echoes = self._echoes
        assert echoes is not None
        fresh = []
        for value in outcomes:
            seen = echoes.pop(value, 0)
            if seen > 1:
                echoes[value] = seen - 1
            elif not seen:
                fresh.append(value)
        if fresh and self._waiting:
            self._deliver(fresh)

    def _deliver(self, outcomes: list[bytes]) -> None:
        """Answer the waiters these outcomes are for (on the event loop)."""
        for value in outcomes:
            if not self._waiting:
                return
            opened = open_outcome(value)
            if opened is not None:
                self.answer(value, *opened)

    def answer(self, value: bytes, signed: SignedRecord | None, record: Record) -> None:
        """Answer the waiters the outcome `value` (opened: `open_outcome`) is for."""
        for waiter in self._waiting.get((record["domain"], record["command_id"]), ()):
            if waiter.future.done():
                continue
            if waiter.answered_by(value, signed, record, self._key_in_force):
                waiter.future.set_result(Answer(record))
            elif signed is None and waiter.position is None and record["status"] != "committed":
                if waiter.unplaced is None:
                    waiter.unplaced = []
                if len(waiter.unplaced) < MAX_UNPLACED:
                    waiter.unplaced.append(record)  # maybe its own refusal: `appended` decides


def open_outcome(value: bytes) -> tuple[SignedRecord | None, Record] | None:
    """An outcome record of the outcome stream, and its seal; None for a record that is not an
    outcome the service wrote (a stray record on the outcomes topic)."""
    try:
        signed = unwrap(value)
        return signed, REGISTRY.decode(OUTCOME, value if signed is None else signed.record)
    except CodecError:
        return None


class CommandWriter:
    """Appends the commands of concurrent requests: those submitted in one turn of the event loop go
    out together, one append per partition, then the processors of those partitions are woken (`wake`).

    On the file log an append is a write() with no fsync: it is made inline, on the event loop. On
    Kafka an append waits for the brokers' acknowledgements (acks=all), so `blocking` runs it on a
    writer thread of its own while the loop goes on gathering the next turn's commands."""

    def __init__(
        self,
        log: CommandLog,
        loop: asyncio.AbstractEventLoop,
        wake: Callable[[Collection[int]], None],
        *,
        blocking: bool,
    ) -> None:
        self.log = log
        self.loop = loop
        self.wake = wake
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="keyload-writer") if blocking else None
        self._pending: _Pending = defaultdict(list)
        self._sending: list[_Pending] = []  # appends the writer thread makes now (a broker may hold them)
        self._stopping: Exception | None = None  # why, once `abandon` ran: appends asked for later fail with it
        self._scheduled = False

    def append(self, partition: int, value: bytes) -> asyncio.Future[int]:
        """A future of the offset `value` is appended at in `partition` (on the file log not yet
        durable: the processor makes it so before publishing anything that depends on it)."""
        future: asyncio.Future[int] = self.loop.create_future()
        if self._stopping is not None:
            future.set_exception(self._stopping)
            return future
        self._pending[partition].append((value, future))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, defaultdict(list)
        if self._thread is None:
            _settle(pending, self._append_each(pending))
            return
        try:
            done = self.loop.run_in_executor(self._thread, self._append_each, pending)
        except RuntimeError as exc:  # the writer thread is shut down: the server is stopping
            _settle(pending, dict.fromkeys(pending, LogError(f"the server is stopping: {exc}")))
            return
        self._sending.append(pending)
        done.add_done_callback(lambda finished: self._sent(pending, finished.result()))

    def _sent(self, pending: _Pending, results: dict[int, list[int] | Exception]) -> None:
        self._sending.remove(pending)
        _settle(pending, results)

    def abandon(self, reason: Exception) -> None:
        """Fail the requests whose appends the writer thread is making (a broker away holds them)
        with `reason` (the service is stopping), so they are answered with the waiting ones rather
        than cut off when the server closes: the append may still be made, so resubmit by command
        id. Thread-safe."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._abandon, reason)

    def _abandon(self, reason: Exception) -> None:
        self._stopping = reason
        for pending in (*self._sending, self._pending):  # made now, or queued behind those
            _settle(pending, dict.fromkeys(pending, reason))

    def _append_each(self, pending: _Pending) -> dict[int, list[int] | Exception]:
        """Append each partition's values: their offsets, or what failed (a full disk, a damaged
        tail, a broker that refuses), by partition: those requests fail, the other partitions' go on."""
        results: dict[int, list[int] | Exception] = {}
        try:
            for partition, entries in pending.items():
                try:
                    appended = self.log.append(partition, [value for value, _ in entries])
                    results[partition] = [record.offset for record in appended]
                except Exception as exc:
                    results[partition] = exc
        finally:
            with contextlib.suppress(OSError):  # a lost ring costs the processors one idle wait
                self.wake(pending.keys())
        return results

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        self.log.close()


def _settle(pending: _Pending, results: dict[int, list[int] | Exception]) -> None:
    for partition, entries in pending.items():
        result = results.get(partition, LogError("the append was not made"))
        for index, (_, future) in enumerate(entries):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result[index])


class OutcomeTail:
    """Kafka mode: the server's reply partition of the outcomes topic, read on a thread of its own,
    every outcome handed to the waiters. Outcomes of partitions that other processes own reach the
    server this way; those of its own processors come in process (`OutcomeWaiters.published`, handed
    over before they are appended), and their copies read here are passed over."""

    def __init__(self, outcomes: CommandLog, waiters: OutcomeWaiters) -> None:
        assert waiters.reply_partition is not None, "the tail reads the reply partition the server's commands name"
        self.partition = waiters.reply_partition
        self.outcomes = outcomes
        self.waiters = waiters
        waiters.read_back()
        self._cursor = outcomes.end_offset(self.partition)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keyload-outcomes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        partition = self.partition
        while not self._stop.is_set():
            try:
                records = self.outcomes.read(partition, self._cursor, TAIL_READ_RECORDS)
            except LogTruncated:  # retention passed the cursor: what is left to answer is newer
                self._cursor = self.outcomes.start_offset(partition)
                continue
            except Exception as exc:  # the broker is away: the waiting requests time out, the tail retries
                log.warning("outcome tail of partition %d: %s", partition, exc)
                self._stop.wait(TAIL_RETRY_S)
                continue
            if records:
                self._cursor = records[-1].offset + 1
                self.waiters.tailed([record.value for record in records])

    def close(self) -> None:
        """Stop reading; the reader's consumer is closed once its read in progress returns."""
        self._stop.set()
        self._thread.join(TAIL_CLOSE_S)
        if not self._thread.is_alive():
            self.outcomes.close()


class OutcomeFeed:
    """Embedded with worker processes (`keyload run --workers`, keyload/service/workers.py): the
    server's reply partition of the outcome stream, read on the event loop whenever a worker rings
    the edge's `bell`, and every FEED_POLL_S besides, so a lost ring costs at most that.

    A worker publishes a group's outcomes before it commits the group, and tells how far its
    committed outcomes go (`answerable_below(partition)`: the reply-partition offset below which
    the outcomes of that partition's worker are committed; None for the serving process's own
    partitions) before it rings. An outcome above that is held until a later read finds it below,
    so a request is answered only once what it did is in the projection, as in one process; held
    outcomes hold back nothing else. Outcomes of the serving process's own partitions come in
    process (`OutcomeWaiters.published`); those found here (a local client's, naming this reply
    partition) are committed already, as the loop turns between steps."""

    def __init__(
        self,
        outcomes: CommandLog,
        waiters: OutcomeWaiters,
        bell: Listener,
        answerable_below: Callable[[int], int | None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        assert waiters.reply_partition is not None, "the feed reads the reply partition the server's commands name"
        self.partition = waiters.reply_partition
        self.outcomes = outcomes
        self.waiters = waiters
        self.bell = bell
        self.answerable_below = answerable_below
        self.loop = loop
        self._cursor = outcomes.end_offset(self.partition)
        self._held: list[tuple[int, bytes, SignedRecord | None, Record]] = []  # (offset, value, seal, record)
        loop.add_reader(bell.fileno(), self._rung)
        self._timer = loop.call_later(FEED_POLL_S, self._poll)

    def _rung(self) -> None:
        self.bell.wait(0)
        self.read()

    def _poll(self) -> None:
        self.read()
        self._timer = self.loop.call_later(FEED_POLL_S, self._poll)

    def read(self) -> None:
        """Answer with what was published to the reply partition since the last read, and with the
        held outcomes now committed."""
        held, self._held = self._held, []
        for offset, value, signed, record in held:
            self._offer(offset, value, signed, record)
        while True:
            try:
                records = self.outcomes.read(self.partition, self._cursor, TAIL_READ_RECORDS)
            except LogTruncated:  # retention passed the cursor: what is left to answer is newer
                self._cursor = self.outcomes.start_offset(self.partition)
                continue
            except LogError as exc:  # the waiting requests time out; the next ring or poll reads again
                log.warning("outcome feed of partition %d: %s", self.partition, exc)
                return
            if not records:
                return
            self._cursor = records[-1].offset + 1
            for published in records:
                opened = open_outcome(published.value) if self.waiters.waiting else None
                if opened is not None:
                    self._offer(published.offset, published.value, *opened)

    def _offer(self, offset: int, value: bytes, signed: SignedRecord | None, record: Record) -> None:
        """Answer with the outcome at `offset` if it is committed; hold it while someone waits for it."""
        if not self.waiters.awaits(record):
            return
        below = self.answerable_below(record["partition"])
        if below is not None and offset >= below:
            self._held.append((offset, value, signed, record))
        else:
            self.waiters.answer(value, signed, record)

    def close(self) -> None:
        self.loop.remove_reader(self.bell.fileno())
        self._timer.cancel()
        self.bell.close()
        self.outcomes.close()
