"""The Avro records of command bodies, read from the `.avsc` files without an Avro library.

The CLI derives its table-driven subcommands' options from these (keyload/cli/commands.py);
reading JSON keeps `keyload --help` free of fastavro and of the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

Schema = Any  # an Avro schema as JSON: a name, a list (union) or a dict


@cache
def _file(name: str) -> dict[str, Any]:
    text = resources.files("keyload.schemas").joinpath(f"{name}.avsc").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _named() -> dict[str, dict[str, Any]]:
    """Every named type defined inline in keyload.Command (command bodies and their records)."""
    found: dict[str, dict[str, Any]] = {}

    def walk(schema: Schema, namespace: str) -> None:
        if isinstance(schema, list):
            for branch in schema:
                walk(branch, namespace)
        elif isinstance(schema, dict):
            ns = schema.get("namespace", namespace)
            if schema.get("type") in ("record", "enum", "fixed") and "name" in schema:
                full = schema["name"] if "." in schema["name"] else f"{ns}.{schema['name']}"
                found[full] = schema
                for field in schema.get("fields", []):
                    walk(field["type"], ns)
            elif schema.get("type") == "array":
                walk(schema["items"], ns)
            elif schema.get("type") == "map":
                walk(schema["values"], ns)

    walk(_file("keyload.Command"), "keyload")
    return found


def resolve(schema: Schema) -> Schema:
    """A named type's definition (inline in keyload.Command or in its own file); others as given."""
    if isinstance(schema, str) and "." in schema:
        return _named().get(schema) or _file(schema)
    return schema


@dataclass(frozen=True)
class Field:
    name: str
    schema: Schema  # resolved, the null branch of an optional union removed
    optional: bool  # the union has a null branch
    has_default: bool
    default: Any
    doc: str | None

    @property
    def kind(self) -> str:
        """string, long, int, boolean, bytes, enum, record, array, map, double, ..."""
        if isinstance(self.schema, str):
            return self.schema
        kind: str = self.schema["type"]
        return kind

    @property
    def required(self) -> bool:
        return not self.optional and not self.has_default


def body_record(name: str) -> dict[str, Any]:
    """The command body record keyload.command.<name>, as in keyload.Command (JSON)."""
    return _named()[f"keyload.command.{name}"]


def body_fields(name: str) -> list[Field]:
    """The fields of the command body record keyload.command.<name>."""
    return record_fields(body_record(name))


def record_fields(schema: Schema) -> list[Field]:
    return [field_of(raw) for raw in resolve(schema)["fields"]]


def field_of(raw: dict[str, Any]) -> Field:
    schema = raw["type"]
    optional = isinstance(schema, list) and "null" in schema
    if isinstance(schema, list):
        rest = [branch for branch in schema if branch != "null"]
        schema = rest[0] if len(rest) == 1 else rest
    return Field(raw["name"], resolve(schema), optional, "default" in raw, raw.get("default"), raw.get("doc"))
