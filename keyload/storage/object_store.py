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
ROOT/<key>~/.upload-<id>/  an unfinished multipart upload (id: 32 random hex digits):
                         `sha256` (the declared SHA-256) and part-NNNNN files
ROOT/<key>~/.tmp-*       a version or upload being written (linked or renamed into place)

Large objects arrive as multipart uploads (S3's model, in both backends): the
writer declares the SHA-256 of the whole object up front, uploads parts of at
least MIN_PART_BYTES (all but the last) numbered 1..MAX_UPLOAD_PARTS, and
completes the upload as one conditional create, refused when the joined bytes
are not the declared ones. `versions` lists every version of a key, so a garbage
collector can delete what a late writer left; `verify` re-reads a version's bytes
for attestation instead of trusting its recorded SHA-256.

`S3ObjectStore` keeps the same contract in an S3 bucket with versioning enabled:
the version is S3's version id, a create is a conditional PUT or multipart
complete (`If-None-Match: *`), and the SHA-256 travels as object metadata so HEAD
reports it without reading the bytes. S3 can neither show an unfinished upload's
metadata nor check a multipart object's SHA-256, so an upload's declared SHA-256
also lives in a zero-byte object PREFIX/<key>~upload-<id> ("~" is in no key), and
a completed upload is read back and its version deleted when the bytes are wrong.
"""

from __future__ import annotations

import base64
import builtins  # `list` is also a method name of the stores
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar

from keyload.errors import KeyloadError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MAX_KEY_CHARS = 512
KEY_PATTERN = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
OBJECT_SUFFIX = "~"  # marks an object's folder, so a key may also be a prefix of other keys
COPY_CHUNK_BYTES = 1 << 20
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's least size of every multipart part but the last
MAX_UPLOAD_PARTS = 10_000  # S3's most parts per multipart upload
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
# An S3 request's bounds, unless `client_options` give a botocore `config` of their own: a store that
# takes requests and answers none fails a request after at most S3_ATTEMPTS * S3_READ_TIMEOUT_S
# (boto3's defaults are 60 s and 5 attempts, with back-off between them).
S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 20.0  # one socket read: an answer's first bytes, or the next ones
S3_ATTEMPTS = 3  # the first try and two retries ("standard" retry mode)
PUT_ATTEMPTS = 5  # a conditional create racing another writer or a delete is retried this often

# FileObjectStore names inside an object's folder; names starting with "." are never versions.
FILE_VERSION_PATTERN = re.compile(r"[0-9]{20}\.[0-9a-f]{8}-[0-9a-f]{64}")
FILE_UPLOAD_ID_PATTERN = re.compile(r"[0-9a-f]{32}")
TEMPORARY_PREFIX = ".tmp-"
UPLOAD_PREFIX = ".upload-"
UPLOAD_SHA256 = "sha256"  # in an upload's folder: the declared SHA-256
UPLOAD_PART_PREFIX = "part-"  # in an upload's folder: part-00001 ...


class ObjectStoreError(KeyloadError):
    """The store cannot serve the request (I/O failure, bad key, missing object)."""


class ObjectConflict(ObjectStoreError):
    """A conditional create found the key holding other bytes."""


class ObjectCorrupt(ObjectStoreError):
    """Bytes do not match the SHA-256 recorded (or declared) for them."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The store did not answer (unreachable, timed out, or a server error): the same request may
    succeed later, unlike a missing object or bytes that do not match."""


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

    def begin_upload(self, key: str, sha256: str) -> str:
        """Start a multipart upload of `key` whose joined bytes must have this SHA-256 (hex); its upload id."""
        ...

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> None:
        """Store part `number` (1..MAX_UPLOAD_PARTS); uploading a part number again replaces it.

        Every part but the last must be at least MIN_PART_BYTES (checked by `complete_upload`).
        """
        ...

    def complete_upload(self, key: str, upload_id: str, parts: int) -> ObjectVersion:
        """Join parts 1..parts into the object, conditionally exactly like put_if_absent.

        The key holding the declared SHA-256 already returns that version, other bytes are
        `ObjectConflict`; either way the upload is dropped. Joined bytes that are not the
        declared SHA-256 are `ObjectCorrupt`: nothing stays visible and the upload is dropped.
        An unknown upload id, a missing part or a part too small is `ObjectStoreError` and
        keeps the upload, so the writer can fix the part and complete again.
        """
        ...

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Drop an unfinished upload and its parts; an unknown or finished id is fine."""
        ...

    def uploads(self, key: str) -> builtins.list[str]:
        """Upload ids of unfinished multipart uploads of exactly `key`, in a stable order."""
        ...

    def versions(self, key: str) -> builtins.list[ObjectVersion]:
        """Every version of exactly `key` (not keys it prefixes), oldest first, described."""
        ...

    def version_ids(self, key: str) -> builtins.list[str]:
        """The ids of every version of exactly `key`, oldest first, whoever wrote them: what a collector
        deletes (one this store did not write has no SHA-256 to describe it by, but is in its key)."""
        ...

    def verify(self, key: str, version: str) -> ObjectVersion:
        """Read the version's bytes and check them against its SHA-256 (`ObjectCorrupt`); missing: ObjectStoreError."""
        ...


def _unless_gone(error: OSError) -> None:
    """A walk passes over a folder deleted meanwhile; any other failure to read one is raised."""
    if not isinstance(error, FileNotFoundError):
        raise ObjectStoreError(f"cannot list {error.filename}: {error.strerror}") from error


def check_key(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not KEY_PATTERN.fullmatch(key) or ".." in key.split("/"):
        raise ObjectStoreError(f"object keys are 1..{MAX_KEY_CHARS} characters of [A-Za-z0-9._-] joined by '/'")
    return key


def _check_sha256(sha256: str) -> str:
    if not SHA256_PATTERN.fullmatch(sha256):
        raise ObjectStoreError(f"a declared SHA-256 is 64 lowercase hex digits, not {sha256!r}")
    return sha256


def _check_part_number(number: int) -> int:
    if not 1 <= number <= MAX_UPLOAD_PARTS:
        raise ObjectStoreError(f"part numbers are 1..{MAX_UPLOAD_PARTS}, not {number}")
    return number


def _check_parts(key: str, upload_id: str, sizes: dict[int, int], parts: int) -> None:
    """Parts 1..parts of an upload (`sizes`: number -> bytes) must all be there, all but the last MIN_PART_BYTES."""
    _check_part_number(parts)
    missing = [number for number in range(1, parts + 1) if number not in sizes]
    if missing:
        raise ObjectStoreError(f"object {key} upload {upload_id}: parts {missing[:10]} are missing")
    small = [number for number in range(1, parts) if sizes[number] < MIN_PART_BYTES]
    if small:
        raise ObjectStoreError(
            f"object {key} upload {upload_id}: parts {small[:10]} are smaller than {MIN_PART_BYTES} bytes "
            "(only the last part may be)"
        )


def _settled(key: str, existing: ObjectVersion | None, etag: str) -> ObjectVersion | None:
    """What a conditional create of bytes with SHA-256 `etag` finds: nothing (None), the same bytes, or a conflict."""
    if existing is not None and existing.etag != etag:
        raise ObjectConflict(f"object {key} exists with other content")
    return existing


def _settle_upload(store: ObjectStore, key: str, upload_id: str, etag: str) -> ObjectVersion | None:
    """`_settled` for a multipart upload: once the key holds an object, the upload can never complete: drop it."""
    try:
        existing = _settled(key, store.head(key), etag)
    except ObjectConflict:
        store.abort_upload(key, upload_id)
        raise
    if existing is not None:
        store.abort_upload(key, upload_id)
    return existing


def _copy(sources: Iterable[Path], out: BinaryIO | None) -> str:
    """Stream the files one after the other into `out` (None: only read them); the SHA-256 (hex) of what was read."""
    digest = hashlib.sha256()
    for source in sources:
        with source.open("rb") as file:
            while chunk := file.read(COPY_CHUNK_BYTES):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    return digest.hexdigest()


def _sha256_of(path: Path) -> str:
    return _copy([path], None)


T = TypeVar("T")


def _make_in(folder: Path, make: Callable[[], T]) -> T:
    """Create something inside an object's folder, creating the folder first.

    A delete removes the folder once it is empty, so it may vanish between the mkdir and
    `make`: that is retried.
    """
    for _ in range(PUT_ATTEMPTS):
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            return make()
    raise ObjectStoreError(f"{folder} kept vanishing under concurrent deletes")


@contextlib.contextmanager
def _held(folder: Path) -> Iterator[None]:
    """An exclusive lock on an object's folder (flock of the folder itself, so nothing is left in it
    to keep it from being removed once empty), across threads and processes of this machine."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


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

    def _path(self, key: str, version: str) -> Path:
        """The file of a version; a name that is no version (a path, an upload folder) is a missing version."""
        if not FILE_VERSION_PATTERN.fullmatch(version):
            raise ObjectStoreError(f"object {key} has no version {version}")
        return self._folder(key) / version

    def _describe(self, key: str, version: str) -> ObjectVersion:
        try:
            length = self._path(key, version).stat().st_size
        except FileNotFoundError:
            raise ObjectStoreError(f"object {key} has no version {version}") from None
        return ObjectVersion(key, version, version.split("-", 1)[1], length)

    def head(self, key: str) -> ObjectVersion | None:
        while versions := self._versions(key):
            try:
                return self._describe(key, versions[-1])
            except ObjectStoreError:
                if versions[-1] in self._versions(key):
                    raise
                # deleted since the listing: look again
        return None

    def _create(self, key: str, etag: str, write: Callable[[BinaryIO], str]) -> ObjectVersion:
        """The conditional create ending both put_if_absent and complete_upload.

        `write` fills a temporary file in the object's folder and returns the SHA-256 of what
        it wrote; bytes other than `etag` are `ObjectCorrupt` before anything is visible.
        """
        folder = self._folder(key)
        handle, name = _make_in(folder, lambda: tempfile.mkstemp(dir=folder, prefix=TEMPORARY_PREFIX))
        try:
            with os.fdopen(handle, "wb") as out:
                written = write(out)
                out.flush()
                os.fsync(out.fileno())
            if written != etag:
                raise ObjectCorrupt(f"object {key}: the bytes' SHA-256 is {written}, not the declared {etag}")
            version = f"{time.time_ns():020d}.{os.urandom(4).hex()}-{etag}"
            with _held(folder):  # writers of the key take turns: the first creates, the others find it
                winner = _settled(key, self.head(key), etag)
                if winner is None:
                    os.link(name, folder / version)
                    winner = self._describe(key, version)
        finally:
            os.unlink(name)
        return winner

    def put_if_absent(self, key: str, source: Path) -> ObjectVersion:
        etag = _sha256_of(source)
        existing = _settled(key, self.head(key), etag)
        if existing is not None:
            return existing
        return self._create(key, etag, lambda out: _copy([source], out))

    def get(self, key: str, into: Path, version: str | None = None) -> ObjectVersion:
        if version is None:
            newest = self.head(key)
            if newest is None:
                raise ObjectStoreError(f"object {key} does not exist")
            version = newest.version
        self._describe(key, version)  # a missing version fails before `into` is created
        into.parent.mkdir(parents=True, exist_ok=True)
        with into.open("wb") as out:
            return self._checked(key, version, out)

    def verify(self, key: str, version: str) -> ObjectVersion:
        return self._checked(key, version, None)

    def _checked(self, key: str, version: str, out: BinaryIO | None) -> ObjectVersion:
        """Read a version (into `out`, if given) and check its bytes against their SHA-256, as the S3
        store does: a byte changed at rest is `ObjectCorrupt`, never served."""
        described = self._describe(key, version)
        try:
            actual = _copy([self._path(key, version)], out)
        except FileNotFoundError:
            raise ObjectStoreError(f"object {key} has no version {version}") from None
        if actual != described.etag:
            raise ObjectCorrupt(f"object {key} version {version}: bytes do not match their SHA-256")
        return described

    def version_ids(self, key: str) -> builtins.list[str]:
        return [name for name in self._versions(key) if FILE_VERSION_PATTERN.fullmatch(name)]

    def versions(self, key: str) -> builtins.list[ObjectVersion]:
        found = []
        for version in self._versions(key):  # names start with the creation time: oldest first
            with contextlib.suppress(ObjectStoreError):  # deleted since the listing
                found.append(self._describe(key, version))
        return found

    def delete(self, key: str, version: str) -> bool:
        folder = self._folder(key)
        if not FILE_VERSION_PATTERN.fullmatch(version):
            return False
        try:
            os.unlink(folder / version)
        except FileNotFoundError:
            return False
        self._drop_empty_folder(key)
        return True

    def _drop_empty_folder(self, key: str) -> None:
        """Remove the object's folder once empty, and the folders of its key it leaves empty (a
        retired checkpoint's `OFFSET/ID/db/`), up to the store's root: none are left to pile up. A
        put racing this recreates what it needs (`_make_in`)."""
        folder = self._folder(key)
        with contextlib.suppress(OSError):  # other versions, an upload in progress or other keys remain
            while folder != self.root:
                folder.rmdir()
                folder = folder.parent

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        parent = prefix.rpartition("/")[0]
        base = self.root / parent if parent else self.root
        found = []
        # os.walk passes over a folder deleted while it walks (another process retiring a
        # checkpoint), where Path.rglob raised FileNotFoundError; an object's folder holds no keys.
        for directory, folders, _ in os.walk(base, onerror=_unless_gone):
            objects = {name for name in folders if name.endswith(OBJECT_SUFFIX)}
            found += [
                (Path(directory) / name).relative_to(self.root).as_posix()[: -len(OBJECT_SUFFIX)] for name in objects
            ]
            folders[:] = [name for name in folders if name not in objects]
        for key in sorted(key for key in found if key.startswith(prefix)):
            newest = self.head(key)
            if newest is not None:
                yield newest

    def _upload(self, key: str, upload_id: str) -> Path:
        if not FILE_UPLOAD_ID_PATTERN.fullmatch(upload_id):
            raise ObjectStoreError(f"object {key} has no upload {upload_id}")
        return self._folder(key) / (UPLOAD_PREFIX + upload_id)

    def begin_upload(self, key: str, sha256: str) -> str:
        _check_sha256(sha256)
        upload_id = os.urandom(16).hex()
        folder = self._folder(key)
        # Written aside and renamed into place: an upload folder always holds its declared SHA-256.
        staged = Path(_make_in(folder, lambda: tempfile.mkdtemp(dir=folder, prefix=TEMPORARY_PREFIX)))
        (staged / UPLOAD_SHA256).write_text(sha256, "ascii")
        os.rename(staged, self._upload(key, upload_id))
        return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> None:
        _check_part_number(number)
        upload = self._upload(key, upload_id)
        try:
            handle, name = tempfile.mkstemp(dir=upload, prefix=TEMPORARY_PREFIX)
        except FileNotFoundError:
            raise ObjectStoreError(f"object {key} has no upload {upload_id}") from None
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(name, upload / f"{UPLOAD_PART_PREFIX}{number:05d}")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
            raise

    def complete_upload(self, key: str, upload_id: str, parts: int) -> ObjectVersion:
        upload = self._upload(key, upload_id)
        try:
            declared = (upload / UPLOAD_SHA256).read_text("ascii")
            sizes = {
                int(entry.name[len(UPLOAD_PART_PREFIX) :]): entry.stat().st_size
                for entry in os.scandir(upload)
                if entry.name.startswith(UPLOAD_PART_PREFIX)
            }
        except FileNotFoundError:
            raise ObjectStoreError(f"object {key} has no upload {upload_id}") from None
        _check_parts(key, upload_id, sizes, parts)
        existing = _settle_upload(self, key, upload_id, declared)
        if existing is not None:
            return existing
        paths = [upload / f"{UPLOAD_PART_PREFIX}{number:05d}" for number in range(1, parts + 1)]
        try:
            created = self._create(key, declared, lambda out: _copy(paths, out))
        except (ObjectConflict, ObjectCorrupt):
            self.abort_upload(key, upload_id)
            raise
        self.abort_upload(key, upload_id)
        return created

    def abort_upload(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(ObjectStoreError):  # not an id this store hands out: nothing to drop
            shutil.rmtree(self._upload(key, upload_id), ignore_errors=True)
        self._drop_empty_folder(key)

    def uploads(self, key: str) -> builtins.list[str]:
        try:
            names = os.listdir(self._folder(key))
        except FileNotFoundError:
            return []
        ids = (name[len(UPLOAD_PREFIX) :] for name in names if name.startswith(UPLOAD_PREFIX))
        return sorted(upload_id for upload_id in ids if FILE_UPLOAD_ID_PATTERN.fullmatch(upload_id))


# S3: the SHA-256 (hex) of an object's bytes, set by put_if_absent and read back by HEAD.
SHA256_METADATA = "sha256"
_MISSING_CODES = {"404", "NoSuchKey", "NoSuchVersion", "NotFound"}


def _code(exc: Exception) -> str:
    response: Any = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(exc: Exception) -> int:
    response: Any = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _missing_upload(exc: Exception) -> bool:
    return _code(exc) in {"NoSuchUpload", *_MISSING_CODES} or _status(exc) == 404


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
    a ready `client`. Without a `config` of theirs, each request is bounded by S3_CONNECT_TIMEOUT_S,
    S3_READ_TIMEOUT_S and S3_ATTEMPTS.
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
            from botocore.config import Config

            bounds = Config(
                connect_timeout=S3_CONNECT_TIMEOUT_S,
                read_timeout=S3_READ_TIMEOUT_S,
                retries={"max_attempts": S3_ATTEMPTS, "mode": "standard"},
            )
            client_options.setdefault("config", bounds)
            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region_name, **client_options)
        self.client = client
        from botocore.exceptions import BotoCoreError, ClientError

        self._client_error = ClientError
        self._errors: tuple[type[Exception], ...] = (BotoCoreError, ClientError)
        self._ensure_bucket(create_bucket)

    def _failure(self, what: str, exc: Exception) -> ObjectStoreError:
        """A failed request, as ObjectStoreUnavailable when no answer came (a connection or read
        error, a timeout) or the answer was a server error (5xx)."""
        transient = not isinstance(exc, self._client_error) or _status(exc) >= 500
        kind = ObjectStoreUnavailable if transient else ObjectStoreError
        return kind(f"S3 bucket {self.bucket}: {what} failed: {exc}")

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

    def _headers(self, key: str, version: str | None) -> dict[str, Any] | None:
        """HEAD of the key's current or given version, whoever wrote it; None when there is none."""
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
        return None if answer.get("DeleteMarker") else dict(answer)

    def _head(self, key: str, version: str | None) -> ObjectVersion | None:
        answer = self._headers(key, version)
        if answer is None:
            return None
        etag = answer.get("Metadata", {}).get(SHA256_METADATA)
        if not etag:
            raise ObjectStoreError(f"S3 object {self._name(key)} has no {SHA256_METADATA} metadata (not ours)")
        return ObjectVersion(key, answer["VersionId"], etag, answer["ContentLength"])

    def head(self, key: str) -> ObjectVersion | None:
        return self._head(key, None)

    def _create(
        self, key: str, what: str, settle: Callable[[], ObjectVersion | None], write: Callable[[], ObjectVersion]
    ) -> ObjectVersion:
        """The conditional create ending put_if_absent and complete_upload.

        `settle` returns the key's object when it holds the same bytes (raising `ObjectConflict`
        on other bytes); otherwise `write` creates it with `If-None-Match: *`. A 412 (another
        writer's version exists) or 409 (a concurrent conditional write is in flight) settles again.
        """
        for _ in range(PUT_ATTEMPTS):
            existing = settle()
            if existing is not None:
                return existing
            try:
                return write()
            except self._client_error as exc:
                if _status(exc) in (409, 412):
                    time.sleep(0.05)
                    continue
                raise self._failure(f"{what} {key}", exc) from exc
            except self._errors as exc:
                raise self._failure(f"{what} {key}", exc) from exc
        raise ObjectStoreError(f"object {key}: conditional create kept racing other writers or deletes")

    def put_if_absent(self, key: str, source: Path) -> ObjectVersion:
        name = self._name(key)
        etag = _sha256_of(source)

        def put() -> ObjectVersion:
            with source.open("rb") as body:
                answer = self.client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=body,
                    IfNoneMatch="*",
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(etag)).decode(),  # S3 verifies what it received
                    Metadata={SHA256_METADATA: etag},
                )
            return ObjectVersion(key, answer["VersionId"], etag, source.stat().st_size)

        return self._create(key, "PUT", lambda: _settled(key, self.head(key), etag), put)

    def _read(self, described: ObjectVersion, out: BinaryIO | None) -> None:
        """Stream a version's bytes (into `out`, if given) and check them against its SHA-256."""
        digest = hashlib.sha256()
        try:
            answer = self.client.get_object(
                Bucket=self.bucket, Key=self._name(described.key), VersionId=described.version
            )
            for chunk in answer["Body"].iter_chunks(COPY_CHUNK_BYTES):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
        except self._errors as exc:
            raise self._failure(f"GET {described.key}", exc) from exc
        if digest.hexdigest() != described.etag:
            raise ObjectCorrupt(f"object {described.key} version {described.version}: bytes do not match their SHA-256")

    def _described(self, key: str, version: str | None) -> ObjectVersion:
        described = self._head(key, version)
        if described is None:
            raise ObjectStoreError(
                f"object {key} does not exist" if version is None else f"object {key} has no version {version}"
            )
        return described

    def get(self, key: str, into: Path, version: str | None = None) -> ObjectVersion:
        described = self._described(key, version)
        into.parent.mkdir(parents=True, exist_ok=True)
        with into.open("wb") as out:
            self._read(described, out)
        return described

    def verify(self, key: str, version: str) -> ObjectVersion:
        described = self._described(key, version)
        self._read(described, None)
        return described

    def version_ids(self, key: str) -> builtins.list[str]:
        name = self._name(key)
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_object_versions").paginate(Bucket=self.bucket, Prefix=name)
            for page in pages:  # delete markers come in page["DeleteMarkers"]: not versions
                found.extend(item["VersionId"] for item in page.get("Versions", []) if item["Key"] == name)
        except self._errors as exc:
            raise self._failure(f"LIST VERSIONS {key}", exc) from exc
        return found[::-1]  # S3 lists newest first

    def versions(self, key: str) -> builtins.list[ObjectVersion]:
        described = (self._head(key, version) for version in self.version_ids(key))
        return [version for version in described if version is not None]  # None: deleted since the listing

    def delete(self, key: str, version: str) -> bool:
        if self._headers(key, version) is None:
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
        for key in sorted(key for key in keys if OBJECT_SUFFIX not in key):  # "~": an upload's declaration
            newest = self.head(key)
            if newest is not None:  # deleted since the listing
                yield newest

    def _declaration(self, key: str, upload_id: str) -> str:
        """The S3 name of the object holding an upload's declared SHA-256 (no key contains "~")."""
        return f"{self._name(key)}{OBJECT_SUFFIX}upload-{upload_id}"

    def _no_upload(self, key: str, upload_id: str, what: str, exc: Exception) -> ObjectStoreError:
        if _missing_upload(exc):
            return ObjectStoreError(f"object {key} has no upload {upload_id}")
        return self._failure(f"{what} {key} upload {upload_id}", exc)

    def begin_upload(self, key: str, sha256: str) -> str:
        _check_sha256(sha256)
        try:
            upload_id = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=self._name(key), Metadata={SHA256_METADATA: sha256}
            )["UploadId"]
            # S3 cannot tell an unfinished upload's metadata; complete_upload needs the declared SHA-256
            # before completing, to settle an existing object exactly like put_if_absent.
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._declaration(key, upload_id),
                Body=b"",
                Metadata={SHA256_METADATA: sha256},
            )
        except self._errors as exc:
            raise self._failure(f"starting an upload of {key}", exc) from exc
        return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> None:
        _check_part_number(number)
        try:
            self.client.upload_part(
                Bucket=self.bucket, Key=self._name(key), UploadId=upload_id, PartNumber=number, Body=data
            )
        except self._errors as exc:
            raise self._no_upload(key, upload_id, f"uploading part {number} of", exc) from exc

    def _declared(self, key: str, upload_id: str) -> str:
        try:
            answer = self.client.head_object(Bucket=self.bucket, Key=self._declaration(key, upload_id))
        except self._errors as exc:
            raise self._no_upload(key, upload_id, "reading the declared SHA-256 of", exc) from exc
        return answer.get("Metadata", {})[SHA256_METADATA]

    def _parts(self, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
        """An upload's parts: number -> (S3 ETag, size)."""
        try:
            pages = self.client.get_paginator("list_parts").paginate(
                Bucket=self.bucket, Key=self._name(key), UploadId=upload_id
            )
            return {
                part["PartNumber"]: (part["ETag"], part["Size"]) for page in pages for part in page.get("Parts", [])
            }
        except self._errors as exc:
            raise self._no_upload(key, upload_id, "listing the parts of", exc) from exc

    def _drop_declaration(self, key: str, upload_id: str) -> None:
        name = self._declaration(key, upload_id)
        try:
            found = self.client.list_object_versions(Bucket=self.bucket, Prefix=name)
            for item in [*found.get("Versions", []), *found.get("DeleteMarkers", [])]:
                if item["Key"] == name:
                    self.client.delete_object(Bucket=self.bucket, Key=name, VersionId=item["VersionId"])
        except self._errors as exc:
            raise self._failure(f"dropping the declaration of {key} upload {upload_id}", exc) from exc

    def complete_upload(self, key: str, upload_id: str, parts: int) -> ObjectVersion:
        declared = self._declared(key, upload_id)
        listed = self._parts(key, upload_id)
        _check_parts(key, upload_id, {number: size for number, (_, size) in listed.items()}, parts)
        manifest: Any = {"Parts": [{"PartNumber": n, "ETag": listed[n][0]} for n in range(1, parts + 1)]}

        def complete() -> ObjectVersion:
            # The declaration goes first: should this process die now, the upload is still
            # listed by uploads() (for a collector to abort) and nothing is left unlisted.
            self._drop_declaration(key, upload_id)
            answer = self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=self._name(key), UploadId=upload_id, MultipartUpload=manifest, IfNoneMatch="*"
            )
            # S3 cannot check a whole multipart object's SHA-256, so the new version is read back.
            try:
                return self.verify(key, answer["VersionId"])
            except ObjectCorrupt:
                self.delete(key, answer["VersionId"])
                raise

        return self._create(
            key, f"completing upload {upload_id} of", lambda: _settle_upload(self, key, upload_id, declared), complete
        )

    def abort_upload(self, key: str, upload_id: str) -> None:
        # The declaration goes first, so an upload whose abort fails half-way is still listed by uploads().
        self._drop_declaration(key, upload_id)
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._name(key), UploadId=upload_id)
        except self._errors as exc:
            if not _missing_upload(exc):
                raise self._failure(f"aborting {key} upload {upload_id}", exc) from exc

    def uploads(self, key: str) -> builtins.list[str]:
        name = self._name(key)
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=name)
            # S3 lists a key's uploads in the order they were started.
            return [item["UploadId"] for page in pages for item in page.get("Uploads", []) if item["Key"] == name]
        except self._errors as exc:
            raise self._failure(f"LIST UPLOADS {key}", exc) from exc
