"""What the CLI prints: JSON for programs, a one-screen summary for people.

Every command that prints a result goes through `emit`. `--json` (or `--output json`) prints
the full result as indented JSON; `--output text` prints a readable summary; the default,
`--output auto`, is text on a terminal and JSON when stdout is a pipe or a file, so scripts and
tests that parse the output keep getting JSON.

JSON encoding: results (msgspec Structs and dataclasses) become objects (field order kept), tuples lists, paths
strings, and `bytes` a string when they are valid UTF-8, else `{"base64": "<standard base64>"}`.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from dataclasses import fields, is_dataclass
from pathlib import PurePath
from typing import Any

import msgspec

from keyload.errors import KeyloadError

SUMMARY_LIST_ITEMS = 20  # a summary shows this many items of a list, then a count


class UsageError(KeyloadError):
    """Bad command-line input: one line to the user, exit 2."""


def record_items(value: Any) -> list[tuple[str, Any]] | None:
    """A result's (field, value) pairs in declaration order (a msgspec Struct's or a dataclass's);
    None for anything else."""
    if isinstance(value, msgspec.Struct):
        return [(name, getattr(value, name)) for name in value.__struct_fields__]
    if is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in fields(value)]
    return None


def jsonable(value: Any) -> Any:
    items = record_items(value)
    if items is not None:
        return {name: jsonable(item) for name, item in items}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, PurePath):  # a restore's kept-aside projection, a replay's directory
        return str(value)
    return value


def print_json(value: Any) -> None:
    print(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


def wants_json(args: argparse.Namespace) -> bool:
    mode = getattr(args, "output", None) or "auto"
    if mode == "auto":
        return not sys.stdout.isatty()
    return bool(mode == "json")


def emit(args: argparse.Namespace, value: Any, title: str | None = None) -> None:
    """Print a result as the command line asked: JSON, or a readable summary."""
    if wants_json(args):
        print_json(value)
    else:
        print(summary(value, title))


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value if value and value.isprintable() else json.dumps(value, ensure_ascii=False)
    if isinstance(value, bytes):
        shown = jsonable(value)
        return json.dumps(shown, ensure_ascii=False) if isinstance(shown, str) else f"<{len(value)} bytes, binary>"
    if value is None:
        return "-"
    return str(value)


def _lines(value: Any, indent: str) -> list[str]:
    out: list[str] = []
    items = record_items(value)
    if items is None and isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    if items is None:
        return [f"{indent}{_scalar(value)}"]
    width = max((len(name) for name, _ in items), default=0)
    for name, item in items:
        if record_items(item) is not None or (isinstance(item, dict) and item):
            out.append(f"{indent}{name}:")
            out += _lines(item, indent + "  ")
        elif isinstance(item, list | tuple) and item:
            out.append(f"{indent}{name}: {len(item)}")
            for n, entry in enumerate(item[:SUMMARY_LIST_ITEMS]):
                sub = _lines(entry, indent + "    ")
                out.append(f"{indent}  - {sub[0].strip()}" if len(sub) == 1 else f"{indent}  [{n}]")
                if len(sub) > 1:
                    out += sub
            if len(item) > SUMMARY_LIST_ITEMS:
                out.append(f"{indent}  … {len(item) - SUMMARY_LIST_ITEMS} more (--json for all)")
        elif isinstance(item, list | tuple | dict):
            out.append(f"{indent}{name:<{width}}  (none)")
        else:
            out.append(f"{indent}{name:<{width}}  {_scalar(item)}")
    return out


def summary(value: Any, title: str | None = None) -> str:
    """A readable multi-line rendering: `name  value` lines, nested records indented."""
    if isinstance(value, list):
        head = [title] if title else []
        body = [line for entry in value for line in ["-", *_lines(entry, "  ")]]
        return "\n".join(head + (body or ["(none)"]))
    lines = _lines(value, "  " if title else "")
    return "\n".join(([title] if title else []) + lines)
