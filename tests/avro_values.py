"""Hypothesis values of an Avro schema (as `fastavro.parse_schema` returns it), as keyload writes
them and fastavro reads them back: shared by the codec and wire-form tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from keyload.log.avro_compiler import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN

PRIMITIVES = frozenset(["null", "boolean", "int", "long", "string", "bytes"])


def named_types(schema: Any, found: dict[str, Any]) -> dict[str, Any]:
    """Every named type a parsed schema defines, by full name, in definition order."""
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, found)
    elif isinstance(schema, dict):
        kind = schema["type"]
        if isinstance(kind, (dict, list)):
            named_types(kind, found)
            return found
        if kind in ("record", "enum", "fixed"):
            found.setdefault(schema["name"], schema)
        for field in schema.get("fields", ()):
            named_types(field["type"], found)
        for key in ("items", "values"):
            if key in schema:
                named_types(schema[key], found)
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
