"""A crash campaign: `keyload run` SIGKILLed 100 times at random moments under live producers and consumers.

Two producer processes enqueue and two consumer processes receive and ack through the SDK
(`keyload.sdk.client.Client` on the data directory) while the test kills the service with SIGKILL
at random moments and restarts it, again and again; an operator thread asks for checkpoints
besides the service's own periodic ones (`--checkpoint-every`), and the command log rolls a
segment every few dozen records, so kills land in checkpoints, segment rolls, group commits,
start-up repair and idle waits alike. Every command has a stable, deterministic command id: a
worker whose outcome does not come (the service is down) submits the same command again until
it learns the outcome. Consumers leave a few deliveries unacked on purpose, and leases are
short, so messages are also redelivered after lease expiry.

After the last restart the workers drain, the service stops cleanly, and:
- every enqueue that got a committed outcome exists exactly once: its message is acked (and
  then by exactly one committed ack) or still in the queue; nothing else is in the queue;
- no message id appears in two committed acks, and no message is delivered by a receive
  applied after a committed ack of it (log order: the receive's offset is past the ack's);
- the queue counters agree (enqueued_total, acked_total), there is no poison entry;
- `keyload drill` passes for every partition, from offset 0 and from the latest checkpoint.
It prints the figures: kills, commands, lost, duplicated.

Start-up of a fresh interpreter costs about a second of imports, which 100 restarts cannot
afford: `keyload run` is forked from a *zygote*, a process that has imported keyload.cli and
does nothing else, and each child runs exactly `keyload.cli.main(["run", ...])`. The workers
outlive every restart. The data directory is created with a small segment size
(`DataDir.create(segment_bytes=...)`, what `keyload run --segment-bytes` records), which every
appender reads from keyload.json.

The RNG seed is printed; set KEYLOAD_CRASH_SEED to rerun one campaign's kill timing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from keyload.errors import CommandRejected, OutcomeTimeout
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.sdk.client import Client
from keyload.sdk.results import QueuePolicySpec, ReceiveResult
from keyload.storage.datadir import DataDir

from .support import create_principals, spread_domains

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SEED_VARIABLE = "KEYLOAD_CRASH_SEED"
KILLS = 100
PARTITIONS = 2
SEGMENT_BYTES = 8_192  # a roll every 30-40 records
CHECKPOINT_EVERY = 300  # records: periodic checkpoints besides the operator's
CHECKPOINT_REQUEST_S = (0.5, 2.5)  # the operator asks for a checkpoint of a random partition this often
EARLY_KILL_SHARE = 0.15  # kills this soon after the fork: start-up, repair, opening the projections
EARLY_WINDOW_S = (0.0, 0.3)
RUN_WINDOW_S = (0.02, 0.8)  # the other kills: this long after the run said it serves
QUEUE = "jobs"
LEASE_MS = 1_500  # short: a lease outlives no restart by much, so some acks come too late and messages return
RECEIVE_MAX = 8
RECEIVE_WAIT_MS = 200
ABANDON_ONE_IN = 40  # deliveries left unacked on purpose: they come back after their lease
PRODUCE_PAUSE_S = 0.005  # at most ~200 enqueues/s per producer: the drills replay every record
OUTCOME_TIMEOUT_S = 1.0  # a worker's wait for one outcome before it submits the command again
CAMPAIGN_TIMEOUT_S = 420.0  # every wait of the campaign ends by then
DRAIN_TIMEOUT_S = 60.0
LIVE_STATES = {"ready", "leased", "scheduled"}
ENQUEUE = "keyload.command.Enqueue"
RECEIVE = "keyload.command.Receive"
ACK = "keyload.command.Ack"


def until_known(call: Callable[[], T], deadline: float) -> tuple[T, int]:
    """`call` (one command under a fixed command id) until its outcome is known; (result, resubmissions)."""
    resubmitted = 0
    while True:
        try:
            return call(), resubmitted
        except OutcomeTimeout:
            if time.monotonic() > deadline:
                raise
            resubmitted += 1


def payload(message_id: str) -> bytes:
    """A message's body, derived from its id (so a retry is the same command)."""
    return (message_id.encode() + b":") * (1 + zlib.crc32(message_id.encode()) % 6)


def abandoned(message_id: str, receive: str) -> bool:
    return zlib.crc32(f"{message_id}/{receive}".encode()) % ABANDON_ONE_IN == 0


# -- the worker processes (python -m tests.test_crash_campaign ROLE ...) -------------------------------


class Journal:
    """One JSON line per event, flushed at once: what a worker learned, read by the test afterwards."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")

    def write(self, **event: Any) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def produce(root: Path, name: str, domains: list[str], journal: Journal, stop: Path, deadline: float) -> None:
    with Client(root, principal=name, timeout_s=OUTCOME_TIMEOUT_S) as client:
        print("ready", flush=True)
        i = 0
        while not stop.exists():
            domain = domains[i % len(domains)]
            message_id = f"{name}-{i}"
            command_id = f"enqueue-{message_id}"
            enqueue = partial(
                client.enqueue, domain, QUEUE, payload(message_id), message_id=message_id, command_id=command_id
            )
            try:
                _, resubmitted = until_known(enqueue, deadline)
                journal.write(kind="enqueue", mid=message_id, domain=domain, cid=command_id, status="committed")
            except CommandRejected as exc:
                journal.write(kind="enqueue", mid=message_id, domain=domain, cid=command_id, status=str(exc))
                resubmitted = 0
            if resubmitted:
                journal.write(kind="resubmitted", count=resubmitted)
            i += 1
            time.sleep(PRODUCE_PAUSE_S)


def consume(root: Path, name: str, domains: list[str], journal: Journal, stop: Path, deadline: float) -> None:
    with Client(root, principal=name, timeout_s=OUTCOME_TIMEOUT_S) as client:
        print("ready", flush=True)
        n = 0
        wait_s = OUTCOME_TIMEOUT_S + RECEIVE_WAIT_MS / 1_000
        while not stop.exists():
            domain = domains[n % len(domains)]
            receive_id = f"{name}-receive-{n}"
            body = {
                "queue": QUEUE,
                "max_messages": RECEIVE_MAX,
                "max_bytes": None,
                "lease_ms": LEASE_MS,
                "wait_ms": RECEIVE_WAIT_MS,
            }
            n += 1
            received, resubmitted = until_known(
                partial(client.submit, domain, RECEIVE, body, receive_id, timeout_s=wait_s), deadline
            )
            if resubmitted:
                journal.write(kind="resubmitted", count=resubmitted)
            if received.status != "committed" or not isinstance(received.result, ReceiveResult):
                journal.write(kind="receive", cid=receive_id, status=received.status, error=received.error_code)
                continue
            journal.write(kind="receive", cid=receive_id, status="committed", error=None)
            for j, delivery in enumerate(received.result.deliveries):
                mid = delivery.message_id
                journal.write(
                    kind="delivered",
                    mid=mid,
                    domain=domain,
                    cid=receive_id,
                    offset=received.offset,
                    attempts=delivery.attempts,
                )
                if abandoned(mid, receive_id):
                    continue
                ack_id = f"{name}-ack-{n - 1}-{j}"
                acked, resubmitted = until_known(
                    partial(client.submit, domain, ACK, {"token": delivery.token}, ack_id), deadline
                )
                if resubmitted:
                    journal.write(kind="resubmitted", count=resubmitted)
                journal.write(
                    kind="ack",
                    mid=mid,
                    domain=domain,
                    cid=ack_id,
                    status=acked.status,
                    error=acked.error_code,
                    offset=acked.offset,
                )


def zygote(log_path: Path, run_arguments: list[str]) -> None:
    """Fork `keyload run` children on request (stdin lines), each with keyload already imported.

    start → "pid N"; poll → "running" or "exited CODE"; kill → "killed" or "exited CODE" (it
    had died by itself); stop (SIGTERM, then wait) → "exited CODE"; quit → exits, killing a
    child still running. A closed stdin is quit too.
    """
    from keyload import cli
    from keyload.service import embedded  # noqa: F401  (the engine too: the CLI imports it lazily)

    child: int | None = None
    last_exit: int | None = None  # of the child reaped last
    print("ready", flush=True)

    def reap(wait: bool) -> int | None:
        nonlocal child, last_exit
        assert child is not None
        pid, status = os.waitpid(child, 0 if wait else os.WNOHANG)
        if pid == 0:
            return None
        child = None
        last_exit = os.waitstatus_to_exitcode(status)
        return last_exit

    try:
        for line in sys.stdin:
            request = line.strip()
            if request == "start":
                assert child is None, "one keyload run at a time"
                child = os.fork()
                if child == 0:  # the service
                    code = 70
                    try:
                        out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                        null = os.open(os.devnull, os.O_RDONLY)
                        os.dup2(null, 0)
                        os.dup2(out, 1)
                        os.dup2(out, 2)
                        os.close(out)
                        os.close(null)
                        code = cli.main(run_arguments)
                    except BaseException:
                        traceback.print_exc()
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(code)
                print(f"pid {child}", flush=True)
            elif request == "poll":
                if child is not None:
                    reap(wait=False)
                print("running" if child is not None else f"exited {last_exit}", flush=True)
            elif request == "kill":
                if child is None:
                    print(f"exited {last_exit}", flush=True)
                    continue
                exited = reap(wait=False)
                if exited is not None:
                    print(f"exited {exited}", flush=True)
                    continue
                os.kill(child, signal.SIGKILL)
                reap(wait=True)
                print("killed", flush=True)
            elif request == "stop":
                assert child is not None
                os.kill(child, signal.SIGTERM)
                deadline = time.monotonic() + 60
                exited = reap(wait=False)
                while exited is None and time.monotonic() < deadline:
                    time.sleep(0.02)
                    exited = reap(wait=False)
                if exited is None:
                    os.kill(child, signal.SIGKILL)
                    reap(wait=True)
                    print("exited hung", flush=True)
                else:
                    print(f"exited {exited}", flush=True)
            elif request == "quit":
                break
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
            reap(wait=True)


def main(argv: list[str]) -> int:
    role, *rest = argv
    if role == "zygote":
        log_path, *run_arguments = rest
        zygote(Path(log_path), run_arguments)
        return 0
    root, name, journal_path, stop, timeout_s, *domains = rest
    deadline = time.monotonic() + float(timeout_s)
    journal = Journal(Path(journal_path))
    try:
        work = produce if role == "producer" else consume
        work(Path(root), name, domains, journal, Path(stop), deadline)
    finally:
        journal.close()
    return 0


# -- the test ---------------------------------------------------------------------------------------


class Service:
    """`keyload run` children of a zygote; their output goes to one file."""

    def __init__(self, root: Path, log: Path, *arguments: str) -> None:
        self.root = root
        self.log = log
        self.mark = 0
        self.starts = 0
        command = [sys.executable, "-m", "tests.test_crash_campaign", "zygote", str(log)]
        self.process = subprocess.Popen(
            [*command, "run", "--data", str(root), *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            text=True,
        )
        assert self._answer() == "ready"

    def _answer(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line, f"the zygote died: {self.process.poll()}"
        return line

    def _ask(self, request: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        return self._answer()

    def start(self) -> None:
        self.mark = self.log.stat().st_size if self.log.exists() else 0
        assert self._ask("start").startswith("pid ")
        self.starts += 1

    def output(self) -> str:
        """What the current run printed so far."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as file:
            file.seek(self.mark)
            return file.read().decode(errors="replace")

    def serving(self) -> bool:
        return "keyload: serving" in self.output()

    def running(self) -> bool:
        return self._ask("poll") == "running"

    def kill(self) -> str:
        """SIGKILL the run: "killed", or "exited CODE" when it had already died by itself."""
        return self._ask("kill")

    def stop(self) -> str:
        return self._ask("stop")

    def close(self) -> None:
        if self.process.poll() is None:
            requests = self.process.stdin
            assert requests is not None
            with suppress(BrokenPipeError):
                requests.write("quit\n")
                requests.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    journal: Path
    errors: Path

    def failure(self) -> str | None:
        code = self.process.poll()
        if code is None or code == 0:
            return None
        return f"{self.name} exited {code}: {self.errors.read_text(errors='replace')[-3000:]}"


def start_worker(role: str, name: str, root: Path, work: Path, stop: Path, domains: list[str]) -> Worker:
    journal, errors = work / f"{name}.jsonl", work / f"{name}.err"
    arguments = [str(root), name, str(journal), str(stop), str(CAMPAIGN_TIMEOUT_S), *domains]
    with errors.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.test_crash_campaign", role, *arguments],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=REPO,
        )
    return Worker(name, process, journal, errors)


def read_journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]


@dataclass
class Operator:
    """Asks for checkpoints of random partitions at random moments, each under its own command id."""

    root: Path
    rng: random.Random
    deadline: float
    stop: threading.Event = field(default_factory=threading.Event)
    requested: int = 0
    resubmitted: int = 0
    error: BaseException | None = None

    def run(self) -> None:
        try:
            # The administrator's client: a checkpoint is an admin's request.
            with Client(self.root, timeout_s=OUTCOME_TIMEOUT_S) as client:
                while not self.stop.wait(self.rng.uniform(*CHECKPOINT_REQUEST_S)):
                    partition = self.rng.randrange(PARTITIONS)
                    command_id = f"checkpoint-{self.requested}"
                    request = partial(client.request_checkpoint, partition, command_id=command_id)
                    _, resubmitted = until_known(request, self.deadline)
                    self.requested += 1
                    self.resubmitted += resubmitted
        except BaseException as exc:
            self.error = exc


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, pause_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause_s)


def takes(root: Path) -> set[str]:
    """The scratch folders of checkpoint takes: one that is new at a kill is a take the kill interrupted
    (a finished take removes its folder; an interrupted one stays behind)."""
    try:
        return {name for name in os.listdir(root / "scratch") if name.startswith("take-")}
    except FileNotFoundError:
        return set()


def projection_messages(data: DataDir, domain: str) -> tuple[dict[str, str], dict[str, int], int]:
    """(message id -> state, the queue's counters, poison entries) of a domain's queue, read from its projection."""
    store = Store(data.projection(partition_for(domain, data.partitions)), read_only=True)
    try:
        raw = store.get(keys.queue(domain, QUEUE))
        assert raw is not None, f"queue {QUEUE} of {domain} does not exist"
        record = REGISTRY.decode("keyload.QueueRecord", raw)
        prefix = keys.MESSAGE + keys.u64(record["view"]["incarnation"])
        states = {
            key[len(prefix) :].decode(): REGISTRY.decode("keyload.MessageMeta", value)["state"]
            for key, value in store.scan(prefix, keys.prefix_end(prefix))
        }
        poison = sum(1 for _ in store.scan(keys.POISON, keys.prefix_end(keys.POISON)))
        return states, record["view"]["counters"], poison
    finally:
        store.close()


def drill(root: Path, partition: int, *start: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "keyload.cli", "drill", "--data", str(root), "--partition", str(partition)]
    return subprocess.run([*command, *start, "--quiet"], capture_output=True, text=True, timeout=300, cwd=REPO)


@dataclass
class Findings:
    """What the verification found; each list names the message ids (or events) concerned."""

    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)


def verify(
    data: DataDir, domains: list[str], producers: list[dict[str, Any]], consumers: list[dict[str, Any]]
) -> tuple[Findings, dict[str, int]]:
    findings = Findings()
    enqueued: dict[str, str] = {}  # committed enqueues: message id -> domain
    for event in producers:
        if event["kind"] != "enqueue":
            continue
        if event["status"] == "committed":
            if event["mid"] in enqueued:
                findings.duplicated.append(f"{event['mid']}: two committed outcomes for one enqueue")
            enqueued[event["mid"]] = event["domain"]
        else:
            findings.other.append(f"enqueue {event['mid']} rejected: {event['status']}")
    acks: dict[str, list[int]] = defaultdict(list)  # message id -> offsets of its committed acks
    deliveries: list[tuple[str, int]] = []
    for event in consumers:
        if event["kind"] == "ack" and event["status"] == "committed":
            acks[event["mid"]].append(event["offset"])
        elif event["kind"] == "ack" and event["error"] not in ("StaleLease", "LeaseExpired"):
            findings.other.append(f"ack of {event['mid']} rejected: {event['error']}")
        elif event["kind"] == "receive" and event["status"] != "committed":
            findings.other.append(f"receive {event['cid']} rejected: {event['error']}")
        elif event["kind"] == "delivered":
            deliveries.append((event["mid"], event["offset"]))
    for mid, offsets in acks.items():
        if len(offsets) > 1:
            findings.duplicated.append(f"{mid}: {len(offsets)} committed acks")
        if mid not in enqueued:
            findings.other.append(f"{mid}: acked, but no enqueue of it was committed")
    for mid, offset in deliveries:
        if mid in acks and offset > min(acks[mid]):
            findings.duplicated.append(f"{mid}: delivered at offset {offset}, after its committed ack")
    still_queued = 0
    for domain in domains:
        states, counters, poison = projection_messages(data, domain)
        mine = {mid for mid, d in enqueued.items() if d == domain}
        for mid in sorted(mine):
            state = states.get(mid)
            if state is None:
                findings.lost.append(f"{mid}: committed enqueue, not in the projection")
            elif state == "acked" and mid not in acks:
                findings.other.append(f"{mid}: acked in the projection, but no consumer got a committed ack")
            elif mid in acks and state != "acked":
                findings.lost.append(f"{mid}: its ack was committed, yet it is {state}")
            elif state != "acked" and state not in LIVE_STATES:
                findings.lost.append(f"{mid}: committed enqueue, now {state}")
            still_queued += state in LIVE_STATES
        findings.duplicated.extend(f"{mid}: in the projection, never enqueued" for mid in sorted(set(states) - mine))
        acked = sum(1 for mid in mine if mid in acks)
        if (counters["enqueued_total"], counters["acked_total"]) != (len(mine), acked):
            findings.other.append(f"{domain}: counters {counters} for {len(mine)} enqueues and {acked} acks")
        if poison:
            findings.other.append(f"{domain}'s partition has {poison} poison entries")
    figures = {
        "enqueued": len(enqueued),
        "acked": len(acks),
        "deliveries": len(deliveries),
        "redeliveries": len(deliveries) - len({mid for mid, _ in deliveries}),
        "still_queued": still_queued,
    }
    return findings, figures


@pytest.mark.slow
def test_crash_campaign_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get(SEED_VARIABLE) or int.from_bytes(os.urandom(4), "big"))
    rng = random.Random(seed)
    print(f"\ncrash campaign seed {seed} ({SEED_VARIABLE}={seed} reruns its kill timing)", flush=True)
    began = time.monotonic()
    deadline = began + CAMPAIGN_TIMEOUT_S
    root, work = tmp_path / "data", tmp_path / "work"
    work.mkdir()
    data = DataDir.create(root, PARTITIONS, segment_bytes=SEGMENT_BYTES)
    domains = spread_domains(PARTITIONS, PARTITIONS)
    service_log = work / "keyload-run.log"
    service = Service(root, service_log, "--checkpoint-every", str(CHECKPOINT_EVERY))
    operator = Operator(root, random.Random(seed + 1), deadline)
    operator_thread = threading.Thread(target=operator.run, name="operator", daemon=True)
    stop_producers, stop_consumers = work / "stop-producers", work / "stop-consumers"
    workers: list[Worker] = []
    kills = early_kills = kills_in_checkpoints = 0
    problems: list[str] = []

    def failed(context: str) -> str:
        return f"seed {seed}, after {kills} kills: {context}"

    def check_workers() -> None:
        for worker in workers:
            failure = worker.failure()
            assert failure is None, failed(failure or "")
        assert operator.error is None, failed(f"operator: {operator.error!r}")

    def check_run(outcome: str, expected: str = "killed") -> None:
        """The run ended as expected (it did not die by itself) and printed nothing but its start (the
        serving line and its HTTP API's) and stop."""
        text = service.output()
        assert outcome == expected, failed(f"keyload run {service.starts} ended {outcome!r}:\n{text[-4000:]}")
        for line in text.splitlines():
            if line.strip() and not line.startswith(("keyload: serving", "keyload: HTTP API on", "keyload: stopped")):
                problems.append(failed(f"run {service.starts} said: {line}"))

    try:
        service.start()
        wait_for(service.serving, 60, failed("the first keyload run to serve"))
        names = [f"{role}{k}" for role in ("producer", "consumer") for k in range(2)]
        create_principals(root, "setup", "verifier", *names)
        with Client(root, principal="setup", timeout_s=OUTCOME_TIMEOUT_S) as setup:
            policy = QueuePolicySpec(max_attempts=1_000, retry_base_ms=50, retry_max_ms=200)
            for domain in domains:
                create = partial(setup.create_queue, domain, QUEUE, policy, command_id=f"create-{domain}")
                until_known(create, deadline)
        for k in range(2):
            workers.append(start_worker("producer", f"producer{k}", root, work, stop_producers, domains))
            workers.append(start_worker("consumer", f"consumer{k}", root, work, stop_consumers, domains))
        for worker in workers:
            assert worker.process.stdout is not None
            assert worker.process.stdout.readline() == b"ready\n", failed(worker.failure() or worker.name)
        operator_thread.start()

        # The campaign: run, wait a random moment, SIGKILL, restart.
        crash_began = time.monotonic()
        seen_takes: set[str] = set()
        while kills < KILLS:
            if rng.random() < EARLY_KILL_SHARE:
                time.sleep(rng.uniform(*EARLY_WINDOW_S))
            else:
                wait_for(lambda: service.serving() or not service.running(), 60, failed("keyload run to serve"))
                time.sleep(rng.uniform(*RUN_WINDOW_S))
            early_kills += not service.serving()
            interrupted = takes(root) - seen_takes
            kills_in_checkpoints += bool(interrupted)
            seen_takes |= interrupted
            check_run(service.kill())
            kills += 1
            check_workers()
            assert time.monotonic() < deadline, failed("the campaign ran out of time")
            service.start()
        crash_s = time.monotonic() - crash_began
        setup_s = crash_began - began

        # The last run serves until the workers are done: producers first, then every message is consumed.
        wait_for(service.serving, 60, failed("the last keyload run to serve"))
        operator.stop.set()
        operator_thread.join(60)
        stop_producers.touch()
        for worker in workers[0::2]:
            worker.process.wait(max(1.0, deadline - time.monotonic()))
        check_workers()
        with Client(root, principal="verifier", timeout_s=10) as verifier:

            def drained() -> bool:
                check_workers()
                return all(verifier.inspect_queue(d, QUEUE).counters.stored_messages == 0 for d in domains)

            try:
                wait_for(drained, DRAIN_TIMEOUT_S, "the consumers to drain the queues", pause_s=0.25)
            except AssertionError as exc:
                problems.append(failed(str(exc)))
        stop_consumers.touch()
        for worker in workers[1::2]:
            worker.process.wait(max(1.0, deadline - time.monotonic()))
        check_workers()
        check_run(service.stop(), "exited 0")
        drain_s = time.monotonic() - crash_began - crash_s
    finally:
        operator.stop.set()
        stop_producers.touch()
        stop_consumers.touch()
        for worker in workers:
            try:
                worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            if worker.process.stdout is not None:
                worker.process.stdout.close()
        service.close()

    producers = [e for w in workers[0::2] for e in read_journal(w.journal)]
    consumers = [e for w in workers[1::2] for e in read_journal(w.journal)]
    findings, figures = verify(data, domains, producers, consumers)
    drills = []
    for partition in range(PARTITIONS):
        for start in ((), ("--from-checkpoint", "latest")):
            result = drill(root, partition, *start)
            drills.append(result.returncode == 0 and ": PASS" in result.stdout)
            if not drills[-1]:
                problems.append(failed(f"drill p{partition} {' '.join(start)}: {result.stdout}{result.stderr}"))

    kinds = Counter(e["kind"] for e in producers + consumers)
    commands = kinds["enqueue"] + kinds["receive"] + kinds["ack"] + operator.requested + len(domains)
    resubmitted = sum(e["count"] for e in producers + consumers if e["kind"] == "resubmitted") + operator.resubmitted
    log = data.command_log()
    try:
        records = sum(log.end_offset(p) for p in range(PARTITIONS))
    finally:
        log.close()
    segments = sum(len(list((root / "log" / "commands" / f"p-{p:04d}").glob("*.seg"))) for p in range(PARTITIONS))
    catalog = [len(list((root / "catalog" / f"p-{p:04d}").glob("*.json"))) for p in range(PARTITIONS)]
    print(
        f"crash campaign seed {seed}: kills {kills}, commands {commands}, "
        f"lost {len(findings.lost)}, duplicated {len(findings.duplicated)}; "
        f"{kills - early_kills} kills while serving, {early_kills} during start-up, {kills_in_checkpoints} inside a "
        f"checkpoint; {kinds['enqueue']} enqueues, {kinds['receive']} receives, {kinds['ack']} acks, "
        f"{operator.requested} checkpoint requests, {resubmitted} resubmissions after a timeout; "
        f"{figures['acked']} of {figures['enqueued']} messages acked, {figures['redeliveries']} redeliveries, "
        f"{figures['still_queued']} left queued; {records} log records in {segments} segments, "
        f"{sum(catalog)} published checkpoints; drills {sum(drills)}/{len(drills)} PASS; "
        f"setup {setup_s:.0f}s, crashes {crash_s:.0f}s, drain {drain_s:.0f}s, "
        f"verification {time.monotonic() - began - setup_s - crash_s - drain_s:.0f}s",
        flush=True,
    )
    details = [f"lost: {x}" for x in findings.lost] + [f"duplicated: {x}" for x in findings.duplicated]
    details += [f"unexpected: {x}" for x in findings.other] + problems
    assert details == [], failed(f"{len(details)} findings:\n" + "\n".join(details[:60]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
