"""The consumer side of keyload in one screen; `scripts/demo` runs it next to `keyload run`.

A work queue with a small retry policy (receive, ack, a nack retried on its
backoff, a message failed until it is dead-lettered, then redriven), a topic
read by two independent subscription groups, a principal refused what it is not
granted, and two recovery drills: one from
offset 0, one from a checkpoint taken between the queue and the topic work (so
it replays the topic's commands). Every step checks that keyload did what its
line says; otherwise the demo stops with "demo FAILED: ..." and exit status 1.

    python scripts/demo.py --data DIR     # DIR served by `keyload run`, fresh
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TypeVar

from keyload import Capability, Client, Grant
from keyload.errors import PermissionDeniedError
from keyload.sdk.results import Delivery, Event, QueuePolicySpec

DOMAIN = "shop"
QUEUE = "orders"
TOPIC = "events"
GROUPS = ("billing", "shipping")
MAX_ATTEMPTS = 3
RETRY_BASE_MS = 500  # attempt n waits 500 ms · 2^(n-1): 500 ms, then 1 s
RETRY_FACTOR = 2
RETRY_MAX_MS = 2_000
WAIT_MS = 5_000  # long poll for a retry coming due; well past every backoff here
CLI_TIMEOUT_S = 60

T = TypeVar("T")


class DemoFailed(Exception):
    """keyload did not do what the demo says it does."""


def check(condition: bool, what: str) -> None:
    if not condition:
        raise DemoFailed(what)


def say(text: str = "") -> None:
    print(text, flush=True)


def ids(items: Sequence[Delivery]) -> str:
    return ", ".join(d.message_id for d in items)


def only(items: Sequence[T], what: str) -> T:
    check(len(items) == 1, f"{what}: {len(items)} found, not one")
    return items[0]


def receive_one(client: Client, message_id: str) -> tuple[Delivery, float]:
    """Long-poll until `message_id` is delivered; the delivery and how long it took."""
    started = time.monotonic()
    deliveries = client.receive(DOMAIN, QUEUE, max_messages=1, wait_ms=WAIT_MS).deliveries
    delivery = only(deliveries, f"{message_id} coming back within {WAIT_MS} ms")
    check(delivery.message_id == message_id, f"expected {message_id}, received {delivery.message_id}")
    return delivery, time.monotonic() - started


def nack_for_retry(client: Client, delivery: Delivery) -> float:
    """Nack a delivery that has attempts left; its backoff in seconds."""
    result = client.nack(DOMAIN, delivery.token)
    expected_ms: int = min(RETRY_BASE_MS * RETRY_FACTOR ** (delivery.attempts - 1), RETRY_MAX_MS)
    check(result.state == "scheduled", f"{delivery.message_id}: nack left it {result.state}, not scheduled")
    check(result.retry_delay_ms == expected_ms, f"{delivery.message_id}: backoff {result.retry_delay_ms} ms")
    return expected_ms / 1000


def queue_part(client: Client) -> None:
    say("== a work queue: ack, retry on backoff, dead letter, redrive")
    policy = QueuePolicySpec(
        max_attempts=MAX_ATTEMPTS,
        retry_base_ms=RETRY_BASE_MS,
        retry_factor=RETRY_FACTOR,
        retry_max_ms=RETRY_MAX_MS,
        retry_jitter="none",
    )
    client.create_queue(DOMAIN, QUEUE, policy)
    say(f"created queue '{QUEUE}': {MAX_ATTEMPTS} attempts, backoff {RETRY_BASE_MS} ms doubling")
    orders = [f"order-{n}" for n in (1, 2, 3)]
    for n, order in enumerate(orders, 1):
        client.enqueue(DOMAIN, QUEUE, b'{"order": %d}' % n, message_id=order, command_id=f"enqueue-{order}")
    say(f"enqueued {', '.join(orders)}")

    batch = client.receive(DOMAIN, QUEUE, max_messages=10).deliveries
    check([d.message_id for d in batch] == orders, f"received {ids(batch)}, not the three orders in order")
    check(all(d.attempts == 1 for d in batch), "a first delivery is not attempt 1")
    say(f"received {ids(batch)} (attempt 1 each)")
    first, second, third = batch

    check(client.ack(DOMAIN, first.token).state == "acked", "order-1 was not acked")
    say("order-1: acked")
    backoff_2 = nack_for_retry(client, second)
    nack_for_retry(client, third)
    nacked_at = time.monotonic()
    say(f"order-2, order-3: nacked on attempt 1, retry in {backoff_2 * 1000:.0f} ms")
    early = client.receive(DOMAIN, QUEUE, max_messages=10).deliveries
    check(not early, f"{ids(early)} delivered before the backoff")
    say("receive at once: nothing ready (both wait out their backoff)")

    again = client.receive(DOMAIN, QUEUE, max_messages=10, wait_ms=WAIT_MS).deliveries
    if len(again) == 1:  # the two retries came due on either side of a tick
        again += client.receive(DOMAIN, QUEUE, max_messages=10, wait_ms=WAIT_MS).deliveries
    waited = time.monotonic() - nacked_at
    check([d.message_id for d in again] == ["order-2", "order-3"], f"after the backoff received {ids(again)}")
    check(all(d.attempts == 2 for d in again), "a retry is not attempt 2")
    second, third = again
    check(client.ack(DOMAIN, second.token).state == "acked", "order-2 was not acked")
    say(f"order-2: back after {waited:.2f} s as attempt 2, acked")

    backoff = nack_for_retry(client, third)
    say(f"order-3: back as attempt 2, nacked again, retry in {backoff * 1000:.0f} ms")
    third, waited = receive_one(client, "order-3")
    check(third.attempts == MAX_ATTEMPTS, f"order-3 came back as attempt {third.attempts}")
    result = client.nack(DOMAIN, third.token)
    check(result.state == "dead_lettered", f"order-3 after its last attempt is {result.state}")
    say(f"order-3: back after {waited:.2f} s as attempt {MAX_ATTEMPTS} of {MAX_ATTEMPTS}, nacked: dead-lettered")

    dead = only(client.list_dead_letters(DOMAIN, QUEUE).messages, "dead letters")
    check(dead.message_id == "order-3", f"{dead.message_id} is dead-lettered, not order-3")
    say(f"dead letters of '{QUEUE}': {dead.message_id} ({dead.meta.attempts} attempts)")
    redriven = client.redrive(DOMAIN, dead)
    check(redriven.meta.state == "ready" and redriven.meta.attempts == 0, f"redriven order-3 is {redriven.meta.state}")
    check(not client.list_dead_letters(DOMAIN, QUEUE).messages, "the dead letters are not empty after the redrive")
    say("order-3: redriven, ready again with fresh attempts")
    third, _ = receive_one(client, "order-3")
    check(third.attempts == 1, f"redriven order-3 came back as attempt {third.attempts}")
    check(client.ack(DOMAIN, third.token).state == "acked", "order-3 was not acked")
    say("order-3: received as attempt 1, acked")

    counters = client.inspect_queue(DOMAIN, QUEUE).counters
    busy = counters.ready + counters.scheduled + counters.leased + counters.dead_lettered
    check(counters.acked_total == 3 and busy == 0, "the queue is not drained")
    say(f"queue '{QUEUE}': {counters.acked_total} acked, nothing ready, leased, retrying or dead")


def topic_part(client: Client) -> None:
    say("== a topic read by two subscription groups")
    client.create_topic(DOMAIN, TOPIC)
    for group in GROUPS:
        client.create_group(DOMAIN, TOPIC, group)
    say(f"created topic '{TOPIC}' with groups '{GROUPS[0]}' and '{GROUPS[1]}'")
    events = [Event("evt-1", "order.placed", b'{"order": 1}'), Event("evt-2", "order.paid", b'{"order": 1}')]
    published = client.publish(DOMAIN, TOPIC, events, command_id="publish-evt-1-2").events
    say("published " + ", ".join(f"{e.event_id} (position {e.position})" for e in published))
    tail = published[-1].position

    for group, note in zip(GROUPS, ("", "still "), strict=True):
        status = client.group_status(DOMAIN, TOPIC, group)
        check(status.lag == len(events), f"{group} is {status.lag} behind, not {len(events)}")
        got = client.group_receive(DOMAIN, TOPIC, group, max_events=10, wait_ms=WAIT_MS).deliveries
        check([d.event_id for d in got] == ["evt-1", "evt-2"], f"{group} received {[d.event_id for d in got]}")
        checkpoint = 0
        for delivery in got:
            acked = client.group_ack(DOMAIN, TOPIC, group, delivery.token)
            check(acked.state == "acked", f"{group}: {delivery.event_id} was not acked")
            checkpoint = acked.checkpoint
        check(checkpoint == tail, f"{group}'s checkpoint is {checkpoint}, not {tail}")
        say(f"{group:<9} {note}{status.lag} behind, received evt-1, evt-2, acked both: group checkpoint {checkpoint}")
    for group in GROUPS:
        check(client.group_status(DOMAIN, TOPIC, group).lag == 0, f"{group} is behind after its acks")


def access_part(client: Client) -> None:
    say("== access control: every command is signed by a principal and checked against its grants")
    client.create_principal("packer", [Grant(capability=Capability.consume, domain=DOMAIN, resource=QUEUE)])
    with Client(client.data.root, principal="packer") as packer:
        check(packer.whoami().principal.grants[0].resource == QUEUE, "packer's grant is not the one given")
        try:
            packer.create_queue(DOMAIN, "returns")
        except PermissionDeniedError as refused:
            detail = refused.outcome.detail
        else:
            raise DemoFailed("packer created a queue without a resource_manage grant")
    say(f"'packer' (may consume {DOMAIN}/{QUEUE}) creating a queue: PermissionDenied, {detail}")


def keyload_cli(data: str, *args: str) -> None:
    """Run a keyload command over `data`, show it and its output; it must succeed."""
    say("$ keyload " + " ".join(args))
    command = [sys.executable, "-m", "keyload.cli", *args, "--data", data]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    sys.stdout.write(done.stdout)
    check(done.returncode == 0, f"`keyload {' '.join(args)}` exited {done.returncode}: {done.stderr.strip()}")
    if args[0] == "drill":
        check("PASS" in done.stdout and "FAIL" not in done.stdout, "the drill did not pass")


def checkpoint_part(data: str) -> None:
    say("== a checkpoint of the partition holding domain 'shop' (the second drill starts there)")
    keyload_cli(data, "checkpoint", "--domain", DOMAIN)


def drill_part(data: str) -> None:
    say("== recovery drills: replay the log, compare digests with the live state")
    keyload_cli(data, "drill", "--domain", DOMAIN, "--quiet")
    keyload_cli(data, "drill", "--domain", DOMAIN, "--from-checkpoint", "latest", "--quiet")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", required=True, help="a fresh data directory served by `keyload run`")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        with Client(args.data) as client:
            queue_part(client)
            say()
            checkpoint_part(args.data)
            say()
            topic_part(client)
            say()
            access_part(client)
        say()
        drill_part(args.data)
    except DemoFailed as failed:
        print(f"demo FAILED: {failed}", file=sys.stderr)
        return 1
    say(f"demo: all steps behaved as shown ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
