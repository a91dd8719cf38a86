"""What a client's connections may hold of the service (keyload/server/connections.py): a bounded
number of connections, a request head that arrives in time, and one of bounded size. A client that
opens connections and sends nothing, or streams a header without end, gets a typed refusal and the
connection closed; the processors go on committing, and other clients are served.

The timeout and the connection bound are exercised on a real uvicorn server with the guarded
protocol and shortened bounds (30 s and 10,000 are long for a test); the size bound, and the
connection bound under a low open-file limit, on `keyload run` itself."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import resource
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from keyload import Client
from keyload.server import connections
from keyload.server.connections import MAX_REQUEST_HEAD_BYTES, connection_limit, guarded_protocol
from keyload.server.metrics import ConnectionCounts

from .support import (
    bearer,
    keyload_command,
    self_signed,
    served_url,
    start_service,
    stop_service,
    wait_until,
)

HEAD_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 0.2  # uvicorn's idle time between requests, shortened too (its default is 5 s)


def received(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """All the server sent on `sock` until it closed it."""
    sock.settimeout(timeout_s)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def refusal(sock: socket.socket, timeout_s: float = 10.0) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of what the server answered before closing `sock`."""
    head, _, body = received(sock, timeout_s).partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return int(head.split()[1]), json.loads(body)


class Guarded:
    """A uvicorn server with the guarded protocol: its URL, and its connection counts."""

    def __init__(self, url: str, registry: CollectorRegistry) -> None:
        self.url = url
        self.registry = registry

    def refused(self, reason: str) -> float | None:
        return self.registry.get_sample_value("keyload_http_connections_refused_total", {"reason": reason})

    def open(self) -> float | None:
        return self.registry.get_sample_value("keyload_http_connections")


@contextlib.contextmanager
def guarded_server(allowed: int, tls: ssl.SSLContext | None = None) -> Iterator[Guarded]:
    """A uvicorn server with the guarded protocol, at most `allowed` connections, over `tls` if given."""

    async def hello(_: Any) -> PlainTextResponse:
        return PlainTextResponse("hello")

    async def slow(_: Any) -> PlainTextResponse:
        await asyncio.sleep(HEAD_TIMEOUT_S * 3)
        return PlainTextResponse("slow")

    registry = CollectorRegistry()
    counts = ConnectionCounts.registered(registry)
    protocol = guarded_protocol(counts, tls, allowed)
    app = Starlette(routes=[Route("/", hello, methods=["GET", "POST"]), Route("/slow", slow)])
    config = uvicorn.Config(
        app, http=protocol, loop="uvloop", log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_S
    )
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    runner = asyncio.Runner(loop_factory=config.get_loop_factory())  # uvloop, as `keyload run`'s
    thread = threading.Thread(target=lambda: runner.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the server to start")
    try:
        yield Guarded(f"{'http' if tls is None else 'https'}://127.0.0.1:{sock.getsockname()[1]}", registry)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def connect(url: str) -> socket.socket:
    """A TCP connection to the server at `url` (over TLS too: no handshake begun)."""
    host, port = url.partition("://")[2].split(":")
    return socket.create_connection((host, int(port)))


def test_a_request_head_that_does_not_arrive_in_time_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "REQUEST_HEAD_TIMEOUT_S", HEAD_TIMEOUT_S)
    with guarded_server(allowed=100) as server:
        url = server.url
        with connect(url) as silent:  # connects and sends nothing: closed without a word, as nginx does
            assert received(silent) == b""
        assert server.refused("head_timeout") == 1

        with connect(url) as slow:  # a request head a byte at a time, never finished
            slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            for byte in b"X-Slow":
                slow.sendall(bytes([byte]))
                time.sleep(HEAD_TIMEOUT_S / 20)
            status, body = refusal(slow)
        assert (status, body["error_code"]) == (408, "Timeout")
        assert body["detail"] == f"no complete request line and headers within {HEAD_TIMEOUT_S:g} s"
        assert server.refused("head_timeout") == 2

        with connect(url) as pipelined:  # the head behind a slow answer: the client waits, not the server
            pipelined.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP")
            answers = received(pipelined)
        assert answers.count(b"HTTP/1.1 200 OK") == 2 and answers.index(b"slow") < answers.index(b"hello")
        assert b"HTTP/1.1 408" in answers[answers.index(b"hello") :]  # then the third head timed out

        with connect(url) as behind:  # a head begun behind an answer keeps its time after it, not the keep-alive's
            behind.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHo")
            behind.settimeout(10)
            first = b""
            while not first.endswith(b"slow"):  # /slow's answer, head and body (maybe apart)
                first += behind.recv(65536)
            assert first.startswith(b"HTTP/1.1 200 OK")
            time.sleep(KEEP_ALIVE_S * 2)  # idle longer than a kept-alive connection may, inside the head's time
            behind.sendall(b"st: x\r\nConnection: close\r\n\r\n")
            assert received(behind).startswith(b"HTTP/1.1 200 OK")

        with httpx.Client(base_url=url) as client:  # requests on a kept-alive connection, slower than the bound
            for _ in range(2):
                assert client.get("/").text == "hello"
                time.sleep(HEAD_TIMEOUT_S * 2)  # idle between requests: closed by the keep-alive, no 408


def head_of(size: int, small_headers: bool) -> bytes:
    """A GET head of exactly `size` bytes, `Name: value` lines: one large header, or many small ones."""
    start, end = b"GET / HTTP/1.1\r\nHost: x\r\n", b"Connection: close\r\n\r\n"
    room = size - len(start) - len(end)
    small = b"a: b\r\n" * ((room - 64) // 6 if small_headers else 0)
    pad = room - len(small) - len(b"x-pad: \r\n")
    return start + small + b"x-pad: " + b"p" * pad + b"\r\n" + end


def test_the_head_bound_is_exact_across_reads_and_counts_no_body_bytes() -> None:
    """A head over the bound is refused however its bytes are split, one under it is served however
    they are split, and a pipelined request's body before the next head is no head of anyone's, nor
    the framing of the next request's body (a read may end one request and begin the next)."""
    head_line = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "
    with guarded_server(allowed=100) as server:
        url = server.url
        for size, small_headers, pieces in itertools.product(
            (MAX_REQUEST_HEAD_BYTES, MAX_REQUEST_HEAD_BYTES + 1), (False, True), (1, 16)
        ):
            head = head_of(size, small_headers)
            assert len(head) == size
            with connect(url) as sent:
                step = -(-size // pieces)
                for at in range(0, size, step):
                    sent.sendall(head[at : at + step])
                    time.sleep(0.01 if pieces > 1 else 0)
                status = int(received(sent).split()[1])
            assert status == (200 if size <= MAX_REQUEST_HEAD_BYTES else 431), (size, small_headers, pieces)
        for size, status in ((MAX_REQUEST_HEAD_BYTES - 1024, 200), (MAX_REQUEST_HEAD_BYTES + 1024, 431)):
            with connect(url) as split:
                split.sendall(head_line + b"a" * (size // 2))
                time.sleep(0.2)  # two reads: the second completes the head
                split.sendall(b"a" * (size - size // 2) + b"\r\nConnection: close\r\n\r\n")
                assert int(received(split).split()[1]) == status, size

        body = b"b" * (MAX_REQUEST_HEAD_BYTES + 10_000)
        post = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        with connect(url) as pipelined:
            pipelined.sendall(post + b"GET / HTTP/1.1\r\nHo")  # one write: a body, then a head begun
            time.sleep(0.2)
            pipelined.sendall(b"st: x\r\nConnection: close\r\n\r\n")
            assert received(pipelined).count(b"HTTP/1.1 200 OK") == 2
        with connect(url) as pipelined:  # one read: a body, then the whole head of a request whose body comes later
            pipelined.sendall(post + b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
            time.sleep(0.2)
            pipelined.sendall(b"hello")
            assert received(pipelined).count(b"HTTP/1.1 200 OK") == 2

        chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: "
        with connect(url) as trailing:  # a trailer streamed without end: cut off, not joined for ever
            trailing.sendall(chunked)
            with contextlib.suppress(OSError):  # what comes after the refusal is dropped, then reset
                for _ in range(4):
                    trailing.sendall(b"t" * 65536)
            answers = received(trailing)
        assert b"HTTP/1.1 200 OK" in answers  # the request itself was answered before its trailer ran over
        assert b"a chunked body's framing and trailers are over 65536 bytes" in answers


def test_connections_past_the_bound_are_refused_and_served_again_once_one_closes() -> None:
    with guarded_server(allowed=3) as server:
        url = server.url
        held = [connect(url) for _ in range(3)]
        try:
            with connect(url) as extra:
                status, body = refusal(extra)
            assert (status, body["error_code"]) == (503, "Unavailable")
            assert "holds 3 connections, its limit" in body["detail"]
            assert (server.refused("connections"), server.open()) == (1, 3)
            held.pop().close()
            wait_until(lambda: httpx.get(url).status_code == 200, 10, "a connection to be served again")
        finally:
            for sock in held:
                sock.close()


def test_over_tls_a_connection_counts_from_its_accept_and_its_handshake_has_the_heads_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections that never begin a handshake hold the bound (asyncio's TLS would not count them
    until their handshake is done, for 60 s): one past it is closed before its handshake, and they
    are closed once their time is out, which frees the bound."""
    monkeypatch.setattr(connections, "REQUEST_HEAD_TIMEOUT_S", HEAD_TIMEOUT_S)
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with guarded_server(allowed=2, tls=context) as server:
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(verify=trust) as client:  # a handshake, then a request: served as ever
            assert client.get(server.url).text == "hello"
        wait_until(lambda: server.open() == 0, 10, "the client's connection to close")
        held = [connect(server.url) for _ in range(2)]
        try:
            wait_until(lambda: server.open() == 2, 10, "the connections to be counted")
            with pytest.raises(httpx.TransportError):
                httpx.get(server.url, verify=trust)
            assert server.refused("connections") == 1
            for sock in held:  # their handshake's time runs out: closed without a word
                assert received(sock) == b""
        finally:
            for sock in held:
                sock.close()
        assert server.refused("head_timeout") == 2
        assert httpx.get(server.url, verify=trust).text == "hello"


def test_the_connection_bound_is_half_the_open_files_at_most_ten_thousand() -> None:
    assert connection_limit(1024) == 512
    assert connection_limit(20_000) == 10_000
    assert connection_limit(1) == 1
    assert connection_limit(resource.RLIM_INFINITY) == 10_000


def test_a_request_head_past_its_bound_is_refused_and_the_service_goes_on(tmp_path: Path) -> None:
    """A header streamed without end is cut off at the bound (it would cost the service's thread
    quadratic time); a head under the bound is served; commands go on meanwhile."""
    root = tmp_path / "data"
    output: list[str] = []
    service = start_service(root, output=output)
    try:
        url = served_url(root)
        for _ in range(3):  # an upgrade is no WebSocket here: answered as a plain request, logged by nobody
            with connect(url) as upgrade:
                upgrade.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                )
                upgrade.settimeout(10)
                assert upgrade.recv(65536).startswith(b"HTTP/1.1 200 OK")
        under = "v" * (MAX_REQUEST_HEAD_BYTES - 1024)
        assert httpx.get(f"{url}/healthz", headers={"X-Padding": under}).status_code == 200
        with connect(url) as streaming:
            streaming.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
            with contextlib.suppress(OSError):  # the server closes the connection mid-stream
                for _ in range(1024):  # up to 64 MiB, far past the bound
                    streaming.sendall(b"a" * 65536)
            status, body = refusal(streaming)
        assert (status, body["error_code"]) == (431, "Validation")
        assert body["detail"] == f"the request line and headers are over {MAX_REQUEST_HEAD_BYTES} bytes"
        with Client(root) as client:
            client.create_queue("acme", "jobs")
            client.enqueue("acme", "jobs", b"after", message_id="m1")
        scrape = httpx.get(f"{url}/metrics", headers=bearer(root)).text
        assert 'keyload_http_connections_refused_total{reason="head_too_large"} 1.0' in scrape
        assert "keyload_http_connections 1.0" in scrape  # the scrape's own: none left over
    finally:
        assert stop_service(service) == 0
    wait_until(lambda: any(line.startswith("keyload: stopped") for line in output), 10, "the service's last line")
    assert not [line for line in output if "upgrade" in line.lower()], output


def test_idle_connections_cannot_take_the_files_the_processors_need(tmp_path: Path) -> None:
    """Under an open-file limit of 256, at most 128 connections are served at once: idle ones past
    that are refused, and the partitions go on committing (a local client's commands are answered,
    which needs the log's and the projections' files); once the idle ones close, the API serves again."""
    root = tmp_path / "data"
    service = start_service(root, open_files=256)
    try:
        url = served_url(root)
        allowed = connection_limit(256)
        held: list[socket.socket] = []
        try:
            while len(held) < allowed:
                held.append(connect(url))
            wait_until(lambda: _refused(url), 10, "a connection past the bound to be refused")
            _served_locally(root)
        finally:
            for sock in held:
                sock.close()
        wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, 10, "the API to serve again")
        scrape = httpx.get(f"{url}/metrics", headers=bearer(root)).text
        assert 'keyload_http_connections_refused_total{reason="connections"} ' in scrape
        assert 'keyload_http_connections_refused_total{reason="connections"} 0.0' not in scrape
    finally:
        assert stop_service(service) == 0


def test_max_connections_lowers_the_bound_and_never_raises_it(tmp_path: Path) -> None:
    """`--max-connections N`: the N+1st connection at once is answered 503; a value the open-file limit
    does not allow is a usage error before anything is created."""
    ceiling = connection_limit(256)
    for value, shown in (
        ("0", "expected a positive integer"),
        (str(ceiling + 1), f"--max-connections must be 1..{ceiling}"),
    ):
        command = keyload_command("run", "--data", str(tmp_path / "never"), "--max-connections", value)
        refused = subprocess.run(
            ["prlimit", "--nofile=64:256", "--", *command, "--listen", "127.0.0.1:0"],
            capture_output=True,
            text=True,
        )
        assert (refused.returncode, shown in refused.stderr) == (2, True), refused.stderr
        assert not (tmp_path / "never").exists()
    root = tmp_path / "data"
    service = start_service(root, "--max-connections", "3")
    try:
        url = served_url(root)
        held = [connect(url) for _ in range(3)]
        try:
            with connect(url) as extra:
                status, body = refusal(extra)
            assert (status, body["error_code"]) == (503, "Unavailable")
            assert "3 connections" in body["detail"]
        finally:
            for sock in held:
                sock.close()
        wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, 10, "the API to serve again")
    finally:
        assert stop_service(service) == 0


def test_tls_handshakes_never_begun_cannot_take_the_files_the_processors_need(tmp_path: Path) -> None:
    """Over TLS under an open-file limit of 256: twice as many connections as may be served, none of
    them beginning its handshake, and the partitions go on committing; those past the bound are
    closed at once, and the API serves again once the others close."""
    cert, key = self_signed(tmp_path)
    root = tmp_path / "data"
    service = start_service(root, "--tls-cert", str(cert), "--tls-key", str(key), open_files=256)
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        url = served_url(root)
        held = [connect(url) for _ in range(connection_limit(256) * 2)]
        try:  # the server accepts in order: once one more is closed at once, so were those past the bound
            wait_until(lambda: _closed_at_once(url), 10, "a connection past the bound to be closed")
            _served_locally(root)
        finally:
            for sock in held:
                sock.close()
        wait_until(lambda: _served(url, trust), 10, "the API to serve again")
        scrape = httpx.get(f"{url}/metrics", headers=bearer(root), verify=trust).text
        refused = next(line for line in scrape.splitlines() if 'refused_total{reason="connections"}' in line)
        assert float(refused.split()[-1]) >= connection_limit(256)  # those past the bound (and probes)
    finally:
        assert stop_service(service) == 0


def _served_locally(root: Path) -> None:
    """A local client's commands are answered: the processors still open and commit files."""
    with Client(root) as client:
        client.create_queue("acme", "jobs")
        client.enqueue("acme", "jobs", b"while held", message_id="m1")
        [delivery] = client.receive("acme", "jobs").deliveries
        client.ack("acme", delivery.token)


def _closed_at_once(url: str) -> bool:
    """Whether a connection to an HTTPS server is closed before its handshake (one that counts waits
    for the handshake for 30 s)."""
    with connect(url) as probe:
        probe.settimeout(2)
        try:
            return probe.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def _served(url: str, trust: ssl.SSLContext) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(f"{url}/healthz", verify=trust).status_code == 200
    return False


def _refused(url: str) -> bool:
    with connect(url) as extra:
        status, body = refusal(extra)
    return status == 503 and body["error_code"] == "Unavailable"


def test_a_client_gone_mid_body_is_not_logged_as_a_failure(tmp_path: Path) -> None:
    """An upload (or any body) cut off by its client is the client's doing: the service logs nothing
    for it, so a client cannot fill the log with failures that are not the service's."""
    root = tmp_path / "data"
    output: list[str] = []
    service = start_service(root, output=output)
    try:
        url = served_url(root)
        authorization = bearer(root)["Authorization"].encode()
        payload = b"p" * 100_000
        reserve = {
            "message_id": "big",
            "length": len(payload),
            "sha256": base64.b64encode(hashlib.sha256(payload).digest()).decode(),
        }
        with httpx.Client(base_url=url, headers=bearer(root)) as api:
            assert api.put("/v1/domains/acme/queues/media", json={"policy": {}}).status_code == 200
            reserved = api.post("/v1/domains/acme/queues/media/reservations", json={**reserve, "headers": {}})
            assert reserved.status_code == 200, reserved.text
        content = f"/v1/domains/acme/reservations/{reserved.json()['result']['reservation_id']}/content"
        cut_off = [
            (b"PUT " + content.encode(), b"application/octet-stream", len(payload), payload[:1000]),
            (b"POST /v1/domains/acme/queues/media/messages", b"application/json", 1000, b'{"message_id"'),
        ]
        for _ in range(3):
            for line, content_type, length, sent in cut_off:
                with connect(url) as cut:
                    cut.sendall(
                        line + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + authorization + b"\r\n"
                        b"Content-Type: " + content_type + b"\r\nContent-Length: %d\r\n\r\n" % length + sent
                    )
                    time.sleep(0.1)  # the request is being read when its client goes
        assert httpx.get(f"{url}/healthz").status_code == 200
    finally:
        assert stop_service(service) == 0
    wait_until(lambda: any(line.startswith("keyload: stopped") for line in output), 10, "the service's last line")
    assert not [line for line in output if "failed" in line], output
