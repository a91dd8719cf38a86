"""The Signed record's hand-written codec (keyload/credentials.py) is the registry's, byte for byte; the
keyring takes the key ids a credential may name."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyload.credentials import SIGNED, Credential, CredentialError, signed, unwrap
from keyload.log.codec import HEADER_BYTES, REGISTRY, CodecError
from keyload.storage import keyring
from keyload.storage.keyring import KeyringError

KEY_IDS = st.text(min_size=0, max_size=80)
RECORDS = st.binary(max_size=3000)


@given(key_id=KEY_IDS, key=st.binary(min_size=16, max_size=64), record=RECORDS)
def test_a_signed_record_is_what_the_registry_writes_and_reads(key_id: str, key: bytes, record: bytes) -> None:
    value = signed(key_id, key, record)
    decoded = REGISTRY.decode(SIGNED, value)
    assert REGISTRY.encode(SIGNED, decoded) == value
    found = unwrap(value)
    assert found is not None
    assert (found.key_id, found.mac, found.record) == (decoded["key_id"], decoded["mac"], decoded["record"])
    assert found.record == record and found.verify(key)


@given(record=RECORDS, cut=st.integers(min_value=1, max_value=30))
def test_a_cut_or_padded_signed_record_is_malformed(record: bytes, cut: int) -> None:
    value = Credential("p", "k", bytes(32)).sign(record)  # at least 46 bytes: the header stays whole
    with pytest.raises(CodecError):
        unwrap(value[:-cut])
    with pytest.raises(CodecError):
        unwrap(value + b"\x00")


def test_a_record_of_another_type_is_not_a_signed_one() -> None:
    command = REGISTRY.encode(
        "keyload.Command",
        {
            "command_id": "c",
            "domain": "d",
            "principal": "p",
            "body": ("keyload.command.Tick", {}),
            "reply_to": None,
            "client_time_ms": None,
        },
    )
    assert unwrap(command) is None
    assert unwrap(b"") is None


@given(record=RECORDS)
def test_a_credential_signs_and_accepts_exactly_what_signed_writes_under_its_key(record: bytes) -> None:
    """`signed` is the one writer: a credential's signature of a command, and an outcome the service
    seals for its principal, are the same bytes; another key id or key is not this credential's seal."""
    credential = Credential("p", "k", bytes(range(32)))
    value = signed("k", credential.secret, record)
    assert credential.sign(record) == value and credential.seals(value)
    assert not credential.seals(signed("k2", credential.secret, record))
    assert not credential.seals(signed("k", bytes(32), record))
    assert not credential.seals(record)


@given(body=st.binary(max_size=200))
def test_any_bytes_after_the_header_read_as_the_registry_reads_them(body: bytes) -> None:
    """Lengths of every size and sign, cut short or overrunning: what the hand-written reader accepts,
    fastavro reads with the same fields; and a whole record fastavro reads, the reader accepts."""
    value = signed("", b"k" * 16, b"")[:HEADER_BYTES] + body
    try:
        expected = REGISTRY.decode(SIGNED, value)
    except Exception:  # fastavro's own errors for a malformed body differ by what is wrong
        expected = None
    try:
        found = unwrap(value)
    except CodecError:
        found = None
    if found is not None:
        assert expected is not None
        assert (found.key_id, found.mac, found.record) == (expected["key_id"], expected["mac"], expected["record"])
    elif expected is not None:
        assert REGISTRY.encode(SIGNED, expected) != value, "a whole Signed record the reader refused"


def test_a_credential_file_loads_by_str_or_path_and_a_missing_one_is_a_credential_error(tmp_path: Path) -> None:
    credential = Credential("p", "k", bytes(range(32)))
    path = tmp_path / "p.json"
    path.write_bytes(credential.to_json())
    assert Credential.load(str(path)) == Credential.load(path) == credential
    with pytest.raises(CredentialError, match="no credential at"):
        Credential.load(str(tmp_path / "missing.json"))


def test_the_keyring_takes_the_key_ids_putprincipal_takes_and_finds_one_added_before_if_asked(tmp_path: Path) -> None:
    """One rule for a key id in the keyring and in PutPrincipal (printable ASCII with the space); a key
    added again is refused, or with exist_ok returned as it is (an issuance sent again)."""
    keyring.create(tmp_path)
    for refused in ("", "k" * 65, "tab\there", "é"):
        with pytest.raises(KeyringError, match=r"^a key id is 1\.\.64 printable ASCII characters$"):
            keyring.add(tmp_path, refused)
    first = keyring.add(tmp_path, "with space")
    assert keyring.add(tmp_path, "with space", exist_ok=True) == first == keyring.load(tmp_path)["with space"]
    with pytest.raises(KeyringError, match="already exists"):
        keyring.add(tmp_path, "with space")
