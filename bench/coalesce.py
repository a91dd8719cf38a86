"""Concurrent producers and consumers over HTTP, one command per message against coalescing (the SDK's,
the server's), in one run.

    python -m bench.coalesce [--threads K] [--messages N] [--rounds R] [--linger-ms L] [--json]

A fresh `keyload run` (HTTP API on loopback, the embedded file log) and one `Client` of it shared by
K threads (default 16), each enqueuing (or acking) its N/K messages of 1 KiB (default N = 8,000) in
a queue (or topic) of its workload's own, in nine ways taken in turns (R rounds, default 3):

- (a) **lone**: each thread calls `client.enqueue` and waits for the answer before the next: one
  Enqueue command (one request) per message. The reference.
- (b) **coalesced, each call waited for**: each thread hands its message to one shared
  `Coalescer` (linger L ms, default 0; up to 100 messages a Batch) and waits for its future before
  the next: the same calling pattern as (a), its messages carried in Batches with the other
  threads'.
- (c) **coalesced, fire and collect**: each thread hands in all its messages, then waits for
  their futures.
- (d) **raw lone**: each thread posts its message as raw bytes to the HTTP API's enqueue route
  (`POST /v1/domains/D/queues/Q/messages`, through one shared `httpx.Client`) and waits for the
  answer: (e)'s reference, one Enqueue command a request.
- (e) **coalesced by the server**: (d) with `Keyload-Coalesce: true`: the server carries
  concurrent requests in Batches (keyload/server/coalescing.py). Its commands are the Batches the
  server's `/metrics` counts.
- (f) **raw lone ack**: the queue is filled and its messages leased first (untimed); then each
  thread posts one lease's ack (`POST /v1/domains/D/leases/ack`) and waits for the answer: (g)'s
  reference, one Ack command a request.
- (g) **acks coalesced by the server**: (f) with `Keyload-Coalesce: true`: the server carries
  concurrent acks in AckBatches, counted as (e)'s.
- (h) **raw lone group ack**: as (f) for a subscription group: the topic is published to and its
  group's positions leased first (untimed); then each thread posts one position's ack (`POST
  /v1/domains/D/topics/T/groups/g/ack`) and waits for the answer: (i)'s reference, one GroupAck
  command a request.
- (i) **group acks coalesced by the server**: (h) with `Keyload-Coalesce: true`: the server carries
  concurrent acks in GroupAckBatches, counted as (e)'s.

Each workload's first WARMUP messages of each thread are untimed. Reported per workload: the median messages
per second (wall clock from the threads' release to the last answer), the CPU per message of
`keyload run` (every thread) and of this process, the commands sent per message, and but for (c)
the p50 and p99 of one call's wait; then the ratios of (b) and (c) to (a), and
of (e) to (d), (g) to (f) and (i) to (h). Every workload's queue must hold exactly its messages
afterwards (`enqueued_total`; `acked_total` for (f) and (g), the group's for (h) and (i)), or the run
fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from keyload import Client, Coalescer, Credential, Event, GroupPolicySpec, QueuePolicySpec
from keyload.limits import MAX_GROUP_RECEIVE_EVENTS, MAX_GROUP_WINDOW, MAX_IN_FLIGHT, MAX_PUBLISH_EVENTS
from keyload.sdk.coalescer import DEFAULT_LINGER_MS
from keyload.sdk.results import EnqueueResult

from .common import BenchError, measured
from .server import Server, process_cpu_s

DEFAULT_THREADS = 16
DEFAULT_MESSAGES = 8_000
DEFAULT_ROUNDS = 3
WARMUP = 10  # untimed messages of each thread before each timed workload
BODY = b"x" * 1024
RAW = {"Content-Type": "application/octet-stream"}
SERVER_COALESCED = {**RAW, "Keyload-Coalesce": "true"}
DOMAIN = "bench"
WORKLOADS = (
    "lone",
    "coalesced-waited",
    "coalesced-collected",
    "raw-lone",
    "server-coalesced",
    "raw-lone-ack",
    "server-coalesced-ack",
    "raw-lone-group-ack",
    "server-coalesced-group-ack",
)
ACKING = ("raw-lone-ack", "server-coalesced-ack")  # workloads that ack leases instead of enqueuing
GROUP_ACKING = ("raw-lone-group-ack", "server-coalesced-group-ack")  # ... a group's leases (its topic named so)
RATIOS = (
    ("coalesced-waited", "lone"),
    ("coalesced-collected", "lone"),
    ("server-coalesced", "raw-lone"),
    ("server-coalesced-ack", "raw-lone-ack"),
    ("server-coalesced-group-ack", "raw-lone-group-ack"),
)
# The server's /metrics: the commands of a kind it appended and answered.
ANSWERED = 'keyload_outcome_latency_seconds_count{{kind="{}"}}'
LEASE_MS = 600_000  # (f) to (i) lease their messages before the clock starts: the leases outlive the run
GROUP = "g"  # (h) and (i)'s group on their topic
# The server's coalescing workloads: the kind of the commands that carry their requests.
CARRIED_BY = {
    "server-coalesced": "Batch",
    "server-coalesced-ack": "AckBatch",
    "server-coalesced-group-ack": "GroupAckBatch",
}
# The workloads that send one command a message (what (a) and the raw workloads are the reference of).
ONE_COMMAND_A_MESSAGE = ("lone", "raw-lone", "raw-lone-ack", "raw-lone-group-ack")


@dataclass(frozen=True)
class Run:
    workload: str
    messages: int
    wall_s: float
    server_cpu_s: float
    client_cpu_s: float
    commands: int
    waits_s: list[float]


Calls = Callable[[str, int, list[float]], None]  # one thread's calls: (queue, messages, waits out)
Leases = dict[str, deque[str]]  # the tokens of each acking workload's queue (or topic), taken by its threads


def calls_of(client: Client, coalescer: Coalescer, http: httpx.Client, leases: Leases) -> dict[str, Calls]:
    def lone(queue: str, count: int, waits: list[float]) -> None:
        for _ in range(count):
            started = time.perf_counter()
            client.enqueue(DOMAIN, queue, BODY)
            waits.append(time.perf_counter() - started)

    def waited(queue: str, count: int, waits: list[float]) -> None:
        for _ in range(count):
            started = time.perf_counter()
            coalescer.enqueue(queue, BODY).result()
            waits.append(time.perf_counter() - started)

    def collected(queue: str, count: int, _: list[float]) -> None:
        futures: list[Future[EnqueueResult]] = [coalescer.enqueue(queue, BODY) for _ in range(count)]
        for future in futures:
            future.result()

    def posted(headers: dict[str, str]) -> Calls:
        def post(queue: str, count: int, waits: list[float]) -> None:
            path = f"/v1/domains/{DOMAIN}/queues/{queue}/messages"
            for _ in range(count):
                timed_post(http, path, waits, content=BODY, headers=headers)

        return post

    def acked(path: str, headers: dict[str, str]) -> Calls:
        def ack(resource: str, count: int, waits: list[float]) -> None:
            route = path.format(resource=resource)
            for _ in range(count):
                timed_post(http, route, waits, json={"token": leases[resource].popleft()}, headers=headers)

        return ack

    lease_ack, group_ack = (
        f"/v1/domains/{DOMAIN}/leases/ack",
        f"/v1/domains/{DOMAIN}/topics/{{resource}}/groups/{GROUP}/ack",
    )
    coalesce = {"Keyload-Coalesce": "true"}

    ways = (
        lone,
        waited,
        collected,
        posted(RAW),
        posted(SERVER_COALESCED),
        acked(lease_ack, {}),
        acked(lease_ack, coalesce),
        acked(group_ack, {}),
        acked(group_ack, coalesce),
    )
    return dict(zip(WORKLOADS, ways, strict=True))


def timed_post(http: httpx.Client, path: str, waits: list[float], **request: Any) -> None:
    """One request, answered 200, its wait appended to `waits`."""
    started = time.perf_counter()
    response = http.post(path, **request)
    if response.status_code != 200:
        raise BenchError(f"{path} was answered {response.status_code}: {response.text[:200]}")
    waits.append(time.perf_counter() - started)


def answered(http: httpx.Client, kind: str) -> int:
    """The commands of `kind` the server has appended and answered (its /metrics)."""
    series = ANSWERED.format(kind)
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(series):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def leased(client: Client, coalescer: Coalescer, queue: str, count: int) -> deque[str]:
    """The tokens of `count` messages enqueued to `queue` and leased for LEASE_MS (untimed set-up)."""
    for future in [coalescer.enqueue(queue, BODY) for _ in range(count)]:
        future.result()
    tokens: deque[str] = deque()
    while len(tokens) < count:
        deliveries = client.receive(DOMAIN, queue, max_messages=100, lease_ms=LEASE_MS).deliveries
        if not deliveries:
            raise BenchError(f"{queue} has {len(tokens)} messages to lease, not {count}")
        tokens.extend(delivery.token for delivery in deliveries)
    return tokens


def group_leased(client: Client, topic: str, count: int) -> deque[str]:
    """The tokens of `count` events published to `topic` and leased by its group for LEASE_MS (untimed
    set-up)."""
    client.create_topic(DOMAIN, topic)
    for first in range(0, count, MAX_PUBLISH_EVENTS):
        events = [Event(f"e{n}", "t", BODY) for n in range(first, min(first + MAX_PUBLISH_EVENTS, count))]
        client.publish(DOMAIN, topic, events)
    policy = GroupPolicySpec(max_window=MAX_GROUP_WINDOW, max_lease_ms=LEASE_MS)
    client.create_group(DOMAIN, topic, GROUP, policy=policy)
    tokens: deque[str] = deque()
    while len(tokens) < count:
        receive = client.group_receive(DOMAIN, topic, GROUP, max_events=MAX_GROUP_RECEIVE_EVENTS, lease_ms=LEASE_MS)
        if not receive.deliveries:
            raise BenchError(f"{topic}'s group has {len(tokens)} positions to lease, not {count}")
        tokens.extend(delivery.token for delivery in receive.deliveries)
    return tokens


def run(calls: Calls, workload: str, queue: str, threads: int, per_thread: int, server_pid: int) -> Run:
    """K threads producing at once after a warm-up of their own; the run's wall time, CPU and waits."""
    waits: list[list[float]] = [[] for _ in range(threads)]
    release = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)

    def thread(index: int) -> None:
        calls(queue, WARMUP, [])
        release.wait()
        calls(queue, per_thread, waits[index])
        done.wait()

    workers = [threading.Thread(target=thread, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    release.wait()
    server_cpu, client_cpu, started = process_cpu_s(server_pid) or 0.0, time.process_time(), time.perf_counter()
    done.wait()
    wall = time.perf_counter() - started
    spent = Run(
        workload,
        threads * per_thread,
        wall,
        (process_cpu_s(server_pid) or 0.0) - server_cpu,
        time.process_time() - client_cpu,
        0,
        [wait for mine in waits for wait in mine],
    )
    for worker in workers:
        worker.join()
    return spent


def measure(directory: Path, threads: int, messages: int, rounds: int, linger_ms: int) -> dict[str, Any]:
    per_thread = messages // threads
    if per_thread < 1:
        raise BenchError("--messages must be at least --threads")
    root = directory / "data"
    server = Server(root)
    runs: list[Run] = []
    try:
        credential = Credential.load(root / "credentials" / "keyload-admin.json")
        bearer = {"Authorization": f"Bearer {credential.bearer_token}"}
        with (
            Client(server.url, credential=credential) as client,
            Coalescer(client, DOMAIN, linger_ms=linger_ms) as coalescer,
            httpx.Client(base_url=server.url, headers=bearer, timeout=60) as http,
        ):
            leases: Leases = {}
            by_workload = calls_of(client, coalescer, http, leases)
            total = threads * (per_thread + WARMUP)
            policy = QueuePolicySpec(receive_max_messages=100, max_lease_ms=LEASE_MS, max_in_flight=MAX_IN_FLIGHT)
            if total > MAX_GROUP_WINDOW:
                raise BenchError(f"(h) and (i) lease {total} positions at once, more than a group's {MAX_GROUP_WINDOW}")
            for round_ in range(rounds):
                for workload in WORKLOADS:
                    name = f"{workload}-{round_}"  # the workload's queue, or topic
                    if workload in GROUP_ACKING:
                        leases[name] = group_leased(client, name, total)
                    else:
                        client.create_queue(DOMAIN, name, policy)
                    if workload in ACKING:
                        leases[name] = leased(client, coalescer, name, total)
                    before = coalescer.stats.commands, {kind: answered(http, kind) for kind in CARRIED_BY.values()}
                    measured = run(by_workload[workload], workload, name, threads, per_thread, server.pid)
                    carrier = CARRIED_BY.get(workload)
                    if carrier is not None:
                        sent = answered(http, carrier) - before[1][carrier]
                    elif workload in ONE_COMMAND_A_MESSAGE:
                        sent = total
                    else:
                        sent = coalescer.stats.commands - before[0]
                    runs.append(replace(measured, commands=sent))
                    settled = settled_count(client, workload, name)
                    if settled != total:
                        raise BenchError(f"{name} counts {settled} messages settled, not {total}")
                    server.check_alive()
            coalescer.close()
    finally:
        server.stop()
    return {**summary(runs, threads, per_thread), "linger_ms": linger_ms}


def settled_count(client: Client, workload: str, name: str) -> int:
    """What a workload's queue (or group) counts as settled: enqueued, or acked."""
    if workload in GROUP_ACKING:
        return client.group_status(DOMAIN, name, GROUP).acked_total
    counters = client.inspect_queue(DOMAIN, name).counters
    return counters.acked_total if workload in ACKING else counters.enqueued_total


def median_of(runs: list[Run], figure: Callable[[Run], float]) -> float:
    return statistics.median(figure(run) for run in runs)


def summary(runs: list[Run], threads: int, per_thread: int) -> dict[str, Any]:
    workloads: dict[str, Any] = {}
    for workload in WORKLOADS:
        mine = [run for run in runs if run.workload == workload]
        waits = sorted(wait for run in mine for wait in run.waits_s)
        workloads[workload] = {
            "messages_per_s": [round(run.messages / run.wall_s) for run in mine],
            "median_messages_per_s": round(median_of(mine, lambda run: run.messages / run.wall_s)),
            "server_cpu_us_per_message": round(median_of(mine, lambda run: 1e6 * run.server_cpu_s / run.messages)),
            "client_cpu_us_per_message": round(median_of(mine, lambda run: 1e6 * run.client_cpu_s / run.messages)),
            "commands_per_message": round(
                median_of(mine, lambda run: run.commands / (run.messages + threads * WARMUP)), 3
            ),
            "wait_p50_ms": round(1e3 * waits[len(waits) // 2], 2) if waits else None,
            "wait_p99_ms": round(1e3 * waits[int(len(waits) * 0.99)], 2) if waits else None,
        }
    return {
        "threads": threads,
        "messages_per_thread": per_thread,
        "rounds": len(runs) // len(WORKLOADS),
        "workloads": workloads,
        "ratios": {
            f"{workload} / {reference}": round(
                workloads[workload]["median_messages_per_s"] / workloads[reference]["median_messages_per_s"], 2
            )
            for workload, reference in RATIOS
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"keyload bench.coalesce: {result['threads']} threads x {result['messages_per_thread']} messages of "
        f"{len(BODY)} B, one shared Client over HTTP, "
        f"linger {result['linger_ms']} ms, {result['rounds']} rounds (medians)",
        f"python {sys.version.split()[0]}; {result['environment']['cpus']} cpus",
        "",
        f"{'':28} {'msg/s':>8} {'runs':>22} {'server µs/msg':>14} {'client µs/msg':>14} {'cmd/msg':>8}"
        f" {'wait p50 ms':>12} {'p99 ms':>8}",
    ]
    for workload, figures in result["workloads"].items():
        shown = ", ".join(f"{rate:,}" for rate in figures["messages_per_s"])
        p50 = "-" if figures["wait_p50_ms"] is None else f"{figures['wait_p50_ms']:.2f}"
        p99 = "-" if figures["wait_p99_ms"] is None else f"{figures['wait_p99_ms']:.2f}"
        lines.append(
            f"{workload:28} {figures['median_messages_per_s']:>8,} {shown:>22}"
            f" {figures['server_cpu_us_per_message']:>14,} {figures['client_cpu_us_per_message']:>14,}"
            f" {figures['commands_per_message']:>8} {p50:>12} {p99:>8}"
        )
    lines.append("")
    for name, ratio in result["ratios"].items():
        lines.append(f"{name}, msg/s: {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coalesce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="calling threads (default 16)")
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES, help="timed messages per workload (8,000)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="turns of the nine workloads (default 3)")
    parser.add_argument("--linger-ms", type=int, default=DEFAULT_LINGER_MS, help="the coalescer's (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measured(
        "coalesce", lambda directory: measure(directory, args.threads, args.messages, args.rounds, args.linger_ms)
    )
    if result is None:
        return 1
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
