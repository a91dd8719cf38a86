"""Long-poll and lease deadlines under load: how late past its deadline each one is honoured.

    python -m bench.deadlines [--waiters N] [--leases N] [--queues Q] [--wait-ms W] [--lease-ms L]
                              [--spread-ms S] [--tick-interval-ms I] [--phases waiters,leases] [--json]
                              [--dir PARENT] [--keep]

A real `keyload run` (a child process; its default settings, or `--tick-interval-ms`) serves a
fresh data directory on the embedded file log. Every command is in one domain, so one partition
holds every deadline. Commands are appended in bulk as the SDK appends them (Command envelopes
with command ids and a reply partition, appends of 500 records, a doorbell ring after each), as
fast as the log takes them, and their outcomes are read from the reply partition by this process.
Each phase also counts the Ticks appended and the CPU `keyload run` spent (from /proc) between
its first deadline and its last answer.

(a) waiters: Q queues, nothing enqueued; N long-poll Receives (`wait_ms` = W), round robin over the
    queues, appended at once (the burst: every deadline falls due together), or with `--spread-ms S`
    in appends of 50 paced evenly over S ms (S = W is the steady state of N consumers that poll
    again as soon as a poll ends: N deadlines pending, N/W due each ms). Each must come back empty
    at its deadline = its Receive's evaluation time + W. Per waiter: evaluation lateness = the empty
    outcome's `eval_time_ms` - deadline (log time: when the record that completed it was stamped),
    arrival lateness = the wall clock when this process read the outcome - deadline (what a client
    sees).
(b) leases: Q other queues, N messages enqueued, all received (100 a Receive, one append) with
    `lease_ms` = L and never acked; `retry_base_ms` = 1 h, so each lease expiry leaves its message
    scheduled. Per message, from InspectMessage once none is leased: expiry lateness =
    (`not_before_ms` - `last_retry_delay_ms`) - `lease_until_ms` (the evaluation time of the record
    that expired it, against the deadline its delivery named). The projection, opened read-only
    every 200 ms from the last deadline on (as `keyload drill` opens it: nothing is added to the
    log), gives the wall clock by which no lease was left.

Lateness is never negative (a timer fires only at or after its deadline); the bench says whether
the largest is within `--bound-ms` (default 1,000), and exits 1 only when a deadline was missed
altogether or an outcome was wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from keyload import limits
from keyload.credentials import Credential, contents, credential_path
from keyload.log.base import CommandLog, partition_for
from keyload.log.codec import REGISTRY, Record
from keyload.projections import keys
from keyload.projections.store import Store, StoreError
from keyload.sdk.client import Client
from keyload.sdk.results import QueuePolicySpec
from keyload.service.doorbell import Doorbell
from keyload.service.ticker import DEFAULT_TICK_INTERVAL_MS
from keyload.storage.datadir import DataDir

from .common import COMMAND, DOMAIN, OUTCOME, PRINCIPAL, BenchError, ServiceProcess, create_bench_principal, environment
from .kafka import process_cpu_s

RECEIVE = "keyload.command.Receive"
ENQUEUE = "keyload.command.Enqueue"
INSPECT_MESSAGE = "keyload.command.InspectMessage"
RECEIVE_RESULT = "keyload.result.ReceiveResult"
MESSAGE_VIEW = "keyload.MessageView"
QUEUE_RECORD = "keyload.QueueRecord"

APPEND_CHUNK = 500  # records per append(): one fsync each, as a client batching its commands would
SPREAD_CHUNK = 50  # records per append() when --spread-ms paces them
RECEIVE_BATCH = 100  # messages a lease-phase Receive asks for
SETUP_REPLY = 0  # the Client's reply partition (queue creation)
WAITER_REPLY = 1  # the waiters' outcomes, and nothing else
LEASE_REPLY = 2  # the lease phase's enqueues, receives and inspections
RETRY_BASE_MS = 3_600_000  # an expired lease leaves its message scheduled for an hour: nothing else moves it
SERVICE_START_S = 60.0
SERVICE_STOP_S = 15.0
OUTCOME_TIMEOUT_S = 120.0  # longest wait for an outcome past the moment it is due
OUTCOME_POLL_S = 0.002  # the outcome tail's pause when the reply partition has nothing new
LEASE_POLL_S = 0.2  # read-only looks at the projection from the last lease deadline on (each replays its WAL)
READ_BATCH = 4096
BOUND_MS = 1_000
TICKER_PRINCIPAL = b"keyload-ticker"  # how a Tick record is told apart without decoding it


# -- the service and the client side --------------------------------------------------------


class Service(ServiceProcess):
    """`keyload run --data ROOT` as a child process, serving once it says so."""

    def __init__(self, root: Path, tick_interval_ms: int | None) -> None:
        arguments = ["--data", str(root)]
        if tick_interval_ms is not None:
            arguments += ["--tick-interval-ms", str(tick_interval_ms)]
        super().__init__(arguments, SERVICE_STOP_S)
        serving = "keyload: serving"
        self.wait_for(
            lambda: any(line.startswith(serving) for line in list(self.lines)), SERVICE_START_S, "did not serve"
        )


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def encode(signer: Credential, command_id: str, kind: str, body: Record, reply_to: int) -> bytes:
    """A Command as the SDK writes it, signed by the bench principal."""
    return signer.sign(
        REGISTRY.encode(
            COMMAND,
            {
                "command_id": command_id,
                "domain": DOMAIN,
                "principal": PRINCIPAL,
                "body": (kind, body),
                "reply_to": reply_to,
                "client_time_ms": wall_ms(),
            },
        )
    )


@dataclass(frozen=True)
class Arrived:
    outcome: Record
    wall_ms: int  # when this process read it


class OutcomeTail:
    """Reads one reply partition from its current end, in a thread, keeping each outcome by command id."""

    def __init__(self, data: DataDir, partition: int) -> None:
        self.log = data.outcome_log()
        self.partition = partition
        self.cursor = self.log.end_offset(partition)
        self.arrived: dict[str, Arrived] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            records = self.log.read(self.partition, self.cursor, READ_BATCH)
            if not records:
                self._stop.wait(OUTCOME_POLL_S)
                continue
            now = wall_ms()
            for record in records:
                outcome = REGISTRY.decode(OUTCOME, contents(record.value))
                self.arrived[outcome["command_id"]] = Arrived(outcome, now)
                self.cursor = record.offset + 1

    def wait_for(self, ids: Sequence[str], until_wall_ms: int, service: Service) -> dict[str, Arrived]:
        """Every outcome of `ids`, or BenchError once the wall clock passes `until_wall_ms`.

        Each id is looked up once it is the first one still missing, so waiting costs this
        process (which shares the machine with `keyload run`) next to nothing.
        """
        first_missing = 0
        while True:
            while first_missing < len(ids) and ids[first_missing] in self.arrived:
                first_missing += 1
            if first_missing == len(ids):
                return {command_id: self.arrived[command_id] for command_id in ids}
            service.check_alive()
            if wall_ms() > until_wall_ms:
                missing = sum(1 for command_id in ids if command_id not in self.arrived)
                raise BenchError(f"{missing} of {len(ids)} outcomes never came, {ids[first_missing]} first")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.log.close()


class Appender:
    """Appends commands to the domain's partition in chunks, ringing the doorbell after each."""

    def __init__(self, data: DataDir) -> None:
        self.log: CommandLog = data.command_log()
        self.doorbell = Doorbell(data.root)
        self.partition = partition_for(DOMAIN, data.partitions)

    def append(self, values: Sequence[bytes], over_ms: int = 0) -> list[int]:
        """Append `values` at once, or paced evenly over `over_ms` in smaller appends; their offsets."""
        chunk = APPEND_CHUNK if over_ms == 0 else SPREAD_CHUNK
        appends = -(-len(values) // chunk)
        offsets: list[int] = []
        started = time.monotonic()
        for n, first in enumerate(range(0, len(values), chunk)):
            time.sleep(max(0.0, started + over_ms / 1000 * n / appends - time.monotonic()))
            positions = self.log.append(self.partition, list(values[first : first + chunk]))
            self.doorbell.ring()
            offsets += [position.offset for position in positions]
        return offsets

    def evaluation_times(self, through: int) -> dict[int, int]:
        """Each record's evaluation time up to offset `through`: its stamp, never decreasing (as applied)."""
        times: dict[int, int] = {}
        offset, last = self.log.start_offset(self.partition), 0
        while offset <= through:
            records = self.log.read(self.partition, offset, READ_BATCH)
            if not records:
                raise BenchError(f"the log ended at offset {offset}, before {through}")
            for record in records:
                last = max(last, record.timestamp_ms)
                times[record.offset] = last
                offset = record.offset + 1
        return times

    def close(self) -> None:
        self.log.close()
        self.doorbell.close()


def unapplied(data: DataDir, appender: Appender) -> int | None:
    """Records of the partition `keyload run` has not applied yet (a read-only look; None if it fails)."""
    end = appender.log.end_offset(appender.partition)
    try:
        store = Store(data.projection(appender.partition), read_only=True)
    except StoreError:
        return None
    try:
        return end - 1 - store.applied_offset
    finally:
        store.close()


class DrainWatch:
    """From a deadline on (waiting for it first): Ticks the ticker appends and CPU `keyload run` spends."""

    def __init__(self, data: DataDir, service: Service, appender: Appender, deadline_ms: int) -> None:
        self.service, self.appender = service, appender
        self.offset = appender.log.end_offset(appender.partition)  # nothing is due before the deadline
        time.sleep(max(0, deadline_ms - wall_ms()) / 1000)
        self.cpu_s = process_cpu_s(service.process.pid)
        self.behind = unapplied(data, appender)

    def stop(self) -> tuple[int, float | None]:
        cpu_s = process_cpu_s(self.service.process.pid)
        log, partition = self.appender.log, self.appender.partition
        ticks, offset, end = 0, self.offset, log.end_offset(partition)
        while offset < end:
            records = log.read(partition, offset, READ_BATCH)
            ticks += sum(1 for record in records if TICKER_PRINCIPAL in record.value)
            offset = records[-1].offset + 1
        return ticks, None if cpu_s is None or self.cpu_s is None else round(cpu_s - self.cpu_s, 2)


def committed(arrived: Arrived, kind: str) -> Record:
    outcome = arrived.outcome
    if outcome["status"] != "committed":
        raise BenchError(
            f"{outcome['command_id']} was {outcome['status']}: {outcome['error_code']} {outcome['detail']}"
        )
    branch, result = outcome["result"]
    if branch != kind:
        raise BenchError(f"{outcome['command_id']} returned {branch}, not {kind}")
    result_record: Record = result
    return result_record


# -- measurements -----------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """Lateness past the deadline in ms, over `count` deadlines."""

    count: int
    p50: int
    p99: int
    max: int

    @staticmethod
    def of(values: Sequence[int]) -> Spread:
        ordered = sorted(values)
        if not ordered:
            raise BenchError("nothing to measure")
        if ordered[0] < 0:
            raise BenchError(f"a deadline was honoured {-ordered[0]} ms early")

        def rank(p: float) -> int:
            return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

        return Spread(len(ordered), rank(50), rank(99), ordered[-1])


@dataclass(frozen=True)
class WaiterRun:
    waiters: int
    queues: int
    wait_ms: int
    submit_ms: int  # first append to last
    deadlines_span_ms: int  # earliest deadline to latest
    evaluation: Spread
    arrival: Spread
    ticks: int  # Ticks the ticker appended from the first deadline until the last waiter was answered
    drain_cpu_s: float | None  # CPU of `keyload run` over that time (None without /proc)
    unapplied_at_deadline: int | None  # records (Receives) `keyload run` had still to apply at the first deadline


@dataclass(frozen=True)
class LeaseRun:
    leases: int
    queues: int
    lease_ms: int
    deadlines_span_ms: int
    expiry: Spread
    none_leased_after_ms: int  # wall clock: the last lease deadline → first look that found none leased
    ticks: int  # Ticks the ticker appended from the deadline until then
    drain_cpu_s: float | None  # CPU of `keyload run` over that time (None without /proc)


def waiters_phase(
    data: DataDir, service: Service, signer: Credential, count: int, queues: int, wait_ms: int, spread_ms: int
) -> WaiterRun:
    names = [f"wait-{q}" for q in range(queues)]
    with Client(data.root, principal=PRINCIPAL, reply_partition=SETUP_REPLY) as client:
        for name in names:
            client.create_queue(DOMAIN, name)
    ids = [f"waiter-{i}" for i in range(count)]
    body: Record = {"max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": wait_ms}
    values = [
        encode(signer, command_id, RECEIVE, {"queue": names[i % queues], **body}, WAITER_REPLY)
        for i, command_id in enumerate(ids)
    ]
    appender, tail = Appender(data), OutcomeTail(data, WAITER_REPLY)
    try:
        started = time.perf_counter()
        offsets = appender.append(values, spread_ms)
        submit_ms = round((time.perf_counter() - started) * 1000)
        times = appender.evaluation_times(offsets[-1])
        deadlines = [times[offset] + wait_ms for offset in offsets]
        cpu = DrainWatch(data, service, appender, min(deadlines))
        arrived = tail.wait_for(ids, max(deadlines) + round(OUTCOME_TIMEOUT_S * 1000), service)
        ticks, drain_cpu_s = cpu.stop()
    finally:
        tail.close()
        appender.close()
    behind = cpu.behind
    evaluation, arrival = [], []
    for command_id, deadline in zip(ids, deadlines, strict=True):
        one = arrived[command_id]
        if committed(one, RECEIVE_RESULT)["deliveries"]:
            raise BenchError(f"{command_id} was delivered a message, though none was enqueued")
        evaluation.append(one.outcome["eval_time_ms"] - deadline)
        arrival.append(one.wall_ms - deadline)
    return WaiterRun(
        count,
        queues,
        wait_ms,
        submit_ms,
        max(deadlines) - min(deadlines),
        Spread.of(evaluation),
        Spread.of(arrival),
        ticks,
        drain_cpu_s,
        behind,
    )


def leases_phase(
    data: DataDir, service: Service, signer: Credential, count: int, queues: int, lease_ms: int
) -> LeaseRun:
    names = [f"lease-{q}" for q in range(queues)]
    per_queue = -(-count // queues)
    policy = QueuePolicySpec(
        max_in_flight=max(per_queue, 1),
        receive_max_messages=RECEIVE_BATCH,
        retry_base_ms=RETRY_BASE_MS,
        retry_max_ms=RETRY_BASE_MS,
        retry_jitter="none",
    )
    with Client(data.root, principal=PRINCIPAL, reply_partition=SETUP_REPLY) as client:
        for name in names:
            client.create_queue(DOMAIN, name, policy)
    messages = [(names[i % queues], f"m-{i}") for i in range(count)]
    appender, tail = Appender(data), OutcomeTail(data, LEASE_REPLY)
    try:
        enqueues = [
            encode(
                signer,
                f"enqueue-{message_id}",
                ENQUEUE,
                {
                    "queue": queue,
                    "message_id": message_id,
                    "body": b"x",
                    "headers": {},
                    "ordering_key": None,
                    "not_before_ms": None,
                    "expires_at_ms": None,
                },
                LEASE_REPLY,
            )
            for queue, message_id in messages
        ]
        appender.append(enqueues)
        timeout_ms = round(OUTCOME_TIMEOUT_S * 1000)
        for arrived in tail.wait_for([f"enqueue-{m}" for _, m in messages], wall_ms() + timeout_ms, service).values():
            committed(arrived, "keyload.result.EnqueueResult")
        receive_ids = []
        receives = []
        for q, name in enumerate(names):
            in_queue = sum(1 for queue, _ in messages if queue == name)
            for r in range(-(-in_queue // RECEIVE_BATCH)):
                command_id = f"receive-{q}-{r}"
                receive_ids.append(command_id)
                body = {"queue": name, "max_messages": RECEIVE_BATCH, "max_bytes": None, "lease_ms": lease_ms}
                receives.append(encode(signer, command_id, RECEIVE, {**body, "wait_ms": None}, LEASE_REPLY))
        last_receive = appender.append(receives)[-1]  # one append: one stamp, so the deadlines fall together
        lease_until: dict[tuple[str, str], int] = {}
        for command_id, arrived in tail.wait_for(receive_ids, wall_ms() + timeout_ms, service).items():
            queue = names[int(command_id.split("-")[1])]
            for delivery in committed(arrived, RECEIVE_RESULT)["deliveries"]:
                lease_until[queue, delivery["message_id"]] = delivery["lease_until_ms"]
        if len(lease_until) != count:
            raise BenchError(f"{len(lease_until)} of {count} messages were leased")
        last_deadline = max(lease_until.values())
        cpu = DrainWatch(data, service, appender, last_deadline)
        none_leased_at = wait_until_none_leased(
            data, service, names, last_receive, last_deadline, last_deadline + timeout_ms
        )
        ticks, drain_cpu_s = cpu.stop()
        inspect_ids = [f"inspect-{message_id}" for _, message_id in messages]
        inspections = [
            encode(
                signer,
                command_id,
                INSPECT_MESSAGE,
                {"queue": queue, "message_id": message_id, "include_body": False},
                LEASE_REPLY,
            )
            for command_id, (queue, message_id) in zip(inspect_ids, messages, strict=True)
        ]
        appender.append(inspections)
        views = tail.wait_for(inspect_ids, wall_ms() + timeout_ms, service)
    finally:
        tail.close()
        appender.close()
    lateness = []
    for command_id, (queue, message_id) in zip(inspect_ids, messages, strict=True):
        meta = committed(views[command_id], MESSAGE_VIEW)["meta"]
        if meta["state"] != "scheduled" or meta["attempts"] != 1 or meta["last_retry_delay_ms"] is None:
            raise BenchError(f"message {message_id} is {meta['state']} after {meta['attempts']} attempts")
        expired_at = meta["not_before_ms"] - meta["last_retry_delay_ms"]
        lateness.append(expired_at - lease_until[queue, message_id])
    return LeaseRun(
        count,
        queues,
        lease_ms,
        last_deadline - min(lease_until.values()),
        Spread.of(lateness),
        none_leased_at - last_deadline,
        ticks,
        drain_cpu_s,
    )


def wait_until_none_leased(
    data: DataDir, service: Service, names: Sequence[str], applied_through: int, deadline_ms: int, until_wall_ms: int
) -> int:
    """The wall clock just after the first read-only look at the projection, from `deadline_ms` on,
    that finds no message leased.

    Only a projection that has applied `applied_through` (the last Receive) counts: outcomes are
    published before their commit, so a look just after them may see the queues before any lease.
    """
    partition = partition_for(DOMAIN, data.partitions)
    time.sleep(max(0, deadline_ms - wall_ms()) / 1000)
    while wall_ms() <= until_wall_ms:
        service.check_alive()
        try:
            store = Store(data.projection(partition), read_only=True)
        except StoreError:
            time.sleep(LEASE_POLL_S)
            continue
        try:
            leased = None
            if store.applied_offset >= applied_through:
                leased = 0
                for name in names:
                    raw = store.get(keys.queue(DOMAIN, name))
                    if raw is None:
                        raise BenchError(f"queue {name} is missing")
                    leased += REGISTRY.decode(QUEUE_RECORD, raw)["view"]["counters"]["leased"]
        finally:
            store.close()
        if leased == 0:
            return wall_ms()  # after the look: what it saw was committed by then
        time.sleep(LEASE_POLL_S)
    raise BenchError(f"leases were still held {OUTCOME_TIMEOUT_S:.0f} s past the last deadline")


# -- reporting -------------------------------------------------------------------------


def spread_line(label: str, spread: Spread) -> str:
    return f"  {label:<37} p50 {spread.p50:>7,} ms   p99 {spread.p99:>7,} ms   max {spread.max:>7,} ms"


def drain_line(ticks: int, cpu_s: float | None, until: str) -> str:
    cpu = "" if cpu_s is None else f", `keyload run` used {cpu_s:.1f} s of CPU"
    return f"  from the first deadline until {until}: {ticks} Ticks appended{cpu}"


def table(
    waiters: WaiterRun | None, leases: LeaseRun | None, tick_interval_ms: int | None, bound_ms: int, env: dict[str, Any]
) -> str:
    interval = f"default, {DEFAULT_TICK_INTERVAL_MS}" if tick_interval_ms is None else f"{tick_interval_ms}"
    lines = [
        f"keyload bench.deadlines: `keyload run` (file log, tick interval {interval} ms), 1 domain (1 of "
        f"{env['partitions']} partitions)",
        f"python {env['python']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus, load {env['load_average_1m']:.2f}",
        "lateness = how long past its deadline a deadline was honoured (never negative)",
    ]
    if waiters is not None:
        lines += [
            "",
            f"(a) {waiters.waiters:,} long-poll Receives, wait_ms {waiters.wait_ms:,}, over {waiters.queues} queues: "
            f"appended in {waiters.submit_ms:,} ms, deadlines spread over {waiters.deadlines_span_ms:,} ms",
            spread_line("evaluation (outcome eval_time_ms)", waiters.evaluation),
            spread_line("arrival (wall clock, read by client)", waiters.arrival),
            drain_line(waiters.ticks, waiters.drain_cpu_s, "the last was answered"),
            f"  at the first deadline `keyload run` had {waiters.unapplied_at_deadline} records left to apply",
        ]
    if leases is not None:
        lines += [
            "",
            f"(b) {leases.leases:,} leases of {leases.lease_ms:,} ms over {leases.queues} queues, never acked: "
            f"deadlines spread over {leases.deadlines_span_ms:,} ms",
            spread_line("expiry (its record's eval time)", leases.expiry),
            f"  no lease left (wall clock, read-only look): {leases.none_leased_after_ms:,} ms after the last deadline",
            drain_line(leases.ticks, leases.drain_cpu_s, "then"),
        ]
    if waiters is not None or leases is not None:
        worst = worst_lateness(waiters, leases)
        verdict = "within" if worst <= bound_ms else "OVER"
        lines += [
            "",
            f"largest lateness (waiter arrival, lease expiry) {worst:,} ms: {verdict} the {bound_ms:,} ms bound",
        ]
    return "\n".join(lines)


def worst_lateness(waiters: WaiterRun | None, leases: LeaseRun | None) -> int:
    found = [waiters.arrival.max] if waiters is not None else []
    if leases is not None:
        found.append(leases.expiry.max)
    return max(found, default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deadlines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=12_000, help="long-poll Receives of phase (a)")
    parser.add_argument("--leases", type=int, default=12_000, help="leased messages of phase (b)")
    parser.add_argument("--queues", type=int, default=12, help="queues of each phase (≤ 1,000 waiters a queue)")
    parser.add_argument("--wait-ms", type=int, default=limits.MAX_WAIT_MS)
    parser.add_argument("--lease-ms", type=int, default=5_000)
    parser.add_argument(
        "--spread-ms",
        type=int,
        default=0,
        help="append the waiters evenly over this long (default 0: as fast as the log takes them)",
    )
    parser.add_argument("--tick-interval-ms", type=int, default=None, help="passed to `keyload run` (default: its own)")
    parser.add_argument("--phases", default="waiters,leases", help="comma-separated: waiters, leases")
    parser.add_argument("--bound-ms", type=int, default=BOUND_MS, help="the lateness the report holds the run to")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary data directory")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    if not phases <= {"waiters", "leases"}:
        parser.error("--phases takes waiters and/or leases")
    if args.queues < 1 or args.waiters < 1 or args.leases < 1 or args.spread_ms < 0:
        parser.error("--queues, --waiters and --leases must be >= 1, --spread-ms >= 0")
    if -(-args.waiters // args.queues) > limits.MAX_WAITERS_PER_RESOURCE:
        parser.error(f"at most {limits.MAX_WAITERS_PER_RESOURCE} waiters a queue: raise --queues")
    if not 1 <= args.wait_ms <= limits.MAX_WAIT_MS or args.lease_ms < limits.MIN_LEASE_MS:
        parser.error(f"--wait-ms must be 1..{limits.MAX_WAIT_MS}, --lease-ms at least {limits.MIN_LEASE_MS}")
    root = Path(tempfile.mkdtemp(prefix="keyload-deadlines-", dir=args.dir))
    waiters = leases = None
    try:
        data = DataDir.create(root / "data")
        service = Service(data.root, args.tick_interval_ms)
        try:
            create_bench_principal(data.root)
            signer = Credential.load(credential_path(data.root, PRINCIPAL))
            if "waiters" in phases:
                waiters = waiters_phase(data, service, signer, args.waiters, args.queues, args.wait_ms, args.spread_ms)
            if "leases" in phases:
                leases = leases_phase(data, service, signer, args.leases, args.queues, args.lease_ms)
        finally:
            status = service.stop()
        if status != 0 or any("halted" in line for line in service.lines):
            raise BenchError(f"`keyload run` exited with status {status}:\n{service.tail()}")
        env = {**environment(0, root), "partitions": data.partitions}
        del env["warmup_commands"]
        worst = worst_lateness(waiters, leases)
        if args.json:
            report = {
                "benchmark": "bench.deadlines",
                "tick_interval_ms": args.tick_interval_ms or DEFAULT_TICK_INTERVAL_MS,
                "waiters": None if waiters is None else asdict(waiters),
                "leases": None if leases is None else asdict(leases),
                "bound_ms": args.bound_ms,
                "largest_lateness_ms": worst,
                "within_bound": worst <= args.bound_ms,
                "environment": env,
            }
            print(json.dumps(report, indent=2), flush=True)
        else:
            print(table(waiters, leases, args.tick_interval_ms, args.bound_ms, env), flush=True)
    except BenchError as exc:
        print(f"bench.deadlines: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
