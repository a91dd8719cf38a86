"""The typed records of projections/records.py, the command bodies of keyload/bodies.py and the
SDK's result classes (keyload/sdk/results.py), against the .avsc files they mirror.

Drift: every class's fields (names, order, types, optionality, defaults, enum symbols,
nested record names) equal its schema record's, read from the schema files; a field
added, renamed or retyped in a schema fails here naming the field.

Round trips: for values generated from the schemas (current and every released
version), decoding into the class and encoding again gives the very bytes REGISTRY
writes, so handlers using the classes store byte-identical state.
"""

from __future__ import annotations

import copy
from enum import Enum
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyload import bodies
from keyload.log.codec import REGISTRY, TOP_LEVEL, expanded_current
from keyload.projections import records
from keyload.projections.records import STORED_RECORDS, AvroRecord, StoredRecord
from keyload.sdk import results

UNTYPED = {"keyload.Command", "keyload.Outcome", "keyload.Signed"}
"""Top-level types with no class of projections/records.py: commands and outcomes (their bodies and
results are typed by keyload/bodies.py and keyload/sdk/results.py, checked below), and the signed
wrapper around either (read by keyload/credentials.py, never stored)."""

AVRO_INT = (-(2**31), 2**31 - 1)
AVRO_LONG = (-(2**63), 2**63 - 1)

# ---------------------------------------------------------------------------------------------
# Drift


def _full_name(schema: dict[str, Any], namespace: str | None) -> str:
    name: str = schema["name"]
    if "." in name:
        return name
    space = schema.get("namespace", namespace)
    return f"{space}.{name}" if space else name


def _space(full: str) -> str | None:
    return full.rpartition(".")[0] or None


class _Checker:
    """Compares one class tree with one expanded schema, collecting every difference."""

    def __init__(self) -> None:
        self.named: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []
        self.in_body = False  # checking a class of keyload/bodies.py: its integers are plain int

    def resolve(self, avro: Any, namespace: str | None) -> tuple[Any, str | None]:
        """A named type referenced by name, as its definition (and that definition's namespace)."""
        if isinstance(avro, str) and avro not in _PRIMITIVES:
            full = avro if "." in avro or namespace is None else f"{namespace}.{avro}"
            if full not in self.named and avro in self.named:
                full = avro
            return self.named[full], _space(full)
        if isinstance(avro, dict) and avro.get("type") in ("record", "enum", "fixed"):
            full = _full_name(avro, namespace)
            self.named.setdefault(full, avro)
            return avro, _space(full)
        return avro, namespace

    def record(self, cls: type[AvroRecord], avro: dict[str, Any], namespace: str | None, path: str) -> None:
        outer, self.in_body = self.in_body, cls.__module__ == bodies.__name__
        try:
            self._record(cls, avro, namespace, path)
        finally:
            self.in_body = outer

    def _record(self, cls: type[AvroRecord], avro: dict[str, Any], namespace: str | None, path: str) -> None:
        full = _full_name(avro, namespace)
        space = _space(full)
        if full != cls.AVRO_NAME:
            self.problems.append(f"{path}: class {cls.__name__} declares {cls.AVRO_NAME}, the schema has {full}")
        if cls.__name__ != full.rpartition(".")[2]:
            self.problems.append(f"{path}: class {cls.__name__} mirrors the record {full}: name it like it")
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        if not info.forbid_unknown_fields:
            self.problems.append(f"{path}: class {cls.__name__} must forbid unknown fields")
        fields = {field.name: field for field in info.fields}
        wanted = [field["name"] for field in avro["fields"]]
        for name in wanted:
            if name not in fields:
                self.problems.append(f"{path}.{name}: schema field {name!r} of {full} has no field in {cls.__name__}")
        for name in fields:
            if name not in wanted:
                self.problems.append(f"{path}.{name}: field {name!r} of {cls.__name__} is not in the schema {full}")
        common_schema = [name for name in wanted if name in fields]
        common_class = [name for name in fields if name in wanted]
        if common_schema != common_class:
            self.problems.append(f"{path}: {cls.__name__} orders its fields {common_class}, the schema {common_schema}")
        for avro_field in avro["fields"]:
            name = avro_field["name"]
            if name not in fields:
                continue
            field = fields[name]
            self.type(field.type, avro_field["type"], space, f"{path}.{name}")
            self.default(field, avro_field, f"{path}.{name}")

    def default(self, field: msgspec.inspect.Field, avro_field: dict[str, Any], path: str) -> None:
        if "default" not in avro_field:
            if not field.required:
                self.problems.append(f"{path}: has a default in the class but none in the schema")
            return
        if field.required:
            self.problems.append(f"{path}: the schema's default {avro_field['default']!r} is missing from the class")
            return
        value = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
        if isinstance(value, Enum):
            value = value.value
        if value != avro_field["default"] or type(value) is not type(avro_field["default"]):
            self.problems.append(f"{path}: default {value!r} in the class, {avro_field['default']!r} in the schema")

    def type(self, info: msgspec.inspect.Type, avro: Any, namespace: str | None, path: str) -> None:
        avro, namespace = self.resolve(avro, namespace)
        if isinstance(avro, list):
            branches = [branch for branch in avro if branch != "null"]
            if len(branches) > 1 and "null" not in avro and all(self._is_record(b, namespace) for b in branches):
                self.expect(info == _BRANCH, path, "a union of records: declare it bodies.Branch")
                return
            if len(branches) != 1:
                self.problems.append(f"{path}: union {avro} has no typed form here (only [null, X] has)")
                return
            optional = "null" in avro
            if not optional:
                self.type(info, branches[0], namespace, path)
                return
            inner = [t for t in getattr(info, "types", ()) if not isinstance(t, msgspec.inspect.NoneType)]
            if not isinstance(info, msgspec.inspect.UnionType) or len(inner) != 1 or len(info.types) != 2:
                self.problems.append(f"{path}: optional in the schema ({avro}): declare it `X | None`")
                return
            self.type(inner[0], branches[0], namespace, path)
            return
        if isinstance(info, msgspec.inspect.UnionType):
            self.problems.append(f"{path}: `X | None` in the class, the schema's type {avro!r} is not optional")
            return
        kind = avro if isinstance(avro, str) else avro["type"]
        if kind in ("long", "int") and self.in_body:
            # A command body's integers carry no range: the handlers refuse by the named ranges.
            ok = isinstance(info, msgspec.inspect.IntType) and info == msgspec.inspect.IntType()
            self.expect(ok, path, f"Avro {kind} of a command body: declare it int (keyload/bodies.py)")
        elif kind in ("long", "int"):
            low, high = AVRO_LONG if kind == "long" else AVRO_INT
            ok = isinstance(info, msgspec.inspect.IntType) and (info.ge, info.le) == (low, high)
            self.expect(ok, path, f"Avro {kind}: declare it records.{'Long' if kind == 'long' else 'Int'}")
        elif kind == "boolean":
            self.expect(isinstance(info, msgspec.inspect.BoolType), path, "Avro boolean: declare it bool")
        elif kind == "string":
            ok = isinstance(info, msgspec.inspect.StrType) and info == msgspec.inspect.StrType()
            self.expect(ok, path, "Avro string: declare it str")
        elif kind == "bytes":
            ok = isinstance(info, msgspec.inspect.BytesType) and info == msgspec.inspect.BytesType()
            self.expect(ok, path, "Avro bytes: declare it bytes")
        elif kind == "fixed":
            size = avro["size"]
            ok = isinstance(info, msgspec.inspect.BytesType) and (info.min_length, info.max_length) == (size, size)
            self.expect(ok, path, f"Avro fixed {avro['name']} of {size} bytes: declare it bytes of exactly that length")
        elif kind == "enum":
            self.enum(info, avro, namespace, path)
        elif kind == "map":
            ok = isinstance(info, msgspec.inspect.DictType) and isinstance(info.key_type, msgspec.inspect.StrType)
            if self.expect(ok, path, "Avro map: declare it dict[str, V]"):
                assert isinstance(info, msgspec.inspect.DictType)
                self.type(info.value_type, avro["values"], namespace, f"{path}[]")
        elif kind == "array":
            if self.expect(isinstance(info, msgspec.inspect.ListType), path, "Avro array: declare it list[T]"):
                assert isinstance(info, msgspec.inspect.ListType)
                self.type(info.item_type, avro["items"], namespace, f"{path}[]")
        elif kind == "record":
            if self.expect(isinstance(info, msgspec.inspect.StructType), path, "Avro record: declare its class"):
                assert isinstance(info, msgspec.inspect.StructType)
                if not issubclass(info.cls, AvroRecord):
                    self.problems.append(f"{path}: class {info.cls.__name__} of a record is not an AvroRecord")
                else:
                    self.record(info.cls, avro, namespace, path)
        else:
            self.problems.append(f"{path}: Avro type {kind!r} has no typed form here")

    def _is_record(self, avro: Any, namespace: str | None) -> bool:
        resolved, _ = self.resolve(avro, namespace)
        return isinstance(resolved, dict) and resolved.get("type") == "record"

    def enum(self, info: msgspec.inspect.Type, avro: dict[str, Any], namespace: str | None, path: str) -> None:
        full = _full_name(avro, namespace)
        if not self.expect(isinstance(info, msgspec.inspect.EnumType), path, f"Avro enum {full}: declare its StrEnum"):
            return
        assert isinstance(info, msgspec.inspect.EnumType)
        cls = info.cls
        if cls.__name__ != full.rpartition(".")[2]:
            self.problems.append(f"{path}: enum class {cls.__name__} mirrors {full}: name it like it")
        values = [member.value for member in cls]
        if values != avro["symbols"]:
            self.problems.append(f"{path}: enum {cls.__name__} has {values}, the schema {full} {avro['symbols']}")

    def expect(self, ok: bool, path: str, message: str) -> bool:
        if not ok:
            self.problems.append(f"{path}: {message}")
        return ok


_BRANCH = msgspec.inspect.type_info(bodies.Branch)
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def drift(cls: type[AvroRecord], schema: dict[str, Any], named: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Every difference between `cls` and the expanded schema record `schema` (whose references to
    named types defined elsewhere in its schema file are found in `named`)."""
    checker = _Checker()
    checker.named.update(named or {})
    checker.resolve(schema, None)
    checker.record(cls, schema, None, cls.AVRO_NAME)
    return checker.problems


@pytest.mark.parametrize("cls", STORED_RECORDS, ids=lambda cls: cls.__name__)
def test_class_matches_its_schema(cls: type[StoredRecord]) -> None:
    assert cls.SCHEMA == cls.AVRO_NAME
    problems = drift(cls, expanded_current(cls.SCHEMA))
    assert not problems, "\n".join(problems)


def test_every_stored_record_is_typed() -> None:
    typed = [cls.SCHEMA for cls in STORED_RECORDS]
    assert len(typed) == len(set(typed))
    missing = sorted(set(TOP_LEVEL) - UNTYPED - set(typed))
    assert not missing, f"top-level schemas with no class in projections/records.py: {missing}"
    assert set(typed) <= set(TOP_LEVEL)


def test_every_record_class_is_listed_or_nested() -> None:
    """A class in records.py is a listed top-level record or nested in one (no stray copies)."""
    reachable: set[type[msgspec.Struct]] = set()

    def walk(info: msgspec.inspect.Type) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls in reachable:
                return
            reachable.add(info.cls)
            for field in info.fields:
                walk(field.type)
        for attribute in ("types", "item_type", "value_type"):
            inner = getattr(info, attribute, None)
            for each in inner if isinstance(inner, tuple) else (inner,) if inner is not None else ():
                walk(each)

    for cls in STORED_RECORDS:
        walk(msgspec.inspect.type_info(cls))
    declared = {
        value
        for value in vars(records).values()
        if isinstance(value, type) and issubclass(value, AvroRecord) and value not in (AvroRecord, StoredRecord)
    }
    stray = sorted(cls.__name__ for cls in declared - reachable)
    assert declared == reachable, f"not reachable from STORED_RECORDS: {stray}"


def _records_in(schema: Any, namespace: str | None, found: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every named type (record, enum, fixed) defined in an expanded schema, by full name."""
    if isinstance(schema, list):
        for branch in schema:
            _records_in(branch, namespace, found)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed"):
            full = _full_name(schema, namespace)
            found[full] = schema
            namespace = _space(full)
            for field in schema.get("fields", ()):
                _records_in(field["type"], namespace, found)
        for key in ("items", "values"):
            if key in schema:
                _records_in(schema[key], namespace, found)
    return found


OUTCOME_RECORDS = _records_in(expanded_current("keyload.Outcome"), None, {})
COMMAND_RECORDS = _records_in(expanded_current("keyload.Command"), None, {})
BODIES = tuple(
    value
    for value in vars(bodies).values()
    if isinstance(value, type)
    and issubclass(value, AvroRecord)
    and "AVRO_NAME" in vars(value)
    and value.__module__ == bodies.__name__
)
"""The body records of keyload/bodies.py (not the bases that only share fields)."""
RESULT_RECORDS = tuple(cls for cls in results.RESULT_CLASSES if issubclass(cls, AvroRecord))
"""The result classes that mirror their record field for field; the other three read a union
(BatchResult, ProcessingResult) or flatten their record (GroupView)."""


@pytest.mark.parametrize("cls", RESULT_RECORDS + BODIES, ids=lambda cls: cls.__name__)
def test_result_and_body_classes_match_their_schema(cls: type[AvroRecord]) -> None:
    named = OUTCOME_RECORDS if cls in RESULT_RECORDS else COMMAND_RECORDS
    problems = drift(cls, named[cls.AVRO_NAME], named)
    assert not problems, "\n".join(problems)


def test_every_command_kind_has_its_body_class() -> None:
    """Each branch of the Command's body union is read by the class of the same record name, and
    every record a body holds has its class (declared in keyload/bodies.py or a stored record's)."""
    [body] = [f for f in expanded_current("keyload.Command")["fields"] if f["name"] == "body"]
    assert set(bodies.BODY_TYPES) == {_full_name(branch, "keyload") for branch in body["type"]}
    records = {name for name, schema in COMMAND_RECORDS.items() if schema["type"] == "record"}
    shared = {"keyload.GroupFilter", "keyload.Grant"}  # stored records' classes a body holds
    assert records - {"keyload.Command"} == {cls.AVRO_NAME for cls in BODIES} | shared


def test_every_result_record_has_its_class() -> None:
    """Each branch of the Outcome's result union is read by the class of the same record name."""
    [result] = [f for f in expanded_current("keyload.Outcome")["fields"] if f["name"] == "result"]
    branches = {_full_name(b, "keyload") if isinstance(b, dict) else b for b in result["type"]} - {"null"}
    assert set(results.RESULT_TYPES) == branches
    assert all(cls.AVRO_NAME in OUTCOME_RECORDS for cls in results.RESULT_CLASSES)


def _document_schema() -> dict[str, Any]:
    return copy.deepcopy(expanded_current("keyload.DocumentRecord"))


def test_drift_names_a_renamed_field() -> None:
    schema = _document_schema()
    schema["fields"][1]["name"] = "rev"
    problems = "\n".join(drift(records.DocumentRecord, schema))
    assert "'rev'" in problems and "'revision'" in problems


def test_drift_names_an_added_field() -> None:
    schema = _document_schema()
    schema["fields"].append({"name": "tags", "type": {"type": "map", "values": "string"}, "default": {}})
    assert drift(records.DocumentRecord, schema) == [
        "keyload.DocumentRecord.tags: schema field 'tags' of keyload.DocumentRecord has no field in DocumentRecord"
    ]


def test_drift_names_a_retyped_or_reordered_field() -> None:
    schema = _document_schema()
    schema["fields"][1]["type"] = "int"
    schema["fields"][2]["type"] = ["null", "long"]
    schema["fields"][2]["default"] = None
    problems = drift(records.DocumentRecord, schema)
    assert any(p.startswith("keyload.DocumentRecord.revision: Avro int") for p in problems), problems
    assert any(p.startswith("keyload.DocumentRecord.updated_at_ms: optional") for p in problems), problems
    schema = _document_schema()
    schema["fields"].reverse()
    assert any("orders its fields" in p for p in drift(records.DocumentRecord, schema))


def test_drift_names_a_changed_enum_and_nested_record() -> None:
    schema = copy.deepcopy(expanded_current("keyload.MessageMeta"))
    fields = {field["name"]: field for field in schema["fields"]}
    fields["state"]["type"]["symbols"].append("archived")
    fields["payload"]["type"][1]["fields"].append({"name": "etag", "type": "string"})
    problems = "\n".join(drift(records.MessageMeta, schema))
    assert "keyload.MessageMeta.state: enum MessageState" in problems and "archived" in problems
    assert "keyload.MessageMeta.payload.etag: schema field 'etag' of keyload.LargePayload" in problems


# ---------------------------------------------------------------------------------------------
# Round trips


def _is_named_record(branch: Any) -> bool:
    """A union branch that is a record (defined there, or named: unions here name no enum or fixed)."""
    return branch.get("type") == "record" if isinstance(branch, dict) else branch not in _PRIMITIVES


def _union_name(branch: Any, namespace: str | None) -> str:
    if isinstance(branch, dict):
        return _full_name(branch, namespace)
    return str(branch) if "." in branch or namespace is None else f"{namespace}.{branch}"


def strategy(schema: Any, named: dict[str, Any] | None = None, namespace: str | None = None) -> st.SearchStrategy[Any]:
    """Values of an (expanded or parsed) Avro schema, in the form fastavro decodes (a union of
    several records as (record name, value), the registry's `return_record_name`)."""
    named = {} if named is None else named
    if isinstance(schema, list):
        records = [branch for branch in schema if branch != "null"]
        if len(records) > 1 and all(_is_named_record(branch) for branch in records):
            tagged = [st.tuples(st.just(_union_name(b, namespace)), strategy(b, named, namespace)) for b in records]
            return st.one_of(*tagged, *([st.none()] if "null" in schema else []))
        return st.one_of(*(strategy(branch, named, namespace) for branch in schema))
    if isinstance(schema, str):
        simple: dict[str, st.SearchStrategy[Any]] = {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": st.integers(*AVRO_INT),
            "long": st.integers(*AVRO_LONG),
            "string": st.text(max_size=12),
            "bytes": st.binary(max_size=24),
        }
        if schema in simple:
            return simple[schema]
        full = schema if "." in schema or namespace is None else f"{namespace}.{schema}"
        return st.deferred(lambda: named[full] if full in named else named[schema])
    kind = schema["type"]
    if kind in ("record", "enum", "fixed"):
        full = _full_name(schema, namespace)
        space = _space(full)
        if kind == "enum":
            built: st.SearchStrategy[Any] = st.sampled_from(schema["symbols"])
        elif kind == "fixed":
            built = st.binary(min_size=schema["size"], max_size=schema["size"])
        else:
            built = st.fixed_dictionaries(
                {field["name"]: strategy(field["type"], named, space) for field in schema["fields"]}
            )
        named[full] = built
        return built
    if kind == "map":
        return st.dictionaries(st.text(max_size=6), strategy(schema["values"], named, namespace), max_size=3)
    if kind == "array":
        return st.lists(strategy(schema["items"], named, namespace), max_size=3)
    return strategy(kind, named, namespace)


_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("cls", STORED_RECORDS, ids=lambda cls: cls.__name__)
@_SETTINGS
@given(data=st.data())
def test_round_trip_is_byte_identical(cls: type[StoredRecord], data: st.DataObject) -> None:
    value = data.draw(strategy(expanded_current(cls.SCHEMA)))
    encoded = REGISTRY.encode(cls.SCHEMA, value)
    typed = cls.decode(encoded)
    assert typed.encode() == encoded
    assert typed.to_avro() == REGISTRY.decode(cls.SCHEMA, encoded)
    # Built from the dict a handler would have stored, it encodes to the same bytes.
    assert cls.from_avro(value).encode() == encoded


@pytest.mark.parametrize("cls", STORED_RECORDS, ids=lambda cls: cls.__name__)
@_SETTINGS
@given(data=st.data())
def test_released_versions_decode_into_the_class(cls: type[StoredRecord], data: st.DataObject) -> None:
    """A value written under any frozen version decodes (by schema resolution) into the class."""
    released = REGISTRY.released(cls.SCHEMA)
    assert released, f"{cls.SCHEMA} has no released version"
    version = data.draw(st.sampled_from(released))
    value = data.draw(strategy(version.schema))
    encoded = version.header + REGISTRY.encode_body_under(version.schema, value)
    typed = cls.decode(encoded)
    assert typed.to_avro() == REGISTRY.decode(cls.SCHEMA, encoded)
    assert typed.encode() == REGISTRY.encode(cls.SCHEMA, REGISTRY.decode(cls.SCHEMA, encoded))


VALUES: dict[str, st.SearchStrategy[Any]] = {}
strategy(expanded_current("keyload.Outcome"), VALUES)  # fills in a strategy per named type
strategy(expanded_current("keyload.Command"), VALUES)


@pytest.mark.parametrize("cls", RESULT_RECORDS + BODIES, ids=lambda cls: cls.__name__)
@_SETTINGS
@given(data=st.data())
def test_a_result_or_body_reads_its_record_whole(cls: type[AvroRecord], data: st.DataObject) -> None:
    """A result or body value as fastavro decodes it becomes the class and back into the same dict."""
    value = data.draw(VALUES[cls.AVRO_NAME])
    assert cls.from_avro(value).to_avro() == value
