"""Principal keys in the keyring, and the credential files clients are given.

The service's own principals are declared here once (`SYSTEM_PRINCIPALS`): the administrator a
new data directory comes with, the ticker and the GC worker, each with exactly the capability it
needs on every domain (the checkpoint publisher records each checkpoint it publishes, which is what
the GC worker's recovery floor may name). Their keys are keyring keys under fixed ids, so every processor given a
copy of the keyring (`--keyring-from`) installs the same ones and appends the same
EnableAccessControl command (keyload/service/access_control.py). The administrator's credential
is also written to DATA/credentials/keyload-admin.json (0600): the local operator's `Client` and
CLI use it unless told otherwise. The other system principals never leave the service: it signs
with their keyring keys directly.

A principal created later (`keyload principal create`) gets a new random keyring key and a
credential file of its own. In Kafka mode every processor needs that key: copy the keyring to
each of them before the principal signs its first command (a processor lacking a key the policy
names halts its partition rather than decide differently from the others).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from keyload.commands import Capability
from keyload.credentials import ADMIN_PRINCIPAL, FOLDER, Credential, CredentialError, credential_path
from keyload.processors.principals import CHECKPOINTER_PRINCIPAL as CHECKPOINTER_PRINCIPAL
from keyload.processors.principals import GC_PRINCIPAL as GC_PRINCIPAL
from keyload.processors.principals import SERVICE_ACTORS as SERVICE_ACTORS
from keyload.processors.principals import TICKER_PRINCIPAL as TICKER_PRINCIPAL
from keyload.processors.principals import system_key_id as system_key_id
from keyload.storage import keyring

# The administrator (listed first: it signs EnableAccessControl), then the service's actors
# (processors/principals.py): the service signs their commands with their fixed keys
# (`system_credential`), so their keys are never rotated (a rotated actor's commands would be refused
# for good); the administrator's may be.
SYSTEM_PRINCIPALS: tuple[tuple[str, Capability], ...] = ((ADMIN_PRINCIPAL, Capability.admin), *SERVICE_ACTORS.items())
FOLDER_MODE = 0o700
# A principal with a credential file: its name is the file's name.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KEY_ID_RANDOM_BYTES = 8


def ensure_system(root: Path) -> None:
    """Add the system principals' keys the keyring lacks, and write the administrator's credential
    file if there is none (a directory created before access control gets them at its next run)."""
    keys = keyring.load(root)
    for principal, _ in SYSTEM_PRINCIPALS:
        if system_key_id(principal) not in keys:
            keyring.add(root, system_key_id(principal))
    if not credential_path(root, ADMIN_PRINCIPAL).exists():
        write_credential(root, system_credential(root, ADMIN_PRINCIPAL))


def system_credential(root: Path, principal: str) -> Credential:
    key_id = system_key_id(principal)
    key = keyring.load(root).get(key_id)
    if key is None:
        raise CredentialError(f"the keyring of {root} has no key {key_id!r}; `keyload run` adds it")
    return Credential(principal, key_id, key)


def new_credential(root: Path, principal: str, key_id: str | None = None) -> Credential:
    """A credential for `principal` not yet written anywhere else: the caller writes its file
    (`write_credential`) once the principal signs with it, so a refused change never replaces a
    working credential file. Its key is a new random keyring key, or the keyring's `key_id`, added
    beforehand (`keyload keys add`) so that every Kafka processor's keyring can hold it before a
    command names it. Keys are never removed from the keyring (the log still holds commands they
    signed)."""
    _check_file_name(principal)
    if key_id is None:
        key_id = f"p-{os.urandom(KEY_ID_RANDOM_BYTES).hex()}"
        return Credential(principal, key_id, keyring.add(root, key_id))
    key = keyring.load(root).get(key_id)
    if key is None:
        raise CredentialError(f"the keyring of {root} has no key {key_id!r}: add it with `keyload keys add {key_id}`")
    return Credential(principal, key_id, key)


def issued_key_id(caller: str, principal: str, command_id: str) -> str:
    """The id of the key one issuance makes (its secret is random, made once)."""
    issuance = json.dumps([caller, principal, command_id])
    return f"p-{hashlib.sha256(issuance.encode('utf-8')).hexdigest()[: 2 * KEY_ID_RANDOM_BYTES]}"


def issued_credential(root: Path, caller: str, principal: str, command_id: str) -> Credential:
    """A credential for `principal` on the key of one issuance (its caller, principal and command
    id): added to the keyring the first time, found there when the issuance is sent again, so a
    repeat (a server's request sent again by its Idempotency-Key, an operator's command sent again
    by its id after a failure part-way) names the same key, makes the same PutPrincipal and is
    answered its stored outcome with the same credential."""
    _check_file_name(principal)
    key_id = issued_key_id(caller, principal, command_id)
    return Credential(principal, key_id, keyring.add(root, key_id, exist_ok=True))


def _check_file_name(principal: str) -> None:
    if FILE_NAME.fullmatch(principal) is None:
        raise CredentialError(
            "a principal with a credential file is named by 1..128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def write_credential(root: Path, credential: Credential) -> Path:
    """The credential's file, DATA/credentials/<principal>.json (0600, in a 0700 folder)."""
    folder = root / FOLDER
    folder.mkdir(FOLDER_MODE, exist_ok=True)
    path = credential_path(root, credential.principal)
    keyring.write_private(path, credential.to_json())
    return path
