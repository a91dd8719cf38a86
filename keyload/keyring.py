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

FILE = "keyring.json"
FORMAT = 1
KEY_BYTES = 32
MIN_KEY_BYTES = 16


class KeyringError(Exception):
    """The keyring file is missing or malformed."""


def create(root: Path) -> None:
    """Write a keyring holding one new random key under the default id, if there is none."""
    path = root / FILE
    if path.exists():
        return
    keys = {DEFAULT_KEY_ID: base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")}
    temporary = root / (FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump({"format": FORMAT, "keys": keys}, file, indent=2)
        file.write("\n")
    os.replace(temporary, path)


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
