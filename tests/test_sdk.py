"""The SDK against a running `keyload run`, over the file log and over Kafka: long poll, multi-lane receive,
the consumer helper."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Unpack

import pytest

from keyload import Client, Credential, Lane
from keyload.credentials import contents
from keyload.errors import (
    ConflictError,
    HistoryUnavailableError,
    InvalidCommand,
    KeyloadError,
    NotFoundError,
    OutcomeTimeout,
    ResourceExhaustedError,
    RevisionConflictError,
    StaleLeaseError,
    TokenInvalidatedError,
    ValidationError,
)
from keyload.log.base import LogRecord, partition_for
from keyload.log.codec import REGISTRY
from keyload.sdk.consumer import ConsumeStats, ExactlyOnce, Handled, WorkOptions
from keyload.sdk.results import (
    Delivery,
    DomainUsage,
    EnqueueMessage,
    Event,
    GroupDelivery,
    GroupPolicySpec,
    Mutation,
    PutDocument,
    QueuePolicySpec,
    TopicPolicySpec,
)
from keyload.storage.datadir import DataDir, KafkaConfig

from .support import free_port, served_url, start_service, stop_service, wait_until

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Served:
    """A client of a running `keyload run`, that service's process, and how to connect another client
    the same way (over the same transport, as the same principal)."""

    client: Client
    service: subprocess.Popen[bytes]
    connect: Callable[..., Client]


def _serve(request: pytest.FixtureRequest, root: Path) -> Iterator[Served]:
    """`keyload run` over the file log or Kafka, its client local (appending to the log) or over HTTP."""
    if request.param == "kafka":
        bootstrap: str = request.getfixturevalue("kafka_bootstrap")
        DataDir.create(root, kafka=KafkaConfig(bootstrap, f"sdk-{uuid.uuid4().hex[:10]}"))
    service = start_service(root, "--tick-interval-ms", "50")
    if request.param == "http":
        credential = Credential.load(root / "credentials" / "keyload-admin.json")
        connect: Callable[..., Client] = partial(Client, served_url(root), credential=credential)
    else:
        connect = partial(Client, root)
    sdk = connect()
    try:
        yield Served(sdk, service, connect)
    finally:
        sdk.close()
        assert stop_service(service) == 0


@pytest.fixture(params=["file", "kafka", "http"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    yield from _serve(request, tmp_path / "data")


@pytest.fixture(params=["file", "kafka"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """For tests that read the command log themselves: a local client only."""
    yield from _serve(request, tmp_path / "data")


@pytest.fixture
def client(served: Served) -> Client:
    return served.client


def test_an_idle_long_poll_appends_one_command_and_an_enqueue_completes_it(local: Served) -> None:
    client = local.client
    client.create_queue("shop", "jobs")
    log = client.data.command_log()
    partition = partition_for("shop", client.data.partitions)
    before = log.end_offset(partition)
    # Nothing arrives: the receive waits out its 20 s in the log, as one command.
    started = time.monotonic()
    assert client.receive("shop", "jobs", wait_ms=20_000).deliveries == []
    assert time.monotonic() - started >= 19.9
    ticks = sum(1 for r in log.read(partition, before, 1_000) if b"keyload-ticker" in r.value)
    assert log.end_offset(partition) - before - ticks == 1
    # A message enqueued during a wait completes it at once.
    producer = local.connect()
    timer = threading.Timer(0.3, lambda: producer.enqueue("shop", "jobs", b"hi", message_id="m1"))
    timer.start()
    result = client.receive("shop", "jobs", wait_ms=20_000)
    timer.join()
    producer.close()
    assert [d.message_id for d in result.deliveries] == ["m1"]  # at the deadline it would have been empty


def test_a_closed_client_and_a_helper_option_out_of_range_raise_keyload_errors(served: Served) -> None:
    """Everything the SDK raises derives from KeyloadError, on every transport: nothing was sent."""
    with pytest.raises(InvalidCommand, match=r"concurrency must be 1\.\.100"):
        served.client.consume("d", "q", lambda delivery: None, concurrency=0)
    closed = served.connect()
    closed.close()
    with pytest.raises(KeyloadError, match="closed"):
        closed.inspect_queue("d", "q")
    # Values no command can hold (one JSON cannot carry, over HTTP) and an id that is no string are
    # the InvalidCommand a wrong type is, never a TypeError from under the SDK.
    client = served.client
    client.create_queue("d", "q")
    client.enqueue("d", "q", b"x", message_id="m")
    [delivery] = client.receive("d", "q").deliveries
    for wrong in (
        lambda: client.ack("d", delivery),  # type: ignore[arg-type]  # the delivery, not its token
        lambda: client.ack("d", delivery.token.encode()),  # type: ignore[arg-type]
        lambda: client.enqueue("d", "q", b"x", not_before_ms=float("nan")),  # type: ignore[arg-type]
        lambda: client.enqueue("d", "q", b"x", command_id=5),  # type: ignore[arg-type]
        lambda: client.batch("d", [1, 2]),  # type: ignore[list-item]  # no mutations
    ):
        with pytest.raises(InvalidCommand, match=r"nothing was (sent|appended)|command id must be"):
            wrong()
    client.ack("d", delivery.token)  # nothing of them was applied: the lease is still held


def test_receive_across_reports_each_lane_and_a_retry_returns_the_same_receipts(client: Client) -> None:
    client.create_queue("shop", "a")
    client.create_queue("shop", "b")
    client.enqueue("shop", "a", b"1", message_id="a1")
    client.enqueue("shop", "b", b"2", message_id="b1")
    lanes = [Lane("shop", "a"), Lane("shop", "missing"), Lane("shop", "b")]
    first = client.receive_across(lanes, request_id="req-1")
    assert [o.status for o in first] == ["committed", "rejected", "committed"]
    assert [o.command_id for o in first] == ["req-1.0", "req-1.1", "req-1.2"]
    assert first[1].error is not None and first[1].error.code == "NotFound"
    again = client.receive_across(lanes, request_id="req-1")
    assert [o.result for o in again] == [o.result for o in first]  # the original deliveries and tokens
    late = client.receive_across(lanes, request_id="req-2", timeout_s=0)
    assert [o.status for o in late] == ["not_attempted"] * 3
    with pytest.raises(InvalidCommand, match=r"^each lane is a keyload\.Lane"):
        client.receive_across([("shop", "a")], request_id="req-3")  # type: ignore[list-item]


def test_a_domain_lists_its_queues_and_topics_on_every_transport(client: Client) -> None:
    for queue in ("orders", "orders-eu", "payments"):
        client.create_queue("shop", queue)
    client.create_topic("shop", "events")
    first = client.list_queues("shop", "orders", max_queues=1)
    assert ([q.queue for q in first.queues], first.next_after) == (["orders"], "orders")
    rest = client.list_queues("shop", "orders", after=first.next_after)
    assert ([q.queue for q in rest.queues], rest.next_after) == (["orders-eu"], None)
    assert [q.queue for q in client.list_queues("shop").queues] == ["orders", "orders-eu", "payments"]
    assert client.list_queues("shop").queues[0] == client.inspect_queue("shop", "orders")
    assert [t.topic for t in client.list_topics("shop").topics] == ["events"]
    with pytest.raises(ValidationError):
        client.list_topics("shop", max_topics=0)


def test_a_purge_empties_a_queue_on_every_transport(client: Client) -> None:
    created = client.create_queue("shop", "jobs", QueuePolicySpec(max_attempts=2))
    for i in range(3):
        client.enqueue("shop", "jobs", b"job", message_id=f"m{i}")
    [delivery] = client.receive("shop", "jobs", max_messages=1).deliveries
    purged = client.purge_queue("shop", "jobs", expected_incarnation=created.incarnation)
    assert (purged.counters.stored_messages, purged.policy.max_attempts) == (0, 2)
    assert purged.incarnation != created.incarnation and client.list_queues("shop").queues == [purged]
    with pytest.raises(TokenInvalidatedError):
        client.ack("shop", delivery.token)
    with pytest.raises(RevisionConflictError):
        client.purge_queue("shop", "jobs", expected_incarnation=created.incarnation)


def test_a_lane_without_an_outcome_is_unknown(tmp_path: Path) -> None:
    # No service runs: the command is appended but nobody applies it.
    DataDir.create(tmp_path / "data")
    client = Client(tmp_path / "data")
    try:
        [lane] = client.receive_across([Lane("shop", "q")], request_id="r", timeout_s=0.3)
        assert lane.status == "unknown"
        with pytest.raises(OutcomeTimeout) as caught:
            client.submit("shop", "keyload.command.InspectQueue", {"queue": "q"}, "direct", 0.2)
        assert caught.value.command_id == "direct"  # what to resubmit with
    finally:
        client.close()


def consume_until_settled(
    served: Served, queue: str, handler: Callable[[Delivery], Handled], settled: int, **options: Unpack[WorkOptions]
) -> ConsumeStats:
    """Run the consumer helper (its own Client, a thread) until `settled` messages of `queue` are
    acked or dead-lettered (at most 60 s), then stop it; its stats."""
    client = served.client
    stop = options["stop"] = threading.Event()
    consumer = served.connect()
    results: list[ConsumeStats] = []
    thread = threading.Thread(
        target=lambda: results.append(consumer.consume("shop", queue, handler, wait_ms=500, **options))
    )
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counters = client.inspect_queue("shop", queue).counters
        if counters.acked_total + counters.dead_lettered == settled:
            break
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    consumer.close()
    [stats] = results
    return stats


def test_consumer_helper_acks_nacks_and_renews(served: Served) -> None:
    client = served.client
    client.create_queue(
        "shop", "jobs", QueuePolicySpec(max_attempts=2, retry_base_ms=10, retry_max_ms=10, lease_ms=6_000)
    )
    for i in range(40):
        client.enqueue("shop", "jobs", str(i).encode(), message_id=f"m{i}")
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def handler(delivery: Delivery) -> None:
        with lock:
            seen[delivery.message_id] = seen.get(delivery.message_id, 0) + 1
        if delivery.message_id == "slow":
            # Longer than the 6 s lease: the helper must renew it (every 2 s). A renewal may take up to
            # 4 s to land, which a broker on a loaded machine needs now and then (a 3 s lease, renewed
            # every second, was lost once in a CI run).
            time.sleep(7)
        if int(delivery.message_id[1:] if delivery.message_id != "slow" else 0) % 10 == 3:
            raise RuntimeError("handler failure")

    client.enqueue("shop", "jobs", b"slow", message_id="slow")
    stats = consume_until_settled(served, "jobs", handler, 41, concurrency=4, lease_ms=6_000)
    counters = client.inspect_queue("shop", "jobs").counters
    assert (counters.acked_total, counters.dead_lettered) == (37, 4)  # m3, m13, m23, m33 fail twice
    assert seen["slow"] == 1 and stats.lost_leases == 0  # renewed, never redelivered
    assert all(seen[f"m{i}"] == (2 if i % 10 == 3 else 1) for i in range(40))
    assert (stats.acked, stats.nacked) == (37, 8)


@pytest.fixture(params=["http"])
def over_http(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    yield from _serve(request, tmp_path / "data")


def test_the_consumer_helper_rides_out_a_queue_pause(over_http: Served) -> None:
    """Paused while a handler runs, the helper's receives are refused with DispatchPaused: it keeps
    settling, then waits in the log; the resume's messages are delivered to it."""
    client = over_http.client
    client.create_queue("shop", "jobs")
    client.enqueue("shop", "jobs", b"first", message_id="m0")
    started, release = threading.Event(), threading.Event()

    def handler(delivery: Delivery) -> None:
        if delivery.message_id == "m0":
            started.set()
            release.wait(30)

    stop = threading.Event()
    consumer = over_http.connect()
    results: list[ConsumeStats] = []
    thread = threading.Thread(
        target=lambda: results.append(consumer.consume("shop", "jobs", handler, wait_ms=500, stop=stop))
    )
    thread.start()
    try:
        assert started.wait(30)
        assert client.pause_queue("shop", "jobs").paused
        for i in range(1, 4):
            client.enqueue("shop", "jobs", b"later", message_id=f"m{i}")
        time.sleep(0.5)  # the helper receives while its handler runs: refused, not fatal
        release.set()
        wait_until(lambda: client.inspect_queue("shop", "jobs").counters.acked_total == 1, what="m0 acked")
        time.sleep(1.0)  # paused: nothing more is delivered
        counters = client.inspect_queue("shop", "jobs").counters
        assert (counters.ready, counters.leased, counters.acked_total) == (3, 0, 1)
        assert thread.is_alive()
        client.resume_queue("shop", "jobs")
        wait_until(lambda: client.inspect_queue("shop", "jobs").counters.acked_total == 4, what="all acked")
    finally:
        release.set()
        stop.set()
        thread.join(30)
        consumer.close()
    [stats] = results
    assert (stats.received, stats.acked) == (4, 4)


def test_the_consumer_helper_asks_no_more_than_the_queue_takes_at_once(over_http: Served) -> None:
    """§10: more free handlers than the queue's receive_max_messages: its receives are refused, so the
    helper asks for half as many until one is taken; a refusal of a receive for one is raised, after
    what ran was settled."""
    client = over_http.client
    client.create_queue("shop", "narrow", QueuePolicySpec(receive_max_messages=3))
    for i in range(20):
        client.enqueue("shop", "narrow", b"x", message_id=f"m{i}")
    stats = consume_until_settled(over_http, "narrow", lambda delivery: None, 20, concurrency=16)
    assert (stats.received, stats.acked) == (20, 20)
    client.create_queue("shop", "short", QueuePolicySpec(lease_ms=1_000, max_lease_ms=2_000))
    client.enqueue("shop", "short", b"x", message_id="m0")
    with over_http.connect() as consumer, pytest.raises(ValidationError, match="lease_ms"):
        consumer.consume("shop", "short", lambda delivery: None, wait_ms=500, lease_ms=30_000)
    assert client.inspect_queue("shop", "short").counters.ready == 1


def test_the_consumer_helper_takes_and_renews_the_sources_own_lease(served: Served) -> None:
    """§10: without `lease_ms` the helper leases for the queue's (the group's) own `lease_ms`, here
    under the 30 s an earlier default asked for and over their max_lease_ms, and renews a delivery
    whose handler outlives it, timed by the expiry the answers state: each is delivered once."""
    client = served.client
    client.create_queue("shop", "short", QueuePolicySpec(lease_ms=1_500, max_lease_ms=2_000))
    client.create_topic("shop", "events")
    client.create_group("shop", "events", "short", policy=GroupPolicySpec(lease_ms=1_500, max_lease_ms=2_000))
    client.enqueue("shop", "short", b"slow", message_id="m0")
    client.publish("shop", "events", [Event("e0", "slow", b"slow")])
    seen: list[str] = []

    def slow(delivery: Delivery | GroupDelivery) -> None:
        seen.append(delivery.message_id if isinstance(delivery, Delivery) else delivery.event_id)
        time.sleep(4)  # over two leases: renewed about every half second

    stats = consume_until_settled(served, "short", slow, 1)
    assert (stats.received, stats.acked, stats.lost_leases) == (1, 1, 0)
    assert client.inspect_queue("shop", "short").counters.expired_total == 0
    stop = threading.Event()
    with served.connect() as consumer:
        thread = threading.Thread(
            target=consumer.subscribe, args=("shop", "events", "short", slow), kwargs={"stop": stop}
        )
        thread.start()
        wait_until(lambda: client.group_status("shop", "events", "short").acked_total == 1, what="the event acked")
        stop.set()
        thread.join(30)
    group = client.group_status("shop", "events", "short")
    assert (group.delivered_total, group.checkpoint, seen) == (1, 1, ["m0", "e0"])


def test_a_handler_that_breaks_the_contract_fails_its_delivery_not_the_helper(over_http: Served) -> None:
    """§10: an exactly-once handler's effects that are no mutations nack the delivery (dead-lettered at
    max_attempts 1) while the others complete; a coroutine function given to Client is refused at once."""
    client = over_http.client
    client.create_queue("shop", "effects", QueuePolicySpec(max_attempts=1))
    for i in range(6):
        client.enqueue("shop", "effects", b"x", message_id=f"m{i}")

    def handler(delivery: Delivery) -> Handled:
        if delivery.message_id == "m3":
            return ["not a mutation"]  # type: ignore[list-item]
        return [PutDocument(key=f"done-{delivery.message_id}", value=b"1")]

    stats = consume_until_settled(over_http, "effects", handler, 6, exactly_once=ExactlyOnce("effects"))
    counters = client.inspect_queue("shop", "effects").counters
    assert (counters.acked_total, counters.dead_lettered, stats.acked, stats.nacked) == (5, 1, 5, 1)

    async def coroutine(delivery: Delivery) -> None:
        return None

    with pytest.raises(InvalidCommand, match="coroutine function"):
        client.consume("shop", "effects", coroutine)  # type: ignore[arg-type]


def test_an_idle_subscriber_waits_in_the_log_and_a_publish_wakes_it(local: Served) -> None:
    client = local.client
    """Idle, a subscriber appends one GroupReceive per wait, each after the previous one expired
    in log time (it waits in the log, it does not poll); a publish that lands while a receive
    waits is delivered by that very receive. Asserted on log order and log time, so a loaded
    machine makes the test slower, never wrong."""
    wait_ms = 1_000
    client.create_topic("shop", "events")
    client.create_group("shop", "events", "g")
    log = client.data.command_log()
    partition = partition_for("shop", client.data.partitions)
    before = log.end_offset(partition)

    def records_after(offset: int, kind: str) -> list[LogRecord]:
        records = log.read(partition, offset + 1, 10_000)
        wanted = f"keyload.command.{kind}"
        return [r for r in records if REGISTRY.decode("keyload.Command", contents(r.value))["body"][0] == wanted]

    def next_receive(after: int) -> LogRecord:
        wait_until(lambda: records_after(after, "GroupReceive"), timeout_s=60, what="a GroupReceive")
        return records_after(after, "GroupReceive")[-1]

    delivered, stop = threading.Event(), threading.Event()
    release = threading.Semaphore(0)
    received: list[str] = []

    def handle(delivery: GroupDelivery) -> None:
        received.append(delivery.event_id)
        delivered.set()
        release.acquire(timeout=60)  # holds the only handler slot: no receive is appended meanwhile

    subscriber = threading.Thread(
        target=lambda: local.connect().subscribe(
            "shop", "events", "g", handle, wait_ms=wait_ms, concurrency=1, stop=stop
        )
    )
    subscriber.start()
    publisher = local.connect()
    try:
        wait_until(lambda: len(records_after(before - 1, "GroupReceive")) >= 3, timeout_s=60, what="3 receives")
        idle = records_after(before - 1, "GroupReceive")
        assert all(b.timestamp_ms - a.timestamp_ms >= wait_ms for a, b in pairwise(idle))
        seen = idle[-1].offset
        for attempt in range(10):
            waiting = next_receive(seen)
            publisher.publish("shop", "events", [Event(f"e{attempt}", "t", b"hi")])
            assert delivered.wait(timeout=60)
            [published] = records_after(waiting.offset, "Publish")
            in_time = published.timestamp_ms < waiting.timestamp_ms + wait_ms  # the receive still waited
            receives_since = records_after(waiting.offset, "GroupReceive")
            seen = receives_since[-1].offset if receives_since else waiting.offset
            delivered.clear()
            release.release()
            if in_time:
                assert received[-1] == f"e{attempt}" and not receives_since  # served by the waiting receive
                break
            # This machine stalled for a whole wait before the publish landed: try again.
        else:
            pytest.fail("no publish landed within a wait of the receive before it")
    finally:
        release.release()
        stop.set()
        subscriber.join(timeout=30)
        publisher.close()
    assert not subscriber.is_alive()


def test_operator_moves_are_fenced_by_the_view_they_were_decided_on(client: Client) -> None:
    """redrive, park_pending and cancel take a MessageView and send what it shows as the fence: a
    view the message has moved on from is refused (RevisionConflict) and changes nothing."""
    client.create_queue("shop", "jobs", QueuePolicySpec(max_attempts=1, max_dead_letter_messages=1))
    client.enqueue("shop", "jobs", b"a", message_id="m1")
    client.enqueue("shop", "jobs", b"b", message_id="m2")
    for delivery in client.receive("shop", "jobs", max_messages=2).deliveries:
        assert client.nack("shop", delivery.token).state in ("dead_lettered", "pending_dead_letter")
    [dead] = client.list_dead_letters("shop", "jobs").messages
    pending = client.inspect_message("shop", "jobs", "m2")
    assert (dead.message_id, dead.meta.state, pending.meta.state) == ("m1", "dead_lettered", "pending_dead_letter")

    redriven = client.redrive("shop", dead)
    assert (redriven.meta.state, redriven.meta.attempts) == ("ready", 0)
    with pytest.raises(RevisionConflictError):
        client.redrive("shop", dead)
    with pytest.raises(RevisionConflictError):
        client.cancel("shop", dead)
    assert client.inspect_message("shop", "jobs", "m1").meta == redriven.meta

    assert client.park_pending("shop", pending).meta.state == "dead_lettered"
    cancelled = client.cancel("shop", client.inspect_message("shop", "jobs", "m1"))
    assert cancelled.meta.state == "cancelled"
    counters = client.inspect_queue("shop", "jobs").counters
    assert (counters.dead_lettered, counters.pending_dead_letter, counters.cancelled_total) == (1, 0, 1)


def test_a_topic_policy_changes_by_compare_and_set_and_old_events_age_out(client: Client) -> None:
    """configure_topic is fenced by the policy version; the service's ticker then drives the age
    limit, and under discard old a publish at the cap pushes the oldest event out."""
    client.create_topic("shop", "events")
    client.publish("shop", "events", [Event(f"e{i}", "t", b"x") for i in range(3)])
    policy = TopicPolicySpec(max_age_ms=1_000, max_retained_events=3, discard="old")
    assert client.configure_topic("shop", "events", policy, expected_policy_version=1).policy_version == 2
    with pytest.raises(RevisionConflictError):
        client.configure_topic("shop", "events", TopicPolicySpec(), expected_policy_version=1)
    client.publish("shop", "events", [Event("e3", "t", b"x")])
    assert client.inspect_topic("shop", "events").first_available == 2  # e0 made room for e3
    wait_until(lambda: client.inspect_topic("shop", "events").retained_events == 0, what="events aged out")
    view = client.inspect_topic("shop", "events")
    assert (view.first_available, view.tail) == (5, 4)


def test_a_domain_holds_at_most_its_caps(client: Client) -> None:
    """keyload run raises the partitions to level 5: once the partition's usage count is done, a
    create past a domain's cap is ResourceExhausted, and a delete gives its room back."""
    wait_until(lambda: _usage(client).counted, what="the usage count done")
    view = client.configure_domain_caps("shop", max_topics=1, max_documents=1)
    assert (view.max_topics, view.max_documents, view.max_queues) == (1, 1, 10_000)
    client.create_topic("shop", "events")
    with pytest.raises(ResourceExhaustedError, match=r"over its cap \(max_topics 1\)"):
        client.create_topic("shop", "audit")
    client.put_document("shop", "a", b"x")
    with pytest.raises(ResourceExhaustedError):
        client.put_document("shop", "b", b"x")
    client.delete_topic("shop", "events")
    client.create_topic("shop", "audit")
    usage = _usage(client)
    assert (usage.topics, usage.documents, usage.document_bytes) == (1, 1, 1)


def _usage(client: Client) -> DomainUsage:
    usage = client.inspect_domain("shop").usage
    assert usage is not None
    return usage


def test_a_command_id_is_answered_within_the_domains_horizons(client: Client) -> None:
    """keyload run raises the partitions to level 2: a domain's outcome horizon bounds the repeats
    that get the stored outcome, the receipt horizon those refused as HistoryUnavailable; after it
    the id is new. The service's ticker drives the sweep."""
    view = client.configure_domain("shop", outcome_horizon_ms=1_000, receipt_horizon_ms=2_000)
    assert (view.outcome_horizon_ms, view.receipt_horizon_ms, view.policy_version) == (1_000, 2_000, 1)
    assert client.inspect_domain("shop") == view
    with pytest.raises(RevisionConflictError):
        client.configure_domain("shop", expected_policy_version=0)
    client.create_queue("shop", "jobs")
    first = client.enqueue("shop", "jobs", b"x", message_id="m1", command_id="send-1")
    assert client.enqueue("shop", "jobs", b"x", message_id="m1", command_id="send-1") == first

    def refused() -> bool:
        try:
            client.enqueue("shop", "jobs", b"x", message_id="m1", command_id="send-1")
        except HistoryUnavailableError as error:
            return "(committed); its outcome is past the domain's outcome horizon" in str(error)
        return False

    wait_until(refused, what="the outcome past its horizon")
    wait_until(
        lambda: client.inspect_queue("shop", "jobs").counters.stored_messages == 1 and _applies_anew(client),
        what="the command id new again",
    )


def test_a_finished_message_id_is_taken_until_the_receipt_horizon(client: Client) -> None:
    """keyload run raises the partitions to level 4: an acked message keeps its history for the
    domain's outcome horizon and its id until the receipt horizon; then the id is new, and the first
    message's token never settles the second's lease. The service's ticker drives the sweep."""
    client.configure_domain("shop", outcome_horizon_ms=1_000, receipt_horizon_ms=2_000)
    client.create_queue("shop", "jobs")
    client.enqueue("shop", "jobs", b"x", message_id="m1")
    [first] = client.receive("shop", "jobs").deliveries
    client.ack("shop", first.token)
    assert client.inspect_message("shop", "jobs", "m1").meta.state == "acked"

    def history_gone() -> bool:
        try:
            client.inspect_message("shop", "jobs", "m1")
        except HistoryUnavailableError as error:
            return "its history is past the domain's outcome horizon" in str(error)
        return False

    def enqueued_again() -> bool:
        try:
            client.enqueue("shop", "jobs", b"y", message_id="m1")
        except ConflictError:
            return False
        return True

    wait_until(history_gone, what="the message's history past its horizon")
    wait_until(enqueued_again, what="the message id new again")
    [second] = client.receive("shop", "jobs").deliveries
    assert (second.message_id, second.body, second.delivery_generation) == ("m1", b"y", first.delivery_generation)
    with pytest.raises(StaleLeaseError):
        client.ack("shop", first.token)
    assert client.ack("shop", second.token).state == "acked"


def _applies_anew(client: Client) -> bool:
    """Whether the id `send-1` is new: another enqueue under it applies (with a new message id)."""
    try:
        client.enqueue("shop", "jobs", b"y", message_id="m2", command_id="send-1")
    except (HistoryUnavailableError, ConflictError):
        return False
    return client.inspect_queue("shop", "jobs").counters.stored_messages == 2


def test_topics_and_groups_are_closed_and_deleted_with_their_guards(client: Client) -> None:
    client.create_topic("shop", "events")
    client.publish("shop", "events", [Event("e0", "t", b"x")])
    client.create_group("shop", "events", "g")
    [delivery] = client.group_receive("shop", "events", "g").deliveries
    assert client.close_topic("shop", "events").closed
    with pytest.raises(ConflictError):
        client.publish("shop", "events", [Event("e1", "t", b"x")])
    with pytest.raises(ConflictError):
        client.delete_group("shop", "events", "g")  # its delivery is outstanding
    with pytest.raises(ConflictError):
        client.delete_topic("shop", "events")  # g has not completed position 1
    incarnation = client.group_status("shop", "events", "g").incarnation
    deleted = client.delete_group("shop", "events", "g", force=True, expected_incarnation=incarnation)
    assert deleted.outstanding == 1
    with pytest.raises(NotFoundError):
        client.group_ack("shop", "events", "g", delivery.token)
    assert client.delete_topic("shop", "events").tail == 1
    with pytest.raises(NotFoundError):
        client.inspect_topic("shop", "events")


def test_exactly_once_consumer_commits_effects_with_the_ack(served: Served) -> None:
    client = served.client
    client.create_queue("shop", "orders", QueuePolicySpec(max_attempts=3, retry_base_ms=10, retry_max_ms=10))
    client.create_queue("shop", "shipments")
    client.put_document("shop", "order/o7", b"taken", expected_revision=0)  # o7's effect will conflict
    for i in range(20):
        client.enqueue("shop", "orders", f"order {i}".encode(), message_id=f"o{i}")

    def handle(delivery: Delivery) -> list[Mutation]:
        order = delivery.message_id
        return [
            PutDocument(f"order/{order}", delivery.body, expected_revision=0),
            EnqueueMessage("shipments", f"ship-{order}", delivery.body),
        ]

    stats = consume_until_settled(served, "orders", handle, 20, exactly_once=ExactlyOnce("order-service"))
    orders = client.inspect_queue("shop", "orders").counters
    assert (orders.acked_total, orders.dead_lettered) == (19, 1)  # o7: RevisionConflict on every attempt
    assert (stats.acked, stats.nacked, stats.already_processed) == (19, 3, 0)
    assert client.inspect_queue("shop", "shipments").counters.stored_messages == 19
    page = client.list_documents("shop", "order/", max_documents=100)
    assert len(page.documents) == 20 and client.get_document("shop", "order/o7").value == b"taken"
    assert {d.revision for d in page.documents} == {1}


def test_the_consumer_helper_over_http_rides_out_a_server_killed_and_started_again(tmp_path: Path) -> None:
    """A server away (kill -9, then `keyload run` again on its port) is an unknown outcome to the
    helper, as a timeout is: counted and tried again, never raised; every job ends acked."""
    root = tmp_path / "data"
    listen = ("--listen", f"127.0.0.1:{free_port()}", "--tick-interval-ms", "50")
    services = [start_service(root, *listen)]
    url = served_url(root)
    client = Client(url, credential=Credential.load(root / "credentials" / "keyload-admin.json"), timeout_s=5)
    client.create_queue("shop", "jobs", QueuePolicySpec(lease_ms=3_000))
    for i in range(30):
        client.enqueue("shop", "jobs", b"job", message_id=f"m{i}")
    handled: list[str] = []

    def handler(delivery: Delivery) -> None:
        handled.append(delivery.message_id)
        if len(handled) == 10 and len(services) == 1:
            services[0].kill()
            services[0].wait()
            time.sleep(1.0)  # the helper meets the server away meanwhile
            services.append(start_service(root, *listen))

    stop = threading.Event()
    results: list[ConsumeStats] = []
    thread = threading.Thread(target=lambda: results.append(client.consume("shop", "jobs", handler, stop=stop)))
    thread.start()
    try:
        wait_until(lambda: len(services) == 2, 60, "the server started again")
        wait_until(lambda: client.inspect_queue("shop", "jobs").counters.acked_total == 30, 90, "every job acked")
    finally:
        stop.set()
        thread.join(60)
        client.close()
        assert stop_service(services[-1]) == 0
    [stats] = results  # the helper returned: nothing was raised
    assert stats.unknown_outcomes >= 1
    assert set(handled) == {f"m{i}" for i in range(30)}


def test_the_consumer_helper_rides_out_a_processor_pause_longer_than_its_timeout(served: Served) -> None:
    client, service = served.client, served.service
    client.create_queue("shop", "jobs", QueuePolicySpec(lease_ms=60_000))
    for i in range(30):
        client.enqueue("shop", "jobs", b"job", message_id=f"m{i}")
    handled: list[str] = []
    paused = threading.Event()

    def handler(delivery: Delivery) -> None:
        handled.append(delivery.message_id)
        if len(handled) == 10 and not paused.is_set():
            paused.set()
            os.kill(service.pid, signal.SIGSTOP)  # the processor stops answering: outcomes time out
            threading.Timer(3.0, os.kill, (service.pid, signal.SIGCONT)).start()

    stop = threading.Event()
    consumer = served.connect(timeout_s=1.0)
    results: list[ConsumeStats] = []
    thread = threading.Thread(
        target=lambda: results.append(consumer.consume("shop", "jobs", handler, wait_ms=500, stop=stop))
    )
    thread.start()
    wait_until(lambda: client.inspect_queue("shop", "jobs").counters.acked_total == 30, 60, "every job acked")
    stop.set()
    thread.join(30)
    consumer.close()
    [stats] = results
    counters = client.inspect_queue("shop", "jobs").counters
    assert (counters.acked_total, counters.stored_messages) == (30, 0)
    assert stats.unknown_outcomes >= 1 and stats.acked + stats.lost_leases >= 30
    assert set(handled) == {f"m{i}" for i in range(30)}
