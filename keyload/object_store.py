"""The object store: immutable, versioned objects under keys (checkpoint files today, payloads later).

The embedded default is a versioned filesystem store. Its contract is the part of
S3's that recovery relies on: an object version never changes once written, a
create is conditional (the same bytes again are idempotent, other bytes are a
conflict), HEAD reports version, etag (SHA-256), and length, and a delete names
the exact version it removes, so a late or repeated delete never removes a newer
object.

ROOT/<key>~/<version>    one file per object version; version = creation time in ns
                         (20 digits), "." 8 random hex digits, "-", SHA-256 of the
                         bytes (the etag): never reused, so a stale delete is harmless

`S3ObjectStore` keeps the same contract in an S3 bucket with versioning enabled:
the version is S3's version id, a create is a conditional PUT (`If-None-Match: *`),
and the SHA-256 travels as object metadata so HEAD reports it without reading the
bytes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MAX_KEY_CHARS = 512
KEY_PATTERN = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
OBJECT_SUFFIX = "~"  # marks an object's folder, so a key may also be a prefix of other keys
COPY_CHUNK_BYTES = 1 << 20


class ObjectStoreError(Exception):
    """The store cannot serve the request (I/O failure, bad key, missing object)."""


class ObjectConflict(ObjectStoreError):
    """A conditional create found the key holding other bytes."""


@dataclass(frozen=True, slots=True)
class ObjectVersion:
    key: str
    version: str
    etag: str  # SHA-256 hex of the bytes
    length: int


class ObjectStore(Protocol):
    def put_if_absent(self, key: str, source: Path) -> ObjectVersion:
        """Create `key` from a file unless it exists; the same bytes again return the existing version."""
        ...

    def get(self, key: str, into: Path, version: str | None = None) -> ObjectVersion:
        """Copy an object version (default: the newest) into a file."""
        ...

    def head(self, key: str) -> ObjectVersion | None: ...

    def delete(self, key: str, version: str) -> bool:
        """Remove exactly that version; False when it was already gone."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        """Newest version of every key under `prefix`, in key order."""
        ...


def check_key(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not KEY_PATTERN.fullmatch(key) or ".." in key.split("/"):
        raise ObjectStoreError(f"object keys are 1..{MAX_KEY_CHARS} characters of [A-Za-z0-9._-] joined by '/'")
    return key


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(COPY_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class FileObjectStore:
    """A versioned object store in a folder; safe for several processes on one machine."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _folder(self, key: str) -> Path:
        return self.root / (check_key(key) + OBJECT_SUFFIX)

    def _versions(self, key: str) -> list[str]:
        folder = self._folder(key)
        try:
            return sorted(name for name in os.listdir(folder) if not name.startswith("."))
        except FileNotFoundError:
            return []

    def _describe(self, key: str, version: str) -> ObjectVersion:
        path = self._folder(key) / version
        try:
            length = path.stat().st_size
        except FileNotFoundError:
            raise ObjectStoreError(f"object {key} has no version {version}") from None
        return ObjectVersion(key, version, version.split("-", 1)[1], length)

    def head(self, key: str) -> ObjectVersion | None:
        versions = self._versions(key)
        return self._describe(key, versions[-1]) if versions else None

    def put_if_absent(self, key: str, source: Path) -> ObjectVersion:
        folder = self._folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        etag = _sha256_of(source)
        existing = self.head(key)
        if existing is not None:
            if existing.etag != etag:
                raise ObjectConflict(f"object {key} exists with other content")
            return existing
        version = f"{time.time_ns():020d}.{os.urandom(4).hex()}-{etag}"
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".upload-")
        try:
            with os.fdopen(handle, "wb") as out, source.open("rb") as src:
                shutil.copyfileobj(src, out, COPY_CHUNK_BYTES)
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):
                # link, not rename: it fails when another writer created the version first.
                os.link(temporary, folder / version)
        finally:
            os.unlink(temporary)
        winner = self.head(key)
        assert winner is not None
        if winner.etag != etag:
            raise ObjectConflict(f"object {key} exists with other content")
        return winner

    def get(self, key: str, into: Path, version: str | None = None) -> ObjectVersion:
        if version is None:
            newest = self.head(key)
            if newest is None:
                raise ObjectStoreError(f"object {key} does not exist")
            version = newest.version
        described = self._describe(key, version)
        into.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._folder(key) / version, into)
        return described

    def delete(self, key: str, version: str) -> bool:
        folder = self._folder(key)
        try:
            os.unlink(folder / version)
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):  # other versions (or an upload in progress) remain
            folder.rmdir()
        return True

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        parent = prefix.rpartition("/")[0]
        base = self.root / parent if parent else self.root
        found = (
            folder.relative_to(self.root).as_posix()[: -len(OBJECT_SUFFIX)]
            for folder in base.rglob("*" + OBJECT_SUFFIX)
        )
        for key in sorted(key for key in found if key.startswith(prefix)):
            newest = self.head(key)
            if newest is not None:
                yield newest


# S3: the SHA-256 (hex) of an object's bytes, set by put_if_absent and read back by HEAD.
SHA256_METADATA = "sha256"
PUT_ATTEMPTS = 5  # a conditional PUT racing another writer or a delete is retried this often
_MISSING_CODES = {"404", "NoSuchKey", "NoSuchVersion", "NotFound"}


def _code(exc: Exception) -> str:
    response: Any = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(exc: Exception) -> int:
    response: Any = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


class S3ObjectStore:
    """The object-store contract in an S3 bucket (AWS, MinIO, moto, ...) with versioning enabled.

    A missing bucket is created with versioning on; an existing bucket whose versioning
    is not enabled is refused, since a delete could then remove bytes another version
    still names. `put_if_absent` is a conditional create (`If-None-Match: *`): exactly
    one writer's version becomes the object, a racing writer gets 412 and compares
    SHA-256s (same bytes: idempotent, other bytes: `ObjectConflict`). `delete` removes
    exactly the named version id (a HEAD of that version first tells whether it was
    there, since S3 answers a delete of a missing version with success as well).
    Keys live under `prefix` (empty, or a valid key: objects go to `prefix/key`).
    `client_options` go to `boto3.client("s3", ...)` (credentials, config, ...), or pass
    a ready `client`.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        client: S3Client | None = None,
        create_bucket: bool = True,
        **client_options: Any,
    ) -> None:
        self.bucket = bucket
        self.prefix = check_key(prefix.rstrip("/")) + "/" if prefix else ""
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region_name, **client_options)
        self.client = client
        from botocore.exceptions import BotoCoreError, ClientError

        self._client_error = ClientError
        self._errors: tuple[type[Exception], ...] = (BotoCoreError, ClientError)
        self._ensure_bucket(create_bucket)

    def _failure(self, what: str, exc: Exception) -> ObjectStoreError:
        return ObjectStoreError(f"S3 bucket {self.bucket}: {what} failed: {exc}")

    def _ensure_bucket(self, create: bool) -> None:
        try:
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except self._client_error as exc:
                if _code(exc) not in {"404", "NoSuchBucket", "NotFound"} or not create:
                    raise
                self._create_bucket()
            status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
        except self._errors as exc:
            raise self._failure("opening the bucket", exc) from exc
        if status != "Enabled":
            raise ObjectStoreError(
                f"S3 bucket {self.bucket} has versioning {(status or 'off').lower()}; the object store needs "
                "versioning enabled (immutable versions, version-aware deletes)"
            )

    def _create_bucket(self) -> None:
        region = self.client.meta.region_name
        try:
            if region and region != "us-east-1":
                self.client.create_bucket(
                    Bucket=self.bucket,
                    CreateBucketConfiguration={"LocationConstraint": region},  # type: ignore[typeddict-item]
                )
            else:
                self.client.create_bucket(Bucket=self.bucket)
        except self._client_error as exc:
            if _code(exc) != "BucketAlreadyOwnedByYou":  # another process created it first
                raise
        self.client.put_bucket_versioning(Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"})

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _head(self, key: str, version: str | None) -> ObjectVersion | None:
        name = self._name(key)
        try:
            if version is None:
                answer = self.client.head_object(Bucket=self.bucket, Key=name)
            else:
                answer = self.client.head_object(Bucket=self.bucket, Key=name, VersionId=version)
        except self._client_error as exc:
            # A version id S3 cannot parse is a 400: no such version either way.
            if _code(exc) in _MISSING_CODES or _status(exc) == 404 or (version is not None and _status(exc) == 400):
                return None
            raise self._failure(f"HEAD {key}", exc) from exc
        except self._errors as exc:
            raise self._failure(f"HEAD {key}", exc) from exc
        if answer.get("DeleteMarker"):
            return None
        etag = answer.get("Metadata", {}).get(SHA256_METADATA)
        if not etag:
            raise ObjectStoreError(f"S3 object {self._name(key)} has no {SHA256_METADATA} metadata (not ours)")
        return ObjectVersion(key, answer["VersionId"], etag, answer["ContentLength"])

    def head(self, key: str) -> ObjectVersion | None:
        return self._head(key, None)

    def put_if_absent(self, key: str, source: Path) -> ObjectVersion:
        name = self._name(key)
        digest = hashlib.sha256()
        with source.open("rb") as file:
            while chunk := file.read(COPY_CHUNK_BYTES):
                digest.update(chunk)
        etag = digest.hexdigest()
        checksum = base64.b64encode(digest.digest()).decode()
        for _ in range(PUT_ATTEMPTS):
            existing = self.head(key)
            if existing is not None:
                if existing.etag != etag:
                    raise ObjectConflict(f"object {key} exists with other content")
                return existing
            try:
                with source.open("rb") as body:
                    answer = self.client.put_object(
                        Bucket=self.bucket,
                        Key=name,
                        Body=body,
                        IfNoneMatch="*",
                        ChecksumSHA256=checksum,  # S3 verifies the bytes it received
                        Metadata={SHA256_METADATA: etag},
                    )
            except self._client_error as exc:
                # 412: another writer's version exists; 409: a concurrent conditional write is in flight.
                if _status(exc) in (409, 412):
                    time.sleep(0.05)
                    continue
                raise self._failure(f"PUT {key}", exc) from exc
            except self._errors as exc:
                raise self._failure(f"PUT {key}", exc) from exc
            return ObjectVersion(key, answer["VersionId"], etag, source.stat().st_size)
        raise ObjectStoreError(f"object {key}: conditional create kept racing other writers or deletes")

    def get(self, key: str, into: Path, version: str | None = None) -> ObjectVersion:
        described = self._head(key, version)
        if described is None:
            raise ObjectStoreError(
                f"object {key} does not exist" if version is None else f"object {key} has no version {version}"
            )
        into.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._name(key), VersionId=described.version)
            with into.open("wb") as out:
                for chunk in answer["Body"].iter_chunks(COPY_CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
        except self._errors as exc:
            raise self._failure(f"GET {key}", exc) from exc
        if digest.hexdigest() != described.etag:
            raise ObjectStoreError(f"object {key} version {described.version}: bytes do not match their SHA-256")
        return described

    def delete(self, key: str, version: str) -> bool:
        if self._head(key, version) is None:
            return False
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._name(key), VersionId=version)
        except self._errors as exc:
            raise self._failure(f"DELETE {key} version {version}", exc) from exc
        return True

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        keys: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
            for page in pages:
                keys.extend(item["Key"][len(self.prefix) :] for item in page.get("Contents", []))
        except self._errors as exc:
            raise self._failure(f"LIST {prefix}", exc) from exc
        for key in sorted(keys):
            newest = self.head(key)
            if newest is not None:  # deleted since the listing
                yield newest
