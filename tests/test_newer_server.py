"""The Python SDK against a server newer than itself, and against answers no keyload server gives.

No newer server exists to run, so a plain HTTP server (stdlib, on loopback) answers each request as
one would: outcomes in the API's JSON form with an error code, an enum symbol or fields this SDK's
schemas lack; and, for what may stand between a client and its server, a proxy's error page. The
SDK under test is the real `Client` over its real HTTP transport (and, last, a local `Client` over
the outcome stream of a data directory)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from keyload import Client, CommandRejected, ErrorCode, KeyloadError
from keyload.credentials import ADMIN_PRINCIPAL, Credential, signed
from keyload.errors import BY_CODE, InvalidCommand, NotFoundError, ServiceUnavailable, UnreadableOutcome
from keyload.storage.datadir import DataDir
from keyload.storage.principals import system_credential

from .support import outcome_json, wait_until

CREDENTIAL = Credential("tenant", "tenant-1", b"s" * 32)
ENQUEUE_RESULT = {
    "queue": "orders",
    "message_id": "m-1",
    "state": "ready",
    "enqueue_sequence": 1,
    "stored_messages": 1,
    "stored_bytes": 5,
}


class Answers:
    """What the stand-in server answers next: (HTTP status, content type, body bytes)."""

    def __init__(self) -> None:
        self.next: tuple[int, str, bytes] = (500, "text/plain", b"nothing set")
        self.requests: list[dict[str, Any]] = []

    def outcome(self, http_status: int, **fields: Any) -> None:
        """An outcome of the command the client sends next, as a newer server's JSON form."""
        answer = outcome_json(**fields)  # its command_id is the request's Idempotency-Key (`_answer`)
        self.next = (http_status, "application/json", json.dumps(answer).encode())


@pytest.fixture
def newer() -> Iterator[tuple[Answers, str]]:
    answers = Answers()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            answers.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._answer()

        def _answer(self) -> None:
            status, content_type, body = answers.next
            if content_type == "application/json":
                answer = json.loads(body)
                if "command_id" in answer:
                    answer["command_id"] = self.headers["Idempotency-Key"]
                body = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield answers, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_result_with_fields_this_sdk_lacks_is_read_without_them(newer: tuple[Answers, str]) -> None:
    answers, url = newer
    answers.outcome(200, result={**ENQUEUE_RESULT, "region": "eu-1"}, served_by="node-2")
    with Client(url, credential=CREDENTIAL) as client:
        result = client.enqueue("shop", "orders", b"hello", message_id="m-1")
    assert (result.message_id, result.state, result.stored_bytes) == ("m-1", "ready", 5)


def test_a_refusal_with_a_code_this_sdk_does_not_know_is_a_command_rejected_keeping_the_code(
    newer: tuple[Answers, str],
) -> None:
    """Newer servers refuse with codes of their own; the caller still learns the command was applied
    and refused, and which code refused it, rather than a conversion error."""
    answers, url = newer
    assert "QueueFrozen" not in set(ErrorCode) | set(BY_CODE)
    answers.outcome(409, status="rejected", error_code="QueueFrozen", detail="orders is frozen")
    with Client(url, credential=CREDENTIAL) as client, pytest.raises(CommandRejected) as refused:
        client.enqueue("shop", "orders", b"hello", command_id="c-frozen")
    assert type(refused.value) is CommandRejected
    assert str(refused.value) == "QueueFrozen: orders is frozen"
    outcome = refused.value.outcome
    assert (outcome.command_id, outcome.status, outcome.error_code, outcome.offset) == (
        "c-frozen",
        "rejected",
        "QueueFrozen",
        7,
    )


def test_a_refusal_with_a_known_code_is_still_its_own_class(newer: tuple[Answers, str]) -> None:
    answers, url = newer
    answers.outcome(404, status="rejected", error_code="NotFound", detail="no queue orders", reason="gone")
    with Client(url, credential=CREDENTIAL) as client, pytest.raises(NotFoundError) as refused:
        client.enqueue("shop", "orders", b"hello")
    assert refused.value.outcome.error_code is ErrorCode.NOT_FOUND


def test_a_result_holding_a_symbol_this_sdk_does_not_know_is_unreadable_not_invalid(
    newer: tuple[Answers, str],
) -> None:
    """The command was applied: the error must not say that nothing was (InvalidCommand), and it
    names the command id to resubmit once the SDK is upgraded."""
    answers, url = newer
    answers.outcome(200, result={**ENQUEUE_RESULT, "state": "frozen"})
    with Client(url, credential=CREDENTIAL) as client, pytest.raises(UnreadableOutcome) as unreadable:
        client.enqueue("shop", "orders", b"hello", command_id="c-new-state")
    assert not isinstance(unreadable.value, InvalidCommand)
    assert unreadable.value.command_id == "c-new-state"
    assert "'c-new-state'" in str(unreadable.value) and "frozen" in str(unreadable.value)
    assert len(answers.requests) == 1


@pytest.mark.parametrize(
    ("status", "error"),
    [(502, ServiceUnavailable), (503, ServiceUnavailable), (404, KeyloadError), (200, KeyloadError)],
)
def test_an_answer_no_keyload_server_gives_is_a_keyload_error_naming_the_status(
    newer: tuple[Answers, str], status: int, error: type[KeyloadError]
) -> None:
    """A proxy's error page (HTML, or JSON of its own), or anything else that is not a keyload
    server's answer: a 5xx may be retried by command id (ServiceUnavailable), and neither escapes as
    a JSON decoding error nor claims that the command was applied (UnreadableOutcome)."""
    answers, url = newer
    answers.next = (status, "text/html", b"<html><body>Bad Gateway</body></html>")
    with Client(url, credential=CREDENTIAL) as client, pytest.raises(KeyloadError) as failed:
        client.enqueue("shop", "orders", b"hello")
    assert type(failed.value) is error
    assert f"answered {status} with no keyload answer" in str(failed.value)
    for other in (b"[1, 2]", b'{"message": "Bad Gateway"}'):
        answers.next = (status, "application/json", other)
        with Client(url, credential=CREDENTIAL) as client, pytest.raises(KeyloadError) as failed:
            client.enqueue("shop", "orders", b"hello")
        assert type(failed.value) is error
    with Client(url, credential=CREDENTIAL) as client, pytest.raises(KeyloadError) as failed:
        client.partitions  # noqa: B018  # GET /v1/service, asked once
    assert type(failed.value) is error


def test_a_local_client_told_its_outcome_under_a_newer_schema_is_told_it_is_unreadable(tmp_path: Path) -> None:
    """A local client reads the outcome stream with its own schemas: an answer sealed for it under a
    schema a newer keyload wrote is UnreadableOutcome naming the command (it applied: upgrade, then
    submit again with the id), not a codec error that reads as if nothing had been sent."""
    root = tmp_path / "data"
    data = DataDir.create(root, 1)
    credential = system_credential(root, ADMIN_PRINCIPAL)
    failures: list[BaseException] = []
    with Client(root, reply_partition=0, timeout_s=30) as client:

        def enqueue() -> None:
            try:
                client.enqueue("shop", "orders", b"x", command_id="cmd-newer")
            except BaseException as exc:
                failures.append(exc)

        sending = threading.Thread(target=enqueue)
        sending.start()
        with data.command_log() as commands:
            wait_until(lambda: commands.end_offset(0) == 1, what="the command appended")
        newer_outcome = b"\xc3\x01" + bytes(range(8)) + b"\x12cmd-newer and fields of a newer schema"
        with data.outcome_log() as outcomes:
            outcomes.append(0, [signed(credential.key_id, credential.secret, newer_outcome)])
        sending.join(30)
    [failure] = failures
    assert isinstance(failure, UnreadableOutcome) and failure.command_id == "cmd-newer", failure
    assert "unknown writer schema" in str(failure)
