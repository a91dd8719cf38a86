"""The HTTP API: one route per row of the command table that declares one (keyload/commands.py),
every route funnelled into one path: authenticate, build the command, append it, await its outcome.

A request becomes a command this way (docs/ARCHITECTURE.md §10a):
- the route names the command kind; `{domain}` its domain, `{partition}` the partition of a
  partition-wide command; every other path segment, query parameter and member of the JSON body
  is a field of the command's body record (a field given twice is refused);
- a body whose record has a top-level `bytes` field `body` (Enqueue) may instead be sent raw with
  `Content-Type: application/octet-stream`, its other fields in the query string;
- `Idempotency-Key` is the command id (default: a new UUID); a repeat within the domain's outcome
  horizon returns the stored outcome, a receive's with its leases re-checked (a read's is answered
  afresh: it keeps none; processors/features.py, horizons.py, repeats.py);
- the response is the command's outcome as JSON, with the HTTP status of its error code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keyload.bodies import Branch
from keyload.commands import BY_BRANCH, COMMANDS, Capability, CommandKind
from keyload.credentials import Credential
from keyload.errors import CommandTooLarge, ErrorCode, InvalidCommand, KeyloadError
from keyload.limits import KEY_ID_PATTERN, KEY_ID_RULE, MAX_WAIT_MS
from keyload.log.base import LogError, partition_for
from keyload.log.codec import Record
from keyload.processors.access import EVERYTHING, allows, load_principal
from keyload.processors.principals import SERVICE_KEY_RULE, signs_for_the_partition
from keyload.projections.store import Readable, StoreError
from keyload.sdk.envelope import check_command_id, encode_command
from keyload.server import statuses
from keyload.server.auth import Authenticator, Unauthenticated
from keyload.server.coalescing import COALESCED_KINDS, Coalescing, UnknownOutcome
from keyload.server.held import HeldProjections
from keyload.server.metrics import ServerMetrics
from keyload.server.processing import Processing
from keyload.server.routing import IndexedApp, IndexedRouter
from keyload.server.writer import Answer, CommandWriter, Halted, OutcomeWaiters
from keyload.service.system_commands import domain_for_partition
from keyload.version import __version__
from keyload.wire import (
    COALESCE_HEADER,
    COMMAND_ID_HEADER,
    ENVELOPE_PATH,
    IDEMPOTENCY_HEADER,
    PARTITION_QUERY,
    SERVICE_PATH,
    UPLOAD_HANDLE_HEADER,
    Names,
    WireError,
    field_schema,
    from_text,
    names,
    short_name,
    to_avro,
    to_json,
)

MAX_REQUEST_BYTES = 8 * 1024 * 1024  # a JSON body: a command at the log's record limit, in base64, fits
OUTCOME_WAIT_S = 30.0  # how long a request waits for its outcome, beyond a long poll's wait_ms
SLASHED_FIELDS = frozenset({"message_id", "key"})  # path fields that may hold '/' (ids and document keys)
RAW_BODY_FIELD = "body"
RAW_BODY_TYPE = "application/octet-stream"
METRICS_PATH = "/metrics"
OPENAPI_PATH = "/v1/openapi.json"  # GET: the OpenAPI document, docs/openapi.json as checked in


log = logging.getLogger("keyload.server")


class Refused(Exception):
    """What the server does itself, outside a command, cannot be done: its error code and status."""

    def __init__(self, pair: tuple[str, int], detail: str) -> None:
        super().__init__(detail)
        self.pair = pair


@dataclass
class Engine:
    """What the API needs of the running service, and the one path every request's command takes."""

    partitions: int
    # The projection whose policy authenticates a request to partition P: the embedded service holds
    # every partition's; a Kafka service's projections come and go with its partitions, so there the
    # keyring alone authenticates at the edge and the processor's decision is the only policy check.
    policy: Callable[[int], Readable | None]
    authenticator: Authenticator
    waiters: OutcomeWaiters
    processing: Processing  # the processors beside: their offsets, halts and stalls
    metrics: ServerMetrics
    # The end of each partition's log when the server started: the backlog the processors replay
    # before the service is ready (`/readyz`); empty on Kafka, whose partitions come and go.
    backlog: Mapping[int, int]
    # Each partition's own projection, where this server can read it (a worker process's too; none on
    # Kafka): what a principal's key is checked against, since the partitions' signing keys differ.
    projections: HeldProjections
    writer: CommandWriter | None = None  # set when the event loop starts
    # Headers a kind's outcome is answered with, made from it and never stored: a reservation's
    # upload handle (keyload/server/payloads.py).
    outcome_headers: Mapping[str, Callable[[Answer], Mapping[str, str]]] = field(default_factory=dict)
    coalescing: Coalescing = field(init=False)  # Enqueues and acks that allow it, in batch commands

    def __post_init__(self) -> None:
        self.coalescing = Coalescing(self.submit, f"{OUTCOME_WAIT_S:g} s")

    async def submit_all(
        self, credential: Credential, command_id: str, targets: Sequence[tuple[str, int]], body: Branch
    ) -> Answer:
        """Submit the command to each (domain, partition) in turn under one command id (a principal
        command goes to every partition, 0 first): the first refusal, else the first target's answer.
        A key it cannot use is refused first (`refuse_unusable_key`): nothing is appended."""
        self.refuse_unusable_key(credential, body)
        answers = []
        for domain, partition in targets:
            answer = await self.submit(credential, command_id, domain, partition, body)
            if answer.record["status"] != "committed":
                return answer
            answers.append(answer)
        return answers[0]

    def refuse_unusable_key(self, credential: Credential, body: Branch) -> None:
        """A 400 for a command naming a key it cannot use, which nothing may append: a key the keyring
        lacks (CommandKind.keyring_fields), which would halt the partitions it reaches (processors/
        key_rotation.py, MissingKey) until the key is added; or a PutPrincipal of a key some partition
        signs tokens, jitter or proofs with, which that partition refuses after the ones before it
        applied it (the principal would be left on some partitions only, and a resend by command id
        gets the stored refusal again). Only a caller that may send the command is told: one that
        may not is left to the processor, which refuses it (PermissionDenied) before it looks at the
        key, so that nobody else learns which keys exist or serve."""
        kind = BY_BRANCH[body[0]]
        if not kind.keyring_fields or kind.capability is None:
            return
        # The keyring is read again when it has changed since: a key added meanwhile counts.
        missing = kind.keys_missing(body[1], self.authenticator.keys)
        serving = None if missing else self._partition_signing_with(kind, body[1])
        if not missing and serving is None:
            return
        policy = self.policy(0)  # a kind naming keys is partition-wide: every partition holds the same policy
        record = None if policy is None else load_principal(policy, credential.principal)
        if policy is not None and (record is None or not allows(record.grants, kind.capability, None, EVERYTHING)):
            return
        if missing:
            if not KEY_ID_PATTERN.fullmatch(body[1][missing[0]]):  # no key could have that id
                raise Refused(statuses.BAD_REQUEST, f"{missing[0]}: {KEY_ID_RULE}")
            raise Refused(
                statuses.BAD_REQUEST,
                f"{missing[0]} names no key of the service's keyring: add it first (keyload keys add)",
            )
        raise Refused(
            statuses.BAD_REQUEST,
            f"key_id: {SERVICE_KEY_RULE} (partition {serving}): rotate that partition's keys off it (keyload keys "
            "rotate) or name another key; nothing was appended",
        )

    def _partition_signing_with(self, kind: CommandKind, body: Record) -> int | None:
        """The first partition that signs with the key a principal command names to sign with
        (CommandKind.principal_key_field), read from each partition's own projection where this
        server can read it (not a Kafka server's: there the processors decide)."""
        key_id = None if kind.principal_key_field is None else body.get(kind.principal_key_field)
        if key_id is None:
            return None
        for partition in self.projections.partitions():
            with contextlib.suppress(StoreError), self.projections.read(partition) as projection:
                if projection is not None and signs_for_the_partition(projection, key_id):
                    return partition
        return None

    def response(self, kind: str, answer: Answer) -> JSONResponse:
        """The outcome of a command of `kind` as the API answers it, with the headers of its kind."""
        response = outcome_response(names("keyload.Outcome"), answer)
        headers = self.outcome_headers.get(kind)
        if headers is not None:
            response.headers.update(headers(answer))
        return response

    def everywhere(self) -> list[tuple[str, int]]:
        """(domain, partition) of every partition: where a principal command goes."""
        return [(domain_for_partition(p, self.partitions), p) for p in range(self.partitions)]

    def caller(self, request: Request, partition: int) -> Credential:
        """The credential the request is authenticated by, against `partition`'s policy. Two
        Authorization headers are refused, not one of them taken: a proxy before the server might
        read the other."""
        if given_twice(request, _AUTHORIZATION):
            raise Unauthenticated("the request carries Authorization more than once: send it once")
        return self.authenticator.credential(request.headers.get("authorization"), self.policy(partition))

    def key_in_force(self, principal: str, partition: int) -> tuple[str, bytes] | None:
        """The key id and secret `principal` signs with now, as `partition`'s policy has it (a worker
        process's partition: partition 0's, which holds every principal too, §5a); None where this
        server holds no policy (Kafka), cannot read it or the keyring now, or the keyring lacks the
        key. Read on the event loop, which the embedded service turns on its processors' thread."""
        try:
            policy = self.policy(partition)
            record = None if policy is None else load_principal(policy, principal)
            secret = None if record is None else self.authenticator.keys.get(record.key_id)
        except Exception:  # a store or keyring that cannot be read now: no answer but the sealed one
            return None
        return None if record is None or secret is None else (record.key_id, secret)

    async def submit(
        self, credential: Credential, command_id: str, domain: str, partition: int, body: Branch
    ) -> Answer:
        """Sign the command (branch, datum) for `credential`, append it, and await its outcome."""
        halt = self.processing.halt_of(partition)
        if halt is not None:
            raise Halted(f"partition {partition} is halted {halt}")
        envelope = {
            "command_id": command_id,
            "domain": domain,
            "principal": credential.principal,
            "body": body,
            "reply_to": self.waiters.reply_to(partition),
            "client_time_ms": None,
        }
        value = credential.sign(encode_command(envelope))
        assert self.writer is not None, "the server appends only once its event loop runs"
        # The processor refuses a wait_ms outside 0..MAX_WAIT_MS; meanwhile it is awaited as the nearest bound.
        wait_ms = min(max(body[1].get("wait_ms") or 0, 0), MAX_WAIT_MS)
        await self.waiters.turn(domain, command_id, credential, value)
        waiter = self.waiters.expect(domain, command_id, credential, value)
        started = time.perf_counter()
        try:
            if waiter.copy_of is None:
                try:
                    offset = await self.writer.append(partition, value)
                except Exception as exc:
                    self.waiters.not_appended(domain, command_id, waiter, exc)
                    raise
                self.waiters.appended(domain, command_id, waiter, (partition, offset))
            answer = await waiter.answer(OUTCOME_WAIT_S + wait_ms / 1000)
        finally:
            self.waiters.forget(domain, command_id, waiter)
        self.metrics.outcome_latency.labels(short_name(body[0])).observe(time.perf_counter() - started)
        return answer


class AnswerJSON(JSONResponse):
    """The JSON of an outcome or a refusal: the bytes Starlette's JSONResponse writes (compact, UTF-8,
    keys in order, tests/test_wire_forms.py compares them), written by msgspec in a tenth of the time
    (1.6 µs against 15 µs for a receive's outcome of one 1 KiB message)."""

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


def error_response(pair: tuple[str, int], detail: str, command_id: str | None = None) -> JSONResponse:
    code, status = pair
    body = {"status": "error", "error_code": code, "detail": detail, "command_id": command_id}
    headers = {COMMAND_ID_HEADER: command_id} if command_id else None
    return AnswerJSON(body, status_code=status, headers=headers)


def inspector_refusal(engine: Engine, request: Request, detail: str) -> Response | None:
    """The refusal (401, or 403 with `detail`) of a request for what names every domain's resources
    (metrics, the census), unless its caller may inspect every domain; None when it may. A Kafka
    server holds no policy (Engine.policy): there a credential the keyring accepts is enough. 503
    while partition 0's projection, which holds the policy, cannot be read (a full disk stalls it)."""
    try:
        caller = engine.caller(request, 0)
        policy = engine.policy(0)
        record = None if policy is None else load_principal(policy, caller.principal)
    except Unauthenticated as exc:
        return error_response(statuses.UNAUTHENTICATED, str(exc))
    except StoreError as exc:
        return error_response(statuses.UNAVAILABLE, f"the access policy cannot be read now: {exc}")
    if policy is not None and (record is None or not allows(record.grants, Capability.inspect, None, EVERYTHING)):
        return error_response(statuses.FORBIDDEN, detail)
    return None


def outcome_response(names_: Names, answer: Answer) -> JSONResponse:
    """The outcome as JSON (the result unwrapped from its union), with its error code's status."""
    record = answer.record
    body = to_json(names_, names_.types["keyload.Outcome"], record)
    if body["result"] is not None:
        (body["result"],) = body["result"].values()
    code = record["error_code"]
    status = 200 if code is None else statuses.HTTP_STATUS[ErrorCode(code)]
    return AnswerJSON(body, status_code=status, headers={COMMAND_ID_HEADER: record["command_id"]})


class CommandRoute:
    """The endpoint of one command kind."""

    def __init__(self, engine: Engine, kind: CommandKind) -> None:
        assert kind.route is not None
        self.engine = engine
        self.kind = kind
        self.commands = names("keyload.Command")
        self.record = self.commands.types[kind.branch]
        self.method = kind.route.method
        self.path_fields = kind.route.fields
        self.everywhere = (
            kind.partition_wide and "partition" not in self.path_fields and "domain" not in self.path_fields
        )
        # `?partition=` picks the one partition a read of an everywhere kind asks (InspectPrincipal); a
        # write of one goes to every partition, so there it is a field the command does not have (400).
        self.partition_queried = self.everywhere and self.method == "GET"
        self.raw_body = any(f["name"] == RAW_BODY_FIELD and f["type"] == "bytes" for f in self.record["fields"])

    async def respond(self, request: Request) -> Response:
        async def answer(command_id: str) -> Response:
            targets = self._targets(request)
            credential = self.engine.caller(request, targets[0][1])  # first: the caller learns nothing before it
            coalesced = self._coalesced(request)
            setattr(request.state, COALESCED_STATE, coalesced)
            body, raw = await self._body(request)
            datum = to_avro(self.commands, self.record, self.kind.filled(body, command_id), "")
            if raw is not None:
                datum[RAW_BODY_FIELD] = raw
            if coalesced:
                ((domain, partition),) = targets
                outcome = await self.engine.coalescing.submit(
                    self.kind.name, credential, command_id, domain, partition, datum
                )
            else:
                outcome = await self.engine.submit_all(credential, command_id, targets, (self.kind.branch, datum))
            return self.engine.response(self.kind.name, outcome)

        return await answered(request, answer)

    def _coalesced(self, request: Request) -> bool:
        """Whether the request asks to go in one command with others (`Keyload-Coalesce: true`): only
        an Enqueue's, an Ack's or a GroupAck's may, and only without a command id of its own
        (keyload/server/coalescing.py)."""
        given = request.headers.get(COALESCE_HEADER)
        if given is None:
            return False
        if given not in ("true", "false"):
            raise WireError(f"{COALESCE_HEADER} must be true or false")
        if given == "false":
            return False
        if self.kind.name not in COALESCED_KINDS:
            raise WireError(f"{COALESCE_HEADER} is for enqueueing one message or acking one lease of a queue or group")
        if IDEMPOTENCY_HEADER in request.headers:
            raise WireError(
                f"{COALESCE_HEADER} and {IDEMPOTENCY_HEADER} together: a coalesced request's outcome is the "
                "command's that carried it, so it has no command id of its own to send again"
            )
        return True

    async def _body(self, request: Request) -> tuple[dict[str, Any], bytes | None]:
        """The command body's fields (JSON form) from the JSON body, the query and the path; and the
        raw body when it stands for the `body` field."""
        body = await read_capped(request)
        raw: bytes | None = None
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if self.raw_body and content_type == RAW_BODY_TYPE:
            fields: dict[str, Any] = {RAW_BODY_FIELD: ""}  # a placeholder: the raw bytes replace it at the end
            raw = body
        else:
            try:
                fields = json_object(body)
            except WireError as exc:
                if not self.raw_body:
                    raise
                # Most likely raw bytes sent without the type (curl's --data-binary sends them as a form).
                raise WireError(f"{exc} (raw bytes as the body need Content-Type: {RAW_BODY_TYPE})") from None
        given = set(fields)  # each field once, from one place: a repeat is refused, never overridden
        queried = request.query_params.multi_items() if request.scope["query_string"] else ()  # parsed only if given
        for name, text in queried:
            _give(given, name)
            if name != PARTITION_QUERY or not self.partition_queried:  # there it routes: no field of the command
                fields[name] = self._text(name, text)
        for name, text in request.path_params.items():
            _give(given, name)
            if name not in ("domain", "partition"):
                fields[name] = self._text(name, text)
        return fields, raw

    def _text(self, name: str, text: str) -> Any:
        try:
            schema = field_schema(self.commands, self.record, name)
        except KeyError:
            raise WireError(f"{name[:64]} is not a field of {self.kind.name}") from None
        return from_text(self.commands, schema, text, name)

    def _targets(self, request: Request) -> list[tuple[str, int]]:
        """(domain, partition) of each command the request sends."""
        params = request.path_params
        partitions = self.engine.partitions
        if "domain" in params:
            domain = params["domain"]
            return [(domain, partition_for(domain, partitions))]
        if "partition" in params or not self.everywhere or self.partition_queried:
            # Given twice it is refused here, before the credential it picks the policy of.
            given = [params["partition"]] if "partition" in params else []
            if request.scope["query_string"]:
                given += request.query_params.getlist(PARTITION_QUERY)
            if len(given) > 1:
                raise WireError(f"{PARTITION_QUERY} is given twice (path, query or body)")
            partition = partition_number(given[0] if given else "0", partitions)
            return [(domain_for_partition(partition, partitions), partition)]
        return self.engine.everywhere()


class _TooLarge(Exception):
    pass


async def answered(request: Request, answer: Callable[[str], Awaitable[Response]]) -> Response:
    """The response to a request whose command `answer` submits under the request's command id: the
    response `answer` makes of its outcome, or the error of the HTTP layer that kept it from having one."""
    response = await _answer(request, answer)
    engine: Engine = request.app.state.engine
    engine.metrics.requests.labels(request.method, str(response.status_code)).inc()
    return response


_AUTHORIZATION = (b"authorization",)
COALESCED_STATE = "coalesced"  # set on a request's state once it is known to go in a batch command
# The request headers a command request takes at most once (the names as ASGI gives them: lower case).
_ONCE = tuple(name.lower().encode() for name in (IDEMPOTENCY_HEADER, COALESCE_HEADER, UPLOAD_HANDLE_HEADER))


def given_twice(request: Request, names: tuple[bytes, ...]) -> str | None:
    """The first of `names` the request carries more than once, or None."""
    seen: set[bytes] = set()
    name: bytes
    for name, _ in request.scope["headers"]:
        if name in names:
            if name in seen:
                return name.decode()
            seen.add(name)
    return None


async def _answer(request: Request, answer: Callable[[str], Awaitable[Response]]) -> Response:
    given = request.headers.get(IDEMPOTENCY_HEADER)  # present but empty is refused, not replaced
    command_id = str(uuid.uuid4()) if given is None else given
    try:
        twice = given_twice(request, _ONCE)
        if twice is not None:
            raise WireError(f"the request carries {twice} more than once: send it once")
        check_command_id(command_id)
        return await answer(command_id)
    except Unauthenticated as exc:
        return error_response(statuses.UNAUTHENTICATED, str(exc))
    except Refused as exc:  # the server's own refusal, before any append: no outcome, no command id
        return error_response(exc.pair, str(exc))
    except CommandTooLarge as exc:
        return error_response(statuses.TOO_LARGE, str(exc))
    except InvalidCommand as exc:
        return error_response(statuses.BAD_REQUEST, str(exc))
    except _TooLarge:
        return error_response(statuses.TOO_LARGE, f"the request body is over {MAX_REQUEST_BYTES} bytes")
    except Halted as exc:
        return error_response(statuses.UNAVAILABLE, str(exc), _own(request, command_id))
    except UnknownOutcome as exc:  # a coalesced request's carrier: the request's own id was never appended
        return error_response(statuses.TIMEOUT, str(exc))
    except TimeoutError:
        detail = (
            f"no outcome within {OUTCOME_WAIT_S:g} s; the command may still apply: "
            "send it again with the same Idempotency-Key to learn its outcome"
        )
        return error_response(statuses.TIMEOUT, detail, command_id)
    except (OSError, LogError) as exc:  # the append failed (a full disk): nothing of it applies
        return error_response(
            statuses.UNAVAILABLE, f"the command could not be appended: {exc}", _own(request, command_id)
        )
    except StoreError as exc:  # the partition's projection cannot be read (a full disk stalls it)
        return error_response(
            statuses.UNAVAILABLE, f"the partition cannot serve this now: {exc}", _own(request, command_id)
        )
    except KeyloadError as exc:  # a request the server cannot act on as given (a bad principal name)
        return error_response(statuses.BAD_REQUEST, str(exc))
    except ClientDisconnect:  # the client went away mid-body: nobody reads the answer, nothing to log
        return error_response(statuses.BAD_REQUEST, "the client went away before sending the whole request")
    except Exception:  # a bug: the request fails alone, in the API's own form
        log.exception("%s %s failed", request.method, request.url.path[:256])
        detail = "the server failed to answer this request (see its log)"
        return error_response(statuses.INTERNAL, detail, _own(request, command_id))


def _own(request: Request, command_id: str) -> str | None:
    """The command id an error answer names: none for a coalesced request, whose own id was never
    appended (its carrier's failure is not something a resend by that id could learn); a coalesced ack
    refused in its batch goes again alone under its own id, and a timeout of that names it."""
    return None if getattr(request.state, COALESCED_STATE, False) else command_id


class EnvelopeRoute:
    """`POST /v1/commands`: any command as the log takes it, `{"domain": D, "body": {"Kind": {...}}}`,
    sent to its domain's partition as is (no fan-out). The SDK's HTTP transport speaks this."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.commands = names("keyload.Command")
        self.union = field_schema(self.commands, self.commands.types["keyload.Command"], "body")

    async def respond(self, request: Request) -> Response:
        async def answer(command_id: str) -> Response:
            envelope = json_object(await read_capped(request))
            if set(envelope) != {"domain", "body"}:
                raise WireError('the request body must be {"domain": DOMAIN, "body": {"Kind": {...}}}')
            domain = envelope["domain"]
            if not isinstance(domain, str):
                raise WireError("domain must be a string")
            partition = partition_for(domain, self.engine.partitions)
            credential = self.engine.caller(request, partition)
            body = to_avro(self.commands, self.union, envelope["body"], "body")
            self.engine.refuse_unusable_key(credential, body)
            outcome = await self.engine.submit(credential, command_id, domain, partition, body)
            return self.engine.response(BY_BRANCH[body[0]].name, outcome)

        return await answered(request, answer)


def _give(given: set[str], name: str) -> None:
    """Note a request field as given; WireError if it already was (in the path, query or body)."""
    if name in given:
        raise WireError(f"{name} is given twice (path, query or body)")
    given.add(name)


# A JSON escape of a UTF-16 surrogate: a pair makes one character, a lone one no text at all (it
# cannot be UTF-8, so no name, id or body can hold it).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that is a JSON object (an empty body is an empty object) of Unicode text;
    WireError otherwise."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw, object_pairs_hook=_members)
    except WireError:
        raise
    except (ValueError, UnicodeDecodeError):
        raise WireError("the request body is not JSON") from None
    except RecursionError:
        raise WireError("the request body nests JSON too deeply") from None
    if not isinstance(value, dict):
        raise WireError("the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        where = next(_not_text(value), None)
        if where is not None:
            raise WireError(f"{where} is not Unicode text: it holds a lone surrogate (\\ud800-\\udfff)")
    return value


def _members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members; a member given twice is refused, as a field given twice in the path
    and the query is (a parser would keep one of them, and not every parser the same one)."""
    members = dict(pairs)
    if len(members) != len(pairs):
        names = [name for name, _ in pairs]
        twice = next(name for name in names if names.count(name) > 1)
        raise WireError(f"{twice[:64]} is given twice in a JSON object")
    return members


def _not_text(value: dict[str, Any]) -> Iterator[str]:
    """The path of each string (or member name) in `value` that UTF-8 cannot encode."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    yield path or "a value"
        elif isinstance(item, dict):
            for name, member in item.items():
                pending.append((f"{path}.{name}" if path else name, member))
                pending.append((path or "a member name", name))
        elif isinstance(item, list):
            pending.extend((f"{path}[{index}]", member) for index, member in enumerate(item))


MAX_NUMBER_DIGITS = 20  # a u64 has at most 20 decimal digits; longer text is no number a route takes


def is_number(text: str) -> bool:
    """Whether `text` is a decimal integer of at most MAX_NUMBER_DIGITS ASCII digits (str.isdigit
    takes '²' too, and int() refuses text of thousands of digits with a ValueError)."""
    return text.isascii() and text.isdigit() and len(text) <= MAX_NUMBER_DIGITS


def partition_number(text: str, partitions: int) -> int:
    """A partition named in a path or query, spelled as the API spells any integer there (ASCII digits
    with an optional '-': '-0' and '00' are 0), and one the data directory has."""
    if not is_number(text.removeprefix("-")) or not 0 <= int(text) < partitions:
        raise WireError(f"partition must be 0..{partitions - 1}")
    return int(text)


async def read_capped(request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and is_number(length) and int(length) > MAX_REQUEST_BYTES:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class _RestOfPath(PathConvertor):
    """Starlette's `path` convertor across line breaks too (its `.*` stops at one): a message id or
    document key holding one is refused by its rule (400), not taken for a route that does not exist."""

    regex = "(?s:.*)"


register_url_convertor("rest", _RestOfPath())


def starlette_path(kind: CommandKind) -> str:
    """The route's path for Starlette: fields that may hold '/' take the rest of their place."""
    assert kind.route is not None
    path = kind.route.path
    for name in SLASHED_FIELDS:
        path = path.replace(f"{{{name}}}", f"{{{name}:rest}}")
    return path


def command_routes(engine: Engine) -> list[Route]:
    routes = [
        Route(starlette_path(kind), CommandRoute(engine, kind).respond, methods=[kind.route.method], name=kind.name)
        for kind in COMMANDS
        if kind.route is not None
    ]
    return [*routes, Route(ENVELOPE_PATH, EnvelopeRoute(engine).respond, methods=["POST"], name="commands")]


def application(
    engine: Engine,
    on_start: Callable[[asyncio.AbstractEventLoop], Awaitable[None]],
    on_stop: Callable[[], Awaitable[None]],
    openapi: Mapping[str, Any],
    more_routes: Sequence[Route] = (),
) -> Starlette:
    """The API: the command routes, `more_routes` (what the server does outside commands), health,
    the service's description and its OpenAPI document."""

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_: Request) -> Response:
        """Ready once every partition has applied the backlog it had at start, or is halted or stalled
        (such a partition stops alone: the others serve); all three are listed."""
        processing = engine.processing
        halted = {str(p): reason for p in range(engine.partitions) if (reason := processing.halt_of(p)) is not None}
        stalled = {str(p): reason for p in range(engine.partitions) if (reason := processing.stall_of(p)) is not None}
        catching_up = {
            str(p): f"applied through {applied} of {engine.backlog[p] - 1}"
            for p, applied in processing.applied_offsets().items()
            if str(p) not in halted and str(p) not in stalled and applied < engine.backlog.get(p, 0) - 1
        }
        body = {
            "status": "unavailable" if catching_up else "ready",
            "catching_up": catching_up,
            "halted": halted,
            "stalled": stalled,
        }
        return JSONResponse(body, status_code=503 if catching_up else 200)

    async def service(_: Request) -> Response:
        return JSONResponse({"version": __version__, "partitions": engine.partitions})

    async def openapi_document(_: Request) -> Response:
        return JSONResponse(openapi)

    async def metrics(request: Request) -> Response:
        """Prometheus metrics, for a principal that may inspect every domain (they name every queue)."""
        refused = inspector_refusal(engine, request, "metrics need inspect on every domain")
        if refused is not None:
            return refused
        text = await asyncio.to_thread(generate_latest, engine.metrics.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(statuses.NO_ROUTE, f"no route {request.url.path[:256]}")

    async def wrong_method(request: Request, exc: Exception) -> Response:
        return error_response(statuses.WRONG_METHOD, f"{request.method} is not a method of {request.url.path[:256]}")

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await on_start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await on_stop()

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route(OPENAPI_PATH, openapi_document, methods=["GET"]),
        Route(SERVICE_PATH, service, methods=["GET"]),
        Route(METRICS_PATH, metrics, methods=["GET"]),
        *command_routes(engine),
        *more_routes,
    ]
    # A path with a trailing slash is no route (404 with its JSON body), not a redirect without one:
    # a client that does not follow redirects would see an empty 307 to a POST.
    router = IndexedRouter(routes, lifespan=lifespan, redirect_slashes=False)
    app = IndexedApp(router, exception_handlers={404: not_found, 405: wrong_method})
    app.state.engine = engine
    return app
