"""Large payloads over HTTP: the service uploads, attests and reads payload objects itself, so no
client holds the keys that sign upload handles, commit proofs or read handles (DESIGN.md §8, §9).

    POST /v1/domains/{domain}/queues/{queue}/reservations    PrepareLargeSchedule (a table route): reserve
    PUT  /v1/domains/{domain}/reservations/{reservation_id}/content    the bytes, raw: upload, attest, commit
    POST /v1/payloads/read    {"read_handle": H}: a large delivery's bytes, raw

The upload streams the request body into the service's scratch folder, checks its length and
SHA-256 against the reservation, stores it in the object store under the reservation's key (an
immutable conditional put: the same bytes again are idempotent), reads it back, signs the
PayloadCommitProof with the reservation's trust-set key, and appends CommitLargeSchedule signed
with the caller's credential: the answer is that command's outcome (the committed reservation). It
is idempotent by reservation: an upload to a reservation already committed with the same object
answers the committed reservation again (each attempt's commit has a command id of its own, since
its proof's attestation time differs). The caller must hold `enqueue` on the reservation's queue,
checked before any byte is stored (the processor checks it again on the commit).

A read handle (a large delivery's `payload.read_handle`) is verified by the service and read
while its lease lasts, for a caller authenticated against the handle's domain.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from keyload.commands import BY_NAME, Capability
from keyload.log.base import partition_for
from keyload.processors.access import allows, load_principal
from keyload.processors.payloads.handles import HandleError, ReadHandle, open_handle
from keyload.projections import keys
from keyload.projections.records import PayloadReservation, ReservationState, load
from keyload.projections.store import Staged, Store
from keyload.sdk.payloads import PayloadConflict, PayloadError, PayloadGateway
from keyload.server import statuses
from keyload.server.app import Engine, Refused, answered, is_number, json_object, outcome_response, read_capped
from keyload.storage.datadir import DataDir
from keyload.storage.keyring import LiveKeyring
from keyload.storage.object_store import ObjectStore, ObjectStoreError
from keyload.wire import WireError, names

COMMIT = BY_NAME["CommitLargeSchedule"]
UPLOAD_PATH = "/v1/domains/{domain}/reservations/{reservation_id}/content"
READ_PATH = "/v1/payloads/read"
SCRATCH = ("scratch", "payloads")  # under the data directory: where uploads are staged and reads copied
NO_RESERVATION = ("NotFound", 404)
WRONG_BYTES = ("Conflict", 409)  # the bytes are not the reserved ones, or the key holds others
STORE_UNAVAILABLE = ("Unavailable", 503)  # the object store failed: retry the upload


class PayloadRoutes:
    def __init__(self, engine: Engine, data: DataDir, keyring: LiveKeyring, stores: Sequence[Store]) -> None:
        self.engine = engine
        self.stores = stores
        self.data = data
        self.keyring = keyring
        self.scratch = data.root.joinpath(*SCRATCH)
        self._objects: ObjectStore | None = None
        self.outcomes = names("keyload.Outcome")

    def gateway(self) -> PayloadGateway:
        """Over the data directory's object store, opened once (S3: two requests) at first use."""
        if self._objects is None:
            self._objects = self.data.object_store()
        return PayloadGateway(self._objects, self.keyring)

    async def upload(self, request: Request) -> Response:
        async def answer(_: str) -> Response:
            domain = request.path_params["domain"]
            reservation_id = _reservation_id(request.path_params["reservation_id"])
            partition = partition_for(domain, self.engine.partitions)
            caller = self.engine.caller(request, partition)
            reservation = self._reservation(partition, domain, reservation_id)
            self._require(caller.principal, partition, Capability.enqueue, domain, reservation.queue)
            proof = await self._store(request, reservation, partition)
            commit = {"reservation_id": reservation_id, "proof": proof}
            command_id = f"upload-{uuid.uuid4()}"  # a proof differs per attempt: idempotent by reservation
            committed = await self.engine.submit(caller, command_id, domain, partition, (COMMIT.branch, commit))
            return outcome_response(self.outcomes, committed)

        return await answered(request, answer)

    async def read(self, request: Request) -> Response:
        async def answer(_: str) -> Response:
            handle_text = _read_handle(await read_capped(request))
            try:
                handle = open_handle(self.keyring, handle_text, ReadHandle)
            except HandleError as exc:
                raise WireError(str(exc)) from None
            self.engine.caller(request, partition_for(handle.domain, self.engine.partitions))
            self.scratch.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.scratch, prefix="read-")
            os.close(fd)
            target = Path(name)
            try:
                await asyncio.to_thread(self.gateway().read, handle_text, target)
            except PayloadError as exc:
                target.unlink(missing_ok=True)
                raise Refused(statuses.GONE, str(exc)) from None
            cleanup = BackgroundTask(target.unlink, missing_ok=True)
            return FileResponse(target, media_type="application/octet-stream", background=cleanup)

        return await answered(request, answer)

    def _reservation(self, partition: int, domain: str, reservation_id: int) -> PayloadReservation:
        reservation = load(Staged(self.stores[partition]), keys.reservation(reservation_id), PayloadReservation)
        if reservation is None or reservation.domain != domain:
            raise Refused(NO_RESERVATION, "reservation does not exist")
        return reservation

    def _require(self, principal: str, partition: int, capability: Capability, domain: str, queue: str) -> None:
        record = load_principal(self.stores[partition], principal)
        if record is None or not allows(record.grants, capability, domain, queue):
            raise Refused(statuses.FORBIDDEN, f"the principal holds no {capability.value} grant on this resource")

    async def _store(self, request: Request, reservation: PayloadReservation, partition: int) -> dict[str, Any]:
        """Stage the request body, check it is the reserved bytes, store and attest it: the proof."""
        if reservation.state not in (ReservationState.reserved, ReservationState.committed):
            raise Refused(NO_RESERVATION, f"the reservation is {reservation.state.value}")
        self.scratch.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.scratch, prefix="upload-")
        staged = Path(name)
        try:
            digest, length = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in request.stream():
                    length += len(chunk)
                    if length > reservation.length:
                        raise Refused(WRONG_BYTES, "the bytes are not the reserved ones (longer than reserved)")
                    digest.update(chunk)
                    out.write(chunk)
            if (length, digest.digest()) != (reservation.length, reservation.sha256):
                raise Refused(WRONG_BYTES, "the bytes are not the reserved ones (length or SHA-256 differ)")
            gateway = self.gateway()
            handle = gateway.upload_handle(reservation, partition)
            try:
                await asyncio.to_thread(gateway.upload, handle, staged)
                proof: dict[str, Any] = await asyncio.to_thread(gateway.attest, handle)
            except PayloadConflict as exc:
                raise Refused(WRONG_BYTES, str(exc)) from None
            except PayloadError as exc:
                raise Refused(statuses.GONE, str(exc)) from None
            except ObjectStoreError as exc:
                raise Refused(STORE_UNAVAILABLE, f"the object store failed: {exc}") from None
            return proof
        finally:
            staged.unlink(missing_ok=True)


def _reservation_id(text: str) -> int:
    if not is_number(text):
        raise WireError("reservation_id must be an integer")
    return int(text)


def _read_handle(raw: bytes) -> str:
    value = json_object(raw)
    if set(value) != {"read_handle"} or not isinstance(value["read_handle"], str):
        raise WireError('the request body must be {"read_handle": HANDLE}')
    return value["read_handle"]


def payload_routes(engine: Engine, data: DataDir, keyring: LiveKeyring, stores: Sequence[Store]) -> list[Route]:
    """The embedded service's: they read reservations from the projections it holds."""
    routes = PayloadRoutes(engine, data, keyring, stores)
    return [
        Route(UPLOAD_PATH, routes.upload, methods=["PUT"], name="upload_payload"),
        Route(READ_PATH, routes.read, methods=["POST"], name="read_payload"),
    ]
