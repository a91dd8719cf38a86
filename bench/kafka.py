"""End-to-end enqueue → outcome latency and throughput over a real Kafka broker, against raw confluent-kafka.

    python -m bench.kafka [--sequential N] [--pipelined M] [--clients C] [--body-bytes B] [--repeat R] [--json]

One broker on loopback: a native KRaft broker started in a temporary directory, or
the one at --bootstrap (or $KEYLOAD_KAFKA_BOOTSTRAP). Per repetition, fresh topics and:

(a) keyload sequential: one keyload.Client, N Enqueues one after another, each
            waiting for its outcome, served by a `keyload run` process.
(b) keyload pipelined: C threads, each with its own Client, M Enqueues in all.
(c) raw sequential: plain confluent-kafka on two fresh topics laid out and configured
            as keyload's commands and outcomes topics. The requester produces the same
            encoded command bytes to the commands topic and waits for a reply; a
            processor process (assigned consumer + producer) answers each record with
            keyload's outcome record for that command on the requester's reply
            partition. That is the round trip keyload's path contains: client produce
            → processor consume → processor produce → client consume.
(d) raw pipelined: (c) with C concurrent requesters.

Latency is per command, from the call until its outcome (reply) is in hand. Ratios
a/c and b/d compare keyload with the raw round trip in the same run on the same broker.
bench/README.md explains the columns.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import multiprocessing
import os
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any, Protocol

import confluent_kafka
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.broker import HEAP, KAFKA_VERSION, BrokerError, NativeBroker, native_broker_available
from keyload import Client, limits
from keyload.credentials import Credential, contents
from keyload.errors import KeyloadError
from keyload.log.base import LogError, partition_for
from keyload.log.codec import REGISTRY
from keyload.log.kafka_log import (
    DELIVERY_MARGIN_S,
    DELIVERY_TIMEOUT_MS,
    DRAIN_BATCH,
    FETCH_WAIT_MS,
    LINGER_MS,
    MAX_MESSAGE_BYTES,
    KafkaLog,
    KafkaSettings,
    ensure_topics,
)
from keyload.processors.policy import INTEGER_FIELDS
from keyload.sdk.results import QueuePolicySpec
from keyload.storage.datadir import DEFAULT_OUTCOME_PARTITIONS, DEFAULT_PARTITIONS, DataDir, KafkaConfig

from .common import (
    COMMAND,
    DOMAIN,
    OUTCOME,
    PRINCIPAL,
    QUEUE,
    SEED,
    BenchError,
    ServiceProcess,
    create_bench_principal,
    environment,
)

ENQUEUE = "keyload.command.Enqueue"
BOOTSTRAP_ENV = "KEYLOAD_KAFKA_BOOTSTRAP"

DEFAULT_SEQUENTIAL = 2_000
DEFAULT_PIPELINED = 10_000
DEFAULT_CLIENTS = 8
DEFAULT_BODY_BYTES = 1024
DEFAULT_WARMUP = 50  # untimed round trips before each phase (pipelined: shared by the clients, at least 1 each)

BROKER_START_S = 120.0  # a cold JVM on a busy 2-core machine
PROCESSOR_START_S = 60.0  # `keyload run` until it owns every partition of the commands topic
PROCESSOR_STOP_S = 30.0
REQUEST_TIMEOUT_S = 60.0  # one round trip, keyload's or raw: far beyond any latency measured, so only a hang fails
RAW_POLL_S = 0.1  # the raw processor's longest wait before it checks whether to stop
TOPIC_DELETE_S = 30.0

Samples = list[float]  # per-command latencies in seconds


# -- workload --------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which commands each phase sends: indices into ids/bodies, and the reply partition of each.

    Every phase of a repetition draws on one list of seeded ids and bodies, so (c) and
    (d) send the bytes keyload's client encoded for (a) and (b): the same commands,
    client_time_ms aside (a different value of the same encoded length).
    """

    ids: list[str]  # command id = message id, UUID4 as the SDK makes them
    bodies: list[bytes]
    reply_to: list[int]  # the requester's reply partition, per command
    sequential_warmup: list[int]
    sequential: list[int]
    pipelined_warmup: list[list[int]]  # per client
    pipelined: list[list[int]]  # per client, round-robin over the timed commands

    @property
    def commands(self) -> int:
        return len(self.ids)


def make_plan(sequential: int, pipelined: int, clients: int, warmup: int, body_bytes: int) -> Plan:
    rng = random.Random(SEED)
    ids: list[str] = []
    bodies: list[bytes] = []
    reply_to: list[int] = []

    def take(count: int, reply_partition: int) -> list[int]:
        first = len(ids)
        for _ in range(count):
            ids.append(str(uuid.UUID(int=rng.getrandbits(128), version=4)))
            bodies.append(rng.randbytes(body_bytes))
            reply_to.append(reply_partition)
        return list(range(first, len(ids)))

    sequential_warmup = take(warmup, 0)
    timed = take(sequential, 0)
    per_client_warmup = max(1, math.ceil(warmup / clients))
    pipelined_warmup = [take(per_client_warmup, client) for client in range(clients)]
    shares = [pipelined // clients + (client < pipelined % clients) for client in range(clients)]
    pipelined_timed = [take(share, client) for client, share in enumerate(shares)]
    return Plan(ids, bodies, reply_to, sequential_warmup, timed, pipelined_warmup, pipelined_timed)


# The raw reference's records are signed like the client's, by a key of the same size: the same bytes
# to move, and the raw processor never checks them.
RAW_SIGNER = Credential(PRINCIPAL, "p-0000000000000000", bytes(32))


def encode_enqueue(plan: Plan, index: int) -> bytes:
    """The signed Command exactly as Client.submit builds it for this Enqueue."""
    command_id = plan.ids[index]
    record: dict[str, Any] = {
        "queue": QUEUE,
        "message_id": command_id,
        "body": plan.bodies[index],
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }
    envelope = {
        "command_id": command_id,
        "domain": DOMAIN,
        "principal": PRINCIPAL,
        "body": (ENQUEUE, record),
        "reply_to": plan.reply_to[index],
        "client_time_ms": time.time_ns() // 1_000_000,
    }
    return RAW_SIGNER.sign(REGISTRY.encode(COMMAND, envelope))


# -- measuring -------------------------------------------------------------------------


class Requester(Protocol):
    """One side of a round trip: sends command `index` and returns once its outcome (reply) arrived."""

    def request(self, index: int) -> None: ...

    def close(self) -> None: ...


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU of a process, all its threads, from /proc (None where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    commands: int
    seconds: float  # wall clock of the timed loop(s)
    p50_s: float
    p99_s: float
    client_cpu_s: float  # the bench process: requesters, their librdkafka threads
    server_cpu_s: float | None  # the processor process (keyload run, or the raw processor)

    @property
    def rate(self) -> float:
        return self.commands / self.seconds if self.seconds > 0 else math.inf

    @property
    def p50_ms(self) -> float:
        return 1000 * self.p50_s

    @property
    def p99_ms(self) -> float:
        return 1000 * self.p99_s

    def cpu_us(self, seconds: float | None) -> float | None:
        return None if seconds is None else 1e6 * seconds / self.commands


def percentile(samples: Sequence[float], q: int) -> float:
    """Nearest-rank percentile: the smallest sample with at least q% of the samples at or below it."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class CpuWatch:
    """CPU of this process and of the processor over the timed part of a phase."""

    def __init__(self, server_pid: int) -> None:
        self.client = time.process_time()
        self.server = process_cpu_s(server_pid)

    def phase(
        self, key: str, label: str, seconds: float, samples: Samples, client_cpu: float, server_cpu: float | None
    ) -> Phase:
        server = None if server_cpu is None or self.server is None else server_cpu - self.server
        return Phase(
            key,
            label,
            len(samples),
            seconds,
            percentile(samples, 50),
            percentile(samples, 99),
            client_cpu - self.client,
            server,
        )


def run_sequential(key: str, label: str, requester: Requester, plan: Plan, server_pid: int) -> Phase:
    """Warm up, then time each command of plan.sequential one after another."""
    for index in plan.sequential_warmup:
        requester.request(index)
    samples: Samples = []
    clock = time.perf_counter
    cpu = CpuWatch(server_pid)
    start = clock()
    for index in plan.sequential:
        sent = clock()
        requester.request(index)
        samples.append(clock() - sent)
    seconds = clock() - start
    return cpu.phase(key, label, seconds, samples, time.process_time(), process_cpu_s(server_pid))


def run_pipelined(key: str, label: str, connect: Callable[[int], Requester], plan: Plan, server_pid: int) -> Phase:
    """One thread per client: connect and warm up untimed, then all start together on their share.

    The clients close only after every one has finished and the CPU is read.
    """
    clients = len(plan.pipelined)
    start_line, finish_line = threading.Barrier(clients + 1), threading.Barrier(clients + 1)
    samples: list[Samples] = [[] for _ in range(clients)]
    finished = [0.0] * clients
    failures: list[str] = []
    clock = time.perf_counter

    def work(client: int) -> None:
        requester: Requester | None = None
        try:
            requester = connect(client)
            for index in plan.pipelined_warmup[client]:
                requester.request(index)
            start_line.wait()
            mine = samples[client]
            for index in plan.pipelined[client]:
                sent = clock()
                requester.request(index)
                mine.append(clock() - sent)
            finished[client] = clock()
            finish_line.wait()
        except threading.BrokenBarrierError:
            pass  # another client failed first and said why
        except Exception as exc:
            failures.append(f"client {client}: {type(exc).__name__}: {exc}")
            start_line.abort()
            finish_line.abort()
        finally:
            if requester is not None:
                requester.close()

    threads = [
        threading.Thread(target=work, args=(client,), name=f"{key}-client-{client}") for client in range(clients)
    ]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a client failed: it says why below
        start_line.wait()
    cpu, start = CpuWatch(server_pid), clock()
    with contextlib.suppress(threading.BrokenBarrierError):
        finish_line.wait()
    client_cpu, server_cpu = time.process_time(), process_cpu_s(server_pid)
    for thread in threads:
        thread.join()
    if failures:
        raise BenchError(f"({key}) {failures[0]}")
    merged = [sample for client_samples in samples for sample in client_samples]
    return cpu.phase(key, label, max(finished) - start, merged, client_cpu, server_cpu)


# -- keyload ---------------------------------------------------------------------------


class KeyloadRequester:
    """Client.enqueue: encode, append (waits for acks=all), tail the reply partition for the outcome."""

    def __init__(self, root: Path, plan: Plan, reply_partition: int) -> None:
        self.plan = plan
        self.client = Client(root, principal=PRINCIPAL, timeout_s=REQUEST_TIMEOUT_S, reply_partition=reply_partition)

    def request(self, index: int) -> None:
        command_id = self.plan.ids[index]
        try:
            result = self.client.enqueue(
                DOMAIN, QUEUE, self.plan.bodies[index], message_id=command_id, command_id=command_id
            )
        except KeyloadError as exc:
            raise BenchError(f"enqueue {command_id}: {type(exc).__name__}: {exc}") from exc
        if result.message_id != command_id:
            raise BenchError(f"enqueue {command_id} answered for message {result.message_id}")

    def close(self) -> None:
        self.client.close()


class ProcessorService(ServiceProcess):
    """`keyload run --data ROOT` on Kafka as a child process, serving once it owns every partition."""

    def __init__(self, root: Path, partitions: int) -> None:
        super().__init__(["--data", str(root)], PROCESSOR_STOP_S)
        everything = set(range(partitions))
        self.wait_for(
            lambda: self.owned() == everything, PROCESSOR_START_S, f"did not come to own all {partitions} partitions"
        )

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for line in list(self.lines):
            if line.startswith("keyload: owns p"):
                owned.add(int(line.split()[2][1:]))
            elif line.startswith("keyload: released p"):
                owned.discard(int(line.split()[2][1:]))
        return owned


@dataclass(frozen=True)
class KeyloadRun:
    sequential: Phase
    pipelined: Phase
    outcomes: list[bytes]  # keyload's outcome record for each command of the plan: (c) and (d) reply with them
    enqueued_total: int
    stored_messages: int


def keyload_phases(root: Path, bootstrap: str, prefix: str, plan: Plan, body_bytes: int, clients: int) -> KeyloadRun:
    """(a) and (b) against one `keyload run`, then the checks: every outcome committed, the queue's counters."""
    data = DataDir.create(root, DEFAULT_PARTITIONS, outcome_partitions(clients), kafka=KafkaConfig(bootstrap, prefix))
    ensure_topics(data.kafka_settings())  # the service would, but the clients may open first
    service = ProcessorService(root, data.partitions)
    try:
        policy = QueuePolicySpec(max_stored_messages=plan.commands, max_stored_bytes=max(1, plan.commands * body_bytes))
        create_bench_principal(root)
        with Client(root, principal=PRINCIPAL, timeout_s=REQUEST_TIMEOUT_S, reply_partition=0) as client:
            client.create_queue(DOMAIN, QUEUE, policy)
        first = KeyloadRequester(root, plan, 0)
        try:
            sequential = run_sequential("a", "keyload, sequential", first, plan, service.pid)
        finally:
            first.close()
        pipelined = run_pipelined(
            "b", f"keyload, {clients} clients", lambda c: KeyloadRequester(root, plan, c), plan, service.pid
        )
        with Client(root, principal=PRINCIPAL, timeout_s=REQUEST_TIMEOUT_S, reply_partition=0) as client:
            counters = client.inspect_queue(DOMAIN, QUEUE).counters
    finally:
        status = service.stop()
    halted = [line for line in service.lines if "halted" in line]
    if status != 0 or halted:
        raise BenchError(f"`keyload run` exited with status {status}:\n{service.tail()}")
    if counters.enqueued_total != plan.commands or counters.stored_messages != plan.commands:
        raise BenchError(
            f"the queue counts {counters.enqueued_total} enqueued and {counters.stored_messages} stored "
            f"for {plan.commands} Enqueues"
        )
    return KeyloadRun(
        sequential, pipelined, read_outcomes(data, plan), counters.enqueued_total, counters.stored_messages
    )


def outcome_partitions(clients: int) -> int:
    """One reply partition per client, so that a client's partition holds its outcomes only."""
    return max(DEFAULT_OUTCOME_PARTITIONS, clients)


def read_outcomes(data: DataDir, plan: Plan) -> list[bytes]:
    """Every Enqueue's outcome from the outcomes topic, each checked committed (not timed)."""
    wanted = {command_id: index for index, command_id in enumerate(plan.ids)}
    found: list[bytes | None] = [None] * plan.commands
    log = KafkaLog.outcomes(data.kafka_settings())
    try:
        for partition in sorted(set(plan.reply_to)):
            offset, end = 0, log.end_offset(partition)
            while offset < end:
                for record in log.read(partition, offset, DRAIN_BATCH):
                    offset = record.offset + 1
                    outcome = REGISTRY.decode(OUTCOME, contents(record.value))
                    index = wanted.get(outcome["command_id"])
                    if index is None:
                        continue  # the CreateQueue and InspectQueue
                    if outcome["status"] != "committed":
                        raise BenchError(f"Enqueue {outcome['command_id']} was {outcome['status']}")
                    found[index] = record.value
    finally:
        log.close()
    missing = [plan.ids[index] for index, value in enumerate(found) if value is None]
    if missing:
        raise BenchError(f"{len(missing)} Enqueues have no outcome on the outcomes topic, {missing[0]} first")
    return [value for value in found if value is not None]


# -- raw reference ---------------------------------------------------------------------


def producer_config(bootstrap: str) -> dict[str, Any]:
    """KafkaLog's producer settings."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": LINGER_MS,
        "message.max.bytes": MAX_MESSAGE_BYTES,
        "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        "allow.auto.create.topics": False,
    }


def consumer_config(bootstrap: str, group: str) -> dict[str, Any]:
    """KafkaLog's reader settings: assigned partitions, a group id that is never joined or committed to."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        "allow.auto.create.topics": False,
    }


def flush(producer: Producer) -> None:
    """Wait for every delivery report, as KafkaLog.append does."""
    left = producer.flush(DELIVERY_TIMEOUT_MS / 1000 + DELIVERY_MARGIN_S)
    if left:
        raise BenchError(f"{left} records have no delivery report")


def serve_raw(
    bootstrap: str,
    topics: tuple[str, str],
    partition: int,
    replies: list[tuple[int, bytes]],
    stop: ProcessEvent,
) -> None:
    """The raw processor (a child process, as `keyload run` is): reply to every command record.

    The record's key is its index in the plan: the reply goes to that command's
    reply partition with keyload's outcome bytes for it, and carries the same key.
    Consumes as KafkaLog reads (poll for the first record, then drain what is
    queued), produces a group's replies and waits for their delivery reports,
    as a processor step publishes its outcomes.
    """
    commands, outcomes = topics
    consumer = Consumer(consumer_config(bootstrap, f"{commands}.raw"))
    producer = Producer(producer_config(bootstrap))
    consumer.assign([TopicPartition(commands, partition, 0)])
    try:
        while not stop.is_set():
            first = consumer.poll(RAW_POLL_S)
            if first is None:
                continue
            for message in [first, *consumer.consume(DRAIN_BATCH, 0)]:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                key = message.key()
                assert key is not None
                reply_partition, value = replies[int(key)]
                producer.produce(outcomes, value, key=key, partition=reply_partition)
            flush(producer)
    finally:
        consumer.close()


class RawRequester:
    """Produce the command bytes (waits for acks=all), then poll the reply partition for the reply.

    The reply partition is read from `position`: the topics are fresh, and the caller
    knows how many replies an earlier requester on the same partition took.
    """

    def __init__(
        self, bootstrap: str, topics: tuple[str, str], partition: int, values: list[bytes], reply: int, position: int
    ) -> None:
        self.commands, outcomes = topics
        self.partition = partition
        self.values = values
        self.position = position
        self.producer = Producer(producer_config(bootstrap))
        self.consumer = Consumer(consumer_config(bootstrap, f"{outcomes}.raw-{reply}"))
        self.consumer.assign([TopicPartition(outcomes, reply, position)])

    def request(self, index: int) -> None:
        key = str(index).encode()
        self.producer.produce(self.commands, self.values[index], key=key, partition=self.partition)
        flush(self.producer)
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while time.monotonic() < deadline:
            message = self.consumer.poll(RAW_POLL_S)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                raise BenchError(f"raw reply of {index}: {error.name()}: {error.str()}")
            if message.key() != key or message.offset() != self.position:
                raise BenchError(f"raw request {index} got {message.key()!r} at offset {message.offset()}")
            self.position += 1
            return
        raise BenchError(f"raw request {index} got no reply within {REQUEST_TIMEOUT_S} s")

    def close(self) -> None:
        self.consumer.close()
        flush(self.producer)


def raw_phases(bootstrap: str, prefix: str, plan: Plan, outcomes: list[bytes], clients: int) -> tuple[Phase, Phase]:
    """(c) and (d) on fresh topics laid out and configured by ensure_topics, as keyload's are."""
    settings = KafkaSettings(
        bootstrap, prefix, partitions=DEFAULT_PARTITIONS, outcome_partitions=outcome_partitions(clients)
    )
    ensure_topics(settings)
    topics = (settings.commands_topic, settings.outcomes_topic)
    partition = partition_for(DOMAIN, settings.partitions)
    values = [encode_enqueue(plan, index) for index in range(plan.commands)]
    replies = list(zip(plan.reply_to, outcomes, strict=True))
    context = multiprocessing.get_context("spawn")  # no fork under librdkafka's threads
    stop = context.Event()
    server = context.Process(
        target=serve_raw, args=(bootstrap, topics, partition, replies, stop), name="raw-processor", daemon=True
    )
    server.start()
    assert server.pid is not None
    try:
        first = RawRequester(bootstrap, topics, partition, values, 0, 0)
        try:
            sequential = run_sequential("c", "raw round trip, sequential", first, plan, server.pid)
        finally:
            first.close()
        positions = [first.position] + [0] * (clients - 1)  # (c) used reply partition 0
        pipelined = run_pipelined(
            "d",
            f"raw round trip, {clients} clients",
            lambda c: RawRequester(bootstrap, topics, partition, values, c, positions[c]),
            plan,
            server.pid,
        )
    finally:
        stop.set()
        server.join(PROCESSOR_STOP_S)
        if server.is_alive():
            server.kill()
            server.join()
    if server.exitcode != 0:
        raise BenchError(f"the raw processor exited with status {server.exitcode}")
    return sequential, pipelined


# -- runs ------------------------------------------------------------------------------


@contextlib.contextmanager
def kafka_broker(given: str | None, workdir: Path) -> Iterator[tuple[str, str]]:
    """(bootstrap, description): the broker at `given`, else a NativeBroker in `workdir` for the whole run."""
    if given:
        yield given, f"broker at {given} (given; its version is not checked)"
        return
    problem = native_broker_available()
    if problem is not None:
        raise BenchError(f"no broker: pass --bootstrap HOST:PORT or set {BOOTSTRAP_ENV} ({problem})")
    broker = NativeBroker(workdir)
    try:
        broker.start(BROKER_START_S)
    except BrokerError as exc:
        raise BenchError(str(exc)) from exc
    try:
        yield (
            broker.bootstrap,
            (
                f"Kafka {KAFKA_VERSION} (devtools.broker.NativeBroker, started for this run): 1 KRaft broker+controller"
                f" node at {broker.bootstrap}, heap {HEAP.removeprefix('-Xmx')}"
            ),
        )
    finally:
        broker.stop()


def delete_topics(bootstrap: str, prefixes: list[str]) -> None:
    """Best effort: a shared broker keeps no bench topics."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    every = [KafkaSettings(bootstrap, prefix) for prefix in prefixes]
    names = [name for s in every for name in (s.commands_topic, s.outcomes_topic, s.catalog_topic)]
    for future in admin.delete_topics(names, operation_timeout=TOPIC_DELETE_S).values():
        try:
            future.result(timeout=TOPIC_DELETE_S)
        except Exception as exc:
            print(f"bench.kafka: could not delete a topic: {exc}", file=sys.stderr)


@dataclass(frozen=True)
class Result:
    sequential: int
    pipelined: int
    clients: int
    body_bytes: int
    warmup: int
    partitions: int
    outcome_partitions: int
    command_partition: int
    repeats: int
    phases: dict[str, Phase]
    enqueued_total: int  # the queue's counter after (a) and (b); every repetition checks its own
    commands: int  # Enqueues sent per repetition, warm-ups included

    def ratios(self) -> dict[str, dict[str, float]]:
        """keyload / raw: latency ratios above 1 and throughput ratios below 1 mean keyload is slower."""
        ratios = {}
        for top, bottom in (("a", "c"), ("b", "d")):
            k, r = self.phases[top], self.phases[bottom]
            ratios[f"{top}/{bottom}"] = {
                "p50": k.p50_s / r.p50_s,
                "p99": k.p99_s / r.p99_s,
                "throughput": k.rate / r.rate,
            }
        return ratios


def measure(
    root: Path, bootstrap: str, plan: Plan, body_bytes: int, clients: int, keep_topics: bool
) -> tuple[dict[str, Phase], int]:
    """One repetition: (a) and (b) on fresh keyload topics, then (c) and (d) on fresh raw topics."""
    run = uuid.uuid4().hex[:10]
    prefixes = [f"bench-kafka-{run}", f"bench-kafka-{run}-raw"]
    try:
        keyload = keyload_phases(root, bootstrap, prefixes[0], plan, body_bytes, clients)
        sequential, pipelined = raw_phases(bootstrap, prefixes[1], plan, keyload.outcomes, clients)
    finally:
        if not keep_topics:
            delete_topics(bootstrap, prefixes)
    phases = {"a": keyload.sequential, "b": keyload.pipelined, "c": sequential, "d": pipelined}
    return phases, keyload.enqueued_total


def best_of(runs: list[dict[str, Phase]]) -> dict[str, Phase]:
    """Per phase the shortest wall time, the lowest percentiles and the least CPU over the repetitions."""
    best = {}
    for key, first in runs[0].items():
        phases = [run[key] for run in runs]
        servers = [phase.server_cpu_s for phase in phases if phase.server_cpu_s is not None]
        best[key] = Phase(
            key,
            first.label,
            first.commands,
            min(phase.seconds for phase in phases),
            min(phase.p50_s for phase in phases),
            min(phase.p99_s for phase in phases),
            min(phase.client_cpu_s for phase in phases),
            min(servers) if servers else None,
        )
    return best


# -- reporting -------------------------------------------------------------------------


def versions() -> dict[str, str]:
    librdkafka, _ = confluent_kafka.libversion()
    return {
        "kafka": KAFKA_VERSION,
        "confluent_kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": librdkafka,
        "keyload": importlib.metadata.version("keyload"),
    }


def to_json(result: Result, broker: str, command: str, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "bench.kafka",
        "command": command,
        "broker": broker,
        "sequential_commands": result.sequential,
        "pipelined_commands": result.pipelined,
        "clients": result.clients,
        "body_bytes": result.body_bytes,
        "warmup": result.warmup,
        "partitions": result.partitions,
        "outcome_partitions": result.outcome_partitions,
        "command_partition": result.command_partition,
        "repeats": result.repeats,
        "phases": {
            key: {
                "label": phase.label,
                "commands": phase.commands,
                "seconds": phase.seconds,
                "commands_per_s": phase.rate,
                "p50_ms": phase.p50_ms,
                "p99_ms": phase.p99_ms,
                "client_cpu_us_per_command": phase.cpu_us(phase.client_cpu_s),
                "processor_cpu_us_per_command": phase.cpu_us(phase.server_cpu_s),
            }
            for key, phase in result.phases.items()
        },
        "ratios": result.ratios(),
        "checks": {"enqueues_committed": result.commands, "queue_enqueued_total": result.enqueued_total},
        "versions": versions(),
        "environment": env,
    }


def _cpu(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def table(result: Result, broker: str, command: str, env: dict[str, Any]) -> str:
    v = versions()
    repeats = f"best of {result.repeats}" if result.repeats > 1 else "1 run"
    lines = [
        f"keyload bench.kafka: enqueue → outcome round trips, body {result.body_bytes} B, 1 domain on partition "
        f"{result.command_partition} of {result.partitions} (outcomes: {result.outcome_partitions} partitions, "
        "one per client)",
        f"broker: {broker}",
        "keyload: 1 `keyload run --data DIR` process (default settings; consumer group on the commands topic), "
        "keyload.Client per requester",
        f"raw: confluent-kafka {v['confluent_kafka']} / librdkafka {v['librdkafka']}: 1 processor process "
        "(assigned consumer + producer), a producer + assigned consumer per requester; topics from ensure_topics",
        f"python {env['python']}, {env['cpus']} cpus, load {env['load_average_1m']:.2f}; {repeats}; "
        f"warm-up of {result.warmup} round trips per phase excluded",
        "",
        f"{'phase':<38} {'cmds':>6} {'wall s':>7} {'cmd/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'client cpu µs/cmd':>17} {'processor cpu µs/cmd':>20}",
    ]
    for phase in result.phases.values():
        lines.append(
            f"({phase.key}) {phase.label:<34} {phase.commands:>6} {phase.seconds:>7.2f} {phase.rate:>8,.0f}"
            f" {phase.p50_ms:>7.2f} {phase.p99_ms:>7.2f}"
            f" {_cpu(phase.cpu_us(phase.client_cpu_s)):>17} {_cpu(phase.cpu_us(phase.server_cpu_s)):>20}"
        )
    lines += [
        "cpu µs/cmd: CPU of the whole process (all threads) over the timed loop, per command; "
        "client = this process, processor = `keyload run` or the raw processor",
        "",
        f"{'keyload / raw':<14} {'p50':>8} {'p99':>8} {'cmd/s':>8}",
    ]
    for name, ratio in result.ratios().items():
        lines.append(f"{name:<14} {ratio['p50']:>8.2f} {ratio['p99']:>8.2f} {ratio['throughput']:>8.3f}")
    lines += [
        "(latency ratios above 1 and throughput ratios below 1: keyload is slower than the raw round trip)",
        f"checks: {result.commands} Enqueues per repetition committed (each outcome read back), queue counters: "
        f"enqueued_total = stored_messages = {result.enqueued_total}",
        f"command: {command}",
    ]
    return "\n".join(lines)


def _check_sizes(args: argparse.Namespace) -> None:
    if args.sequential < 1 or args.pipelined < 1:
        raise BenchError("--sequential and --pipelined must be >= 1")
    if args.clients < 1 or args.clients > args.pipelined:
        raise BenchError("--clients must be 1..--pipelined")
    if not 0 <= args.body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        raise BenchError(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    if args.warmup < 0 or args.repeat < 1:
        raise BenchError("--warmup must be >= 0 and --repeat >= 1")
    total = args.sequential + args.pipelined + args.warmup + args.clients * math.ceil(args.warmup / args.clients)
    if total > INTEGER_FIELDS["max_stored_messages"].maximum:
        raise BenchError("more Enqueues than the largest max_stored_messages a queue may have")
    if total * args.body_bytes > INTEGER_FIELDS["max_stored_bytes"].maximum:
        raise BenchError("the Enqueues' bodies exceed the largest max_stored_bytes a queue may have")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sequential", type=int, default=DEFAULT_SEQUENTIAL, help="commands of (a) and (c) (default %(default)s)"
    )
    parser.add_argument(
        "--pipelined", type=int, default=DEFAULT_PIPELINED, help="commands of (b) and (d) (default %(default)s)"
    )
    parser.add_argument(
        "--clients", type=int, default=DEFAULT_CLIENTS, help="requesters of (b) and (d) (default %(default)s)"
    )
    parser.add_argument(
        "--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="message body size (default %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=DEFAULT_WARMUP, help="untimed round trips before each phase (default %(default)s)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions; per phase the best is reported")
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get(BOOTSTRAP_ENV),
        help=f"use the broker at HOST:PORT (default: ${BOOTSTRAP_ENV}, else start one)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and the topics")
    args = parser.parse_args(argv)
    try:
        _check_sizes(args)
    except BenchError as exc:
        parser.error(str(exc))
    command = shlex.join(["python", "-m", "bench.kafka", *(sys.argv[1:] if argv is None else argv)])
    plan = make_plan(args.sequential, args.pipelined, args.clients, args.warmup, args.body_bytes)

    root = Path(tempfile.mkdtemp(prefix="keyload-bench-kafka-", dir=args.dir))
    try:
        with kafka_broker(args.bootstrap, root / "broker") as (bootstrap, broker):
            runs = []
            enqueued = 0
            for repetition in range(args.repeat):
                phases, enqueued = measure(
                    root / f"run-{repetition}", bootstrap, plan, args.body_bytes, args.clients, args.keep
                )
                runs.append(phases)
                if not args.keep:
                    shutil.rmtree(root / f"run-{repetition}")
        partitions = DEFAULT_PARTITIONS
        result = Result(
            args.sequential,
            args.pipelined,
            args.clients,
            args.body_bytes,
            args.warmup,
            partitions,
            outcome_partitions(args.clients),
            partition_for(DOMAIN, partitions),
            args.repeat,
            best_of(runs),
            enqueued,
            plan.commands,
        )
        env = environment(args.warmup, root)
        print(
            json.dumps(to_json(result, broker, command, env), indent=2)
            if args.json
            else table(result, broker, command, env),
            flush=True,
        )
    except (BenchError, LogError, KafkaException) as exc:
        print(f"bench.kafka: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
