"""CompleteProcessing is all or nothing when `keyload run` is SIGKILLed mid-workload.

Worker threads receive messages of the queue "in" and complete each with two
effects (a document put and an enqueue to "out") while the test kills the
processor service with SIGKILL again and again, restarting it each time. An
outcome that does not come in time is unknown: the worker submits the same
command again under the same command id until it learns the outcome. Some
completions are repeated on purpose under a new command id (the same effects:
`already_processed`; other effects: Conflict), and some messages are received
but never completed.

After recovery, for every message: either its document exists once at revision 1,
its follow-up message exists once, its inbox entry exists (the same effects under
yet another command id are `already_processed` with the first receipt) and it is
acked; or none of that exists and it is still leased — and then it can still be
completed. No message has part of its effects. The live projections equal a
clean replay of the log.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from keyload import Client
from keyload.errors import ConflictError, LeaseExpiredError, NotFoundError, OutcomeTimeout, StaleLeaseError
from keyload.sdk.results import EnqueueMessage, Mutation, ProcessingResult, PutDocument, QueuePolicySpec
from keyload.storage.datadir import DataDir

from .support import assert_live_equals_replay, create_principals, keyload_command

pytestmark = pytest.mark.slow

T = TypeVar("T")

DOMAIN = "shop"
SCOPE = "crash-test"
PRINCIPAL = "worker"  # tokens are issued to a principal: the verifier completes with the workers' tokens
MESSAGES = 400
KILLS = 8
TRANCHES = KILLS + 1  # one batch of messages enqueued after each (re)start, so every kill finds work to do
WORKERS = 3
KILL_AFTER_S = (0.3, 1.0)
LEASE_MS = 300_000  # no lease runs out during the test: what is not completed stays leased
OUTCOME_TIMEOUT_S = 0.3  # a worker's wait for one outcome before it resubmits the command
WORKLOAD_TIMEOUT_S = 180.0
HANDLER_WORK_S = (0.02, 0.08)  # a tranche takes longer than a kill interval: kills land mid-work


def message_id(i: int) -> str:
    return f"m{i}"


def abandoned(i: int) -> bool:
    """Received and never completed, as by a handler that hangs: it must stay leased, without effects."""
    return i % 25 == 7


def repeated(i: int) -> bool:
    """Completed again under a new command id with the same effects: already_processed."""
    return i % 10 == 3


def conflicting(i: int) -> bool:
    """Completed again under a new command id with other effects: Conflict."""
    return i % 10 == 5


def effects(mid: str, variant: str = "") -> list[Mutation]:
    return [
        PutDocument(f"doc/{mid}", f"processed {mid}{variant}".encode(), expected_revision=0),
        EnqueueMessage("out", f"out-{mid}", f"follow-up of {mid}".encode()),
    ]


def until_known(call: Callable[[], T], deadline: float, unknown: list[int]) -> T:
    """`call` (one command under a fixed command id) until its outcome is known; counts the unknowns."""
    while True:
        try:
            return call()
        except OutcomeTimeout:
            unknown[0] += 1
            if time.monotonic() > deadline:
                raise


class Service:
    """`keyload run` over a data directory, killed and restarted at will; output to a file, never a pipe."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_s = 0.0

    def start(self) -> None:
        began = time.monotonic()
        with self.log.open("ab") as out:
            mark = out.tell()
            self.process = subprocess.Popen(
                keyload_command("run", "--data", str(self.root)), stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while b"keyload: serving" not in self.log.read_bytes()[mark:]:
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "keyload run did not start"
            time.sleep(0.01)
        self.starts += 1
        self.start_s += time.monotonic() - began

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, "keyload run died on its own"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return self.process.returncode

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass(frozen=True, slots=True)
class Completed:
    token: str
    receipt: ProcessingResult


@dataclass
class Workload:
    """What the workers did, shared between them (under `lock`)."""

    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    completed: dict[str, Completed] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)  # abandoned message id -> its token
    unknown: list[int] = field(default_factory=lambda: [0])  # outcomes that did not come in time
    unknown_completions: int = 0  # completions resubmitted under their command id: a kill caught them in flight
    lost_leases: int = 0
    failed: threading.Event = field(default_factory=threading.Event)

    def finished(self) -> bool:
        with self.lock:
            return len(self.completed) == sum(not abandoned(i) for i in range(MESSAGES))

    def count_unknown(self, unknown: list[int]) -> None:
        with self.lock:
            self.unknown[0] += unknown[0]


def work(root: Path, name: str, workload: Workload) -> None:
    """Receive and complete until every message that is not abandoned is completed."""
    rng = random.Random(name)
    unknown = [0]
    try:
        with Client(root, principal=PRINCIPAL, timeout_s=OUTCOME_TIMEOUT_S) as client:
            for k in range(1_000_000):
                if workload.finished() or workload.failed.is_set():
                    return
                assert time.monotonic() < workload.deadline, "the workload did not finish in time"
                receive_id = f"{name}-receive-{k}"
                receive = partial(
                    client.receive, DOMAIN, "in", max_messages=4, lease_ms=LEASE_MS, command_id=receive_id
                )
                received = until_known(receive, workload.deadline, unknown)
                if not received.deliveries:
                    time.sleep(0.02)  # what is left is in other workers' hands
                    continue
                for delivery in received.deliveries:
                    complete(client, name, k, delivery.message_id, delivery.token, workload, unknown, rng)
    except BaseException:
        workload.failed.set()
        raise
    finally:
        workload.count_unknown(unknown)


def complete(
    client: Client,
    name: str,
    k: int,
    mid: str,
    token: str,
    workload: Workload,
    unknown: list[int],
    rng: random.Random,
) -> None:
    i = int(mid[1:])
    if abandoned(i):
        with workload.lock:
            workload.held[mid] = token
        return
    time.sleep(rng.uniform(*HANDLER_WORK_S))  # the handler's work
    command_id = f"{name}-complete-{k}-{mid}"
    unknown_before = unknown[0]
    try:
        receipt = until_known(
            lambda: client.complete_processing(DOMAIN, token, effects(mid), handler_scope=SCOPE, command_id=command_id),
            workload.deadline,
            unknown,
        )
    except (LeaseExpiredError, StaleLeaseError):
        with workload.lock:
            workload.lost_leases += 1  # nothing applied: the message comes again
        return
    if unknown[0] > unknown_before:
        with workload.lock:
            workload.unknown_completions += 1
    # However often it was resubmitted, the outcome is the first application's.
    assert (receipt.already_processed, receipt.command_id) == (False, command_id), receipt
    if repeated(i):
        again = until_known(
            lambda: client.complete_processing(
                DOMAIN, token, effects(mid), handler_scope=SCOPE, command_id=f"{command_id}-again"
            ),
            workload.deadline,
            unknown,
        )
        assert again.already_processed and again.command_id == command_id, again
        assert again.results == receipt.results
    if conflicting(i):
        with pytest.raises(ConflictError):
            until_known(
                lambda: client.complete_processing(
                    DOMAIN, token, effects(mid, " otherwise"), handler_scope=SCOPE, command_id=f"{command_id}-other"
                ),
                workload.deadline,
                unknown,
            )
    with workload.lock:
        assert mid not in workload.completed, f"{mid} was delivered again after it was completed"
        workload.completed[mid] = Completed(token, receipt)


def enqueue_tranche(client: Client, tranche: int, deadline: float, unknown: list[int]) -> None:
    numbers = range(tranche, MESSAGES, TRANCHES)
    messages = [EnqueueMessage("in", message_id(i), f"payload {i}".encode()) for i in numbers]
    until_known(lambda: client.batch(DOMAIN, messages, command_id=f"enqueue-{tranche}"), deadline, unknown)


def test_kill_9_mid_complete_processing_leaves_all_or_nothing(tmp_path: Path) -> None:
    rng = random.Random(7)  # only the kill timing is random
    root = tmp_path / "data"
    service = Service(root, tmp_path / "keyload-run.log")
    started = time.monotonic()
    deadline = started + WORKLOAD_TIMEOUT_S
    workload = Workload(deadline)
    setup_unknown = [0]
    kills = 0
    try:
        service.start()
        create_principals(root, "setup", PRINCIPAL)
        with Client(root, principal="setup", timeout_s=OUTCOME_TIMEOUT_S) as setup:
            setup.create_queue(DOMAIN, "in", QueuePolicySpec(max_attempts=1_000))
            setup.create_queue(DOMAIN, "out")
            with ThreadPoolExecutor(WORKERS) as pool:
                workers = [pool.submit(work, root, f"w{n}", workload) for n in range(WORKERS)]
                try:
                    for tranche in range(TRANCHES):
                        enqueue_tranche(setup, tranche, deadline, setup_unknown)
                        if tranche == KILLS:
                            break
                        time.sleep(rng.uniform(*KILL_AFTER_S))
                        service.kill()
                        kills += 1
                        service.start()
                except BaseException:
                    workload.failed.set()
                    raise
                finally:
                    for worker in workers:
                        worker.result(timeout=max(1.0, deadline - time.monotonic()))
        workload_s = time.monotonic() - started

        expected_done = {message_id(i) for i in range(MESSAGES) if not abandoned(i)}
        assert set(workload.completed) == expected_done
        assert set(workload.held) == {message_id(i) for i in range(MESSAGES) if abandoned(i)}

        with Client(root, principal=PRINCIPAL) as verifier:
            # Per message: everything or nothing.
            for i in range(MESSAGES):
                mid = message_id(i)
                try:
                    document = verifier.get_document(DOMAIN, f"doc/{mid}")
                    found_document: tuple[bytes, int] | None = (document.value, document.revision)
                except NotFoundError:
                    found_document = None
                try:
                    follow_up = verifier.inspect_message(DOMAIN, "out", f"out-{mid}", include_body=True)
                    found_follow_up: tuple[str, bytes | None] | None = (follow_up.meta.state, follow_up.body)
                except NotFoundError:
                    found_follow_up = None
                state = verifier.inspect_message(DOMAIN, "in", mid).meta.state
                if mid in workload.completed:
                    assert found_document == (f"processed {mid}".encode(), 1), mid
                    assert found_follow_up == ("ready", f"follow-up of {mid}".encode()), mid
                    assert state == "acked", mid
                    # The inbox entry is there: the same effects under a new command id are a recognised repeat.
                    first = workload.completed[mid]
                    repeat = verifier.complete_processing(
                        DOMAIN, first.token, effects(mid), handler_scope=SCOPE, command_id=f"verify-{mid}"
                    )
                    assert repeat.already_processed and repeat.command_id == first.receipt.command_id, mid
                    assert repeat.results == first.receipt.results, mid
                else:
                    assert (found_document, found_follow_up, state) == (None, None, "leased"), mid

            inbound = verifier.inspect_queue(DOMAIN, "in").counters
            assert (inbound.acked_total, inbound.leased, inbound.stored_messages) == (
                len(expected_done),
                len(workload.held),
                len(workload.held),
            )
            outbound = verifier.inspect_queue(DOMAIN, "out").counters
            assert outbound.stored_messages == outbound.enqueued_total == len(expected_done)
            documents = 0
            after = None
            while True:
                page = verifier.list_documents(DOMAIN, after=after, max_documents=1_000)
                documents += len(page.documents)
                if page.next_after is None:
                    break
                after = page.next_after
            assert documents == len(expected_done)

            # The messages without effects can still be processed: their leases stand.
            for mid, token in sorted(workload.held.items()):
                receipt = verifier.complete_processing(
                    DOMAIN, token, effects(mid), handler_scope=SCOPE, command_id=f"late-{mid}"
                )
                assert not receipt.already_processed
                assert verifier.get_document(DOMAIN, f"doc/{mid}").revision == 1
                assert verifier.inspect_message(DOMAIN, "in", mid).meta.state == "acked"
            assert verifier.inspect_queue(DOMAIN, "out").counters.stored_messages == MESSAGES
        assert service.stop() == 0
    finally:
        service.cleanup()
    assert_live_equals_replay(DataDir.open(root), tmp_path / "replay")
    print(
        f"\n{MESSAGES} messages, {kills} kills in {workload_s:.1f}s of workload; "
        f"{workload.unknown[0]} worker and {setup_unknown[0]} setup outcomes unknown and resubmitted "
        f"({workload.unknown_completions} completions); "
        f"{workload.lost_leases} lost leases; {service.starts} starts took {service.start_s:.1f}s"
    )
