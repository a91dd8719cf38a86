"""The keyring file: key material by key id, kept outside the log.

    DATA/keyring.json   {"format": 1, "keys": {"k0": "<base64 of 32 random bytes>", ...}}

Processors reference keys by id only (the active ids are partition state, set by
the logged RotateKeys command). Keep every key a log still references: a replay
needs them. Copy this file with the data directory when moving or restoring it.
The file is written with mode 0600 (`write_private`), copies too (`copy`).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from keyload.errors import KeyloadError
from keyload.limits import KEY_ID_PATTERN, KEY_ID_RULE
from keyload.processors.key_rotation import DEFAULT_KEY_ID

FILE = "keyring.json"
LOCK_FILE = "keyring.lock"
FORMAT = 1
KEY_BYTES = 32
MIN_KEY_BYTES = 16
PRIVATE_MODE = 0o600  # key material and the data directory's files: the owner only


class KeyringError(KeyloadError):
    """The keyring file is missing or malformed."""


def create(root: Path) -> None:
    """Write a keyring holding one new random key under the default id, if there is none."""
    if not (root / FILE).exists():
        _write(root, {DEFAULT_KEY_ID: base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")})


def copy(source: Path, root: Path) -> None:
    """Install a copy of the keyring file `source` as `root`'s keyring (mode 0600), once it reads as one."""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise KeyringError(f"cannot read {source}: {exc.strerror or exc}") from None
    _parse(data, source)
    write_private(root / FILE, data)


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically, readable by the owner only (0600) from the first byte.

    The bytes go to a temporary of a name of its own (so concurrent writers never share one),
    created with mode 0600, are fsynced, and the temporary is renamed over `path`.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _write(root: Path, keys: dict[str, str]) -> None:
    write_private(root / FILE, (json.dumps({"format": FORMAT, "keys": keys}, indent=2) + "\n").encode("utf-8"))


def add(root: Path, key_id: str, *, exist_ok: bool = False) -> bytes:
    """Add a new random key and return it; existing keys are never replaced (logs may still
    reference them): one is refused, or with `exist_ok` returned (an issuance sent again finds the
    key its first attempt added). Writers of the keyring (processes, threads) take turns on
    DATA/keyring.lock, so two additions at once both land."""
    if not KEY_ID_PATTERN.fullmatch(key_id):
        raise KeyringError(KEY_ID_RULE)
    with _writing(root):
        keys = load(root)
        if key_id in keys:
            if exist_ok:
                return keys[key_id]
            raise KeyringError(f"key {key_id!r} already exists")
        current = {k: base64.b64encode(v).decode("ascii") for k, v in keys.items()}
        key = os.urandom(KEY_BYTES)
        current[key_id] = base64.b64encode(key).decode("ascii")
        _write(root, current)
    return key


@contextmanager
def _writing(root: Path) -> Iterator[None]:
    """An exclusive lock on DATA/keyring.lock, held across a read-modify-write of the keyring."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def load(root: Path) -> dict[str, bytes]:
    path = root / FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KeyringError(f"no keyring at {path}") from None
    except OSError as exc:
        raise KeyringError(f"cannot read {path}: {exc.strerror or exc}") from None
    return _parse(data, path)


def _parse(data: bytes, path: Path) -> dict[str, bytes]:
    """The keys of a keyring file's bytes; KeyringError if they are not a keyring (never echoing them)."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except ValueError:
        raise KeyringError(f"{path} is not a keyring (not JSON)") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or not isinstance(raw.get("keys"), dict):
        raise KeyringError(f"{path} is not a format {FORMAT} keyring")
    keyring = {}
    for key_id, text in raw["keys"].items():
        try:
            material = base64.b64decode(text, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise KeyringError(f"{path}: key {key_id!r} is not base64") from None
        if len(material) < MIN_KEY_BYTES:
            raise KeyringError(f"{path}: key {key_id!r} is shorter than {MIN_KEY_BYTES} bytes")
        keyring[key_id] = material
    return keyring


class LiveKeyring(Mapping[str, bytes]):
    """The keyring of a running service as a mapping: a key id it lacks makes it read the file again
    when the file has changed since (a principal created, a key added for RotateKeys), so a
    long-running reader sees new keys without rereading the file on every lookup."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()  # readers on several threads (the event loop, its workers)
        self._stamp = self._file_stamp()
        self._keys = load(root)

    def __getitem__(self, key_id: str) -> bytes:
        keys = self._keys
        if key_id not in keys:
            with self._lock:
                stamp = self._file_stamp()
                if stamp != self._stamp:
                    self._keys = load(self._root)  # the stamp moves only once the new keys are read
                    self._stamp = stamp
                keys = self._keys
        return keys[key_id]

    def __contains__(self, key_id: object) -> bool:
        if not isinstance(key_id, str):
            return False
        try:
            self[key_id]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def _file_stamp(self) -> tuple[int, int]:
        status = os.stat(self._root / FILE)
        return status.st_mtime_ns, status.st_ino
