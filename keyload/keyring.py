"""The keyring file: key material by key id, kept outside the log.

    DATA/keyring.json   {"format": 1, "keys": {"k0": "<base64 of 32 random bytes>", ...}}

Processors reference keys by id only (the active ids are partition state, set by
the logged RotateKeys command). Keep every key a log still references: a replay
needs them. Copy this file with the data directory when moving or restoring it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path

from keyload.processors.key_rotation import DEFAULT_KEY_ID
from keyload.processors.limits import MAX_KEY_ID_CHARS

FILE = "keyring.json"
FORMAT = 1
KEY_BYTES = 32
MIN_KEY_BYTES = 16


class KeyringError(Exception):
    """The keyring file is missing or malformed."""


def create(root: Path) -> None:
    """Write a keyring holding one new random key under the default id, if there is none."""
    if not (root / FILE).exists():
        _write(root, {DEFAULT_KEY_ID: base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")})


def _write(root: Path, keys: dict[str, str]) -> None:
    temporary = root / (FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump({"format": FORMAT, "keys": keys}, file, indent=2)
        file.write("\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, root / FILE)


def add(root: Path, key_id: str) -> None:
    """Add a new random key; existing keys are never replaced (logs may still reference them)."""
    current = {k: base64.b64encode(v).decode("ascii") for k, v in load(root).items()}
    if key_id in current:
        raise KeyringError(f"key {key_id!r} already exists")
    if not 1 <= len(key_id) <= MAX_KEY_ID_CHARS or not key_id.isascii() or not key_id.isprintable():
        raise KeyringError(f"key ids are 1..{MAX_KEY_ID_CHARS} printable ASCII characters")
    current[key_id] = base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")
    _write(root, current)


def load(root: Path) -> dict[str, bytes]:
    path = root / FILE
    try:
        raw = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise KeyringError(f"no keyring at {path}") from None
    except (OSError, ValueError) as exc:
        raise KeyringError(f"cannot read {path}: {exc}") from exc
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
