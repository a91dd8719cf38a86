"""The coalescer (keyload/sdk/coalescer.py, docs/ARCHITECTURE.md §10) against a real `keyload run`, over
HTTP and through the file log.

What a user notices: every call's future answers with its own result or its own typed error, as the
call on its own would have; messages are enqueued once each, in the order handed in; many calls go
as few commands; a service that is away (stopped, or killed with -9 mid-load) delays the answers
and loses or doubles nothing.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload import Client, Coalescer, Credential
from keyload.commands import part_refused
from keyload.credentials import contents
from keyload.errors import (
    CoalescerTimeout,
    CommandRejected,
    CommandTooLarge,
    ConflictError,
    InvalidCommand,
    KeyloadError,
    NotFoundError,
    OutcomeTimeout,
    ValidationError,
)
from keyload.limits import MAX_INLINE_BODY_BYTES
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.operations.recovery import drill
from keyload.sdk.results import EnqueueResult, Event
from keyload.server.coalescing import Coalescing, UnknownOutcome
from keyload.server.writer import Answer
from keyload.storage.datadir import DataDir

from .support import (
    assert_each_enqueued_once,
    bearer,
    records_from,
    served_url,
    start_service,
    stop_service,
    wait_until,
)
from .test_server_crash import free_port

LONG_LINGER_MS = 60_000  # the tests' commands go when full or flushed, never by the clock


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("coalescer") / "data"
    process = start_service(root)
    try:
        yield root, served_url(root)
    finally:
        assert stop_service(process) == 0


@pytest.fixture
def client(served: tuple[Path, str]) -> Iterator[Client]:
    root, url = served
    with Client(url, credential=Credential.load(root / "credentials" / "keyload-admin.json")) as client:
        yield client


def new_domain() -> str:
    return f"co-{uuid.uuid4().hex[:12]}"


def drained(client: Client, domain: str, queue: str) -> list[tuple[str, bytes]]:
    """The queue's messages (id, body) in delivery order, each received and acked."""
    seen: list[tuple[str, bytes]] = []
    while deliveries := client.receive(domain, queue, max_messages=10).deliveries:
        seen += [(delivery.message_id, delivery.body) for delivery in deliveries]
        client.ack_batch(domain, [delivery.token for delivery in deliveries])
    return seen


def error_of(future: Future[Any]) -> BaseException | None:
    return future.exception(timeout=60)


def test_calls_from_many_threads_go_as_full_batches_and_each_message_once(client: Client) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    threads, per_thread = 8, 50
    futures: dict[str, Future[EnqueueResult]] = {}
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS) as coalescer:

        def hand_in(thread: int) -> None:
            for n in range(per_thread):
                futures[f"t{thread}-{n}"] = coalescer.enqueue("jobs", f"t{thread}-{n}".encode())

        workers = [threading.Thread(target=hand_in, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        results = {body: future.result(timeout=60) for body, future in futures.items()}
    # 400 calls, 100 to a Batch: four commands, each sent the moment it was full.
    assert (coalescer.stats.commands, coalescer.stats.messages, coalescer.stats.resent) == (4, 400, 0)
    assert sorted(result.enqueue_sequence for result in results.values()) == list(range(1, 401))
    received = drained(client, domain, "jobs")
    assert sorted(body.decode() for _, body in received) == sorted(futures)
    assert {message_id: body.decode() for message_id, body in received} == {
        result.message_id: body for body, result in results.items()
    }
    # One thread's messages keep its order.
    order = [body.decode() for _, body in received]
    for thread in range(threads):
        mine = [body for body in order if body.startswith(f"t{thread}-")]
        assert mine == [f"t{thread}-{n}" for n in range(per_thread)]


def test_a_refused_message_gets_its_own_error_and_the_others_are_enqueued_in_order(client: Client) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS) as coalescer:
        first = coalescer.enqueue("jobs", b"1", message_id="m1")
        missing = coalescer.enqueue("absent", b"2", message_id="m2")
        third = coalescer.enqueue("jobs", b"3", message_id="m3")
        reused = coalescer.enqueue("jobs", b"4", message_id="m1")
        too_large = coalescer.enqueue("jobs", b"x" * (MAX_INLINE_BODY_BYTES + 1), message_id="m5")
        last = coalescer.enqueue("jobs", b"6", message_id="m6")
        coalescer.flush(timeout_s=60)
        assert [future.result().message_id for future in (first, third, last)] == ["m1", "m3", "m6"]
        refused = error_of(missing)
        assert isinstance(refused, NotFoundError)
        assert (refused.failed_index, refused.outcome.status, refused.outcome.error_code) == (1, "rejected", "NotFound")
        assert isinstance(error_of(reused), ConflictError)
        assert str(error_of(reused)) == "Conflict: message id is already used in this queue"
        assert isinstance(error_of(too_large), ValidationError)
    # One Batch carried all six; each of its three refusals sent the rest again as a new Batch.
    assert (coalescer.stats.commands, coalescer.stats.resent, coalescer.stats.messages) == (4, 3, 3)
    assert drained(client, domain, "jobs") == [("m1", b"1"), ("m3", b"3"), ("m6", b"6")]


def test_each_coalesced_ack_answers_as_a_lone_ack_would(client: Client) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    for n in range(5):
        client.enqueue(domain, "jobs", b"x", message_id=f"m{n}")
    deliveries = client.receive(domain, "jobs", max_messages=5).deliveries
    client.ack(domain, deliveries[0].token)
    with pytest.raises(CommandRejected) as lone:
        client.ack(domain, deliveries[0].token)
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS) as coalescer:
        futures = [coalescer.ack(delivery.token) for delivery in deliveries]
        coalescer.flush(timeout_s=60)
    refusal = error_of(futures[0])
    assert type(refusal) is type(lone.value)
    assert isinstance(refusal, CommandRejected)
    assert refusal.outcome.error_code == lone.value.outcome.error_code
    assert [future.result().message_id for future in futures[1:]] == ["m1", "m2", "m3", "m4"]
    assert coalescer.stats.commands == 1
    assert client.inspect_queue(domain, "jobs").counters.stored_messages == 0


def test_enqueues_and_acks_share_one_coalescer(client: Client) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    client.enqueue(domain, "jobs", b"old", message_id="old")
    (delivery,) = client.receive(domain, "jobs").deliveries
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS) as coalescer:
        new = coalescer.enqueue("jobs", b"new", message_id="new")
        acked = coalescer.ack(delivery.token)
        coalescer.flush(timeout_s=60)
        assert new.result().message_id == "new"
        assert acked.result().message_id == "old"
    assert coalescer.stats.commands == 2
    assert drained(client, domain, "jobs") == [("new", b"new")]


def test_a_cancelled_call_is_left_out_and_a_full_coalescer_pushes_back(client: Client) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    coalescer = Coalescer(client, domain, linger_ms=LONG_LINGER_MS, max_pending=2, block_s=0)
    cancelled = coalescer.enqueue("jobs", b"a", message_id="a")
    kept = coalescer.enqueue("jobs", b"b", message_id="b")
    with pytest.raises(CoalescerTimeout):
        coalescer.enqueue("jobs", b"c", message_id="c")
    assert cancelled.cancel()
    coalescer.close()
    assert kept.result().message_id == "b"
    with pytest.raises(KeyloadError, match="closed"):
        coalescer.enqueue("jobs", b"d")
    assert drained(client, domain, "jobs") == [("b", b"b")]


def test_a_call_that_cannot_be_sent_as_given_fails_alone(client: Client) -> None:
    """A field of the wrong type makes the client refuse the whole Batch before sending it: each call
    then goes alone, so only the bad one fails (InvalidCommand, as a lone enqueue would)."""
    domain = new_domain()
    client.create_queue(domain, "jobs")
    headers = {"n": "0"}
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS) as coalescer:
        first = coalescer.enqueue("jobs", b"1", message_id="m1", headers=headers)
        headers["n"] = "1"  # handed in: the coalescer keeps its own copy
        bad = coalescer.enqueue("jobs", b"2", message_id="m2", ordering_key=5)  # type: ignore[arg-type]
        last = coalescer.enqueue("jobs", b"3", message_id="m3", headers=headers)
        coalescer.flush(timeout_s=60)
    assert isinstance(error_of(bad), InvalidCommand)
    assert (first.result().message_id, last.result().message_id) == ("m1", "m3")
    assert coalescer.stats.resent == 3
    received = client.receive(domain, "jobs", max_messages=10).deliveries
    assert [(d.message_id, d.headers) for d in received] == [("m1", {"n": "0"}), ("m3", {"n": "1"})]


def test_a_body_or_headers_of_the_wrong_type_are_refused_at_once_and_what_is_handed_in_is_copied(
    client: Client,
) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS) as coalescer:
        with pytest.raises(InvalidCommand, match="body must be bytes"):
            coalescer.enqueue("jobs", "text")  # type: ignore[arg-type]
        with pytest.raises(InvalidCommand, match="headers must map str to str"):
            coalescer.enqueue("jobs", b"x", headers={"n": 5})  # type: ignore[dict-item]
        body = bytearray(b"as handed in")
        future = coalescer.enqueue("jobs", body, message_id="m")  # type: ignore[arg-type]
        body[:] = b"changed after"
        mine = coalescer.enqueue("jobs", b"y", message_id="mine")
        mine.set_result("settled by its caller")  # left as it is; the others still go
        coalescer.flush(timeout_s=60)
    assert future.result().message_id == "m"
    assert mine.result() == "settled by its caller"
    assert drained(client, domain, "jobs") == [("m", b"as handed in")]


def test_a_full_coalescer_sends_without_waiting_out_its_linger(client: Client) -> None:
    """Callers blocked for room make the waiting command due at once, whatever the linger."""
    domain = new_domain()
    client.create_queue(domain, "jobs")
    with Coalescer(client, domain, linger_ms=LONG_LINGER_MS, max_pending=1, block_s=30) as coalescer:
        futures = [coalescer.enqueue("jobs", b"x", message_id=f"m{n}") for n in range(3)]
        assert [future.result(timeout=30).message_id for future in futures] == ["m0", "m1", "m2"]


def test_a_callback_may_hand_in_but_not_flush_or_close(client: Client) -> None:
    domain = new_domain()
    client.create_queue(domain, "jobs")
    raised: list[BaseException] = []
    followers: list[Future[EnqueueResult]] = []
    with Coalescer(client, domain) as coalescer:

        def on_done(_: Future[EnqueueResult]) -> None:
            followers.append(coalescer.enqueue("jobs", b"after", message_id="after"))
            for wait in (coalescer.flush, coalescer.close):
                try:
                    wait()
                except KeyloadError as error:
                    raised.append(error)

        coalescer.enqueue("jobs", b"first", message_id="first").add_done_callback(on_done)
        wait_until(lambda: len(raised) == 2, 30, "the callback")
    assert [str(error) for error in raised] == [
        f"{what} from a future's callback: callbacks run on the coalescer's own thread" for what in ("flush", "close")
    ]
    assert followers[0].result(timeout=0).message_id == "after"


def test_a_command_without_an_answer_gives_up_after_the_delivery_timeout(tmp_path: Path) -> None:
    """No service: each try times out, the command is tried again by its id, and one second after the
    call was handed in its future gets the OutcomeTimeout."""
    root = tmp_path / "data"
    DataDir.create(root, 2)
    with Client(root, timeout_s=0.2) as client:
        with Coalescer(client, "away", delivery_timeout_s=1.0) as coalescer:
            future = coalescer.enqueue("jobs", b"x")
            assert isinstance(error_of(future), OutcomeTimeout)
        assert coalescer.stats.commands == 1 and coalescer.stats.retries >= 2


@pytest.mark.parametrize(
    "options",
    [
        {"linger_ms": -1},
        {"linger_ms": 60_001},
        {"max_messages": 0},
        {"max_messages": 101},
        {"max_bytes": 0},
        {"max_bytes": 2 * 1024 * 1024 + 1},
        {"max_pending": 0},
        {"block_s": -1},
        {"delivery_timeout_s": -1},
    ],
)
def test_options_out_of_range_are_refused(client: Client, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidCommand):
        Coalescer(client, "d", **options)


# One call as the model says a lone enqueue would end: a message id that is new in its queue is
# enqueued; a used one is Conflict; a queue that does not exist is NotFound; an empty id Validation.
CALLS = st.lists(
    st.tuples(st.sampled_from(["jobs", "jobs", "other", "absent"]), st.sampled_from(["a", "b", "c", "d", ""])),
    min_size=1,
    max_size=30,
)


@settings(max_examples=12, deadline=None)
@given(calls=CALLS, max_messages=st.integers(1, 8), max_bytes=st.sampled_from([1, 3, 1024]))
def test_coalesced_calls_end_as_lone_calls_in_order_would(
    served: tuple[Path, str], calls: list[tuple[str, str]], max_messages: int, max_bytes: int
) -> None:
    root, url = served
    domain = new_domain()
    with Client(url, credential=Credential.load(root / "credentials" / "keyload-admin.json")) as client:
        for queue in ("jobs", "other"):
            client.create_queue(domain, queue)
        sizes: list[int] = []  # messages each command carried
        submit = client.submit

        def counted(domain: str, kind: str, body: dict[str, Any], *args: Any) -> Any:
            sizes.append(len(body["mutations"]))
            return submit(domain, kind, body, *args)

        client.submit = counted  # type: ignore[method-assign]
        with Coalescer(
            client, domain, linger_ms=LONG_LINGER_MS, max_messages=max_messages, max_bytes=max_bytes
        ) as coalescer:
            futures = [coalescer.enqueue(queue, b"xy", message_id=message_id) for queue, message_id in calls]
            coalescer.flush(timeout_s=120)
        del client.submit  # the class's again
        # Each command within the limits (bodies of 2 bytes: a max_bytes under 4 sends them one by one),
        # and the first carried as many as fit.
        assert max(sizes) <= (max_messages if max_bytes >= 4 else 1)
        assert sizes[0] == min(len(calls), max_messages if max_bytes >= 4 else 1)
        used: dict[str, list[str]] = {"jobs": [], "other": []}
        for (queue, message_id), future in zip(calls, futures, strict=True):
            error = error_of(future)
            if queue == "absent":
                assert isinstance(error, NotFoundError)
            elif message_id == "":
                assert isinstance(error, ValidationError)
            elif message_id in used[queue]:
                assert isinstance(error, ConflictError)
            else:
                assert error is None, error
                used[queue].append(message_id)
        for queue, ids in used.items():
            assert [message_id for message_id, _ in drained(client, domain, queue)] == ids


def test_calls_wait_out_a_stopped_service_and_apply_once(tmp_path: Path) -> None:
    """Through the file log: the outcomes do not come while no service runs, so each command is
    appended again by its command id until the service is back; each message is enqueued once."""
    root = tmp_path / "data"
    service = start_service(root, "--listen", "none")
    with Client(root) as admin:
        admin.create_queue("away", "jobs")
    assert stop_service(service) == 0
    with Client(root, timeout_s=0.5) as client, Coalescer(client, "away", linger_ms=0, max_messages=2) as coalescer:
        futures = [coalescer.enqueue("jobs", f"p0-{n}".encode(), message_id=f"p0-{n}") for n in range(5)]
        wait_until(lambda: coalescer.stats.retries >= 2, 30, "the coalescer to try again")
        assert not any(future.done() for future in futures)
        service = start_service(root, "--listen", "none")
        try:
            assert [future.result(timeout=60).message_id for future in futures] == [f"p0-{n}" for n in range(5)]
        finally:
            coalescer.close()
            assert stop_service(service) == 0
    assert coalescer.stats.commands == 3
    service = start_service(root, "--listen", "none")
    try:
        with Client(root) as admin:
            assert_each_enqueued_once(admin, "away", "jobs", 1, 5)
    finally:
        assert stop_service(service) == 0


PRODUCERS = 4
GIVE_UP_S = 180.0  # how long a producer may block for room while the server is away
MESSAGES = 200  # per producer (the queue leases up to 1,000 at once: all of them are received to check)


@pytest.mark.slow
def test_a_server_killed_mid_load_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """kill -9 of `keyload run` while four threads hand messages to one coalescer over HTTP: the
    commands in flight are sent again by their ids through the restart, every future answers with
    its message's result, each message is in the queue once, and the drill passes."""
    root = tmp_path / "data"
    listen = f"127.0.0.1:{free_port()}"
    url = f"http://{listen}"
    service = start_service(root, "--listen", listen)
    credential = Credential.load(root / "credentials" / "keyload-admin.json")
    futures: list[Future[EnqueueResult]] = []
    with Client(url, credential=credential, timeout_s=5) as client:
        client.create_queue("crash", "jobs")
        coalescer = Coalescer(client, "crash", max_messages=20, max_pending=100, block_s=GIVE_UP_S)

        killed = threading.Event()

        def produce(producer: int) -> None:
            for n in range(MESSAGES):
                if n == MESSAGES * 2 // 3:
                    killed.wait()  # the last third is handed in after the kill: tried while the server is down
                futures.append(coalescer.enqueue("jobs", f"p{producer}-{n}".encode(), message_id=f"p{producer}-{n}"))

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: coalescer.stats.messages >= PRODUCERS * MESSAGES // 3, 120, "a third of the messages")
            service.send_signal(signal.SIGKILL)
            service.wait()
            killed.set()
            time.sleep(0.5)  # the coalescer meets a server that is not there
            service = start_service(root, "--listen", listen)
            for thread in threads:
                thread.join(180)
            coalescer.close()
            answered = [future.result(timeout=0) for future in futures]
        finally:
            if service.poll() is None:
                assert stop_service(service, 30) == 0
    assert len(answered) == PRODUCERS * MESSAGES
    assert coalescer.stats.retries > 0, "commands were tried while the server was down"
    service = start_service(root, "--listen", listen)
    try:
        with Client(url, credential=credential) as admin:
            assert_each_enqueued_once(admin, "crash", "jobs", PRODUCERS, MESSAGES)
    finally:
        assert stop_service(service, 30) == 0
    data = DataDir.open(root)
    report = drill(data, partition_for("crash", data.partitions), tmp_path / "drill", progress=False)
    assert report.passed, report


# -- the server's coalescing (keyload/server/coalescing.py) ---------------------------------------------


COALESCE = {"Keyload-Coalesce": "true"}


def in_threads(work: Callable[[int], None], count: int) -> None:
    """`work(i)` for i in 0..count-1, each on a thread of its own, all at once; returns when all are done."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def batches_appended(http: httpx.Client) -> dict[str, float]:
    """How many commands of each kind the server has appended and had answered (its /metrics)."""
    counts: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("keyload_outcome_latency_seconds_count{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            counts[kind] = float(line.rsplit(" ", 1)[1])
    return counts


def test_coalesced_enqueue_requests_are_answered_each_as_a_lone_enqueue(served: tuple[Path, str]) -> None:
    """16 threads post enqueues with `Keyload-Coalesce: true`: each gets its own result (the Batch
    that carried it named) or its own refusal (every seventh names a queue that does not exist), the
    server appends Batches and no Enqueue, and every message it accepted is in the queue once."""
    root, url = served
    domain = new_domain()
    with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as http:
        assert http.put(f"/v1/domains/{domain}/queues/jobs", json={}).status_code == 200
        before = batches_appended(http)
        answers: list[httpx.Response] = []
        refused: list[httpx.Response] = []  # every seventh message goes to a queue that does not exist

        def post(thread: int) -> None:
            with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as mine:
                for n in range(20):
                    queue = "absent" if n % 7 == 3 else "jobs"
                    body = {"body": "eA==", "message_id": f"t{thread}-{n}"}
                    response = mine.post(f"/v1/domains/{domain}/queues/{queue}/messages", json=body, headers=COALESCE)
                    (refused if queue == "absent" else answers).append(response)

        in_threads(post, 16)
        assert {(r.status_code, r.json()["error_code"], r.json()["detail"]) for r in refused} == {
            (404, "NotFound", "queue does not exist")
        }
        assert {response.status_code for response in answers} == {200}
        results = [response.json() for response in answers]
        assert all(r["result"]["queue"] == "jobs" and r["failed_index"] is None for r in results)
        assert [response.headers["Keyload-Command-Id"] for response in answers] == [r["command_id"] for r in results]
        assert sorted(r["result"]["enqueue_sequence"] for r in results) == list(range(1, len(answers) + 1))
        after = batches_appended(http)
        assert after.get("Enqueue", 0) == before.get("Enqueue", 0)  # coalesced messages go only in Batches
        assert after["Batch"] > before.get("Batch", 0)

        used = http.post(
            f"/v1/domains/{domain}/queues/jobs/messages", json={"body": "eA==", "message_id": "t0-0"}, headers=COALESCE
        )
        assert (used.status_code, used.json()["error_code"], used.json()["detail"]) == (
            409,
            "Conflict",
            "message id is already used in this queue",
        )
        missing = http.post(
            f"/v1/domains/{domain}/queues/absent/messages",
            content=b"raw",
            headers={**COALESCE, "Content-Type": "application/octet-stream"},
        )
        assert (missing.status_code, missing.json()["error_code"]) == (404, "NotFound")
        raw = http.post(
            f"/v1/domains/{domain}/queues/jobs/messages",
            content=b"raw",
            headers={**COALESCE, "Content-Type": "application/octet-stream"},
        )
        assert raw.status_code == 200
        assert raw.json()["result"]["message_id"] not in ("", raw.json()["command_id"])  # the request's own id
    with Client(url, credential=Credential.load(root / "credentials" / "keyload-admin.json")) as client:
        ids = sorted(message_id for message_id, _ in drained(client, domain, "jobs"))
    enqueued = [f"t{t}-{n}" for t in range(16) for n in range(20) if n % 7 != 3]
    assert ids == sorted([*enqueued, raw.json()["result"]["message_id"]])


@dataclass
class AckRun:
    """What 16 threads' coalesced acks got (`acks_of_16_threads`)."""

    lone: httpx.Response  # the last lease's ack, sent alone: what a lone ack answers
    answers: dict[Any, httpx.Response]  # by each lease's key
    refused: list[tuple[httpx.Response, httpx.Response]]  # (answer, its lone reference)
    appended: dict[str, float]  # the commands the server appended meanwhile, by kind


def acks_of_16_threads(url: str, root: Path, path: str, leases: list[tuple[Any, str]]) -> AckRun:
    """The last of `leases` ((key, token) pairs) acked at `path` alone, then again, and a forged token
    sent alone: the references. Then 16 threads ack the other leases, a share each, with
    `Keyload-Coalesce: true`, and each acks its share's first lease again and sends the forged token."""
    *shared, (_, last) = leases
    forged = last[:-4] + ("AAAA" if not last.endswith("AAAA") else "BBBB")
    share = len(shared) // 16
    answers: dict[Any, httpx.Response] = {}
    refused: list[tuple[httpx.Response, httpx.Response]] = []
    with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as http:
        lone = http.post(path, json={"token": last})
        twice, bad = http.post(path, json={"token": last}), http.post(path, json={"token": forged})
        assert (lone.status_code, twice.status_code, twice.json()["error_code"]) == (200, 409, "StaleLease")
        assert bad.status_code in (403, 409)  # refused as its resource's token checks find it
        before = batches_appended(http)

        def ack_all(thread: int) -> None:
            mine = shared[thread * share : thread * share + share]
            with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as own:
                for key, token in mine:
                    answers[key] = own.post(path, json={"token": token}, headers=COALESCE)
                refused.append((own.post(path, json={"token": mine[0][1]}, headers=COALESCE), twice))
                refused.append((own.post(path, json={"token": forged}, headers=COALESCE), bad))

        in_threads(ack_all, 16)
        after = batches_appended(http)
    return AckRun(lone, answers, refused, {kind: count - before.get(kind, 0) for kind, count in after.items()})


def test_coalesced_ack_requests_are_answered_each_as_a_lone_ack(client: Client, served: tuple[Path, str]) -> None:
    """16 threads ack leases with `Keyload-Coalesce: true`, each also acking one lease twice and
    sending a forged token: an acked lease's answer is the LeaseResult a lone Ack gives, a refusal is
    the lone Ack's own (status, code, detail, the request's own command id); the server appends
    AckBatches, and an Ack only for each refused token; every message is acked once."""
    root, url = served
    domain = new_domain()
    client.create_queue(domain, "jobs")
    for n in range(16 * 10 + 1):
        client.enqueue(domain, "jobs", b"x", message_id=f"m{n}")
    leases = [d for _ in range(17) for d in client.receive(domain, "jobs", max_messages=10).deliveries]
    assert [lease.message_id for lease in leases] == [f"m{n}" for n in range(161)]
    run = acks_of_16_threads(url, root, f"/v1/domains/{domain}/leases/ack", [(d.message_id, d.token) for d in leases])

    reference = run.lone.json()
    assert reference["result"] == {
        "message_id": "m160",
        "state": "acked",
        "lease_until_ms": None,
        "not_before_ms": None,
        "retry_delay_ms": None,
    }
    assert len(run.answers) == 160
    assert_answered_as_alone(
        run.answers, reference, lambda message_id: {**reference["result"], "message_id": message_id}
    )
    assert_refused_as_alone(run.refused)
    assert run.appended.get("Ack", 0) == 32  # only the refused tokens went as lone Acks
    assert run.appended["AckBatch"] < 16 * 12  # some AckBatch carried more than one
    assert client.inspect_queue(domain, "jobs").counters.acked_total == 161


def test_coalesced_group_ack_requests_are_answered_each_as_a_lone_group_ack(
    client: Client, served: tuple[Path, str]
) -> None:
    """16 threads ack a subscription group's positions with `Keyload-Coalesce: true`, each also
    acking one position twice and sending a forged token: an acked position's answer is the
    GroupLeaseResult a lone GroupAck gives, with the checkpoint right after that ack (feature level
    10); a refusal is the lone GroupAck's own; the server appends GroupAckBatches, and a GroupAck
    only for each refused token; every position is acked once and the checkpoint passes them all."""
    root, url = served
    domain = new_domain()
    last = 16 * 6 + 1
    client.create_topic(domain, "news")
    client.publish(domain, "news", [Event(f"e{n}", "t", b"x") for n in range(1, last + 1)])
    client.create_group(domain, "news", "g")
    leases = [d for _ in range(10) for d in client.group_receive(domain, "news", "g", max_events=10).deliveries]
    assert [lease.position for lease in leases] == list(range(1, last + 1))
    path = f"/v1/domains/{domain}/topics/news/groups/g/ack"
    run = acks_of_16_threads(url, root, path, [(d.position, d.token) for d in leases])

    reference = run.lone.json()
    assert reference["result"] == {
        "position": last,
        "state": "acked",
        "checkpoint": 0,  # positions 1..96 were still leased
        "lease_until_ms": None,
        "not_before_ms": None,
        "retry_delay_ms": None,
    }
    assert sorted(run.answers) == list(range(1, last))
    after_own_ack = checkpoints_after_each_ack(root, domain, {lease.token: lease.position for lease in leases})
    assert_answered_as_alone(
        run.answers, reference, lambda at: {**reference["result"], "position": at, "checkpoint": after_own_ack[at]}
    )
    assert_refused_as_alone(run.refused)
    assert run.appended.get("GroupAck", 0) == 32  # only the refused tokens went alone
    assert run.appended["GroupAckBatch"] < 16 * 8  # some carried more than one
    view = client.group_status(domain, "news", "g")
    assert (view.checkpoint, view.outstanding, view.acked_total) == (last, 0, last)


def assert_answered_as_alone(
    answers: dict[Any, httpx.Response], reference: dict[str, Any], result_of: Callable[[Any], dict[str, Any]]
) -> None:
    """Each coalesced request's answer reads as its lone command's (`reference`): 200, the same fields
    in the same order, `result_of` its key as its result, committed, the carrying command named."""
    for key, response in answers.items():
        body = response.json()
        assert response.status_code == 200
        assert list(body) == list(reference)
        assert body["result"] == result_of(key)
        assert (body["status"], body["error_code"], body["detail"], body["failed_index"]) == (
            "committed",
            None,
            "",
            None,
        )
        assert response.headers["Keyload-Command-Id"] == body["command_id"]


def assert_refused_as_alone(refused: list[tuple[httpx.Response, httpx.Response]]) -> None:
    """Each refused coalesced request got its lone reference's status, code and detail, and went alone
    under a command id of its own."""
    for response, alone in refused:
        assert (response.status_code, response.json()["error_code"], response.json()["detail"]) == (
            alone.status_code,
            alone.json()["error_code"],
            alone.json()["detail"],
        )
    assert len({response.json()["command_id"] for response, _ in refused}) == len(refused)


def checkpoints_after_each_ack(root: Path, domain: str, positions: dict[str, int]) -> dict[int, int]:
    """Each position's group checkpoint right after its ack, worked out from the GroupAcks and
    GroupAckBatches of `domain` in log order (`positions`: each lease's token; a token of no lease, or
    of a position acked already, acks nothing)."""
    data = DataDir.open(root)
    acked: set[int] = set()
    checkpoint, after_ack = 0, {}
    for record in records_from(data.file_command_log(), partition_for(domain, data.partitions), 0):
        command = REGISTRY.decode("keyload.Command", contents(record.value))
        kind, body = command["body"]
        if command["domain"] != domain or kind not in ("keyload.command.GroupAck", "keyload.command.GroupAckBatch"):
            continue
        for token in body["tokens"] if "tokens" in body else [body["token"]]:
            position = positions.get(token)
            if position is None or position in acked:
                continue
            acked.add(position)
            while checkpoint + 1 in acked:
                checkpoint += 1
            after_ack[position] = checkpoint
    return after_ack


@pytest.mark.parametrize(
    ("path", "headers", "detail"),
    [
        ("queues/jobs/messages", {"Keyload-Coalesce": "yes"}, "Keyload-Coalesce must be true or false"),
        (
            "queues/jobs/messages",
            {"Keyload-Coalesce": "true", "Idempotency-Key": "k"},
            "Keyload-Coalesce and Idempotency-Key together",
        ),
        ("leases/ack", {"Keyload-Coalesce": "true", "Idempotency-Key": "k"}, "Keyload-Coalesce and Idempotency-Key"),
        ("leases/nack", {"Keyload-Coalesce": "true"}, "Keyload-Coalesce is for enqueueing one message or acking"),
    ],
)
def test_coalescing_asked_of_what_cannot_be_coalesced_is_refused(
    served: tuple[Path, str], path: str, headers: dict[str, str], detail: str
) -> None:
    root, url = served
    domain = new_domain()
    with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as http:
        response = http.post(f"/v1/domains/{domain}/{path}", json={"body": "eA==", "token": "t"}, headers=headers)
    assert (response.status_code, response.json()["error_code"]) == (400, "Validation")
    assert response.json()["detail"].startswith(detail)


# The server's gathering, on its own: a service that applies a Batch as the processor does (each
# message in order, the first refused one refusing the whole), and counts what it was sent.


RECORD_LIMIT = 2_000  # the fake log's, in characters of message ids


class BatchService:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str]]] = []  # (command kind, message ids) of each command appended
        self.queued: list[str] = []
        self.refuse: set[str] = set()  # message ids refused with NotFound
        self.timeout = False

    async def submit(self, credential: Credential, command_id: str, domain: str, partition: int, body: Any) -> Answer:
        await asyncio.sleep(0)  # an append and an outcome take turns of the event loop
        kind, datum = body[0].rsplit(".", 1)[1], body[1]
        ids = [m["mutation"][1]["message_id"] for m in datum["mutations"]] if kind == "Batch" else [datum["message_id"]]
        if sum(map(len, ids)) > RECORD_LIMIT:
            raise CommandTooLarge("the command is over the record limit; nothing was appended")
        self.sent.append((kind, ids))
        if self.timeout:
            raise TimeoutError
        record = {"command_id": command_id, "domain": domain, "status": "committed", "detail": "", "result": None}
        for index, message_id in enumerate(ids):
            if message_id in self.refuse:
                detail = part_refused(index, "queue does not exist") if kind == "Batch" else "queue does not exist"
                failed = index if kind == "Batch" else None
                return Answer(
                    {**record, "status": "rejected", "error_code": "NotFound", "detail": detail, "failed_index": failed}
                )
        self.queued += ids
        results = [("keyload.result.EnqueueResult", {"message_id": message_id}) for message_id in ids]
        result = ("keyload.result.BatchResult", {"results": results}) if kind == "Batch" else results[0]
        return Answer({**record, "error_code": None, "result": result})


def gathered(service: BatchService, requests: list[tuple[str, str]]) -> list[Any]:
    """Each request (principal, message id) sent at once through one Coalescing: its answer's record or error."""
    coalescing = Coalescing(service.submit, "30 s")

    async def one(principal: str, message_id: str) -> Any:
        credential = Credential(principal, "k1", b"s" * 32)
        enqueue = {"message_id": message_id, "body": b"x", "headers": {}, "ordering_key": None}
        try:
            return (await coalescing.submit("Enqueue", credential, f"c-{message_id}", "d", 0, enqueue)).record
        except Exception as error:
            return error

    async def all_of() -> list[Any]:
        return await asyncio.gather(*(one(principal, message_id) for principal, message_id in requests))

    return asyncio.run(all_of())


def test_the_server_gathers_one_callers_requests_in_order_up_to_the_count() -> None:
    service = BatchService()
    answers = gathered(service, [("alice", f"m{n}") for n in range(250)] + [("bob", "b0")])
    assert [answer["result"][1]["message_id"] for answer in answers] == [f"m{n}" for n in range(250)] + ["b0"]
    # All came in one turn of the event loop: alice's by the hundred, in order; bob's apart.
    assert [len(ids) for _, ids in service.sent if ids[0] != "b0"] == [100, 100, 50]
    assert ("Batch", ["b0"]) in service.sent


def test_the_server_answers_a_refused_message_alone_and_sends_the_rest_again() -> None:
    service = BatchService()
    service.refuse = {"m3", "m5"}
    answers = gathered(service, [("alice", f"m{n}") for n in range(8)])
    refused = {answer["result"] is None and answer["detail"] for answer in answers if answer["status"] == "rejected"}
    assert refused == {"queue does not exist"}
    statuses = [answer["status"] for answer in answers]
    assert statuses == ["committed"] * 3 + ["rejected", "committed", "rejected"] + ["committed"] * 2
    assert all(answer["failed_index"] is None for answer in answers)
    assert service.queued == ["m0", "m1", "m2", "m4", "m6", "m7"]


def test_the_server_sends_a_batch_it_cannot_encode_message_by_message_each_alone() -> None:
    service = BatchService()
    long_id = "x" * (RECORD_LIMIT + 1)  # over the fake record limit even alone
    answers = gathered(service, [("alice", "a"), ("alice", "b"), ("alice", long_id), ("alice", "c")])
    assert isinstance(answers[2], CommandTooLarge)
    assert [answer["result"][1]["message_id"] for answer in (answers[0], answers[1], answers[3])] == ["a", "b", "c"]
    assert [answer["command_id"] for answer in (answers[0], answers[1], answers[3])] == ["c-a", "c-b", "c-c"]
    # The four together were never appended; each went as its own Enqueue, under its request's id.
    assert service.sent == [("Enqueue", ["a"]), ("Enqueue", ["b"]), ("Enqueue", ["c"])]


def test_a_batch_without_an_outcome_tells_each_request_how_to_learn_it() -> None:
    service = BatchService()
    service.timeout = True
    (answer,) = gathered(service, [("alice", "m1")])
    assert isinstance(answer, UnknownOutcome) and isinstance(answer, TimeoutError)
    assert "message 'm1'" in str(answer) and "enqueue the message again under that message_id" in str(answer)


class AckService:
    """Applies an AckBatch as the processor does: each token alone; "good" tokens are acked once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, list[str]]] = []  # (kind, command id, tokens) of each command
        self.acked: set[str] = set()
        self.in_flight = self.most_in_flight = 0
        self.silent: set[str] = set()  # tokens whose lone Ack gets no outcome in time

    async def submit(self, credential: Credential, command_id: str, domain: str, partition: int, body: Any) -> Answer:
        kind, datum = body[0].rsplit(".", 1)[1], body[1]
        tokens = datum["tokens"] if kind == "AckBatch" else [datum["token"]]
        self.sent.append((kind, command_id, tokens))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)  # an append and its outcome
        self.in_flight -= 1
        if kind == "Ack" and datum["token"] in self.silent:
            raise TimeoutError
        record = {"command_id": command_id, "domain": domain, "detail": "", "failed_index": None}
        results = []
        for token in tokens:
            if token.startswith("good") and token not in self.acked:
                self.acked.add(token)
                results.append({"status": "committed", "error_code": None, "message_id": token.upper()})
            else:
                results.append({"status": "rejected", "error_code": "StaleLease", "message_id": None})
        if kind == "AckBatch":
            result = ("keyload.result.AckBatchResult", {"results": results})
            return Answer({**record, "status": "committed", "error_code": None, "result": result})
        (only,) = results
        if only["status"] == "committed":
            lease = {"message_id": only["message_id"], "state": "acked"}
            return Answer({**record, "status": "committed", "error_code": None, "result": ("LeaseResult", lease)})
        return Answer({**record, "status": "rejected", "error_code": "StaleLease", "detail": "stale", "result": None})


def acks_coalesced(service: AckService, tokens: list[str], cancelled: frozenset[int] = frozenset()) -> list[Any]:
    """Each token acked at once through one Coalescing, the requests at `cancelled` given up by their
    clients while the AckBatch is in flight: each answer's record or error."""
    coalescing = Coalescing(service.submit, "30 s")
    credential = Credential("alice", "k1", b"s" * 32)

    async def one(n: int, token: str) -> Any:
        try:
            return (await coalescing.submit("Ack", credential, f"c{n}", "d", 0, {"token": token})).record
        except BaseException as error:  # a cancelled request's CancelledError too
            return error

    async def all_of() -> list[Any]:
        requests = [asyncio.create_task(one(n, token)) for n, token in enumerate(tokens)]
        await asyncio.sleep(0.005)
        for n in cancelled:
            requests[n].cancel()
        return await asyncio.gather(*requests)

    return asyncio.run(all_of())


def test_the_server_answers_acked_tokens_from_the_batch_and_sends_refused_ones_alone_together() -> None:
    service = AckService()
    tokens = ["good1", "bad1", "good2", "good1"]
    answers = acks_coalesced(service, tokens)
    batch_id = service.sent[0][1]
    assert service.sent[0] == ("AckBatch", batch_id, tokens)
    assert sorted(service.sent[1:]) == [("Ack", "c1", ["bad1"]), ("Ack", "c3", ["good1"])]
    assert service.most_in_flight == 2  # the two refused acks went alone at once
    assert [(a["command_id"], a["status"]) for a in answers] == [
        (batch_id, "committed"),
        ("c1", "rejected"),
        (batch_id, "committed"),
        ("c3", "rejected"),
    ]
    assert answers[0]["result"] == (
        "keyload.result.LeaseResult",
        {
            "message_id": "GOOD1",
            "state": "acked",
            "lease_until_ms": None,
            "not_before_ms": None,
            "retry_delay_ms": None,
        },
    )
    assert answers[1]["detail"] == "stale"


def test_a_refused_ack_without_an_outcome_alone_is_an_ordinary_timeout_and_a_gone_request_is_not_sent() -> None:
    service = AckService()
    service.silent = {"bad1"}
    answers = acks_coalesced(service, ["good1", "bad1", "bad2"], cancelled=frozenset({2}))
    assert answers[0]["status"] == "committed"
    # Its own Ack was appended under its own id: the ordinary 504, which names that id, not UnknownOutcome.
    assert type(answers[1]) is TimeoutError
    assert isinstance(answers[2], asyncio.CancelledError)
    assert [kind for kind, _, _ in service.sent] == ["AckBatch", "Ack"]  # bad2's client had gone


def test_an_ack_batch_without_an_outcome_tells_each_request_how_to_learn_it() -> None:
    async def silent(credential: Credential, command_id: str, domain: str, partition: int, body: Any) -> Answer:
        raise TimeoutError

    async def one() -> BaseException:
        coalescing = Coalescing(silent, "30 s")
        try:
            await coalescing.submit("Ack", Credential("alice", "k1", b"s" * 32), "c0", "d", 0, {"token": "t"})
        except UnknownOutcome as error:
            return error
        raise AssertionError("answered without an outcome")

    error = asyncio.run(one())
    assert str(error).startswith("no outcome within 30 s for AckBatch ")
    assert "ack again with the same token" in str(error)


def test_the_server_carries_each_groups_acks_in_a_group_ack_batch_of_its_own() -> None:
    """One caller's acks to two groups of a topic, and to a group of the same name on another topic, go in
    GroupAckBatches of their own, each naming its topic and group;
    each acked request is answered with its token's checkpoint, or the batch's where the token's
    result has none (a partition below feature level 10)."""
    sent: list[tuple[str, Any]] = []

    async def submit(credential: Credential, command_id: str, domain: str, partition: int, body: Any) -> Answer:
        kind, datum = body[0].rsplit(".", 1)[1], body[1]
        sent.append((kind, datum))
        await asyncio.sleep(0.01)  # an append and its outcome
        results = [
            {
                "status": "committed",
                "error_code": None,
                "position": int(token[1:]),
                "checkpoint": None if datum["group"] == "old" else int(token[1:]),
            }
            for token in datum["tokens"]
        ]
        result = ("keyload.result.GroupAckBatchResult", {"results": results, "checkpoint": 7})
        record = {"command_id": command_id, "domain": domain, "detail": "", "failed_index": None}
        return Answer({**record, "status": "committed", "error_code": None, "result": result})

    async def all_of() -> list[Answer]:
        coalescing = Coalescing(submit, "30 s")
        credential = Credential("alice", "k1", b"s" * 32)
        lines = [("t", "new"), ("t", "old"), ("t", "new"), ("t", "old"), ("u", "new")]
        return await asyncio.gather(
            *(
                coalescing.submit("GroupAck", credential, f"c{n}", "d", 0, {"topic": t, "group": g, "token": f"p{n}"})
                for n, (t, g) in enumerate(lines)
            )
        )

    answers = asyncio.run(all_of())
    assert sorted((kind, datum["topic"], datum["group"], datum["tokens"]) for kind, datum in sent) == [
        ("GroupAckBatch", "t", "new", ["p0", "p2"]),
        ("GroupAckBatch", "t", "old", ["p1", "p3"]),
        ("GroupAckBatch", "u", "new", ["p4"]),
    ]
    assert answers[2].record["result"] == (
        "keyload.result.GroupLeaseResult",
        {
            "position": 2,
            "state": "acked",
            "checkpoint": 2,
            "lease_until_ms": None,
            "not_before_ms": None,
            "retry_delay_ms": None,
        },
    )
    assert [answer.record["result"][1]["checkpoint"] for answer in answers] == [0, 7, 2, 7, 4]


def test_a_coalesced_request_a_halted_partition_refuses_names_no_command_id(tmp_path: Path) -> None:
    """A halted partition refuses a request 503 before anything is appended: a lone request names its
    command id (a resend by it learns the outcome once the partition serves), a coalesced one none,
    since its own id would never be appended: it is sent again as a new request.

    The partition is one whose projection was moved aside over a damaged log: rebuilt, it applies the
    records in front of the damage (its policy: the callers are authenticated, 503 not 401) and
    halts there alone, the other partitions served. The service once stopped at start instead (the
    EnableAccessControl a fresh projection gets could not find the damaged log's end)."""
    root = tmp_path / "data"
    domain = "halting"
    service = start_service(root)
    try:
        with httpx.Client(base_url=served_url(root), headers=bearer(root), timeout=60) as http:
            assert http.put(f"/v1/domains/{domain}/queues/jobs").status_code == 200
            for _ in range(3):
                assert http.post(f"/v1/domains/{domain}/queues/jobs/messages", json={"body": "eA=="}).status_code == 200
    finally:
        assert stop_service(service) == 0
    data = DataDir.open(root)
    partition = partition_for(domain, data.partitions)
    [segment] = sorted((root / "log" / "commands" / f"p-{partition:04d}").glob("*.seg"))
    damaged = bytearray(segment.read_bytes())
    damaged[len(damaged) // 2] ^= 0x40
    segment.write_bytes(bytes(damaged))
    # Its projection moved aside: rebuilt from the log's start, into the damage, where it halts alone
    # (the service once stopped there, at the EnableAccessControl it appends to a fresh projection).
    shutil.rmtree(data.projection(partition))
    service = start_service(root)
    try:
        with httpx.Client(base_url=served_url(root), headers=bearer(root), timeout=60) as http:
            wait_until(lambda: str(partition) in http.get("/readyz").json()["halted"], 60, "the halt")
            enqueue = f"/v1/domains/{domain}/queues/jobs/messages"
            lone = http.post(enqueue, json={"body": "eA=="}, headers={"Idempotency-Key": "lone-1"})
            coalesced = http.post(enqueue, json={"body": "eA=="}, headers=COALESCE)
            elsewhere = next(
                d for d in (f"other-{n}" for n in range(64)) if partition_for(d, data.partitions) != partition
            )
            assert http.put(f"/v1/domains/{elsewhere}/queues/jobs").status_code == 200
    finally:
        assert stop_service(service) == 1  # a partition halted (§3)
    for response, named in ((lone, "lone-1"), (coalesced, None)):
        assert (response.status_code, response.json()["error_code"]) == (503, "Unavailable"), response.text
        assert (response.json()["command_id"], response.headers.get("Keyload-Command-Id")) == (named, named)
