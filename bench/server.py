"""The HTTP API's live path against the local SDK's, both served by one `keyload run` in one run.

    python -m bench.server [--cycles N] [--batches C] [--concurrency K] [--messages M] [--body-bytes B]
                           [--rounds R] [--no-strace] [--no-go] [--json]

One `keyload run --data DIR --listen 127.0.0.1:0` child process serves a fresh data directory on the
embedded file log (its URL from DIR/server.json). (a) and (b) share one domain, so one partition and
its processor; (c), (d) and (h)'s fan-in use a domain of another partition, (e) one of a third. Both paths act as
the administrator.

(a) SDK cycles: one keyload.Client(DIR): it appends each command to the file log itself (one fsync
            per append), rings the doorbell and polls its reply partition for the outcome. N cycles,
            one at a time: enqueue → receive(max_messages=1) → ack.
(b) HTTP cycles: one httpx.Client with the administrator's bearer token, the same N cycles against
            the API: the server appends without an fsync (the processor's sync_through before it
            publishes is the one fsync of every record appended meanwhile) and answers each request
            in-process when its outcome is published.
            (a) and (b) run in R rounds of N/R cycles each, taking turns at going first.
(c) HTTP fan-in: K threads (default 16), each with its own httpx.Client, M Enqueues each, one at a
            time, all released together; against one client doing M Enqueues, in R rounds taking
            turns at going first. K / 1 shows what the group commit gives concurrent clients.
(d) fsyncs per message (untimed; needs strace): strace -f -c -e trace=fsync,fdatasync attached to
            `keyload run` while one SDK client, one HTTP client and K HTTP clients enqueue; the SDK
            client runs in a child process under strace of its own, to count its fsyncs too.
(e) HTTP batched cycles: one httpx.Client, C cycles of 100 messages in R rounds: one POST …/batch of 100
            Enqueue mutations (one command) → POST …/receive {"max_messages": 100} → one POST
            …/leases/ack-batch of the 100 tokens. Rated in messages/s.
(f) processor-only references: bench.cycle's cycles `1` and `100`, run in this process through its own
            QueueDriver (rounds of 500, its default), each on as many messages as (a)+(b)(+(h))'s queue, or
            (e)'s, saw; their step() loops' wall-clock msg/s. Cycle `1` once more in rounds of one message
            (window 1): each step applies one command, as the live one-at-a-time cycle's steps do. Played a
            share of their rounds after each round of (a)/(b) (cycle `1`) or of (e) (cycle `100`),
            `keyload run` idle meanwhile.
(g) fsync on this disk: os.fsync after a 1 KiB append to a file in the bench's temporary directory, a
            share of the tries after each round of (a)/(b).
(h) the Go client (bench/go/httpclient, built with `go build` when go is on PATH; --no-go skips it):
            (b)'s cycles from a Go program on one keep-alive connection, taking turns with (a) and (b)
            on their queue, and (c)'s fan-in with a goroutine and connection per client, taking turns
            with (c); a Go client costs a fraction of httpx's CPU per request, so its figures show what
            the server gives rather than what a Python client can ask of it.

The report ends with the issue's targets, as ratios in this run: (b)'s cycles/s against (f)'s cycle `1`
(≥ 0.5), (b)'s produce → received p50 against (g)'s p50 (≤ 3), K clients' enqueues/s against one's in
(c) (≥ 4); the same three on (h)'s figures; and, with no target, (b)'s and (h)'s cycles/s against
(f)'s cycle `1` one command a step, that against (f)'s cycle `1` in rounds of 500, and (e) against (f)'s
cycle `100`.

Latency is per request, from the call until its outcome is in hand; CPU is per cycle or Enqueue, of this
process and of `keyload run` (split into its service thread, which runs the processors and, between their
steps, the HTTP API's event loop, and the others: the GC worker, the API's worker threads), from /proc.
The figures to compare are the ratios against a reference measured in the same run (HTTP / SDK, K clients
/ 1). bench/README.md explains the columns.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.metadata
import itertools
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from keyload import Client, limits
from keyload.credentials import ADMIN_PRINCIPAL, Credential, credential_path
from keyload.errors import KeyloadError
from keyload.log.base import partition_for
from keyload.processors.policy import INTEGER_FIELDS
from keyload.sdk.results import QueuePolicySpec
from keyload.server.runner import ADDRESS_FILE
from keyload.service.embedded import SERVICE_THREAD
from keyload.storage.datadir import DataDir

from .common import DOMAIN, QUEUE, SEED, BenchError, ServiceProcess, environment, rounds
from .cycle import CYCLES as REFERENCE_CYCLES
from .cycle import DEFAULTS as CYCLE_DEFAULTS
from .cycle import QueueDriver
from .go_client import GoClient
from .go_client import build as build_go_client
from .kafka import percentile

FANIN_QUEUE = "bench-fanin"  # (c), (d) and (h) enqueue here, in a domain of another partition, and never receive
BATCH_QUEUE = "bench-batch"  # (e), in a domain of a third partition
BATCH = 100  # messages per batched cycle: Enqueue mutations per Batch, max_messages, tokens per AckBatch
assert min(limits.MAX_BATCH_MUTATIONS, limits.MAX_ACK_BATCH, limits.MAX_RECEIVE_MESSAGES) >= BATCH

DEFAULT_CYCLES = 2_000  # per path
DEFAULT_BATCHES = 40  # batched cycles of (e), BATCH messages each
DEFAULT_CONCURRENCY = 16
DEFAULT_MESSAGES = 500  # per client of (c)
DEFAULT_BODY_BYTES = 1024
DEFAULT_ROUNDS = 4
DEFAULT_WARMUP = 50  # untimed cycles per path before the first round
DEFAULT_FSYNC_MESSAGES = 400  # per workload of (d)
FANIN_WARMUP = 2  # untimed Enqueues per client of (c) and (h) per round, before the start line: its connection
BATCH_WARMUP = 1  # untimed batched cycles of (e) before the first round
DEFAULT_FSYNC_TRIES = 300  # (g)
FSYNC_APPEND_BYTES = 1024  # (g): appended before each timed fsync
FSYNC_WARMUP = 10  # (g): untimed tries first
REFERENCE_WINDOW = CYCLE_DEFAULTS.window  # (f): bench.cycle's messages per round
REFERENCE_WARMUP = CYCLE_DEFAULTS.warmup  # (f): messages per cycle of a discarded run first, as bench.cycle does
REFERENCE_KEYS = ("1", "100")  # (f): bench.cycle's cycles, against (a)/(b) and against (e)
# (f): cycle `1` once more in rounds of one message, so that each step applies one command, as the live
# one-at-a-time cycle's do: what the processor alone does with the live cycle's group shape
SINGLES = "1-singles"

SERVER_START_S = 60.0
SERVER_STOP_S = 15.0
REQUEST_TIMEOUT_S = 60.0  # one request: far beyond any latency measured, so only a hang fails
STRACE_ATTACH_S = 10.0
STRACE_STOP_S = 15.0
IDLE_WINDOW_S = 1.0  # (d): fsyncs of the server with nothing sent
REPO = Path(__file__).resolve().parent.parent

Samples = list[float]  # seconds


# -- the service -------------------------------------------------------------------------


class Server(ServiceProcess):
    """`keyload run --data ROOT --listen 127.0.0.1:0` as a child process; serving once ROOT/server.json
    names its URL."""

    def __init__(self, root: Path, *arguments: str) -> None:
        super().__init__(["--data", str(root), "--listen", "127.0.0.1:0", *arguments], SERVER_STOP_S)
        self.url = ""
        address = root / ADDRESS_FILE

        def listening() -> bool:
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.url = json.loads(address.read_text())["url"]
            return bool(self.url)

        self.wait_for(listening, SERVER_START_S, f"did not write {address}")


# -- the workload ------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    message_id: str  # also the command id of its Enqueue (the HTTP path: its Idempotency-Key)
    body: bytes
    encoded: str  # the body in base64, as the JSON route takes it (made before the clock starts)


class Messages:
    """Seeded UUID4 ids and seeded random bodies, as the other benchmarks make them."""

    def __init__(self, body_bytes: int) -> None:
        self.rng = random.Random(SEED)
        self.body_bytes = body_bytes
        self.lock = threading.Lock()

    def take(self, count: int) -> list[Message]:
        with self.lock:
            taken = []
            for _ in range(count):
                body = self.rng.randbytes(self.body_bytes)
                message_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
                taken.append(Message(message_id, body, base64.b64encode(body).decode("ascii")))
            return taken


def split(count: int, parts: int) -> list[int]:
    """`count` in `parts` near-equal shares."""
    return [count // parts + (1 if part < count % parts else 0) for part in range(parts)]


# -- the two paths -----------------------------------------------------------------------


class Side(ABC):
    """A client of one path: enqueue a message, receive one (its id, body and token), ack a token.
    Each call returns once the command's outcome is in hand; a refusal or a wrong answer is a BenchError."""

    name: ClassVar[str]

    @abstractmethod
    def enqueue(self, domain: str, queue: str, message: Message) -> None: ...

    @abstractmethod
    def receive(self) -> tuple[str, bytes, str]: ...

    @abstractmethod
    def ack(self, token: str) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class SdkPath(Side):
    """keyload.Client(DIR): the file log appended to by this process (an fsync per append), the outcome
    polled for on its own reply partition (not the server's)."""

    name = "SDK"

    def __init__(self, root: Path, reply_partition: int) -> None:
        self.client = Client(root, timeout_s=REQUEST_TIMEOUT_S, reply_partition=reply_partition)

    def enqueue(self, domain: str, queue: str, message: Message) -> None:
        try:
            result = self.client.enqueue(
                domain, queue, message.body, message_id=message.message_id, command_id=message.message_id
            )
        except KeyloadError as exc:
            raise BenchError(f"SDK enqueue {message.message_id}: {type(exc).__name__}: {exc}") from exc
        if result.message_id != message.message_id:
            raise BenchError(f"SDK enqueue {message.message_id} answered for message {result.message_id}")

    def receive(self) -> tuple[str, bytes, str]:
        try:
            deliveries = self.client.receive(DOMAIN, QUEUE, max_messages=1).deliveries
        except KeyloadError as exc:
            raise BenchError(f"SDK receive: {type(exc).__name__}: {exc}") from exc
        if len(deliveries) != 1:
            raise BenchError(f"SDK receive(max_messages=1) delivered {len(deliveries)} messages, not 1")
        return deliveries[0].message_id, deliveries[0].body, deliveries[0].token

    def ack(self, token: str) -> None:
        try:
            state = self.client.ack(DOMAIN, token).state
        except KeyloadError as exc:
            raise BenchError(f"SDK ack: {type(exc).__name__}: {exc}") from exc
        if state != "acked":
            raise BenchError(f"an SDK ack left its message {state}")

    def close(self) -> None:
        self.client.close()


class HttpPath(Side):
    """One httpx.Client (one keep-alive connection) on the API, with the administrator's bearer token."""

    name = "HTTP"

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=REQUEST_TIMEOUT_S)
        self.statuses: Counter[int] = Counter()

    def _post(self, what: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        """The committed result of a POST; any other answer (a non-200 status, a refusal) is a BenchError."""
        try:
            response = self.http.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise BenchError(f"HTTP {what}: {type(exc).__name__}: {exc}") from exc
        self.statuses[response.status_code] += 1
        if response.status_code != 200:
            raise BenchError(f"HTTP {what}: status {response.status_code}: {response.text[:1000]}")
        outcome = response.json()
        if outcome.get("status") != "committed":
            raise BenchError(f"HTTP {what}: status 200 with outcome {response.text[:1000]}")
        return outcome["result"]

    def enqueue(self, domain: str, queue: str, message: Message) -> None:
        result = self._post(
            f"enqueue {message.message_id}",
            f"/v1/domains/{domain}/queues/{queue}/messages",
            {"message_id": message.message_id, "body": message.encoded},
            {"Idempotency-Key": message.message_id},
        )
        if result["message_id"] != message.message_id:
            raise BenchError(f"HTTP enqueue {message.message_id} answered for message {result['message_id']}")

    def receive(self) -> tuple[str, bytes, str]:
        deliveries = self._post("receive", f"/v1/domains/{DOMAIN}/queues/{QUEUE}/receive", {"max_messages": 1})[
            "deliveries"
        ]
        if len(deliveries) != 1:
            raise BenchError(f"HTTP receive (max_messages 1) delivered {len(deliveries)} messages, not 1")
        delivery = deliveries[0]
        return delivery["message_id"], base64.b64decode(delivery["body"]), delivery["token"]

    def ack(self, token: str) -> None:
        state = self._post("ack", f"/v1/domains/{DOMAIN}/leases/ack", {"token": token})["state"]
        if state != "acked":
            raise BenchError(f"an HTTP ack left its message {state}")

    # (e): the batched cycle

    def enqueue_batch(self, domain: str, queue: str, messages: Sequence[Message]) -> None:
        """One Batch command of an Enqueue mutation per message (its Idempotency-Key: the first message's id)."""
        mutations = [
            {"mutation": {"Enqueue": {"queue": queue, "message_id": message.message_id, "body": message.encoded}}}
            for message in messages
        ]
        command_id = f"batch-{messages[0].message_id}"
        results = self._post(
            f"batch {command_id}",
            f"/v1/domains/{domain}/batch",
            {"mutations": mutations},
            {"Idempotency-Key": command_id},
        )["results"]
        ids = [result.get("EnqueueResult", {}).get("message_id") for result in results]
        if ids != [message.message_id for message in messages]:
            raise BenchError(f"HTTP batch {command_id} of {len(messages)} Enqueues answered {str(results)[:1000]}")

    def receive_many(self, domain: str, queue: str, count: int) -> list[tuple[str, bytes, str]]:
        """One Receive of up to `count` messages: (id, body, token) of each delivery."""
        deliveries = self._post(
            f"receive (max_messages {count})", f"/v1/domains/{domain}/queues/{queue}/receive", {"max_messages": count}
        )["deliveries"]
        return [(d["message_id"], base64.b64decode(d["body"]), d["token"]) for d in deliveries]

    def ack_batch(self, domain: str, tokens: list[str]) -> None:
        results = self._post(
            f"ack-batch of {len(tokens)}", f"/v1/domains/{domain}/leases/ack-batch", {"tokens": tokens}
        )["results"]
        refused = [result for result in results if result["status"] != "committed"]
        if len(results) != len(tokens) or refused:
            raise BenchError(f"HTTP ack-batch of {len(tokens)} tokens: {len(results)} results, refused {refused[:3]}")

    def close(self) -> None:
        self.http.close()


# -- measuring -------------------------------------------------------------------------


@dataclass
class Tally:
    """A measured phase, summed over its rounds."""

    count: int = 0  # cycles, or Enqueues
    seconds: float = 0.0  # wall clock of the timed loops
    client_cpu_s: float = 0.0  # this process, all threads, over the timed loops
    server_cpu_s: float | None = 0.0  # `keyload run`, all threads (None without /proc)
    processors_cpu_s: float | None = 0.0  # its service thread: processors and HTTP API (None without /proc)
    latencies: dict[str, Samples] = field(default_factory=dict)  # per measured step, seconds
    round_p50_ms: list[float] = field(default_factory=list)  # of the whole cycle (of an Enqueue), per round

    def add(self, count: int, seconds: float, cpu: Cpu) -> None:
        self.count += count
        self.seconds += seconds
        self.client_cpu_s += cpu.client
        if cpu.server is None or self.server_cpu_s is None or self.processors_cpu_s is None:
            self.server_cpu_s = self.processors_cpu_s = None
        else:
            self.server_cpu_s += cpu.server[0]
            self.processors_cpu_s += cpu.server[1]

    def add_round(self, count: int, seconds: float, cpu: Cpu, latencies: dict[str, Samples], headline: str) -> None:
        """One timed round: its totals, its latencies by step, and the p50 of its `headline` step."""
        self.add(count, seconds, cpu)
        self.round_p50_ms.append(1000 * percentile(latencies[headline], 50))
        for step, samples in latencies.items():
            self.latencies.setdefault(step, []).extend(samples)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else math.inf

    def ms(self, step: str, q: int) -> float:
        return 1000 * percentile(self.latencies[step], q)

    def max_ms(self, step: str) -> float:
        return 1000 * max(self.latencies[step])

    def cpu_us(self, seconds: float | None) -> float | None:
        return None if seconds is None else 1e6 * seconds / self.count


def server_cpu_s(pid: int) -> tuple[float, float] | None:
    """CPU of `keyload run`: all its threads (exited ones included), and its service thread alone, which
    runs the processors and the HTTP API's event loop (the others: the main thread, which waits for it,
    the GC worker, the API's worker threads). A `keyload run` of before the service thread ran the
    processors on its main thread: that one then. None where there is no /proc."""
    service = process_cpu_s(pid, service_thread(pid))
    every = process_cpu_s(pid)
    return None if service is None or every is None else (every, service)


def service_thread(pid: int) -> int:
    """The thread id of `keyload run`'s service thread, or its main thread's. It is named in the OS,
    and the threads it starts (the GC worker, the API's workers) inherit the name: it is the first."""
    named = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == SERVICE_THREAD:
                named.append(int(task.name))
    return min(named, default=pid)


def process_cpu_s(pid: int, thread: int | None = None) -> float | None:
    """User + system CPU of a process (all threads) or of one of its threads, from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cpu:
    client: float  # this process
    server: tuple[float, float] | None  # `keyload run`: (all threads, service thread)


class CpuWatch:
    """CPU of this process and of `keyload run` from here on."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.client = time.process_time()
        self.server = server_cpu_s(server_pid)

    def spent(self) -> Cpu:
        client, server = time.process_time(), server_cpu_s(self.server_pid)
        if server is None or self.server is None:
            return Cpu(client - self.client, None)
        return Cpu(client - self.client, (server[0] - self.server[0], server[1] - self.server[1]))


CYCLE_STEPS = ("enqueue", "received", "ack", "cycle")


def run_cycles(path: Side, messages: list[Message], tally: Tally | None, server_pid: int) -> None:
    """Cycles one at a time: enqueue → receive(max_messages=1) → ack; each received message must be the
    one just enqueued, with its body. Timed into `tally` (None: untimed)."""
    clock = time.perf_counter
    steps: list[Samples] = [[] for _ in CYCLE_STEPS]
    enqueued, received, acked, whole = steps
    cpu = CpuWatch(server_pid)
    start = clock()
    for message in messages:
        sent = clock()
        path.enqueue(DOMAIN, QUEUE, message)
        in_hand = clock()
        message_id, body, token = path.receive()
        delivered = clock()
        path.ack(token)
        done = clock()
        if message_id != message.message_id or body != message.body:
            raise BenchError(
                f"{path.name} received {message_id} after enqueueing {message.message_id}, or another body"
            )
        enqueued.append(in_hand - sent)
        received.append(delivered - sent)  # produce → received: from the enqueue call to the delivery in hand
        acked.append(done - delivered)
        whole.append(done - sent)
    seconds = clock() - start
    if tally is not None:
        tally.add_round(len(messages), seconds, cpu.spent(), dict(zip(CYCLE_STEPS, steps, strict=True)), "cycle")


def run_batches(
    http: HttpPath, domain: str, batches: list[list[Message]], tally: Tally | None, server_pid: int
) -> None:
    """(e): batched cycles one at a time: one Batch of Enqueues → one Receive of as many → one AckBatch of
    their tokens; the Receive must deliver exactly the batch's messages, in order, with their bodies.
    Timed into `tally` (None: untimed); its count is messages, its latencies per batched cycle."""
    clock = time.perf_counter
    steps: list[Samples] = [[] for _ in CYCLE_STEPS]
    enqueued, received, acked, whole = steps
    count = 0
    cpu = CpuWatch(server_pid)
    start = clock()
    for batch in batches:
        sent = clock()
        http.enqueue_batch(domain, BATCH_QUEUE, batch)
        in_hand = clock()
        deliveries = http.receive_many(domain, BATCH_QUEUE, len(batch))
        delivered = clock()
        http.ack_batch(domain, [token for _, _, token in deliveries])
        done = clock()
        if [(message_id, body) for message_id, body, _ in deliveries] != [(m.message_id, m.body) for m in batch]:
            raise BenchError(f"HTTP receive of {len(batch)} did not deliver the batch just enqueued, in order")
        count += len(batch)
        enqueued.append(in_hand - sent)
        received.append(delivered - sent)
        acked.append(done - delivered)
        whole.append(done - sent)
    seconds = clock() - start
    if tally is not None:
        tally.add_round(count, seconds, cpu.spent(), dict(zip(CYCLE_STEPS, steps, strict=True)), "cycle")


def run_fanin(
    url: str, token: str, domain: str, per_client: list[list[Message]], tally: Tally | None, server_pid: int
) -> Counter[int]:
    """One thread per client, each with its own httpx.Client: FANIN_WARMUP untimed Enqueues (the connection),
    then all released together on their own messages, one at a time. Wall clock from the release until the
    last client finishes. Returns the HTTP statuses seen."""
    clients = len(per_client)
    start_line, finish_line = threading.Barrier(clients + 1), threading.Barrier(clients + 1)
    samples: list[Samples] = [[] for _ in range(clients)]
    finished = [0.0] * clients
    statuses: list[Counter[int]] = [Counter() for _ in range(clients)]
    failures: list[str] = []
    clock = time.perf_counter

    def work(client: int, warmup: list[Message]) -> None:
        path: HttpPath | None = None
        try:
            path = HttpPath(url, token)
            for message in warmup:
                path.enqueue(domain, FANIN_QUEUE, message)
            start_line.wait()
            mine = samples[client]
            for message in per_client[client]:
                sent = clock()
                path.enqueue(domain, FANIN_QUEUE, message)
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
            if path is not None:
                statuses[client] = path.statuses
                path.close()

    warmups = [messages[:FANIN_WARMUP] for messages in per_client]
    per_client = [messages[FANIN_WARMUP:] for messages in per_client]
    threads = [
        threading.Thread(target=work, args=(client, warmups[client]), name=f"fanin-{client}")
        for client in range(clients)
    ]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        start_line.wait()
    cpu, start = CpuWatch(server_pid), clock()
    with contextlib.suppress(threading.BrokenBarrierError):
        finish_line.wait()
    spent = cpu.spent()
    for thread in threads:
        thread.join()
    if failures:
        raise BenchError(f"(c) {failures[0]}")
    if tally is not None:
        merged = [sample for mine in samples for sample in mine]
        count = sum(len(messages) for messages in per_client)
        tally.add_round(count, max(finished) - start, spent, {"enqueue": merged}, "enqueue")
    return sum(statuses, Counter())


def run_go_cycles(go: GoClient, messages: list[Message], tally: Tally | None, server_pid: int) -> None:
    """(h): run_cycles' cycles from the Go client; its CPU is the client's."""
    cpu = CpuWatch(server_pid)
    job = go.cycles(DOMAIN, QUEUE, [(message.message_id, message.encoded) for message in messages])
    if tally is not None:
        tally.add_round(len(messages), job.seconds, Cpu(job.cpu_s, cpu.spent().server), job.latencies, "cycle")


def run_go_fanin(
    go: GoClient, domain: str, per_client: list[list[Message]], tally: Tally | None, server_pid: int
) -> None:
    """(h): run_fanin's fan-in from the Go client, a goroutine and connection per client."""
    cpu = CpuWatch(server_pid)
    clients = [[(message.message_id, message.encoded) for message in messages] for messages in per_client]
    job = go.fanin(domain, FANIN_QUEUE, FANIN_WARMUP, clients)
    if tally is not None:
        count = sum(len(messages) - FANIN_WARMUP for messages in per_client)
        tally.add_round(count, job.seconds, Cpu(job.cpu_s, cpu.spent().server), job.latencies, "enqueue")


CyclePlayer = Callable[[list[Message], "Tally | None"], None]  # plays cycles of these messages, timed into a tally
FaninPlayer = Callable[[list[list[Message]], "Tally | None"], None]  # plays one fan-in of each client's messages
GO = "Go"  # (h)'s path
ONE, MANY = "one", "many"  # the fan-in players' keys end with which: one client, or --concurrency


def cycle_players(sdk: SdkPath, http: HttpPath, go: GoClient | None, server_pid: int) -> dict[str, CyclePlayer]:
    """(a), (b) and (h)'s cycles, by path name."""

    def python_cycles(path: Side) -> CyclePlayer:
        return lambda messages, tally: run_cycles(path, messages, tally, server_pid)

    players = {path.name: python_cycles(path) for path in (sdk, http)}
    if go is not None:
        players[GO] = lambda messages, tally: run_go_cycles(go, messages, tally, server_pid)
    return players


def fanin_players(
    url: str, token: str, domain: str, go: GoClient | None, server_pid: int, statuses: Counter[int]
) -> dict[str, FaninPlayer]:
    """(c) and (h)'s fan-ins, by key ("HTTP one", "HTTP many", "Go one", "Go many"); the httpx clients' HTTP
    statuses are added to `statuses` (the Go client counts its own)."""

    def httpx_fanin(per_client: list[list[Message]], tally: Tally | None) -> None:
        statuses.update(run_fanin(url, token, domain, per_client, tally, server_pid))

    players: dict[str, FaninPlayer] = {f"HTTP {ONE}": httpx_fanin, f"HTTP {MANY}": httpx_fanin}
    if go is not None:

        def go_fanin(per_client: list[list[Message]], tally: Tally | None) -> None:
            run_go_fanin(go, domain, per_client, tally, server_pid)

        players |= {f"{GO} {ONE}": go_fanin, f"{GO} {MANY}": go_fanin}
    return players


def taking_turns(names: list[str], turn: int) -> list[str]:
    """The order of round `turn`: each name goes first in turn."""
    first = turn % len(names)
    return names[first:] + names[:first]


# -- (d): fsyncs, counted by strace -------------------------------------------------------


def strace_calls(summary: Path) -> int:
    """fsync + fdatasync calls in a `strace -c` summary."""
    calls = 0
    for line in summary.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in ("fsync", "fdatasync"):
            calls += int(fields[3])
    return calls


STRACE = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync"]  # every thread; a summary of the calls


@contextlib.contextmanager
def traced(pid: int, summary: Path) -> Iterator[None]:
    """strace -f -c -e trace=fsync,fdatasync attached to every thread of `pid` for the block; its summary
    goes to `summary` (read it after the block)."""
    tracer = subprocess.Popen(
        [*STRACE, "-o", str(summary), "-p", str(pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert tracer.stderr is not None
        for line in tracer.stderr:
            lines.append(line.rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + STRACE_ATTACH_S
        while not any("attached" in line for line in list(lines)):  # strace says so once it holds every thread
            if tracer.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"strace did not attach to process {pid}: {' / '.join(lines)}")
            time.sleep(0.01)
        yield
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches and writes the summary
            try:
                tracer.wait(STRACE_STOP_S)
            except subprocess.TimeoutExpired:
                tracer.kill()
                tracer.wait()
        reader.join(STRACE_STOP_S)


SDK_CHILD = "import sys; from bench.server import sdk_enqueues; sdk_enqueues(*sys.argv[1:])"


def sdk_enqueues(root: str, domain: str, queue: str, count: str, body_bytes: str) -> None:
    """(d)'s SDK workload, run in a child process under strace: `count` Enqueues one at a time."""
    messages = Messages(int(body_bytes))
    messages.rng.seed(f"{SEED}-fsync")
    path = SdkPath(Path(root), sdk_reply_partition(DataDir.open(root)))
    try:
        for message in messages.take(int(count)):
            path.enqueue(domain, queue, message)
    finally:
        path.close()


def spare_domain(prefix: str, partitions: int, taken: Sequence[str]) -> str:
    """A domain on a partition none of `taken` is on, where there is one: (c) and (d)'s, then (e)'s, so that
    their processor does not step over the rows the cycles' acked leases left behind (bench/README.md:
    bench.cycle's caveats). With too few partitions, one shared with as few of `taken` as any."""
    busy = Counter(partition_for(domain, partitions) for domain in taken)
    fewest = min(busy.get(partition, 0) for partition in range(partitions))
    for number in itertools.count():
        domain = f"{prefix}-{number}"
        if busy.get(partition_for(domain, partitions), 0) == fewest:
            return domain
    raise AssertionError("unreachable")


def sdk_reply_partition(data: DataDir) -> int:
    """The SDK client's reply partition: one of its own, as the server's commands name none (the
    server is answered in process), so the SDK never tails the server's outcomes."""
    return data.outcome_partitions - 1


@dataclass(frozen=True)
class FsyncCount:
    label: str
    messages: int
    server: int  # fsync + fdatasync calls of `keyload run`, all threads
    client: int | None  # of the client process, when it is not this one (the SDK child)


def count_fsyncs(
    root: Path, work: Path, server: Server, token: str, domain: str, messages: Messages, count: int, clients: int
) -> tuple[list[FsyncCount], int, Counter[int]]:
    """(d): per workload, the fsyncs of the server (and of the SDK client) while it runs; then the
    server's over IDLE_WINDOW_S with nothing sent. Untimed."""
    counts = []
    statuses: Counter[int] = Counter()
    server_summary, client_summary = work / "strace-server-sdk.txt", work / "strace-client-sdk.txt"
    with traced(server.pid, server_summary):
        sdk_child = [sys.executable, "-c", SDK_CHILD, str(root), domain, FANIN_QUEUE, str(count)]
        sdk_child.append(str(messages.body_bytes))
        child = subprocess.run(
            [*STRACE, "-o", str(client_summary), "--", *sdk_child],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    if child.returncode != 0:
        raise BenchError(f"(d) the SDK client under strace exited with status {child.returncode}:\n{child.stderr}")
    counts.append(FsyncCount("SDK, 1 client", count, strace_calls(server_summary), strace_calls(client_summary)))

    for label, fanin in (("HTTP, 1 client", 1), (f"HTTP, {clients} clients", clients)):
        summary = work / f"strace-server-http-{fanin}.txt"
        shares = split(count, fanin)
        with traced(server.pid, summary):
            per_client = [messages.take(FANIN_WARMUP + n) for n in shares]
            statuses += run_fanin(server.url, token, domain, per_client, None, server.pid)
        # the warm-up Enqueues were traced too: they count as messages
        counts.append(FsyncCount(label, count + FANIN_WARMUP * fanin, strace_calls(summary), None))

    idle = work / "strace-server-idle.txt"
    with traced(server.pid, idle):
        time.sleep(IDLE_WINDOW_S)
    return counts, strace_calls(idle), statuses


# -- (f) and (g): the references, measured in this process --------------------------------


@dataclass(frozen=True)
class Reference:
    """(f): bench.cycle's processor-only apply of one of its cycles."""

    key: str  # bench.cycle's cycle key: "1" or "100"
    label: str
    messages: int
    window: int
    records: int  # commands applied in the timed loops
    seconds: float  # wall clock of the step() loops
    cpu_seconds: float  # this thread's CPU in them

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_rate(self) -> float:
        return self.messages / self.cpu_seconds if self.cpu_seconds > 0 else math.inf


def warm_references(work: Path, body_bytes: int) -> None:
    """A discarded run of REFERENCE_WARMUP messages of each of (f)'s cycles, as bench.cycle's warm-up: imports,
    schema parsing, RocksDB start-up, allocator growth."""
    if REFERENCE_WARMUP:
        for key in REFERENCE_KEYS:
            run = ReferenceRun(work / f"reference-{key}-warmup", key, REFERENCE_WARMUP, body_bytes)
            try:
                run.play(len(run.pending))
                run.finish()
            finally:
                run.close()


class ReferenceRun:
    """(f): bench.cycle's (a) for one of its cycles on `messages` messages in rounds of `window`, with
    its QueueDriver on a fresh data directory (removed by close()), played a share of its rounds at a time
    between the live rounds, so that the machine's drift falls on both sides of the ratio. As in bench.cycle,
    only the processor's step() loops are timed, and the driver checks every outcome and, in finish(), the
    drained queue."""

    def __init__(
        self, directory: Path, key: str, messages: int, body_bytes: int, window: int = REFERENCE_WINDOW
    ) -> None:
        self.directory = directory
        self.cycle = {cycle.key: cycle for cycle in REFERENCE_CYCLES}[key]
        self.messages = messages
        self.window = min(window, messages)
        self.pending = list(rounds(messages, self.window))  # the sizes of the rounds still to play
        self.driver = QueueDriver(directory, self.cycle, body_bytes)
        self.closed = False
        try:
            self.driver.setup(messages, self.window)
        except BaseException:
            self.close()
            raise

    def play(self, count: int) -> None:
        """The next `count` rounds (fewer if fewer are left)."""
        for items in self.pending[:count]:
            self.driver.round(items)
        del self.pending[:count]

    def finish(self) -> Reference:
        """The rounds left, the drained-queue check, and the timing of every round's step() loops."""
        self.play(len(self.pending))
        self.driver.check_drained(self.messages)
        commits = self.driver.store.commits
        assert commits
        watches = self.driver.watches.values()
        return Reference(
            self.cycle.key,
            self.cycle.label,
            self.messages,
            self.window,
            commits[-1][1] - self.driver.first_timed + 1,
            sum(watch.seconds for watch in watches),
            sum(watch.cpu_seconds for watch in watches),
        )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.driver.close()
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)


def fsync_cost(directory: Path, tries: int) -> Samples:
    """(g): os.fsync of a file in `directory` right after appending FSYNC_APPEND_BYTES to it, `tries` times
    (after FSYNC_WARMUP untimed ones); the seconds of each fsync."""
    path = directory / "fsync-probe"
    payload = random.Random(SEED).randbytes(FSYNC_APPEND_BYTES)
    samples: Samples = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fsync(fd)
        for attempt in range(FSYNC_WARMUP + tries):
            if os.write(fd, payload) != len(payload):
                raise BenchError(f"a short write to {path}")
            start = time.perf_counter()
            os.fsync(fd)
            if attempt >= FSYNC_WARMUP:
                samples.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return samples


# -- the run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One of the issue's targets: a ratio measured in this run, against its bound."""

    key: str
    label: str
    measured: str  # the two figures of the ratio, with their unit
    ratio: float
    bound: float | None  # None: reported, no target
    at_least: bool  # the ratio should be >= bound (else <=)

    @property
    def met(self) -> bool | None:
        if self.bound is None:
            return None
        return self.ratio >= self.bound if self.at_least else self.ratio <= self.bound

    def json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "measured": self.measured,
            "ratio": self.ratio,
            "target": None if self.bound is None else f"{'>=' if self.at_least else '<='} {self.bound:g}",
            "met": self.met,
        }


def cycle_ratios(path: Tally, reference: Tally) -> dict[str, float]:
    """`path` / `reference`: above 1 for a rate, below 1 for a latency, means `path` is faster."""
    ratios = {"cycles_per_s": path.rate / reference.rate}
    for step in CYCLE_STEPS:
        for q in (50, 99):
            ratios[f"{step}_p{q}"] = path.ms(step, q) / reference.ms(step, q)
    return ratios


def fanin_ratios(many: Tally, one: Tally) -> dict[str, float]:
    return {
        "enqueues_per_s": many.rate / one.rate,
        "enqueue_p50": many.ms("enqueue", 50) / one.ms("enqueue", 50),
        "enqueue_p99": many.ms("enqueue", 99) / one.ms("enqueue", 99),
    }


@dataclass
class GoRun:
    """(h): the Go client's cycles (as (b)'s) and fan-ins (as (c)'s)."""

    cycles: Tally
    one: Tally
    many: Tally


@dataclass
class Result:
    cycles: int
    clients: int
    messages: int
    batches: int
    body_bytes: int
    rounds: int
    warmup: int
    url: str
    partition: int  # of DOMAIN: (a) and (b)
    fanin_domain: str
    fanin_partition: int
    batch_domain: str
    batch_partition: int
    partitions: int
    sdk_reply_partition: int
    sdk: Tally
    http: Tally
    one: Tally  # (c) with one client
    many: Tally  # (c) with K clients
    batched: Tally  # (e): counts messages; latencies per batched cycle
    fsyncs: list[FsyncCount] | None  # None: no strace
    idle_fsyncs: int | None
    statuses: Counter[int]
    acked_total: int
    batch_acked: int
    fanin_enqueued: int
    fanin_sent: int
    fsync: Samples = field(default_factory=list)  # (g), seconds
    references: dict[str, Reference] = field(default_factory=dict)  # (f), by bench.cycle's cycle key
    go: GoRun | None = None  # (h); None without go on PATH, or with --no-go

    def fsync_ms(self, q: int) -> float:
        return 1000 * percentile(self.fsync, q)

    def targets(self) -> list[Target]:
        """The issue's targets on the httpx client's figures, then on the Go client's ((h)), then the ratios
        reported beside them: (f)'s two group shapes, and (e) against (f)'s cycle `100`."""
        batched, single, singles = self.references["100"], self.references["1"], self.references[SINGLES]
        targets = self._live_targets("", "(b) HTTP", "(c)", self.http, self.one, self.many)
        if self.go is not None:
            targets += self._live_targets("go_", "(h) Go", "(h) Go", self.go.cycles, self.go.one, self.go.many)
        targets.append(
            Target(
                "singles_over_processor_only",
                "(f) cycle 1 msg/s, one command a step / rounds of 500",
                f"{singles.rate:,.0f} / {single.rate:,.0f}",
                singles.rate / single.rate,
                None,
                True,
            )
        )
        targets.append(
            Target(
                "batched_over_processor_only",
                "(e) HTTP batched msg/s / (f) cycle 100 msg/s",
                f"{self.batched.rate:,.0f} / {batched.rate:,.0f}",
                self.batched.rate / batched.rate,
                None,
                True,
            )
        )
        return targets

    def _live_targets(
        self, prefix: str, cycles_label: str, fanin_label: str, cycles: Tally, one: Tally, many: Tally
    ) -> list[Target]:
        single, singles = self.references["1"], self.references[SINGLES]
        received, fsync = cycles.ms("received", 50), self.fsync_ms(50)
        return [
            Target(
                f"{prefix}live_cycle_over_processor_only",
                f"{cycles_label} cycles/s, one at a time / (f) cycle 1 msg/s",
                f"{cycles.rate:,.0f} / {single.rate:,.0f}",
                cycles.rate / single.rate,
                0.5,
                True,
            ),
            Target(
                f"{prefix}live_cycle_over_singles",
                f"{cycles_label} cycles/s, one at a time / (f) cycle 1, one command a step",
                f"{cycles.rate:,.0f} / {singles.rate:,.0f}",
                cycles.rate / singles.rate,
                None,
                True,
            ),
            Target(
                f"{prefix}round_trip_p50_over_fsync_p50",
                f"{cycles_label} produce→received p50 / (g) fsync p50",
                f"{received:.2f} / {fsync:.2f} ms",
                received / fsync,
                3.0,
                False,
            ),
            Target(
                f"{prefix}fanin_k_over_1",
                f"{fanin_label} {self.clients} producers / 1, enqueues/s",
                f"{many.rate:,.0f} / {one.rate:,.0f}",
                many.rate / one.rate,
                4.0,
                True,
            ),
        ]


class Interleaved:
    """(f) and (g), played a share at a time after each round of (a)/(b) (cycle `1` in rounds of 500 and of
    one, and the fsyncs) and of (e) (cycle `100`), with `keyload run` up and idle, so that the machine's drift
    falls on both sides of a ratio."""

    def __init__(
        self, work: Path, single: ReferenceRun, singles: ReferenceRun, batched: ReferenceRun, args: argparse.Namespace
    ) -> None:
        self.work = work
        self.single, self.singles, self.batched = single, singles, batched
        self.single_shares = split(len(single.pending), args.rounds)
        self.singles_shares = split(len(singles.pending), args.rounds)
        self.batched_shares = split(len(batched.pending), args.rounds)
        self.fsync_shares = split(args.fsync_tries, args.rounds)
        self.fsync: Samples = []

    def after_cycles(self, turn: int) -> None:
        self.single.play(self.single_shares[turn])
        self.singles.play(self.singles_shares[turn])
        self.fsync += fsync_cost(self.work, self.fsync_shares[turn])

    def after_batches(self, turn: int) -> None:
        self.batched.play(self.batched_shares[turn])


def measure(root: Path, work: Path, args: argparse.Namespace) -> Result:
    """(f)'s warm-up, then the live run with (f) and (g) interleaved, then (f)'s checks."""
    go_binary = None if args.no_go else build_go_client(work)
    paths = 2 if go_binary is None else 3  # (a), (b) and (h) cycle on one queue
    warm_references(work, args.body_bytes)
    with contextlib.ExitStack() as stack:
        single = ReferenceRun(work / "reference-1", "1", paths * (args.cycles + args.warmup), args.body_bytes)
        stack.callback(single.close)
        singles = ReferenceRun(work / "reference-1-singles", "1", single.messages, args.body_bytes, window=1)
        stack.callback(singles.close)
        batched = ReferenceRun(work / "reference-100", "100", BATCH * (args.batches + BATCH_WARMUP), args.body_bytes)
        stack.callback(batched.close)
        between = Interleaved(work, single, singles, batched, args)
        result = measure_live(root, work, args, between, go_binary)
        result.fsync = between.fsync
        result.references = {"1": single.finish(), SINGLES: singles.finish(), "100": batched.finish()}
    return result


def measure_live(
    root: Path, work: Path, args: argparse.Namespace, between: Interleaved, go_binary: Path | None
) -> Result:
    server = Server(root)
    go: GoClient | None = None
    statuses: Counter[int] = Counter()
    try:
        data = DataDir.open(root)
        token = Credential.load(credential_path(root, ADMIN_PRINCIPAL)).bearer_token
        messages = Messages(args.body_bytes)
        total = fanin_total(args)
        fanin = spare_domain("bench-fanin", data.partitions, [DOMAIN])
        batch_domain = spare_domain("bench-batch", data.partitions, [DOMAIN, fanin])
        reply = sdk_reply_partition(data)
        sdk = SdkPath(root, reply)
        http = HttpPath(server.url, token)
        try:
            if go_binary is not None:
                go = GoClient(go_binary, server.url, token, work / "go-client.err")
            sdk.client.create_queue(DOMAIN, QUEUE)
            policy = QueuePolicySpec(max_stored_messages=total, max_stored_bytes=max(1, total * args.body_bytes))
            sdk.client.create_queue(fanin, FANIN_QUEUE, policy)
            sdk.client.create_queue(batch_domain, BATCH_QUEUE, QueuePolicySpec(receive_max_messages=BATCH))
            players = cycle_players(sdk, http, go, server.pid)
            for play in players.values():
                play(messages.take(args.warmup), None)
            results = {name: Tally() for name in players}
            for turn, size in enumerate(split(args.cycles, args.rounds)):
                for name in taking_turns(list(players), turn):
                    players[name](messages.take(size), results[name])
                    server.check_alive()
                between.after_cycles(turn)

            batched = Tally()
            run_batches(http, batch_domain, [messages.take(BATCH) for _ in range(BATCH_WARMUP)], None, server.pid)
            for turn, size in enumerate(split(args.batches, args.rounds)):
                run_batches(http, batch_domain, [messages.take(BATCH) for _ in range(size)], batched, server.pid)
                server.check_alive()
                between.after_batches(turn)
            statuses += http.statuses
            counters = sdk.client.inspect_queue(DOMAIN, QUEUE).counters
            batch_counters = sdk.client.inspect_queue(batch_domain, BATCH_QUEUE).counters
        finally:
            sdk.close()
            http.close()

        fanins = fanin_players(server.url, token, fanin, go, server.pid, statuses)
        fanin_results = {key: Tally() for key in fanins}
        fanin_sent = 0
        for turn, size in enumerate(split(args.messages, args.rounds)):
            for key in taking_turns(list(fanins), turn):
                clients = args.concurrency if key.endswith(MANY) else 1
                per_client = [messages.take(FANIN_WARMUP + size) for _ in range(clients)]
                fanins[key](per_client, fanin_results[key])
                fanin_sent += clients * (FANIN_WARMUP + size)
                server.check_alive()

        fsyncs = idle = None
        if shutil.which("strace") is not None and not args.no_strace:
            fsyncs, idle, seen = count_fsyncs(
                root, work, server, token, fanin, messages, args.fsync_messages, args.concurrency
            )
            statuses += seen
            fanin_sent += sum(count.messages for count in fsyncs)
        with Client(root, timeout_s=REQUEST_TIMEOUT_S, reply_partition=reply) as client:
            fanin_counters = client.inspect_queue(fanin, FANIN_QUEUE).counters
    finally:
        try:
            if go is not None:
                go.close()
                statuses += go.statuses
        finally:
            status = server.stop()
    if status != 0 or any("halted" in line for line in server.lines):
        raise BenchError(f"`keyload run` exited with status {status}:\n{server.tail()}")
    cycles = len(results) * (args.cycles + args.warmup)
    if (counters.acked_total, counters.stored_messages, counters.leased) != (cycles, 0, 0):
        raise BenchError(
            f"the cycles' queue counts {counters.acked_total} acked, {counters.stored_messages} stored and "
            f"{counters.leased} leased after {cycles} cycles"
        )
    batch_messages = BATCH * (args.batches + BATCH_WARMUP)
    if (batch_counters.acked_total, batch_counters.stored_messages, batch_counters.leased) != (batch_messages, 0, 0):
        raise BenchError(
            f"the batched cycles' queue counts {batch_counters.acked_total} acked, {batch_counters.stored_messages} "
            f"stored and {batch_counters.leased} leased after {batch_messages} messages"
        )
    if fanin_counters.enqueued_total != fanin_sent or fanin_counters.stored_messages != fanin_sent:
        raise BenchError(
            f"the fan-in queue counts {fanin_counters.enqueued_total} enqueued and {fanin_counters.stored_messages} "
            f"stored for {fanin_sent} Enqueues"
        )
    return Result(
        args.cycles,
        args.concurrency,
        args.messages,
        args.batches,
        args.body_bytes,
        args.rounds,
        args.warmup,
        server.url,
        partition_for(DOMAIN, data.partitions),
        fanin,
        partition_for(fanin, data.partitions),
        batch_domain,
        partition_for(batch_domain, data.partitions),
        data.partitions,
        reply,
        results["SDK"],
        results["HTTP"],
        fanin_results[f"HTTP {ONE}"],
        fanin_results[f"HTTP {MANY}"],
        batched,
        fsyncs,
        idle,
        statuses,
        counters.acked_total,
        batch_counters.acked_total,
        fanin_counters.enqueued_total,
        fanin_sent,
        go=None if go is None else GoRun(results[GO], fanin_results[f"{GO} {ONE}"], fanin_results[f"{GO} {MANY}"]),
    )


# -- reporting -------------------------------------------------------------------------


def _opt(value: float | None) -> str:
    return "n/a" if value is None else f"{round(value):,}"  # round(): no "-0"


def tally_json(tally: Tally, steps: Sequence[str]) -> dict[str, Any]:
    return {
        "count": tally.count,
        "seconds": tally.seconds,
        "per_s": tally.rate,
        "round_p50_ms": tally.round_p50_ms,
        "latency_ms": {
            step: {"p50": tally.ms(step, 50), "p99": tally.ms(step, 99), "max": tally.max_ms(step)} for step in steps
        },
        "client_cpu_us_per_item": tally.cpu_us(tally.client_cpu_s),
        "server_cpu_us_per_item": tally.cpu_us(tally.server_cpu_s),
        "server_main_thread_cpu_us_per_item": tally.cpu_us(tally.processors_cpu_s),
    }


def to_json(result: Result, command: str, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "bench.server",
        "command": command,
        "cycles_per_path": result.cycles,
        "concurrency": result.clients,
        "messages_per_client": result.messages,
        "batched_cycles": result.batches,
        "batch_messages": BATCH,
        "body_bytes": result.body_bytes,
        "rounds": result.rounds,
        "warmup_cycles": result.warmup,
        "partition": result.partition,
        "fanin_domain": result.fanin_domain,
        "fanin_partition": result.fanin_partition,
        "batch_domain": result.batch_domain,
        "batch_partition": result.batch_partition,
        "partitions": result.partitions,
        "cycles": {"sdk": tally_json(result.sdk, CYCLE_STEPS), "http": tally_json(result.http, CYCLE_STEPS)},
        "cycle_ratios_http_over_sdk": cycle_ratios(result.http, result.sdk),
        "fanin": {"1": tally_json(result.one, ["enqueue"]), str(result.clients): tally_json(result.many, ["enqueue"])},
        "fanin_ratios_k_over_1": fanin_ratios(result.many, result.one),
        "batched": tally_json(result.batched, CYCLE_STEPS),
        "processor_only": {
            key: {
                "label": ref.label,
                "messages": ref.messages,
                "window": ref.window,
                "records": ref.records,
                "seconds": ref.seconds,
                "cpu_seconds": ref.cpu_seconds,
                "messages_per_s": ref.rate,
                "messages_per_cpu_s": ref.cpu_rate,
            }
            for key, ref in result.references.items()
        },
        "fsync_ms": {
            "tries": len(result.fsync),
            "append_bytes": FSYNC_APPEND_BYTES,
            "p50": result.fsync_ms(50),
            "p99": result.fsync_ms(99),
            "max": 1000 * max(result.fsync),
        },
        "go_client": None if result.go is None else go_json(result.go, result),
        "targets": {target.key: target.json() for target in result.targets()},
        "fsyncs": None
        if result.fsyncs is None
        else {
            "workloads": [
                {"label": c.label, "messages": c.messages, "server": c.server, "client": c.client}
                for c in result.fsyncs
            ],
            "idle_server_per_s": (result.idle_fsyncs or 0) / IDLE_WINDOW_S,
        },
        "http_statuses": {str(code): n for code, n in sorted(result.statuses.items())},
        "checks": {
            "cycles_acked": result.acked_total,
            "batched_acked": result.batch_acked,
            "fanin_enqueued": result.fanin_enqueued,
        },
        "versions": {
            "keyload": importlib.metadata.version("keyload"),
            "httpx": importlib.metadata.version("httpx"),
            "uvicorn": importlib.metadata.version("uvicorn"),
        },
        "environment": env,
    }


def go_json(go: GoRun, result: Result) -> dict[str, Any]:
    return {
        "cycles": tally_json(go.cycles, CYCLE_STEPS),
        "cycle_ratios_go_over_httpx": cycle_ratios(go.cycles, result.http),
        "fanin": {"1": tally_json(go.one, ["enqueue"]), str(result.clients): tally_json(go.many, ["enqueue"])},
        "fanin_ratios_k_over_1": fanin_ratios(go.many, go.one),
    }


STEP_LABELS = {"enqueue": "enqueue", "received": "enq→received", "ack": "ack", "cycle": "cycle"}
BATCH_STEP_LABELS = {"enqueue": "batch", "received": "batch→received", "ack": "ack-batch", "cycle": "cycle"}
LABEL = 34  # the first column of the tables


def _row(label: str, values: Sequence[str]) -> str:
    return (f"{label:<{LABEL}}" + "".join(f" {value:>11}" for value in values)).rstrip()


def _tally_rows(
    tallies: Sequence[Tally],
    steps: Sequence[str],
    unit: str,
    ratios: dict[str, float],
    labels: dict[str, str] = STEP_LABELS,
) -> list[str]:
    """The rows of one comparison: a column per tally, then the ratio of the last to the first (when there
    is more than one)."""
    compared = len(tallies) > 1
    blank = [""] if compared else []

    def ratio(key: str) -> list[str]:
        return [f"{ratios[key]:.2f}" if key in ratios else ""] if compared else []

    rows = [
        _row(f"{unit}s", [f"{t.count:,}" for t in tallies] + blank),
        _row("wall s", [f"{t.seconds:.2f}" for t in tallies] + blank),
        _row(f"{unit}s/s", [f"{t.rate:,.0f}" for t in tallies] + ratio("per_s")),
    ]
    for step in steps:
        for q in (50, 99):
            rows.append(
                _row(f"{labels[step]} p{q} ms", [f"{t.ms(step, q):.2f}" for t in tallies] + ratio(f"{step}_p{q}"))
            )
        rows.append(_row(f"{labels[step]} max ms", [f"{t.max_ms(step):.1f}" for t in tallies] + blank))
    headline = labels[steps[-1]]
    for turn, p50s in enumerate(zip(*(t.round_p50_ms for t in tallies), strict=True)):
        last = [f"{p50s[-1] / p50s[0]:.2f}"] if compared else []
        rows.append(_row(f"{headline} p50 ms, round {turn + 1}", [f"{p50:.2f}" for p50 in p50s] + last))

    def cpu(seconds: Callable[[Tally], float | None]) -> list[str]:
        return [_opt(t.cpu_us(seconds(t))) for t in tallies] + blank

    def others(t: Tally) -> float | None:
        return None if t.server_cpu_s is None or t.processors_cpu_s is None else t.server_cpu_s - t.processors_cpu_s

    rows += [
        _row(f"client cpu µs/{unit}", cpu(lambda t: t.client_cpu_s)),
        _row(f"server cpu µs/{unit}", cpu(lambda t: t.server_cpu_s)),
        _row("  service thread (processors, API)", cpu(lambda t: t.processors_cpu_s)),
        _row("  other threads (GC, API workers)", cpu(others)),
    ]
    return rows


def table(result: Result, command: str, env: dict[str, Any]) -> str:
    k = result.clients
    lines = [
        "keyload bench.server: the HTTP API against the local SDK, one `keyload run --listen` on the embedded file "
        f"log, body {result.body_bytes} B",
        f"{result.url}; {result.partitions} partitions: (a) and (b) in domain {DOMAIN} (partition {result.partition}), "
        f"(c), (d) and (h) in {result.fanin_domain} (partition {result.fanin_partition}), (e) in {result.batch_domain} "
        f"(partition {result.batch_partition}); outcomes: the SDK client's on "
        f"partition {result.sdk_reply_partition}, the server's in process",
        f"python {env['python']}, httpx {importlib.metadata.version('httpx')}, "
        f"uvicorn {importlib.metadata.version('uvicorn')}, {env['cpus']} cpus, load {env['load_average_1m']:.2f}; "
        f"{result.rounds} rounds, taking turns at going first; warm-up of {result.warmup} cycles per path excluded",
        "",
        _row(f"cycles, one at a time ({result.cycles})", ["(a) SDK", "(b) HTTP", "HTTP / SDK"]),
        *_tally_rows([result.sdk, result.http], CYCLE_STEPS, "cycle", _cycle_ratios(result.http, result.sdk)),
        "(a cycle: enqueue → receive(max_messages=1) → ack. Latency: from the call until its outcome is in hand; "
        "enq→received: from the enqueue call until the receive that delivered it returned. cpu: over the timed "
        "loops, all threads of this process (client) and of `keyload run` (server))",
        "",
        _row(f"(c) HTTP fan-in ({result.messages} each)", ["1 client", f"{k} clients", f"{k} / 1"]),
        *_tally_rows([result.one, result.many], ["enqueue"], "enqueue", _fanin_ratios(result.many, result.one)),
        "(Enqueues one at a time per client, each client a thread with its own httpx.Client, all released together; "
        "wall: from the release until the last client finished)",
        "",
        *_go_rows(result),
    ]
    if result.fsyncs is None:
        lines.append("(d) fsyncs per message: not counted (no strace on PATH, or --no-strace)")
    else:
        lines.append(_row("(d) fsyncs per message", ["messages", "server", "per message", "client", "per message"]))
        for c in result.fsyncs:
            client = "n/a" if c.client is None else f"{c.client / c.messages:.3f}"
            values = [f"{c.messages:,}", f"{c.server:,}", f"{c.server / c.messages:.3f}", _opt(c.client), client]
            lines.append(_row(c.label, values))
        lines.append(
            "(strace -f -c -e trace=fsync,fdatasync attached to `keyload run`, untimed; it slows the traced process, "
            "which may batch more than in (c). The SDK client runs in a child process under strace of its own; the "
            f"HTTP clients are this process, which never fsyncs. Idle server: {result.idle_fsyncs} fsyncs in "
            f"{IDLE_WINDOW_S:g} s)"
        )
    lines += [
        "",
        _row(f"(e) HTTP batched cycles ({result.batches} x {BATCH})", ["(e) HTTP"]),
        *_tally_rows([result.batched], CYCLE_STEPS, "message", {}, BATCH_STEP_LABELS),
        f"(a batched cycle: one POST …/batch of {BATCH} Enqueue mutations (one command) → one POST …/receive "
        f'{{"max_messages": {BATCH}}} → one POST …/leases/ack-batch of its {BATCH} tokens. Latencies are per batched '
        "cycle (batch→received: from the batch call until the receive returned); rates and cpu per message)",
        "",
        *_reference_rows(result),
        "",
        *_target_rows(result.targets()),
        "",
        "checks: every response 200 and committed (HTTP statuses: "
        + ", ".join(f"{code}: {n:,}" for code, n in sorted(result.statuses.items()))
        + "); each receive delivered the message(s) just enqueued, with their bodies; the cycles' queue: "
        f"{result.acked_total:,} acked, the batched cycles' {result.batch_acked:,}, none stored; the fan-in queue: "
        f"{result.fanin_enqueued:,} enqueued; `keyload run` exited 0; (f) checked as bench.cycle checks it",
        f"command: {command}",
    ]
    return "\n".join(lines)


def _cycle_ratios(path: Tally, reference: Tally) -> dict[str, float]:
    return {key.replace("cycles_per_s", "per_s"): value for key, value in cycle_ratios(path, reference).items()}


def _fanin_ratios(many: Tally, one: Tally) -> dict[str, float]:
    return {key.replace("enqueues_per_s", "per_s"): value for key, value in fanin_ratios(many, one).items()}


def _go_rows(result: Result) -> list[str]:
    """(h): the Go client's cycles beside (b)'s, and its fan-in."""
    if result.go is None:
        return ["(h) the Go client: not run (no go on PATH, or --no-go)", ""]
    go, k = result.go, result.clients
    return [
        _row(f"(h) Go client, cycles ({result.cycles})", ["(b) httpx", "(h) Go", "Go / httpx"]),
        *_tally_rows([result.http, go.cycles], CYCLE_STEPS, "cycle", _cycle_ratios(go.cycles, result.http)),
        _row(f"(h) Go client, fan-in ({result.messages} each)", ["1 client", f"{k} clients", f"{k} / 1"]),
        *_tally_rows([go.one, go.many], ["enqueue"], "enqueue", _fanin_ratios(go.many, go.one)),
        "(bench/go/httpclient, standard library only: (b)'s cycles on one keep-alive connection, taking turns with "
        "(a) and (b) on the same queue; (c)'s fan-in with a goroutine and a connection per client, taking turns "
        "with (c). client cpu: the Go process's, over its timed loops)",
        "",
    ]


def _reference_rows(result: Result) -> list[str]:
    """(f) and (g)."""
    columns = ["messages", "window", "records", "wall s", "msg/s", "cpu s", "msg/cpu-s"]
    rows = [_row("(f) processor-only (bench.cycle)", columns)]
    for ref in result.references.values():
        values = [f"{ref.messages:,}", f"{ref.window:,}", f"{ref.records:,}", f"{ref.seconds:.2f}", f"{ref.rate:,.0f}"]
        rows.append(_row(f"`{ref.key}` {ref.label}", [*values, f"{ref.cpu_seconds:.2f}", f"{ref.cpu_rate:,.0f}"]))
    rows += [
        "(bench.cycle's cycles in this process, through its QueueDriver: rounds of "
        f"{REFERENCE_WINDOW} messages (its default; `1` once more in rounds of one message, window 1, so that each "
        "step applies one command, as in the live one-at-a-time cycle), each cycle on as many messages as its live "
        f"queue saw, warm-ups included ((a)+(b)(+(h))'s for `1`, (e)'s for `100`), after a discarded run of "
        f"{REFERENCE_WARMUP}; played a share of the rounds after each round of (a)/(b) (`1`) or of (e) (`100`), "
        "`keyload run` idle meanwhile. Timed: PartitionProcessor.step() only (no appends or their fsyncs, no "
        "HTTP); msg/s is by wall clock, as the live rates are)",
        f"(g) fsync after a {FSYNC_APPEND_BYTES} B append, {len(result.fsync)} tries: "
        f"p50 {result.fsync_ms(50):.3f} ms, p99 {result.fsync_ms(99):.3f} ms, max {1000 * max(result.fsync):.3f} ms "
        "(os.fsync of a file in the bench's temporary directory, next to the data directory; a share of the tries "
        "after each round of (a)/(b))",
    ]
    return rows


def _target_rows(targets: Sequence[Target]) -> list[str]:
    """The issue's targets: each ratio measured in this run against its bound."""
    width = max(len(target.label) for target in targets)
    measured = max(len(target.measured) for target in targets)

    def row(label: str, values: Sequence[str]) -> str:
        return f"{label:<{width}}  {values[0]:>{measured}}  {values[1]:>7}  {values[2]:>7}  {values[3]}"

    rows = [row("targets, as ratios in this run", ["measured", "ratio", "target", "met"])]
    for target in targets:
        bound = "none" if target.bound is None else f"{'≥' if target.at_least else '≤'} {target.bound:g}"
        met = {True: "met", False: "NOT MET", None: "-"}[target.met]
        rows.append(row(target.label, [target.measured, f"{target.ratio:.2f}", bound, met]))
    return rows


# -- the command line --------------------------------------------------------------------


def fanin_total(args: argparse.Namespace) -> int:
    """Every Enqueue of (c), (d) and (h), warm-ups included: the fan-in queue's quota."""
    clients: int = args.concurrency
    per_client: int = args.messages + (args.rounds + 1) * FANIN_WARMUP
    fsync_messages: int = args.fsync_messages
    go = not args.no_go and shutil.which("go") is not None
    clients_sides = 2 if go else 1  # (c)'s httpx clients, and (h)'s Go clients unless skipped
    return clients_sides * (clients + 1) * per_client + 3 * fsync_messages


def _check_sizes(args: argparse.Namespace) -> None:
    if args.rounds < 1 or min(args.cycles, args.messages, args.batches) < args.rounds:
        raise BenchError("--rounds must be >= 1, and --cycles, --messages and --batches at least --rounds")
    if min(args.concurrency, args.fsync_messages, args.fsync_tries) < 1 or args.warmup < 0:
        raise BenchError("--concurrency, --fsync-messages and --fsync-tries must be >= 1, --warmup >= 0")
    if not 0 <= args.body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        raise BenchError(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    total = fanin_total(args)
    if total > INTEGER_FIELDS["max_stored_messages"].maximum:
        raise BenchError("more fan-in Enqueues than the largest max_stored_messages a queue may have")
    if total * args.body_bytes > INTEGER_FIELDS["max_stored_bytes"].maximum:
        raise BenchError("the fan-in Enqueues' bodies exceed the largest max_stored_bytes a queue may have")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cycles", type=int, default=DEFAULT_CYCLES, help="cycles of (a), (b) and (h) each (default %(default)s)"
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=DEFAULT_BATCHES,
        help=f"batched cycles of {BATCH} messages of (e) (default %(default)s)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="HTTP clients of (c) and (h) (default %(default)s)"
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        help="Enqueues per client of (c) and (h) (default %(default)s)",
    )
    parser.add_argument(
        "--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="message body size (default %(default)s)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="rounds (a)/(b), (c) and (e) are split into (default %(default)s)",
    )
    parser.add_argument(
        "--warmup", type=int, default=DEFAULT_WARMUP, help="untimed cycles per path first (default %(default)s)"
    )
    parser.add_argument(
        "--fsync-messages",
        type=int,
        default=DEFAULT_FSYNC_MESSAGES,
        help="Enqueues per workload of (d) (default %(default)s)",
    )
    parser.add_argument(
        "--fsync-tries", type=int, default=DEFAULT_FSYNC_TRIES, help="timed fsyncs of (g) (default %(default)s)"
    )
    parser.add_argument("--no-strace", action="store_true", help="skip (d), the fsync count")
    parser.add_argument("--no-go", action="store_true", help="skip (h), the Go client")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    try:
        _check_sizes(args)
    except BenchError as exc:
        parser.error(str(exc))
    command = shlex.join(["python", "-m", "bench.server", *(sys.argv[1:] if argv is None else argv)])

    root = Path(tempfile.mkdtemp(prefix="keyload-bench-server-", dir=args.dir))
    try:
        result = measure(root / "data", root, args)
        env = environment(args.warmup, root)
        print(
            json.dumps(to_json(result, command, env), indent=2) if args.json else table(result, command, env),
            flush=True,
        )
    except BenchError as exc:
        print(f"bench.server: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
