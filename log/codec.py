"""Avro single-object encoding over a registry of every historical writer schema.

Each encoded value is `C3 01 | CRC-64-AVRO fingerprint (8 bytes, big-endian) | body`. The Avro
specification writes the fingerprint little-endian; keyload's logs and projections hold it reversed
since their first release, and it is part of the contract (docs/ARCHITECTURE.md §10a).
The fingerprint names the writer schema; a value written under any version in
`schemas/history/` decodes under the current schema by Avro schema resolution.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
from fastavro.validation import validate

from keyload.errors import KeyloadError
from keyload.log.avro_compiler import CompiledSchema, Unsupported, compile_schema

MAGIC = b"\xc3\x01"
HEADER_BYTES = 10

# Top-level schemas that are written as single-object encoded values.
TOP_LEVEL = (
    "keyload.Command",
    "keyload.Outcome",
    "keyload.QueueRecord",
    "keyload.MessageMeta",
    "keyload.PoisonEntry",
    "keyload.Waiter",
    "keyload.TopicRecord",
    "keyload.EventRecord",
    "keyload.GroupRecord",
    "keyload.PositionMeta",
    "keyload.DocumentRecord",
    "keyload.InboxEntry",
    "keyload.InboxRecord",
    "keyload.DomainRecord",
    "keyload.PayloadReservation",
    "keyload.RetentionTask",
    "keyload.PrincipalRecord",
    "keyload.Signed",
)

Record = dict[str, Any]


class CodecError(KeyloadError):
    """Bytes that are not a readable single-object encoded value of the expected type."""


class UnknownSchema(CodecError):
    """The value's writer fingerprint is not in the registry."""


@dataclass(frozen=True, slots=True)
class _Writer:
    name: str
    schema: Any  # parsed writer schema


@dataclass(frozen=True, slots=True)
class Released:
    """One frozen version of a top-level type from `schemas/history/`, parsed once."""

    version: int
    header: bytes  # MAGIC + the version's fingerprint: how a value written under it starts
    schema: Any  # parsed writer schema


def _fingerprint(schema: Any) -> bytes:
    hex_fp: str = fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
    return bytes.fromhex(hex_fp)[::-1]  # fastavro gives the spec's little-endian bytes: reversed, as ever written


def expanded_current(name: str) -> Any:
    """The current schema of `name` with every referenced type inlined."""
    path = resources.files("keyload.schemas").joinpath(f"{name}.avsc")
    with resources.as_file(path) as file:
        return load_schema(str(file), _write_hint=False)


def history(name: str) -> list[tuple[int, Any]]:
    """Every released version of `name`, oldest first."""
    folder = resources.files("keyload.schemas").joinpath("history", name)
    versions: list[tuple[int, Any]] = []
    if not folder.is_dir():
        return versions
    for entry in folder.iterdir():
        if entry.name.endswith(".avsc"):
            version = int(entry.name.removeprefix("v").removesuffix(".avsc"))
            versions.append((version, json.loads(entry.read_text("utf-8"))))
    return sorted(versions, key=lambda item: item[0])


class SchemaRegistry:
    """Current reader schemas plus every historical writer schema, by fingerprint."""

    def __init__(self) -> None:
        self._current: dict[str, Any] = {}
        self._current_header: dict[str, bytes] = {}
        self._writers: dict[bytes, _Writer] = {}
        self._released: dict[str, tuple[Released, ...]] = {}
        self._compiled: dict[str, CompiledSchema] = {}  # generated on first use (log/avro_compiler.py)
        for name in TOP_LEVEL:
            current = parse_schema(expanded_current(name))
            self._current[name] = current
            fp = _fingerprint(current)
            self._current_header[name] = MAGIC + fp
            self._writers[fp] = _Writer(name, current)
            released = []
            for version, old in history(name):
                parsed = parse_schema(old)
                old_fp = _fingerprint(parsed)
                self._writers.setdefault(old_fp, _Writer(name, parsed))
                released.append(Released(version, MAGIC + old_fp, parsed))
            self._released[name] = tuple(released)
        # A digest of every top-level type's current fingerprint: a projection marked with another
        # one may hold values written under older versions (projections/migration.py).
        marker = hashlib.sha256()
        for name in TOP_LEVEL:
            marker.update(name.encode("ascii") + b"\x00" + self._current_header[name])
        self.schema_set = marker.digest()

    def schema(self, name: str) -> Any:
        return self._current[name]

    def released(self, name: str) -> tuple[Released, ...]:
        """Every released version of `name`, oldest first (the current one too, once frozen)."""
        return self._released[name]

    def encode(self, name: str, record: Record) -> bytes:
        return self._current_header[name] + self.encode_body(name, record)

    def encode_body(self, name: str, record: Record) -> bytes:
        """The Avro binary body alone, without the single-object header."""
        try:
            return self._compiled_for(name).encode(record)
        except Unsupported:
            pass  # fastavro writes it, or names why it cannot
        out = io.BytesIO()
        schemaless_writer(out, self._current[name], record)
        return out.getvalue()

    def _compiled_for(self, name: str) -> CompiledSchema:
        compiled = self._compiled.get(name)
        if compiled is None:
            compiled = self._compiled[name] = compile_schema(self._current[name])
        return compiled

    def encode_body_under(self, schema: Any, record: Record) -> bytes:
        """The Avro binary body of `record` under another (released) parsed schema.

        CodecError when that schema cannot write it (a union branch or enum symbol it
        lacks). Fields it lacks are dropped silently: compare a decoded round trip to
        know whether the encoding is lossless.
        """
        out = io.BytesIO()
        try:
            schemaless_writer(out, schema, record)
        except Exception as exc:  # fastavro raises ValueError, TypeError, ... on values a schema cannot hold
            raise CodecError(f"not representable under that schema: {type(exc).__name__}: {exc}") from exc
        return out.getvalue()

    def mismatched_fields(self, name: str, record: Record) -> list[str]:
        """The schema paths (never the values) at which `record` does not fit `name`'s schema,
        sorted; empty when it fits, or when fastavro cannot say where."""
        try:
            validate(record, self.schema(name), raise_errors=True)
        except Exception as exc:  # fastavro's ValidationError, or whatever a value makes it raise
            found = {str(error.field) for error in getattr(exc, "errors", ()) if getattr(error, "field", None)}
            return sorted(found)
        return []

    def is_current(self, name: str, data: bytes) -> bool:
        """Whether `data` was written under the current schema of `name`."""
        return data[:HEADER_BYTES] == self._current_header[name]

    def writer_name(self, data: bytes) -> str:
        """The top-level type a value was written as; raises CodecError/UnknownSchema."""
        return self._writer(data).name

    def decode(self, name: str, data: bytes) -> Record:
        writer = self._writer(data)
        if writer.name != name:
            raise CodecError(f"expected {name}, found {writer.name}")
        current = self._current[name]
        if writer.schema is current:
            try:
                value, end = self._compiled_for(name).decode(data, HEADER_BYTES)
                if end == len(data):
                    return value  # type: ignore[no-any-return]
            except Unsupported:
                pass  # fastavro reads it, or names what is wrong with it
        reader = None if writer.schema is current else current
        body = io.BytesIO(data[HEADER_BYTES:])
        try:
            record: Record = schemaless_reader(  # type: ignore[assignment]
                body,
                writer.schema,
                reader,
                return_record_name=True,
                return_record_name_override=True,
            )
        except Exception as exc:  # fastavro raises many types on malformed bodies
            raise CodecError(f"malformed {name} body: {type(exc).__name__}") from exc
        if body.tell() != len(data) - HEADER_BYTES:
            raise CodecError(f"malformed {name} body: {len(data) - HEADER_BYTES - body.tell()} trailing bytes")
        return record

    def _writer(self, data: bytes) -> _Writer:
        if len(data) < HEADER_BYTES or data[:2] != MAGIC:
            raise CodecError("not an Avro single-object encoded value")
        writer = self._writers.get(data[2:HEADER_BYTES])
        if writer is None:
            raise UnknownSchema(f"unknown writer schema fingerprint {data[2:HEADER_BYTES].hex()}")
        return writer


def encoded_optional_long(value: int | None) -> bytes:
    """The Avro binary encoding of a ["null", "long"] (or "int") union value."""
    if value is None:
        return b"\x00"
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray(b"\x02")
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


REGISTRY = SchemaRegistry()
