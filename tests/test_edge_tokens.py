"""The edge's authenticator (keyload/server/auth.py) keeps the parse of bearer tokens the keyring
accepted, at most ACCEPTED_TOKENS of them, and checks keyring and policy on every request all the
same (tests/test_server_http.py: a rotated or disabled credential is refused at once); what the
keyring refuses is never kept. Over a real keyring file."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyload import limits
from keyload.credentials import Credential, CredentialError
from keyload.server import auth
from keyload.server.auth import Authenticator, Unauthenticated
from keyload.storage import keyring
from keyload.storage.keyring import LiveKeyring


def bearer(credential: Credential) -> str:
    return f"Bearer {credential.bearer_token}"


def test_accepted_tokens_are_kept_within_the_bound_and_refused_ones_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "ACCEPTED_TOKENS", 2)
    keyring.create(tmp_path)
    good = [Credential(f"p{i}", f"edge-{i}", keyring.add(tmp_path, f"edge-{i}")) for i in range(3)]
    authenticator = Authenticator(LiveKeyring(tmp_path))
    for credential in good:
        assert authenticator.credential(bearer(credential), None) == credential
        assert authenticator.credential(bearer(credential), None) == credential  # from the kept parse
    assert list(authenticator._accepted) == [good[1].bearer_token, good[2].bearer_token]  # oldest out
    refused = [
        (Credential("p0", "edge-0", b"\x00" * 32), None),  # a wrong secret
        (Credential("p9", "edge-9", b"\x01" * 32), None),  # a key the keyring lacks
        (Credential("p" * (limits.MAX_PRINCIPAL_CHARS + 1), "edge-0", good[0].secret), None),  # never a name
        (Credential("nobody", "edge-0", good[0].secret), _NoPrincipals()),  # the policy knows no such principal
    ]
    for credential, policy in refused:
        with pytest.raises(Unauthenticated):
            authenticator.credential(bearer(credential), policy)
    assert list(authenticator._accepted) == [good[1].bearer_token, good[2].bearer_token]


class _NoPrincipals:
    """A policy (projections' Readable) that holds nothing."""

    def get(self, key: bytes) -> bytes | None:
        return None


def test_a_secret_has_one_spelling_and_any_other_is_refused() -> None:
    credential = Credential("p0", "edge-0", bytes([0xFB, 0xFF]) * 16)  # spelled with both - and _
    principal_and_key, secret = credential.bearer_token.rsplit(":", 1)
    assert {"-", "_"} <= set(secret) and len(secret) == 43  # its last character holds 2 unused bits
    last = BASE64URL.index(secret[-1])
    respelled = [
        secret[:10] + "!" + secret[10:],  # outside the alphabet: a lenient decoder skips it
        secret[:10] + " " + secret[10:],
        secret + "=",  # padded
        secret.replace("-", "+").replace("_", "/"),  # the standard alphabet
        secret[:-1] + BASE64URL[last ^ 1],  # an unused bit set: the same bytes
    ]
    for spelling in respelled:
        with pytest.raises(CredentialError, match="not unpadded base64url"):
            Credential.from_bearer_token(f"{principal_and_key}:{spelling}")
    assert Credential.from_bearer_token(credential.bearer_token) == credential


BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
