"""Large payloads over HTTP: the service uploads, attests and reads payload objects itself, so no
client holds the keys that sign upload handles, commit proofs or read handles (DESIGN.md §8, §9).

    POST /v1/domains/{domain}/queues/{queue}/reservations    PrepareLargeSchedule (a table route): reserve
    PUT  /v1/domains/{domain}/reservations/{reservation_id}/content    the bytes, raw: upload, attest, commit
    POST /v1/payloads/read    {"read_handle": H}: a large delivery's bytes, raw

A committed reservation is answered with its upload handle in the `Keyload-Upload-Handle` header
(`UploadHandles`, on the table route and on `POST /v1/commands` alike): signed by the service, it
binds the reservation, its object key, length, SHA-256 and upload deadline, and it is never stored.
The upload takes it back in the same header, so any server of the data directory's keyring can take
the bytes without the reservation's projection: a Kafka processor's server, which holds none, needs
it. The embedded service reads the reservation from its projection besides (and takes an upload
without the header): it refuses the upload of a reservation that is cancelled or expired, or of a
caller without `enqueue` on the reservation's queue, before any byte is stored. On Kafka those come
out at the commit instead (the processor checks both); bytes stored meanwhile are the reserved ones
exactly, under the reservation's own key, and retention deletes them after the upload deadline.

The upload streams the request body into the service's scratch folder, checks its length and
SHA-256 against the handle, stores it in the object store under the reservation's key (an
immutable conditional put: the same bytes again are idempotent), reads it back, signs the
PayloadCommitProof with the reservation's trust-set key, and appends CommitLargeSchedule signed
with the caller's credential: the answer is that command's outcome (the committed reservation). It
is idempotent by reservation: an upload to a reservation already committed with the same object
answers the committed reservation again (each attempt's commit has a command id of its own, since
its proof's attestation time differs). Uploads of one reservation to one server are stored one at a
time: an attempt sent while another still runs waits for it and finds the object stored.

A read handle (a large delivery's `payload.read_handle`) is verified by the service and read
while its lease lasts, for a caller authenticated against the handle's domain.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from keyload.commands import BY_NAME, Capability
from keyload.limits import AVRO_LONG_MAX
from keyload.log.base import partition_for
from keyload.processors.access import allows, load_principal
from keyload.processors.apply import DOMAIN_RULE, valid_domain
from keyload.processors.payloads.handles import HandleError, ReadHandle, UploadHandle, open_handle
from keyload.projections import keys
from keyload.projections.records import PayloadReservation, ReservationState, load
from keyload.projections.store import Readable, Staged, Store
from keyload.sdk.payloads import PayloadConflict, PayloadError, PayloadGateway, upload_handle
from keyload.server import statuses
from keyload.server.app import Engine, Refused, answered, is_number, json_object, outcome_response, read_capped
from keyload.server.writer import Answer
from keyload.storage.datadir import DataDir
from keyload.storage.keyring import LiveKeyring
from keyload.storage.object_store import ObjectStore, ObjectStoreError
from keyload.wire import UPLOAD_HANDLE_HEADER, WireError, names

PREPARE = BY_NAME["PrepareLargeSchedule"]
COMMIT = BY_NAME["CommitLargeSchedule"]
UPLOAD_PATH = "/v1/domains/{domain}/reservations/{reservation_id}/content"
READ_PATH = "/v1/payloads/read"
SCRATCH = ("scratch", "payloads")  # under the data directory: where uploads are staged and reads copied
UPLOAD_STAGED = "upload-"  # the server's files in SCRATCH, by what they hold
READ_STAGED = "read-"
NO_RESERVATION = ("NotFound", 404)
HANDLE_NEEDED = f"send the {UPLOAD_HANDLE_HEADER} header the reservation was answered with"
log = logging.getLogger("keyload.server")
WRONG_BYTES = ("Conflict", 409)  # the bytes are not the reserved ones, or the key holds others
STORE_UNAVAILABLE = ("Unavailable", 503)  # the object store failed: retry the upload


class PayloadRoutes:
    def __init__(self, engine: Engine, data: DataDir, keyring: LiveKeyring, stores: Mapping[int, Store]) -> None:
        self.engine = engine
        self.stores = stores  # the projections this process holds, by partition
        self.data = data
        self.keyring = keyring
        self.scratch = data.root.joinpath(*SCRATCH)
        # What a server killed mid-transfer left (this one holds the directory's run lock, or is a
        # Kafka processor's, the only server of its data directory): nobody will finish it. Only
        # the server's own files: a local client stages its uploads here too (`payload-…`).
        for leftover in self.scratch.glob("*"):
            if leftover.name.startswith((UPLOAD_STAGED, READ_STAGED)):
                leftover.unlink(missing_ok=True)
        self._objects: ObjectStore | None = None
        self.outcomes = names("keyload.Outcome")
        # One upload at a time per object key: a second attempt at a reservation (a client retrying
        # while its first try still runs) waits, then finds the object stored and stores nothing.
        # An S3 store need not hold concurrent conditional completes of one key to one version.
        self._storing: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def gateway(self) -> PayloadGateway:
        """Over the data directory's object store, opened once (S3: two requests) at first use; a
        store that cannot be opened is a 503 (upload again), as one that fails later is."""
        if self._objects is None:
            try:
                self._objects = self.data.object_store()
            except ObjectStoreError as exc:
                raise Refused(STORE_UNAVAILABLE, f"the object store failed: {exc}") from None
        return PayloadGateway(self._objects, self.keyring)

    async def upload(self, request: Request) -> Response:
        async def answer(_: str) -> Response:
            domain = request.path_params["domain"]
            if not valid_domain(domain):
                raise WireError(DOMAIN_RULE)
            reservation_id = _reservation_id(request.path_params["reservation_id"])
            partition = partition_for(domain, self.engine.partitions)
            caller = self.engine.caller(request, partition)
            handle_text, handle, stored = self._upload_handle(
                request, caller.principal, domain, partition, reservation_id
            )
            stopping = Refused(statuses.UNAVAILABLE, "the service is stopping: upload again once it serves")
            proof = await self.engine.waiters.unless_abandoned(
                self._store(request, handle_text, handle, stored), stopping
            )
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
            fd, name = tempfile.mkstemp(dir=self.scratch, prefix=READ_STAGED)
            os.close(fd)
            target = Path(name)
            try:
                await asyncio.to_thread(lambda: self.gateway().read(handle_text, target))
            except PayloadError as exc:
                target.unlink(missing_ok=True)
                raise Refused(statuses.GONE, str(exc)) from None
            except ObjectStoreError as exc:  # the store did not answer, or could not be opened: not the payload's fault
                target.unlink(missing_ok=True)
                raise Refused(STORE_UNAVAILABLE, f"the object store failed: {exc}") from None
            cleanup = BackgroundTask(target.unlink, missing_ok=True)
            return FileResponse(target, media_type="application/octet-stream", background=cleanup)

        return await answered(request, answer)

    def _upload_handle(
        self, request: Request, principal: str, domain: str, partition: int, reservation_id: int
    ) -> tuple[str, UploadHandle, bool]:
        """The upload's handle (as sent, and opened): the one the request carries, verified for the
        reservation of its path; and whether the reservation is known committed. The embedded
        service first finds in its projection that the reservation is open or committed and the
        caller may enqueue to its queue, and makes the handle itself when the request carries none.
        A handle past its deadline is refused before any byte is read, unless its reservation is
        committed: its object is stored, so a client that lost the first answer is answered again."""
        handle_text = request.headers.get(UPLOAD_HANDLE_HEADER)
        handle = None if handle_text is None else self._opened(handle_text, domain, partition, reservation_id)
        committed = False
        store = self.stores.get(partition)
        if store is not None:
            reservation = self._reservation(store, principal, domain, reservation_id)
            if reservation.state not in (ReservationState.reserved, ReservationState.committed):
                raise Refused(NO_RESERVATION, f"the reservation is {reservation.state.value}")
            committed = reservation.state == ReservationState.committed
            if handle_text is None:
                handle_text = upload_handle(self.keyring, reservation, partition)
                handle = open_handle(self.keyring, handle_text, UploadHandle)
        if handle_text is None or handle is None:
            raise WireError(HANDLE_NEEDED)
        if not committed:
            try:
                self.gateway().check_alive(handle)
            except PayloadError as exc:
                raise Refused(statuses.GONE, str(exc)) from None
        return handle_text, handle, committed

    def _opened(self, handle_text: str, domain: str, partition: int, reservation_id: int) -> UploadHandle:
        """The upload handle the request carries, verified, for the reservation of its path."""
        try:
            handle = open_handle(self.keyring, handle_text, UploadHandle)
        except HandleError as exc:
            raise WireError(f"{UPLOAD_HANDLE_HEADER}: {exc}") from None
        if (handle.domain, handle.partition, handle.reservation_id) != (domain, partition, reservation_id):
            raise WireError(f"{UPLOAD_HANDLE_HEADER} is the handle of another reservation")
        return handle

    def _reservation(self, store: Readable, principal: str, domain: str, reservation_id: int) -> PayloadReservation:
        """The reservation, for a caller that may enqueue to its queue. A caller without `enqueue` on
        the domain is refused before the reservation is looked up, and one that may not enqueue to
        the reservation's queue is told what it would be told of a reservation that does not exist:
        neither learns which reservation ids exist."""
        record = load_principal(store, principal)
        grants = () if record is None else record.grants
        if not allows(grants, Capability.enqueue, domain, None):
            raise Refused(statuses.FORBIDDEN, "the principal holds no enqueue grant on this domain")
        reservation = load(Staged(store), keys.reservation(reservation_id), PayloadReservation)
        if (
            reservation is None
            or reservation.domain != domain
            or not allows(grants, Capability.enqueue, domain, reservation.queue)
        ):
            raise Refused(NO_RESERVATION, "no such reservation on a queue the principal may enqueue to")
        return reservation

    async def _store(self, request: Request, handle_text: str, handle: UploadHandle, stored: bool) -> dict[str, Any]:
        """Stage the request body, check it is the reserved bytes, store it (unless `stored`: its
        reservation is committed, so its object is there) and attest it: the proof."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.scratch, prefix=UPLOAD_STAGED)
        staged = Path(name)
        try:
            digest, length = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in request.stream():
                    length += len(chunk)
                    if length > handle.length:
                        raise Refused(WRONG_BYTES, "the bytes are not the reserved ones (longer than reserved)")
                    digest.update(chunk)
                    out.write(chunk)
            if (length, digest.hexdigest()) != (handle.length, handle.sha256):
                raise Refused(WRONG_BYTES, "the bytes are not the reserved ones (length or SHA-256 differ)")
            gateway = self.gateway()
            storing = self._storing.setdefault(handle.object_key, asyncio.Lock())
            try:
                async with storing:
                    if not stored:
                        await asyncio.to_thread(gateway.upload, handle_text, staged)
                    proof: dict[str, Any] = await asyncio.to_thread(gateway.attest, handle_text)
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
    """A reservation id named in a path: an Avro long ≥ 0, as a command's field takes it (one that
    names no reservation is then NotFound)."""
    if not is_number(text) or int(text) > AVRO_LONG_MAX:
        raise WireError(f"reservation_id must be an integer in 0..{AVRO_LONG_MAX}")
    return int(text)


def _read_handle(raw: bytes) -> str:
    value = json_object(raw)
    if set(value) != {"read_handle"} or not isinstance(value["read_handle"], str):
        raise WireError('the request body must be {"read_handle": HANDLE}')
    return value["read_handle"]


class UploadHandles:
    """The header a committed PrepareLargeSchedule is answered with: the reservation's upload handle."""

    def __init__(self, keyring: Mapping[str, bytes]) -> None:
        self.keyring = keyring

    def __call__(self, answer: Answer) -> dict[str, str]:
        """No header when the reservation was refused, or when this server's keyring lacks its trust
        key (a Kafka processor's keyring copy behind a key rotation): the outcome stands, and the
        upload is refused for want of the handle, which a repeat of the reservation answers again."""
        record = answer.record
        if record["status"] != "committed":
            return {}
        _, result = record["result"]
        receipt = PayloadReservation.from_avro(result)
        try:
            return {UPLOAD_HANDLE_HEADER: upload_handle(self.keyring, receipt, record["partition"])}
        except PayloadError as exc:
            log.warning("reservation %d is answered without its upload handle: %s", receipt.reservation_id, exc)
            return {}


def payload_headers(keyring: Mapping[str, bytes]) -> dict[str, Callable[[Answer], Mapping[str, str]]]:
    """`Engine.outcome_headers`: a reservation is answered with its upload handle."""
    return {PREPARE.name: UploadHandles(keyring)}


def payload_routes(engine: Engine, data: DataDir, keyring: LiveKeyring, stores: Mapping[int, Store]) -> list[Route]:
    """The embedded service reads an upload's reservation and the caller's grant from the
    partition's projection it holds (`stores`), and makes the upload's handle when the request
    carries none. A Kafka processor's server holds none ({}), nor does `keyload run` hold its
    worker processes' (`--workers`): there an upload is taken by its handle alone, and its
    reservation and grant are checked when it is committed."""
    routes = PayloadRoutes(engine, data, keyring, stores)
    return [
        Route(UPLOAD_PATH, routes.upload, methods=["PUT"], name="upload_payload"),
        Route(READ_PATH, routes.read, methods=["POST"], name="read_payload"),
    ]
