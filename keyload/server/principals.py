"""Issuing principals' credentials over HTTP (docs/ARCHITECTURE.md §10a).

A credential's key lives in the service's keyring, which only the service writes. So an
administrator's client of the server cannot make one itself, as a local operator's does: it asks
the server, which checks that the caller administers every domain (before it adds anything to the
keyring), makes the key, sends the PutPrincipal naming it to every partition under the request's
command id, and answers the credential. Its secret is kept nowhere but the keyring; its key is the
request's own (caller, principal, command id), so a request sent again with its Idempotency-Key after
a lost answer makes the same PutPrincipal and is answered the same credential.

    POST /v1/principals                           {"principal": NAME, "grants": [Grant, ...]}: create
    POST /v1/principals/{principal}/credential    a new key for an existing principal: rotate
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keyload.commands import BY_NAME, Capability
from keyload.credentials import Credential
from keyload.processors.access import EVERYTHING, allows, load_principal
from keyload.projections.store import Readable
from keyload.server import statuses
from keyload.server.app import Engine, Refused, answered, json_object, outcome_response, read_capped
from keyload.server.writer import Answer
from keyload.storage.principals import SYSTEM_PRINCIPALS, issued_credential
from keyload.wire import COMMAND_ID_HEADER, WireError, names, to_avro, to_json

PUT_PRINCIPAL = BY_NAME["PutPrincipal"]
CREATE_PATH = "/v1/principals"
ROTATE_PATH = "/v1/principals/{principal}/credential"
GRANTS = {"type": "array", "items": "keyload.Grant"}
NO_PRINCIPAL = ("NotFound", 404)
SERVICE_PRINCIPALS = frozenset(name for name, _ in SYSTEM_PRINCIPALS)  # the administrator and the service's actors
KAFKA_CREDENTIALS = (
    "a Kafka processor's server issues no credentials: every processor needs each key before a command "
    "names it, so add the key with `keyload keys add ID` on one processor's data directory, copy its "
    "keyring to every other processor, then `keyload principal create NAME --key-id ID`"
)


class CredentialIssuer:
    def __init__(self, engine: Engine, root: Path, policy: Readable) -> None:
        self.engine = engine
        self.root = root
        self.policy = policy  # partition 0's projection: who administers, a principal's revision
        self.commands = names("keyload.Command")
        self.outcomes = names("keyload.Outcome")

    async def create(self, request: Request) -> Response:
        async def answer(command_id: str) -> Response:
            _no_query(request)
            caller = self._administrator(request)
            fields = json_object(await read_capped(request))
            if set(fields) - {"principal", "grants"} or not isinstance(fields.get("principal"), str):
                raise WireError('the request body must be {"principal": NAME, "grants": [Grant, ...]}')
            grants = to_avro(self.commands, GRANTS, fields.get("grants", []), "grants")
            credential = await self._credential(caller, command_id, fields["principal"])
            return await self._issue(caller, command_id, credential, grants, expected_revision=0)

        return await answered(request, answer)

    async def rotate(self, request: Request) -> Response:
        async def answer(command_id: str) -> Response:
            _no_query(request)
            caller = self._administrator(request)
            if json_object(await read_capped(request)):  # nothing to say: a body that does is a mistake
                raise WireError("the request body must be empty or {}: a rotation takes no fields")
            principal = request.path_params["principal"]
            current = load_principal(self.policy, principal)
            if current is None:
                raise Refused(NO_PRINCIPAL, "principal does not exist")
            credential = await self._credential(caller, command_id, principal)
            # A repeat of a rotation that committed finds its key in force: it is sent as first sent
            # (at the revision before it), so the log answers it with the stored outcome.
            revision = current.revision - 1 if current.key_id == credential.key_id else current.revision
            return await self._issue(caller, command_id, credential, None, expected_revision=revision)

        return await answered(request, answer)

    def _administrator(self, request: Request) -> Credential:
        """The caller, when it holds admin on every domain (what PutPrincipal needs): checked before a
        key is added to the keyring, so nobody else can grow it."""
        caller = self.engine.caller(request, 0)
        record = load_principal(self.policy, caller.principal)
        if record is None or not allows(record.grants, Capability.admin, None, EVERYTHING):
            raise Refused(statuses.FORBIDDEN, "issuing credentials needs admin on every domain")
        return caller

    async def _credential(self, caller: Credential, command_id: str, principal: str) -> Credential:
        """The credential this request issues: its key is the request's (caller, principal, command
        id), so a request sent again by its Idempotency-Key issues the same one."""
        if principal in SERVICE_PRINCIPALS:
            raise Refused(statuses.FORBIDDEN, "the service's own principals keep the keys the service signs with")
        return await asyncio.to_thread(issued_credential, self.root, caller.principal, principal, command_id)

    async def _issue(
        self, caller: Credential, command_id: str, credential: Credential, grants: Any, *, expected_revision: int
    ) -> Response:
        body = {
            "principal": credential.principal,
            "key_id": credential.key_id,
            "enabled": None,
            "grants": grants,
            "expected_revision": expected_revision,
        }
        answer: Answer = await self.engine.submit_all(
            caller, command_id, self.engine.everywhere(), (PUT_PRINCIPAL.branch, body)
        )
        if answer.record["status"] != "committed":
            return outcome_response(self.outcomes, answer)
        (view,) = to_json(self.outcomes, self.outcomes.types["keyload.Outcome"], answer.record)["result"].values()
        issued = {
            "principal": view,
            "credential": {
                "principal": credential.principal,
                "key_id": credential.key_id,
                "secret": base64.b64encode(credential.secret).decode("ascii"),
            },
            "bearer_token": credential.bearer_token,
        }
        return JSONResponse(issued, headers={COMMAND_ID_HEADER: command_id})


def _no_query(request: Request) -> None:
    """Refuse a query parameter, as a table route refuses one its command lacks: `?partition=` picks
    none (the PutPrincipal goes to every partition), and nothing else is taken from the query."""
    given = next(iter(request.query_params), None)
    if given is not None:
        raise WireError(f"{given[:64]} is not a field of {PUT_PRINCIPAL.name}")


def credential_routes(engine: Engine, root: Path, policy: Readable) -> list[Route]:
    """The embedded service's: its keyring is the only one."""
    issuer = CredentialIssuer(engine, root, policy)
    return [
        Route(CREATE_PATH, issuer.create, methods=["POST"], name="create_principal"),
        Route(ROTATE_PATH, issuer.rotate, methods=["POST"], name="rotate_credential"),
    ]


def credentials_refused() -> list[Route]:
    """A Kafka processor's server: a key it made would be in its own keyring only, and every processor
    needs each key, so it refuses, naming the way that works, rather than answering "no route" for a
    route its OpenAPI lists. Nothing is appended."""

    async def refuse(request: Request) -> Response:
        async def answer(command_id: str) -> Response:
            raise Refused(statuses.NOT_SERVED_HERE, KAFKA_CREDENTIALS)

        return await answered(request, answer)

    return [
        Route(CREATE_PATH, refuse, methods=["POST"], name="create_principal"),
        Route(ROTATE_PATH, refuse, methods=["POST"], name="rotate_credential"),
    ]
