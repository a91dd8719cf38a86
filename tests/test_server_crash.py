"""kill -9 of a serving `keyload run` in the middle of HTTP load: clients retry by command id
(Idempotency-Key) until answered, through the restart. Nothing is lost, nothing applied twice, and the
drill rebuilds the same projection from the log."""

from __future__ import annotations

import base64
import hashlib
import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from keyload import Client, Credential
from keyload.log.base import partition_for
from keyload.operations.recovery import drill
from keyload.storage.datadir import DataDir

from .support import (
    assert_each_enqueued_once,
    enqueue_retrying,
    free_port,
    served_url,
    start_service,
    stop_service,
    wait_until,
)

pytestmark = pytest.mark.slow

DOMAIN = "crash"
PRODUCERS = 4
MESSAGES = 150  # per producer
GIVE_UP_S = 180.0  # a producer that cannot get an answer this long after its first try fails the test


def test_a_killed_server_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    listen = f"127.0.0.1:{free_port()}"
    url = f"http://{listen}"
    service = start_service(root, "--listen", listen)
    credential = Credential.load(root / "credentials" / "keyload-admin.json")
    with Client(url, credential=credential) as admin:
        admin.create_queue(DOMAIN, "jobs")
    answered: list[int] = []
    retried: list[int] = []
    failures: list[str] = []

    def produce(producer: int) -> None:
        with Client(url, credential=credential, timeout_s=5) as client:
            for n in range(MESSAGES):
                try:
                    retried.append(enqueue_retrying(client, DOMAIN, "jobs", f"p{producer}-{n}", GIVE_UP_S))
                except AssertionError as exc:
                    failures.append(str(exc))
                    return
                answered.append(1)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(answered) >= PRODUCERS * MESSAGES // 3, 120, "a third of the messages")
        service.send_signal(signal.SIGKILL)
        service.wait()
        time.sleep(0.5)  # the producers meet a server that is not there
        service = start_service(root, "--listen", listen)
        for thread in threads:
            thread.join(GIVE_UP_S + 30)
    finally:
        if service.poll() is None:
            assert stop_service(service, 30) == 0
    assert failures == []
    assert len(answered) == PRODUCERS * MESSAGES
    assert sum(retried), "the kill reached the producers in flight"

    service = start_service(root, "--listen", listen)
    try:
        with Client(url, credential=credential) as admin:
            assert_each_enqueued_once(admin, DOMAIN, "jobs", PRODUCERS, MESSAGES)
    finally:
        assert stop_service(service, 30) == 0
    data = DataDir.open(root)
    report = drill(data, partition_for(DOMAIN, data.partitions), tmp_path / "drill", progress=False)
    assert report.passed, report


def test_a_request_in_flight_when_the_service_is_stopped_gets_its_outcome(tmp_path: Path) -> None:
    """SIGTERM drains the API before the processors stop: a long poll waiting at the signal is still
    answered by a message a local operator enqueues during the drain (200, with the message), and
    the server takes no new connection meanwhile."""
    poll = LongPoll(tmp_path / "data", "jobs")
    poll.service.send_signal(signal.SIGTERM)
    wait_until(lambda: refused(poll.url), what="the server to stop taking connections")
    with Client(poll.root) as operator:  # the local path: straight into the file log
        operator.enqueue(DOMAIN, "jobs", b"sent during the drain", message_id="late")
    poll.waiting.join(30)
    assert stop_service(poll.service, 30) == 0
    response = poll.answered[0]
    assert response.status_code == 200
    (delivery,) = response.json()["result"]["deliveries"]
    assert (delivery["message_id"], delivery["body"]) == ("late", "c2VudCBkdXJpbmcgdGhlIGRyYWlu")


def test_an_upload_in_flight_when_the_service_stops_is_answered_503_and_taken_after_a_restart(
    tmp_path: Path,
) -> None:
    """An upload whose body is still coming (a slow client) when the service stops is answered 503
    `Unavailable` at the end of the drain, in the API's JSON form, before the server closes its
    connection (uvicorn would answer a request it cuts off 500, in plain text); once the service
    serves again the same reservation and handle take the bytes."""
    root = tmp_path / "data"
    service = start_service(root)
    url = served_url(root)
    credential = Credential.load(root / "credentials" / "keyload-admin.json")
    auth = {"Authorization": f"Bearer {credential.bearer_token}"}
    payload = bytes(range(256)) * 64
    queue = f"{url}/v1/domains/{DOMAIN}/queues/media"
    assert httpx.put(queue, json={"policy": {}}, headers=auth).status_code == 200
    reserve = {
        "message_id": "video",
        "length": len(payload),
        "sha256": base64.b64encode(hashlib.sha256(payload).digest()).decode(),
        "headers": {},
    }
    reserved = httpx.post(f"{queue}/reservations", json=reserve, headers=auth)
    content = f"{url}/v1/domains/{DOMAIN}/reservations/{reserved.json()['result']['reservation_id']}/content"
    upload = {**auth, "Keyload-Upload-Handle": reserved.headers["keyload-upload-handle"]}
    # A client that sent the head and part of the body, and reads while it would send the rest (httpx
    # reads an answer only once its body is sent).
    address = url.removeprefix("http://").rsplit(":", 1)
    target = content.removeprefix(url)
    head = (
        f"PUT {target} HTTP/1.1\r\nHost: {address[0]}\r\nAuthorization: {auth['Authorization']}\r\n"
        f"Keyload-Upload-Handle: {upload['Keyload-Upload-Handle']}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection((address[0], int(address[1])), timeout=30) as slow:
        slow.sendall(head.encode() + payload[:1024])
        time.sleep(0.5)
        started = time.monotonic()
        service.send_signal(signal.SIGTERM)
        answer = slow.makefile("rb").read()
    assert time.monotonic() - started < 8  # within the drain, before the server's graceful shutdown ends
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 503 Service Unavailable"
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error_code"] == "Unavailable"
    assert stop_service(service, 30) == 0
    service = start_service(root)
    try:
        again = httpx.put(served_url(root) + content.removeprefix(url), content=payload, headers=upload, timeout=30)
        assert (again.status_code, again.json()["result"]["state"]) == (200, "committed")
    finally:
        assert stop_service(service, 30) == 0


class LongPoll:
    """A running `keyload run` over `root`, a new queue in DOMAIN, and a receive on it waiting up to
    20 s over HTTP in a thread of its own (under way when the constructor returns): its response goes
    to `answered`."""

    def __init__(self, root: Path, queue: str) -> None:
        self.root = root
        self.service = start_service(root)
        self.url = served_url(root)
        credential = Credential.load(root / "credentials" / "keyload-admin.json")
        with Client(self.url, credential=credential) as admin:
            admin.create_queue(DOMAIN, queue)
        self.answered: list[httpx.Response] = []
        self.waiting = threading.Thread(target=self._receive, args=(credential, queue))
        self.waiting.start()
        time.sleep(0.5)

    def _receive(self, credential: Credential, queue: str) -> None:
        headers = {"Authorization": f"Bearer {credential.bearer_token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            response = client.post(f"/v1/domains/{DOMAIN}/queues/{queue}/receive", json={"wait_ms": 20_000})
        self.answered.append(response)


def refused(url: str) -> bool:
    """Whether a new connection goes unserved: refused, or reset before any answer (it was still in the
    listener's backlog when the server closed its socket)."""
    try:
        httpx.get(f"{url}/healthz", timeout=1.0)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def test_a_stopping_server_answers_waiting_requests_503(tmp_path: Path) -> None:
    poll = LongPoll(tmp_path / "data", "idle")
    started = time.monotonic()
    assert stop_service(poll.service, 30) == 0
    poll.waiting.join(30)
    assert time.monotonic() - started < 10
    assert (poll.answered[0].status_code, poll.answered[0].json()["error_code"]) == (503, "Unavailable")
