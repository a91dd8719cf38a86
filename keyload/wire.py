"""The JSON form of keyload's Avro records on the HTTP API, derived from the schemas: the server
(keyload/server/) and the SDK's HTTP transport both speak it.

One rule set, used both ways (request bodies into command records, outcomes into responses) and
by the OpenAPI document (`json_schema`):

- records are JSON objects with the schema's field names; a field with a default may be left out,
  and so may a map (then empty) and a record whose every field has a default (then `{}`, those
  defaults: `PUT .../queues/orders` with no body creates the queue with the default policy);
- `bytes` and `fixed` values are base64 strings (RFC 4648, standard alphabet, padded);
- `int` and `long` are JSON integers, `boolean` is true/false, enums are their symbol as a string;
- an optional field (a union with `null`) is `null` or the value itself;
- a union of several records (a batch mutation, an outcome's result) is an object with one
  member named by the record's short name: `{"Enqueue": {...}}`;
- maps are JSON objects, arrays JSON arrays.

A value that does not fit raises `WireError` naming the path of the field (`mutations[0].Enqueue.body`),
never the value, so a rejected request never echoes what the caller sent.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from keyload.errors import InvalidCommand
from keyload.log.codec import expanded_current

Schema = Any  # an Avro schema as parsed JSON: a name, a union (list) or a dict

# The HTTP API's own names (docs/ARCHITECTURE.md §10a), shared by the server and the SDK.
ENVELOPE_PATH = "/v1/commands"  # POST {"domain": D, "body": {"Kind": {...}}}: any command, as the log takes it
SERVICE_PATH = "/v1/service"  # GET: {"version", "partitions"}
CENSUS_PATH = "/v1/census"  # GET [?partition=P]: {"partitions": [census, ...]} (keyload/server/census.py)
# Which partition: of a partition-wide GET without {partition} in its path (default 0), of the census (default: all)
PARTITION_QUERY = "partition"
IDEMPOTENCY_HEADER = "Idempotency-Key"  # the command id
COMMAND_ID_HEADER = "Keyload-Command-Id"  # on every response to a request that became a command
# "true": an enqueue request may go in a Batch with others (keyload/server/coalescing.py)
COALESCE_HEADER = "Keyload-Coalesce"
UPLOAD_HANDLE_HEADER = "Keyload-Upload-Handle"  # a committed reservation's upload handle, for its upload

_INTEGERS = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


class WireError(InvalidCommand):
    """A request body or parameter that does not match the command's schema (HTTP 400)."""


class _Misfit(Exception):
    """A value that does not fit its schema, inside a converter built by `Names.avro_form`: what is
    wrong with it, and the steps from where it was found up to where it is caught (innermost first),
    so that its path is put together only when there is an error to report."""

    def __init__(self, what: str, unnamed: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.unnamed = unnamed  # what names the value when the path is empty
        self.steps: list[tuple[str, bool]] = []

    def within(self, step: str, *, field: bool = False) -> _Misfit:
        """The misfit, one step further out: a field's name, or what follows a path (`[3]`, `.member`)."""
        self.steps.append((step, field))
        return self

    def message(self, path: str) -> str:
        for step, field in reversed(self.steps):
            path = _join(path, step) if field else path + step
        return f"{path or self.unnamed} {self.what}"


JsonForm = Callable[[Any], Any]  # an Avro datum of one schema -> its JSON form
AvroForm = Callable[[Any], Any]  # the JSON form of a value of one schema -> its Avro datum, or _Misfit
F = TypeVar("F")  # what is built per schema node: a JsonForm (or None), an AvroForm
_REQUIRED = object()  # a record field a request must give
_EMPTY = object()  # a record field left out as {}: an empty map, or a record of its defaults
_PLAIN: dict[str, tuple[type, str]] = {"boolean": (bool, "must be true or false"), "string": (str, "must be a string")}


class Names:
    """The named types of one top-level schema, so that a type referenced by name after its first
    definition resolves to that definition; and the JSON form of each schema node, built once.

    `reader`: converting reads what a newer writer may have written. A record's JSON form may hold
    fields the schema lacks, and they are left out (records gain fields only at their end, as Avro
    schema resolution reads them); an enum's symbol the schema lacks is kept, as its string, for the
    typed layer to read or refuse (keyload/sdk/http_transport.py). For an SDK reading a newer
    server's outcomes; requests are held to their schema, so that a typo is not silently dropped."""

    def __init__(self, top: Schema, *, reader: bool = False) -> None:
        self.types: dict[str, dict[str, Any]] = {}
        self._reader = reader
        self._collect(top, "")
        # By id of a schema node, with the node itself (`_once`).
        self._json_forms: dict[int, tuple[Schema, JsonForm | None]] = {}
        self._record_forms: dict[str, JsonForm] = {}  # by full name: a record that contains itself
        self._avro_forms: dict[int, tuple[Schema, AvroForm]] = {}  # the same, the other way
        self._record_avro_forms: dict[str, AvroForm] = {}
        # Every form of `top` is built here, so that converting (from any thread) only reads: a record's
        # form is published before its fields are, for a record that contains itself.
        self.json_form(top)
        self.avro_form(top)

    def _collect(self, schema: Schema, namespace: str) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self._collect(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "enum", "fixed"):
                namespace = schema.get("namespace", namespace)
                self.types.setdefault(full_name(schema, namespace), schema)
                for field in schema.get("fields", []):
                    self._collect(field["type"], namespace)
            elif kind == "array":
                self._collect(schema["items"], namespace)
            elif kind == "map":
                self._collect(schema["values"], namespace)

    def resolve(self, schema: Schema) -> Schema:
        if isinstance(schema, str) and schema in self.types:
            return self.types[schema]
        if isinstance(schema, dict) and schema.get("type") in self.types:
            return self.types[schema["type"]]
        return schema

    def json_form(self, schema: Schema) -> JsonForm | None:
        """The function from an Avro datum of `schema` to its JSON form (None: the datum is its own
        JSON form). Built once per schema node from the rules above, so that converting a value walks
        the value alone: the schema is not looked at again (an outcome is converted per response)."""
        return _once(self._json_forms, schema, self._build_json_form)

    def _build_json_form(self, schema: Schema) -> JsonForm | None:
        schema = self.resolve(schema)
        kind = _kind(schema)
        if kind == "union":
            branches = _branches(self, schema)
            if len(branches) == 1:
                only = self.json_form(branches[0])
                return None if only is None else lambda datum: None if datum is None else only(datum)
            by_name = {full_name(b): (short_name(full_name(b)), self.json_form(b)) for b in branches}

            def union(datum: Any) -> Any:
                if datum is None:
                    return None
                name, inner = datum
                member, form = by_name[name]
                return {member: inner if form is None else form(inner)}

            return union
        if kind == "record":
            name = full_name(schema)
            if name in self._record_forms:
                return self._record_forms[name]
            fields: list[tuple[str, JsonForm | None]] = []

            def record(datum: Any) -> Any:
                return {field: datum[field] if form is None else form(datum[field]) for field, form in fields}

            self._record_forms[name] = record  # before its fields: one of them may be this record
            fields += [(field["name"], self.json_form(field["type"])) for field in schema["fields"]]
            return record
        if kind == "array":
            item = self.json_form(schema["items"])
            return list if item is None else lambda datum: [item(value) for value in datum]
        if kind == "map":
            value = self.json_form(schema["values"])
            return dict if value is None else lambda datum: {key: value(v) for key, v in datum.items()}
        if kind in ("bytes", "fixed"):
            return _base64
        return None

    def avro_form(self, schema: Schema) -> AvroForm:
        """The function from the JSON form of a value of `schema` to its Avro datum, checking it by
        the rules above (`_Misfit` where it does not fit). Built once per schema node, as `json_form`
        is, so that converting a request body walks the value alone: a Batch of 100 Enqueues is
        converted per request."""
        return _once(self._avro_forms, schema, self._build_avro_form)

    def _build_avro_form(self, schema: Schema) -> AvroForm:
        schema = self.resolve(schema)
        kind = _kind(schema)
        if kind == "union":
            return self._union_avro_form(schema)
        if kind == "record":
            return self._record_avro_form(schema)
        if kind == "enum":
            symbols = schema["symbols"]
            listing = ", ".join(symbols)

            def enum(value: Any) -> Any:
                if not isinstance(value, str) or not (self._reader or value in symbols):
                    raise _Misfit(f"must be one of {listing}")
                return value

            return enum
        if kind == "array":
            return _array_avro_form(self.avro_form(schema["items"]))
        if kind == "map":
            return _map_avro_form(self.avro_form(schema["values"]))
        if kind in ("bytes", "fixed"):
            return _bytes_avro_form(schema["size"] if kind == "fixed" else None)
        if kind in _INTEGERS:
            low, high = _INTEGERS[kind]

            def integer(value: Any) -> Any:
                if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                    raise _Misfit(f"must be an integer in {low}..{high}")
                return value

            return integer
        if kind in _PLAIN:
            plain, what = _PLAIN[kind]

            def checked(value: Any) -> Any:
                if not isinstance(value, plain):
                    raise _Misfit(what)
                return value

            return checked
        if kind == "null":
            return _null
        raise TypeError(f"no JSON form for Avro type {kind!r}")  # a schema type the API does not use

    def _union_avro_form(self, schema: list[Any]) -> AvroForm:
        nullable = "null" in schema
        branches = _branches(self, schema)
        if len(branches) == 1:
            only = self.avro_form(branches[0])
            return (lambda value: None if value is None else only(value)) if nullable else only
        members = {short_name(full_name(b)): (full_name(b), self.avro_form(b)) for b in branches}
        wrong = f"must be an object with one member, one of {', '.join(members)}"

        def union(value: Any) -> Any:
            if value is None and nullable:
                return None
            if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in members:
                raise _Misfit(wrong)
            ((member, inner),) = value.items()
            name, form = members[member]
            try:
                return (name, form(inner))
            except _Misfit as misfit:
                misfit.within(f".{member}")
                raise

        return union

    def _record_avro_form(self, schema: dict[str, Any]) -> AvroForm:
        name = full_name(schema)
        if name in self._record_avro_forms:
            return self._record_avro_forms[name]
        known = frozenset(field["name"] for field in schema["fields"])
        not_a_field = f"is not a field of {short_name(name)}"
        # (name, form, default): default is _REQUIRED, _EMPTY (converted from {}) or the schema's default
        fields: list[tuple[str, AvroForm, Any]] = []

        def record(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Misfit("must be a JSON object", unnamed="the body")
            if not self._reader and not known.issuperset(value):
                raise _Misfit(not_a_field).within(sorted(set(value) - known)[0][:64], field=True)
            datum = {}
            for field, form, default in fields:
                if field in value:
                    given = value[field]
                elif default is _REQUIRED:
                    raise _Misfit("is required").within(field, field=True)
                elif default is _EMPTY:
                    given = {}
                else:
                    datum[field] = default
                    continue
                try:
                    datum[field] = form(given)
                except _Misfit as misfit:
                    misfit.within(field, field=True)
                    raise
            return datum

        self._record_avro_forms[name] = record  # before its fields: one of them may be this record
        for field in schema["fields"]:
            default = (
                field["default"] if "default" in field else _EMPTY if _empty_when_left_out(self, field) else _REQUIRED
            )
            fields.append((field["name"], self.avro_form(field["type"]), default))
        return record


def _once(built: dict[int, tuple[Schema, F]], schema: Schema, build: Callable[[Schema], F]) -> F:
    """What `build` makes of a schema node, made once per node: by its id, kept with the node itself,
    which so stays alive and its id is never taken for another's."""
    cached = built.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    made = build(schema)
    built[id(schema)] = (schema, made)
    return made


def full_name(schema: dict[str, Any], namespace: str = "") -> str:
    name: str = schema["name"]
    if "." in name:
        return name
    own = schema.get("namespace", namespace)
    return f"{own}.{name}" if own else name


def short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@cache
def names(top: str, *, reader: bool = False) -> Names:
    """The named types of the current schema of `top` (keyload.Command, keyload.Outcome); `reader`:
    as a reader of a newer writer's values converts them (`Names`)."""
    return Names(expanded_current(top), reader=reader)


def _kind(schema: Schema) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    kind: str = schema["type"]
    return kind


def _branches(names_: Names, union: list[Any]) -> list[Schema]:
    return [names_.resolve(branch) for branch in union if branch != "null"]


def to_avro(names_: Names, schema: Schema, value: Any, path: str) -> Any:
    """The Avro datum (as fastavro writes it) of `value`, the JSON form of `schema`; `path` names
    `value` in what a WireError says."""
    try:
        return names_.avro_form(schema)(value)
    except _Misfit as misfit:
        raise WireError(misfit.message(path)) from None


def _array_avro_form(item: AvroForm) -> AvroForm:
    def array(value: Any) -> Any:
        if not isinstance(value, list):
            raise _Misfit("must be a JSON array")
        datum = []
        for index, given in enumerate(value):
            try:
                datum.append(item(given))
            except _Misfit as misfit:
                misfit.within(f"[{index}]")
                raise
        return datum

    return array


def _map_avro_form(values: AvroForm) -> AvroForm:
    def map_(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _Misfit("must be a JSON object")
        datum = {}
        for key, given in value.items():
            try:
                datum[key] = values(given)
            except _Misfit as misfit:
                misfit.within(f".{key[:64]}")
                raise
        return datum

    return map_


def _bytes_avro_form(size: int | None) -> AvroForm:
    """`bytes` (size None) or a `fixed` of `size` bytes, given in base64."""

    def bytes_(value: Any) -> Any:
        if not isinstance(value, str):
            raise _Misfit("must be a base64 string")
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _Misfit("is not valid base64") from None
        if size is not None and len(decoded) != size:
            raise _Misfit(f"must be {size} bytes")
        return decoded

    return bytes_


def _null(value: Any) -> Any:
    if value is not None:
        raise _Misfit("must be null")
    return None


def _empty_when_left_out(names_: Names, field: dict[str, Any]) -> bool:
    """Whether a field without a default may be left out as `{}`: a map (then empty) or a record
    whose every field has a default (then those defaults)."""
    schema = names_.resolve(field["type"])
    kind = _kind(schema)
    return kind == "map" or (kind == "record" and all("default" in inner for inner in schema["fields"]))


def required(names_: Names, field: dict[str, Any]) -> bool:
    """Whether a request must give `field` of a command's body: the OpenAPI document's request
    bodies (a record's own schema, shared with outcomes, which give every field, lists all)."""
    return "default" not in field and not _empty_when_left_out(names_, field)


def to_json(names_: Names, schema: Schema, datum: Any) -> Any:
    """The JSON form of `datum`, an Avro value of `schema` as the registry decodes it
    (a union of several records as a (full name, value) pair)."""
    form = names_.json_form(schema)
    return datum if form is None else form(datum)


def _base64(datum: bytes) -> str:
    return binascii.b2a_base64(datum, newline=False).decode("ascii")


_INTEGER_TEXT = re.compile(r"-?[0-9]{1,20}")  # what a JSON integer of 64 bits is written as


def from_text(names_: Names, schema: Schema, text: str, path: str) -> Any:
    """The JSON value of a path segment or query parameter `text` for a field of `schema`: integers
    and booleans are parsed, strings taken as they are, anything else is JSON."""
    kind = _kind(names_.resolve(schema))
    if kind == "union":
        branches = _branches(names_, schema)
        if text == "null" and "null" in schema:
            return None
        if len(branches) == 1:
            return from_text(names_, branches[0], text, path)
    if kind in _INTEGERS:
        if _INTEGER_TEXT.fullmatch(text) is None:  # int() takes other scripts' digits, ' 1', '+1' and '1_0' too
            raise WireError(f"{path} must be an integer")
        return int(text)
    if kind == "boolean":
        if text not in ("true", "false"):
            raise WireError(f"{path} must be true or false")
        return text == "true"
    if kind in ("string", "enum", "bytes", "fixed"):
        return text
    raise WireError(f"{path} cannot be given as a query parameter; send it in a JSON body")


def field_schema(names_: Names, record: Schema, name: str) -> Schema:
    """The schema of field `name` of `record`; KeyError when it has none."""
    for field in names_.resolve(record)["fields"]:
        if field["name"] == name:
            return field["type"]
    raise KeyError(name)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def json_schema(names_: Names, schema: Schema, refs: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema (OpenAPI 3.1) of the JSON form of `schema`; named records and enums go into
    `refs` (components/schemas, by full name) and are referenced."""
    schema = names_.resolve(schema)
    kind = _kind(schema)
    if kind == "union":
        branches = _branches(names_, schema)
        if len(branches) == 1:
            inner = json_schema(names_, branches[0], refs)
        else:
            inner = {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {short_name(full_name(b)): json_schema(names_, b, refs)},
                        "required": [short_name(full_name(b))],
                        "additionalProperties": False,
                    }
                    for b in branches
                ]
            }
        return {"anyOf": [inner, {"type": "null"}]} if "null" in schema else inner
    if kind in ("record", "enum"):
        name = full_name(schema)
        if name not in refs:
            refs[name] = {}  # placed first: a record that contains itself refers to its own entry
            refs[name] = _named_schema(names_, schema, refs)
        return {"$ref": f"#/components/schemas/{name}"}
    if kind == "array":
        return {"type": "array", "items": json_schema(names_, schema["items"], refs)}
    if kind == "map":
        return {"type": "object", "additionalProperties": json_schema(names_, schema["values"], refs)}
    if kind in ("bytes", "fixed"):
        return {"type": "string", "contentEncoding": "base64"}
    if kind in _INTEGERS:
        return {"type": "integer", "format": "int32" if kind == "int" else "int64"}
    return {"type": {"string": "string", "boolean": "boolean", "null": "null"}[kind]}


def _named_schema(names_: Names, schema: dict[str, Any], refs: dict[str, Any]) -> dict[str, Any]:
    described: dict[str, Any]
    if schema["type"] == "enum":
        described = {"type": "string", "enum": list(schema["symbols"])}
    else:
        described = {
            "type": "object",
            "properties": {f["name"]: _field_schema(names_, f, refs) for f in schema["fields"]},
            "required": [f["name"] for f in schema["fields"] if "default" not in f],
            "additionalProperties": False,
        }
    if "doc" in schema:
        described["description"] = schema["doc"]
    return described


def _field_schema(names_: Names, field: dict[str, Any], refs: dict[str, Any]) -> dict[str, Any]:
    described = json_schema(names_, field["type"], refs)
    if "doc" in field:
        described = {**described, "description": field["doc"]}
    return described
