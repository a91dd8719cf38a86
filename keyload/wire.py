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
from collections.abc import Callable
from functools import cache
from typing import Any

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
UPLOAD_HANDLE_HEADER = "Keyload-Upload-Handle"  # a committed reservation's upload handle, for its upload

_INTEGERS = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


class WireError(InvalidCommand):
    """A request body or parameter that does not match the command's schema (HTTP 400)."""


JsonForm = Callable[[Any], Any]  # an Avro datum of one schema -> its JSON form


class Names:
    """The named types of one top-level schema, so that a type referenced by name after its first
    definition resolves to that definition; and the JSON form of each schema node, built once."""

    def __init__(self, top: Schema) -> None:
        self.types: dict[str, dict[str, Any]] = {}
        self._collect(top, "")
        # By id of a schema node, with the node itself: it stays alive, and an id is never taken for another's.
        self._json_forms: dict[int, tuple[Schema, JsonForm | None]] = {}
        self._record_forms: dict[str, JsonForm] = {}  # by full name: a record that contains itself
        # Every form of `top` is built here, so that converting (from any thread) only reads: a record's
        # form is published before its fields are, for a record that contains itself.
        self.json_form(top)

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
        cached = self._json_forms.get(id(schema))
        if cached is not None and cached[0] is schema:
            return cached[1]
        form = self._build_json_form(schema)
        self._json_forms[id(schema)] = (schema, form)
        return form

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


def full_name(schema: dict[str, Any], namespace: str = "") -> str:
    name: str = schema["name"]
    if "." in name:
        return name
    own = schema.get("namespace", namespace)
    return f"{own}.{name}" if own else name


def short_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@cache
def names(top: str) -> Names:
    """The named types of the current schema of `top` (keyload.Command, keyload.Outcome)."""
    return Names(expanded_current(top))


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
    """The Avro datum (as fastavro writes it) of `value`, the JSON form of `schema`."""
    schema = names_.resolve(schema)
    kind = _kind(schema)
    if kind == "union":
        if value is None and "null" in schema:
            return None
        branches = _branches(names_, schema)
        if len(branches) == 1:
            return to_avro(names_, branches[0], value, path)
        by_name = {short_name(full_name(branch)): branch for branch in branches}
        if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in by_name:
            raise WireError(f"{path} must be an object with one member, one of {', '.join(by_name)}")
        ((member, inner),) = value.items()
        branch = by_name[member]
        return (full_name(branch), to_avro(names_, branch, inner, f"{path}.{member}"))
    if kind == "record":
        if not isinstance(value, dict):
            raise WireError(f"{path or 'the body'} must be a JSON object")
        known = {field["name"] for field in schema["fields"]}
        unknown = sorted(set(value) - known)
        if unknown:
            raise WireError(f"{_join(path, unknown[0][:64])} is not a field of {short_name(full_name(schema))}")
        record = {}
        for field in schema["fields"]:
            name = field["name"]
            if name in value:
                record[name] = to_avro(names_, field["type"], value[name], _join(path, name))
            elif "default" in field:
                record[name] = field["default"]
            elif _empty_when_left_out(names_, field):
                record[name] = to_avro(names_, field["type"], {}, _join(path, name))
            else:
                raise WireError(f"{_join(path, name)} is required")
        return record
    if kind == "enum":
        if value not in schema["symbols"]:
            raise WireError(f"{path} must be one of {', '.join(schema['symbols'])}")
        return value
    if kind == "array":
        if not isinstance(value, list):
            raise WireError(f"{path} must be a JSON array")
        return [to_avro(names_, schema["items"], item, f"{path}[{i}]") for i, item in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise WireError(f"{path} must be a JSON object")
        return {key: to_avro(names_, schema["values"], item, f"{path}.{key[:64]}") for key, item in value.items()}
    if kind in ("bytes", "fixed"):
        if not isinstance(value, str):
            raise WireError(f"{path} must be a base64 string")
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise WireError(f"{path} is not valid base64") from None
        if kind == "fixed" and len(decoded) != schema["size"]:
            raise WireError(f"{path} must be {schema['size']} bytes")
        return decoded
    if kind in _INTEGERS:
        low, high = _INTEGERS[kind]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise WireError(f"{path} must be an integer in {low}..{high}")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise WireError(f"{path} must be true or false")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise WireError(f"{path} must be a string")
        return value
    if kind == "null":
        if value is not None:
            raise WireError(f"{path} must be null")
        return None
    raise TypeError(f"no JSON form for Avro type {kind!r}")  # a schema type the API does not use


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
        try:
            return int(text)
        except ValueError:
            raise WireError(f"{path} must be an integer") from None
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
