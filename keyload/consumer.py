"""The consumer helper: receive, run a handler per delivery, renew while it runs, ack or nack.

All log traffic happens on the calling thread (a Client is not thread-safe);
handlers run on a thread pool. A handler that returns acks its delivery, one that
raises nacks it (retried per the queue's policy, or dead-lettered). Setting
`stop` stops receiving, lets running handlers finish, settles them, and returns
(a long-poll receive in progress finishes first: at most `wait_ms`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from threading import Event
from typing import TYPE_CHECKING

from keyload.processors.limits import MAX_ACK_BATCH

from .errors import CommandRejected, KeyloadError
from .results import Delivery

if TYPE_CHECKING:
    from .client import Client

Handler = Callable[[Delivery], None]

DEFAULT_CONCURRENCY = 4
DEFAULT_LEASE_MS = 30_000
RENEW_FRACTION = 3  # renew when a third of the lease is left
DEFAULT_WAIT_MS = 5_000  # long poll while idle: one receive command per wait, not a flood
SETTLE_POLL_S = 0.05  # how often running handlers are checked for completion and renewal
LOST_LEASE_CODES = frozenset({"StaleLease", "LeaseExpired", "TokenInvalidated"})


@dataclass
class ConsumeStats:
    received: int = 0
    acked: int = 0
    nacked: int = 0
    lost_leases: int = 0  # renew/ack/nack found the lease gone: the message will be redelivered


@dataclass
class _Running:
    delivery: Delivery
    renew_at: float


def consume(
    client: Client,
    domain: str,
    queue: str,
    handler: Handler,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease_ms: int = DEFAULT_LEASE_MS,
    wait_ms: int = DEFAULT_WAIT_MS,
    stop: Event | None = None,
    nack_delay_ms: int | None = None,
) -> ConsumeStats:
    """Process deliveries of `queue` until `stop` is set; see the module docstring."""
    if not 1 <= concurrency <= MAX_ACK_BATCH:
        raise ValueError(f"concurrency must be 1..{MAX_ACK_BATCH} (one AckBatch settles a round)")
    stop = stop or Event()
    stats = ConsumeStats()
    running: dict[Future[None], _Running] = {}
    renew_every = lease_ms / 1000 / RENEW_FRACTION

    def settle(finished: list[tuple[Future[None], _Running]]) -> None:
        """Ack the handlers that returned in one AckBatch; nack the ones that raised."""
        succeeded = [entry.delivery.token for future, entry in finished if future.exception() is None]
        if succeeded:
            for result in client.ack_batch(domain, succeeded).results:
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
                client.nack(domain, entry.delivery.token, delay_ms=nack_delay_ms)
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
                client.renew(domain, entry.delivery.token, lease_ms=lease_ms)
                entry.renew_at = now + renew_every
            except CommandRejected as refusal:
                if refusal.code not in LOST_LEASE_CODES:
                    raise
                entry.renew_at = float("inf")  # the lease is gone; settle will count it

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="keyload-consumer") as pool:
        while not stop.is_set() or running:
            free = concurrency - len(running)
            if free > 0 and not stop.is_set():
                # Long-poll only while nothing runs, so running handlers keep being settled and renewed.
                result = client.receive(
                    domain, queue, max_messages=free, lease_ms=lease_ms, wait_ms=None if running else wait_ms
                )
                for delivery in result.deliveries:
                    running[pool.submit(handler, delivery)] = _Running(delivery, time.monotonic() + renew_every)
                stats.received += len(result.deliveries)
            if running:
                done, _ = wait(list(running), timeout=SETTLE_POLL_S, return_when=FIRST_COMPLETED)
                if done:
                    settle([(future, running.pop(future)) for future in done])
                renew_due()
    return stats
