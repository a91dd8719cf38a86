"""The HTTP transport: a client of a keyload server sends each command to `POST /v1/commands` with
its credential as the bearer token and the command id as `Idempotency-Key`, and reads the outcome
from the response (docs/ARCHITECTURE.md §10a). The body travels in the API's JSON form
(keyload/wire.py), so the typed methods of `Client` work unchanged over either transport."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import ssl
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from keyload.bounded import remember
from keyload.commands import BY_BRANCH
from keyload.credentials import Credential, CredentialError
from keyload.errors import (
    CensusError,
    CommandTooLarge,
    InvalidCommand,
    KeyloadError,
    OutcomeTimeout,
    ServiceUnavailable,
    UnreadableOutcome,
    rejection,
)
from keyload.sdk.envelope import long_poll_s, mismatched_fields
from keyload.sdk.payloads import PayloadError, Progress
from keyload.sdk.results import Census, Outcome, PayloadReservation
from keyload.wire import (
    CENSUS_PATH,
    ENVELOPE_PATH,
    IDEMPOTENCY_HEADER,
    PARTITION_QUERY,
    SERVICE_PATH,
    UPLOAD_HANDLE_HEADER,
    field_schema,
    names,
    short_name,
    to_avro,
    to_json,
)

CONNECT_TIMEOUT_S = 10.0  # to open a connection to the server
# Connections open to the server at once; every one is kept alive. httpcore (1.0.9) closes an idle
# connection whenever the pool holds more than its keep-alive count, and a connection it has just
# handed to a thread still looks idle until that thread starts on it: with 64 threads (AsyncClient's
# default) a request then read a socket closed under it ("[Errno 9] Bad file descriptor", about one
# run in ten of 300 concurrent enqueues). Keeping as many alive as may be open takes that path away.
MAX_CONNECTIONS = 100
PRINCIPALS_PATH = "/v1/principals"
PAYLOAD_CONTENT_PATH = "/v1/domains/{domain}/reservations/{reservation_id}/content"
PAYLOAD_READ_PATH = "/v1/payloads/read"
UPLOAD_CHUNK_BYTES = 1024 * 1024
RESERVATION = "keyload.PayloadReservation"
MAX_UPLOAD_HANDLES = 1024  # reservations remembered for their uploads; the oldest go first
PRINCIPAL_VIEW = "keyload.result.PrincipalView"
OUTCOME_MEMBERS = frozenset({"command_id", "status"})  # what makes a JSON answer an outcome (§10a)


# TLS verification: on, off, the CA bundle to trust, or a client context of the caller's own.
Verify = bool | str | os.PathLike[str] | ssl.SSLContext


def _trusting(bundle: str | os.PathLike[str]) -> ssl.SSLContext:
    """The TLS of a client trusting the CA bundle at `bundle`, a client error when it does not load
    (not the next request's: nothing could be sent)."""
    try:
        return ssl.create_default_context(cafile=os.fspath(bundle))
    except (OSError, ValueError) as exc:  # ssl.SSLError included
        raise KeyloadError(f"verify={os.fspath(bundle)!r} is no CA bundle this client can load: {exc}") from None


class HttpTransport:
    """Sends commands to one keyload server over a kept-alive connection pool."""

    def __init__(self, url: str, credential: Credential, *, verify: Verify = True) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {credential.bearer_token}"},
            verify=verify if isinstance(verify, (bool, ssl.SSLContext)) else _trusting(verify),
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS),
        )
        self._commands = names("keyload.Command")
        # A newer server's outcomes may hold fields and enum symbols this SDK's schema lacks (wire.Names).
        self._outcomes = names("keyload.Outcome", reader=True)
        self._union = field_schema(self._commands, self._commands.types["keyload.Command"], "body")
        self._partitions: int | None = None
        # The upload handles the server answered reservations with, for their uploads (any server of
        # the keyring takes an upload by its handle; a Kafka processor's server needs it).
        self._upload_handles: OrderedDict[tuple[str, int], str] = OrderedDict()

    @property
    def partitions(self) -> int:
        """The server's partition count (asked once)."""
        if self._partitions is None:
            response = self._request("GET", SERVICE_PATH, timeout=CONNECT_TIMEOUT_S)
            answer = _json_answer(response)
            if answer.get("status") == "error":
                raise _http_error(response.status_code, answer, "service", CONNECT_TIMEOUT_S)
            if response.status_code != 200 or not isinstance(answer.get("partitions"), int):
                raise _foreign(response)
            self._partitions = answer["partitions"]
        return self._partitions

    def close(self) -> None:
        self._http.close()

    def _check_open(self) -> None:
        if self._http.is_closed:
            raise InvalidCommand("the client is closed; nothing was sent")

    def submit(self, domain: str, kind: str, body: dict[str, Any], command_id: str, timeout_s: float) -> Outcome:
        try:
            payload = {"domain": domain, "body": to_json(self._commands, self._union, (kind, body))}
            request = _json_body(payload, {IDEMPOTENCY_HEADER: command_id})  # a value JSON cannot hold fails here
        except (KeyError, TypeError, ValueError, StopIteration):
            envelope = {"command_id": command_id, "domain": domain, "principal": "", "body": (kind, body)}
            where = mismatched_fields({**envelope, "reply_to": None, "client_time_ms": None})
            raise InvalidCommand(f"{kind[:64]} does not match its schema{where}; nothing was sent") from None
        try:
            response = self._request(
                "POST",
                ENVELOPE_PATH,
                **request,
                timeout=timeout_s + long_poll_s(body),  # as a local client waits: the outcome within timeout_s
            )
        except httpx.TimeoutException:
            raise OutcomeTimeout(command_id, timeout_s, "; the server did not answer in time") from None
        outcome = self._outcome(response, BY_BRANCH[kind].result, command_id, timeout_s)
        handle = response.headers.get(UPLOAD_HANDLE_HEADER)
        if handle is not None and isinstance(outcome.result, PayloadReservation):
            # The oldest goes first when full: a reservation never uploaded to.
            remember(self._upload_handles, (domain, outcome.result.reservation_id), handle, MAX_UPLOAD_HANDLES)
        return outcome

    def _outcome(
        self, response: httpx.Response, result_record: str, command_id: str, timeout_s: float, payload: bool = False
    ) -> Outcome:
        """The outcome a response carries; the SDK's exception when it carries an error instead
        (`payload`: of a payload route), or UnreadableOutcome when this SDK cannot represent it (a
        newer server's value)."""
        answer = _json_answer(response)
        if answer.get("status") == "error":
            raise _http_error(response.status_code, answer, command_id, timeout_s, payload)
        if not answer.keys() >= OUTCOME_MEMBERS:  # JSON, but no keyload answer: a proxy's, say
            raise _foreign(response)
        result = answer.get("result")
        if result is not None:
            answer["result"] = {short_name(result_record): result}
        try:
            return Outcome.from_record(to_avro(self._outcomes, self._outcomes.types["keyload.Outcome"], answer, ""))
        except ValueError as exc:  # WireError, msgspec's ValidationError, an enum's: a value it does not know
            raise UnreadableOutcome(command_id, str(exc)[:256]) from None

    def issue_credential(
        self, principal: str, grants: list[dict[str, Any]] | None, command_id: str, timeout_s: float
    ) -> Credential:
        """A new credential from the server: for a new principal with `grants`, or (None) a rotation
        of an existing principal's (keyload/server/principals.py)."""
        headers = {IDEMPOTENCY_HEADER: command_id}
        if grants is None:
            path, request = f"{PRINCIPALS_PATH}/{principal}/credential", {"headers": headers}
        else:
            path, request = PRINCIPALS_PATH, _json_body({"principal": principal, "grants": grants}, headers)
        response = self._request("POST", path, **request, timeout=timeout_s)
        if response.status_code != 200:
            raise rejection(self._outcome(response, PRINCIPAL_VIEW, command_id, timeout_s))
        issued = response.json()["credential"]
        return Credential(issued["principal"], issued["key_id"], base64.b64decode(issued["secret"]))

    def upload_payload(
        self, domain: str, reservation_id: int, source: Path, progress: Progress | None, timeout_s: float
    ) -> Outcome:
        """Send a reservation's bytes to the server, which stores, attests and commits them: the
        CommitLargeSchedule's outcome (keyload/server/payloads.py). No time limit but the connect's
        and `timeout_s` for the answer once the bytes are sent."""
        path = PAYLOAD_CONTENT_PATH.format(domain=domain, reservation_id=reservation_id)
        headers = {"Content-Type": "application/octet-stream"}
        handle = self._upload_handles.get((domain, reservation_id))
        if handle is not None:
            headers[UPLOAD_HANDLE_HEADER] = handle
        response = self._request(
            "PUT",
            path,
            content=_chunks(source, progress),
            headers=headers,
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S, read=timeout_s),
        )
        outcome = self._outcome(response, RESERVATION, f"upload of reservation {reservation_id}", timeout_s, True)
        self._upload_handles.pop((domain, reservation_id), None)
        return outcome

    def read_payload(self, read_handle: str, sha256: bytes, into: Path, timeout_s: float) -> None:
        """Copy a large delivery's bytes into a file, checked against `sha256`, the delivery's (the
        server checks them too, before it sends any): on any failure the file is removed."""
        try:
            read = self._download(read_handle, into, timeout_s)
        except BaseException:
            into.unlink(missing_ok=True)
            raise
        if read != sha256:
            into.unlink(missing_ok=True)
            raise PayloadError("the bytes read do not match the delivery's SHA-256: read it again")

    def _download(self, read_handle: str, into: Path, timeout_s: float) -> bytes:
        """Stream what the read route answers into a file; the SHA-256 of what was written."""
        digest = hashlib.sha256()
        self._check_open()
        try:
            with self._http.stream(
                "POST", PAYLOAD_READ_PATH, **_json_body({"read_handle": read_handle}), timeout=timeout_s
            ) as response:
                if response.status_code != 200:
                    response.read()
                    raise _http_error(response.status_code, _json_answer(response), "read_payload", timeout_s, True)
                with into.open("wb") as out:
                    for chunk in response.iter_bytes():
                        digest.update(chunk)
                        out.write(chunk)
        except httpx.TimeoutException:
            raise OutcomeTimeout("read_payload", timeout_s, "; the server did not answer in time") from None
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return digest.digest()

    def census(self, partition: int | None) -> list[Census]:
        """The census of the partitions the server holds projections of, or of the one named
        (keyload/server/census.py). No time limit but the connect's: the server reads every row."""
        params = {} if partition is None else {PARTITION_QUERY: partition}
        response = self._request("GET", CENSUS_PATH, params=params)
        answer = _json_answer(response)
        if response.status_code == 404:  # no projection of it here (an older server: no such route)
            raise CensusError(str(answer.get("detail", "")))
        if response.status_code != 200:
            raise _http_error(response.status_code, answer, "census", 0)
        return [Census.from_json(found) for found in answer["partitions"]]

    def _unreachable(self, exc: httpx.HTTPError) -> KeyloadError:
        """What a request that reached no answer raises: ServiceUnavailable (resubmit by command id),
        but a certificate this client does not trust is no passing fault: resubmitting cannot help."""
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            return KeyloadError(
                f"the keyload server at {self._http.base_url} presented a certificate this client does not "
                f"trust ({cause.verify_message}): pass verify= the CA bundle that signed it; nothing was sent"
            )
        return ServiceUnavailable(f"the keyload server at {self._http.base_url} cannot be reached: {exc}")

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        self._check_open()
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None


def _json_body(payload: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """httpx's arguments for a JSON request body: UTF-8 as httpx writes it, but a string holding a lone
    surrogate (which UTF-8 cannot carry) is sent escaped, so that the server refuses it naming its
    field (400, docs/ARCHITECTURE.md §10a "JSON form") rather than httpx's encoding failing with an
    error outside the SDK's."""
    try:
        content = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except UnicodeEncodeError:
        content = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode("ascii")
    return {"content": content, "headers": {**(headers or {}), "Content-Type": "application/json"}}


def _chunks(source: Path, progress: Progress | None) -> Iterator[bytes]:
    total = source.stat().st_size
    sent = 0
    with source.open("rb") as file:
        while chunk := file.read(UPLOAD_CHUNK_BYTES):
            yield chunk
            sent += len(chunk)
            if progress is not None:
                progress(sent, total)


def _json_answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON object a keyload server answers with; an answer that is not one comes from something
    else on the way (a proxy's error page): `_foreign`."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        return answer
    raise _foreign(response)


def _foreign(response: httpx.Response) -> KeyloadError:
    """The error of an answer no keyload server gives: ServiceUnavailable for a 5xx, KeyloadError otherwise."""
    what = f"the server answered {response.status_code} with no keyload answer: {response.text[:128]!r}"
    return ServiceUnavailable(what) if response.status_code >= 500 else KeyloadError(what)


def _http_error(
    status: int, answer: dict[str, Any], command_id: str, timeout_s: float, payload: bool = False
) -> KeyloadError:
    """The SDK's exception for an error of the HTTP layer (`status` "error": the request has no outcome);
    `payload`: of a payload route, whose 404, 409 and 410 are about the payload."""
    detail = str(answer.get("detail", ""))
    if status == 401:
        return CredentialError(f"the server refused the credential: {detail}")
    if status == 413 and not payload:  # a command over the log's record limit, or a body over the server's
        return CommandTooLarge(_nothing_appended(detail))
    if status in (400, 413):
        return InvalidCommand(_nothing_appended(detail))
    if payload and status in (404, 409, 410):  # its reservation, bytes or handle (keyload/server/payloads.py)
        return PayloadError(detail)
    if status == 504:
        return OutcomeTimeout(command_id, timeout_s, f"; the server says: {detail}")
    if status == 503:
        return ServiceUnavailable(detail)
    return KeyloadError(f"the server answered {status}: {detail}")


def _nothing_appended(detail: str) -> str:
    """A refusal's detail saying that nothing was appended, once (the server's may say it already)."""
    return detail if detail.endswith("nothing was appended") else f"{detail}; nothing was appended"
