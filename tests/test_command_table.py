"""The command table (keyload/commands.py) against the schema, the processor, the SDK and the CLI's names."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import io
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

import fastavro
import pytest

from keyload.cli import commands as cli_commands
from keyload.cli.main import build_parser, main
from keyload.cli.schema import body_record
from keyload.commands import BY_NAME, COMMAND_ID, COMMANDS, CommandKind
from keyload.log.codec import REGISTRY, expanded_current
from keyload.processors.apply import COMMANDS as DISPATCHED
from keyload.processors.apply import DISPATCH, UNSTORED_KINDS, Dispatch
from keyload.processors.batch import MUTATIONS
from keyload.processors.context import Context
from keyload.processors.outcomes import new_outcome
from keyload.projections.records import AvroRecord, Int, Long
from keyload.projections.store import Staged, Store
from keyload.sdk import results
from keyload.sdk.client import Client
from keyload.sdk.results import RESULT_TYPES, Outcome
from keyload.wire import names

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


def test_request_defaults_fill_fields_of_their_body() -> None:
    """A request default names a field of its body (and alternatives that may be null), fills it
    only when none of them is given, and COMMAND_ID stands for the command's own id."""
    defaulted = {kind.name: kind.request_default for kind in COMMANDS if kind.request_default is not None}
    assert set(defaulted) == {"ReadTopic", "Enqueue"}
    for name, default in defaulted.items():
        fields = {f["name"]: f for f in names("keyload.Command").types[BY_NAME[name].branch]["fields"]}
        assert default.field in fields and all("null" in fields[other]["type"] for other in default.unless)
        value = "c-1" if default.value is COMMAND_ID else default.value
        assert BY_NAME[name].filled({}, "c-1") == {default.field: value}
        for given_name in (default.field, *default.unless):
            given = {given_name: "given"}
            assert BY_NAME[name].filled(given, "c-1") is given, (name, given_name)


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


class EchoResult(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The throwaway kind's result record, typed as every result is (keyload/sdk/results.py)."""

    AVRO_NAME = "test.EchoResult"

    said: str
    offset: Long


ECHO_RESULT: dict[str, Any] = {
    "type": "record",
    "name": "EchoResult",
    "namespace": "test",
    "fields": [{"name": "said", "type": "string"}, {"name": "offset", "type": "long"}],
}


def _with_branch(name: str, field: str, branch: dict[str, Any]) -> Any:
    """The current schema `name` with one more branch in the union of its field `field`, parsed."""
    schema = copy.deepcopy(expanded_current(name))
    [union] = [f for f in schema["fields"] if f["name"] == field]
    union["type"].append(branch)
    return fastavro.parse_schema(schema)


def _round_trip(schema: Any, record: dict[str, Any]) -> Any:
    """Avro-encoded under `schema` and decoded as the registry decodes (unions as (branch, value))."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, record)
    out.seek(0)
    return fastavro.schemaless_reader(out, schema, None, return_record_name=True, return_record_name_override=True)


class Tone(StrEnum):
    calm = "calm"
    loud = "loud"


class Echo(AvroRecord, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The throwaway kind's body record, typed as every body is (keyload/bodies.py)."""

    AVRO_NAME = "keyload.command.Echo"

    say: str
    times: Int = 1
    tone: Tone = Tone.calm
    tags: list[str] = []
    until_ms: Long | None = None


ECHO_BODIES = {ECHO.branch: Echo}


def echo(stage: Staged, body: Echo, ctx: Context) -> dict[str, Any]:
    """The throwaway kind's handler: writes one key and says what it was told."""
    stage.put(b"echo|" + body.say.encode(), b"1")
    return {"said": body.say, "offset": ctx.offset}


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
    """What adding a schema branch, a handler and a row buys, for a kind the shipped schema lacks.
    Covered: the command, its body record added to the Command's body union, encoded and decoded in
    Avro as the registry does; dispatch built from a test-only table (handler resolved from its row,
    under this package) applying the decoded body to a real staged projection; its stored-ness; the
    outcome, its result record added to the Outcome's result union, through Avro too, and typed by
    the SDK's decoders built from the same table; and the SDK's generic path (`Client.send`)
    finding the row and typing the result."""
    table = (*COMMANDS, ECHO)
    command_schema = _with_branch("keyload.Command", "body", ECHO_BODY)
    outcome_schema = _with_branch("keyload.Outcome", "result", ECHO_RESULT)
    envelope = {
        "command_id": "c1",
        "domain": "acme",
        "principal": "alice",
        "body": (ECHO.branch, {"say": "hi", "times": 2, "tone": "loud", "tags": ["a"], "until_ms": None}),
        "reply_to": 0,
        "client_time_ms": 1_000,
    }
    command = _round_trip(command_schema, envelope)
    assert command == envelope
    dispatch = Dispatch.from_table(table[-1:], package="tests", bodies=ECHO_BODIES)
    assert not dispatch.stored(ECHO.branch) and DISPATCH.stored("keyload.command.Enqueue")

    store = Store(tmp_path / "projection")
    try:
        stage = Staged(store)
        ctx = Context(0, 7, 1_000, "c1", "acme", "alice", {})
        kind, body = command["body"]
        applied = dispatch.apply(stage, kind, dispatch.typed(kind, body), ctx)
        assert applied == ("test.EchoResult", {"said": "hi", "offset": 7})
        assert stage.get(b"echo|hi") == b"1"
    finally:
        store.close()

    outcome = new_outcome("c1", "acme", 0, 7, 1_000)
    outcome["result"] = applied
    decoded = _round_trip(outcome_schema, outcome)
    assert decoded["result"] == applied
    decoders = results.decoders(table, EchoClient.result_types)
    typed = results.decode_result(*decoded["result"], decoders)
    assert typed == EchoResult(said="hi", offset=7)

    client = EchoClient({ECHO.branch: typed})
    assert client.send("Echo", "acme", {"say": "hi"}) == EchoResult(said="hi", offset=7)
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
    client = EchoClient({ECHO.branch: EchoResult(said="hi", offset=7)})
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
        dispatch = Dispatch.from_table((ECHO,), package="tests", bodies=ECHO_BODIES)
        applied = dispatch.apply(Staged(store), ECHO.branch, dispatch.typed(ECHO.branch, body), ctx)
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
