"""Authentication at the edge: a request's bearer token is a principal's credential, checked against
the service's keyring and policy before anything is appended.

The check mirrors the processor's (`keyload.processors.access.verify`): the key id must be in the
keyring with exactly the secret presented, and the partition's policy must hold the principal
enabled and signing with that key id. Anything else is 401 with one detail that does not say which
part failed, and nothing is appended. The processor still authenticates and authorizes the
command the server signs with the credential (the policy may change between this check and the
command's log position): that decision is the authoritative one.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict

from keyload import limits
from keyload.bounded import remember
from keyload.credentials import Credential, CredentialError
from keyload.processors.access import UNKNOWN_SIGNER, load_principal
from keyload.projections.store import Readable
from keyload.storage.keyring import LiveKeyring

ACCEPTED_TOKENS = 1024  # bearer tokens accepted (keyring and policy), kept parsed (oldest out first)


class Unauthenticated(Exception):
    """The request carries no credential, or one the service does not accept (HTTP 401)."""


class Authenticator:
    def __init__(self, keys: LiveKeyring) -> None:
        self.keys = keys
        # Every request of a client carries the same token: its parse is kept once the token has
        # been accepted (the checks run on every request all the same). Refused tokens are not kept,
        # so a caller sending made-up ones grows nothing.
        self._accepted: OrderedDict[str, Credential] = OrderedDict()

    def credential(self, authorization: str | None, policy: Readable | None) -> Credential:
        """The credential of an `Authorization` header, proven against the keyring and the policy
        of `policy` (the projection of the partition the command goes to; None: the keyring alone)."""
        if authorization is None:
            raise Unauthenticated("the request has no credential: send Authorization: Bearer PRINCIPAL:KEY_ID:SECRET")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must be Bearer PRINCIPAL:KEY_ID:SECRET")
        token = token.strip()
        credential = self._accepted.get(token) or _parsed(token)
        if len(credential.principal) > limits.MAX_PRINCIPAL_CHARS:  # never a principal's: not looked up
            raise Unauthenticated(UNKNOWN_SIGNER)
        key = self.keys.get(credential.key_id)
        if key is None or not hmac.compare_digest(key, credential.secret):
            raise Unauthenticated(UNKNOWN_SIGNER)
        if policy is not None:
            record = load_principal(policy, credential.principal)
            if record is None or not record.enabled or record.key_id != credential.key_id:
                raise Unauthenticated(UNKNOWN_SIGNER)
        remember(self._accepted, token, credential, ACCEPTED_TOKENS)
        return credential


def _parsed(token: str) -> Credential:
    try:
        return Credential.from_bearer_token(token)
    except CredentialError as exc:
        raise Unauthenticated(str(exc)) from None
