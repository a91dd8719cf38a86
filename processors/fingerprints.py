"""The fingerprint of a command: what idempotency compares a repeat of a command id against.

SHA-256 over the command's canonical bytes (its Avro encoding with maps in key order, under the
oldest released Command version that represents it losslessly), up to the informational tail
that retries may change. processors/apply.py stores it with every outcome (docs/ARCHITECTURE.md §5).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

from keyload.log.codec import (
    HEADER_BYTES,
    REGISTRY,
    CodecError,
    Record,
    Released,
    encoded_optional_long,
    expanded_current,
    history,
)

COMMAND = "keyload.Command"
FINGERPRINT_BYTES = 32
INFORMATIONAL_TAIL = ("reply_to", "client_time_ms")
OPTIONAL_VARINTS = (["null", "int"], ["null", "long"])  # encoded alike: how long the tail is


def _ends_in_informational_tail(schema: Any) -> bool:
    tail = schema["fields"][-len(INFORMATIONAL_TAIL) :]
    names = tuple(f["name"] for f in tail)
    return names == INFORMATIONAL_TAIL and all(f["type"] in OPTIONAL_VARINTS for f in tail)


# Every version's fingerprint leaves out the same tail, measured the same way.
assert all(
    _ends_in_informational_tail(schema)
    for schema in (REGISTRY.schema(COMMAND), *(released.schema for released in REGISTRY.released(COMMAND)))
)


# Where a map sits in a command body: field names, ITEMS stepping into every item of an array,
# PRESENT into the value of an optional (["null", X]) field when it is not null, BRANCH + a
# record's full name into the value of a union of several records when it is that branch
# (decoded as a (name, value) pair: a Batch's mutations).
MapPath = tuple[str, ...]
ITEMS = "[]"
PRESENT = "?"
BRANCH = "|"


def _map_paths(schema: Any, named: dict[str, Any], path: MapPath = ()) -> list[MapPath]:
    """Every map inside `schema` (a parsed schema), following records, arrays and optional values."""
    if isinstance(schema, str) and schema in named:
        return _map_paths(named[schema], named, path)
    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        if len(branches) == 1:
            return _map_paths(branches[0], named, (*path, PRESENT))
        found = []
        for branch in branches:
            name = branch if isinstance(branch, str) else branch.get("name")
            paths = _map_paths(branch, named, (*path, BRANCH + str(name)))
            assert not paths or name in named, "map inside a union branch that is not a named record"
            found += paths
        return found
    if not isinstance(schema, dict):
        return []
    if schema["type"] == "map":
        return [path]
    if schema["type"] == "array":
        return _map_paths(schema["items"], named, (*path, ITEMS))
    if schema["type"] != "record":
        return []
    named[schema["name"]] = schema
    return [found for f in schema["fields"] for found in _map_paths(f["type"], named, (*path, f["name"]))]


def _map_fields(schema: Any) -> dict[str, tuple[MapPath, ...]]:
    """Per command kind, where its body holds maps: Avro maps have no order, so the fingerprint sorts them."""
    [body] = [f for f in schema["fields"] if f["name"] == "body"]
    named: dict[str, Any] = {}
    found = {}
    for branch in body["type"]:
        paths = tuple(_map_paths(branch, named))
        if paths:
            found[branch["name"]] = paths
    return found


MAP_FIELDS = _map_fields(REGISTRY.schema(COMMAND))


def fingerprint(command: Record, value: bytes) -> bytes:
    """SHA-256 over the command's canonical bytes, up to the informational tail (reply-to,
    client time) that retries may change: its Avro encoding, maps in key order, under the
    oldest released Command version that represents it losslessly.

    The oldest, so that a command keeps its fingerprint across upgrades: a processor
    stores the fingerprint with the outcome, and neither a retry after an upgrade nor a
    replay by the new processor may see another one. For a kind whose record never
    changed every version encodes alike, so the current one is used; and the canonical
    bytes are then a prefix of the record as written whenever it was written under the
    current schema with its maps in key order: the common case needs no re-encoding.
    """
    kind, body = command["body"]
    if kind in CHANGED_KINDS:
        return _prefix_digest(command, _oldest_lossless_encoding(_canonical(command), CHANGED_KINDS[kind]))
    paths = MAP_FIELDS.get(kind, ())
    if REGISTRY.is_current(COMMAND, value) and all(_in_key_order(m) for path in paths for m in _maps_at(body, path)):
        encoded = value[HEADER_BYTES:]
    else:
        encoded = REGISTRY.encode_body(COMMAND, _canonical(command))
    return _prefix_digest(command, encoded)


def _oldest_lossless_encoding(canonical: Record, candidates: tuple[Released, ...]) -> bytes:
    """The command's body under the oldest of `candidates` (its kind's older shapes) that writes it
    and reads it back unchanged; a command setting a field older versions lack gets a newer (or the
    current) one."""
    for released in candidates:
        try:
            encoded = REGISTRY.encode_body_under(released.schema, canonical)
            if REGISTRY.decode(COMMAND, released.header + encoded) == canonical:
                return encoded
        except CodecError:
            continue  # a kind, union branch or enum symbol that version lacks
    return REGISTRY.encode_body(COMMAND, canonical)


NAMING_KEYS = frozenset({"name", "namespace", "aliases", "symbols", "default"})  # strings that are not type references


def _branch_shapes(schema: Any) -> dict[str, str]:
    """Per command kind of an (expanded, unparsed) Command schema, its body record with every
    named type it references written out, docs left out: equal shapes encode alike."""
    named: dict[str, Any] = {}

    def collect(node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for item in node:
                collect(item, namespace)
        elif isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed"):
                space = node.get("namespace", namespace)
                named[node["name"] if "." in node["name"] else f"{space}.{node['name']}"] = node
                namespace = space
            for value in node.values():
                collect(value, namespace)

    def expand(node: Any) -> Any:
        if isinstance(node, str):
            return expand(named[node]) if node in named else node
        if isinstance(node, list):
            return [expand(item) for item in node]
        if isinstance(node, dict):
            return {key: value if key in NAMING_KEYS else expand(value) for key, value in node.items() if key != "doc"}
        return node

    collect(schema, "")
    [body] = [f for f in schema["fields"] if f["name"] == "body"]
    shapes = {}
    for branch in body["type"]:
        name = branch if isinstance(branch, str) else branch["name"]
        full = name if "." in name else f"{branch['namespace']}.{name}"
        shapes[full] = json.dumps(expand(branch), sort_keys=True)
    return shapes


def _changed_kinds() -> dict[str, tuple[Released, ...]]:
    """Command kinds whose record differs between released versions (or the current one), each with
    the oldest released version of every shape it had before the current one: the only versions
    worth trying (one lacking the kind cannot write it, and equal shapes encode alike)."""
    released = {r.version: r for r in REGISTRY.released(COMMAND)}
    current = _branch_shapes(expanded_current(COMMAND))
    older: dict[str, dict[str, Released]] = {}  # kind -> shape -> its oldest version
    for version, schema in history(COMMAND):
        for kind, shape in _branch_shapes(schema).items():
            if shape != current.get(kind):
                older.setdefault(kind, {}).setdefault(shape, released[version])
    return {kind: tuple(shapes.values()) for kind, shapes in older.items()}


# ReadTopic and GroupReceive since Command v4: these fingerprint under their oldest lossless version.
CHANGED_KINDS = _changed_kinds()


def _canonical(command: Record) -> Record:
    """The command with every map in key order."""
    kind, body = command["body"]
    for path in MAP_FIELDS.get(kind, ()):
        body = _sorting_maps(body, path)
    return dict(command, body=(kind, body))


def _prefix_digest(command: Record, encoded: bytes) -> bytes:
    """SHA-256 over an encoding of `command` (under any Command version) up to the informational tail."""
    tail = sum(len(encoded_optional_long(command[field])) for field in INFORMATIONAL_TAIL)
    return hashlib.sha256(encoded[: len(encoded) - tail]).digest()


def _in_key_order(mapping: dict[str, Any]) -> bool:
    return all(a < b for a, b in itertools.pairwise(mapping))


def _maps_at(value: Any, path: MapPath) -> Iterator[dict[str, Any]]:
    if not path:
        yield value
        return
    if path[0] == PRESENT:
        if value is not None:
            yield from _maps_at(value, path[1:])
        return
    if path[0].startswith(BRANCH):
        if value[0] == path[0][1:]:
            yield from _maps_at(value[1], path[1:])
        return
    for item in value if path[0] == ITEMS else (value[path[0]],):
        yield from _maps_at(item, path[1:])


def _sorting_maps(value: Any, path: MapPath) -> Any:
    """A copy of `value` whose maps at `path` are in key order."""
    if not path:
        return dict(sorted(value.items()))
    if path[0] == PRESENT:
        return None if value is None else _sorting_maps(value, path[1:])
    if path[0].startswith(BRANCH):
        return (value[0], _sorting_maps(value[1], path[1:])) if value[0] == path[0][1:] else value
    if path[0] == ITEMS:
        return [_sorting_maps(item, path[1:]) for item in value]
    return dict(value, **{path[0]: _sorting_maps(value[path[0]], path[1:])})
