"""Avro binary encoders and decoders generated once per parsed schema.

fastavro interprets a schema for every value it reads or writes; on keyload's small, deeply
nested records most of that time is spent walking the schema, not the bytes. This module
turns one parsed schema (as `fastavro.parse_schema` returns it) into Python source — one
function per record type, primitives inlined — and compiles it once.

The generated code is an accelerator, never a second definition of the format: it handles
the values keyload writes and the bytes it reads, with strict type checks, and raises
`Unsupported` on anything else (a value fastavro might coerce, a branch choice fastavro makes
by validation, a malformed or unusual body). The codec then asks fastavro, so every answer —
bytes, decoded value or error — is fastavro's. tests/test_avro_compiler.py proves the
generated code byte-identical to fastavro over every schema version in `schemas/history/`,
hypothesis-generated values and mutated bodies.

Decoding mirrors `schemaless_reader(..., return_record_name=True,
return_record_name_override=True)` with the writer schema as reader: a union branch that is a
record (or a reference to a named type) comes back as `(name, value)` unless it is the union's
only such branch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastavro.const import AVRO_TYPES

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
MAX_VARINT_BYTES = 10  # a zig-zag long never takes more

_MISSING = object()

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes, int], tuple[Any, int]]


class Unsupported(Exception):
    """The generated code does not answer for this value or body: ask fastavro."""


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """Generated binary codec of one parsed schema; both functions raise Unsupported to defer."""

    encode: Encoder  # value -> Avro binary body
    decode: Decoder  # (data, start) -> (value, end)


def compile_schema(schema: Any) -> CompiledSchema:
    """Generate and compile the codec of one parsed schema (writer and reader alike)."""
    return _Generator(schema).build()


# --- the names the generated code uses besides its own ------------------------------------------


_RUNTIME: dict[str, Any] = {
    "Unsupported": Unsupported,
    "_MISSING": _MISSING,
    "INT_MIN": INT_MIN,
    "INT_MAX": INT_MAX,
    "LONG_MIN": LONG_MIN,
    "LONG_MAX": LONG_MAX,
}


# --- generation ---------------------------------------------------------------------------------


def _kind(schema: Any) -> str:
    """The Avro type of a schema node; "ref" for a reference to a named type by name."""
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        kind = schema["type"]
        return _kind(kind) if isinstance(kind, (dict, list)) else str(kind)
    return str(schema) if schema in AVRO_TYPES else "ref"  # fastavro's test for a named reference


class _Generator:
    """Writes the source of one schema's codec: a function per record, union, enum, array, map."""

    def __init__(self, schema: Any) -> None:
        self._root = schema
        self._named: dict[str, Any] = {}  # full name -> its defining node
        self._functions: dict[int, tuple[str, str]] = {}  # id(node) -> (writer name, reader name)
        self._source: list[str] = []
        self._constants: dict[str, Any] = {}
        self._count = 0

    def build(self) -> CompiledSchema:
        writer, reader = self._function(self._root)
        namespace = dict(_RUNTIME)
        namespace.update(self._constants)
        exec(compile("\n".join(self._source), "<keyload avro codec>", "exec"), namespace)
        encode_node, decode_node = namespace[writer], namespace[reader]

        def encode(value: Any) -> bytes:
            out = bytearray()
            try:
                encode_node(value, out)
            except Unsupported:
                raise
            except Exception as exc:  # a value the strict checks let through but Python refused
                raise Unsupported from exc
            return bytes(out)

        def decode(data: bytes, pos: int) -> tuple[Any, int]:
            if type(data) is not bytes:
                raise Unsupported
            try:
                value, end = decode_node(data, pos)
            except Unsupported:
                raise
            except Exception as exc:  # truncated or malformed: fastavro names the error
                raise Unsupported from exc
            return value, end

        return CompiledSchema(encode, decode)

    # Every node gets a writer `w_N(v, out)` and a reader `r_N(data, pos) -> (value, pos)`.

    def _resolve(self, schema: Any) -> Any:
        while True:
            if isinstance(schema, dict) and isinstance(schema["type"], (dict, list)):
                schema = schema["type"]
            elif _kind(schema) == "ref":
                schema = self._named[schema]
            else:
                return schema

    def _constant(self, value: Any) -> str:
        name = f"K{len(self._constants)}"
        self._constants[name] = value
        return name

    def _function(self, schema: Any) -> tuple[str, str]:
        schema = self._resolve(schema)
        if id(schema) in self._functions:
            return self._functions[id(schema)]
        self._count += 1
        names = (f"w_{self._count}", f"r_{self._count}")
        self._functions[id(schema)] = names
        kind = _kind(schema)
        if isinstance(schema, dict) and kind in ("record", "error", "enum", "fixed"):
            self._named[schema["name"]] = schema
        generators: dict[str, Callable[[Any, str, str], None]] = {
            "record": self._gen_record,
            "error": self._gen_record,
            "enum": self._gen_enum,
            "fixed": self._gen_fixed,
            "array": self._gen_array,
            "map": self._gen_map,
            "union": self._gen_union,
        }
        generators.get(kind, self._gen_primitive)(schema, *names)
        return names

    # Writers: `v` holds the value, `out` the bytearray. Readers: `data`, `pos`, `end`.

    def _gen_primitive(self, schema: Any, writer: str, reader: str) -> None:
        write, read = _PRIMITIVE.get(_kind(schema), _DEFERRED)
        self._source += [f"def {writer}(x, out):", *_indent(write), ""]
        self._source += [f"def {reader}(data, pos):", "    end = len(data)", *_indent(read), "    return x, pos", ""]

    def _gen_record(self, schema: dict[str, Any], writer: str, reader: str) -> None:
        write = [f"def {writer}(v, out):", "    if type(v) is not dict or '-type' in v:", "        raise Unsupported"]
        read = [f"def {reader}(data, pos):", "    end = len(data)", "    rec = {}"]
        for field in schema["fields"]:
            name = repr(field["name"])
            write.append(f"    x = v.get({name}, _MISSING)")
            write.append("    if x is _MISSING:")
            if "default" in field:
                write.append(f"        x = {self._constant(field['default'])}")
            else:
                write.append("        raise Unsupported")
            write += _indent(self._inline_write(field["type"]))
            read += _indent(self._inline_read(field["type"]))
            read.append(f"    rec[{name}] = x")
        read.append("    return rec, pos")
        self._source += [*write, "", *read, ""]

    def _inline_write(self, schema: Any) -> list[str]:
        """Lines writing `x`: primitives and optional values in place, the rest by function."""
        node = self._resolve(schema)
        kind = _kind(node)
        if kind in _PRIMITIVE:
            return _PRIMITIVE[kind][0]
        optional = _optional(node)
        if optional is not None:
            null, other = optional
            return [
                "if x is None:",
                f"    out.append({null * 2})",
                "else:",
                f"    out.append({other * 2})",
                *_indent(self._inline_write(node[other])),
            ]
        writer, _ = self._function(node)
        return [f"{writer}(x, out)"]

    def _inline_read(self, schema: Any) -> list[str]:
        node = self._resolve(schema)
        kind = _kind(node)
        if kind in _PRIMITIVE:
            return _PRIMITIVE[kind][1]
        optional = _optional(node)
        if optional is not None:
            null, other = optional
            return [
                "b = data[pos]",
                "pos += 1",
                f"if b == {null * 2}:",
                "    x = None",
                f"elif b == {other * 2}:",
                *_indent(self._inline_read(node[other])),
                "else:",
                "    raise Unsupported",
            ]
        _, reader = self._function(node)
        return [f"x, pos = {reader}(data, pos)"]

    def _gen_enum(self, schema: dict[str, Any], writer: str, reader: str) -> None:
        symbols = list(schema["symbols"])
        index = self._constant({symbol: position for position, symbol in enumerate(symbols)})
        table = self._constant(tuple(symbols))
        self._source += [
            f"def {writer}(v, out):",
            "    if type(v) is not str:",
            "        raise Unsupported",
            f"    i = {index}.get(v)",
            "    if i is None:",
            "        raise Unsupported",
            *_indent(_count_write("i")),
            "",
            f"def {reader}(data, pos):",
            "    end = len(data)",
            *_indent(_READ_LONG),
            f"    if not 0 <= x < {len(symbols)}:",
            "        raise Unsupported",
            f"    return {table}[x], pos",
            "",
        ]

    def _gen_fixed(self, schema: dict[str, Any], writer: str, reader: str) -> None:
        size = int(schema["size"])
        self._source += [
            f"def {writer}(v, out):",
            f"    if type(v) is not bytes or len(v) != {size}:",
            "        raise Unsupported",
            "    out += v",
            "",
            f"def {reader}(data, pos):",
            f"    if pos + {size} > len(data):",
            "        raise Unsupported",
            f"    return data[pos:pos + {size}], pos + {size}",
            "",
        ]

    def _gen_array(self, schema: dict[str, Any], writer: str, reader: str) -> None:
        self._blocks(schema["items"], writer, reader, "list", "for x in v:", "items.append(x)", "items = []")

    def _gen_map(self, schema: dict[str, Any], writer: str, reader: str) -> None:
        self._blocks(
            schema["values"], writer, reader, "dict", "for k, x in v.items():", "items[k] = x", "items = {}", key=True
        )

    def _blocks(
        self, item: Any, writer: str, reader: str, pytype: str, loop: str, store: str, start: str, key: bool = False
    ) -> None:
        """Arrays and maps: one block of `len(v)` items, then the empty block. Negative block
        counts (with a byte size) are valid Avro that keyload never writes: fastavro reads them."""
        write_key = ["y = x", "x = k", *_PRIMITIVE["string"][0], "x = y"] if key else []
        read_key = [*_STRING_READ, "k = x"] if key else []
        self._source += [
            f"def {writer}(v, out):",
            f"    if type(v) is not {pytype}:",
            "        raise Unsupported",
            "    if v:",
            "        n = len(v)",
            *_indent(_count_write("n"), 2),
            f"        {loop}",
            *_indent(write_key + self._inline_write(item), 3),
            "    out.append(0)",
            "",
            f"def {reader}(data, pos):",
            "    end = len(data)",
            f"    {start}",
            "    while True:",
            *_indent(_READ_LONG, 2),
            "        if x == 0:",
            "            return items, pos",
            "        if x < 0:",
            "            raise Unsupported",
            "        for _ in range(x):",
            *_indent(read_key + self._inline_read(item) + [store], 3),
            "",
        ]

    def _gen_union(self, branches: list[Any], writer: str, reader: str) -> None:
        """Branch choice as fastavro makes it for the values keyload writes: by `(name, value)`
        tuple, or by the value's Python type when exactly one branch can hold it."""
        functions = [self._function(branch) for branch in branches]
        kinds = [_kind(branch) for branch in branches]
        nodes = [self._resolve(branch) for branch in branches]
        by_name: dict[str, int] = {}
        for position, branch in enumerate(branches):
            # fastavro takes a (name, value) tuple for a record (by its name), a named reference
            # or a primitive written as its bare name; naming any other branch it refuses
            if kinds[position] in ("record", "error"):
                by_name.setdefault(branch["name"], position)
            elif isinstance(branch, str):
                by_name.setdefault(branch, position)
        # fastavro counts a reference to any named type as a record here, and tags none of
        # the values of a union with exactly one record.
        single_record = sum(kind in ("record", "ref") for kind in kinds) == 1
        tags = tuple(
            nodes[position]["name"] if kind in ("record", "ref") and not single_record else None
            for position, kind in enumerate(kinds)
        )
        write_table = f"({', '.join(w for w, _ in functions)},)"
        read_table = f"({', '.join(r for _, r in functions)},)"
        names = self._constant(by_name)
        choice = self._constant(_type_choice([_kind(node) for node in nodes], nodes))
        tagged = self._constant(tags)
        self._source += [
            f"def {writer}(v, out):",
            "    if type(v) is tuple:",
            "        if len(v) != 2:",
            "            raise Unsupported",
            f"        i = {names}.get(v[0])",
            "        if i is None:",
            "            raise Unsupported",
            "        v = v[1]",
            "    else:",
            f"        i = {choice}(v)",
            "    n = i",
            *_indent(_count_write("n")),
            f"    {write_table}[i](v, out)",
            "",
            f"def {reader}(data, pos):",
            "    end = len(data)",
            *_indent(_READ_LONG),
            f"    if not 0 <= x < {len(branches)}:",
            "        raise Unsupported",
            f"    value, pos = {read_table}[x](data, pos)",
            f"    tag = {tagged}[x]",
            "    return (value if tag is None else (tag, value)), pos",
            "",
        ]


def _optional(node: Any) -> tuple[int, int] | None:
    """(null's index, the other's) of a two-branch union with null: untagged either way, and
    fastavro's choice is by `is None` alone."""
    if _kind(node) != "union" or len(node) != 2:
        return None
    kinds = [_kind(branch) for branch in node]
    if kinds.count("null") != 1:
        return None
    null = kinds.index("null")
    return null, 1 - null


def _type_choice(kinds: list[str], nodes: list[Any]) -> Callable[[Any], int]:
    """The branch index for an untagged value, when its Python type leaves exactly fastavro's
    first valid branch; Unsupported when fastavro would have to validate to choose."""
    first: dict[str, int] = {}
    for position, kind in enumerate(kinds):
        first.setdefault(kind, position)
    enums = [(position, frozenset(nodes[position]["symbols"])) for position, kind in enumerate(kinds) if kind == "enum"]
    containers = sum(kind in ("record", "map") for kind in kinds)
    numeric = {"int", "long", "float", "double"}

    def choose(value: Any) -> int:
        pytype = type(value)
        if value is None and "null" in first:
            return first["null"]
        if pytype is str:
            candidates = [position for position, symbols in enums if value in symbols]
            if "string" in first:
                candidates.append(first["string"])
            if candidates:
                return min(candidates)
        elif pytype is bool and "boolean" in first and not numeric & first.keys():
            return first["boolean"]
        elif pytype is int and not {"float", "double"} & first.keys():
            fits = [first[kind] for kind, (low, high) in _RANGES.items() if kind in first and low <= value <= high]
            if fits:
                return min(fits)
        elif pytype is bytes and "bytes" in first and "fixed" not in first:
            return first["bytes"]
        elif pytype is dict and containers == 1:
            return first.get("record", first.get("map", -1))
        elif pytype is list and "array" in first:
            return first["array"]
        raise Unsupported

    return choose


_RANGES = {"int": (INT_MIN, INT_MAX), "long": (LONG_MIN, LONG_MAX)}


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["    " * depth + line for line in lines]


# A zig-zag varint read in place, as fastavro reads it but for what it reads its own way: an eleventh
# byte, or a value past 64 bits (Unsupported). A body that ends mid-varint raises IndexError, which
# `decode` turns into Unsupported.
_READ_LONG = [
    "b = data[pos]",
    "pos += 1",
    "if b & 0x80:",
    "    x = b & 0x7F",
    "    shift = 7",
    "    while True:",
    "        b = data[pos]",
    "        pos += 1",
    "        x |= (b & 0x7F) << shift",
    "        if not b & 0x80:",
    "            break",
    "        shift += 7",
    f"        if shift >= {7 * MAX_VARINT_BYTES}:",
    "            raise Unsupported",
    "    if x >> 64:",
    "        raise Unsupported",
    "    x = (x >> 1) ^ -(x & 1)",
    "else:",
    "    x = (b >> 1) ^ -(b & 1)",
]
_SIZED_READ = [*_READ_LONG, "if x < 0 or pos + x > end:", "    raise Unsupported", "n = x"]
_STRING_READ = [*_SIZED_READ, "x = str(data[pos:pos + n], 'utf-8')", "pos += n"]
# float and double: keyload's schemas hold none, fastavro writes and reads them.
_DEFERRED = (["raise Unsupported"], ["raise Unsupported"])

# Numbers are written in place, never by a call per value: a receive's outcome writes about ten a
# delivery, most of them timestamps and sequences of several varint bytes.


def _varint_write(name: str) -> list[str]:
    """Lines writing the int in variable `name` (within a long's range) as a zig-zag varint; they
    consume the variable."""
    return [
        f"{name} = ({name} << 1) ^ ({name} >> 63)",
        f"while {name} > 0x7F:",
        f"    out.append(({name} & 0x7F) | 0x80)",
        f"    {name} >>= 7",
        f"out.append({name})",
    ]


def _count_write(name: str) -> list[str]:
    """Lines writing the count or index in variable `name` (an int >= 0 the generated code made): one
    byte below 64."""
    return [f"if {name} < 64:", f"    out.append({name} << 1)", "else:", *_indent(_varint_write(name))]


def _long_write(low: str, high: str) -> list[str]:
    """Lines writing the value `x`, a long (or an int) within low..high: one byte for -64..63."""
    return [
        "if type(x) is not int:",
        "    raise Unsupported",
        "if -64 <= x < 64:",
        "    out.append((x << 1) ^ (x >> 63))",
        f"elif {low} <= x <= {high}:",
        *_indent(_varint_write("x")),
        "else:",
        "    raise Unsupported",
    ]


_SIZED_WRITE = ["n = len(x)", *_count_write("n"), "out += x"]


# kind -> (lines writing `x` to `out`, lines reading `x` at `pos`)
_PRIMITIVE: dict[str, tuple[list[str], list[str]]] = {
    "null": (["if x is not None:", "    raise Unsupported"], ["x = None"]),
    "boolean": (
        [
            "if x is True:",
            "    out.append(1)",
            "elif x is False:",
            "    out.append(0)",
            "else:",
            "    raise Unsupported",
        ],
        ["b = data[pos]", "pos += 1", "if b > 1:", "    raise Unsupported", "x = b == 1"],
    ),
    "int": (
        _long_write("INT_MIN", "INT_MAX"),
        [*_READ_LONG, "if not INT_MIN <= x <= INT_MAX:", "    raise Unsupported"],
    ),
    "long": (_long_write("LONG_MIN", "LONG_MAX"), _READ_LONG),
    "string": (["if type(x) is not str:", "    raise Unsupported", "x = x.encode()", *_SIZED_WRITE], _STRING_READ),
    "bytes": (
        ["if type(x) is not bytes:", "    raise Unsupported", *_SIZED_WRITE],
        [*_SIZED_READ, "x = data[pos:pos + n]", "pos += n"],
    ),
}
