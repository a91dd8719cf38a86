"""Principal credentials and the records they vouch for (DESIGN.md §9).

A credential is what a client holds: its principal's name, the id of its key and the key's
bytes. The service's keyring holds the same key under the same id (keyload/storage/keyring.py);
the log and the projection hold only the id. A client signs every command it sends with its key
and accepts only outcomes sealed with it, so neither a command nor a reply can be forged by
someone who can write to the log but lacks the key.

Signed record (`keyload.Signed`, schemas/): `{key_id, mac, record}`, where `record` is the
single-object encoding of a `keyload.Command` (a signed command) or of a `keyload.Outcome` (an
outcome sealed for the principal whose command it answers) and `mac` is HMAC-SHA256 under the key
`key_id` names, over exactly those bytes. Any language can sign: encode the Command as usual, MAC
its bytes, wrap them. HMAC was chosen by measurement (docs/ARCHITECTURE.md, access control): a
verification costs about 2 µs of processor CPU per command, an Ed25519 one about 130 µs.

    DATA/credentials/<principal>.json   {"format": 1, "principal": P, "key_id": K, "secret": "<base64>"}

written mode 0600 by `keyload principal create` (and, for the administrator, by the creation of
the data directory). Give a client its file, nothing else of the data directory.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from keyload.errors import KeyloadError
from keyload.log.codec import HEADER_BYTES, REGISTRY, CodecError

SIGNED = "keyload.Signed"
FORMAT = 1
FOLDER = "credentials"
ADMIN_PRINCIPAL = "keyload-admin"  # the administrator a new data directory is created with
BEARER_PARTS = 3  # principal, key id, secret


class CredentialError(KeyloadError):
    """A credential file is missing or malformed."""


KEYED_HMACS = 1024  # keys whose HMAC state is kept ready (a principal's, for the commands and outcomes it signs)


@functools.lru_cache(maxsize=KEYED_HMACS)
def _keyed(key: bytes) -> hmac.HMAC:
    """HMAC-SHA256 with `key` absorbed: a copy of it saves the key schedule of every MAC (a third of
    one over a short outcome)."""
    return hmac.new(key, digestmod=hashlib.sha256)


def mac(key: bytes, record: bytes) -> bytes:
    """HMAC-SHA256 of `record` under `key`."""
    keyed = _keyed(key).copy()
    keyed.update(record)
    return keyed.digest()


def _unpadded_base64url(secret: bytes) -> str:
    return base64.urlsafe_b64encode(secret).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class Credential:
    principal: str
    key_id: str
    secret: bytes = field(repr=False)

    def sign(self, record: bytes) -> bytes:
        """`record` (a single-object-encoded Command) signed: the `keyload.Signed` log record."""
        return signed(self.key_id, self.secret, record)

    def seals(self, value: bytes) -> bool:
        """Whether `value`, an outcome record, is sealed with this credential's key: the service's answer."""
        signed = unwrap(value)
        return signed is not None and signed.key_id == self.key_id and signed.verify(self.secret)

    @property
    def bearer_token(self) -> str:
        """The credential as the HTTP API's bearer token: `PRINCIPAL:KEY_ID:SECRET`, the secret in
        unpadded base64url (`Authorization: Bearer <token>`, docs/ARCHITECTURE.md §10a)."""
        return f"{self.principal}:{self.key_id}:{_unpadded_base64url(self.secret)}"

    @classmethod
    def from_bearer_token(cls, token: str) -> Credential:
        """The credential a bearer token carries; CredentialError (never echoing it) when malformed.

        The secret must be exactly what `bearer_token` writes: a character outside the base64url
        alphabet, padding, or trailing bits that are not zero make it malformed, so one secret has
        one spelling (a lenient decoder would skip such characters and accept many)."""
        parts = token.split(":")
        if len(parts) != BEARER_PARTS or not all(parts):
            raise CredentialError("a bearer token is PRINCIPAL:KEY_ID:SECRET")
        principal, key_id, secret = parts
        try:
            key = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))
        except (binascii.Error, ValueError):
            raise CredentialError("the bearer token's secret is not unpadded base64url") from None
        if _unpadded_base64url(key) != secret:
            raise CredentialError("the bearer token's secret is not unpadded base64url")
        return cls(principal, key_id, key)

    def to_json(self) -> bytes:
        secret = base64.b64encode(self.secret).decode("ascii")
        text = {"format": FORMAT, "principal": self.principal, "key_id": self.key_id, "secret": secret}
        return (json.dumps(text, indent=2) + "\n").encode("utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Credential:
        """The credential of a file; CredentialError (never echoing the file's bytes) otherwise."""
        try:
            raw = json.loads(Path(path).read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise CredentialError(f"no credential at {path}") from None
        except OSError as exc:
            raise CredentialError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError:
            raise CredentialError(f"{path} is not a credential (not JSON)") from None
        fields = ("principal", "key_id", "secret")
        if (
            not isinstance(raw, dict)
            or raw.get("format") != FORMAT
            or not all(isinstance(raw.get(f), str) for f in fields)
        ):
            raise CredentialError(f"{path} is not a format {FORMAT} credential")
        try:
            secret = base64.b64decode(raw["secret"], validate=True)
        except (binascii.Error, ValueError):
            raise CredentialError(f"{path}: the secret is not base64") from None
        return cls(raw["principal"], raw["key_id"], secret)


def credential_path(root: Path, principal: str) -> Path:
    return root / FOLDER / f"{principal}.json"


@dataclass(frozen=True, slots=True)
class SignedRecord:
    key_id: str
    mac: bytes
    record: bytes

    def verify(self, key: bytes) -> bool:
        return hmac.compare_digest(mac(key, self.record), self.mac)


# The Signed record is on every command's and outcome's path, so it is written and read here, field by
# field, rather than through fastavro: three Avro `bytes`/`string` fields, each a zigzag varint length
# and the bytes (tests/test_credentials.py checks both against the registry's codec).
_HEADER = REGISTRY.encode(SIGNED, {"key_id": "", "mac": b"", "record": b""})[:HEADER_BYTES]


def _length(value: int) -> bytes:
    """The Avro long `value` (≥ 0), zigzag varint encoded."""
    if value < 0x40:  # one byte: a key id, a MAC
        return bytes((value << 1,))
    zigzag, out = value << 1, bytearray()
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


_MAC_LENGTH = _length(hashlib.sha256().digest_size)  # every MAC is one HMAC-SHA256


def signed(key_id: str, key: bytes, record: bytes) -> bytes:
    """The `keyload.Signed` record of `record` (a Command, or an Outcome sealed for the principal
    whose key this is) under the key `key_id` names."""
    name = key_id.encode("utf-8")
    return b"".join((_HEADER, _length(len(name)), name, _MAC_LENGTH, mac(key, record), _length(len(record)), record))


def _field(value: bytes, at: int) -> tuple[bytes, int]:
    """The Avro `bytes` at `at` and where the next field starts; CodecError when it is cut short."""
    if at < len(value) and value[at] < 0x80 and not value[at] & 1:  # one byte, not negative: a key id, a MAC
        length, at = value[at] >> 1, at + 1
        if at + length > len(value):
            raise CodecError("malformed keyload.Signed body: a field runs past the record")
        return value[at : at + length], at + length
    zigzag, shift = 0, 0
    while True:
        if at >= len(value) or shift > 63:
            raise CodecError("malformed keyload.Signed body: a length is cut short")
        byte = value[at]
        at += 1
        zigzag |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    length = (zigzag >> 1) ^ -(zigzag & 1)
    if length < 0 or at + length > len(value):
        raise CodecError("malformed keyload.Signed body: a field runs past the record")
    return value[at : at + length], at + length


def unwrap(value: bytes) -> SignedRecord | None:
    """The signed record `value` is, or None when it is not one (a plain Command or Outcome).
    CodecError when it claims to be one and is malformed."""
    if value[:HEADER_BYTES] != _HEADER:
        return None
    key_id, at = _field(value, HEADER_BYTES)
    digest, at = _field(value, at)
    record, at = _field(value, at)
    if at != len(value):
        raise CodecError(f"malformed keyload.Signed body: {len(value) - at} trailing bytes")
    try:
        return SignedRecord(key_id.decode("utf-8"), digest, record)
    except UnicodeDecodeError:
        raise CodecError("malformed keyload.Signed body: the key id is not UTF-8") from None


def contents(value: bytes) -> bytes:
    """The record a signed record holds, or `value` itself when it is not one."""
    signed_record = unwrap(value)
    return value if signed_record is None else signed_record.record
