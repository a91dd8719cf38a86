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
"""

from __future__ import annotations

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
from typing import Protocol

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
