"""keyload against its peers on this machine, the same workloads interleaved in one run.

    python -m bench.peers [--install] [--repetitions 3] [--json]

Each peer runs from its own package on loopback, with the durable settings a user of it would
choose, and is driven by its usual Python client, one connection, one call at a time:

- **keyload**: `keyload run --listen` on the embedded file log, driven over HTTP (httpx); a
  command's outcome is answered once the group holding it is fsynced (group commit).
- **Redis Streams** (`redis-server`, Debian): `appendonly yes`, `appendfsync everysec`;
  XADD, XREADGROUP, XACK (redis-py).
- **RabbitMQ** (`rabbitmq-server`, Debian): a quorum queue, persistent messages, publisher
  confirms, manual acks, prefetch 100 (aio-pika); its Erlang schedulers told not to spin while
  idle (`+sbwt none`), as every server runs throughout and idles while the others are measured.
- **NATS JetStream** (`nats-server`, `go install`): file storage (fsync on its default
  interval), a durable pull consumer, explicit acks confirmed by the server (nats-py).
- **Kafka share group**: the project's Kafka broker (devtools/broker.py, Maven Central jars),
  a producer with acks=all and a share consumer in explicit acknowledgement mode with
  commitSync, in a small Java program (bench/java/ShareDriver.java, compiled on the spot)
  driven line by line over a pipe (which adds its own tens of µs to each call).

Workloads, each over fresh messages of `--body-bytes` random bytes:

- **cycle**: produce one message, receive it, ack it; msg/s, and the produce → received
  round trip (from the produce call until the receive returned it), p50 and p99.
- **batched**: produce 100 (keyload: one Batch of 100 Enqueues; Redis: one pipeline;
  RabbitMQ and NATS: 100 publishes at once, each confirmed; Kafka: 100 sends, then waited for), receive 100,
  ack them (keyload: one AckBatch; RabbitMQ: one multiple ack; Redis: one XACK; NATS: 100
  confirmed acks, concurrently; Kafka: 100 acknowledgements and one commitSync).
- **produce**: produce one message at a time, confirmed; msg/s (drained afterwards, untimed).

Every workload runs `--repetitions` times, peers taking turns at going first; the table gives the
median and the range of each cell, and keyload's ratio to each peer (its median over theirs; for
latencies, lower is better). A peer whose server or client package is missing is skipped and
said so; `--install` installs the servers first (apt-get and go, as root).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bench.common import DOMAIN, QUEUE, BenchError, environment
from bench.server import BATCH, HttpPath, Message, Messages, SdkPath, Server, sdk_reply_partition
from keyload.credentials import ADMIN_PRINCIPAL, Credential, credential_path
from keyload.sdk.results import QueuePolicySpec
from keyload.storage.datadir import DataDir

T = TypeVar("T")
WORKLOADS = ("cycle", "batched", "produce")
START_S = 60.0  # a server not answering after this long is skipped
STOP_S = 15.0  # after SIGTERM, before SIGKILL
RECEIVE_WAIT_S = 10.0  # a message produced and not received within this long is a BenchError
WARMUP_CYCLES = 20
NATS_MODULE = "github.com/nats-io/nats-server/v2@v2.15.3"
DEBIAN_PACKAGES = ("redis-server", "rabbitmq-server")
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


class Daemon:
    """A peer's server as a child process in a session of its own, its output in a file."""

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        after_stop: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.after_stop = after_stop  # what the server left outside its session (RabbitMQ's epmd)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_S
        while True:
            with contextlib.suppress(Exception):  # not listening yet: any client error means "not yet"
                if ready():
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise BenchError(f"{what} did not start: {tail}")
            time.sleep(0.2)

    @contextlib.contextmanager
    def stopped_on_failure(self) -> Iterator[None]:
        """Around a peer's set-up once its server runs: a failure stops the server too."""
        try:
            yield
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.after_stop is not None:
            self.after_stop()


# -- the peers ---------------------------------------------------------------------------


class Peer(ABC):
    """One system under test: produce, receive exactly `count`, ack what was received."""

    name: ClassVar[str]
    durability: ClassVar[str]

    @abstractmethod
    def __init__(self, work: Path, messages: int, body_bytes: int) -> None:
        """Start the peer's server under `work`, ready for `messages` messages of `body_bytes` in all."""

    @classmethod
    def missing(cls) -> str | None:
        """Why this peer cannot run here, or None."""
        return None

    @abstractmethod
    def produce(self, message: Message) -> None: ...

    @abstractmethod
    def produce_many(self, messages: Sequence[Message]) -> None: ...

    @abstractmethod
    def receive(self, count: int) -> list[Any]: ...

    @abstractmethod
    def ack(self, deliveries: list[Any]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


def _module_missing(*modules: str) -> str | None:
    absent = [module for module in modules if importlib.util.find_spec(module) is None]
    return f"Python package {', '.join(absent)} not installed (scripts/bootstrap installs it)" if absent else None


def _binary(name: str, *elsewhere: Path) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    return next((str(path) for path in elsewhere if path.exists()), None)


class Keyload(Peer):
    name = "keyload"
    durability = "embedded file log, fsynced per group commit before any outcome; HTTP API"

    def __init__(self, work: Path, messages: int, body_bytes: int) -> None:
        root = work / "keyload"
        self.server = Server(root)
        try:
            sdk = SdkPath(root, sdk_reply_partition(DataDir.open(root)))
            try:
                policy = QueuePolicySpec(
                    receive_max_messages=BATCH, max_stored_messages=messages, max_stored_bytes=messages * body_bytes
                )
                sdk.client.create_queue(DOMAIN, QUEUE, policy)
            finally:
                sdk.close()
            token = Credential.load(credential_path(root, ADMIN_PRINCIPAL)).bearer_token
            self.http = HttpPath(self.server.url, token)
        except BaseException:
            self.server.stop()
            raise

    def produce(self, message: Message) -> None:
        self.http.enqueue(DOMAIN, QUEUE, message)

    def produce_many(self, messages: Sequence[Message]) -> None:
        self.http.enqueue_batch(DOMAIN, QUEUE, messages)

    def receive(self, count: int) -> list[Any]:
        received: list[Any] = []
        deadline = time.monotonic() + RECEIVE_WAIT_S
        while len(received) < count:
            if count == 1:
                received.append(self.http.receive())
            else:
                received += self.http.receive_many(DOMAIN, QUEUE, count - len(received))
            if time.monotonic() > deadline:
                raise BenchError(f"keyload: {len(received)} of {count} messages received")
        return received

    def ack(self, deliveries: list[Any]) -> None:
        tokens = [token for _, _, token in deliveries]
        if len(tokens) == 1:
            self.http.ack(tokens[0])
        else:
            self.http.ack_batch(DOMAIN, tokens)

    def close(self) -> None:
        self.http.close()
        self.server.stop()


class Redis(Peer):
    name = "Redis Streams"
    durability = "appendonly yes, appendfsync everysec"
    STREAM, GROUP, CONSUMER = "bench", "bench-group", "bench-consumer"

    @classmethod
    def missing(cls) -> str | None:
        if _binary("redis-server") is None:
            return "redis-server not on PATH (Debian package redis-server; --install)"
        return _module_missing("redis")

    def __init__(self, work: Path, messages: int, body_bytes: int) -> None:
        import redis

        directory = work / "redis"
        directory.mkdir()
        port = free_port()
        argv = ["redis-server", "--bind", LOOPBACK, "--port", str(port), "--dir", str(directory), "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no"]
        self.daemon = Daemon(argv, directory / "server.log")
        with self.daemon.stopped_on_failure():
            self.client = redis.Redis(host=LOOPBACK, port=port)
            self.daemon.wait_until(lambda: bool(self.client.ping()), "redis-server")
            self.client.xgroup_create(self.STREAM, self.GROUP, id="$", mkstream=True)

    def produce(self, message: Message) -> None:
        self.client.xadd(self.STREAM, {"body": message.body})

    def produce_many(self, messages: Sequence[Message]) -> None:
        pipeline = self.client.pipeline(transaction=False)
        for message in messages:
            pipeline.xadd(self.STREAM, {"body": message.body})
        pipeline.execute()

    def receive(self, count: int) -> list[Any]:
        received: list[Any] = []
        while len(received) < count:
            answer: Any = self.client.xreadgroup(
                self.GROUP,
                self.CONSUMER,
                {self.STREAM: ">"},
                count=count - len(received),
                block=int(RECEIVE_WAIT_S * 1000),
            )
            if not answer:
                raise BenchError(f"Redis: {len(received)} of {count} messages received")
            received += [entry_id for entry_id, _ in answer[0][1]]
        return received

    def ack(self, deliveries: list[Any]) -> None:
        self.client.xack(self.STREAM, self.GROUP, *deliveries)

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()


class EventLoop:
    """An asyncio client's loop, driven one call at a time from the benchmark's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def awaited() -> T:
            return await awaitable

        return self.loop.run_until_complete(awaited())

    def run_all(self, awaitables: Iterable[Awaitable[Any]]) -> None:
        """Awaited together: requests sent at once, their answers taken as they come."""

        async def together() -> None:
            await asyncio.gather(*awaitables)

        self.loop.run_until_complete(together())

    def take(self, inbox: asyncio.Queue[T], count: int, what: str) -> list[T]:
        async def taken() -> list[T]:
            return [await asyncio.wait_for(inbox.get(), RECEIVE_WAIT_S) for _ in range(count)]

        try:
            return self.run(taken())
        except TimeoutError:
            raise BenchError(f"{what}: fewer than {count} messages received") from None

    def close(self) -> None:
        self.loop.close()


class RabbitMq(Peer):
    name = "RabbitMQ quorum"
    durability = "quorum queue, persistent messages, publisher confirms, manual acks"
    SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # Debian's, without the wrapper that changes user
    QUEUE = "bench"

    @classmethod
    def missing(cls) -> str | None:
        if not cls.SERVER.exists():
            return f"{cls.SERVER} not found (Debian package rabbitmq-server; --install)"
        return _module_missing("aio_pika")

    def __init__(self, work: Path, messages: int, body_bytes: int) -> None:
        import aio_pika

        directory = work / "rabbitmq"
        for sub in ("mnesia", "log"):
            (directory / sub).mkdir(parents=True)
        (directory / "enabled_plugins").write_text("[].\n")
        epmd_was_running = _epmd_running()
        port = free_port()
        env = dict(os.environ)
        env.update(
            RABBITMQ_NODENAME=f"keyload-bench-{port}@localhost",
            RABBITMQ_NODE_IP_ADDRESS=LOOPBACK,
            RABBITMQ_NODE_PORT=str(port),
            RABBITMQ_DIST_PORT=str(free_port()),
            RABBITMQ_MNESIA_BASE=str(directory / "mnesia"),
            RABBITMQ_LOG_BASE=str(directory / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(directory / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(directory / "pid"),
            RABBITMQ_CONFIG_FILE=str(directory / "rabbitmq"),
            # Erlang's schedulers spin while idle by default: on a shared two-core machine that taxes whoever runs
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none",
        )
        self.daemon = Daemon(
            [str(self.SERVER)], directory / "server.log", env, after_stop=None if epmd_was_running else _stop_epmd
        )
        with self.daemon.stopped_on_failure():
            self.events = EventLoop()
            self.daemon.wait_until(lambda: _listening(port), "RabbitMQ")
            self.inbox: asyncio.Queue[Any] = asyncio.Queue()

            async def consuming() -> tuple[Any, Any]:
                connection = await aio_pika.connect(host=LOOPBACK, port=port)
                channel = await connection.channel(publisher_confirms=True)
                await channel.set_qos(prefetch_count=BATCH)
                queue = await channel.declare_queue(self.QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
                await queue.consume(self.inbox.put)
                return connection, channel.default_exchange

            self.connection, self.exchange = self.events.run(consuming())
            self.persistent = aio_pika.DeliveryMode.PERSISTENT
            self.message = aio_pika.Message

    def _publish(self, message: Message) -> Awaitable[Any]:
        body = self.message(message.body, delivery_mode=self.persistent)
        confirmed: Awaitable[Any] = self.exchange.publish(body, routing_key=self.QUEUE, mandatory=True)
        return confirmed

    def produce(self, message: Message) -> None:
        self.events.run(self._publish(message))

    def produce_many(self, messages: Sequence[Message]) -> None:
        self.events.run_all(self._publish(message) for message in messages)

    def receive(self, count: int) -> list[Any]:
        return self.events.take(self.inbox, count, "RabbitMQ")

    def ack(self, deliveries: list[Any]) -> None:
        self.events.run(deliveries[-1].ack(multiple=len(deliveries) > 1))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the broker goes down next anyway
            self.events.run(self.connection.close())
        self.events.close()
        self.daemon.stop()


def _stop_epmd() -> None:
    """Erlang's port mapper, which the node started and which outlives it in a session of its own."""
    subprocess.run(["epmd", "-kill"], capture_output=True, check=False)


def _epmd_running() -> bool:
    if shutil.which("epmd") is None:
        return False
    return subprocess.run(["epmd", "-names"], capture_output=True, check=False).returncode == 0


class NatsJetStream(Peer):
    name = "NATS JetStream"
    durability = "file storage (fsync on JetStream's default interval), durable pull consumer, acks confirmed"
    SUBJECT, STREAM, DURABLE = "bench.queue", "BENCH", "bench-consumer"

    @classmethod
    def missing(cls) -> str | None:
        if _nats_server() is None:
            return f"nats-server not on PATH nor in ~/go/bin (go install {NATS_MODULE}; --install)"
        return _module_missing("nats")

    def __init__(self, work: Path, messages: int, body_bytes: int) -> None:
        import nats

        directory = work / "nats"
        directory.mkdir()
        port = free_port()
        server = _nats_server()
        assert server is not None
        argv = [server, "-js", "-sd", str(directory), "-a", LOOPBACK, "-p", str(port)]
        self.daemon = Daemon(argv, directory / "server.log")
        with self.daemon.stopped_on_failure():
            self.events = EventLoop()
            self.daemon.wait_until(lambda: _listening(port), "nats-server")
            self.client = self.events.run(nats.connect(f"nats://{LOOPBACK}:{port}", allow_reconnect=False))
            self.stream = self.client.jetstream()
            self.events.run(self.stream.add_stream(name=self.STREAM, subjects=[self.SUBJECT], storage="file"))
            self.pull = self.events.run(self.stream.pull_subscribe(self.SUBJECT, durable=self.DURABLE))

    def produce(self, message: Message) -> None:
        self.events.run(self.stream.publish(self.SUBJECT, message.body))

    def produce_many(self, messages: Sequence[Message]) -> None:
        self.events.run_all(self.stream.publish(self.SUBJECT, message.body) for message in messages)

    def receive(self, count: int) -> list[Any]:
        received: list[Any] = []
        deadline = time.monotonic() + RECEIVE_WAIT_S
        while len(received) < count:
            received += self.events.run(self.pull.fetch(count - len(received), timeout=RECEIVE_WAIT_S))
            if time.monotonic() > deadline:
                raise BenchError(f"NATS: {len(received)} of {count} messages received")
        return received

    def ack(self, deliveries: list[Any]) -> None:
        self.events.run_all(delivery.ack_sync() for delivery in deliveries)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.events.run(self.client.close())
        self.events.close()
        self.daemon.stop()


class KafkaShareGroup(Peer):
    name = "Kafka share group"
    durability = (
        "acks=all on one broker (flushed by the OS, Kafka's default), share group, explicit acknowledgement, commitSync"
    )
    TOPIC, GROUP = "bench-share", "bench-share-group"
    DRIVER = Path(__file__).parent / "java" / "ShareDriver.java"
    # kafka-clients and what it needs at run time: no logging binding, so nothing but answers reaches stdout
    CLIENT_JARS = ("kafka-clients-", "lz4-java-", "snappy-java-", "zstd-jni-", "slf4j-api-")

    @classmethod
    def missing(cls) -> str | None:
        absent = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
        return f"{' and '.join(absent)} not on PATH (a JDK 17)" if absent else None

    def __init__(self, work: Path, messages: int, body_bytes: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        from devtools.broker import BrokerError, NativeBroker, kafka_classpath

        directory = work / "kafka"
        directory.mkdir()
        try:
            jars = kafka_classpath()
        except BrokerError as exc:
            raise BenchError(f"Kafka jars: {exc}") from exc
        classes = directory / "driver"
        classpath = os.pathsep.join(str(jar) for jar in jars if jar.name.startswith(self.CLIENT_JARS))
        compiled = subprocess.run(
            ["javac", "-d", str(classes), "-cp", classpath, str(self.DRIVER)], capture_output=True, text=True
        )
        if compiled.returncode != 0:
            raise BenchError(f"javac {self.DRIVER.name}: {compiled.stderr[-2000:]}")
        self.broker = NativeBroker(directory / "broker")
        try:
            self.broker.start()
            admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
            for future in admin.create_topics([NewTopic(self.TOPIC, 1, 1)]).values():
                future.result()
            argv = ["java", "-cp", os.pathsep.join([classpath, str(classes)]), "ShareDriver"]
            argv += [self.broker.bootstrap, self.TOPIC, self.GROUP, str(body_bytes)]
            self.driver = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
            )
            if self._answer(START_S) != "ready":
                raise BenchError("the share-consumer driver did not start")
        except BaseException:
            if hasattr(self, "driver"):
                self.driver.kill()
            self.broker.stop()
            raise

    def _answer(self, timeout_s: float = 2 * RECEIVE_WAIT_S) -> str:
        """The driver's answer to the last request: one line (nothing else is ever buffered)."""
        assert self.driver.stdout is not None
        readable, _, _ = select.select([self.driver.stdout], [], [], timeout_s)
        if not readable:
            raise BenchError(f"Kafka share driver: no answer within {timeout_s:g} s")
        line = self.driver.stdout.readline().strip()
        if not line or line.startswith("error"):
            raise BenchError(f"Kafka share driver: {line or 'exited'}")
        return line

    def _ask(self, request: str) -> str:
        assert self.driver.stdin is not None
        self.driver.stdin.write(request + "\n")
        return self._answer()

    def produce(self, message: Message) -> None:
        self._ask("produce")

    def produce_many(self, messages: Sequence[Message]) -> None:
        self._ask(f"produce-many {len(messages)}")

    def receive(self, count: int) -> list[Any]:
        got = 0
        deadline = time.monotonic() + RECEIVE_WAIT_S
        while True:
            got += int(self._ask(f"receive {count - got}").split()[1])
            if got >= count:
                return [None] * count
            if time.monotonic() > deadline:
                raise BenchError(f"Kafka share group: {got} of {count} messages received")
            self._ask("ack")  # a share consumer polls again only once its last poll's records are acknowledged

    def ack(self, deliveries: list[Any]) -> None:
        self._ask("ack")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.driver.stdin is not None
            self.driver.stdin.close()
        try:
            self.driver.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.driver.kill()
        self.broker.stop()


def _listening(port: int) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=1):
        return True


def _nats_server() -> str | None:
    return _binary("nats-server", Path.home() / "go" / "bin" / "nats-server")


PEERS: tuple[type[Peer], ...] = (Keyload, Redis, RabbitMq, NatsJetStream, KafkaShareGroup)


def install() -> None:
    """The peers' servers from packages: Debian's Redis and RabbitMQ, NATS from the Go proxy."""
    if shutil.which("apt-get") is not None:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-q", *DEBIAN_PACKAGES], env=env, check=False)
    if shutil.which("go") is not None and _nats_server() is None:
        subprocess.run(["go", "install", NATS_MODULE], check=False)


# -- the workloads -----------------------------------------------------------------------


@dataclass
class Cell:
    """One workload of one peer: a rate per repetition, and the cycle's round trips."""

    rates: list[float] = field(default_factory=list)
    round_trips_ms: list[list[float]] = field(default_factory=list)  # per repetition


def run_cycle(peer: Peer, messages: Sequence[Message], cell: Cell | None) -> None:
    trips = []
    started = time.perf_counter()
    for message in messages:
        sent = time.perf_counter()
        peer.produce(message)
        deliveries = peer.receive(1)
        trips.append((time.perf_counter() - sent) * 1000)
        peer.ack(deliveries)
    if cell is not None:
        cell.rates.append(len(messages) / (time.perf_counter() - started))
        cell.round_trips_ms.append(trips)


def run_batched(peer: Peer, messages: Sequence[Message], cell: Cell | None) -> None:
    started = time.perf_counter()
    for first in range(0, len(messages), BATCH):
        batch = messages[first : first + BATCH]
        peer.produce_many(batch)
        peer.ack(peer.receive(len(batch)))
    if cell is not None:
        cell.rates.append(len(messages) / (time.perf_counter() - started))


def run_produce(peer: Peer, messages: Sequence[Message], cell: Cell | None) -> None:
    started = time.perf_counter()
    for message in messages:
        peer.produce(message)
    if cell is not None:
        cell.rates.append(len(messages) / (time.perf_counter() - started))
    for first in range(0, len(messages), BATCH):  # drained, untimed: the next workload starts empty
        peer.ack(peer.receive(min(BATCH, len(messages) - first)))


RUNS: dict[str, Callable[[Peer, Sequence[Message], Cell | None], None]] = {
    "cycle": run_cycle,
    "batched": run_batched,
    "produce": run_produce,
}


@dataclass
class Result:
    counts: dict[str, int]
    durability: dict[str, str]
    skipped: dict[str, str]
    cells: dict[str, dict[str, Cell]]  # workload -> peer -> cell


def measure(work: Path, args: argparse.Namespace) -> Result:
    counts = {"cycle": args.cycles, "batched": args.batches * BATCH, "produce": args.produce}
    skipped: dict[str, str] = {}
    kinds = [kind for kind in PEERS if kind.name in args.peers or kind.name == Keyload.name]
    for kind in kinds:
        reason = kind.missing()
        if reason is not None:
            skipped[kind.name] = reason
    messages = Messages(args.body_bytes)
    total = sum(counts.values()) * args.repetitions + WARMUP_CYCLES
    with contextlib.ExitStack() as stack:
        peers: list[Peer] = []
        for kind in kinds:
            if kind.name in skipped:
                continue
            try:
                peer = kind(work, total, args.body_bytes)
            except BenchError as exc:
                skipped[kind.name] = str(exc)[:500]
                continue
            stack.callback(peer.close)
            run_cycle(peer, messages.take(WARMUP_CYCLES), None)
            peers.append(peer)
        cells = {workload: {peer.name: Cell() for peer in peers} for workload in WORKLOADS}
        for repetition in range(args.repetitions):
            for workload in WORKLOADS:
                turn = peers[repetition % len(peers) :] + peers[: repetition % len(peers)]
                for peer in turn:
                    RUNS[workload](peer, messages.take(counts[workload]), cells[workload][peer.name])
        durability = {peer.name: peer.durability for peer in peers}
    return Result(counts, durability, skipped, cells)


# -- reporting ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value at least a fraction `q` of the values do not exceed."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def rows(result: Result) -> list[tuple[str, dict[str, tuple[float, float, float]], bool]]:
    """(label, peer -> (median, low, high), higher is better) per table row."""
    table = []
    for workload in WORKLOADS:
        spans = {name: _span(cell.rates) for name, cell in result.cells[workload].items()}
        table.append((f"{workload}, msg/s", spans, True))
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        spans = {
            name: _span([percentile(trips, q) for trips in cell.round_trips_ms])
            for name, cell in result.cells["cycle"].items()
        }
        table.append((f"round trip {label}, ms", spans, False))
    return table


def _span(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def to_json(result: Result, command: str, env: dict[str, Any]) -> dict[str, Any]:
    table = rows(result)
    return {
        "benchmark": "bench.peers",
        "command": command,
        "messages": result.counts,
        "durability": result.durability,
        "skipped": result.skipped,
        "rows": {
            label: {name: {"median": m, "low": lo, "high": hi} for name, (m, lo, hi) in spans.items()}
            for label, spans, _ in table
        },
        "keyload_ratio": {label: _ratios(spans) for label, spans, _ in table},
        "environment": env,
    }


def _ratios(spans: dict[str, tuple[float, float, float]]) -> dict[str, float]:
    own = spans.get(Keyload.name)
    if own is None:
        return {}
    return {name: own[0] / span[0] for name, span in spans.items() if name != Keyload.name and span[0] > 0}


def table(result: Result, command: str, env: dict[str, Any], repetitions: int) -> str:
    names = list(result.durability)
    measured, ratios = [], []
    for label, spans, higher in rows(result):
        shown = [
            f"{m:,.0f} ({lo:,.0f}-{hi:,.0f})" if higher else f"{m:.2f} ({lo:.2f}-{hi:.2f})"
            for m, lo, hi in (spans[n] for n in names)
        ]
        measured.append((label, shown))
        against = _ratios(spans)
        ratios.append((label, [f"{against[n]:.2f}" if n in against else "" for n in names]))
    width = 2 + max(len(text) for text in [*names, *(cell for _, shown in measured for cell in shown)])
    label_width = 2 + max(len(label) for label, _ in measured)

    def lines_of(heading: str, body: list[tuple[str, list[str]]]) -> list[str]:
        return [heading.ljust(label_width) + "".join(name.rjust(width) for name in names)] + [
            label.ljust(label_width) + "".join(cell.rjust(width) for cell in cells) for label, cells in body
        ]

    return "\n".join(
        [
            f"keyload bench.peers: {command}",
            f"{env['cpus']} cpus, load {env['load_average_1m']:.2f}; {repetitions} repetitions, "
            "peers taking turns at going first",
            f"messages per repetition: {', '.join(f'{w} {n}' for w, n in result.counts.items())}; "
            f"body {env['body_bytes']} B",
            "",
            *lines_of("median (low-high)", measured),
            "",
            *lines_of("keyload / peer", ratios),
            "(rates: above 1 is keyload ahead; latencies: below 1 is keyload ahead)",
            "",
            "durability:",
            *(f"  {name}: {setting}" for name, setting in result.durability.items()),
            "skipped:" if result.skipped else "skipped: none",
            *(f"  {name}: {reason}" for name, reason in result.skipped.items()),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=500, help="one-at-a-time cycles per repetition (default 500)")
    parser.add_argument(
        "--batches", type=int, default=10, help=f"batched cycles of {BATCH} per repetition (default 10)"
    )
    parser.add_argument("--produce", type=int, default=1000, help="messages produced one at a time (default 1000)")
    parser.add_argument("--repetitions", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--body-bytes", type=int, default=1024, help="message body size (default 1024)")
    parser.add_argument(
        "--peers",
        default=",".join(kind.name for kind in PEERS[1:]),
        type=lambda text: [name.strip() for name in text.split(",")],
        help="which peers besides keyload, by name, comma-separated (default: all)",
    )
    parser.add_argument("--install", action="store_true", help="install the peers' servers first (root: apt-get, go)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    if min(args.cycles, args.batches, args.produce, args.repetitions, args.body_bytes) < 1:
        parser.error("every count must be at least 1")
    if args.install:
        install()
    # SIGTERM unwinds like Ctrl-C, so every server started (each in a session of its own) is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    command = " ".join(["python", "-m", "bench.peers", *(sys.argv[1:] if argv is None else argv)])
    work = Path(tempfile.mkdtemp(prefix="keyload-bench-peers-", dir=args.dir))
    try:
        result = measure(work, args)
        env = environment(WARMUP_CYCLES, work)
        env["body_bytes"] = args.body_bytes
        print(
            json.dumps(to_json(result, command, env), indent=2)
            if args.json
            else table(result, command, env, args.repetitions)
        )
    except BenchError as exc:
        print(f"bench.peers: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
