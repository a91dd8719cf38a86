"""Payload commit proofs: Ed25519 signatures over a proof's canonical bytes.

An attester (keyload/sdk/payloads.py) checks a stored object and signs what it found;
CommitLargeSchedule verifies the signature without calling the object store. The
signing key of a key id is derived from its keyring material (HMAC-SHA256 with a
fixed label gives the Ed25519 seed), so the keyring stays one file of secrets and a
proof key id is rotated like any other (RotateKeys). Canonical bytes are JSON with
sorted keys and no spaces, the SHA-256 in hex: any language can rebuild them.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from keyload.bodies import PayloadCommitProof

PROOF_FORMAT = "keyload.PayloadCommitProof/1"
SEED_LABEL = b"keyload payload commit proof seed v1"
SIGNED_FIELDS = (
    "domain",
    "reservation_id",
    "object_key",
    "object_version",
    "length",
    "sha256",
    "trust_set_version",
    "key_id",
    "attested_at_ms",
)


def canonical_bytes(proof: Mapping[str, Any]) -> bytes:
    """What the signature covers: every field but the signature, and the format name. The fields are
    read by name from a mapping: an attester signs its proof before it has the signature a
    `PayloadCommitProof` requires."""
    fields = {name: proof[name] for name in SIGNED_FIELDS}
    fields["sha256"] = bytes(fields["sha256"]).hex()
    fields["format"] = PROOF_FORMAT
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _seed(material: bytes) -> bytes:
    return hmac.new(material, SEED_LABEL, hashlib.sha256).digest()


def signing_key(material: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_seed(material))


@functools.lru_cache(maxsize=64)
def _public_key(material: bytes) -> Ed25519PublicKey:
    return signing_key(material).public_key()


def sign(material: bytes, proof: Mapping[str, Any]) -> bytes:
    return signing_key(material).sign(canonical_bytes(proof))


def signature_valid(keyring: Mapping[str, bytes], proof: PayloadCommitProof) -> bool:
    """Whether the keyring key the proof names signed exactly these fields."""
    material = keyring.get(proof.key_id)
    if material is None:
        return False
    try:
        # The dict of its fields, as `sign` received them: the same canonical bytes.
        _public_key(material).verify(proof.signature, canonical_bytes(proof.to_avro()))
    except InvalidSignature:
        return False
    return True
