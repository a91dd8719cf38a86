"""The consumer helpers: receive, run a handler per delivery, renew while it runs, ack or nack.

One engine serves a queue (`consume`) and a subscription group (`subscribe`).
All log traffic happens on the calling thread (a Client is not thread-safe);
handlers run on a thread pool. A handler that returns acks its delivery, one that
raises nacks it (retried per the queue's or group's policy, then dead-lettered or
parked). Setting `stop` stops receiving, lets running handlers finish, settles
them, and returns (a long-poll receive in progress finishes first: at most
`wait_ms`).

While idle, a queue consumer long-polls (one Receive per `wait_ms`). Group
receives do not wait in the log yet, so an idle subscriber polls, its pause
doubling from IDLE_POLL_MIN_S to IDLE_POLL_MAX_S: one Receive a second at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from threading import Event
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from keyload.processors.limits import MAX_ACK_BATCH

from .errors import CommandRejected, KeyloadError
from .results import Delivery, GroupDelivery

if TYPE_CHECKING:
    from .client import Client

DEFAULT_CONCURRENCY = 4
DEFAULT_LEASE_MS = 30_000
RENEW_FRACTION = 3  # renew when a third of the lease is left
DEFAULT_WAIT_MS = 5_000  # long poll while idle: one receive command per wait, not a flood
SETTLE_POLL_S = 0.05  # how often running handlers are checked for completion and renewal
IDLE_POLL_MIN_S = 0.05  # an idle subscriber's first pause between receives ...
IDLE_POLL_MAX_S = 1.0  # ... doubling up to this
LOST_LEASE_CODES = frozenset({"StaleLease", "LeaseExpired", "TokenInvalidated"})


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


class Source(Protocol[D_co]):
    """Where deliveries come from and go back to: a queue or a subscription group."""

    waits_in_log: bool  # whether receive(wait=True) long-polls in the log

    def receive(self, max_items: int, lease_ms: int, wait: bool) -> Sequence[D_co]: ...

    def ack_batch(self, tokens: list[str]) -> Sequence[Settled]: ...

    def nack(self, token: str, delay_ms: int | None) -> None: ...

    def renew(self, token: str, lease_ms: int) -> None: ...


@dataclass
class QueueSource:
    client: Client
    domain: str
    queue: str
    wait_ms: int
    waits_in_log: bool = True

    def receive(self, max_items: int, lease_ms: int, wait: bool) -> Sequence[Delivery]:
        wait_ms = self.wait_ms if wait else None
        return self.client.receive(
            self.domain, self.queue, max_messages=max_items, lease_ms=lease_ms, wait_ms=wait_ms
        ).deliveries

    def ack_batch(self, tokens: list[str]) -> Sequence[Settled]:
        return self.client.ack_batch(self.domain, tokens).results

    def nack(self, token: str, delay_ms: int | None) -> None:
        self.client.nack(self.domain, token, delay_ms=delay_ms)

    def renew(self, token: str, lease_ms: int) -> None:
        self.client.renew(self.domain, token, lease_ms=lease_ms)


@dataclass
class GroupSource:
    client: Client
    domain: str
    topic: str
    group: str
    waits_in_log: bool = False

    def receive(self, max_items: int, lease_ms: int, wait: bool) -> Sequence[GroupDelivery]:
        return self.client.group_receive(
            self.domain, self.topic, self.group, max_events=max_items, lease_ms=lease_ms
        ).deliveries

    def ack_batch(self, tokens: list[str]) -> Sequence[Settled]:
        return self.client.group_ack_batch(self.domain, self.topic, self.group, tokens).results

    def nack(self, token: str, delay_ms: int | None) -> None:
        self.client.group_nack(self.domain, self.topic, self.group, token, delay_ms=delay_ms)

    def renew(self, token: str, lease_ms: int) -> None:
        self.client.group_renew(self.domain, self.topic, self.group, token, lease_ms=lease_ms)


@dataclass
class _Running(Generic[D]):
    delivery: D
    renew_at: float


def work(
    source: Source[D],
    handler: Callable[[D], None],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease_ms: int = DEFAULT_LEASE_MS,
    stop: Event | None = None,
    nack_delay_ms: int | None = None,
) -> ConsumeStats:
    """Process deliveries of `source` until `stop` is set; see the module docstring."""
    if not 1 <= concurrency <= MAX_ACK_BATCH:
        raise ValueError(f"concurrency must be 1..{MAX_ACK_BATCH} (one AckBatch settles a round)")
    stop = stop or Event()
    stats = ConsumeStats()
    running: dict[Future[None], _Running[D]] = {}
    renew_every = lease_ms / 1000 / RENEW_FRACTION
    idle_pause = IDLE_POLL_MIN_S

    def settle(finished: list[tuple[Future[None], _Running[D]]]) -> None:
        """Ack the handlers that returned in one batch; nack the ones that raised."""
        succeeded = [entry.delivery.token for future, entry in finished if future.exception() is None]
        if succeeded:
            for result in source.ack_batch(succeeded):
                if result.status == "committed":
                    stats.acked += 1
                elif result.error_code in LOST_LEASE_CODES:
                    stats.lost_leases += 1
                else:
                    raise KeyloadError(f"ack refused: {result.error_code}")
        for future, entry in finished:
            if future.exception() is None:
                continue
            try:
                source.nack(entry.delivery.token, nack_delay_ms)
                stats.nacked += 1
            except CommandRejected as refusal:
                if refusal.code not in LOST_LEASE_CODES:
                    raise
                stats.lost_leases += 1

    def renew_due() -> None:
        now = time.monotonic()
        for future, entry in list(running.items()):
            if entry.renew_at > now or future.done():
                continue
            try:
                source.renew(entry.delivery.token, lease_ms)
                entry.renew_at = now + renew_every
            except CommandRejected as refusal:
                if refusal.code not in LOST_LEASE_CODES:
                    raise
                entry.renew_at = float("inf")  # the lease is gone; settle will count it

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="keyload-consumer") as pool:
        while not stop.is_set() or running:
            free = concurrency - len(running)
            if free > 0 and not stop.is_set():
                # Wait in the log only while nothing runs, so running handlers keep being settled and renewed.
                deliveries = source.receive(free, lease_ms, wait=not running)
                for delivery in deliveries:
                    running[pool.submit(handler, delivery)] = _Running(delivery, time.monotonic() + renew_every)
                stats.received += len(deliveries)
                if deliveries or running or source.waits_in_log:
                    idle_pause = IDLE_POLL_MIN_S
                else:
                    stop.wait(idle_pause)
                    idle_pause = min(idle_pause * 2, IDLE_POLL_MAX_S)
            if running:
                done, _ = wait(list(running), timeout=SETTLE_POLL_S, return_when=FIRST_COMPLETED)
                if done:
                    settle([(future, running.pop(future)) for future in done])
                renew_due()
    return stats


def consume(
    client: Client,
    domain: str,
    queue: str,
    handler: Callable[[Delivery], None],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease_ms: int = DEFAULT_LEASE_MS,
    wait_ms: int = DEFAULT_WAIT_MS,
    stop: Event | None = None,
    nack_delay_ms: int | None = None,
) -> ConsumeStats:
    """Process deliveries of a queue until `stop` is set."""
    source = QueueSource(client, domain, queue, wait_ms)
    return work(source, handler, concurrency=concurrency, lease_ms=lease_ms, stop=stop, nack_delay_ms=nack_delay_ms)


def subscribe(
    client: Client,
    domain: str,
    topic: str,
    group: str,
    handler: Callable[[GroupDelivery], None],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease_ms: int = DEFAULT_LEASE_MS,
    stop: Event | None = None,
    nack_delay_ms: int | None = None,
) -> ConsumeStats:
    """Process deliveries of a subscription group until `stop` is set."""
    source = GroupSource(client, domain, topic, group)
    return work(source, handler, concurrency=concurrency, lease_ms=lease_ms, stop=stop, nack_delay_ms=nack_delay_ms)
