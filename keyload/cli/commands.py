"""Subcommands derived from the command table: `keyload <noun> <verb>` for every row with `cli`.

Each row of `keyload.commands.COMMANDS` that names a CLI noun and verb becomes a subcommand
whose options come from its body's Avro record (keyload/schemas, read as JSON):

- a scalar field becomes `--kebab-name` (its type, the schema's default, help from the field's
  `doc` or a generated text naming the type and unit: `*_ms` durations are milliseconds,
  `not_before_ms`/`*_at_ms` are absolute epoch milliseconds or `+DURATION` from now);
- `bytes` becomes `--body TEXT` / `--body-file PATH`; a string map `--header NAME=VALUE` (repeat);
  a string array `--<singular>` (repeat) or trailing positionals; an enum a choice;
- a record of scalars (a policy, a group filter) is flattened into its fields' options
  (`queue create --max-stored-messages`); any other record or array is `--<field>-json JSON`.

`SHAPES` holds what the schema cannot say: which fields are positional (the grammar of the
commands as they were; a row with none takes its queue or topic as `--queue` or as a positional,
NAMED_RESOURCES), renamed options, and the few bodies built from friendlier options
(`--start beginning|end|N`, one event from `--event-id/--type/--body`). The handler builds the
body, sends it with `Client.submit` (or the row's SDK method where a row needs one), and prints
the typed result through `keyload.cli.output.emit`.

Old top-level verbs (`enqueue`, `receive`, `ack`, `publish`, `read`, `redrive`, `stats`, ...) are
aliases: the same parser, options and output as their noun-verb command (ALIASES).

All of it is built from a `Table` (`add_table_commands`): the rows, each row's body record, the
shapes and the client the handler sends through. `TABLE` is keyload's: `COMMANDS`, the records of
the `.avsc` files, `SHAPES` and `keyload.cli.main.client_of`. A row without a shape gets options
from its record alone and its record's `doc` as help, so a test can add a throwaway kind through a
table of its own (tests/test_command_table.py).

This module imports nothing of the engine or the SDK at import time.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyload.cli.output import UsageError, emit, record_items
from keyload.cli.schema import Field, Schema, body_record, record_fields
from keyload.commands import COMMANDS, CommandKind

if TYPE_CHECKING:
    from keyload.sdk.client import Client

EXIT_FAILED = 1

# Choices of the policies' string fields (the schema says only "string"); tests/test_cli_grammar.py
# checks them against keyload.processors.policy, which the CLI must not import to build its parser.
CHOICES: dict[str, tuple[str, ...]] = {
    "retry_jitter": ("none", "full"),
    "ordering": ("competing", "strict_per_key"),
    "parked_head": ("continue", "block"),
    "discard": ("new", "old"),
}
# Integer fields given as a count or size that must be positive (argparse refuses 0, exit 2).
POSITIVE = re.compile(r"^(max_|receive_max_|limit$|lease_ms$)")
ABSOLUTE_TIMES = ("not_before_ms", "expires_at_ms")
# A row without positionals takes its queue or topic as `--queue NAME` or as its one positional, so
# `queue pause --domain d orders` reads as `queue create --domain d orders` does.
NAMED_RESOURCES = ("queue", "topic")
_AS_POSITIONAL = "__positional"  # the dest suffix of that positional
DURATION = re.compile(r"^\+(\d+)(ms|s|m|h)?$")
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1}

Send = Callable[["Client", argparse.Namespace, dict[str, Any], CommandKind], tuple[Any, int]]
Build = Callable[[argparse.Namespace, dict[str, Any]], None]


@dataclass(frozen=True)
class Shape:
    """What a row's subcommand needs beyond its schema."""

    help: str
    positional: tuple[str, ...] = ()
    nargs: dict[str, str] = field(default_factory=dict)  # positional field -> argparse nargs
    rename: dict[str, str] = field(default_factory=dict)  # field -> option name (no dashes)
    optional: tuple[str, ...] = ()  # required in the schema, filled by `build` when not given
    hidden: tuple[str, ...] = ()  # filled by `build` from `extra` options
    extra: Callable[[argparse.ArgumentParser], None] | None = None
    build: Build | None = None
    send: Send | None = None
    partition_scoped: bool = False  # names --partition, not --domain
    may_be_zero: tuple[str, ...] = ()  # counts POSITIVE would refuse 0 for, where 0 means "none allowed"
    text_default: bool = False  # printed text before JSON existed: text unless --json


# -- parsing helpers ------------------------------------------------------------------------


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    """A number of seconds, 0 or more (0 where an option documents it as "none")."""
    value = _finite_seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    value = _finite_seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _finite_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    return value


def command_id(text: str) -> str:
    """A command id as the processor takes one: a usage error, since a bad one is never sent."""
    from keyload.errors import InvalidCommand
    from keyload.sdk.envelope import check_command_id

    try:
        check_command_id(text)
    except InvalidCommand as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def partition_number(text: str) -> int:
    """A partition number: an integer, 0 or more (whether the data directory has it is checked once
    it is open: exit 1)."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a partition (0 or more), got {text!r}")
    return value


def domain_name(text: str) -> str:
    """A domain name as every command takes it (§8), checked before an operator command picks the
    partition it hashes to: a typo must not truncate or restore another partition."""
    from keyload.processors.apply import DOMAIN_RULE, valid_domain

    if not valid_domain(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a domain: {DOMAIN_RULE}")
    return text


def offset(text: str) -> int:
    """A log offset: an integer, 0 or more."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a log offset (0 or more), got {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class FromNow:
    """`+DURATION`: a time `ms` after the moment the command is sent, not the moment the options were
    read (opening the client can take a while on a busy machine, and the processor judges the time
    at its log time: `+500ms` taken at parse time could have passed on arrival)."""

    ms: int


def epoch_ms(text: str) -> int | FromNow:
    """Absolute epoch milliseconds, or `+N[ms|s|m|h]` from when the command is sent (`sent_now`)."""
    relative = DURATION.match(text)
    if relative:
        return FromNow(int(relative.group(1)) * UNIT_MS[relative.group(2)])
    if text.lstrip("-").isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected epoch milliseconds or +DURATION (+500ms, +5s, +2m, +1h), got {text!r}")


def sent_now(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with each `+DURATION` time made absolute: called as the command is about to be sent."""
    now_ms = time.time_ns() // 1_000_000
    return {name: now_ms + value.ms if isinstance(value, FromNow) else value for name, value in body.items()}


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def group_position(text: str) -> str | int:
    if text in ("beginning", "end"):
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f'expected "beginning", "end" or a position, got {text!r}')
    return int(text)


def headers(pairs: list[str]) -> dict[str, str]:
    parsed = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--header must be NAME=VALUE, got {pair!r}")
        parsed[name] = value
    return parsed


def body_bytes(args: argparse.Namespace) -> bytes:
    if (args.body is None) == (args.body_file is None):
        raise UsageError("give exactly one of --body or --body-file")
    return args.body.encode("utf-8") if args.body is not None else Path(args.body_file).read_bytes()


def json_bytes(value: Any) -> bytes:
    """A bytes field given in JSON: a string (UTF-8) or {"base64": "..."}."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"base64"}:
        import base64

        return base64.b64decode(value["base64"], validate=True)
    raise UsageError('a bytes value in JSON must be a string or {"base64": "..."}')


JSON_SHAPE = {"array": "a list, as in the Avro schema", "record": "an object, as in the Avro schema"}


def kebab(name: str) -> str:
    return name.replace("_", "-")


def singular(name: str) -> str:
    return name[:-1] if name.endswith("s") else name


def _escape(text: str) -> str:
    return text.replace("%", "%%")


NAMED_HELP = {
    "queue": "the queue's name",
    "topic": "the topic's name",
    "group": "the subscription group's name",
    "token": "a delivery's lease token (from receive)",
    "tokens": "deliveries' lease tokens (from receive)",
    "message_id": "the message's id, unique in the queue (queue enqueue: default the command id)",
    "after_sequence": "read on: the parked sequence the previous page ended at",
    "include_body": "include message bodies",
    "token_key_id": "the keyring key that signs delivery tokens (default: keep the active one)",
    "jitter_key_id": "the keyring key that seeds retry jitter (default: keep the active one)",
    "key": "the document's key",
    "ordering_key": "messages with the same key are delivered in order (strict_per_key queues)",
    "expected_state_version": "the message's state version as last seen (inspect or dlq list)",
    "expected_delivery_generation": "the message's delivery generation as last seen",
    "expected_generation": "the current generation as last seen (optimistic concurrency)",
    "expected_policy_version": "the current policy version as last seen (default: any)",
    "expected_revision": "write only at this revision (0: only if absent); default: any",
    "through": "the last position deleted",
    "from_position": "the first position read (default 1; or --cursor)",
    "limit": "most entries listed",
    "after": "read on: the previous page's next_after",
    "prefix": "list only those whose key or name starts with this text (default: all)",
    "max_receipts": "receipts the inbox keeps",
}


def generated_help(f: Field, scope: str = "") -> str:
    """A short text naming the field's type and unit, and its default."""
    name, kind = f.name, f.kind
    if name in NAMED_HELP:
        text = NAMED_HELP[name]
    elif name in ABSOLUTE_TIMES or name.endswith("_at_ms"):
        text = "absolute time in epoch milliseconds, or +DURATION from now (+500ms, +5s, +2m, +1h)"
    elif name.endswith("_ms"):
        text = "duration in milliseconds"
    elif name.endswith("_bytes"):
        text = "size in bytes"
    elif kind in ("int", "long"):
        text = "a count" if name.startswith("max_") else "an integer"
    elif kind == "boolean":
        text = f"set {name.replace('_', ' ')}"
    elif name in CHOICES:
        text = "one of " + ", ".join(CHOICES[name])
    else:
        text = f"the {name.replace('_', ' ')}"
    if f.optional and f.default is None and name not in NAMED_HELP:
        text += "; default: the documented default" if scope else "; default: unset"
    elif f.has_default and f.default not in (None, [], {}, False, ""):
        text += f"; default: {f.default}"
    return f"{scope}: {text}" if scope else text


def _flattened(f: Field) -> bool:
    """A record whose fields are all scalars, string maps or string arrays: flattened into options."""
    if f.kind != "record":
        return False
    return all(sub.kind not in ("record", "bytes") for sub in record_fields(f.schema))


# -- building a row's parser ----------------------------------------------------------------


def add_field(
    parser: argparse.ArgumentParser, f: Field, shape: Shape, dest: str, required: bool, scope: str = ""
) -> None:
    """One option (or positional) for one field (`scope`: the record a flattened field is of)."""
    flag = "--" + kebab(shape.rename.get(f.name, f.name))
    doc = _escape(f.doc or generated_help(f, scope))
    if f.name in shape.positional:
        nargs = shape.nargs.get(f.name)
        if nargs is None and f.kind == "array":
            nargs = "+"
        kwargs: dict[str, Any] = {"help": doc}
        if nargs:
            kwargs["nargs"] = nargs
        if nargs == "?":
            kwargs["default"] = f.default if f.has_default else None
        parser.add_argument(dest, metavar=f.name.upper(), **kwargs)
        return
    kind = f.kind
    if f.name in NAMED_RESOURCES and not shape.positional and not scope and required:
        parser.add_argument(flag, dest=dest, help=doc)
        parser.add_argument(dest + _AS_POSITIONAL, nargs="?", metavar=f.name.upper(), help=f"the {f.name} (or {flag})")
    elif kind == "bytes":
        parser.add_argument("--body", help="the body as UTF-8 text (or --body-file)")
        parser.add_argument("--body-file", metavar="PATH", help="read the body's bytes from this file (or --body)")
    elif kind == "map":
        parser.add_argument(
            "--" + kebab(singular(shape.rename.get(f.name, f.name))),
            dest=dest,
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=_escape(f.doc or f"{scope + ': ' if scope else ''}a {singular(f.name)}: NAME=VALUE (repeat)"),
        )
    elif kind == "array" and f.schema["items"] == "string":
        parser.add_argument(
            "--" + kebab(singular(shape.rename.get(f.name, f.name))),
            dest=dest,
            action="append",
            default=[],
            required=required,
            metavar=singular(f.name).upper(),
            help=_escape(f.doc or f"{scope + ': ' if scope else ''}one of the {f.name.replace('_', ' ')} (repeat)"),
        )
    elif kind in ("array", "record"):
        parser.add_argument(
            flag + "-json",
            dest=dest,
            type=json_value,
            metavar="JSON",
            required=required,
            help=_escape(f.doc or f'the {f.name} as JSON ({JSON_SHAPE[kind]}; bytes: UTF-8 text or {{"base64": ...}})'),
        )
    elif kind == "boolean":
        parser.add_argument(flag, dest=dest, action="store_true", help=doc)
    elif kind == "enum":
        parser.add_argument(flag, dest=dest, choices=f.schema["symbols"], required=required, help=doc)
    elif kind in ("int", "long"):
        if f.name in ABSOLUTE_TIMES or f.name.endswith("_at_ms"):
            convert: Callable[[str], int | FromNow] = epoch_ms
        elif POSITIVE.match(f.name) and not scope and f.name not in shape.may_be_zero:
            # (not inside a policy, `scope`: a policy's bounds are the processor's to check)
            convert = positive
        else:
            convert = integer
        parser.add_argument(flag, dest=dest, type=convert, required=required, metavar="N", help=doc)
    else:
        choices = CHOICES.get(f.name)
        parser.add_argument(flag, dest=dest, choices=choices, required=required, help=doc)


def add_row_options(parser: argparse.ArgumentParser, body: Sequence[Field], shape: Shape) -> None:
    """The options (and positionals) of a row's body fields, then the shape's extra ones."""
    for f in body:
        if f.name in shape.hidden:
            continue
        if _flattened(f):
            for sub in record_fields(f.schema):
                add_field(parser, sub, shape, f"{f.name}__{sub.name}", False, f.name)
            continue
        add_field(parser, f, shape, f.name, f.required and f.name not in shape.optional)
    if shape.extra is not None:
        shape.extra(parser)


def _value(f: Field, args: argparse.Namespace, dest: str) -> Any:
    if hasattr(args, dest + _AS_POSITIONAL):
        return named_once(f.name, getattr(args, dest + _AS_POSITIONAL), getattr(args, dest))
    if f.kind == "bytes":
        return body_bytes(args)
    raw = getattr(args, dest)
    if f.kind == "map":
        return headers(raw) if isinstance(raw, list) else raw
    if f.kind in ("array", "record") and raw is not None and not (f.kind == "array" and f.schema["items"] == "string"):
        return _from_json(f.schema, raw)
    if raw is None and f.has_default:
        return f.default
    return raw


def named_once(name: str, positional: str | None, option: str | None) -> str:
    """A queue or topic given as the positional or as the option, exactly once."""
    given = [value for value in (positional, option) if value is not None]
    if len(given) != 1:
        needed = f"{name.upper()} or --{name}"
        raise UsageError(f"give the {name} once: {needed}" if given else f"the {name} is required: {needed}")
    return given[0]


def _from_json(schema: Any, value: Any) -> Any:
    """Bytes inside a JSON-given record or array: strings or {"base64": ...} -> bytes."""
    from keyload.cli.schema import field_of, resolve

    schema = resolve(schema)
    if schema == "bytes":
        return json_bytes(value)
    if isinstance(schema, dict) and schema.get("type") == "array" and isinstance(value, list):
        return [_from_json(schema["items"], item) for item in value]
    if isinstance(schema, dict) and schema.get("type") == "record" and isinstance(value, dict):
        out = dict(value)
        for raw in schema["fields"]:
            sub = field_of(raw)
            if sub.name in out and out[sub.name] is not None:
                out[sub.name] = _from_json(sub.schema, out[sub.name])
            elif sub.name not in out and sub.has_default:
                out[sub.name] = sub.default
        return out
    return value


def build_body(fields_: Sequence[Field], shape: Shape, args: argparse.Namespace) -> dict[str, Any]:
    """The command body from the parsed options of a row's body fields (then the shape's `build`)."""
    body: dict[str, Any] = {}
    for f in fields_:
        if f.name in shape.hidden:
            continue
        if _flattened(f):
            record = {sub.name: _value(sub, args, f"{f.name}__{sub.name}") for sub in record_fields(f.schema)}
            given = any(value not in (None, [], {}) for value in record.values())
            body[f.name] = record if given or not f.optional else None
            continue
        body[f.name] = _value(f, args, f.name)
    if shape.build is not None:
        shape.build(args, body)
    return body


# -- row-specific bodies and sends -----------------------------------------------------------


def _command_id(args: argparse.Namespace) -> str:
    """The command id, chosen now when not given (some bodies default an id to it)."""
    if args.command_id is None:
        args.command_id = str(uuid.uuid4())
    command_id: str = args.command_id
    return command_id


def _publish_extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--event-id", help="one event: its id, unique in the topic (default: the command id)")
    parser.add_argument("--type", help="one event: its type (required unless --events-json)")
    parser.add_argument("--body", help="one event: its body as UTF-8 text (or --body-file)")
    parser.add_argument("--body-file", metavar="PATH", help="one event: read its body from this file")
    parser.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="one event: a header (repeat)"
    )


def _publish_build(args: argparse.Namespace, body: dict[str, Any]) -> None:
    single = args.type is not None or args.body is not None or args.body_file is not None
    if body.get("events") is not None:
        if single or args.event_id is not None or args.header:
            raise UsageError("give either --events-json or one event's --type/--body options, not both")
        return
    if args.type is None:
        raise UsageError("give --type (and --body or --body-file), or --events-json")
    event_id = args.event_id or _command_id(args)
    body["events"] = [
        {"event_id": event_id, "type": args.type, "headers": headers(args.header), "body": body_bytes(args)}
    ]


def _read_build(args: argparse.Namespace, body: dict[str, Any]) -> None:
    if body["from_position"] is not None and body["cursor"] is not None:
        raise UsageError("give --from or --cursor, not both")


def _start_extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--start",
        type=group_position,
        default="beginning",
        help="where delivery starts: beginning, end or a position (default: beginning)",
    )


def _start_build(args: argparse.Namespace, body: dict[str, Any]) -> None:
    start = args.start
    body["start"], body["position"] = ("position", start) if isinstance(start, int) else (start, None)


def _seek_extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--to", type=group_position, required=True, help="the next position delivered: beginning, end or a position"
    )


def _seek_build(args: argparse.Namespace, body: dict[str, Any]) -> None:
    to = args.to
    body["to"], body["position"] = ("position", to) if isinstance(to, int) else (to, None)


def committed(outcome: Any) -> Any:
    """An outcome's typed result; a rejection raises its typed error."""
    if outcome.status != "committed":
        from keyload.errors import rejection

        raise rejection(outcome)
    return outcome.result


def submit(client: Client, domain: str, name: str, body: dict[str, Any], command_id: str | None) -> Any:
    """Send a command of the table row `name` and return its typed result (a rejection raises).

    Through `Client.send`, the SDK's generic path (its refusals name a publish's events by id),
    or `Client.submit` and the outcome where a client has no `send`."""
    generic = getattr(client, "send", None)
    if generic is not None:
        return generic(name, domain, body, command_id)
    return committed(client.submit(domain, f"keyload.command.{name}", body, command_id))


def _ack_send(batch: str, field_name: str) -> Send:
    """One token: Ack; several: one AckBatch (exit 1 unless every token committed)."""

    def send(client: Client, args: argparse.Namespace, body: dict[str, Any], kind: CommandKind) -> tuple[Any, int]:
        tokens = body.pop(field_name)
        if len(tokens) == 1:
            body["token"] = tokens[0]
            return submit(client, args.domain, kind.name, body, args.command_id), 0
        body["tokens"] = tokens
        result = submit(client, args.domain, batch, body, args.command_id)
        return result, 0 if all(r.status == "committed" for r in result.results) else EXIT_FAILED

    return send


def _batch_send(client: Client, args: argparse.Namespace, body: dict[str, Any], kind: CommandKind) -> tuple[Any, int]:
    result = submit(client, args.domain, kind.name, body, args.command_id)
    return result, 0 if all(r.status == "committed" for r in result.results) else EXIT_FAILED


def _rotate_extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--partition", type=partition_number, metavar="N", help="the partition (default: every partition)"
    )


def _rotate_send(client: Client, args: argparse.Namespace, body: dict[str, Any], kind: CommandKind) -> tuple[Any, int]:
    partitions = range(client.data.partitions) if args.partition is None else [args.partition]
    rows = []
    for partition in partitions:
        active = getattr(client, kind.sdk or "rotate_keys")(partition, **body)
        rows.append({"partition": partition, **dict(record_items(active) or ())})
    return rows, 0


def _rotate_text(rows: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"p{row['partition']}: token key {row['token_key_id']}, jitter key {row['jitter_key_id']}, "
        f"proof key {row['proof_key_id']} (trust set {row['trust_set_version']})"
        for row in rows
    )


def queue_text(view: Any) -> str:
    """A queue's counters, one `name  value` per line under a title."""
    counters = dict(record_items(view.counters) or ())
    width = max(len(name) for name in counters)
    flags = "".join(f", {name}" for name in ("paused", "closed") if getattr(view, name))
    lines = [f"{view.domain}/{view.queue} (policy version {view.policy_version}{flags})"]
    return "\n".join(lines + [f"  {name:<{width}}  {value}" for name, value in counters.items()])


def columns(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    """`rows` under `header`, the first column left-aligned and the others right-aligned."""
    cells = [tuple(str(cell) for cell in row) for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]


def _flags(view: Any, *names: str) -> str:
    return ",".join(name for name in names if getattr(view, name)) or "-"


def _page_end(next_after: str | None) -> list[str]:
    return [] if next_after is None else [f"more: read on with --after {next_after}"]


def queue_list_text(page: Any) -> str:
    """One line per queue: its messages by state and its flags."""
    header = ("queue", "ready", "leased", "scheduled", "dead_lettered", "stored", "flags")
    rows = [
        (q.queue, c.ready, c.leased, c.scheduled, c.dead_lettered, c.stored_messages, _flags(q, "paused", "closed"))
        for q, c in ((q, q.counters) for q in page.queues)
    ]
    return "\n".join(columns(header, rows) + _page_end(page.next_after))


def topic_list_text(page: Any) -> str:
    """One line per topic: its retained range and size, and its flags."""
    header = ("topic", "first_available", "tail", "retained_events", "retained_bytes", "flags")
    rows = [
        (t.topic, t.first_available, t.tail, t.retained_events, t.retained_bytes, _flags(t, "closed"))
        for t in page.topics
    ]
    return "\n".join(columns(header, rows) + _page_end(page.next_after))


TEXT: dict[str, Callable[[Any], str]] = {  # summaries by result type
    "QueueView": queue_text,
    "QueueList": queue_list_text,
    "TopicList": topic_list_text,
}
ROW_TEXT: dict[str, Callable[[Any], str]] = {"RotateKeys": _rotate_text}

_MESSAGE_RENAME = {"expected_state_version": "state_version", "expected_delivery_generation": "generation"}
_GROUP = ("group",)

SHAPES: dict[str, Shape] = {
    "CreateQueue": Shape("create a queue", positional=("queue",)),
    "ConfigureQueue": Shape("replace a queue's policy (fields not given take their defaults)", positional=("queue",)),
    "InspectQueue": Shape("show a queue's policy version and counters"),
    "PauseQueue": Shape("stop dispatch (receives are refused with DispatchPaused)"),
    "ResumeQueue": Shape("dispatch again"),
    "CloseQueue": Shape("take no new messages (one-way)"),
    "DeleteQueue": Shape("delete a queue holding no message (any, with --force); its rows are reclaimed after"),
    "PurgeQueue": Shape("drop every message: a new incarnation, configured as the queue was (leases end)"),
    "InspectMessage": Shape("show one message", positional=("message_id",), rename={"include_body": "body"}),
    "Enqueue": Shape("enqueue one message", optional=("message_id",)),
    "Receive": Shape("lease ready messages"),
    "Renew": Shape("extend a delivery's lease", positional=("token",)),
    "Ack": Shape(
        "complete deliveries (several tokens: one batch)", positional=("token",), nargs={"token": "+"},
        send=_ack_send("AckBatch", "token"),
    ),
    "AckBatch": Shape("complete several deliveries in one command", positional=("tokens",), send=_batch_send),
    "Nack": Shape("give a delivery back for retry", positional=("token",)),
    "ListQueues": Shape(
        "list the domain's queues by name prefix, in name order", positional=("prefix",), nargs={"prefix": "?"}
    ),
    "ListDeadLetters": Shape(
        "list dead-lettered messages in parked order", rename={"after_sequence": "after", "include_body": "body"}
    ),
    "Redrive": Shape("send a dead letter back to ready", positional=("message_id",), rename=_MESSAGE_RENAME),
    "Cancel": Shape("cancel a message (any non-terminal state)", positional=("message_id",), rename=_MESSAGE_RENAME),
    "ParkPending": Shape(
        "move a pending dead letter into the dead-letter index", positional=("message_id",), rename=_MESSAGE_RENAME
    ),
    "CreateTopic": Shape("create a topic", positional=("topic",)),
    "Publish": Shape(
        "publish one event (or --events-json) to a topic", extra=_publish_extra, build=_publish_build,
        optional=("events",),
    ),
    "ReadTopic": Shape(
        "read a page of a topic's events in position order", rename={"from_position": "from"}, build=_read_build
    ),
    "ListTopics": Shape(
        "list the domain's topics by name prefix, in name order", positional=("prefix",), nargs={"prefix": "?"}
    ),
    "InspectTopic": Shape("show a topic's retained range and counters", positional=("topic",)),
    "ConfigureTopic": Shape("replace a topic's policy (fields not given take their defaults)", positional=("topic",)),
    "CloseTopic": Shape("take no new events (one-way)", positional=("topic",)),
    "DeleteTopic": Shape("delete a topic and its groups (the rows go in steps)", positional=("topic",)),
    "PurgeTopic": Shape("delete retained events up to a position", positional=("topic",)),
    "CreateGroup": Shape(
        "create a subscription group", positional=_GROUP, hidden=("start", "position"), extra=_start_extra,
        build=_start_build,
    ),
    "GroupReceive": Shape("lease the next matching events", positional=_GROUP),
    "GroupAck": Shape(
        "complete deliveries (several tokens: one batch)", positional=("group", "token"), nargs={"token": "+"},
        send=_ack_send("GroupAckBatch", "token"),
    ),
    "GroupAckBatch": Shape(
        "complete several deliveries in one command", positional=("group", "tokens"), send=_batch_send
    ),
    "GroupNack": Shape("give a delivery back for retry", positional=("group", "token")),
    "GroupRenew": Shape("extend a delivery's lease", positional=("group", "token")),
    "GroupStatus": Shape("checkpoint, issued, outstanding, parked and lag", positional=_GROUP),
    "SeekGroup": Shape(
        "make a position the next delivered; leaves the group paused", positional=_GROUP, hidden=("to", "position"),
        extra=_seek_extra, build=_seek_build,
    ),
    "ConfigureGroup": Shape("change a paused group's filter (replaced whole) or policy", positional=_GROUP),
    "PauseGroup": Shape("stop deliveries", positional=_GROUP),
    "DeleteGroup": Shape("delete a group with no outstanding delivery (any, with --force)", positional=_GROUP),
    "ResumeGroup": Shape("resume deliveries", positional=_GROUP),
    "PutDocument": Shape("write a document", positional=("key",)),
    "DeleteDocument": Shape("delete a document", positional=("key",)),
    "GetDocument": Shape("show a document", positional=("key",)),
    "ListDocuments": Shape("list documents by key prefix, in key order", positional=("prefix",), nargs={"prefix": "?"}),
    "ConfigureInbox": Shape("accept CommitInbox within a policy"),
    "ConfigureDomain": Shape("replace the domain's idempotency horizons (fields not given take their defaults)"),
    "ConfigureDomainCaps": Shape(
        "replace the most the domain may hold (an operator's; not given: the defaults; 0: none)",
        may_be_zero=("max_queues", "max_topics", "max_groups", "max_documents", "max_document_bytes"),
    ),
    "InspectDomain": Shape("show the domain's idempotency horizons, caps and what it holds"),
    "RotateKeys": Shape(
        "activate keyring keys (a logged command per partition)",
        rename={"token_key_id": "token_key", "jitter_key_id": "jitter_key", "proof_key_id": "proof_key"},
        extra=_rotate_extra, send=_rotate_send, partition_scoped=True, text_default=True,
    ),
}  # fmt: skip

# Old top-level verbs: alias -> (noun, verb) of the same parser.
ALIASES: dict[str, tuple[str, str]] = {
    "enqueue": ("queue", "enqueue"),
    "receive": ("queue", "receive"),
    "renew": ("lease", "renew"),
    "ack": ("lease", "ack"),
    "nack": ("lease", "nack"),
    "publish": ("topic", "publish"),
    "read": ("topic", "read"),
    "redrive": ("message", "redrive"),
    "cancel": ("message", "cancel"),
    "park": ("message", "park"),
    "stats": ("queue", "inspect"),  # prints the counters as text unless --json
}
NOUN_HELP = {
    "queue": "queues: create, configure, inspect, enqueue, receive",
    "message": "one message: inspect, redrive, cancel, park",
    "lease": "deliveries of queue messages: ack, nack, renew",
    "dlq": "dead letters",
    "topic": "topics: create, inspect, publish, read, purge",
    "group": "subscription groups of a topic",
    "doc": "documents: key → value with a revision",
    "inbox": "a domain's target inbox",
    "keys": "keyring keys",
}


@dataclass(frozen=True)
class Table:
    """What the table-derived subcommands are built from, and what their handler sends through."""

    rows: Sequence[CommandKind]
    schema_of: Callable[[str], Schema]  # a row's name -> its body record (an Avro record as JSON)
    shapes: Mapping[str, Shape]
    client_of: Callable[[argparse.Namespace], Client] | None = None  # None: keyload.cli.main.client_of

    def cli_rows(self) -> list[CommandKind]:
        return [kind for kind in self.rows if kind.cli is not None]

    def row(self, name: str) -> CommandKind:
        return next(kind for kind in self.rows if kind.name == name)

    def shape(self, kind: CommandKind) -> Shape:
        """The row's shape; a row without one: its record's options, the record's doc as help."""
        found = self.shapes.get(kind.name)
        if found is not None:
            return found
        doc = self.schema_of(kind.name).get("doc")
        return Shape(doc if isinstance(doc, str) and doc else f"send a {kind.name} command")

    def fields(self, kind: CommandKind) -> list[Field]:
        return record_fields(self.schema_of(kind.name))

    def client(self, args: argparse.Namespace) -> Client:
        if self.client_of is not None:
            return self.client_of(args)
        from keyload.cli.main import client_of

        return client_of(args)


TABLE = Table(COMMANDS, body_record, SHAPES)


def table_rows(table: Table = TABLE) -> list[CommandKind]:
    return table.cli_rows()


NounParsers = dict[str, "argparse._SubParsersAction[argparse.ArgumentParser]"]


def add_table_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: list[argparse.ArgumentParser],
    table: Table = TABLE,
) -> NounParsers:
    """`keyload <noun> <verb>` for every row of `table` with `cli`, and the ALIASES of those rows.

    Returns the nouns' subparsers (hand-written commands add verbs to them: `keys add`)."""
    nouns: NounParsers = {}
    by_cli: dict[tuple[str, str], CommandKind] = {}
    for kind in table.cli_rows():
        assert kind.cli is not None
        noun, verb = kind.cli
        if noun not in nouns:
            nouns[noun] = sub.add_parser(noun, help=NOUN_HELP.get(noun)).add_subparsers(
                dest="action", required=True, metavar="VERB"
            )
        add_row_parser(nouns[noun], verb, kind, parents, table=table)
        by_cli[kind.cli] = kind
    for alias, target in ALIASES.items():
        kind = by_cli[target]
        help_text = f"alias of `keyload {' '.join(target)}`: {table.shape(kind).help}"
        if alias == "stats":
            help_text += " (as text unless --json, into a pipe too)"
        parser = add_row_parser(sub, alias, kind, parents, help_text, table=table)
        if alias == "stats":
            parser.set_defaults(text_only=True)
    return nouns


def add_row_parser(
    sub: Any,
    name: str,
    kind: CommandKind,
    parents: list[argparse.ArgumentParser],
    help_text: str | None = None,
    table: Table = TABLE,
) -> argparse.ArgumentParser:
    shape = table.shape(kind)
    parser: argparse.ArgumentParser = sub.add_parser(
        name, parents=parents, help=help_text or shape.help, description=help_text or shape.help
    )
    if not shape.partition_scoped:
        parser.add_argument("--domain", required=True, help="the domain (partition key) of the command")
    add_row_options(parser, table.fields(kind), shape)
    parser.set_defaults(func=run_row, row=kind.name, table=table, text_only=shape.text_default)
    return parser


def run_row(args: argparse.Namespace) -> int:
    """Build the body from the options, send it through the table's client, print the result."""
    table: Table = getattr(args, "table", TABLE)
    kind = table.row(args.row)
    shape = table.shape(kind)
    body = build_body(table.fields(kind), shape, args)
    with table.client(args) as client:
        body = sent_now(body)
        if shape.send is not None:
            result, code = shape.send(client, args, body, kind)
        else:
            result, code = submit(client, args.domain, kind.name, body, args.command_id), 0
    show(args, result, ROW_TEXT.get(kind.name))
    return code


def show(args: argparse.Namespace, result: Any, text: Callable[[Any], str] | None = None) -> None:
    """JSON or text, as asked; text through the result type's own summary when it has one."""
    if getattr(args, "text_only", False) and getattr(args, "output", "auto") == "auto":
        args.output = "text"
    renderer = text or TEXT.get(type(result).__name__)
    from keyload.cli.output import wants_json

    if renderer is not None and not wants_json(args):
        print(renderer(result))
    else:
        emit(args, result)
