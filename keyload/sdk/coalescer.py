"""Coalescing: enqueues and acks handed in by any number of threads, sent as Batch and AckBatch commands.

A command costs the processor a fixed share of its work whatever it carries (decoding, the
signature, routing, the stored outcome), and a request costs the server and the client as much
again: an Enqueue inside a Batch of 100 costs a fraction of an Enqueue on its own (bench.coalesce,
bench/README.md). A `Coalescer` sends what its callers hand it from a thread of its own, one command
at a time: calls gather while a command is in flight (and for `linger_ms` after the first, if set),
and a full command goes at once. Each call returns a `Future` at once.

    with Coalescer(client, "shop") as coalescer:
        futures = [coalescer.enqueue("orders", body) for body in bodies]
        results = [future.result() for future in futures]  # EnqueueResult each, or its error raised

What a caller keeps (docs/ARCHITECTURE.md §10):

- **Each message its own id, result and error.** A message's id defaults to a new UUID given when
  it is handed in, so it stays the same however often its Batch is sent. A Batch is all or nothing:
  when the service refuses one message (its queue is full or missing, its id used, its fields out
  of range), nothing of the Batch applied, so that message's future gets its own typed error
  (`failed_index` is its place in the Batch that carried it) and the others go again, in order,
  as a new Batch.
- **Each ack its own result.** An AckBatch settles each token on its own: an acked token's future
  gets its `TokenResult`; a refused token's future the typed error a lone ack would have raised
  (`StaleLeaseError`, `LeaseExpiredError`, ...), whose `outcome` is the AckBatch's receipt carrying
  that token's code.
- **Order.** One thread sends, one command at a time, and a command takes messages in the order they
  were handed in: a thread's messages to a queue are enqueued in its order, a refused message
  taking its own place out of the line.
- **No loss and no duplicate across faults.** A command whose outcome does not come within the
  client's timeout (`OutcomeTimeout`) or whose server cannot be reached (`ServiceUnavailable`) is
  sent again with the same command id every `RETRY_PAUSE_S` until `delivery_timeout_s` has passed
  since its first try: the service applies a command once and answers a repeat with the stored
  outcome. Past that, each of its futures gets the error, and the messages may or may not be
  enqueued (ask by message id).
- **Back-pressure.** At most `max_pending` calls wait to be sent; a further call blocks until
  there is room (`TimeoutError` after `block_s`).

In an asyncio program, await a call's future with `asyncio.wrap_future(coalescer.enqueue(...))`,
given `Coalescer(async_client.client, domain)`.

The coalescer's thread is the only user of the client it was given while the coalescer is open,
unless that client speaks to a server (its HTTP connection pool is thread-safe): a local client
(`Client(DATA)`) must not be used elsewhere meanwhile. `close` (or leaving the `with` block) sends
what is pending and waits for it; a future cancelled before its command is sent is left out.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyload.errors import CommandRejected, KeyloadError, OutcomeTimeout, ServiceUnavailable, rejection
from keyload.limits import MAX_ACK_BATCH, MAX_BATCH_MUTATIONS
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
DEFAULT_MAX_BATCH_BYTES = 1024 * 1024  # bodies and headers of one Batch; a larger message goes alone
DEFAULT_MAX_PENDING = 10_000  # calls waiting to be sent before a further call blocks
DEFAULT_BLOCK_S = 60.0  # how long a call blocks for room before TimeoutError
DEFAULT_DELIVERY_TIMEOUT_S = 120.0  # as Kafka's delivery.timeout.ms: how long one command is retried
RETRY_PAUSE_S = 0.1  # between tries of a command whose service is away
MAX_LINGER_MS = 60_000
MAX_CALLS = min(MAX_BATCH_MUTATIONS, MAX_ACK_BATCH)  # one count bounds both kinds of command

_MUTATION_PREFIX = re.compile(r"mutation \d+: ")  # how a Batch's refusal names its mutation


@dataclass
class CoalescerStats:
    """What a coalescer sent: `commands` Batches and AckBatches, carrying `messages` and `acks`;
    `resent` of those commands were sent again without a message the service refused; `retries`
    tries repeated by command id after a timeout or an unreachable server."""

    commands: int = 0
    messages: int = 0
    acks: int = 0
    resent: int = 0
    retries: int = 0


@dataclass
class _Call:
    """One caller's message or token, waiting for its command."""

    seq: int  # its place among every call handed in
    kind: str  # ENQUEUE or ACK
    item: Any  # an EnqueueMessage, or a token
    size: int  # what it adds to a Batch's bytes
    future: Future[Any]
    since: float  # monotonic time it was handed in


ENQUEUE, ACK = "enqueue", "ack"


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
            raise ValueError(f"linger_ms must be 0..{MAX_LINGER_MS}")
        if not 1 <= max_messages <= MAX_CALLS:
            raise ValueError(f"max_messages must be 1..{MAX_CALLS} (a Batch's and an AckBatch's limit)")
        if max_bytes < 1 or max_pending < 1 or block_s < 0 or delivery_timeout_s < 0:
            raise ValueError("max_bytes and max_pending must be positive, block_s and delivery_timeout_s not negative")
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
        self._answers = threading.Condition(lock)  # callers wait here for room, flushes for their calls
        self._pending: deque[_Call] = deque()  # in the order handed in
        self._waiting = {ENQUEUE: 0, ACK: 0}  # pending calls by kind
        self._sending: list[_Call] = []  # the command in flight
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
        `message_id` defaults to a new UUID (the future's result names it)."""
        message = EnqueueMessage(
            queue=queue,
            message_id=str(uuid.uuid4()) if message_id is None else message_id,
            body=body,
            headers=headers or {},
            ordering_key=ordering_key,
            not_before_ms=not_before_ms,
            expires_at_ms=expires_at_ms,
        )
        size = len(body) + sum(len(name) + len(value) for name, value in message.headers.items())
        return self._hand_in(ENQUEUE, message, size)

    def ack(self, token: str) -> Future[TokenResult]:
        """Ack one delivery of this domain's queues in an AckBatch with others: the token's result
        (status committed), or the typed error a lone ack would have raised."""
        return self._hand_in(ACK, token, 0)

    def flush(self, timeout_s: float | None = None) -> None:
        """Send what was handed in before this call without lingering, and wait until each of its
        futures is settled (TimeoutError after `timeout_s`)."""
        with self._work:
            target = self._handed
            self._flush_through = max(self._flush_through, target)
            self._work.notify()
            if not self._answers.wait_for(lambda: self._answered_through(target), timeout_s):
                raise TimeoutError(f"calls handed in before the flush are still unanswered after {timeout_s} s")

    def close(self) -> None:
        """Send what is pending, wait for it, and stop the coalescer's thread; later calls raise."""
        with self._work:
            self._closing = True
            self._work.notify()
            self._answers.notify_all()
        self._thread.join()

    def __enter__(self) -> Coalescer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- callers' side ----------------------------------------------------------------------------

    def _hand_in(self, kind: str, item: Any, size: int) -> Future[Any]:
        future: Future[Any] = Future()
        with self._work:
            room = self._answers.wait_for(
                lambda: self._closing or len(self._pending) < self._max_pending, self._block_s
            )
            if self._closing:
                raise KeyloadError("the coalescer is closed")
            if not room:
                raise TimeoutError(f"{self._max_pending} calls have waited to be sent for {self._block_s} s")
            self._handed += 1
            self._pending.append(_Call(self._handed, kind, item, size, future, time.monotonic()))
            self._waiting[kind] += 1
            if len(self._pending) == 1 or self._waiting[kind] == self._max_messages:
                self._work.notify()  # a linger to start, or a full command
        return future

    def _has_room(self) -> bool:
        return self._closing or len(self._pending) < self._max_pending

    def _answered_through(self, seq: int) -> bool:
        """Whether every call up to `seq` has its answer (neither pending nor in flight)."""
        oldest = min((call.seq for call in self._sending), default=seq + 1)
        if self._pending:
            oldest = min(oldest, self._pending[0].seq)
        return oldest > seq

    # -- the sending thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._work:
                while not self._due():
                    if self._closing and not self._pending:
                        return
                    self._work.wait(self._until_due())
                self._sending = self._take()
                self._answers.notify_all()  # room for callers
            try:
                self._send(self._sending)
            finally:
                with self._work:
                    self._sending = []
                    self._answers.notify_all()

    def _due(self) -> bool:
        """Whether a command goes now: one is full, the oldest call's linger is over, or a flush or
        close asks for it. The oldest call's command goes first."""
        if not self._pending:
            return False
        oldest = self._pending[0]
        return (
            self._closing
            or oldest.seq <= self._flush_through
            or max(self._waiting.values()) >= self._max_messages
            or oldest.since + self._linger_s <= time.monotonic()
        )

    def _until_due(self) -> float | None:
        return self._pending[0].since + self._linger_s - time.monotonic() if self._pending else None

    def _take(self) -> list[_Call]:
        """The next command's calls: those of the oldest call's kind, in order, up to the first that
        does not fit (a first message over `max_bytes` goes alone). A call whose future was
        cancelled is left out."""
        kind = self._pending[0].kind
        taken: list[_Call] = []
        passed: list[_Call] = []  # calls of the other kind, kept in their places
        size = 0
        while self._pending:
            call = self._pending[0]
            if call.kind != kind:
                passed.append(self._pending.popleft())
                continue
            if len(taken) == self._max_messages or (taken and size + call.size > self._max_bytes):
                break
            self._pending.popleft()
            self._waiting[kind] -= 1
            if call.future.set_running_or_notify_cancel():
                taken.append(call)
                size += call.size
        self._pending.extendleft(reversed(passed))
        return taken

    def _send(self, calls: list[_Call]) -> None:
        """Send the calls' command, and settle each call's future with its result or its error."""
        if not calls:
            return
        try:
            if calls[0].kind == ENQUEUE:
                self._send_enqueues(list(calls))
            else:
                self._send_acks(calls)
        except Exception as error:  # the command as a whole failed: every call still open shares its error
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(error)

    def _send_enqueues(self, calls: list[_Call]) -> None:
        while calls:
            body = {"mutations": [mutation_record(call.item) for call in calls]}
            try:
                outcome = self._committed("Batch", body)
            except CommandRejected as refusal:
                failed = refusal.failed_index
                if failed is None or not 0 <= failed < len(calls):
                    raise
                detail = _MUTATION_PREFIX.sub("", refusal.outcome.detail, count=1)
                calls.pop(failed).future.set_exception(rejection(refusal.outcome, f"{refusal.code}: {detail}"))
                if calls:
                    self.stats.resent += 1
                continue
            assert isinstance(outcome.result, BatchResult)
            for call, result in zip(calls, outcome.result.results, strict=True):
                call.future.set_result(result)
            self.stats.messages += len(calls)
            return

    def _send_acks(self, calls: list[_Call]) -> None:
        outcome = self._committed("AckBatch", {"tokens": [call.item for call in calls]})
        assert isinstance(outcome.result, AckBatchResult)
        for call, result in zip(calls, outcome.result.results, strict=True):
            if result.error_code is None:
                call.future.set_result(result)
            else:
                refused = dataclasses.replace(
                    outcome, status=OutcomeStatus.rejected, error_code=result.error_code, result=None
                )
                message = f"{result.error_code}: a token of AckBatch {outcome.command_id!r}"
                call.future.set_exception(rejection(refused, message))
        self.stats.acks += len(calls)

    def _committed(self, name: str, body: dict[str, Any]) -> Outcome:
        """Send one command under a new command id, again by the same id while its outcome does not
        come or its server cannot be reached (up to `delivery_timeout_s`): its committed outcome, or
        its refusal raised."""
        kind = self.client.commands[name]
        command_id = str(uuid.uuid4())
        body = kind.filled(body, command_id)
        give_up = time.monotonic() + self._delivery_timeout_s
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
