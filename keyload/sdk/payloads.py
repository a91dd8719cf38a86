"""The payload gateway: upload handles, uploads, attestation and reads of large payloads.

Everything here happens outside the log, between the reservation and the commit
(DESIGN.md §8): the gateway signs an upload handle from a reservation receipt it
received itself (the handle binds reservation, object key, length, SHA-256 and the
upload deadline, and is never written to a command, outcome, checkpoint or query
result; the HTTP API gives it to the caller that reserved, in a response header,
and takes it back with the upload), uploads bytes only under a valid handle to the key the handle names,
attests the stored object by reading it back, and signs the PayloadCommitProof
that CommitLargeSchedule verifies. Reads need a read handle from a delivery.

Handle expiry is checked against this process's clock; the processor never trusts
that clock (the deadline is log time), and retention waits the queue policy's payload_request_horizon_ms
past any handle's expiry before deleting, for the skew between the two.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from keyload.errors import KeyloadError
from keyload.processors.payloads import proofs
from keyload.processors.payloads.handles import HandleError, ReadHandle, UploadHandle, issue, open_handle
from keyload.storage.object_store import (
    MAX_UPLOAD_PARTS,
    ObjectConflict,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    ObjectVersion,
)

PART_BYTES = 8 * 1024 * 1024  # multipart part size; objects up to this go in one conditional PUT
PART_ALIGN_BYTES = 1024 * 1024  # a larger part size (objects over 80,000 MiB, about 78 GiB) is a whole number of MiB
READ_CHUNK_BYTES = 1024 * 1024
UPLOAD_ATTEMPTS = 5  # tries per part (and per single PUT) when the object store fails
RETRY_PAUSE_S = 0.2  # first pause between tries; doubles

Progress = Callable[[int, int], object]  # (bytes uploaded so far, total)
T = TypeVar("T")


class PayloadError(KeyloadError):
    """A payload cannot be uploaded, attested or read as asked (bad handle, wrong bytes, missing object)."""


class PayloadConflict(PayloadError):
    """Other bytes than the reservation's: offered for upload, or already stored under its key."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Digest:
    length: int
    sha256: bytes


def digest_of(path: Path) -> Digest:
    digest, length = hashlib.sha256(), 0
    with path.open("rb") as file:
        while chunk := file.read(READ_CHUNK_BYTES):
            digest.update(chunk)
            length += len(chunk)
    return Digest(length, digest.digest())


class PayloadGateway:
    """Signs handles and proofs with the keyring; moves bytes to and from the object store."""

    def __init__(
        self, objects: ObjectStore, keyring: Mapping[str, bytes], clock: Callable[[], int] = wall_clock_ms
    ) -> None:
        self.objects = objects
        self.keyring = keyring
        self.clock = clock

    def upload_handle(self, receipt: Any, partition: int) -> str:
        """A handle for the reservation a PrepareLargeSchedule outcome (`receipt`) describes."""
        return upload_handle(self.keyring, receipt, partition)

    def _open_upload(self, text: str) -> UploadHandle:
        try:
            return open_handle(self.keyring, text, UploadHandle)
        except HandleError as exc:
            raise PayloadError(str(exc)) from None

    def upload(self, handle_text: str, source: Path, progress: Progress | None = None) -> ObjectVersion:
        """Store `source` under the handle's object key: one conditional PUT, or a multipart upload
        for more than PART_BYTES. The same bytes again are idempotent; other bytes are PayloadConflict."""
        handle = self._open_upload(handle_text)
        self.check_alive(handle)
        found = digest_of(source)
        if (found.length, found.sha256.hex()) != (handle.length, handle.sha256):
            raise PayloadConflict("the bytes are not the reserved ones (length or SHA-256 differ)")
        try:
            if handle.length <= PART_BYTES:
                self.check_alive(handle)  # hashing a large file takes a while
                stored = _retrying(lambda: self.objects.put_if_absent(handle.object_key, source))
            else:
                stored = self._multipart(handle, source, progress)
        except ObjectConflict:
            raise PayloadConflict(f"object {handle.object_key} already holds other bytes") from None
        if progress is not None:
            progress(handle.length, handle.length)
        return stored

    def check_alive(self, handle: UploadHandle) -> None:
        """Checked right before anything is created: an object must never appear under an expired
        handle, since retention deletes abandoned keys once the deadline and horizon have passed."""
        if self.clock() >= handle.expires_ms:
            raise PayloadError("the upload handle has expired (the reservation's deadline has passed)")

    def _multipart(self, handle: UploadHandle, source: Path, progress: Progress | None) -> ObjectVersion:
        key = handle.object_key
        existing = self.objects.head(key)
        if existing is not None and existing.etag == handle.sha256:
            return existing  # a retry after a completed upload
        part_bytes = part_size(handle.length)
        self.check_alive(handle)
        upload_id = _retrying(lambda: self.objects.begin_upload(key, handle.sha256))
        try:
            parts = 0
            with source.open("rb") as file:
                while chunk := file.read(part_bytes):
                    parts += 1
                    _retrying(functools.partial(self.objects.upload_part, key, upload_id, parts, chunk))
                    if progress is not None:
                        progress(min(parts * part_bytes, handle.length), handle.length)
            self.check_alive(handle)
            return _retrying(lambda: self.objects.complete_upload(key, upload_id, parts))
        except BaseException:
            with contextlib.suppress(ObjectStoreError):
                self.objects.abort_upload(key, upload_id)
            raise

    def attest(self, handle_text: str) -> dict[str, Any]:
        """Read the reserved object back and sign a PayloadCommitProof of what is stored."""
        handle = self._open_upload(handle_text)
        stored = self.objects.head(handle.object_key)
        if stored is None:
            raise PayloadError(f"object {handle.object_key} has not been uploaded")
        try:
            stored = self.objects.verify(handle.object_key, stored.version)
        except ObjectStoreError as exc:
            raise PayloadError(f"object {handle.object_key} cannot be verified: {exc}") from None
        if (stored.length, stored.etag) != (handle.length, handle.sha256):
            raise PayloadError("the stored object is not the reserved one (length or SHA-256 differ)")
        proof: dict[str, Any] = {
            "domain": handle.domain,
            "reservation_id": handle.reservation_id,
            "object_key": handle.object_key,
            "object_version": stored.version,
            "length": stored.length,
            "sha256": bytes.fromhex(stored.etag),
            "trust_set_version": handle.trust_set_version,
            "key_id": handle.trust_key_id,
            "attested_at_ms": self.clock(),
        }
        proof["signature"] = proofs.sign(self.keyring[handle.trust_key_id], proof)
        return proof

    def read(self, read_handle: str, into: Path) -> ObjectVersion:
        """Copy the object version a delivery's read handle names into a file, verifying its SHA-256."""
        try:
            handle = open_handle(self.keyring, read_handle, ReadHandle)
        except HandleError as exc:
            raise PayloadError(str(exc)) from None
        if self.clock() >= handle.expires_ms:
            raise PayloadError("the read handle has expired (its lease has ended): receive the message again")
        try:
            return self.objects.get(handle.object_key, into, handle.object_version)
        except ObjectStoreUnavailable:  # not the payload's fault: the same read may succeed later
            into.unlink(missing_ok=True)
            raise
        except ObjectStoreError as exc:  # ObjectCorrupt included: bytes changed at rest are never handed on
            into.unlink(missing_ok=True)
            raise PayloadError(f"payload {handle.object_key} cannot be read: {exc}") from None


def upload_handle(keyring: Mapping[str, bytes], receipt: Any, partition: int) -> str:
    """A handle for the reservation a PrepareLargeSchedule outcome (`receipt`) describes, signed with
    its trust set's key: it binds the reservation, its object key, length, SHA-256 and upload deadline."""
    if receipt.trust_key_id not in keyring:
        raise PayloadError(f"the keyring has no key {receipt.trust_key_id!r} (the reservation's trust set)")
    handle = UploadHandle(
        key_id=receipt.trust_key_id,
        domain=receipt.domain,
        partition=partition,
        reservation_id=receipt.reservation_id,
        object_key=receipt.object_key,
        length=receipt.length,
        sha256=receipt.sha256.hex(),
        expires_ms=receipt.upload_deadline_ms,
        trust_set_version=receipt.trust_set_version,
        trust_key_id=receipt.trust_key_id,
    )
    return issue(keyring, handle)


def part_size(length: int) -> int:
    """PART_BYTES, or more when that many parts would exceed the store's limit (5 TiB: 525 MiB parts)."""
    needed = -(-length // MAX_UPLOAD_PARTS)
    return max(PART_BYTES, -(-needed // PART_ALIGN_BYTES) * PART_ALIGN_BYTES)


def _retrying(attempt: Callable[[], T]) -> T:
    """Run an object-store call, retrying failures that may be transient (never a conflict)."""
    pause = RETRY_PAUSE_S
    for remaining in range(UPLOAD_ATTEMPTS - 1, -1, -1):
        try:
            return attempt()
        except ObjectConflict:
            raise
        except ObjectStoreError:
            if remaining == 0:
                raise
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


@contextlib.contextmanager
def staged_source(source: bytes | os.PathLike[str], scratch: Path) -> Iterator[Path]:
    """A path holding the payload: the file given, or the bytes written to a scratch file."""
    if not isinstance(source, bytes | bytearray):
        yield Path(source)
        return
    scratch.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=scratch, prefix="payload-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(source)
        yield Path(name)
    finally:
        os.unlink(name)
