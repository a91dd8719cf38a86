"""The command table (keyload/commands.py) against the schema, the processor, the SDK and the CLI's names."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import subprocess
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from keyload.cli import commands as cli_commands
from keyload.cli.main import build_parser, main
from keyload.cli.schema import body_record
from keyload.commands import COMMANDS, CommandKind
from keyload.log.codec import REGISTRY, expanded_current
from keyload.processors.apply import COMMANDS as DISPATCHED
from keyload.processors.apply import DISPATCH, UNSTORED_KINDS, Dispatch
from keyload.processors.batch import MUTATIONS
from keyload.processors.context import Context
from keyload.projections.store import Staged, Store
from keyload.sdk import results
from keyload.sdk.client import Client
from keyload.sdk.results import RESULT_TYPES, Outcome

PARAM = re.compile(r"\{(\w+)\}")


def _named(schema: Any) -> str:
    return schema if isinstance(schema, str) else str(schema["name"])


def _body_union() -> list[Any]:
    [body] = [f for f in REGISTRY.schema("keyload.Command")["fields"] if f["name"] == "body"]
    return list(body["type"])


def _record_fields(name: str, schema: Any, named: dict[str, Any]) -> None:
    """Every named record in a parsed schema, by full name."""
    if isinstance(schema, list):
        for item in schema:
            _record_fields(name, item, named)
    elif isinstance(schema, dict):
        if schema.get("type") == "record":
            named[schema["name"]] = schema
            for f in schema["fields"]:
                _record_fields(name, f["type"], named)
        elif schema.get("type") == "array":
            _record_fields(name, schema["items"], named)
        elif schema.get("type") == "map":
            _record_fields(name, schema["values"], named)


def test_branches_are_the_command_union() -> None:
    assert {kind.branch for kind in COMMANDS} == {_named(branch) for branch in _body_union()}


def test_every_handler_resolves_and_is_dispatched() -> None:
    for kind in COMMANDS:
        assert callable(kind.resolve()), kind.name
        handler, result = DISPATCHED[kind.branch]
        assert handler is kind.resolve() and result == kind.result
    assert set(DISPATCHED) == {kind.branch for kind in COMMANDS}
    assert {kind.branch for kind in COMMANDS if not kind.stored} == UNSTORED_KINDS


def test_every_result_is_an_outcome_branch_with_a_decoder() -> None:
    [result] = [f for f in REGISTRY.schema("keyload.Outcome")["fields"] if f["name"] == "result"]
    branches = {_named(branch) for branch in result["type"]} - {"null"}
    named = {kind.result for kind in COMMANDS}
    assert named == branches  # every result record is a known schema, and every branch is some row's
    assert set(RESULT_TYPES) == named
    # A BatchResult's results are mutation results, typed by the same decoders.
    assert {kind.result for kind in COMMANDS if kind.batchable} <= set(RESULT_TYPES)


# Records inside results whose SDK classes have a field per schema field (besides the results).
NESTED = {
    "keyload.MessageMeta": results.MessageMeta,
    "keyload.result.TokenResult": results.TokenResult,
    "keyload.result.GroupTokenResult": results.GroupTokenResult,
    "keyload.RetentionTask": results.RetentionTask,
    "keyload.QueuePolicy": results.QueuePolicy,
    "keyload.GroupPolicy": results.GroupPolicy,
    "keyload.Outcome": results.Outcome,
}


def _named_types(schema: Any, namespace: str, found: dict[str, Any]) -> None:
    """Every named record and enum of an expanded schema, by full name."""
    if isinstance(schema, list):
        for item in schema:
            _named_types(item, namespace, found)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum"):
            namespace = schema.get("namespace", namespace)
            name = schema["name"] if "." in schema["name"] else f"{namespace}.{schema['name']}"
            found[name] = schema
        for key in ("fields", "type", "items", "values"):
            if key in schema and not isinstance(schema[key], str):
                _named_types(schema[key], namespace, found)


def _symbols(hint: Any) -> set[str] | None:
    """The values an SDK field's type allows, when it is an enum or a Literal (None besides)."""
    options = (
        [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if typing.get_origin(hint)
        in (
            types.UnionType,
            typing.Union,
        )
        else [hint]
    )
    if len(options) != 1:
        return None
    [only] = options
    if isinstance(only, type) and issubclass(only, enum.StrEnum):
        return {member.value for member in only}
    if typing.get_origin(only) is typing.Literal:
        return set(typing.get_args(only))
    return None


def test_sdk_fields_mirror_schema_enums() -> None:
    """Every result field (and of the records nested in results the SDK mirrors) whose schema type is
    an enum is an SDK enum (or a Literal) of the same symbols."""
    named: dict[str, Any] = {}
    _named_types(expanded_current("keyload.Outcome"), "keyload", named)
    checked = 0
    for record_name, cls in {**RESULT_TYPES, **NESTED}.items():
        hints = typing.get_type_hints(cls)
        for f in named[record_name]["fields"]:
            field_type = f["type"]
            options = [t for t in field_type if t != "null"] if isinstance(field_type, list) else [field_type]
            enum_type = named.get(options[0]) if isinstance(options[0], str) else options[0]
            if len(options) != 1 or not isinstance(enum_type, dict) or enum_type.get("type") != "enum":
                continue
            if f["name"] not in hints:
                continue  # a class that reshapes its record (GroupView) is checked through NESTED
            assert _symbols(hints[f["name"]]) == set(enum_type["symbols"]), (record_name, f["name"])
            checked += 1
    assert checked >= 10


def test_every_sdk_name_is_a_client_method() -> None:
    for kind in COMMANDS:
        if kind.sdk is not None:
            assert callable(getattr(Client, kind.sdk, None)), kind.sdk
    assert Client.commands == {kind.name: kind for kind in COMMANDS}


def test_routes_name_body_fields_and_are_unique() -> None:
    named: dict[str, Any] = {}
    for branch in _body_union():
        _record_fields(branch["name"], branch, named)
    seen_routes: set[tuple[str, str]] = set()
    seen_cli: set[tuple[str, str]] = set()
    for kind in COMMANDS:
        if kind.route is not None:
            fields = {f["name"] for f in named[kind.branch]["fields"]}
            for param in PARAM.findall(kind.route.path):
                assert param in fields | {"domain", "partition"}, (kind.name, param)
            pair = (kind.route.method, kind.route.path)
            assert pair not in seen_routes, pair
            seen_routes.add(pair)
        if kind.cli is not None:
            assert kind.cli not in seen_cli, kind.cli
            seen_cli.add(kind.cli)


def test_batchable_rows_are_the_batch_mutation_union() -> None:
    [batch] = [branch for branch in _body_union() if branch["name"] == "keyload.command.Batch"]
    [mutations] = [f for f in batch["fields"] if f["name"] == "mutations"]
    mutation = mutations["type"]["items"]
    [union] = [f for f in mutation["fields"] if f["name"] == "mutation"]
    batchable = {kind.branch for kind in COMMANDS if kind.batchable}
    assert {_named(branch) for branch in union["type"]} == batchable
    assert set(MUTATIONS) == batchable


# -- a throwaway command kind, through a test-only table ---------------------------------------

ECHO = CommandKind(
    "Echo", "test_command_table:echo", "test.EchoResult", None, "echo", ("echo", "say"), None, stored=False
)
# Its body record, as the .avsc files would give it (the CLI reads it through the test table's `schema_of`).
ECHO_BODY: dict[str, Any] = {
    "type": "record",
    "name": "Echo",
    "namespace": "keyload.command",
    "doc": "say something back (a throwaway kind)",
    "fields": [
        {"name": "say", "type": "string", "doc": "what to say back"},
        {"name": "times", "type": "int", "default": 1},
        {"name": "tone", "type": {"type": "enum", "name": "Tone", "symbols": ["calm", "loud"]}, "default": "calm"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "until_ms", "type": ["null", "long"], "default": None},
    ],
}


@dataclass(frozen=True, slots=True)
class EchoResult:
    said: str
    offset: int


def echo(stage: Staged, body: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The throwaway kind's handler: writes one key and says what it was told."""
    stage.put(b"echo|" + body["say"].encode(), b"1")
    return {"said": body["say"], "offset": ctx.offset}


class EchoClient(Client):
    """A client over the test-only table, whose log is a list: what it submitted."""

    commands: ClassVar[Mapping[str, CommandKind]] = {**Client.commands, "Echo": ECHO}
    result_types: ClassVar[Mapping[str, type[Any]]] = {**RESULT_TYPES, "test.EchoResult": EchoResult}

    def __init__(self, answers: dict[str, Any]) -> None:
        self.submitted: list[tuple[str, str, dict[str, Any]]] = []
        self.answers = answers

    def submit(
        self,
        domain: str,
        kind: str,
        body: dict[str, Any],
        command_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Outcome:
        self.submitted.append((domain, kind, body))
        result = self.answers[kind]
        return Outcome(command_id or "c1", domain, 0, 7, 0, "committed", None, "", result)

    def close(self) -> None:
        """Nothing to close: no logs were opened (the CLI's handler closes the client it sent through)."""


def test_a_new_kind_is_dispatched_typed_and_sent_from_its_row(tmp_path: Path) -> None:
    """What adding a row buys, for a kind the real schema does not have. Covered: dispatch built from a
    test-only table (handler resolved from its row, under this package) applied to a real staged
    projection; its stored-ness; its outcome typed by the SDK's decoders built from the same table;
    and the SDK's generic path (`Client.send`) finding the row and typing the result. Not covered: Avro
    encoding of the throwaway kind and its outcome (the registry is the shipped schemas)."""
    table = (*COMMANDS, ECHO)
    dispatch = Dispatch.from_table(table[-1:], package="tests")
    assert not dispatch.stored(ECHO.branch) and DISPATCH.stored("keyload.command.Enqueue")

    store = Store(tmp_path / "projection")
    try:
        stage = Staged(store)
        ctx = Context(0, 7, 1_000, "c1", "acme", "alice", {})
        applied = dispatch.apply(stage, ECHO.branch, {"say": "hi"}, ctx)
        assert applied == ("test.EchoResult", {"said": "hi", "offset": 7})
        assert stage.get(b"echo|hi") == b"1"
    finally:
        store.close()

    decoders = results.decoders(table, EchoClient.result_types)
    typed = results.decode_result(applied[0], applied[1], decoders)
    assert typed == EchoResult("hi", 7)

    client = EchoClient({ECHO.branch: typed})
    assert client.send("Echo", "acme", {"say": "hi"}) == EchoResult("hi", 7)
    assert client.submitted == [("acme", "keyload.command.Echo", {"say": "hi"})]


def _echo_table(client: EchoClient) -> cli_commands.Table:
    """The CLI's table with the throwaway row: its record given as a dict, sent through `client`."""
    return dataclasses.replace(
        cli_commands.TABLE,
        rows=(*COMMANDS, ECHO),
        schema_of=lambda name: ECHO_BODY if name == ECHO.name else body_record(name),
        client_of=lambda args: client,
    )


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def test_a_new_kind_is_a_cli_command_from_its_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same throwaway row reaches the CLI through a test-only table (rows, its body record as a dict,
    the client the handler sends through), with no shape of its own. Covered: `keyload echo say` exists
    beside every real command, its options derived from the record (help on each, from the field's doc or
    generated; an int, an enum's choices, a repeated string array, an optional long, the required field
    required); a command line parsed into the body, defaults filled from the record; the generic handler
    (`main` -> `run_row`) sending that body as keyload.command.Echo through the test client over the test
    table and printing the typed result as JSON; and that body applied by the row's handler. The
    shipped CLI (`build_parser()`) has no such command."""
    client = EchoClient({ECHO.branch: EchoResult("hi", 7)})
    table = _echo_table(client)

    parser = _subparser(build_parser(table), "echo", "say")
    assert parser.description == "say something back (a throwaway kind)"
    options = {action.dest: action for action in parser._actions}
    assert {"say", "times", "tone", "tags", "until_ms", "domain", "command_id"} <= set(options)
    for action in parser._actions:
        assert action.help, action.dest
    assert options["say"].required and options["say"].help == "what to say back"
    assert options["times"].help == "an integer; default: 1"
    assert options["tone"].choices == ["calm", "loud"]
    assert options["tags"].option_strings == ["--tag"]
    assert options["until_ms"].option_strings == ["--until-ms"]
    assert parser.get_default("row") == "Echo"
    with pytest.raises(SystemExit) as done:
        main(["echo", "say", "--help"], table)
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "usage: keyload echo say" in shown and "what to say back" in shown and "--tag TAG" in shown
    with pytest.raises(SystemExit) as done:
        main(["echo", "say", "--domain", "acme"], table)  # --say is required by the record
    assert done.value.code == 2
    capsys.readouterr()

    line = ["echo", "say", "--domain", "acme", "--say", "hi", "--times", "3", "--tag", "a", "--tag", "b"]
    args = build_parser(table).parse_args(line)
    body = cli_commands.build_body(table.fields(ECHO), table.shape(ECHO), args)
    expected = {"say": "hi", "times": 3, "tone": "calm", "tags": ["a", "b"], "until_ms": None}
    assert body == expected

    assert main([*line, "--tone", "loud", "--json", "--command-id", "c9"], table) == 0
    assert json.loads(capsys.readouterr().out) == {"said": "hi", "offset": 7}
    assert client.submitted == [("acme", "keyload.command.Echo", {**expected, "tone": "loud"})]

    store = Store(tmp_path / "projection")
    try:
        ctx = Context(0, 7, 1_000, "c9", "acme", "anonymous", {})
        applied = Dispatch.from_table((ECHO,), package="tests").apply(Staged(store), ECHO.branch, body, ctx)
        assert applied == ("test.EchoResult", {"said": "hi", "offset": 7})
    finally:
        store.close()

    with pytest.raises(SystemExit):
        build_parser().parse_args(["echo", "say", "--help"])
    assert "invalid choice: 'echo'" in capsys.readouterr().err


def test_the_sdk_does_not_load_the_engine() -> None:
    probe = (
        "import sys; from keyload import Client; "
        "print(sorted(m for m in sys.modules if m.startswith(('rocksdict', 'confluent_kafka', 'keyload.processors'))))"
    )
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
