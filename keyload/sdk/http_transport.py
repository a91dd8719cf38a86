"""The HTTP transport: a client of a keyload server sends each command to `POST /v1/commands` with
its credential as the bearer token and the command id as `Idempotency-Key`, and reads the outcome
from the response (docs/ARCHITECTURE.md §10a). The body travels in the API's JSON form
(keyload/wire.py), so the typed methods of `Client` work unchanged over either transport."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from keyload.commands import BY_BRANCH
from keyload.credentials import Credential, CredentialError
from keyload.errors import InvalidCommand, KeyloadError, OutcomeTimeout, ServiceUnavailable, rejection
from keyload.sdk.results import Outcome
from keyload.wire import (
    ENVELOPE_PATH,
    IDEMPOTENCY_HEADER,
    SERVICE_PATH,
    field_schema,
    names,
    short_name,
    to_avro,
    to_json,
)

CONNECT_TIMEOUT_S = 10.0  # to open a connection to the server
PRINCIPALS_PATH = "/v1/principals"
PRINCIPAL_VIEW = "keyload.result.PrincipalView"


class HttpTransport:
    """Sends commands to one keyload server over a kept-alive connection pool."""

    def __init__(self, url: str, credential: Credential, *, verify: bool | str = True) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {credential.bearer_token}"},
            verify=verify,
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
        )
        self._commands = names("keyload.Command")
        self._outcomes = names("keyload.Outcome")
        self._union = field_schema(self._commands, self._commands.types["keyload.Command"], "body")
        self._partitions: int | None = None

    @property
    def partitions(self) -> int:
        """The server's partition count (asked once)."""
        if self._partitions is None:
            response = self._request("GET", SERVICE_PATH, timeout=CONNECT_TIMEOUT_S)
            self._partitions = int(response.json()["partitions"])
        return self._partitions

    def close(self) -> None:
        self._http.close()

    def submit(self, domain: str, kind: str, body: dict[str, Any], command_id: str, timeout_s: float) -> Outcome:
        try:
            payload = {"domain": domain, "body": to_json(self._commands, self._union, (kind, body))}
        except (KeyError, TypeError, ValueError, StopIteration):
            raise InvalidCommand(f"{kind[:64]} does not match its schema; nothing was sent") from None
        wait_s = (body.get("wait_ms") or 0) / 1000
        try:
            response = self._request(
                "POST",
                ENVELOPE_PATH,
                json=payload,
                headers={IDEMPOTENCY_HEADER: command_id},
                timeout=timeout_s + wait_s,  # as a local client waits: the outcome within timeout_s (after the poll)
            )
        except httpx.TimeoutException:
            raise OutcomeTimeout(command_id, timeout_s, "; the server did not answer in time") from None
        return self._outcome(response, BY_BRANCH[kind].result, command_id, timeout_s)

    def _outcome(self, response: httpx.Response, result_record: str, command_id: str, timeout_s: float) -> Outcome:
        """The outcome a response carries; the SDK's exception when it carries an error instead."""
        answer = response.json()
        if answer.get("status") == "error":
            raise _http_error(response.status_code, answer, command_id, timeout_s)
        result = answer["result"]
        if result is not None:
            answer["result"] = {short_name(result_record): result}
        return Outcome.from_record(to_avro(self._outcomes, self._outcomes.types["keyload.Outcome"], answer, ""))

    def issue_credential(
        self, principal: str, grants: list[dict[str, Any]] | None, command_id: str, timeout_s: float
    ) -> Credential:
        """A new credential from the server: for a new principal with `grants`, or (None) a rotation
        of an existing principal's (keyload/server/principals.py)."""
        if grants is None:
            path, payload = f"{PRINCIPALS_PATH}/{principal}/credential", None
        else:
            path, payload = PRINCIPALS_PATH, {"principal": principal, "grants": grants}
        response = self._request(
            "POST", path, json=payload, headers={IDEMPOTENCY_HEADER: command_id}, timeout=timeout_s
        )
        if response.status_code != 200:
            raise rejection(self._outcome(response, PRINCIPAL_VIEW, command_id, timeout_s))
        issued = response.json()["credential"]
        return Credential(issued["principal"], issued["key_id"], base64.b64decode(issued["secret"]))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"the keyload server at {self._http.base_url} cannot be reached: {exc}") from None


def _http_error(status: int, answer: dict[str, Any], command_id: str, timeout_s: float) -> KeyloadError:
    """The SDK's exception for an error of the HTTP layer (`status` "error": the request has no outcome)."""
    detail = str(answer.get("detail", ""))
    if status == 401:
        return CredentialError(f"the server refused the credential: {detail}")
    if status in (400, 413):
        return InvalidCommand(f"{detail}; nothing was appended")
    if status == 504:
        return OutcomeTimeout(command_id, timeout_s, f"; the server says: {detail}")
    if status == 503:
        return ServiceUnavailable(detail)
    return KeyloadError(f"the server answered {status}: {detail}")
