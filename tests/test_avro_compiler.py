"""The generated Avro codec against fastavro: same bytes, same values, and where it declines, fastavro's answer.

Every top-level type, under its current schema and every version in schemas/history/, is
encoded and decoded both ways over hypothesis-generated values; mutated bodies check that the
generated decoder never answers where fastavro would refuse, nor answers differently.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyload.log.avro_compiler import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    CompiledSchema,
    Unsupported,
    compile_schema,
)
from keyload.log.codec import HEADER_BYTES, REGISTRY, TOP_LEVEL, CodecError

from .avro_values import named_types, values
from .support import ENQUEUE, command, enqueue_body

SCHEMAS = [
    pytest.param(schema, id=f"{name}-{label}")
    for name in TOP_LEVEL
    for label, schema in [("current", REGISTRY.schema(name))]
    + [(f"v{released.version}", released.schema) for released in REGISTRY.released(name)]
]
EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


_COMPILED: dict[int, CompiledSchema] = {}


def _compiled(schema: Any) -> CompiledSchema:
    """Generated once per schema: generation is the slow part, not what is tested."""
    if id(schema) not in _COMPILED:
        _COMPILED[id(schema)] = compile_schema(schema)
    return _COMPILED[id(schema)]


def _fastavro_bytes(schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, schema, value)
    return out.getvalue()


def _fastavro_value(schema: Any, body: bytes) -> tuple[Any, int]:
    stream = io.BytesIO(body)
    value = schemaless_reader(stream, schema, None, return_record_name=True, return_record_name_override=True)
    return value, stream.tell()


@pytest.mark.parametrize("schema", SCHEMAS)
@EXAMPLES
@given(data=st.data())
def test_generated_codec_writes_and_reads_what_fastavro_does(schema: Any, data: st.DataObject) -> None:
    value = data.draw(values(schema, named_types(schema, {})))
    compiled = _compiled(schema)
    expected = _fastavro_bytes(schema, value)
    assert compiled.encode(value) == expected  # never declines a value as keyload writes it
    decoded, end = compiled.decode(expected, 0)
    assert (decoded, end) == _fastavro_value(schema, expected)
    assert compiled.encode(decoded) == expected


@pytest.mark.parametrize("schema", SCHEMAS)
@EXAMPLES
@given(data=st.data())
def test_generated_decoder_answers_mutated_bodies_as_fastavro_or_not_at_all(schema: Any, data: st.DataObject) -> None:
    body = bytearray(_fastavro_bytes(schema, data.draw(values(schema, named_types(schema, {})))))
    for _ in range(data.draw(st.integers(1, 3))):
        edit = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if edit == "flip" and body:
            body[at] = data.draw(st.integers(0, 255))
        elif edit == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=3))
    mutated = bytes(body)
    try:
        answer = _compiled(schema).decode(mutated, 0)
    except Unsupported:
        return  # fastavro decides
    assert answer == _fastavro_value(schema, mutated)


def test_values_fastavro_coerces_or_chooses_by_validation_still_encode_as_fastavro_does() -> None:
    """The registry defers to fastavro wherever the generated code declines."""
    schema = REGISTRY.schema("keyload.Command")
    plain = {"command_id": "c-1", "domain": "d", "principal": "p"}
    loose = [
        dict(plain, body=(ENQUEUE, dict(enqueue_body("q", "m-1", b"x"), body=bytearray(b"body")))),
        dict(plain, body=enqueue_body("q", "m-1", b"x")),  # untagged: fastavro picks the branch by its fields
    ]
    for value in loose:
        assert REGISTRY.encode_body("keyload.Command", value) == _fastavro_bytes(schema, value)
    with pytest.raises(Unsupported):
        compile_schema(schema).encode(loose[0])


def test_a_value_fastavro_refuses_is_refused_by_the_registry() -> None:
    bad = {"command_id": 7, "domain": "d", "principal": "p", "body": (ENQUEUE, enqueue_body("q", "m", b""))}
    with pytest.raises(Exception) as fastavro_error:
        _fastavro_bytes(REGISTRY.schema("keyload.Command"), bad)
    with pytest.raises(type(fastavro_error.value)):
        REGISTRY.encode("keyload.Command", bad)


@pytest.mark.parametrize(
    ("varint", "why"),
    [
        (b"\xff" * 10 + b"\x01", "eleven bytes"),
        (b"\xff" * 9 + b"\x7f", "past 64 bits"),
        (b"\x80" * 3, "truncated"),
    ],
)
def test_longs_fastavro_reads_its_own_way_are_left_to_it(varint: bytes, why: str) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}
    with pytest.raises(Unsupported):
        compile_schema(schema).decode(varint, 0)


def _written_and_read_as_fastavro_does(schema: Any, value: Any) -> None:
    compiled, body = compile_schema(schema), _fastavro_bytes(schema, value)
    assert compiled.encode(value) == body
    assert compiled.decode(body, 0) == _fastavro_value(schema, body) == (value, len(body))


def _one_field(kind: Any) -> Any:
    """A record of one field `n` of type `kind`."""
    return parse_schema({"type": "record", "name": "R", "fields": [{"name": "n", "type": kind}]})


@pytest.mark.parametrize(
    ("kind", "value"),
    [(kind, value) for kind in ("int", "long") for value in (-65, -64, -1, 0, 63, 64, 8191, 8192)]
    + [("int", INT_MIN), ("int", INT_MAX), ("long", LONG_MIN), ("long", LONG_MAX), ("long", 1_733_470_030_000)],
)
def test_numbers_at_every_varint_length_write_and_read_as_fastavro_does(kind: str, value: int) -> None:
    _written_and_read_as_fastavro_does(_one_field(kind), {"n": value})


MANY = [f"s{n}" for n in range(100)]  # past one varint byte of indexes and counts


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ({"type": "enum", "name": "E", "symbols": MANY}, "s99"),
        ([*({"type": "record", "name": name, "fields": []} for name in MANY), "long"], 7),
        ({"type": "array", "items": "long"}, list(range(-100, 100))),
        ({"type": "map", "values": "int"}, {name: n for n, name in enumerate(MANY)}),
        ("string", "é" * 5_000),
        ("bytes", bytes(range(256)) * 40),
    ],
)
def test_counts_and_indexes_past_one_byte_write_and_read_as_fastavro_does(kind: Any, value: Any) -> None:
    _written_and_read_as_fastavro_does(_one_field(kind), {"n": value})


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("int", INT_MAX + 1),
        ("int", INT_MIN - 1),
        ("long", LONG_MAX + 1),
        ("long", LONG_MIN - 1),
        ("long", True),  # fastavro writes a bool as 1; the generated code leaves it to fastavro
        ("long", 1.0),
        ("int", "1"),
    ],
)
def test_numbers_out_of_range_or_of_another_type_are_left_to_fastavro(kind: str, value: Any) -> None:
    with pytest.raises(Unsupported):
        compile_schema(_one_field(kind)).encode({"n": value})


def test_registry_decodes_a_malformed_command_with_fastavros_error() -> None:
    value = command("acme", ENQUEUE, enqueue_body("jobs", "m-1", b"body"), "c-1")
    with pytest.raises(CodecError, match=r"malformed keyload\.Command body"):
        REGISTRY.decode("keyload.Command", value[: HEADER_BYTES + 5])
    with pytest.raises(CodecError, match="trailing bytes"):
        REGISTRY.decode("keyload.Command", value + b"\x00")


@pytest.mark.parametrize(
    "value",
    [("E", "A"), ("array", [1]), ("map", {"k": 1})],
    ids=["enum", "array", "map"],
)
def test_a_tuple_naming_a_branch_fastavro_will_not_take_by_name_is_left_to_fastavro(value: tuple[str, Any]) -> None:
    """fastavro takes `(name, value)` for records, named references and bare primitive names only."""
    enum = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    union = ["long", enum, {"type": "array", "items": "long"}, {"type": "map", "values": "long"}]
    inner = {"type": "record", "name": "In", "fields": [{"name": "u", "type": union}]}
    schema = parse_schema({"type": "record", "name": "Out", "fields": [{"name": "o", "type": ["null", inner]}]})
    record = {"o": {"u": value}}
    with pytest.raises(Exception):  # noqa: B017 - whatever fastavro raises, it refuses
        _fastavro_bytes(schema, record)
    with pytest.raises(Unsupported):
        compile_schema(schema).encode(record)
