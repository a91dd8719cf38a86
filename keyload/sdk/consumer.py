"""The consumer helpers: receive, run a handler per delivery, renew while it runs, ack or nack.

One engine serves a queue (`consume`) and a subscription group (`subscribe`).
All log traffic happens on the calling thread (a Client is not thread-safe);
handlers run on a thread pool. A handler that returns acks its delivery, one that
raises nacks it (retried per the queue's or group's policy, then dead-lettered or
parked); so does one whose return breaks the contract (an awaitable: handlers are
plain functions here; in exactly-once mode, anything but None or a sequence of
mutations). Setting `stop` stops receiving, lets running handlers finish, settles
them, and returns (a long-poll receive in progress finishes first: at most
`wait_ms`). An error that ends the helper does the same before it is raised.

A receive asks for as many deliveries as handlers are free. A queue takes at most
its `receive_max_messages` at once and refuses more (Validation, nothing leased):
the helper then asks for half as many, down to one, and keeps the smaller number
for the rest of the run (a refusal of a receive for one delivery is raised).

Leases are the queue's or group's own (its policy's `lease_ms`) unless `lease_ms` is given, and
are renewed while a handler runs, when two thirds of the lease are left, counted from when the
receive or renew was sent: the lease's length is read from the answer (its `lease_until_ms` less
the log time the outcome was evaluated at), never from this machine's clock against the server's.

While idle, a consumer long-polls: one receive command per `wait_ms`, waiting in
the log (a consumer of a paused queue or group waits there for the resume). While
handlers run it receives without waiting, and a paused source's DispatchPaused
refusal then means "nothing now": the handlers are settled and the consumer
waits once they are done.

Exactly-once mode (`exactly_once=ExactlyOnce(handler_scope)`): the handler
returns its effects (document writes, enqueues, publishes: keyload.sdk.results
mutations) instead of performing them, and the helper commits them with the ack
in one CompleteProcessing. A crash anywhere leaves either everything or nothing:
a completion that did not land leaves the lease to run out and the delivery comes
again (the handler runs again); one that did acked the delivery with its effects.
A completion of a delivery that was already completed — by a holder whose lease
ran out while it was paused, after another consumer completed the redelivery — is
recognised (`already_processed`, counted in the stats) and applies nothing twice.
Effects must be a function of the delivery (ids derived from it, never random),
or such a repeat is a Conflict. A completion refused for another reason (a
document revision conflict, a full queue) is nacked and retried per the policy.

An outcome that does not come in time (the processor or broker is down longer
than the client's timeout), or a server that cannot take the command now
(restarting, draining, a halted partition: ServiceUnavailable), does not stop the
helper: the command is counted in
`unknown_outcomes` and tried again next round as a new command. A receive's lost
deliveries come again when their leases run out; a settle that did apply shows
as a lost lease, or, exactly once, as already processed; a delivery stays
unsettled (and `stop` waits for it) until its settle is known.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from threading import Event
from typing import TYPE_CHECKING, Generic, Protocol, TypedDict, TypeVar, Unpack

from keyload.errors import (
    CommandRejected,
    DispatchPausedError,
    InvalidCommand,
    KeyloadError,
    OutcomeTimeout,
    ServiceUnavailable,
    ValidationError,
)
from keyload.limits import MAX_ACK_BATCH
from keyload.sdk.results import (
    Delivery,
    GroupDelivery,
    GroupLeaseResult,
    GroupReceiveResult,
    LeaseResult,
    Mutation,
    ReceiveResult,
)

if TYPE_CHECKING:
    from keyload.sdk.client import Client

DEFAULT_CONCURRENCY = 4
RENEW_FRACTION = 3  # renew every third of the lease (two thirds still left): see `renew_at`
DEFAULT_WAIT_MS = 5_000  # long poll while idle: one receive command per wait, not a flood
SETTLE_POLL_S = 0.05  # how often running handlers are checked for completion and renewal
LOST_LEASE_CODES = frozenset({"StaleLease", "LeaseExpired", "TokenInvalidated"})
# No outcome known: none in time, or a server away (restarting, draining, a halted partition's 503).
UNKNOWN_OUTCOME = (OutcomeTimeout, ServiceUnavailable)
UNKNOWN_PAUSE_S = 0.1  # after a round that met one: a server that refuses at once is not asked in a loop


class Token(Protocol):
    @property
    def token(self) -> str: ...


class Settled(Protocol):
    """One token's fate in an ack batch."""

    @property
    def status(self) -> str: ...

    @property
    def error_code(self) -> str | None: ...


D = TypeVar("D", bound=Token)
D_co = TypeVar("D_co", bound=Token, covariant=True)


@dataclass
class ConsumeStats:
    received: int = 0
    acked: int = 0
    nacked: int = 0
    lost_leases: int = 0  # renew/ack/nack found the lease gone: the delivery will come again
    already_processed: int = 0  # exactly-once mode: completions the log had already applied (counted in acked)
    unknown_outcomes: int = 0  # commands without a known outcome (OutcomeTimeout, ServiceUnavailable): retried


class Source(Protocol[D_co]):
    """Where deliveries come from and go back to: a queue or a subscription group.

    `receive(wait=True)` long-polls in the log for up to the source's `wait_ms`."""

    def receive(self, max_items: int, lease_ms: int | None, wait: bool) -> Leased[D_co]: ...

    def ack_batch(self, tokens: list[str]) -> Sequence[Settled]: ...

    def nack(self, token: str, delay_ms: int | None) -> None: ...

    def renew(self, token: str, lease_ms: int | None) -> int | None:
        """Renew a lease; the length it was renewed for in ms (None: it is not held)."""
        ...

    def complete(self, token: str, effects: Sequence[Mutation], scope: str, execution_generation: int) -> bool:
        """CompleteProcessing of one delivery; whether the effects were already processed."""
        ...


@dataclass(frozen=True)
class Leased(Generic[D_co]):
    """What a receive leased: the deliveries whose leases are held, and the leases' length in ms."""

    deliveries: Sequence[D_co]
    lease_ms: int


Held = TypeVar("Held", Delivery, GroupDelivery)


def leased(deliveries: Sequence[Held], at: int) -> Leased[Held]:
    """The deliveries of a receive answered at log time `at` whose leases are held (a receive the SDK
    repeated, a retry after a lost answer, reports a lease settled or expired since with its error
    code, and nothing is left to process), and their leases' length (`Client._sent`)."""
    held = [delivery for delivery in deliveries if delivery.error_code is None]
    return Leased(held, held[0].lease_until_ms - at if held else 0)


def renewed(lease_until_ms: int | None, at: int) -> int | None:
    """The length of a lease renewed at log time `at` until `lease_until_ms` (None: not held)."""
    return None if lease_until_ms is None else lease_until_ms - at


@dataclass
class QueueSource:
    client: Client
    domain: str
    queue: str
    wait_ms: int

    def receive(self, max_items: int, lease_ms: int | None, wait: bool) -> Leased[Delivery]:
        body = {
            "queue": self.queue,
            "max_messages": max_items,
            "max_bytes": None,
            "lease_ms": lease_ms,
            "wait_ms": self.wait_ms if wait else None,
        }
        result, at = self.client._send_timed(ReceiveResult, "Receive", self.domain, body)
        return leased(result.deliveries, at)

    def ack_batch(self, tokens: list[str]) -> Sequence[Settled]:
        return self.client.ack_batch(self.domain, tokens).results

    def nack(self, token: str, delay_ms: int | None) -> None:
        self.client.nack(self.domain, token, delay_ms=delay_ms)

    def renew(self, token: str, lease_ms: int | None) -> int | None:
        body = {"token": token, "lease_ms": lease_ms}
        result, at = self.client._send_timed(LeaseResult, "Renew", self.domain, body)
        return renewed(result.lease_until_ms, at)

    def complete(self, token: str, effects: Sequence[Mutation], scope: str, execution_generation: int) -> bool:
        return self.client.complete_processing(
            self.domain, token, effects, handler_scope=scope, execution_generation=execution_generation
        ).already_processed


@dataclass
class GroupSource:
    client: Client
    domain: str
    topic: str
    group: str
    wait_ms: int

    def receive(self, max_items: int, lease_ms: int | None, wait: bool) -> Leased[GroupDelivery]:
        body = {
            "topic": self.topic,
            "group": self.group,
            "max_events": max_items,
            "max_bytes": None,
            "lease_ms": lease_ms,
            "wait_ms": self.wait_ms if wait else None,
        }
        result, at = self.client._send_timed(GroupReceiveResult, "GroupReceive", self.domain, body)
        return leased(result.deliveries, at)

    def ack_batch(self, tokens: list[str]) -> Sequence[Settled]:
        return self.client.group_ack_batch(self.domain, self.topic, self.group, tokens).results

    def nack(self, token: str, delay_ms: int | None) -> None:
        self.client.group_nack(self.domain, self.topic, self.group, token, delay_ms=delay_ms)

    def renew(self, token: str, lease_ms: int | None) -> int | None:
        body = {"topic": self.topic, "group": self.group, "token": token, "lease_ms": lease_ms}
        result, at = self.client._send_timed(GroupLeaseResult, "GroupRenew", self.domain, body)
        return renewed(result.lease_until_ms, at)

    def complete(self, token: str, effects: Sequence[Mutation], scope: str, execution_generation: int) -> bool:
        return self.client.complete_processing(
            self.domain,
            token,
            effects,
            handler_scope=scope,
            execution_generation=execution_generation,
            topic=self.topic,
            group=self.group,
        ).already_processed


@dataclass
class _Running(Generic[D]):
    delivery: D
    renew_at: float


@dataclass(frozen=True)
class ExactlyOnce:
    """Exactly-once mode: the handler's returned effects are committed with the ack (module docstring)."""

    handler_scope: str
    execution_generation: int = 0


Handled = Sequence[Mutation] | None  # what a handler returns: its effects in exactly-once mode, else nothing


def held_to_contract(handler: Callable[[D], Handled], exactly_once: bool) -> Callable[[D], Handled]:
    """`handler`, its return checked on the handler's thread: a return that breaks the contract fails
    its delivery as an exception would (nacked), instead of acking work that never ran (an
    awaitable nobody awaits) or failing the settle (effects that are not mutations)."""

    def run(delivery: D) -> Handled:
        returned = handler(delivery)
        if inspect.isawaitable(returned):
            if inspect.iscoroutine(returned):
                returned.close()  # never run: no "never awaited" warning
            raise InvalidCommand("the handler returned an awaitable: Client runs plain functions (AsyncClient awaits)")
        if exactly_once and returned is not None and not _mutations(returned):
            raise InvalidCommand(
                "an exactly-once handler returns None or a sequence of mutations (keyload.sdk.results: "
                f"PutDocument, EnqueueMessage, PublishEvents, ...), not {type(returned).__name__}"
            )
        return returned

    return run


def _mutations(returned: object) -> bool:
    return isinstance(returned, (list, tuple)) and all(isinstance(effect, Mutation) for effect in returned)


def work(
    source: Source[D],
    handler: Callable[[D], Handled],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease_ms: int | None = None,
    stop: Event | None = None,
    nack_delay_ms: int | None = None,
    exactly_once: ExactlyOnce | None = None,
) -> ConsumeStats:
    """Process deliveries of `source` until `stop` is set; see the module docstring."""
    if not 1 <= concurrency <= MAX_ACK_BATCH:
        raise InvalidCommand(f"concurrency must be 1..{MAX_ACK_BATCH} (one AckBatch settles a round)")
    if inspect.iscoroutinefunction(handler):
        raise InvalidCommand("the handler is a coroutine function: Client runs plain functions (AsyncClient awaits)")
    handle = held_to_contract(handler, exactly_once is not None)
    most = concurrency  # deliveries one receive asks for at most: halved while the source refuses as many
    stop = stop or Event()
    stats = ConsumeStats()
    running: dict[Future[Handled], _Running[D]] = {}

    def renew_at(asked: float, granted_ms: int | None) -> float:
        """When to renew a lease of `granted_ms` asked for at `asked` (monotonic): a third of it after
        it was asked for, so the time the answer took does not eat into it (None: not held, never)."""
        return float("inf") if granted_ms is None else asked + granted_ms / 1000 / RENEW_FRACTION

    def known(command: Callable[..., object], *args: object) -> bool:
        """Run a command; False when its outcome is not known (it is tried again later)."""
        try:
            command(*args)
        except UNKNOWN_OUTCOME:
            stats.unknown_outcomes += 1
            return False
        return True

    def nack(token: str) -> None:
        try:
            source.nack(token, nack_delay_ms)
            stats.nacked += 1
        except CommandRejected as refusal:
            if refusal.code not in LOST_LEASE_CODES:
                raise
            stats.lost_leases += 1

    def complete(token: str, effects: Handled, mode: ExactlyOnce) -> None:
        try:
            if source.complete(token, effects or (), mode.handler_scope, mode.execution_generation):
                stats.already_processed += 1
            stats.acked += 1
        except CommandRejected as refusal:
            if refusal.code in LOST_LEASE_CODES:
                stats.lost_leases += 1
            else:
                nack(token)  # the effects were refused (nothing applied): retry per the policy

    def ack_all(tokens: list[str]) -> None:
        for result in source.ack_batch(tokens):
            if result.status == "committed":
                stats.acked += 1
            elif result.error_code in LOST_LEASE_CODES:
                stats.lost_leases += 1
            else:
                raise KeyloadError(f"ack refused: {result.error_code}")

    def settle(finished: list[Future[Handled]]) -> None:
        """Ack the handlers that returned in one batch (or complete each, exactly once); nack the
        ones that raised. What is settled leaves `running`; what met an unknown outcome stays
        there and is settled again next round (a repeat that did apply shows as a lost lease,
        or, exactly once, as already processed)."""
        settled: list[Future[Handled]] = []
        succeeded = [future for future in finished if future.exception() is None]
        if exactly_once is None:
            tokens = [running[future].delivery.token for future in succeeded]
            if not tokens or known(ack_all, tokens):
                settled += succeeded
        else:
            mode = exactly_once
            for future in succeeded:
                token = running[future].delivery.token
                if known(complete, token, future.result(), mode):
                    settled.append(future)
        for future in finished:
            token = running[future].delivery.token
            if future.exception() is not None and known(nack, token):
                settled.append(future)
        for future in settled:
            del running[future]

    def renew_due() -> None:
        now = time.monotonic()
        for future, entry in list(running.items()):
            if entry.renew_at > now or future.done():
                continue
            try:
                entry.renew_at = renew_at(now, source.renew(entry.delivery.token, lease_ms))
            except UNKNOWN_OUTCOME:
                stats.unknown_outcomes += 1  # renewed again next round
            except CommandRejected as refusal:
                if refusal.code not in LOST_LEASE_CODES:
                    raise
                entry.renew_at = float("inf")  # the lease is gone; settle will count it

    def settle_before_raising() -> None:
        """The helper ends with an error: what runs finishes and is settled first, as `stop` would
        have it, so that no finished work comes again (what cannot be settled now is left to its lease)."""
        wait(list(running))
        with contextlib.suppress(KeyloadError):
            settle(list(running))

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="keyload-consumer") as pool:
        try:
            while not stop.is_set() or running:
                unknown_before = stats.unknown_outcomes
                free = min(concurrency - len(running), most)
                if free > 0 and not stop.is_set():
                    # Wait in the log only while nothing runs, so running handlers keep being settled and
                    # renewed. A lease runs from the receive's log time, after it was asked for: renewals
                    # count from then.
                    asked = time.monotonic()
                    got: Leased[D] = Leased((), 0)
                    try:
                        got = source.receive(free, lease_ms, wait=not running)
                    except UNKNOWN_OUTCOME:  # what it may have leased comes again when the lease runs out
                        stats.unknown_outcomes += 1
                    except DispatchPausedError:  # only while handlers run: once they are done it waits
                        pass
                    except ValidationError:
                        if free == 1:
                            raise
                        most = free // 2  # more than the queue takes at once (module docstring)
                    for delivery in got.deliveries:
                        running[pool.submit(handle, delivery)] = _Running(delivery, renew_at(asked, got.lease_ms))
                    stats.received += len(got.deliveries)
                if running:
                    done, _ = wait(list(running), timeout=SETTLE_POLL_S, return_when=FIRST_COMPLETED)
                    if done:
                        settle(list(done))
                    renew_due()
                if stats.unknown_outcomes > unknown_before:
                    time.sleep(UNKNOWN_PAUSE_S)
        except KeyloadError:
            settle_before_raising()
            raise
    return stats


class WorkOptions(TypedDict, total=False):
    """How the helper works, each with a default: `concurrency` (DEFAULT_CONCURRENCY handlers at
    once), `lease_ms` (None: the queue's or group's own lease, module docstring), `stop` (set it to
    stop), `nack_delay_ms` (None: the policy's backoff), `exactly_once` (None: ack on return)."""

    concurrency: int
    lease_ms: int | None
    stop: Event | None
    nack_delay_ms: int | None
    exactly_once: ExactlyOnce | None


def consume(
    client: Client,
    domain: str,
    queue: str,
    handler: Callable[[Delivery], Handled],
    *,
    wait_ms: int = DEFAULT_WAIT_MS,
    **options: Unpack[WorkOptions],
) -> ConsumeStats:
    """Process deliveries of a queue until `stop` is set."""
    return work(QueueSource(client, domain, queue, wait_ms), handler, **options)


def subscribe(
    client: Client,
    domain: str,
    topic: str,
    group: str,
    handler: Callable[[GroupDelivery], Handled],
    *,
    wait_ms: int = DEFAULT_WAIT_MS,
    **options: Unpack[WorkOptions],
) -> ConsumeStats:
    """Process deliveries of a subscription group until `stop` is set."""
    return work(GroupSource(client, domain, topic, group, wait_ms), handler, **options)
