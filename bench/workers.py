"""`keyload run --workers W` against one process, over the same log, measured in one run.

    python -m bench.workers [--commands N] [--domains D] [--workers W] [--rounds R] [--json]

One data directory gets D domains, an equal number on each partition (default 4 over the default 4
partitions: one each), each a CreateQueue and N/D Enqueues of 1 KiB with reply_to set, signed by
the administrator's credential, as local clients append them. Copies of it are then caught up by
`keyload run --until-idle --listen none --workers K` for K = 1 and W, in turns (1, W, 1, W, ...,
R rounds): the wall time from start to exit (start-up included: the workers' own is part of the
price), the wall time from the run's "serving" line (every worker started) to exit, and the CPU
time of the process tree. Reported: the commands per second of each run both ways, the median of
each K, the ratios of the medians W / 1 (issue 17's target: at least 1.6 for W = 2 on 4 domains),
and whether every partition's projection digest is the same in every copy (it must be: a
partition is applied by one processor whichever process runs it).

Then (b), the HTTP API: a fresh `keyload run --workers K` (K = 1 and W, in turns, R rounds) with a
queue in each domain, and HTTP_CLIENTS Go clients (bench/go/httpclient, one connection each, client
i on domain i % D) enqueuing 1 KiB messages one at a time each, all at once: Enqueues per second
from their release to the last answer, and the CPU per Enqueue of `keyload run` and its workers
together, with the Enqueues' p99 latency and the median time of a `/metrics` scrape every 0.5 s
meanwhile (with workers it reads their projections too). The API is served by worker 0 alone, so
this shows what moving processors off its core gives the server. Without `go` on PATH, (b) is left out and says so.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from keyload import Client
from keyload.credentials import ADMIN_PRINCIPAL, Credential, credential_path
from keyload.log.base import partition_for
from keyload.processors.policy import default_spec
from keyload.projections.store import Store
from keyload.service.runtime import MAX_GROUP_RECORDS
from keyload.storage.datadir import DataDir
from keyload.storage.principals import system_credential

from .common import KEYLOAD_RUN, BenchError, encode_command, measured
from .go_client import GoClient, build
from .server import Server
from .throughput import CREATE_QUEUE, ENQUEUE

DEFAULT_COMMANDS = 40_000
DEFAULT_DOMAINS = 4
DEFAULT_WORKERS = 2
DEFAULT_ROUNDS = 3
BODY_BYTES = 1024
RUN_TIMEOUT_S = 900.0
HTTP_CLIENTS = 16
HTTP_WARMUP = 20  # untimed Enqueues of each client first
HTTP_MESSAGES = 1000  # timed Enqueues of each client (long enough for the workers to fill memtables)
SCRAPE_EVERY_S = 0.5  # (b)'s /metrics scrapes, meanwhile
# No Tick (the interval outlasts the run) and no GC worker (`--gc-interval-s 0`): every copy's log
# stays the same, so every copy's projections must be too.
NO_TICKS = ["--tick-interval-ms", "3600000"]


@dataclass(frozen=True)
class HttpRun:
    workers: int
    enqueues_per_s: float
    cpu_us_per_enqueue: float  # `keyload run` and its workers together
    enqueue_p99_ms: float
    scrape_ms: float  # median time of a /metrics scrape meanwhile


@dataclass(frozen=True)
class Run:
    workers: int
    seconds: float  # wall clock, start to exit
    serving_seconds: float  # wall clock, from the "serving" line (every worker started) to exit
    cpu_seconds: float  # user + system of the process tree


def domains(count: int, partitions: int) -> list[str]:
    """`count` domain names, as many on each partition as on any other (count a multiple of partitions)."""
    if count % partitions:
        raise BenchError(f"--domains must be a multiple of the {partitions} partitions")
    chosen: dict[int, list[str]] = {partition: [] for partition in range(partitions)}
    n = 0
    while any(len(names) < count // partitions for names in chosen.values()):
        name = f"tenant-{n}"
        n += 1
        names = chosen[partition_for(name, partitions)]
        if len(names) < count // partitions:
            names.append(name)
    return [name for names in chosen.values() for name in names]


def prepare(root: Path, commands: int, tenants: list[str]) -> int:
    """The served data directory (access control on), then each tenant's queue and its share of the
    Enqueues appended; the number of commands appended."""
    done = subprocess.run([*KEYLOAD_RUN, "--data", str(root), "--until-idle", "--listen", "none"], capture_output=True)
    if done.returncode != 0:
        raise BenchError(f"`keyload run` could not make {root}: {done.stdout.decode()}{done.stderr.decode()}")
    data = DataDir.open(root)
    admin = system_credential(root, ADMIN_PRINCIPAL)
    body = os.urandom(BODY_BYTES)
    share = commands // len(tenants)
    policy = {**default_spec(), "max_stored_messages": share, "max_stored_bytes": share * BODY_BYTES}
    appended = 0
    log = data.command_log()
    try:
        for tenant in tenants:
            create = {"queue": "q", "policy": policy}
            values = [encode_command(str(uuid.uuid4()), CREATE_QUEUE, create, ADMIN_PRINCIPAL, tenant)]
            for _ in range(share):
                message_id = str(uuid.uuid4())
                enqueue: dict[str, Any] = {"queue": "q", "message_id": message_id, "body": body, "headers": {}}
                enqueue |= {"ordering_key": None, "not_before_ms": None, "expires_at_ms": None}
                values.append(encode_command(message_id, ENQUEUE, enqueue, ADMIN_PRINCIPAL, tenant))
            signed = [admin.sign(value) for value in values]
            partition = partition_for(tenant, data.partitions)
            for at in range(0, len(signed), MAX_GROUP_RECORDS):
                log.append(partition, signed[at : at + MAX_GROUP_RECORDS])
            appended += len(signed)
    finally:
        log.close()
    return appended


def catch_up(root: Path, workers: int) -> Run:
    """`keyload run --until-idle` over `root` with `workers` workers, timed."""
    arguments = ["--data", str(root), "--until-idle", "--listen", "none", "--gc-interval-s", "0", *NO_TICKS]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(
        [*KEYLOAD_RUN, *arguments, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    serving = None
    output = []
    for line in process.stdout:
        output.append(line)
        if serving is None and line.startswith("keyload: serving"):
            serving = time.perf_counter()
    code = process.wait(RUN_TIMEOUT_S)
    ended = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0 or serving is None:
        raise BenchError(f"`keyload run --workers {workers}` failed: {''.join(output)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(workers, ended - started, ended - serving, cpu)


def tree_cpu_s(pid: int) -> float:
    """User + system CPU of a process and of its children (the workers), from /proc."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(entry.name) == pid or int(fields[1]) == pid:
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def http_fanin(root: Path, workers: int, tenants: list[str], binary: Path) -> HttpRun:
    """(b): HTTP_CLIENTS Go clients enqueuing at once over `tenants`, against `keyload run --workers`."""
    server = Server(root, "--workers", str(workers))
    try:
        credential = Credential.load(credential_path(root, ADMIN_PRINCIPAL))
        with Client(server.url, credential=credential) as admin:
            for tenant in tenants:
                admin.create_queue(tenant, "q")
        body = base64.b64encode(os.urandom(BODY_BYTES)).decode()
        batches = [[(str(uuid.uuid4()), body) for _ in range(HTTP_WARMUP + HTTP_MESSAGES)] for _ in range(HTTP_CLIENTS)]
        go = GoClient(binary, server.url, credential.bearer_token, root.parent / "go.err")
        scrapes = Scrapes(server.url, credential.bearer_token)
        try:
            before = tree_cpu_s(server.pid)
            job = go.fanin(tenants[0], "q", HTTP_WARMUP, batches, tenants)
            spent = tree_cpu_s(server.pid) - before
        finally:
            scrapes.stop()
            go.close()
    finally:
        server.stop()
    enqueued = HTTP_CLIENTS * (HTTP_WARMUP + HTTP_MESSAGES)
    latencies = sorted(job.latencies["enqueue"])
    return HttpRun(
        workers,
        HTTP_CLIENTS * HTTP_MESSAGES / job.seconds,
        spent / enqueued * 1e6,
        latencies[int(len(latencies) * 0.99)] * 1000,
        statistics.median(scrapes.ms) if scrapes.ms else math.nan,
    )


class Scrapes:
    """A Prometheus server's part: GET /metrics every SCRAPE_EVERY_S on a thread of its own, timed."""

    def __init__(self, url: str, token: str) -> None:
        self.ms: list[float] = []
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        self._thread = threading.Thread(target=self._scrape, daemon=True)
        self._thread.start()

    def _scrape(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY_S):
            started = time.perf_counter()
            if self._client.get("/metrics").status_code == 200:
                self.ms.append((time.perf_counter() - started) * 1000)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


def digests(root: Path, partitions: int) -> list[str]:
    found = []
    for partition in range(partitions):
        store = Store(root / "projections" / f"p-{partition:04d}", read_only=True)
        try:
            found.append(store.digest())
        finally:
            store.close()
    return found


def measure(directory: Path, commands: int, tenants: int, workers: int, rounds: int) -> dict[str, Any]:
    source = directory / "source"
    data_partitions = DataDir.create(source).partitions
    appended = prepare(source, commands, domains(tenants, data_partitions))
    runs: list[Run] = []
    seen: set[tuple[str, ...]] = set()
    for round_ in range(rounds):
        for count in (1, workers):
            copy = directory / f"r{round_}-w{count}"
            shutil.copytree(source, copy)
            runs.append(catch_up(copy, count))
            seen.add(tuple(digests(copy, data_partitions)))
            shutil.rmtree(copy)

    binary = build(directory)
    http: list[HttpRun] = []
    if binary is not None:
        tenant_names = domains(tenants, data_partitions)
        for round_ in range(rounds):
            for count in (1, workers):
                http.append(http_fanin(directory / f"http-r{round_}-w{count}", count, tenant_names, binary))

    def http_median(count: int) -> dict[str, float]:
        mine = [run for run in http if run.workers == count]
        return {
            "enqueues_per_s": statistics.median(run.enqueues_per_s for run in mine),
            "cpu_us_per_enqueue": statistics.median(run.cpu_us_per_enqueue for run in mine),
            "enqueue_p99_ms": statistics.median(run.enqueue_p99_ms for run in mine),
            "scrape_ms": statistics.median(run.scrape_ms for run in mine),
        }

    def median_rate(count: int, serving: bool = False) -> float:
        return statistics.median(
            appended / (run.serving_seconds if serving else run.seconds) for run in runs if run.workers == count
        )

    return {
        "commands": appended,
        "domains": tenants,
        "partitions": data_partitions,
        "workers": workers,
        "runs": [asdict(run) for run in runs],
        "median_rate": {1: median_rate(1), workers: median_rate(workers)},
        "median_serving_rate": {1: median_rate(1, True), workers: median_rate(workers, True)},
        "ratio": median_rate(workers) / median_rate(1),
        "serving_ratio": median_rate(workers, True) / median_rate(1, True),
        "digests_equal": len(seen) == 1,
        "http": None
        if not http
        else {
            "clients": HTTP_CLIENTS,
            "runs": [asdict(run) for run in http],
            "median": {1: http_median(1), workers: http_median(workers)},
            "ratio": http_median(workers)["enqueues_per_s"] / http_median(1)["enqueues_per_s"],
        },
    }


def table(result: dict[str, Any]) -> str:
    workers = result["workers"]
    commands = result["commands"]
    lines = [
        f"{commands:,} commands ({result['domains']} domains over {result['partitions']} partitions), "
        f"caught up by `keyload run --until-idle`; 'serving': from its serving line (every worker started) on",
        f"{'workers':>8} {'seconds':>9} {'serving s':>10} {'CPU s':>8} {'commands/s':>11} {'serving/s':>10}",
    ]
    lines += [
        f"{run['workers']:>8} {run['seconds']:>9.2f} {run['serving_seconds']:>10.2f} {run['cpu_seconds']:>8.2f} "
        f"{commands / run['seconds']:>11,.0f} {commands / run['serving_seconds']:>10,.0f}"
        for run in result["runs"]
    ]
    rate, serving = result["median_rate"], result["median_serving_rate"]
    lines.append(
        f"medians, commands/s: 1 worker {rate[1]:,.0f} ({serving[1]:,.0f} serving), {workers} workers "
        f"{rate[workers]:,.0f} ({serving[workers]:,.0f} serving)"
    )
    lines.append(
        f"ratio {workers}/1: {result['ratio']:.2f} start to exit, {result['serving_ratio']:.2f} serving "
        "(issue 17's target: >= 1.6 for 2 workers)"
    )
    lines.append(f"every partition's digest the same in every copy: {'yes' if result['digests_equal'] else 'NO'}")
    http = result["http"]
    if http is None:
        lines.append("(b) HTTP fan-in: left out, no `go` on PATH")
        return "\n".join(lines)
    lines.append(
        f"(b) HTTP: {http['clients']} Go clients enqueuing at once over the {result['domains']} domains "
        "(server CPU: keyload run and its workers)"
    )
    lines.append(f"{'workers':>8} {'enqueues/s':>11} {'server CPU µs/enqueue':>22} {'p99 ms':>7} {'scrape ms':>10}")
    for run in http["runs"]:
        lines.append(
            f"{run['workers']:>8} {run['enqueues_per_s']:>11,.0f} {run['cpu_us_per_enqueue']:>22,.0f} "
            f"{run['enqueue_p99_ms']:>7.1f} {run['scrape_ms']:>10.1f}"
        )
    median = http["median"]
    lines.append(
        f"medians: 1 worker {median[1]['enqueues_per_s']:,.0f}/s (p99 {median[1]['enqueue_p99_ms']:.1f} ms, scrape "
        f"{median[1]['scrape_ms']:.1f} ms), {workers} workers {median[workers]['enqueues_per_s']:,.0f}/s (p99 "
        f"{median[workers]['enqueue_p99_ms']:.1f} ms, scrape {median[workers]['scrape_ms']:.1f} ms); "
        f"ratio {http['ratio']:.2f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=DEFAULT_COMMANDS, help="Enqueues in all (default 40,000)")
    parser.add_argument("--domains", type=int, default=DEFAULT_DOMAINS, help="a multiple of the partitions (4)")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="measured against 1 (default 2)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="turns of 1 and W workers (default 3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measured(
        "workers", lambda directory: measure(directory, args.commands, args.domains, args.workers, args.rounds)
    )
    if result is None:
        return 1
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0 if result["digests_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
