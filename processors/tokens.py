"""Delivery tokens: HMAC-signed, principal-bound capabilities for one lease of one message.

A token names the key that signed it, the queue incarnation, the message, the
principal it was issued to, the delivery generation and the lease version. It is
verified against the keyring and the projection, never stored as authority: the
message metadata decides whether the lease it names is still the current one.

Wire form: "v1." + base64url(payload | mac), payload =
u8 key id length | key id | u64 incarnation | u64 delivery generation |
u64 lease version | u16 message id length | message id | u16 principal length |
principal; mac = HMAC-SHA256(key, payload | domain | 0x00 | queue name).

"v2." tokens (a queue's, from feature level 4) append u64 enqueue sequence to the payload. From
that level a finished message's id becomes new after its domain's receipt horizon, so a message id
alone no longer names one message: the enqueue sequence does, and a token of an earlier message
under the id never names a lease of a later one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from keyload.processors.errors import ErrorCode, Rejected

PREFIX = "v1."
PREFIX_V2 = "v2."  # with the message's enqueue sequence
assert len(PREFIX_V2) == len(PREFIX), "parse strips either prefix by the same length"
MAC_BYTES = 32
MAX_TOKEN_CHARS = 1024
_U64x3 = struct.Struct(">QQQ")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")

Keyring = Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class Token:
    key_id: str
    incarnation: int
    delivery_generation: int
    lease_version: int
    message_id: str
    principal: str
    enqueue_sequence: int | None  # None: a v1 token
    payload: bytes
    mac: bytes


def _invalid() -> Rejected:
    return Rejected(ErrorCode.TOKEN_INVALIDATED, "delivery token is not valid")


def _mac(key: bytes, payload: bytes, domain: str, queue: str) -> bytes:
    scope = domain.encode("utf-8") + b"\x00" + queue.encode("utf-8")
    return hmac.new(key, payload + scope, hashlib.sha256).digest()


def issue(
    keyring: Keyring,
    key_id: str,
    *,
    domain: str,
    queue: str,
    incarnation: int,
    message_id: str,
    principal: str,
    delivery_generation: int,
    lease_version: int,
    enqueue_sequence: int | None = None,
) -> str:
    """A v1 token, or a v2 token when the message's `enqueue_sequence` is given."""
    encoded_key = key_id.encode("utf-8")
    encoded_id = message_id.encode("utf-8")
    encoded_principal = principal.encode("utf-8")
    payload = (
        bytes([len(encoded_key)])
        + encoded_key
        + _U64x3.pack(incarnation, delivery_generation, lease_version)
        + _U16.pack(len(encoded_id))
        + encoded_id
        + _U16.pack(len(encoded_principal))
        + encoded_principal
    )
    prefix = PREFIX
    if enqueue_sequence is not None:
        prefix, payload = PREFIX_V2, payload + _U64.pack(enqueue_sequence)
    mac = _mac(keyring[key_id], payload, domain, queue)
    return prefix + base64.urlsafe_b64encode(payload + mac).decode("ascii").rstrip("=")


def parse(token: str) -> Token:
    """The token's fields, unverified; TokenInvalidated if it is not a token at all."""
    version_2 = token.startswith(PREFIX_V2)
    if not (version_2 or token.startswith(PREFIX)) or len(token) > MAX_TOKEN_CHARS:
        raise _invalid()
    text = token[len(PREFIX) :]
    enqueue_sequence = None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        at = 1 + payload[0]
        key_id = payload[1:at].decode("utf-8")
        incarnation, generation, lease_version = _U64x3.unpack_from(payload, at)
        at += _U64x3.size
        (id_length,) = _U16.unpack_from(payload, at)
        message_id = payload[at + 2 : at + 2 + id_length].decode("utf-8")
        at += 2 + id_length
        (principal_length,) = _U16.unpack_from(payload, at)
        principal = payload[at + 2 : at + 2 + principal_length].decode("utf-8")
        at += 2 + principal_length
        if version_2:
            (enqueue_sequence,) = _U64.unpack_from(payload, at)
            at += _U64.size
    except (binascii.Error, ValueError, IndexError, struct.error, UnicodeDecodeError):
        raise _invalid() from None
    if at != len(payload) or len(mac) != MAC_BYTES or len(message_id.encode("utf-8")) != id_length:
        raise _invalid()
    return Token(key_id, incarnation, generation, lease_version, message_id, principal, enqueue_sequence, payload, mac)


def verify_signature(key: bytes | None, token: Token, domain: str, queue: str) -> None:
    """TokenInvalidated unless `key`, the service key the token names (None: it names none,
    processors/access.py `service_key`), signed exactly this token for this queue."""
    if key is None or not hmac.compare_digest(_mac(key, token.payload, domain, queue), token.mac):
        raise _invalid()
