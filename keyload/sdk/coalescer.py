"""Coalescing: enqueues and acks handed in by any number of threads, sent as Batch and AckBatch commands.

A command costs the processor a fixed share of its work whatever it carries (decoding, the
signature, routing, the stored outcome), and a request costs the server and the client as much
again: an Enqueue inside a Batch of 100 costs a fraction of an Enqueue on its own (bench.coalesce,
bench/README.md). A `Coalescer` sends what its callers hand it from a thread of its own, one command
at a time: calls gather while a command is in flight (and for `linger_ms` after the first, if set).
Each call returns a `Future`, at once unless `max_pending` calls already wait.

    with Coalescer(client, "shop") as coalescer:
        futures = [coalescer.enqueue("orders", body) for body in bodies]
        results = [future.result() for future in futures]  # EnqueueResult each, or its error raised

What a caller keeps (docs/ARCHITECTURE.md §10 says it in full, with every default):

- **Each message its own id, result and error.** A message's id defaults to a new UUID given when
  it is handed in, so it stays the same however often its Batch is sent. A Batch is all or nothing:
  when the service refuses one message, nothing of the Batch applied, so that message's future gets
  the typed error a lone Enqueue would have had and the others go again, in order, as a new Batch.
  A call the client cannot send as given (a field of the wrong type, a Batch over the record limit:
  `InvalidCommand`, nothing appended) sends each of its command's calls alone, so only it fails.
- **Each ack its own result.** An AckBatch settles each token on its own: an acked token's future
  gets its `TokenResult`, a refused one the typed error a lone ack would have raised.
- **Order.** One thread sends, one command at a time, a command's calls in the order they were
  handed in: a thread's messages to a queue are enqueued in its order. Enqueues and acks are two
  lines: an ack handed in after an enqueue may be sent first.
- **No loss and no duplicate across faults.** A command without an answer (`OutcomeTimeout`,
  `ServiceUnavailable`) is sent again under the same command id, until `delivery_timeout_s` after
  its oldest call was handed in: the service applies a command once and answers a repeat with the
  stored outcome.
- **Back-pressure.** At most `max_pending` calls wait; a further call blocks up to `block_s`.

Futures are settled on the coalescer's thread, so their done-callbacks run there: a callback may
hand in a call while there is room, but not `flush` or `close` (`KeyloadError`), and must not wait
for another of its futures (the thread would wait on itself). The thread is a
daemon: close the coalescer (or leave its `with` block) before the program ends, or what is
pending is lost unsent. In an asyncio program, await `asyncio.wrap_future(coalescer.enqueue(...))`
given `Coalescer(async_client.client, domain)`. The coalescer's thread is the only user of a local
client (`Client(DATA)`) while it is open; a client of a server may be shared (its HTTP connection
pool is thread-safe).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from keyload.commands import part_detail
from keyload.errors import (
    CoalescerTimeout,
    CommandRejected,
    InvalidCommand,
    KeyloadError,
    OutcomeTimeout,
    ServiceUnavailable,
    rejection,
)
from keyload.limits import COALESCED_BATCH_BYTES, MAX_ACK_BATCH, MAX_BATCH_MUTATIONS
from keyload.sdk.results import (
    AckBatchResult,
    BatchResult,
    EnqueueMessage,
    EnqueueResult,
    Outcome,
    OutcomeStatus,
    TokenResult,
    mutation_record,
)

if TYPE_CHECKING:
    from keyload.sdk.client import Client

# No linger by default: calls gather by themselves while a command is in flight, and a linger would
# hold up callers who wait for each answer (bench.coalesce: 16 threads each waiting, 1.74 times the
# lone rate at 0 ms against 1.34 at 5 ms). Kafka's producer lingered 0 ms by default until 4.0 (now 5).
DEFAULT_LINGER_MS = 0
MAX_LINGER_MS = 60_000
MAX_CALLS = min(MAX_BATCH_MUTATIONS, MAX_ACK_BATCH)  # calls one command carries: both commands' limit
DEFAULT_MAX_BATCH_BYTES = COALESCED_BATCH_BYTES  # bodies and header names and values of one Batch
# A Batch is one log record (≤ 4 MiB with its ids and framing; over HTTP, base64 in an 8 MiB request):
# 2 MiB of bodies leaves room for the rest. A message larger than max_bytes goes in a Batch alone.
MAX_BATCH_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_PENDING = 10_000  # calls waiting to be sent before a further call blocks
DEFAULT_BLOCK_S = 60.0  # how long a call blocks for room before CoalescerTimeout
DEFAULT_DELIVERY_TIMEOUT_S = 120.0  # as Kafka's delivery.timeout.ms: from a call's hand-in to giving up
RETRY_PAUSE_S = 0.1  # between tries of a command whose service is away


@dataclass
class CoalescerStats:
    """What a coalescer sent: `commands` Batches and AckBatches; `messages` enqueued and `acks` acked
    by them (refused ones are not counted); `resent` commands sent again without a message the service
    refused, or each call alone after one could not be sent as given; `retries` tries repeated by
    command id after a timeout or an unreachable server."""

    commands: int = 0
    messages: int = 0
    acks: int = 0
    resent: int = 0
    retries: int = 0


Item = TypeVar("Item", EnqueueMessage, str)  # what a call hands in: a message, or a token


@dataclass
class _Call(Generic[Item]):
    """One caller's message or token, waiting for its command."""

    seq: int  # its place among every call handed in
    item: Item
    size: int  # what it adds to a Batch's bytes
    future: Future[Any]
    since: float  # monotonic time it was handed in


@dataclass
class _Line(Generic[Item]):
    """The calls waiting for one kind of command, in the order handed in, and how they are sent."""

    send: Callable[[list[_Call[Item]]], None]  # settles every call's future
    calls: deque[_Call[Item]] = field(default_factory=deque)
    size: int = 0  # their bytes


class Coalescer:
    def __init__(
        self,
        client: Client,
        domain: str,
        *,
        linger_ms: int = DEFAULT_LINGER_MS,
        max_messages: int = MAX_CALLS,
        max_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_pending: int = DEFAULT_MAX_PENDING,
        block_s: float = DEFAULT_BLOCK_S,
        delivery_timeout_s: float = DEFAULT_DELIVERY_TIMEOUT_S,
    ) -> None:
        if not 0 <= linger_ms <= MAX_LINGER_MS:
            raise InvalidCommand(f"linger_ms must be 0..{MAX_LINGER_MS}")
        if not 1 <= max_messages <= MAX_CALLS:
            raise InvalidCommand(f"max_messages must be 1..{MAX_CALLS} (a Batch's and an AckBatch's limit)")
        if not 1 <= max_bytes <= MAX_BATCH_BYTES:
            raise InvalidCommand(f"max_bytes must be 1..{MAX_BATCH_BYTES} (a Batch is one log record)")
        if max_pending < 1 or block_s < 0 or delivery_timeout_s < 0:
            raise InvalidCommand("max_pending must be positive, block_s and delivery_timeout_s not negative")
        self.client = client
        self.domain = domain
        self.stats = CoalescerStats()
        self._linger_s = linger_ms / 1000
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._max_pending = max_pending
        self._block_s = block_s
        self._delivery_timeout_s = delivery_timeout_s
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # the sending thread waits here for a command to send
        self._answers = threading.Condition(lock)  # callers wait here for room, flushes for their answers
        self._enqueues: _Line[EnqueueMessage] = _Line(self._send_enqueues)
        self._acks: _Line[str] = _Line(self._send_acks)
        self._pending = 0  # calls waiting in both lines
        self._sending: list[_Call[Any]] = []  # the command in flight
        self._handed = 0  # calls handed in, ever
        self._flush_through = 0  # calls up to this seq go without lingering
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"keyload-coalescer-{domain}", daemon=True)
        self._thread.start()

    def enqueue(
        self,
        queue: str,
        body: bytes,
        *,
        message_id: str | None = None,
        headers: dict[str, str] | None = None,
        ordering_key: str | None = None,
        not_before_ms: int | None = None,
        expires_at_ms: int | None = None,
    ) -> Future[EnqueueResult]:
        """Enqueue one message in a Batch with others: its `EnqueueResult`, or its own error, in time.
        `message_id` defaults to a new UUID (the future's result names it). The body and headers are
        copied when handed in; a body that is not bytes, or headers that are not str to str, are
        `InvalidCommand` at once."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidCommand("a message's body must be bytes; nothing was handed in")
        copied = dict(headers or {})
        if not all(isinstance(name, str) and isinstance(value, str) for name, value in copied.items()):
            raise InvalidCommand("a message's headers must map str to str; nothing was handed in")
        message = EnqueueMessage(
            queue=queue,
            message_id=str(uuid.uuid4()) if message_id is None else message_id,
            body=bytes(body),
            headers=copied,
            ordering_key=ordering_key,
            not_before_ms=not_before_ms,
            expires_at_ms=expires_at_ms,
        )
        size = len(message.body) + sum(len(name.encode()) + len(value.encode()) for name, value in copied.items())
        return self._hand_in(self._enqueues, message, size)

    def ack(self, token: str) -> Future[TokenResult]:
        """Ack one delivery of this domain's queues in an AckBatch with others: the token's result
        (status committed), or the typed error a lone ack would have raised."""
        return self._hand_in(self._acks, token, 0)

    def flush(self, timeout_s: float | None = None) -> None:
        """Send what was handed in before this call without lingering, and wait until each of its
        futures is settled (CoalescerTimeout after `timeout_s`)."""
        self._not_on_own_thread("flush")
        with self._work:
            target = self._handed
            self._flush_through = max(self._flush_through, target)
            self._work.notify()
            if not self._answers.wait_for(lambda: self._answered_through(target), timeout_s):
                raise CoalescerTimeout(f"calls handed in before the flush are unanswered after {timeout_s} s")

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is pending, wait for it, and stop the coalescer's thread; later calls raise
        `KeyloadError`. CoalescerTimeout after `timeout_s` (the thread goes on sending)."""
        self._not_on_own_thread("close")
        with self._work:
            self._closing = True
            self._work.notify()
            self._answers.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise CoalescerTimeout(f"the coalescer is still sending after {timeout_s} s")

    def __enter__(self) -> Coalescer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- callers' side ----------------------------------------------------------------------------

    def _hand_in(self, line: _Line[Item], item: Item, size: int) -> Future[Any]:
        future: Future[Any] = Future()
        # The coalescer's own thread (a future's callback) cannot wait for room: only it makes room.
        block_s = 0.0 if threading.current_thread() is self._thread else self._block_s
        with self._work:
            room = self._answers.wait_for(self._has_room, block_s)
            if self._closing:
                raise KeyloadError("the coalescer is closed")
            if not room:
                raise CoalescerTimeout(f"no room for a call: {self._max_pending} have waited for {block_s} s")
            self._handed += 1
            line.calls.append(_Call(self._handed, item, size, future, time.monotonic()))
            line.size += size
            self._pending += 1
            if self._pending == 1 or self._full(line) or self._pending >= self._max_pending:
                self._work.notify()  # a linger to start, or a command to send now
        return future

    def _has_room(self) -> bool:
        return self._closing or self._pending < self._max_pending

    def _answered_through(self, seq: int) -> bool:
        """Whether every call up to `seq` has its answer (neither waiting nor in flight)."""
        heads = [line.calls[0].seq for line in (self._enqueues, self._acks) if line.calls]
        return min((call.seq for call in self._sending), default=seq + 1) > seq and min(heads, default=seq + 1) > seq

    def _not_on_own_thread(self, what: str) -> None:
        if threading.current_thread() is self._thread:
            raise KeyloadError(f"{what} from a future's callback: callbacks run on the coalescer's own thread")

    # -- the sending thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._work:
                    while (line := self._due()) is None:
                        if self._closing and not self._pending:
                            return
                        self._work.wait(self._until_due())
                    self._sending = self._take(line)
                    self._answers.notify_all()  # room for callers
                self._send(line, list(self._sending))  # a copy: a refused message leaves it, not `_sending`
                with self._work:
                    self._sending = []
                    self._answers.notify_all()
        except BaseException as defect:  # of the coalescer itself: no caller is left waiting on it
            with self._work:
                self._closing = True
                held = [*self._sending, *self._enqueues.calls, *self._acks.calls]
                self._sending = []
                for waiting in (self._enqueues, self._acks):
                    waiting.calls.clear()
                    waiting.size = 0
                self._pending = 0
                self._answers.notify_all()
            # Outside the lock: a done-callback may call the coalescer (and be told it is closed).
            self._fail(held, KeyloadError(f"the coalescer's thread failed: {defect!r}"))
            raise

    def _oldest(self) -> _Line[Any] | None:
        """The line whose first call was handed in first."""
        lines: list[_Line[Any]] = [line for line in (self._enqueues, self._acks) if line.calls]
        return min(lines, key=lambda line: line.calls[0].seq, default=None)

    def _full(self, line: _Line[Any]) -> bool:
        return len(line.calls) >= self._max_messages or line.size >= self._max_bytes

    def _due(self) -> _Line[Any] | None:
        """The line whose command goes now, the oldest first: when a command is full, callers wait for
        room, the oldest call's linger is over, or a flush or close asks for it."""
        oldest = self._oldest()
        if oldest is None:
            return None
        first = oldest.calls[0]
        if (
            self._closing
            or first.seq <= self._flush_through
            or self._pending >= self._max_pending
            or self._full(self._enqueues)
            or self._full(self._acks)
            or first.since + self._linger_s <= time.monotonic()
        ):
            return oldest
        return None

    def _until_due(self) -> float | None:
        oldest = self._oldest()
        return None if oldest is None else oldest.calls[0].since + self._linger_s - time.monotonic()

    def _take(self, line: _Line[Item]) -> list[_Call[Item]]:
        """The line's next command: its calls in order, up to the first that does not fit (a first
        message over `max_bytes` goes alone). A call whose future was cancelled is left out."""
        taken: list[_Call[Item]] = []
        size = 0
        while line.calls:
            call = line.calls[0]
            if len(taken) == self._max_messages or (taken and size + call.size > self._max_bytes):
                break
            line.calls.popleft()
            line.size -= call.size
            self._pending -= 1
            with contextlib.suppress(RuntimeError):  # its caller settled it already: nothing to send
                if call.future.set_running_or_notify_cancel():
                    taken.append(call)
                    size += call.size
        return taken

    def _send(self, line: _Line[Item], calls: list[_Call[Item]]) -> None:
        """Send the calls' command and settle each call's future with its result or its error. A
        command the client cannot send as given (nothing was appended) goes again call by call, so
        only a call that cannot be sent fails."""
        if not calls:
            return
        try:
            line.send(calls)
        except InvalidCommand as error:
            unsettled = [call for call in calls if not call.future.done()]
            if len(unsettled) < 2:
                self._fail(unsettled, error)
                return
            self.stats.resent += len(unsettled)
            for call in unsettled:
                self._send(line, [call])
        except Exception as error:  # the command as a whole failed: each call still open gets the error
            self._fail(calls, error)

    @staticmethod
    def _fail(calls: list[_Call[Any]], error: BaseException) -> None:
        for call in calls:
            _answer(call.future, error=error)

    def _send_enqueues(self, calls: list[_Call[EnqueueMessage]]) -> None:
        """One Batch of the messages; a message the service refuses gets its error, and the rest go again."""
        while calls:
            body = {"mutations": [mutation_record(call.item) for call in calls]}
            try:
                outcome = self._committed("Batch", body, calls[0].since)
            except CommandRejected as refusal:
                failed = refusal.failed_index
                if failed is None or not 0 <= failed < len(calls):
                    raise
                detail = part_detail(failed, refusal.outcome.detail)
                message = f"{refusal.outcome.error_code}: {detail}"
                _answer(calls.pop(failed).future, error=rejection(refusal.outcome, message))
                self.stats.resent += bool(calls)
                continue
            assert isinstance(outcome.result, BatchResult)
            for call, result in zip(calls, outcome.result.results, strict=True):
                _answer(call.future, result)
            self.stats.messages += len(calls)
            return

    def _send_acks(self, calls: list[_Call[str]]) -> None:
        """One AckBatch of the tokens; each token's future gets its own result or refusal."""
        outcome = self._committed("AckBatch", {"tokens": [call.item for call in calls]}, calls[0].since)
        assert isinstance(outcome.result, AckBatchResult)
        for call, result in zip(calls, outcome.result.results, strict=True):
            if result.error_code is None:
                _answer(call.future, result)
                self.stats.acks += 1
                continue
            # A copy of the AckBatch's receipt, rejected with the token's code: what a lone Ack's would say.
            refused = replace(outcome, status=OutcomeStatus.rejected, error_code=result.error_code, result=None)
            message = f"{result.error_code}: a token of AckBatch {outcome.command_id!r}"
            _answer(call.future, error=rejection(refused, message))

    def _committed(self, name: str, body: dict[str, Any], first_handed: float) -> Outcome:
        """Send one command under a new command id, again under the same id while its outcome does not
        come or its server cannot be reached, up to `delivery_timeout_s` after `first_handed` (when its
        oldest call was handed in): its committed outcome, or its refusal raised."""
        kind = self.client.commands[name]
        command_id = str(uuid.uuid4())
        body = kind.filled(body, command_id)
        give_up = first_handed + self._delivery_timeout_s
        self.stats.commands += 1
        while True:
            try:
                outcome = self.client.submit(self.domain, kind.branch, body, command_id)
                break
            except (OutcomeTimeout, ServiceUnavailable):
                if time.monotonic() + RETRY_PAUSE_S > give_up:
                    raise
            self.stats.retries += 1
            time.sleep(RETRY_PAUSE_S)
        if outcome.status != OutcomeStatus.committed:
            raise rejection(outcome)
        return outcome


def _answer(future: Future[Any], result: object = None, error: BaseException | None = None) -> None:
    """Settle a call's future with its result or its error. One its caller settled itself, or
    cancelled while it waited, stays as it is."""
    with contextlib.suppress(InvalidStateError, RuntimeError):
        if future.running() or future.set_running_or_notify_cancel():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
