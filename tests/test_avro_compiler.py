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

from .support import ENQUEUE, command, enqueue_body

SCHEMAS = [
    pytest.param(schema, id=f"{name}-{label}")
    for name in TOP_LEVEL
    for label, schema in [("current", REGISTRY.schema(name))]
    + [(f"v{released.version}", released.schema) for released in REGISTRY.released(name)]
]
EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRIMITIVES = frozenset(["null", "boolean", "int", "long", "string", "bytes"])


def _named_types(schema: Any, found: dict[str, Any]) -> dict[str, Any]:
    """Every named type a parsed schema defines, by full name, in definition order."""
    if isinstance(schema, list):
        for branch in schema:
            _named_types(branch, found)
    elif isinstance(schema, dict):
        kind = schema["type"]
        if isinstance(kind, (dict, list)):
            _named_types(kind, found)
            return found
        if kind in ("record", "enum", "fixed"):
            found.setdefault(schema["name"], schema)
        for field in schema.get("fields", ()):
            _named_types(field["type"], found)
        for key in ("items", "values"):
            if key in schema:
                _named_types(schema[key], found)
    return found


def values(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values as keyload writes them and fastavro reads them back: a union's record branches
    tagged `(name, value)` unless the union has exactly one; omitted fields take defaults."""
    if isinstance(schema, str) and schema not in PRIMITIVES:
        return values(named[schema], named)
    kind = schema["type"] if isinstance(schema, dict) else "union" if isinstance(schema, list) else schema
    if isinstance(kind, (dict, list)):
        return values(kind, named)
    if kind == "union":
        records = [b for b in schema if (isinstance(b, str) and b not in PRIMITIVES) or _kind(b) == "record"]
        return st.one_of(
            [
                values(branch, named).map(lambda v, b=branch: (_name(b, named), v))
                if len(records) > 1 and branch in records
                else values(branch, named)
                for branch in schema
            ]
        )
    if kind == "record":
        fields = {f["name"]: values(f["type"], named) for f in schema["fields"]}
        defaults = [f["name"] for f in schema["fields"] if "default" in f]
        return st.fixed_dictionaries(fields).flatmap(
            lambda record: st.sets(st.sampled_from(defaults) if defaults else st.nothing()).map(
                lambda omitted: {k: v for k, v in record.items() if k not in omitted}
            )
        )
    return {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(INT_MIN, INT_MAX),
        "long": st.integers(LONG_MIN, LONG_MAX),
        "string": st.text(max_size=12),
        "bytes": st.binary(max_size=40),
        "enum": st.sampled_from(schema["symbols"]) if kind == "enum" else st.nothing(),
        "fixed": st.binary(min_size=schema.get("size", 0), max_size=schema.get("size", 0))
        if kind == "fixed"
        else st.nothing(),
        "array": st.lists(values(schema["items"], named), max_size=3) if kind == "array" else st.nothing(),
        "map": st.dictionaries(st.text(max_size=6), values(schema["values"], named), max_size=3)
        if kind == "map"
        else st.nothing(),
    }[kind]


def _kind(schema: Any) -> str:
    return str(schema["type"]) if isinstance(schema, dict) else "union" if isinstance(schema, list) else str(schema)


def _name(branch: Any, named: dict[str, Any]) -> str:
    return str(branch["name"] if isinstance(branch, dict) else named[branch]["name"])


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
    value = data.draw(values(schema, _named_types(schema, {})))
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
    body = bytearray(_fastavro_bytes(schema, data.draw(values(schema, _named_types(schema, {})))))
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
