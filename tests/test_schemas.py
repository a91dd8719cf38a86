"""The schema contract: every released writer version stays readable forever."""

from __future__ import annotations

import io

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.log.codec import (
    MAGIC,
    REGISTRY,
    TOP_LEVEL,
    CodecError,
    UnknownSchema,
    encoded_optional_long,
    expanded_current,
    history,
)
from keyload.processors.apply import fingerprint

from .support import ENQUEUE, command, enqueue_body


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_current_schema_is_a_released_version(name: str) -> None:
    """Editing a schema without freezing the new version into schemas/history fails here."""
    versions = history(name)
    assert versions, f"{name} has no released version in schemas/history/{name}/"
    latest = versions[-1][1]
    assert to_parsing_canonical_form(expanded_current(name)) == to_parsing_canonical_form(latest), (
        f"schemas/{name}.avsc differs from its latest history version: add it as v{versions[-1][0] + 1}.avsc"
    )


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_every_historical_version_resolves_against_the_current_one(name: str) -> None:
    """Backward-transitive: a value written under any released version decodes under the current schema."""
    for version, writer in history(name):
        parsed = parse_schema(writer)
        example = _example(parsed)
        out = io.BytesIO()
        schemaless_writer(out, parsed, example)
        header = MAGIC + bytes.fromhex(_fingerprint(parsed))[::-1]
        decoded = REGISTRY.decode(name, header + out.getvalue())
        assert isinstance(decoded, dict), f"{name} v{version}"


def test_round_trip_keeps_every_field() -> None:
    value = command("acme", ENQUEUE, enqueue_body("jobs", "m-1", b"\x00\xffbody", headers={"k": "v"}), "c-1")
    decoded = REGISTRY.decode("keyload.Command", value)
    assert decoded["command_id"] == "c-1"
    assert decoded["body"][0] == ENQUEUE
    assert decoded["body"][1]["body"] == b"\x00\xffbody"
    assert decoded["body"][1]["headers"] == {"k": "v"}


def test_single_object_header_names_the_writer() -> None:
    value = command("acme", ENQUEUE, enqueue_body("jobs", "m-1"))
    assert value[:2] == b"\xc3\x01"
    assert REGISTRY.writer_name(value) == "keyload.Command"


def test_unknown_fingerprint_and_garbage_are_refused() -> None:
    value = command("acme", ENQUEUE, enqueue_body("jobs", "m-1"))
    with pytest.raises(UnknownSchema):
        REGISTRY.decode("keyload.Command", value[:2] + b"\x00" * 8 + value[10:])
    with pytest.raises(CodecError):
        REGISTRY.decode("keyload.Command", b"not avro at all")
    with pytest.raises(CodecError):
        REGISTRY.decode("keyload.Command", value[:12])  # truncated body
    with pytest.raises(CodecError):
        REGISTRY.decode("keyload.Outcome", value)  # right header, wrong type


def _fingerprint(parsed: object) -> str:
    from fastavro.schema import fingerprint

    result: str = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return result


def _example(schema: object) -> object:
    """A minimal valid value of any (parsed) Avro schema, taking the first union branch."""
    if isinstance(schema, list):
        return _example(schema[0])
    if isinstance(schema, str):
        return {
            "null": None,
            "boolean": False,
            "int": 0,
            "long": 0,
            "float": 0.0,
            "double": 0.0,
            "bytes": b"",
            "string": "",
        }[schema]
    assert isinstance(schema, dict)
    kind = schema["type"]
    if kind == "record":
        return {field["name"]: _example(field["type"]) for field in schema["fields"]}
    if kind == "enum":
        return schema["symbols"][0]
    if kind == "array":
        return []
    if kind == "map":
        return {}
    if kind == "fixed":
        return b"\x00" * schema["size"]
    return _example(kind)


@settings(max_examples=200)
@given(value=st.none() | st.integers(-(2**63), 2**63 - 1))
def test_optional_long_encoding_matches_avro(value: int | None) -> None:
    schema = parse_schema({"type": "record", "name": "T", "fields": [{"name": "v", "type": ["null", "long"]}]})
    out = io.BytesIO()
    schemaless_writer(out, schema, {"v": value})
    assert encoded_optional_long(value) == out.getvalue()


@settings(max_examples=100)
@given(
    reply_to=st.none() | st.integers(0, 2**31 - 1),
    client_time=st.none() | st.integers(-(2**63), 2**63 - 1),
    body=st.binary(max_size=64),
)
def test_fingerprint_ignores_the_informational_tail_and_nothing_else(
    reply_to: int | None, client_time: int | None, body: bytes
) -> None:
    plain = REGISTRY.decode("keyload.Command", command("acme", ENQUEUE, enqueue_body("q", "m", body), "c-1"))
    retried = dict(plain, reply_to=reply_to, client_time_ms=client_time)
    retried_bytes = REGISTRY.encode("keyload.Command", retried)
    plain_bytes = REGISTRY.encode("keyload.Command", plain)
    assert fingerprint(retried, retried_bytes) == fingerprint(plain, plain_bytes)
    # The slow path (a value written under an older schema is re-encoded) agrees with the fast one.
    assert fingerprint(retried, b"\xc3\x01" + b"\x00" * 8 + retried_bytes[10:]) == fingerprint(plain, plain_bytes)
    changed = dict(plain, body=(ENQUEUE, dict(plain["body"][1], body=body + b"!")))
    assert fingerprint(changed, REGISTRY.encode("keyload.Command", changed)) != fingerprint(plain, plain_bytes)


def test_fingerprint_does_not_depend_on_header_order() -> None:
    forward = command("acme", ENQUEUE, enqueue_body("q", "m", headers={"a": "1", "b": "2"}), "c-1")
    backward = command("acme", ENQUEUE, enqueue_body("q", "m", headers={"b": "2", "a": "1"}), "c-1")
    assert forward != backward
    decode = REGISTRY.decode
    assert fingerprint(decode("keyload.Command", forward), forward) == fingerprint(
        decode("keyload.Command", backward), backward
    )
