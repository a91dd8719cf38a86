"""Signed capabilities for payload objects: read handles (in deliveries) and upload handles.

A handle names one object and an expiry and is signed with HMAC-SHA256 by a keyring
key, so whoever serves the object (keyload/sdk/payloads.py) can check it without the
projection. Callers never choose the object: the handle does. Read handles are
issued by the processor (deterministically: they are part of a Receive outcome);
upload handles are issued outside the log and are never stored anywhere.

Wire form: PREFIX + base64url(canonical JSON) + "." + base64url(HMAC(key, PREFIX + JSON)).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

MAX_HANDLE_CHARS = 4096


class HandleError(Exception):
    """Not a valid handle of this kind: unsigned, tampered, unknown key, or malformed."""


@dataclass(frozen=True, slots=True)
class ReadHandle:
    key_id: str
    domain: str
    object_key: str
    object_version: str
    expires_ms: int


@dataclass(frozen=True, slots=True)
class UploadHandle:
    key_id: str
    domain: str
    partition: int
    reservation_id: int
    object_key: str
    length: int
    sha256: str  # hex
    expires_ms: int  # the reservation's upload deadline
    trust_set_version: int
    trust_key_id: str


Handle = TypeVar("Handle", ReadHandle, UploadHandle)
PREFIXES: dict[type[Any], str] = {ReadHandle: "kr1.", UploadHandle: "ku1."}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, prefix: str, payload: bytes) -> bytes:
    return hmac.new(key, prefix.encode("ascii") + payload, hashlib.sha256).digest()


def issue(keyring: Mapping[str, bytes], handle: ReadHandle | UploadHandle) -> str:
    prefix = PREFIXES[type(handle)]
    payload = json.dumps(asdict(handle), sort_keys=True, separators=(",", ":")).encode("utf-8")
    return prefix + _b64(payload) + "." + _b64(_mac(keyring[handle.key_id], prefix, payload))


def open_handle(keyring: Mapping[str, bytes], text: str, kind: type[Handle]) -> Handle:
    """The handle's fields once its signature is verified (its expiry is the caller's to check)."""
    prefix = PREFIXES[kind]
    if not text.startswith(prefix) or len(text) > MAX_HANDLE_CHARS or text.count(".") != 2:
        raise HandleError(f"not a {kind.__name__}")
    body, mac_text = text[len(prefix) :].split(".")
    try:
        payload, mac = _unb64(body), _unb64(mac_text)
        raw = json.loads(payload)
        if not isinstance(raw, dict) or set(raw) != {f.name for f in fields(kind)}:
            raise ValueError("fields")
        if not all(isinstance(raw[f.name], int if f.type == "int" else str) for f in fields(kind)):
            raise ValueError("field types")
        handle = kind(**raw)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise HandleError(f"not a {kind.__name__}") from None
    key = keyring.get(handle.key_id)
    if key is None or not hmac.compare_digest(_mac(key, prefix, payload), mac):
        raise HandleError(f"{kind.__name__} signature is not valid")
    return handle
