"""An order service that processes every order exactly once.

It consumes the queue "orders" with the consumer helper in exactly-once mode.
For each order the handler does not write anything itself: it *returns* the
order's effects (a document with the processed order, a message for the
shipping service), and the helper commits them together with the ack in one
CompleteProcessing command. If the service dies anywhere — before, during or
after that command — either all of an order's effects exist and the order is
acked, or none exist and the order is delivered again. A repeat of a completion
that did land is recognised by the log (`already_processed`) and applies
nothing twice.

The one rule for handlers: effects are a function of the order. Ids, keys and
bodies are derived from the order (never random, never the current time), so a
re-run produces byte-identical effects.

Run it next to `keyload run` (see examples/README.md):

    python examples/order_service.py --data ./keyload-data

`--crash-probability` is a test hook, not a feature: it makes the handler kill
its own process (SIGKILL) at random points, so tests can check that crashes lose
and duplicate nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from keyload import Client
from keyload.sdk.consumer import ExactlyOnce
from keyload.sdk.results import Delivery, EnqueueMessage, Mutation, PutDocument

ORDERS = "orders"
SHIPMENTS = "shipments"
HANDLER_SCOPE = "order-service"  # names this handler in the inbox: one completion per delivery and scope


def canonical(value: Any) -> bytes:
    """JSON with sorted keys and no spaces: the same value always encodes to the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def order_effects(order: dict[str, Any]) -> list[Mutation]:
    """What processing one order writes. Pure: the same order gives the same effects, byte for byte."""
    order_id = str(order["id"])
    items = [{"sku": str(item["sku"]), "qty": int(item["qty"])} for item in order["items"]]
    processed = {
        "id": order_id,
        "customer": order["customer"],
        "items": items,
        "amount_cents": int(order["amount_cents"]),
        "status": "accepted",
    }
    shipment = {"order_id": order_id, "customer": order["customer"], "items": items}
    return [
        # expected_revision=0: the order document must not exist yet. A second, different
        # processing of the same order would be refused instead of overwriting the first.
        PutDocument(f"order/{order_id}", canonical(processed), expected_revision=0),
        EnqueueMessage(SHIPMENTS, message_id=f"ship-{order_id}", body=canonical(shipment)),
    ]


class OrderHandler:
    """The consumer's handler: parse the order, return its effects. Also the crash hook and idle clock."""

    def __init__(self, crash_probability: float, seed: int | None) -> None:
        self.crash_probability = crash_probability
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.last_activity = time.monotonic()

    def crash_point(self) -> str | None:
        """Test hook: where this call dies ("start" or "end"), with the configured probability; None: it lives."""
        with self.lock:
            if self.rng.random() >= self.crash_probability:
                return None
            return self.rng.choice(("start", "end"))

    def __call__(self, delivery: Delivery) -> Sequence[Mutation]:
        self.last_activity = time.monotonic()
        crash = self.crash_point()
        if crash == "start":
            os.kill(os.getpid(), signal.SIGKILL)  # before any work
        effects = order_effects(json.loads(delivery.body))
        if crash == "end":
            os.kill(os.getpid(), signal.SIGKILL)  # the effects computed, not yet committed
        return effects


def stop_when_idle(handler: OrderHandler, idle_s: float, stop: threading.Event) -> None:
    """Set `stop` once no order has arrived for `idle_s` seconds."""
    while not stop.wait(0.1):
        if time.monotonic() - handler.last_activity >= idle_s:
            stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Process orders from the queue 'orders' exactly once.")
    parser.add_argument("--data", default=os.environ.get("KEYLOAD_DATA", "./keyload-data"), help="data directory")
    parser.add_argument("--domain", default="shop")
    parser.add_argument("--principal", default="order-service", help="every instance must use the same one")
    parser.add_argument("--concurrency", type=int, default=8, help="handlers running at once")
    parser.add_argument("--lease-ms", type=int, default=10_000, help="renewed while a handler runs")
    parser.add_argument("--wait-ms", type=int, default=1_000, help="long poll while idle")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each outcome")
    parser.add_argument("--stop-after-idle", type=float, metavar="S", help="exit after S seconds without orders")
    parser.add_argument(
        "--crash-probability",
        type=float,
        default=0.0,
        metavar="P",
        help="TEST HOOK: per order handled, kill this process (SIGKILL) mid-handling with probability P",
    )
    parser.add_argument("--seed", type=int, help="seed of the crash hook's random numbers")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    handler = OrderHandler(args.crash_probability, args.seed)
    if args.stop_after_idle is not None:
        threading.Thread(target=stop_when_idle, args=(handler, args.stop_after_idle, stop), daemon=True).start()

    print(f"order-service: consuming {args.domain}/{ORDERS} (pid {os.getpid()})", flush=True)
    with Client(args.data, principal=args.principal, timeout_s=args.timeout) as client:
        stats = client.consume(
            args.domain,
            ORDERS,
            handler,
            concurrency=args.concurrency,
            lease_ms=args.lease_ms,
            wait_ms=args.wait_ms,
            stop=stop,
            exactly_once=ExactlyOnce(HANDLER_SCOPE),
        )
    # One JSON line: received, acked (already_processed included), nacked, lost_leases, already_processed.
    print(json.dumps({"stats": vars(stats)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
