"""The HTTP API (docs/ARCHITECTURE.md §10a) against one real `keyload run`, driven by a real HTTP client.

What a user of the API notices: the outcome of each command as JSON with its HTTP status, idempotent
repeats by Idempotency-Key, long polls answered by a later enqueue, credentials refused at the edge
with nothing appended, refusals of the policy with their code, malformed requests refused with a
message that names the field, and the OpenAPI document served as checked in.

Every test uses a domain of its own, so the tests share one service without interfering.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyload import AsyncClient, Capability, Client, Credential, Delivery, Grant, QueuePolicySpec
from keyload.credentials import CredentialError, contents
from keyload.errors import (
    CommandTooLarge,
    InvalidCommand,
    KeyloadError,
    NotFoundError,
    PermissionDeniedError,
    RevisionConflictError,
    ServiceUnavailable,
)
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.processors.outcomes import OUTCOME
from keyload.projections import keys
from keyload.projections.records import PayloadReservation, ReservationState
from keyload.projections.store import Store
from keyload.sdk.envelope import encode_command
from keyload.sdk.payloads import PayloadError
from keyload.server import openapi
from keyload.server.payloads import UploadHandles
from keyload.server.writer import Answer
from keyload.storage import keyring
from keyload.storage.datadir import DataDir
from keyload.wire import COALESCE_HEADER, UPLOAD_HANDLE_HEADER

from .support import (
    bearer,
    keyload_command,
    race_under_one_key,
    served_url,
    start_service,
    stop_service,
    wait_until,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    """Every test runs against `keyload run` alone and with a worker process beside it (`--workers 2`:
    partitions 1 and 3 are the worker's), which must answer alike."""
    count: int = request.param
    return count


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, workers: int) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("http") / "data"
    process = start_service(root, "--workers", str(workers))
    try:
        yield root, served_url(root)
    finally:
        assert stop_service(process) == 0


@pytest.fixture
def api(served: tuple[Path, str]) -> Iterator[httpx.Client]:
    root, url = served
    with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as client:
        yield client


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def domain() -> str:
    return f"http-{uuid.uuid4().hex[:12]}"


def domain_of(root: Path, worker: int, workers: int) -> str:
    """A new domain whose partition worker `worker` of `workers` serves (worker 0: `keyload run` itself)."""
    partitions = DataDir.open(root).partitions
    return next(name for name in iter(domain, None) if partition_for(name, partitions) % workers == worker)


def log_end(root: Path, of_domain: str) -> int:
    data = DataDir.open(root)
    with data.file_command_log() as log:
        return log.end_offset(partition_for(of_domain, data.partitions))


def long_poll(url: str, headers: dict[str, str], path: str) -> tuple[threading.Thread, list[httpx.Response]]:
    """A 20 s long-poll receive sent from a thread with `headers`, once it is recorded as a waiter:
    the thread, and the list its response lands in."""
    answered: list[httpx.Response] = []

    def poll() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as own:
            answered.append(own.post(path, json={"wait_ms": 20_000}))

    waiting = threading.Thread(target=poll)
    waiting.start()
    time.sleep(0.5)  # the receive is recorded as a waiter first
    return waiting, answered


def new_queue(api: httpx.Client, name: str, policy: dict[str, Any] | None = None) -> tuple[str, str]:
    """A queue of a domain of its own: (the domain, the queue's path)."""
    d = domain()
    queue = f"/v1/domains/{d}/queues/{name}"
    committed(api.put(queue, json={"policy": policy or {}}))
    return d, queue


def committed(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "committed"
    assert response.headers["keyload-command-id"] == body["command_id"]
    result: dict[str, Any] = body["result"]
    return result


def test_enqueue_receive_ack(api: httpx.Client) -> None:
    d = domain()
    queue = f"/v1/domains/{d}/queues/orders"
    assert committed(api.put(queue, json={"policy": {"max_attempts": 3}}))["policy"]["max_attempts"] == 3
    enqueued = committed(api.post(f"{queue}/messages", json={"message_id": "m-1", "body": b64(b"\x00\xffhello")}))
    assert (enqueued["message_id"], enqueued["state"], enqueued["stored_messages"]) == ("m-1", "ready", 1)
    raw = api.post(
        f"{queue}/messages",
        params={"message_id": "m-2"},
        content=b"raw \x01",
        headers={"content-type": "application/octet-stream"},
    )
    assert committed(raw)["stored_bytes"] == len(b"\x00\xffhello") + len(b"raw \x01")
    take = {"Idempotency-Key": f"take-{d}"}
    deliveries = committed(api.post(f"{queue}/receive", json={"max_messages": 5}, headers=take))["deliveries"]
    assert [(m["message_id"], base64.b64decode(m["body"]), m["attempts"]) for m in deliveries] == [
        ("m-1", b"\x00\xffhello", 1),
        ("m-2", b"raw \x01", 1),
    ]
    for delivery in deliveries:
        assert committed(api.post(f"/v1/domains/{d}/leases/ack", json={"token": delivery["token"]}))["state"] == "acked"
    # The receive again under its key: the same leases, each as it stands now: acked, so no body.
    repeat = committed(api.post(f"{queue}/receive", json={"max_messages": 5}, headers=take))["deliveries"]
    assert [(m["message_id"], m["error_code"], m["body"]) for m in repeat] == [
        ("m-1", "StaleLease", ""),
        ("m-2", "StaleLease", ""),
    ]
    again = api.post(f"/v1/domains/{d}/leases/ack", json={"token": deliveries[0]["token"]})
    assert again.status_code == 409
    assert (again.json()["status"], again.json()["error_code"]) == ("rejected", "StaleLease")
    view = committed(api.get(queue))
    assert view["counters"]["stored_messages"] == 0


def test_nack_retries_and_dead_letters_over_http(api: httpx.Client) -> None:
    d, queue = new_queue(api, "work", {"max_attempts": 2, "retry_base_ms": 1, "retry_max_ms": 1})
    committed(api.post(f"{queue}/messages", json={"message_id": "job", "body": b64(b"x")}))
    first = committed(api.post(f"{queue}/receive", json={}))["deliveries"][0]
    committed(api.post(f"/v1/domains/{d}/leases/nack", json={"token": first["token"], "delay_ms": 1}))
    second = committed(api.post(f"{queue}/receive", json={"wait_ms": 5000}))["deliveries"]
    assert [(m["message_id"], m["attempts"]) for m in second] == [("job", 2)]
    committed(api.post(f"/v1/domains/{d}/leases/nack", json={"token": second[0]["token"]}))
    dead = committed(api.get(f"{queue}/dead-letters"))["messages"]
    assert [m["message_id"] for m in dead] == ["job"]


def test_a_wait_ms_out_of_bounds_is_refused_at_once_not_timed_out(api: httpx.Client) -> None:
    """The processor refuses a long poll's wait_ms outside 0..20,000 as Validation; the server
    awaits that answer whatever the number (a wait_ms far below 0 once made it answer 504 at once,
    again on every retry by the same Idempotency-Key)."""
    d, queue = new_queue(api, "polls")
    topic = f"/v1/domains/{d}/topics/t"
    committed(api.put(topic))
    committed(api.put(f"{topic}/groups/g", json={"start": "beginning"}))
    for route, path in enumerate((f"{queue}/receive", f"{topic}/groups/g/receive")):
        for wait_ms in (-40_000, -(2**62), 2**62):
            key = {"Idempotency-Key": f"poll-{route}{wait_ms}"}
            refused = api.post(path, json={"wait_ms": wait_ms}, headers=key)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error_code"] == "Validation"
            assert "wait_ms" in refused.json()["detail"]


def test_idempotency_key_returns_the_stored_outcome(served: tuple[Path, str], api: httpx.Client) -> None:
    root, _ = served
    d, queue = new_queue(api, "q")
    key = {"Idempotency-Key": "order-17"}
    body = {"message_id": "m", "body": b64(b"once")}
    first = api.post(f"{queue}/messages", json=body, headers=key)
    repeat = api.post(f"{queue}/messages", json=body, headers=key)
    assert committed(first) == committed(repeat)
    assert first.json()["offset"] == repeat.json()["offset"]
    assert committed(api.get(queue))["counters"]["stored_messages"] == 1
    other = api.post(f"{queue}/messages", json={"message_id": "m2", "body": b64(b"x")}, headers=key)
    assert (other.status_code, other.json()["error_code"]) == (409, "Conflict")
    before = log_end(root, d)
    for bad_key in ("with space", ""):  # an empty key is refused, never replaced by a random one
        bad = api.post(f"{queue}/messages", json=body, headers={"Idempotency-Key": bad_key})
        assert (bad.status_code, bad.json()["error_code"], bad.json()["status"]) == (400, "Validation", "error")
    assert log_end(root, d) == before


def test_requests_sent_at_once_under_one_idempotency_key_are_each_answered_as_the_log_decides(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """Two requests under one key sent together, each with other content: the log applies one
    first, and the other is a 409 Conflict. Neither is answered with the other's outcome (which
    would tell its caller that its own message was enqueued). A third with the first's content
    gets that one's answer."""
    root, url = served
    _, queue = new_queue(api, "q")
    asyncio.run(race_under_one_key(url, bearer(root), queue, 20))
    assert committed(api.get(queue))["counters"]["enqueued_total"] == 20


def test_an_idempotency_key_past_the_domains_outcome_horizon_is_410(api: httpx.Client) -> None:
    d, queue = new_queue(api, "q")
    policy = {"outcome_horizon_ms": 1_000, "receipt_horizon_ms": 600_000}
    configured = committed(api.put(f"/v1/domains/{d}/policy", json=policy))
    assert (configured["outcome_horizon_ms"], configured["policy_version"]) == (1_000, 1)
    assert committed(api.get(f"/v1/domains/{d}")) == configured
    stale = api.put(f"/v1/domains/{d}/policy", json={"expected_policy_version": 0})
    assert (stale.status_code, stale.json()["error_code"]) == (409, "RevisionConflict")
    key = {"Idempotency-Key": "order-18"}
    body = {"message_id": "m", "body": b64(b"once")}
    first = committed(api.post(f"{queue}/messages", json=body, headers=key))

    def gone() -> bool:  # the service's ticker sweeps the outcome once its horizon passes
        repeat = api.post(f"{queue}/messages", json=body, headers=key)
        if repeat.status_code == 200:
            assert committed(repeat) == first
            return False
        assert (repeat.status_code, repeat.json()["error_code"]) == (410, "HistoryUnavailable"), repeat.text
        return "(committed)" in repeat.json()["detail"]

    wait_until(gone, what="the outcome past its horizon")
    assert committed(api.get(queue))["counters"]["stored_messages"] == 1


def test_a_domain_cap_refuses_a_create_with_429(api: httpx.Client) -> None:
    """`keyload run` raises the partitions to level 5: once the service has counted what the
    partition held, a domain's caps apply."""
    d = domain()

    def counted() -> bool:
        return bool(committed(api.get(f"/v1/domains/{d}"))["usage"]["counted"])

    wait_until(counted, what="the usage count done")
    configured = committed(api.put(f"/v1/domains/{d}/caps", json={"max_queues": 1, "max_document_bytes": 4}))
    assert (configured["max_queues"], configured["max_topics"]) == (1, 10_000)
    committed(api.put(f"/v1/domains/{d}/queues/a", json={"policy": {}}))
    refused = api.put(f"/v1/domains/{d}/queues/b", json={"policy": {}})
    assert (refused.status_code, refused.json()["error_code"]) == (429, "ResourceExhausted")
    assert "over its cap (max_queues 1)" in refused.json()["detail"]
    too_big = api.put(f"/v1/domains/{d}/documents/k", json={"value": b64(b"12345")})
    assert too_big.status_code == 429
    usage = committed(api.get(f"/v1/domains/{d}"))["usage"]
    assert (usage["queues"], usage["documents"], usage["document_bytes"]) == (1, 0, 0)


def test_long_poll_is_answered_by_a_later_enqueue(api: httpx.Client, served: tuple[Path, str]) -> None:
    root, url = served
    _, queue = new_queue(api, "jobs")
    started = time.monotonic()
    waiting, answered = long_poll(url, bearer(root), f"{queue}/receive")
    committed(api.post(f"{queue}/messages", json={"message_id": "late", "body": b64(b"hi")}))
    waiting.join(30)
    assert time.monotonic() - started < 15, "answered by the enqueue, not by the wait's deadline"
    assert [m["message_id"] for m in committed(answered[0])["deliveries"]] == ["late"]


def test_a_long_poll_outlives_a_rotation_of_its_principals_credential(
    api: httpx.Client, served: tuple[Path, str], workers: int
) -> None:
    """A long poll is authorized when it is recorded (§5a): the rotation of its caller's credential
    while it waits does not keep its answer from it. It is served later, sealed with the key then in
    force; the server answers it with its delivery (with two workers, from the worker's partition)."""
    root, url = served
    d = domain_of(root, workers - 1, workers)
    queue = f"/v1/domains/{d}/queues/rotating"
    committed(api.put(queue, json={"policy": {}}))
    name = f"poller-{uuid.uuid4().hex[:8]}"
    grants = [{"capability": "consume", "domain": d}]
    issued = api.post("/v1/principals", json={"principal": name, "grants": grants}).json()
    started = time.monotonic()
    waiting, answered = long_poll(url, {"Authorization": f"Bearer {issued['bearer_token']}"}, f"{queue}/receive")
    assert api.post(f"/v1/principals/{name}/credential").status_code == 200
    committed(api.post(f"{queue}/messages", json={"message_id": "after-rotation", "body": b64(b"hi")}))
    waiting.join(60)
    assert time.monotonic() - started < 15, "answered by the enqueue, not by the server's outcome timeout"
    assert [m["message_id"] for m in committed(answered[0])["deliveries"]] == ["after-rotation"]


def test_a_local_client_and_the_api_are_served_side_by_side(api: httpx.Client, served: tuple[Path, str]) -> None:
    """The API and the processors share one thread: a local client's appends (the doorbell) are
    applied while HTTP requests come and go, and each side sees the other's commands."""
    root, url = served
    d, queue = new_queue(api, "mixed")
    waiting, answered = long_poll(url, bearer(root), f"{queue}/receive")
    with Client(root) as local:
        local.enqueue(d, "mixed", b"from-local", message_id="local-1")
        waiting.join(30)
        assert [m["message_id"] for m in committed(answered[0])["deliveries"]] == ["local-1"]
        http_ids = [f"http-{n}" for n in range(20)]
        local_ids = [f"local-{n}" for n in range(2, 22)]
        failures: list[str] = []

        def over_http() -> None:
            with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as own:
                for message_id in http_ids:
                    response = own.post(f"{queue}/messages", json={"message_id": message_id, "body": b64(b"h")})
                    if response.status_code != 200:
                        failures.append(response.text)

        sender = threading.Thread(target=over_http)
        sender.start()
        for message_id in local_ids:
            local.enqueue(d, "mixed", b"l", message_id=message_id)
        sender.join(60)
        assert not failures
        delivered: list[str] = []
        while len(delivered) < len(http_ids + local_ids):
            deliveries = local.receive(d, "mixed", max_messages=10).deliveries
            assert deliveries, f"received {len(delivered)} of {len(http_ids + local_ids)}"
            delivered += [m.message_id for m in deliveries]
            tokens = [m.token for m in deliveries]
            committed(api.post(f"/v1/domains/{d}/leases/ack-batch", json={"tokens": tokens}))
        assert sorted(delivered) == sorted(http_ids + local_ids)
    view = committed(api.get(queue))
    assert view["counters"]["acked_total"] == 40  # and local-1, which the long poll holds, is leased


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Basic a2V5bG9hZA==",
        "Bearer nonsense",
        "Bearer keyload-admin:keyload-admin-1:AAAA",  # the right key id, a wrong secret
        "Bearer nobody:keyload-admin-1:AAAA",
    ],
)
def test_a_missing_or_wrong_credential_is_401_and_appends_nothing(served: tuple[Path, str], header: str | None) -> None:
    root, url = served
    d = domain()
    before = log_end(root, d)
    headers = {} if header is None else {"Authorization": header}
    response = httpx.post(
        f"{url}/v1/domains/{d}/queues/q/messages", json={"message_id": "m", "body": ""}, headers=headers
    )
    assert response.status_code == 401
    assert (response.json()["status"], response.json()["error_code"]) == ("error", "Unauthenticated")
    assert "AAAA" not in response.text
    # The partition it picks the policy of comes first: given twice, it is refused before the credential.
    twice = httpx.get(f"{url}/v1/principals/keyload-admin?partition=0&partition=1", headers=headers)
    assert (twice.status_code, twice.json()["detail"]) == (400, "partition is given twice (path, query or body)")
    # The credential is checked before the request's body and headers: a caller without one learns nothing.
    receive = f"{url}/v1/domains/{d}/queues/q/receive"
    for response in (
        httpx.post(receive, content=b"not JSON", headers=headers),
        httpx.post(receive, json={}, headers={**headers, COALESCE_HEADER: "maybe"}),
    ):
        assert (response.status_code, response.json()["error_code"]) == (401, "Unauthenticated")
    assert log_end(root, d) == before


def test_a_header_that_decides_what_a_request_does_is_taken_once_not_one_of_two(served: tuple[Path, str]) -> None:
    """Two Authorization headers (401), or two Idempotency-Key or Keyload-Coalesce headers (400), are
    refused, and nothing is appended: the server would take the first, a proxy before it maybe the other."""
    root, url = served
    d = domain()
    before = log_end(root, d)
    admin = bearer(root)["Authorization"]
    enqueue = f"{url}/v1/domains/{d}/queues/q/messages"
    message = {"message_id": "m", "body": ""}
    twice = [
        ([("Authorization", admin), ("Authorization", "Bearer nobody:k:AAAA")], 401, "Unauthenticated"),
        ([("Authorization", "Bearer nobody:k:AAAA"), ("Authorization", admin)], 401, "Unauthenticated"),
        ([("Authorization", admin), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")], 400, "Validation"),
        ([("Authorization", admin), (COALESCE_HEADER, "true"), (COALESCE_HEADER, "false")], 400, "Validation"),
    ]
    for headers, status, code in twice:
        response = httpx.post(enqueue, json=message, headers=headers)
        assert (response.status_code, response.json()["error_code"]) == (status, code), headers
        assert "more than once" in response.json()["detail"]
    handles = [("Authorization", admin), (UPLOAD_HANDLE_HEADER, "ku1.a"), (UPLOAD_HANDLE_HEADER, "ku1.b")]
    upload = httpx.put(f"{url}/v1/domains/{d}/reservations/1/content", content=b"x", headers=handles)
    assert (upload.status_code, upload.json()["error_code"]) == (400, "Validation")
    assert log_end(root, d) == before
    scrape = httpx.get(f"{url}/metrics", headers=[("Authorization", admin), ("Authorization", admin)])
    assert (scrape.status_code, scrape.json()["error_code"]) == (401, "Unauthenticated")


def test_a_principal_is_authorized_by_its_grants(served: tuple[Path, str], api: httpx.Client) -> None:
    root, url = served
    d = domain()
    name = f"svc-{uuid.uuid4().hex[:8]}"
    committed(api.put(f"/v1/domains/{d}/queues/in", json={"policy": {}}))
    with Client(root) as admin:
        credential = admin.create_principal(name, [Grant(capability=Capability.enqueue, domain=d, resource="in")])
    service = {"Authorization": f"Bearer {credential.bearer_token}"}
    with httpx.Client(base_url=url, headers=service, timeout=60) as client:
        committed(client.post(f"/v1/domains/{d}/queues/in/messages", json={"message_id": "a", "body": ""}))
        refused = client.post(f"/v1/domains/{d}/queues/in/receive", json={})
        assert refused.status_code == 403
        assert refused.json()["error_code"] == "PermissionDenied"
        assert "consume" in refused.json()["detail"]
        whoami = committed(client.get(f"/v1/principals/{name}"))
        assert whoami["principal"]["principal"] == name
        granted = api.post(
            f"/v1/principals/{name}/grants", json={"grant": {"capability": "consume", "domain": d, "resource": "*"}}
        )
        assert committed(granted)["principal"]["revision"] == 2
        assert len(committed(client.post(f"/v1/domains/{d}/queues/in/receive", json={}))["deliveries"]) == 1
        disabled = api.put(f"/v1/principals/{name}", json={"enabled": False})
        assert committed(disabled)["principal"]["enabled"] is False
        before = log_end(root, d)
        gone = client.post(f"/v1/domains/{d}/queues/in/messages", json={"message_id": "b", "body": ""})
        assert (gone.status_code, gone.json()["error_code"]) == (401, "Unauthenticated")
        assert log_end(root, d) == before


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"message_id": "m"}).encode(), "body is required"),
        (json.dumps({"message_id": "m", "body": "%%%"}).encode(), "body is not valid base64"),
        (json.dumps({"message_id": 7, "body": ""}).encode(), "message_id must be a string"),
        (json.dumps({"message_id": "m", "body": "", "colour": "red"}).encode(), "colour is not a field of Enqueue"),
        (json.dumps({"message_id": "m", "body": "", "queue": "other"}).encode(), "queue is given twice"),
        (b'{"message_id": "m", "body": "", "message_id": "n"}', "message_id is given twice in a JSON object"),
        (b'{"message_id": "m", "body": "", "headers": {"k": "1", "k": "2"}}', "k is given twice in a JSON object"),
        (
            json.dumps({"message_id": "m", "body": "", "not_before_ms": "soon"}).encode(),
            "not_before_ms must be an integer",
        ),
        (b"[" * 5000 + b"]" * 5000, "nests JSON too deeply"),  # past the parser's recursion, not a 500
        (b'{"message_id": "m", "body": "", "headers": {"k": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "too deeply"),
        (b'{"message_id": "\\ud800", "body": ""}', "message_id is not Unicode text"),  # a lone surrogate
        (b'{"message_id": "m", "body": "", "headers": {"k": "a\\udfff"}}', "headers.k is not Unicode text"),
    ],
)
def test_a_malformed_request_is_400_naming_the_field(
    served: tuple[Path, str], api: httpx.Client, content: bytes, named: str
) -> None:
    root, _ = served
    d = domain()
    before = log_end(root, d)
    response = api.post(
        f"/v1/domains/{d}/queues/q/messages", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert (response.json()["status"], response.json()["error_code"]) == ("error", "Validation")
    assert named in response.json()["detail"]
    assert log_end(root, d) == before


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("POST", "/queues/q/messages?queue=other", "queue"),  # the path's, again in the query
        ("POST", "/queues/q/messages?message_id=a&message_id=b", "message_id"),  # the query's, twice
        ("GET", "/queues/q?queue=other", "queue"),
        ("DELETE", "/queues/q?queue=other", "queue"),
    ],
)
def test_a_field_given_twice_in_the_path_and_query_is_refused_not_overridden(
    served: tuple[Path, str], api: httpx.Client, method: str, path: str, named: str
) -> None:
    root, _ = served
    d = domain()
    committed(api.put(f"/v1/domains/{d}/queues/q"))
    committed(api.put(f"/v1/domains/{d}/queues/other"))
    before = log_end(root, d)
    raw = {"content-type": "application/octet-stream"}
    response = api.request(method, f"/v1/domains/{d}{path}", content=b"x" if method == "POST" else None, headers=raw)
    assert (response.status_code, response.json()["error_code"]) == (400, "Validation")
    assert response.json()["detail"] == f"{named} is given twice (path, query or body)"
    assert log_end(root, d) == before


@pytest.mark.parametrize(
    ("method", "path", "body", "named"),
    [
        ("GET", "/v1/principals/keyload-admin?partition=0&partition=1", None, "partition is given twice"),
        ("GET", "/v1/census?partition=0&partition=1", None, "partition is given twice"),
        ("POST", "/v1/commands", b'{"domain": "\\ud800", "body": {"InspectQueue": {"queue": "q"}}}', "domain is not"),
        ("GET", "/v1/domains/d/queues/q/dead-letters?limit=%D9%A1", None, "limit must be an integer"),  # not ASCII
        ("GET", "/v1/domains/d/queues/q/dead-letters?limit=+1", None, "limit must be an integer"),
        ("POST", "/v1/principals/keyload-admin/credential", b"{not json", "not JSON"),  # nothing rotated
        ("POST", "/v1/principals/keyload-admin/credential", b'{"grants": []}', "a rotation takes no fields"),
        # Issuing credentials takes nothing from the query: a PutPrincipal goes to every partition.
        ("POST", "/v1/principals?partition=2", b'{"principal": "p", "grants": []}', "partition is not a field"),
        ("POST", "/v1/principals/someone/credential?bogus=1", None, "bogus is not a field of PutPrincipal"),
    ],
)
def test_routing_parameters_and_bodies_without_fields_are_checked_as_strictly(
    served: tuple[Path, str], api: httpx.Client, method: str, path: str, body: bytes | None, named: str
) -> None:
    root, _ = served
    before = log_end(root, "d")
    response = api.request(method, path, content=body, headers={"content-type": "application/json"})
    assert (response.status_code, response.json()["error_code"]) == (400, "Validation"), response.text
    assert named in response.json()["detail"]
    assert log_end(root, "d") == before
    assert api.get("/v1/principals/keyload-admin").status_code == 200  # the credential still works


def test_a_partition_is_spelled_as_any_integer_of_the_api(served: tuple[Path, str], api: httpx.Client) -> None:
    """ASCII digits with an optional '-': '-0' and '00' name partition 0 wherever a partition is given."""
    for spelled in ("-0", "00"):
        assert committed(api.get(f"/v1/principals/keyload-admin?partition={spelled}"))["principal"]["enabled"]
        assert committed(api.get(f"/v1/partitions/{spelled}/retention"))["tasks"] is not None
        census = api.get(f"/v1/census?partition={spelled}")
        assert census.status_code == 200, census.text
    for wrong in ("-1", "+0", "%D9%A0"):  # below 0; not an integer of the API
        refused = api.get(f"/v1/census?partition={wrong}")
        assert (refused.status_code, refused.json()["detail"]) == (400, "partition must be 0..3")


def test_raw_bytes_sent_as_a_form_are_told_the_content_type_a_raw_body_needs(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """curl's --data-binary sends a form's content type: a route whose command has a raw body says
    which type takes raw bytes; one without says only that the body is not JSON."""
    root, _ = served
    d = domain()
    before = log_end(root, d)
    form = {"content-type": "application/x-www-form-urlencoded"}
    response = api.post(f"/v1/domains/{d}/queues/q/messages", content=b"hello", headers=form)
    assert (response.status_code, response.json()["error_code"]) == (400, "Validation")
    assert response.json()["detail"] == (
        "the request body is not JSON (raw bytes as the body need Content-Type: application/octet-stream)"
    )
    receive = api.post(f"/v1/domains/{d}/queues/q/receive", content=b"hello", headers=form)
    assert (receive.status_code, receive.json()["detail"]) == (400, "the request body is not JSON")
    assert log_end(root, d) == before


def test_a_policy_filter_or_headers_left_out_take_their_defaults(api: httpx.Client) -> None:
    d = domain()
    queue = committed(api.put(f"/v1/domains/{d}/queues/orders"))  # no body at all
    assert queue["policy"]["max_attempts"] == 5 and queue["policy"]["lease_ms"] == 30_000
    committed(api.put(f"/v1/domains/{d}/topics/events", json={}))
    group = committed(api.put(f"/v1/domains/{d}/topics/events/groups/billing", json={"start": "beginning"}))
    assert group["state"]["filter"] == {"event_types": [], "headers": {}}
    reserved = api.post(
        f"/v1/domains/{d}/queues/orders/reservations",
        json={"message_id": "big", "length": 3, "sha256": base64.b64encode(hashlib.sha256(b"abc").digest()).decode()},
    )
    assert committed(reserved)["headers"] == {}
    # A record with a field of its own to give is still required, by name.
    missing = api.post("/v1/principals/someone/grants", json={})
    assert (missing.status_code, missing.json()["detail"]) == (400, "grant is required")
    # A principal write goes to every partition: `?partition=` picks none there, so it is refused, not ignored.
    grant = {"grant": {"capability": "consume", "domain": d, "resource": "*"}}
    routed = api.post("/v1/principals/someone/grants?partition=1", json=grant)
    assert (routed.status_code, routed.json()["detail"]) == (400, "partition is not a field of GrantCapability")


def test_a_topic_read_with_no_start_reads_from_position_1(api: httpx.Client) -> None:
    """The table's request default (`RequestDefault`): the same page the SDK and the CLI read."""
    topic = f"/v1/domains/{domain()}/topics/t"
    committed(api.put(topic))
    events = [{"event_id": f"e{i}", "type": "created", "body": b64(b"{}")} for i in range(3)]
    committed(api.post(f"{topic}/events", json={"events": events}))
    page = committed(api.get(f"{topic}/events", params={"max_events": 2}))
    assert [e["position"] for e in page["events"]] == [1, 2]
    rest = committed(api.get(f"{topic}/events", params={"cursor": page["next_cursor"]}))
    assert [e["position"] for e in rest["events"]] == [3]
    both = api.get(f"{topic}/events", params={"from_position": 1, "cursor": page["next_cursor"]})
    assert (both.status_code, both.json()["error_code"]) == (400, "Validation")


def test_an_enqueue_without_a_message_id_takes_the_command_id(api: httpx.Client) -> None:
    """As the SDK and the CLI do: a retry under the same Idempotency-Key is the same message."""
    path = f"/v1/domains/{domain()}/queues/orders"
    committed(api.put(path))
    sent = api.post(f"{path}/messages", json={"body": b64(b"hi")}, headers={"Idempotency-Key": "order-7"})
    assert committed(sent)["message_id"] == "order-7"
    raw = api.post(f"{path}/messages", content=b"raw", headers={"content-type": "application/octet-stream"})
    generated = committed(raw)
    assert generated["message_id"] == raw.json()["command_id"]
    message = committed(api.get(f"{path}/messages/order-7"))
    assert message["meta"]["state"] == "ready"


def test_a_put_of_a_queue_as_it_is_declares_it(api: httpx.Client) -> None:
    """PUT is idempotent: a second service start declaring its queue gets it (feature level 9)."""
    path = f"/v1/domains/{domain()}/queues/orders"
    first = committed(api.put(path, json={"policy": {"max_attempts": 3}}))
    assert committed(api.put(path, json={"policy": {"max_attempts": 3}})) == first
    other = api.put(path, json={"policy": {"max_attempts": 4}})
    assert (other.status_code, other.json()["error_code"], other.json()["detail"]) == (
        409,
        "Conflict",
        "queue already exists with another policy",
    )


def test_a_domain_lists_its_queues_and_topics_by_page(api: httpx.Client) -> None:
    d = domain()
    for queue in ("orders-us", "orders-eu", "payments"):
        committed(api.put(f"/v1/domains/{d}/queues/{queue}"))
    committed(api.put(f"/v1/domains/{d}/topics/events"))
    first = committed(api.get(f"/v1/domains/{d}/queues", params={"prefix": "orders-", "max_queues": 1}))
    assert ([q["queue"] for q in first["queues"]], first["next_after"]) == (["orders-eu"], "orders-eu")
    rest = committed(api.get(f"/v1/domains/{d}/queues", params={"prefix": "orders-", "after": "orders-eu"}))
    assert ([q["queue"] for q in rest["queues"]], rest["next_after"]) == (["orders-us"], None)
    assert rest["queues"][0] == committed(api.get(f"/v1/domains/{d}/queues/orders-us"))
    topics = committed(api.get(f"/v1/domains/{d}/topics"))
    assert [t["topic"] for t in topics["topics"]] == ["events"]
    wrong = api.get(f"/v1/domains/{d}/queues", params={"max_queues": 0})
    assert (wrong.status_code, wrong.json()["error_code"]) == (400, "Validation")


def test_routes_methods_and_sizes(api: httpx.Client) -> None:
    assert api.get("/v1/nowhere").status_code == 404
    assert api.get("/v1/nowhere").json()["error_code"] == "NotFound"
    slash = api.post(f"/v1/domains/{domain()}/queues/q/receive/", json={})  # no redirect to follow
    assert (slash.status_code, slash.json()["error_code"]) == (404, "NotFound")
    wrong = api.delete(f"/v1/domains/{domain()}/queues/q/receive")
    assert (wrong.status_code, wrong.json()["status"]) == (405, "error")
    huge = api.post(f"/v1/domains/{domain()}/queues/q/messages", content=b"x" * (8 * 1024 * 1024 + 1))
    assert huge.status_code == 413
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready", "catching_up": {}, "halted": {}, "stalled": {}}


def test_keyload_codes_map_to_statuses(api: httpx.Client) -> None:
    d = domain()
    assert (api.get(f"/v1/domains/{d}/queues/missing").status_code, "NotFound") == (404, "NotFound")
    topic = f"/v1/domains/{d}/topics/t"
    committed(api.put(topic, json={"policy": {}}))
    event = {"event_id": "e1", "type": "created", "body": b64(b"{}")}
    committed(api.post(f"{topic}/events", json={"events": [event]}))
    duplicate = api.post(f"{topic}/events", json={"events": [event]})
    assert (duplicate.status_code, duplicate.json()["error_code"]) == (409, "DuplicateEventId")
    invalid = api.put(f"/v1/domains/{d}/queues/{'x' * 300}", json={"policy": {}})
    assert (invalid.status_code, invalid.json()["error_code"], invalid.json()["status"]) == (
        400,
        "Validation",
        "rejected",
    )


def test_configure_a_topic_over_http_fenced_by_its_policy_version(api: httpx.Client) -> None:
    topic = f"/v1/domains/{domain()}/topics/t"
    assert committed(api.put(topic, json={"policy": {}}))["policy_version"] == 1
    policy = {"max_age_ms": 60_000, "discard": "old"}
    configured = committed(api.put(f"{topic}/policy", json={"policy": policy, "expected_policy_version": 1}))
    assert (configured["policy_version"], configured["policy"]["max_age_ms"], configured["policy"]["discard"]) == (
        2,
        60_000,
        "old",
    )
    stale = api.put(f"{topic}/policy", json={"policy": {}, "expected_policy_version": 1})
    assert (stale.status_code, stale.json()["error_code"]) == (409, "RevisionConflict")
    assert api.get(topic).json()["result"]["policy"]["discard"] == "old"


def test_close_and_delete_a_topic_and_a_group_over_http(api: httpx.Client) -> None:
    topic = f"/v1/domains/{domain()}/topics/t"
    committed(api.put(topic, json={"policy": {}}))
    event = {"event_id": "e1", "type": "created", "body": b64(b"{}")}
    committed(api.post(f"{topic}/events", json={"events": [event]}))
    committed(api.put(f"{topic}/groups/g", json={"start": "beginning", "filter": {}, "policy": {}}))
    assert committed(api.post(f"{topic}/close"))["closed"] is True
    late = api.post(f"{topic}/events", json={"events": [dict(event, event_id="e2")]})
    assert (late.status_code, late.json()["error_code"]) == (409, "Conflict")
    held = api.delete(topic)
    assert (held.status_code, held.json()["error_code"]) == (409, "Conflict")  # g has not read e1
    assert committed(api.delete(f"{topic}/groups/g"))["state"]["group"] == "g"
    assert api.get(f"{topic}/groups/g").status_code == 404
    committed(api.put(f"{topic}/groups/h", json={"start": "beginning", "filter": {}, "policy": {}}))
    assert committed(api.delete(topic, params={"force": "true"}))["tail"] == 1
    assert api.get(topic).status_code == 404


def test_pause_resume_close_and_delete_a_queue_over_http(api: httpx.Client, served: tuple[Path, str]) -> None:
    root, url = served
    d, queue = new_queue(api, "jobs")
    assert committed(api.post(f"{queue}/pause"))["paused"] is True
    paused = api.post(f"{queue}/receive", json={})
    assert (paused.status_code, paused.json()["error_code"]) == (409, "DispatchPaused")
    waiting, answered = long_poll(url, bearer(root), f"{queue}/receive")  # waits for the resume
    committed(api.post(f"{queue}/messages", json={"message_id": "m-1", "body": b64(b"held")}))
    assert not answered, "a paused queue dispatches nothing"
    assert committed(api.post(f"{queue}/resume"))["paused"] is False
    waiting.join(30)
    [delivery] = committed(answered[0])["deliveries"]
    assert (delivery["message_id"], base64.b64decode(delivery["body"])) == ("m-1", b"held")
    assert committed(api.post(f"{queue}/close"))["closed"] is True
    refused = api.post(f"{queue}/messages", json={"message_id": "m-2", "body": b64(b"late")})
    assert (refused.status_code, refused.json()["error_code"]) == (409, "Conflict")
    assert "closed" in refused.json()["detail"]
    acked = committed(api.post(f"/v1/domains/{d}/leases/ack", json={"token": delivery["token"]}))
    assert acked["state"] == "acked"  # what a closed queue holds is still settled
    shown = committed(api.get(queue))
    assert (shown["paused"], shown["closed"], shown["counters"]["enqueued_total"]) == (False, True, 1)
    assert committed(api.delete(queue))["counters"]["acked_total"] == 1
    assert (api.get(queue).status_code, api.get(queue).json()["error_code"]) == (404, "NotFound")
    committed(api.put(queue, json={"policy": {}}))  # the name is free: a new queue
    committed(api.post(f"{queue}/messages", json={"message_id": "m-1", "body": b64(b"again")}))
    held = api.delete(queue)
    assert (held.status_code, held.json()["error_code"]) == (409, "Conflict")
    assert committed(api.delete(queue, params={"force": "true"}))["counters"]["stored_messages"] == 1


def test_the_ticker_drives_a_deleted_queues_reclamation(served: tuple[Path, str], api: httpx.Client) -> None:
    """With no other traffic, Ticks keep coming while the reclamation is due, until it is done."""
    root, _ = served
    d, queue = new_queue(api, "spent", {"receive_max_messages": 100})
    for first in range(0, 600, 100):
        enqueues = [
            {"mutation": {"Enqueue": {"queue": "spent", "message_id": f"m{i}", "body": b64(b"x")}}}
            for i in range(first, first + 100)
        ]
        committed(api.post(f"/v1/domains/{d}/batch", json={"mutations": enqueues}))
    while deliveries := committed(api.post(f"{queue}/receive", json={"max_messages": 100}))["deliveries"]:
        tokens = [delivery["token"] for delivery in deliveries]
        committed(api.post(f"/v1/domains/{d}/leases/ack-batch", json={"tokens": tokens}))
    incarnation = committed(api.delete(queue))["incarnation"]
    data = DataDir.open(root)
    projection = data.projection(partition_for(d, data.partitions))

    def reclaimed() -> bool:
        store = Store(projection, read_only=True)  # beside the service, as `keyload drill` reads it
        try:
            return store.get(keys.resource_key(incarnation)) is None and not any(
                True for _ in store.scan(keys.message(incarnation, ""), keys.prefix_end(keys.message(incarnation, "")))
            )
        finally:
            store.close()

    wait_until(reclaimed, timeout_s=30, what="the deleted queue's rows reclaimed")


def test_documents_keys_and_message_ids_may_hold_slashes(api: httpx.Client) -> None:
    d = domain()
    put = api.put(f"/v1/domains/{d}/documents/orders/42/lines", json={"value": b64(b"v1"), "expected_revision": 0})
    assert committed(put)["revision"] == 1
    got = committed(api.get(f"/v1/domains/{d}/documents/orders/42/lines"))
    assert (got["key"], base64.b64decode(got["value"])) == ("orders/42/lines", b"v1")
    queue = f"/v1/domains/{d}/queues/q"
    committed(api.put(queue, json={"policy": {}}))
    committed(api.post(f"{queue}/messages", json={"message_id": "a/b", "body": ""}))
    assert committed(api.get(f"{queue}/messages/a/b"))["message_id"] == "a/b"
    # A line break is no printable ASCII: the id's or key's rule refuses it; it names no other route.
    for path in (f"/v1/domains/{d}/documents/orders%0A42", f"{queue}/messages/a%0Ab"):
        refused = api.get(path)
        assert (refused.status_code, refused.json()["error_code"]) == (400, "Validation"), refused.text


def test_batches_take_a_union_of_records_by_name(api: httpx.Client) -> None:
    d = domain()
    committed(api.put(f"/v1/domains/{d}/queues/q", json={"policy": {}}))
    mutations = [
        {"mutation": {"PutDocument": {"key": "k", "value": b64(b"v")}}},
        {"mutation": {"Enqueue": {"queue": "q", "message_id": "m", "body": b64(b"b")}}},
    ]
    result = committed(api.post(f"/v1/domains/{d}/batch", json={"mutations": mutations}))
    assert len(result["results"]) == 2
    bad = api.post(f"/v1/domains/{d}/batch", json={"mutations": [{"mutation": {"Shout": {}}}]})
    assert bad.status_code == 400
    assert "mutations[0].mutation must be an object with one member" in bad.json()["detail"]


def test_partition_scoped_operator_routes(api: httpx.Client) -> None:
    checkpoint = committed(api.post("/v1/partitions/0/checkpoints", json={}))
    assert checkpoint["offset"] >= 0
    out_of_range = api.post("/v1/partitions/99/checkpoints", json={})
    assert (out_of_range.status_code, out_of_range.json()["error_code"]) == (400, "Validation")


def test_the_openapi_document_is_served_and_checked_in(api: httpx.Client) -> None:
    checked_in = (REPO / "docs" / "openapi.json").read_text()
    assert checked_in == openapi.text(), (
        "docs/openapi.json drifted: python -m keyload.server.openapi > docs/openapi.json"
    )
    assert api.get("/v1/openapi.json").json() == json.loads(checked_in)
    served_outside_commands = ("/healthz", "/readyz", "/metrics", "/v1/openapi.json", "/v1/service", "/v1/census")
    assert all("get" in openapi.document()["paths"][path] for path in served_outside_commands)
    # The operational answers have the members their schemas declare, of the declared types.
    json_types = {"object": dict, "string": str, "integer": int, "array": list}
    for path in ("/healthz", "/readyz", "/v1/service", "/v1/census"):
        answer = api.get(path)
        declared = openapi.document()["paths"][path]["get"]["responses"][str(answer.status_code)]
        schema = declared["content"]["application/json"]["schema"]
        body = answer.json()
        assert sorted(body) == sorted(schema["required"]), path
        for name, member in schema["properties"].items():
            assert isinstance(body[name], json_types[member["type"]]), (path, name)
            assert body[name] in member.get("enum", [body[name]]), (path, name)


def test_a_body_the_document_makes_optional_is_one_the_server_does_without(api: httpx.Client) -> None:
    """A client built from the OpenAPI document sends a body wherever one has required members:
    without one (and without the fields in the query) the request is a 400 naming the field."""
    for path, item in openapi.document()["paths"].items():
        for method, operation in item.items():
            body = operation.get("requestBody")
            schema = body and body["content"].get("application/json", {}).get("schema", {})
            if schema and schema.get("required"):
                assert body["required"], f"{method.upper()} {path} needs {schema['required']}"
    d, _ = new_queue(api, "q")
    bare = api.post(f"/v1/domains/{d}/leases/ack")
    assert (bare.status_code, bare.json()["detail"]) == (400, "token is required")
    queried = api.post(f"/v1/domains/{d}/leases/ack", params={"token": "v2.not-a-token"})
    assert queried.json()["error_code"] != "Validation", queried.text  # the query form stays


def test_the_sdk_speaks_http_with_typed_results_and_errors(served: tuple[Path, str]) -> None:
    root, url = served
    d = domain()
    admin_credential = Credential.load(root / "credentials" / "keyload-admin.json")
    with Client(url, credential=admin_credential) as admin:
        assert admin.partitions == DataDir.open(root).partitions
        admin.create_queue(d, "q")
        name = f"remote-{uuid.uuid4().hex[:8]}"
        issued = admin.create_principal(name, [Grant(capability=Capability.consume, domain=d)])
        assert not (root / "credentials" / f"{name}.json").exists(), "a server's credential goes to the caller only"
        with pytest.raises(RevisionConflictError):
            admin.create_principal(name)
        enqueued = admin.enqueue(d, "q", b"\x00bytes", message_id="m1", command_id="enq-1")
        assert admin.enqueue(d, "q", b"\x00bytes", message_id="m1", command_id="enq-1") == enqueued
        with pytest.raises(NotFoundError):
            admin.inspect_queue(d, "missing")
        with pytest.raises(InvalidCommand):
            admin.send("Enqueue", d, {"queue": "q"})
        with pytest.raises(KeyloadError, match="needs a local data directory"):
            admin.poison_entries()
        assert admin.request_checkpoint(0).offset >= 0
        admin.create_queue(d, "media")
        large = bytes(range(256)) * 3000
        seen: list[tuple[int, int]] = []
        committed_reservation = admin.schedule_large(
            d, "media", large, message_id="clip", progress=lambda *p: seen.append(p)
        )
        assert committed_reservation.state == "committed" and seen[-1] == (len(large), len(large))
        [clip] = admin.receive(d, "media").deliveries
        assert admin.read_payload(clip) == large
    with Client(url, credential=issued) as consumer:
        assert consumer.whoami().principal.principal == name
        [delivery] = consumer.receive(d, "q").deliveries
        assert delivery.body == b"\x00bytes"
        consumer.ack(d, delivery.token)
        with pytest.raises(PermissionDeniedError):
            consumer.enqueue(d, "q", b"x")
        with Client(url, credential=admin_credential) as admin:
            rotated = admin.rotate_credential(name)
        with pytest.raises(CredentialError):
            consumer.receive(d, "q")
    with Client(url, credential=rotated) as consumer:
        assert consumer.receive(d, "q").deliveries == []
    stranger = Credential("keyload-admin", "keyload-admin-1", b"\x01" * 32)
    with Client(url, credential=stranger) as client, pytest.raises(CredentialError):
        client.inspect_queue(d, "q")
    with Client("http://127.0.0.1:9", credential=admin_credential) as client, pytest.raises(ServiceUnavailable):
        client.inspect_queue(d, "q")


def test_the_sdk_refuses_a_command_alike_over_http_and_locally(served: tuple[Path, str]) -> None:
    """What a client refuses, or the server refuses before appending, is the same exception over both
    transports: a string UTF-8 cannot carry (named, as a 400 names it), a command over the log's record
    limit (`CommandTooLarge`, said once that nothing was appended), a body of the wrong type, a partition
    out of range, and any call on a closed client."""
    root, url = served
    d = domain()
    credential = Credential.load(root / "credentials" / "keyload-admin.json")
    with Client(url, credential=credential) as remote, Client(root) as local:
        remote.create_queue(d, "q")
        before = log_end(root, d)
        for client in (remote, local):
            for named, call in (
                ("message_id", lambda c: c.enqueue(d, "q", b"x", message_id="\ud800")),
                ("headers.h", lambda c: c.enqueue(d, "q", b"x", headers={"h": "\ud800"})),
                ("body", lambda c: c.enqueue(d, "q", "text")),  # type: ignore[arg-type]
            ):
                with pytest.raises(InvalidCommand, match=named.replace(".", r"\.")) as refused:
                    call(client)
                assert type(refused.value) is InvalidCommand, refused.value
            with pytest.raises(CommandTooLarge) as too_large:
                client.enqueue(d, "q", b"B" * (5 << 20))
            assert str(too_large.value).count("nothing was appended") == 1, too_large.value
            for out_of_range in (lambda c: c.census(99), lambda c: c.partition_domain(99)):
                with pytest.raises(InvalidCommand, match=r"partition must be 0\.\."):
                    out_of_range(client)
        assert log_end(root, d) == before
    for closed in (remote, local):
        with pytest.raises(InvalidCommand, match="the client is closed"):
            closed.inspect_queue(d, "q")


def reservation_of(message_id: str, payload: bytes) -> dict[str, Any]:
    """The body of a reservation of `payload` for message `message_id` (PrepareLargeSchedule)."""
    return {
        "message_id": message_id,
        "length": len(payload),
        "sha256": b64(hashlib.sha256(payload).digest()),
        "headers": {},
    }


def test_large_payloads_are_uploaded_attested_and_read_by_the_service(
    served: tuple[Path, str], api: httpx.Client, workers: int
) -> None:
    """The serving process checks an upload against the projection of its partition, and makes its
    handle when the request carries none."""
    root, url = served
    d = domain_of(root, 0, workers)
    queue = f"/v1/domains/{d}/queues/media"
    committed(api.put(queue, json={"policy": {}}))
    payload = bytes(range(256)) * 4096  # 1 MiB
    reserve = reservation_of("video-1", payload)
    reservation = committed(api.post(f"{queue}/reservations", json=reserve))
    content = f"/v1/domains/{d}/reservations/{reservation['reservation_id']}/content"
    raw = {"content-type": "application/octet-stream"}
    wrong = api.put(content, content=payload[:-1] + b"\x00", headers=raw)
    assert (wrong.status_code, wrong.json()["error_code"]) == (409, "Conflict")
    assert wrong.json()["command_id"] is None and "keyload-command-id" not in wrong.headers  # no outcome
    assert committed(api.put(content, content=payload, headers=raw))["state"] == "committed"
    assert committed(api.put(content, content=payload, headers=raw))["state"] == "committed"  # idempotent
    [delivery] = committed(api.post(f"{queue}/receive", json={}))["deliveries"]
    assert delivery["payload"]["length"] == len(payload)
    handle = delivery["payload"]["read_handle"]
    read = api.post("/v1/payloads/read", json={"read_handle": handle})
    assert (read.status_code, read.content) == (200, payload)
    forged = api.post("/v1/payloads/read", json={"read_handle": handle[:-4] + "AAAA"})
    assert (forged.status_code, forged.json()["error_code"]) == (400, "Validation")
    missing = api.put(f"/v1/domains/{d}/reservations/999999/content", content=b"x", headers=raw)
    assert (missing.status_code, missing.json()["error_code"]) == (404, "NotFound")
    bad_domain = api.put("/v1/domains/UPPER/reservations/1/content", content=b"x", headers=raw)
    assert (bad_domain.status_code, bad_domain.json()["error_code"]) == (400, "Validation")
    second = committed(api.post(f"{queue}/reservations", json={**reserve, "message_id": "video-2"}))
    # Neither a principal without enqueue on the domain nor one that may enqueue only to another queue
    # of it learns which reservation ids exist: a reservation it may not upload to reads as a missing one.
    suffix = uuid.uuid4().hex[:8]
    with Client(root) as admin:
        reader = admin.create_principal(f"reader-{suffix}", [Grant(capability=Capability.consume, domain=d)])
        elsewhere = admin.create_principal(
            f"elsewhere-{suffix}", [Grant(capability=Capability.enqueue, domain=d, resource="other")]
        )
    for credential, expected in ((reader, (403, "PermissionDenied")), (elsewhere, (404, "NotFound"))):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {credential.bearer_token}"}) as other:
            answers = [
                other.put(f"/v1/domains/{d}/reservations/{number}/content", content=payload, headers=raw)
                for number in (second["reservation_id"], 999_999)
            ]
        assert [(answer.status_code, answer.json()["error_code"]) for answer in answers] == [expected] * 2
        assert answers[0].json()["detail"] == answers[1].json()["detail"]


def test_a_committed_upload_sent_again_after_its_deadline_is_answered_committed(
    served: tuple[Path, str], api: httpx.Client, workers: int
) -> None:
    """A client that lost the answer to its upload and sends it again after the upload window is
    answered the committed reservation (its object is stored; nothing is stored again), and other
    bytes are still the 409 they are before the deadline, not the 410 of an expired reservation."""
    root, _ = served
    d = domain_of(root, 0, workers)  # a partition whose projection the serving process holds
    queue = f"/v1/domains/{d}/queues/late"
    committed(api.put(queue, json={"policy": {}}))
    payload = b"late upload " * 100
    reserve = {**reservation_of("late-1", payload), "upload_window_ms": 1_000}
    reservation = committed(api.post(f"{queue}/reservations", json=reserve))
    content = f"/v1/domains/{d}/reservations/{reservation['reservation_id']}/content"
    raw = {"content-type": "application/octet-stream"}
    first = committed(api.put(content, content=payload, headers=raw))
    time.sleep(max(0.0, (first["upload_deadline_ms"] - time.time() * 1000) / 1000) + 0.2)
    again = committed(api.put(content, content=payload, headers=raw))
    assert (again["state"], again["object_version"]) == ("committed", first["object_version"])
    other = api.put(content, content=payload[:-1] + b"!", headers=raw)
    assert (other.status_code, other.json()["error_code"]) == (409, "Conflict"), other.text
    assert committed(api.get(f"{queue}"))["counters"]["enqueued_total"] == 1


def test_a_payload_changed_at_rest_is_never_served(served: tuple[Path, str], api: httpx.Client, workers: int) -> None:
    """A byte of the stored object flipped after its commit: the read route refuses it (410, its detail
    naming the SHA-256) rather than streaming it, and neither SDK transport hands it on or leaves a
    file behind (PayloadError). On `keyload run`'s own partition, where an upload needs no handle."""
    root, url = served
    d = domain_of(root, 0, workers)
    queue = f"/v1/domains/{d}/queues/media"
    committed(api.put(queue, json={"policy": {}}))
    payload = bytes(range(256)) * 256  # 64 KiB
    reservation = committed(api.post(f"{queue}/reservations", json=reservation_of("m", payload)))
    content = f"/v1/domains/{d}/reservations/{reservation['reservation_id']}/content"
    committed(api.put(content, content=payload, headers={"content-type": "application/octet-stream"}))
    admin = Credential.load(root / "credentials" / "keyload-admin.json")
    with Client(url, credential=admin) as client, Client(root) as local:
        [delivery] = client.receive(d, "media").deliveries
        assert delivery.payload is not None and client.read_payload(delivery) == payload
        stored = root / "objects" / f"{delivery.payload.object_key}~" / delivery.payload.object_version
        changed = bytearray(stored.read_bytes())
        changed[0] ^= 0xFF
        stored.chmod(0o600)
        stored.write_bytes(bytes(changed))
        read = api.post("/v1/payloads/read", json={"read_handle": delivery.payload.read_handle})
        assert (read.status_code, read.json()["error_code"]) == (410, "Gone")
        assert "do not match their SHA-256" in read.json()["detail"]
        into = root.parent / f"read-{uuid.uuid4().hex[:8]}"
        for reader in (client, local):
            with pytest.raises(PayloadError, match="do not match"):
                reader.read_payload(delivery)
            with pytest.raises(PayloadError, match="do not match"):
                reader.read_payload(delivery, into)
            assert not into.exists()


def test_an_upload_to_a_worker_processs_partition_takes_its_handle(
    served: tuple[Path, str], api: httpx.Client, workers: int
) -> None:
    """`keyload run` does not hold a worker process's projection: an upload to its partition must
    carry the handle its reservation was answered with (400 without), as on Kafka; one process makes
    it itself."""
    root, _ = served
    d = domain_of(root, workers - 1, workers)
    queue = f"/v1/domains/{d}/queues/media"
    committed(api.put(queue, json={"policy": {}}))
    payload = b"\x05" * 10_000
    reserve = {"message_id": "m", "length": len(payload), "sha256": b64(hashlib.sha256(payload).digest())}
    reserved = api.post(f"{queue}/reservations", json={**reserve, "headers": {}})
    content = f"/v1/domains/{d}/reservations/{committed(reserved)['reservation_id']}/content"
    raw = {"content-type": "application/octet-stream"}
    bare = api.put(content, content=payload, headers=raw)
    if workers == 1:
        assert committed(bare)["state"] == "committed"
        return
    assert (bare.status_code, bare.json()["error_code"]) == (400, "Validation")
    assert UPLOAD_HANDLE_HEADER in bare.json()["detail"]
    handled = api.put(
        content, content=payload, headers={**raw, UPLOAD_HANDLE_HEADER: reserved.headers[UPLOAD_HANDLE_HEADER]}
    )
    assert committed(handled)["state"] == "committed"


def test_a_reservation_is_answered_with_the_upload_handle_its_upload_takes(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """The handle binds the reservation: it takes that reservation's upload (without the projection,
    as a Kafka server takes it), not another's, and a forged one takes none."""
    _, url = served
    d, queue = new_queue(api, "clips")
    payload = b"\x07" * 70_000
    reserve = {"length": len(payload), "sha256": b64(hashlib.sha256(payload).digest()), "headers": {}}
    first = api.post(f"{queue}/reservations", json={**reserve, "message_id": "clip-1"})
    second = api.post(f"{queue}/reservations", json={**reserve, "message_id": "clip-2"})
    handle = first.headers[UPLOAD_HANDLE_HEADER]
    assert handle.startswith("ku1.") and handle != second.headers[UPLOAD_HANDLE_HEADER]
    refused = api.post(f"{queue}/reservations", json={**reserve, "message_id": "clip-3", "length": -1})
    assert refused.status_code == 400 and UPLOAD_HANDLE_HEADER not in refused.headers
    again = api.post(f"{queue}/reservations", json={**reserve, "message_id": "clip-1"}, headers=first_id(first))
    assert committed(again) == committed(first) and UPLOAD_HANDLE_HEADER in again.headers  # a repeat: the same one
    content = f"/v1/domains/{d}/reservations/{{}}/content"
    raw = {"content-type": "application/octet-stream"}
    other = api.put(
        content.format(committed(second)["reservation_id"]),
        content=payload,
        headers={**raw, UPLOAD_HANDLE_HEADER: handle},
    )
    assert (other.status_code, other.json()["error_code"]) == (400, "Validation")
    assert "another reservation" in other.json()["detail"]
    forged = api.put(
        content.format(committed(first)["reservation_id"]),
        content=payload,
        headers={**raw, UPLOAD_HANDLE_HEADER: handle[:-4] + "AAAA"},
    )
    assert (forged.status_code, forged.json()["error_code"]) == (400, "Validation")
    upload = api.put(
        content.format(committed(first)["reservation_id"]),
        content=payload,
        headers={**raw, UPLOAD_HANDLE_HEADER: handle},
    )
    assert committed(upload)["state"] == "committed"
    with httpx.Client(base_url=url, headers=api.headers) as envelope:  # the SDK's route answers it too
        sent = envelope.post(
            "/v1/commands",
            json={"domain": d, "body": {"PrepareLargeSchedule": {**reserve, "queue": "clips", "message_id": "clip-4"}}},
        )
    assert committed(sent)["state"] == "reserved" and sent.headers[UPLOAD_HANDLE_HEADER].startswith("ku1.")


def test_a_reservation_is_answered_without_a_handle_when_the_keyring_lacks_its_trust_key() -> None:
    """On Kafka a processor's keyring copy can lag a key rotation: the outcome stands, without the header."""
    reservation = PayloadReservation(
        reservation_id=7,
        domain="d",
        queue="q",
        queue_id=1,
        message_id="m",
        object_key="payloads/d/1/m",
        length=1,
        sha256=b"\x00" * 32,
        headers={},
        upload_deadline_ms=2**40,
        trust_set_version=1,
        trust_key_id="k-missing",
        state=ReservationState.reserved,
        reserved_at_ms=1,
    )
    answer = Answer({"status": "committed", "partition": 0, "result": (reservation.AVRO_NAME, reservation.to_avro())})
    assert UploadHandles({})(answer) == {}
    assert UploadHandles({"k-missing": b"\x01" * 32})(answer)[UPLOAD_HANDLE_HEADER].startswith("ku1.")


def first_id(response: httpx.Response) -> dict[str, str]:
    """The Idempotency-Key that repeats the command `response` answered."""
    return {"Idempotency-Key": response.headers["Keyload-Command-Id"]}


def test_metrics_report_partitions_queues_groups_and_requests(
    served: tuple[Path, str], api: httpx.Client, workers: int
) -> None:
    """With two workers, of a partition the worker process serves: its projection read read-only."""
    root, url = served
    d = domain_of(root, workers - 1, workers)
    queue = f"/v1/domains/{d}/queues/depth"
    committed(api.put(queue, json={"policy": {}}))
    for i in range(3):
        committed(api.post(f"{queue}/messages", json={"message_id": f"m{i}", "body": ""}))
    committed(api.post(f"{queue}/receive", json={"max_messages": 1}))
    topic = f"/v1/domains/{d}/topics/t"
    committed(api.put(topic, json={"policy": {}}))
    committed(api.put(f"{topic}/groups/g", json={"start": "beginning", "filter": {}, "policy": {}}))
    committed(api.post(f"{topic}/events", json={"events": [{"event_id": "e", "type": "x", "body": ""}]}))
    samples = scrape(api)
    assert samples[f'keyload_queue_messages{{domain="{d}",queue="depth",state="ready"}}'] == 2
    assert samples[f'keyload_queue_messages{{domain="{d}",queue="depth",state="leased"}}'] == 1
    assert samples[f'keyload_group_backlog_events{{domain="{d}",group="g",topic="t"}}'] == 1
    partition = partition_for(d, DataDir.open(root).partitions)
    assert samples[f'keyload_partition_halted{{partition="{partition}"}}'] == 0
    assert samples[f'keyload_lag_records{{partition="{partition}"}}'] >= 0
    assert samples['keyload_http_requests_total{method="POST",status="200"}'] >= 4
    assert samples['keyload_outcome_latency_seconds_count{kind="Enqueue"}'] >= 3
    assert httpx.get(f"{url}/metrics").status_code == 401
    name = f"narrow-{uuid.uuid4().hex[:8]}"
    with Client(root) as admin:
        narrow = admin.create_principal(name, [Grant(capability=Capability.inspect, domain=d)])
    refused = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {narrow.bearer_token}"})
    assert (refused.status_code, refused.json()["error_code"]) == (403, "PermissionDenied")
    # Under load the figures move with it: depth, applied offsets, latencies.
    ready = f'keyload_queue_messages{{domain="{d}",queue="depth",state="ready"}}'
    applied = f'keyload_applied_offset{{partition="{partition}"}}'
    latencies = 'keyload_outcome_latency_seconds_count{kind="Enqueue"}'
    for i in range(30):
        committed(api.post(f"{queue}/messages", json={"message_id": f"load-{i}", "body": ""}))
    loaded = scrape(api)
    assert loaded[ready] == samples[ready] + 30
    assert loaded[applied] >= samples[applied] + 30
    assert loaded[latencies] >= samples[latencies] + 30
    for delivery in committed(api.post(f"{queue}/receive", json={"max_messages": 10}))["deliveries"]:
        committed(api.post(f"/v1/domains/{d}/leases/ack", json={"token": delivery["token"]}))
    acked = scrape(api)
    assert acked[ready] == loaded[ready] - 10
    assert acked[f'keyload_queue_acked_total{{domain="{d}",queue="depth"}}'] == 10
    assert "# TYPE keyload_queue_acked_total counter" in api.get("/metrics").text  # for rate()


def test_metrics_age_the_oldest_ready_message_from_its_enqueue(api: httpx.Client) -> None:
    """SQS's ApproximateAgeOfOldestMessage: the head of the ready index, the next one delivered."""
    d, queue = new_queue(api, "aging")
    age = f'keyload_queue_oldest_ready_age_seconds{{domain="{d}",queue="aging"}}'
    assert scrape(api)[age] == 0  # nothing ready
    committed(api.post(f"{queue}/messages", json={"message_id": "first", "body": ""}))
    time.sleep(1.0)
    committed(api.post(f"{queue}/messages", json={"message_id": "second", "body": ""}))
    assert 1.0 <= scrape(api)[age] < 60
    [delivery] = committed(api.post(f"{queue}/receive", json={"max_messages": 1}))["deliveries"]
    assert delivery["message_id"] == "first"
    assert scrape(api)[age] < 1.0  # the head is now the second, enqueued after the pause
    committed(api.post(f"{queue}/receive", json={"max_messages": 1}))
    assert scrape(api)[age] == 0


def scrape(api: httpx.Client) -> dict[str, float]:
    """The samples of one /metrics scrape, by name and labels."""
    scraped = api.get("/metrics")
    assert scraped.status_code == 200
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in scraped.text.splitlines()
        if line and not line.startswith("#")
    }


def test_the_asyncio_client_runs_calls_concurrently(served: tuple[Path, str]) -> None:
    root, url = served
    d = domain()
    credential = Credential.load(root / "credentials" / "keyload-admin.json")

    async def scenario() -> None:
        async with AsyncClient(url, credential=credential) as client:
            await client.create_queue(d, "jobs")
            waiting = asyncio.create_task(client.receive(d, "jobs", max_messages=1, wait_ms=20_000))
            await asyncio.sleep(0.3)  # the long poll waits on the server; the loop goes on
            receipts = await asyncio.gather(
                *(client.enqueue(d, "jobs", f"job {i}".encode(), message_id=f"j{i}") for i in range(50))
            )
            assert sorted(r.message_id for r in receipts) == sorted(f"j{i}" for i in range(50))
            [delivery] = (await asyncio.wait_for(waiting, 15)).deliveries
            await client.ack(d, delivery.token)
            with pytest.raises(NotFoundError):
                await client.inspect_queue(d, "missing")
            assert (await client.inspect_queue(d, "jobs")).counters.stored_messages == 49

    asyncio.run(scenario())
    with pytest.raises(InvalidCommand):
        AsyncClient(str(root), credential=credential)


def test_the_asyncio_clients_consumer_awaits_a_coroutine_handler_on_the_calling_loop(
    served: tuple[Path, str],
) -> None:
    """§10a: AsyncClient.consume takes a coroutine function: each delivery's coroutine runs on the
    caller's event loop and is acked when it returns, nacked when it raises."""
    root, url = served
    d = domain()
    credential = Credential.load(root / "credentials" / "keyload-admin.json")

    async def scenario() -> None:
        async with AsyncClient(url, credential=credential) as client:
            await client.create_queue(d, "jobs", QueuePolicySpec(max_attempts=1))
            for i in range(8):
                await client.enqueue(d, "jobs", b"x", message_id=f"j{i}")
            loop, ran, stop = asyncio.get_running_loop(), set[str](), threading.Event()

            async def handler(delivery: Delivery) -> None:
                assert asyncio.get_running_loop() is loop
                await asyncio.sleep(0.01)
                ran.add(delivery.message_id)
                if len(ran) == 8:
                    stop.set()
                if delivery.message_id == "j5":
                    raise RuntimeError("handler failure")

            try:
                stats = await asyncio.wait_for(client.consume(d, "jobs", handler, wait_ms=500, stop=stop), 60)
            finally:
                stop.set()
            assert ran == {f"j{i}" for i in range(8)} and (stats.acked, stats.nacked) == (7, 1)
            counters = (await client.inspect_queue(d, "jobs")).counters
            assert (counters.acked_total, counters.dead_lettered) == (7, 1)

    asyncio.run(scenario())


def test_the_asyncio_client_has_every_call_of_the_client_and_refuses_calls_once_closed(
    served: tuple[Path, str],
) -> None:
    """§10a: every method of Client, awaited, but what only a local client has (a data directory's
    files) and what is no call (the class's tables; `partitions`, a property that may block); a call
    after close is InvalidCommand, as on a closed Client, not the thread pool's RuntimeError."""
    root, url = served
    local_only = {"data", "payloads", "poison_entries", "reply_partition"}
    not_calls = {"commands", "result_types", "partitions"}
    public = {name for name in vars(Client) if not name.startswith("_")}
    awaited = {name for name, value in vars(AsyncClient).items() if inspect.iscoroutinefunction(value)}
    assert public - local_only - not_calls == {name for name in awaited if not name.startswith("__")}
    credential = Credential.load(root / "credentials" / "keyload-admin.json")

    async def scenario() -> None:
        client = AsyncClient(url, credential=credential)
        with Client(url, credential=credential) as sync:
            assert await client.partition_domain(0) == sync.partition_domain(0)
        await client.close()
        await client.close()
        with pytest.raises(InvalidCommand, match="closed"):
            await client.inspect_queue(domain(), "jobs")

    asyncio.run(scenario())


def test_two_principals_with_one_command_id_are_each_answered_their_own_outcome(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    root, url = served
    d, queue = new_queue(api, "shared")
    with Client(root) as admin:
        other = admin.create_principal(
            f"other-{uuid.uuid4().hex[:8]}", [Grant(capability=Capability.consume, domain=d)]
        )
    same_key = {"Idempotency-Key": "shared-id"}
    waiting, answered = long_poll(url, {**bearer(root), **same_key}, f"{queue}/receive")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {other.bearer_token}"}, timeout=60) as theirs:
        clash = theirs.post(f"{queue}/receive", json={"wait_ms": 20_000}, headers=same_key)
    assert (clash.status_code, clash.json()["error_code"]) == (409, "Conflict")
    committed(api.post(f"{queue}/messages", json={"message_id": "m", "body": b64(b"mine")}))
    waiting.join(30)
    deliveries = committed(answered[0])["deliveries"]
    assert [base64.b64decode(m["body"]) for m in deliveries] == [b"mine"]


def outcome_stream_ends(root: Path) -> list[int]:
    data = DataDir.open(root)
    with data.outcome_log() as outcomes:
        return [outcomes.end_offset(partition) for partition in range(data.outcome_partitions)]


def outcome_stream_partitions(root: Path, since: list[int], domain: str) -> set[int]:
    """The partitions of the outcome stream that got an outcome of `domain` past the ends `since`."""
    with DataDir.open(root).outcome_log() as outcomes:
        return {
            partition
            for partition, start in enumerate(since)
            for record in outcomes.read(partition, start, 10_000)
            if REGISTRY.decode(OUTCOME, contents(record.value))["domain"] == domain
        }


def test_the_servers_answers_are_not_appended_to_the_outcome_stream(
    served: tuple[Path, str], api: httpx.Client, workers: int
) -> None:
    """The server's commands to its own process's partitions name no reply partition: they are answered
    in process, including a long poll served later by an enqueue, and the outcome stream (which local
    clients tail) gets none of it. A worker process's partitions answer through one partition of the
    stream, the server's reply partition. (The service's GC worker is a local client of its own: what
    it appends meanwhile is answered on the stream, and is not the server's.)"""
    root, url = served
    partitions = DataDir.open(root).partitions
    for worker in range(workers):
        d = next(name for name in iter(domain, None) if partition_for(name, partitions) % workers == worker)
        queue = f"/v1/domains/{d}/queues/q"
        before = outcome_stream_ends(root)
        committed(api.put(queue, json={"policy": {}}))
        waiting, answered = long_poll(url, {**bearer(root), "Idempotency-Key": "poll-1"}, f"{queue}/receive")
        committed(api.post(f"{queue}/messages", json={"message_id": "m-1", "body": b64(b"first")}))
        waiting.join(30)
        [delivery] = committed(answered[0])["deliveries"]
        assert base64.b64decode(delivery["body"]) == b"first"
        ack = api.post(f"/v1/domains/{d}/leases/ack", json={"token": delivery["token"]})
        assert committed(ack)["state"] == "acked"
        grown = outcome_stream_partitions(root, before, d)
        assert len(grown) == (0 if worker == 0 else 1), (worker, grown)


def test_an_unsigned_record_under_a_waiting_command_id_answers_nobody(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    root, url = served
    d, queue = new_queue(api, "q")
    waiting, answered = long_poll(url, {**bearer(root), "Idempotency-Key": "k-9"}, f"{queue}/receive")
    data = DataDir.open(root)
    forged = {
        "command_id": "k-9",
        "domain": d,
        "principal": "keyload-admin",
        "body": ("keyload.command.Receive", {"queue": "q", **dict.fromkeys(("max_messages", "max_bytes", "lease_ms"))}),
        "reply_to": None,  # as the server's own commands: answered in process
        "client_time_ms": None,
    }
    with data.file_command_log() as log:  # anyone who can append: no signature
        log.append(partition_for(d, data.partitions), [encode_command(forged)])
    time.sleep(0.5)
    assert answered == [], "the unsigned record's refusal answered the waiting request"
    committed(api.post(f"{queue}/messages", json={"message_id": "m", "body": b64(b"real")}))
    waiting.join(30)
    assert [base64.b64decode(m["body"]) for m in committed(answered[0])["deliveries"]] == [b"real"]


def test_an_issued_credential_is_answered_with_the_principals_view_and_works(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """The answer's shape as §10a and the OpenAPI document give it: the PrincipalView (record and
    policy epoch) the PutPrincipal committed, the credential and its bearer token."""
    _, url = served
    name = f"issued-{uuid.uuid4().hex[:8]}"
    created = api.post("/v1/principals", json={"principal": name, "grants": []})
    assert created.status_code == 200, created.text
    issued = created.json()
    assert set(issued) == {"principal", "credential", "bearer_token"}
    assert issued["principal"] == committed(api.get(f"/v1/principals/{name}"))
    assert issued["principal"]["principal"]["key_id"] == issued["credential"]["key_id"]
    rotated = api.post(f"/v1/principals/{name}/credential").json()
    assert rotated["principal"]["principal"]["revision"] == 2
    assert rotated["principal"]["policy_epoch"] > issued["principal"]["policy_epoch"]
    for token, status in ((issued["bearer_token"], 401), (rotated["bearer_token"], 200)):
        whoami = httpx.get(f"{url}/v1/principals/{name}", headers={"Authorization": f"Bearer {token}"})
        assert whoami.status_code == status


def test_an_issuance_sent_again_by_its_idempotency_key_is_answered_the_same_credential(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """A client that lost the answer to a create or a rotation sends it again with its Idempotency-Key:
    the stored outcome and the same working credential, no other key made, nothing rotated twice; the
    same key from another administrator, or with other grants, is a 409 as any other command's."""
    root, url = served
    name = f"again-{uuid.uuid4().hex[:8]}"
    create = {"principal": name, "grants": []}
    first = api.post("/v1/principals", json=create, headers={"Idempotency-Key": f"create-{name}"})
    again = api.post("/v1/principals", json=create, headers={"Idempotency-Key": f"create-{name}"})
    assert (again.status_code, again.json()) == (200, first.json())
    keys_before = len(keyring.load(root))
    rotate = {"Idempotency-Key": f"rotate-{name}"}
    rotated = [api.post(f"/v1/principals/{name}/credential", headers=rotate) for _ in range(2)]
    assert [answer.status_code for answer in rotated] == [200, 200]
    assert rotated[1].json() == rotated[0].json() and rotated[0].json()["principal"]["principal"]["revision"] == 2
    assert len(keyring.load(root)) == keys_before + 1
    for token, status in ((first.json()["bearer_token"], 401), (rotated[0].json()["bearer_token"], 200)):
        whoami = httpx.get(f"{url}/v1/principals/{name}", headers={"Authorization": f"Bearer {token}"})
        assert whoami.status_code == status
    other_grants = {**create, "grants": [{"capability": "consume", "domain": "d", "resource": "*"}]}
    changed = api.post("/v1/principals", json=other_grants, headers={"Idempotency-Key": f"create-{name}"})
    assert (changed.status_code, changed.json()["error_code"]) == (409, "Conflict")
    with Client(root) as admin:
        second_admin = admin.create_principal(f"admin-{name}", [Grant(capability=Capability.admin, domain="*")])
    by_another = httpx.post(
        f"{url}/v1/principals/{name}/credential",
        headers={**rotate, "Authorization": f"Bearer {second_admin.bearer_token}"},
    )
    assert (by_another.status_code, by_another.json()["error_code"]) == (409, "Conflict")
    assert committed(api.get(f"/v1/principals/{name}"))["principal"]["revision"] == 2


def log_ends(root: Path) -> list[int]:
    data = DataDir.open(root)
    with data.file_command_log() as log:
        return [log.end_offset(partition) for partition in range(data.partitions)]


def test_a_key_the_keyring_lacks_is_refused_before_it_could_halt_a_partition(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """A PutPrincipal or RotateKeys naming a key the keyring lacks would halt every partition it
    reaches until the key is added: an administrator's typo is a 400 instead, nothing appended,
    whether it comes to its own route or to `POST /v1/commands` (the SDK's). A
    caller that may not send the command is refused by the processor, as for any other key id."""
    root, url = served
    name = f"keyed-{uuid.uuid4().hex[:8]}"
    before = log_ends(root)
    missing = api.put(f"/v1/principals/{name}", json={"key_id": "no-such-key", "grants": [], "expected_revision": 0})
    assert (missing.status_code, missing.json()["error_code"]) == (400, "Validation"), missing.text
    assert missing.json()["detail"] == "key_id names no key of the service's keyring: add it first (keyload keys add)"
    too_long = api.put(f"/v1/principals/{name}", json={"key_id": "k" * 65, "grants": [], "expected_revision": 0})
    assert (too_long.status_code, too_long.json()["detail"]) == (
        400,
        "key_id: a key id is 1..64 printable ASCII characters",
    )  # no key can have it: the rule, not the keyring, is what to fix
    rotate = api.post(f"/v1/domains/{domain()}/keys/rotate", json={"jitter_key_id": "no-such-key"})
    assert (rotate.status_code, rotate.json()["detail"].split(" ")[0]) == (400, "jitter_key_id")
    for body in (  # the same commands as the log takes them, which the SDK's HTTP transport sends
        {"PutPrincipal": {"principal": name, "key_id": "no-such-key"}},
        {"RotateKeys": {"token_key_id": "no-such-key"}},
    ):
        enveloped = api.post("/v1/commands", json={"domain": domain(), "body": body})
        assert (enveloped.status_code, enveloped.json()["error_code"]) == (400, "Validation"), enveloped.text
    admin_credential = Credential.load(root / "credentials" / "keyload-admin.json")
    with Client(url, credential=admin_credential) as remote, pytest.raises(InvalidCommand, match=r"^key_id names no"):
        remote.put_principal(name, key_id="no-such-key")
    assert log_ends(root) == before
    assert api.get("/readyz").json()["halted"] == {}
    with Client(root) as admin:
        tenant = admin.create_principal(name, [Grant(capability=Capability.consume, domain="*")])
    as_tenant = {"Authorization": f"Bearer {tenant.bearer_token}"}
    other = f"/v1/principals/{name}-2"
    denied = httpx.put(f"{url}{other}", json={"key_id": "no-such-key", "grants": []}, headers=as_tenant)
    assert (denied.status_code, denied.json()["error_code"]) == (403, "PermissionDenied")
    keyring.add(root, "added-later")  # read again by the server: a key added while it runs counts
    added = api.put(other, json={"key_id": "added-later", "grants": [], "expected_revision": 0})
    assert committed(added)["principal"]["key_id"] == "added-later"
    assert api.get("/readyz").json()["halted"] == {}


def test_a_key_any_partition_signs_with_is_refused_before_any_partition_applies_it(
    served: tuple[Path, str], api: httpx.Client
) -> None:
    """Each partition's signing keys are its own (RotateKeys names one), and a worker process's
    partition is checked as the server's own are: a PutPrincipal of a key partition P signs tokens
    with is a 400 naming P, nothing appended anywhere, rather than a principal changed on the
    partitions before P and refused by P for good."""
    root, _ = served
    key_id = f"k-serving-{uuid.uuid4().hex[:8]}"
    keyring.add(root, key_id)
    name = f"taker-{uuid.uuid4().hex[:8]}"
    with Client(root) as admin:
        for partition in range(admin.partitions):
            before = admin.rotate_keys(partition).token_key_id
            admin.rotate_keys(partition, token_key_id=key_id)
            try:
                ends = log_ends(root)
                refused = api.put(
                    f"/v1/principals/{name}", json={"key_id": key_id, "grants": [], "expected_revision": 0}
                )
                assert refused.status_code == 400, refused.text
                assert f"(partition {partition})" in refused.json()["detail"]
                assert log_ends(root) == ends
            finally:
                admin.rotate_keys(partition, token_key_id=before)
        for partition in range(admin.partitions):
            with pytest.raises(NotFoundError):
                admin.inspect_principal(name, partition=partition)


def test_credential_issuing_refuses_what_it_must(api: httpx.Client, served: tuple[Path, str]) -> None:
    """Refusals of the HTTP layer: no outcome, so no command id (§10a), though the request gave one."""
    ends = log_ends(served[0])
    keyed = {"Idempotency-Key": "refused-issuance"}
    missing = api.post("/v1/principals/nobody-here/credential", headers=keyed)
    assert (missing.status_code, missing.json()["error_code"]) == (404, "NotFound")
    refusals = [missing]
    for service_principal in ("keyload-ticker", "keyload-gc", "keyload-admin"):
        refused = api.post(f"/v1/principals/{service_principal}/credential", headers=keyed)
        assert (refused.status_code, refused.json()["error_code"]) == (403, "PermissionDenied")
        refusals.append(refused)
    assert log_ends(served[0]) == ends
    name = f"plain-{uuid.uuid4().hex[:8]}"
    plain = api.post("/v1/principals", json={"principal": name, "grants": []}).json()["bearer_token"]
    by_a_plain_principal = httpx.post(
        f"{served[1]}/v1/principals",
        json={"principal": f"{name}-2", "grants": []},
        headers={**keyed, "Authorization": f"Bearer {plain}"},
    )
    assert (by_a_plain_principal.status_code, by_a_plain_principal.json()["error_code"]) == (403, "PermissionDenied")
    refusals.append(by_a_plain_principal)
    for refused in refusals:
        assert refused.json()["command_id"] is None and "keyload-command-id" not in refused.headers
    bad_name = api.post("/v1/principals", json={"principal": "bad name!", "grants": []})
    assert (bad_name.status_code, bad_name.json()["error_code"]) == (400, "Validation")
    assert api.get("/healthz").status_code == 200  # the connection is still good


def test_non_ascii_digits_are_not_numbers(api: httpx.Client) -> None:
    partition = api.post("/v1/partitions/%C2%B2/checkpoints", json={})
    assert (partition.status_code, partition.json()["error_code"]) == (400, "Validation")
    for spelled in ("%C2%B2", str(2**64), str(2**63)):  # not digits; past a u64; past an Avro long
        reservation = api.put(f"/v1/domains/{domain()}/reservations/{spelled}/content", content=b"x")
        assert (reservation.status_code, reservation.json()["error_code"]) == (400, "Validation")


@pytest.mark.parametrize("form", ["text", "json"])
def test_what_uvicorn_logs_is_in_the_services_log_format(tmp_path: Path, form: str) -> None:
    """A request uvicorn refuses before any route (a control character in a header) is answered
    400 and logged by uvicorn: in the service's --log-format like every other line, so one bad
    request cannot put a line a JSON log pipeline cannot parse into the service's log."""
    root = tmp_path / "data"
    errors = tmp_path / "stderr"
    with errors.open("wb") as sink:
        command = keyload_command("run", "--data", str(root), "--log-format", form)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        address = httpx.URL(served_url(root))
        with socket.create_connection((address.host, address.port or 80)) as connection:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n")
            assert connection.recv(4096).startswith(b"HTTP/1.1 400 ")
        assert stop_service(process) == 0
    finally:
        if process.poll() is None:
            process.kill()
    lines = errors.read_text().splitlines()
    assert any("Invalid HTTP request" in line for line in lines), lines
    for line in lines:
        if form == "json":
            assert isinstance(json.loads(line), dict), line
        else:
            assert line.startswith("keyload: "), line
