"""Which keyring keys a partition signs tokens and draws retry jitter with.

The choice is state, changed only by the logged RotateKeys command, so a replay
signs with exactly the keys the live run used. Key material stays in the
keyring file (DATA/keyring.json); the log and the projection hold only ids.
"""

from __future__ import annotations

from collections.abc import Mapping

from keyload import limits
from keyload.bodies import RotateKeys
from keyload.log.codec import Record
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.projections import keys
from keyload.projections.store import Readable, Staged

TOKEN = keys.META + b"token_key_id"
JITTER = keys.META + b"jitter_key_id"
PROOF = keys.META + b"proof_key_id"  # signs payload commit proofs (processors/payloads/proofs.py)
TRUST_SET_VERSION = keys.META + b"trust_set_version"  # u64, absent: 1; +1 whenever PROOF changes
DEFAULT_KEY_ID = "k0"  # the key a new data directory's keyring is created with


class MissingKey(Exception):
    """The projection names a key id the keyring does not hold: processing cannot go on."""


def active_key_id(stage: Readable, purpose: bytes) -> str:
    raw = stage.get(purpose)
    return DEFAULT_KEY_ID if raw is None else raw.decode("utf-8")


def active_key(stage: Readable, keyring: Mapping[str, bytes], purpose: bytes) -> tuple[str, bytes]:
    key_id = active_key_id(stage, purpose)
    key = keyring.get(key_id)
    if key is None:
        raise MissingKey(f"keyring has no key {key_id!r}; restore it to the keyring file")
    return key_id, key


def trust_set(stage: Readable) -> tuple[int, str]:
    """(version, key id) of the payload-proof trust set: a reservation pins both."""
    raw = stage.get(TRUST_SET_VERSION)
    return (1 if raw is None else keys.read_u64(raw)), active_key_id(stage, PROOF)


def rotate_keys(stage: Staged, body: RotateKeys, ctx: Context) -> Record:
    chosen = (
        (TOKEN, "token_key_id", body.token_key_id),
        (JITTER, "jitter_key_id", body.jitter_key_id),
        (PROOF, "proof_key_id", body.proof_key_id),
    )
    for purpose, name, key_id in chosen:
        if key_id is None:
            continue
        if not 1 <= len(key_id) <= limits.MAX_KEY_ID_CHARS:
            raise Rejected(ErrorCode.VALIDATION, f"{name} must be 1..{limits.MAX_KEY_ID_CHARS} characters")
        if stage.get(keys.principal_key(key_id)) is not None:
            raise Rejected(ErrorCode.VALIDATION, f"{name} names a principal's key: its holder could sign with it")
        if key_id not in ctx.keyring:
            # Not a rejection: whether a key exists is configuration, and a replay with the
            # key present would decide differently. The runtime reloads the keyring or halts.
            raise MissingKey(f"keyring has no key {key_id!r}")
        if purpose == PROOF and key_id != active_key_id(stage, PROOF):
            stage.put(TRUST_SET_VERSION, keys.u64(trust_set(stage)[0] + 1))
        stage.put(purpose, key_id.encode("utf-8"))
    version, proof_key_id = trust_set(stage)
    return {
        "token_key_id": active_key_id(stage, TOKEN),
        "jitter_key_id": active_key_id(stage, JITTER),
        "proof_key_id": proof_key_id,
        "trust_set_version": version,
    }
