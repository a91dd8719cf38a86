"""The CLI's one grammar: a `keyload <noun> <verb>` for every command-table row with `cli`, options
derived from the body's Avro record, help on every option, no engine import for `--help`, JSON
output that parses, and the old top-level verbs as aliases."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from keyload.cli import build_parser, main
from keyload.cli import commands as cli_commands
from keyload.cli.operations import DEFAULTS
from keyload.cli.schema import body_fields
from keyload.commands import COMMANDS

from .support import run_keyload, start_service, stop_service

ROWS = [kind for kind in COMMANDS if kind.cli is not None]


def subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("kind", ROWS, ids=[" ".join(kind.cli or ()) for kind in ROWS])
def test_every_table_row_has_a_noun_verb_command_with_help_on_every_option(
    kind: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kind.cli is not None
    with pytest.raises(SystemExit) as done:
        main([*kind.cli, "--help"])
    assert done.value.code == 0
    assert f"usage: keyload {' '.join(kind.cli)}" in capsys.readouterr().out
    parser = subparser(build_parser(), *kind.cli)
    for action in parser._actions:
        assert action.help, f"{' '.join(kind.cli)}: {action.option_strings or action.dest} has no help"
    assert parser.get_default("row") == kind.name


@pytest.mark.parametrize("kind", ROWS, ids=[" ".join(kind.cli or ()) for kind in ROWS])
def test_every_body_field_is_an_option_a_positional_or_built(kind: Any) -> None:
    """Each schema field reaches the command line: by its name, renamed, flattened, or built by the row."""
    assert kind.cli is not None
    parser = subparser(build_parser(), *kind.cli)
    dests = {action.dest for action in parser._actions}
    shape = cli_commands.SHAPES[kind.name]
    for field in body_fields(kind.name):
        covered = (
            field.name in dests
            or field.name in shape.hidden
            or any(dest.startswith(f"{field.name}__") for dest in dests)
            or (field.kind == "bytes" and {"body", "body_file"} <= dests)
        )
        assert covered, f"{' '.join(kind.cli)}: no option for {field.name}"


def test_aliases_are_the_noun_verb_commands() -> None:
    parser = build_parser()
    for alias, target in cli_commands.ALIASES.items():
        old, new = subparser(parser, alias), subparser(parser, *target)
        assert old.get_default("row") == new.get_default("row")
        assert sorted(a.dest for a in old._actions) == sorted(a.dest for a in new._actions), alias


def test_the_cli_states_the_engines_defaults_and_choices() -> None:
    """The parser states defaults and choices without importing the engine: they must agree with it."""
    from keyload.operations import checkpoints, gc
    from keyload.processors.policy import ENUM_FIELDS, GROUP_ENUM_FIELDS, TOPIC_ENUM_FIELDS
    from keyload.projections import store
    from keyload.sdk import client
    from keyload.server import runner
    from keyload.service import kafka, ticker, workers
    from keyload.storage import datadir

    assert {
        "partitions": datadir.DEFAULT_PARTITIONS,
        "tick_interval_ms": ticker.DEFAULT_TICK_INTERVAL_MS,
        "session_timeout_ms": kafka.DEFAULT_SESSION_TIMEOUT_MS,
        "checkpoint_every": checkpoints.DEFAULT_CHECKPOINT_EVERY_RECORDS,
        "checkpoint_interval_s": checkpoints.DEFAULT_CHECKPOINT_INTERVAL_S,
        "checkpoint_retain": checkpoints.DEFAULT_RETAINED_CHECKPOINTS,
        "gc_interval_s": gc.DEFAULT_GC_INTERVAL_S,
        "projection_cache_mib": store.DEFAULT_PROJECTION_CACHE_BYTES // store.MIB,
        "projection_memtable_mib": store.DEFAULT_PROJECTION_WRITE_BUFFER_BYTES // store.MIB,
        "timeout": client.DEFAULT_TIMEOUT_S,
        "poison_limit": client.DEFAULT_POISON_LIMIT,
        "listen": f"{runner.DEFAULT_HOST}:{runner.DEFAULT_PORT}",
        "listen_env": runner.LISTEN_ENV,
        "workers": workers.DEFAULT_WORKERS,
    } == DEFAULTS
    assert {**ENUM_FIELDS, **GROUP_ENUM_FIELDS, **TOPIC_ENUM_FIELDS} == cli_commands.CHOICES


def test_relative_and_absolute_times() -> None:
    """A +DURATION counts from when the command is sent (`sent_now`, once the client is open), not from
    when the options were read: on a busy machine a `+500ms` read at parse time had passed on arrival."""
    assert cli_commands.epoch_ms("1700000000000") == 1_700_000_000_000
    relative = cli_commands.epoch_ms("+5s")
    assert relative == cli_commands.FromNow(5000)
    time.sleep(0.05)
    before = time.time_ns() // 1_000_000
    sent = cli_commands.sent_now({"expires_at_ms": relative, "not_before_ms": 7, "queue": "q"})
    assert 0 <= sent["expires_at_ms"] - before - 5000 < 5000
    assert {name: sent[name] for name in ("not_before_ms", "queue")} == {"not_before_ms": 7, "queue": "q"}
    with pytest.raises(argparse.ArgumentTypeError):
        cli_commands.epoch_ms("soon")


HELP_PROBE = """
import sys
from keyload.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("rocksdict", "confluent_kafka")
               or m.startswith("keyload.processors"))
print("HEAVY", heavy)
"""


@pytest.mark.parametrize("argv", [["--help"], ["queue", "enqueue", "--help"], ["group", "create", "--help"]])
def test_help_imports_no_engine(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", HELP_PROBE, *argv], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines()[-1] == "HEAVY []", result.stdout[-2000:]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "nothing")
    assert main(["queue", "enqueue", "--data", data, "--domain", "d", "--queue", "q"]) == 2
    assert capsys.readouterr().err == (
        "keyload: give exactly one of --body or --body-file (`keyload queue enqueue --help` shows the options)\n"
    )
    code = main(["topic", "publish", "--data", data, "--domain", "d", "--topic", "t", "--body", "x"])
    assert code == 2 and "give --type" in capsys.readouterr().err
    assert main(["queue", "inspect", "--data", data, "--domain", "d", "--queue", "q", "--log-format", "json"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and "keyload data directory" in record["message"]
    # A queue or topic is given once, as the row's positional or as its option.
    assert main(["queue", "pause", "--data", data, "--domain", "d"]) == 2
    assert capsys.readouterr().err == (
        "keyload: the queue is required: QUEUE or --queue (`keyload queue pause --help` shows the options)\n"
    )
    assert main(["topic", "read", "--data", data, "--domain", "d", "--topic", "t", "t"]) == 2
    assert capsys.readouterr().err == (
        "keyload: give the topic once: TOPIC or --topic (`keyload topic read --help` shows the options)\n"
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["log", "truncate", "--domain", "Shop", "--before", "0"], "'Shop' is not a domain"),
        (["restore", "--domain", "shop!"], "'shop!' is not a domain"),
        (["checkpoint", "--domain", ""], "'' is not a domain"),
        (["census", "--domain", "a" * 65], "is not a domain"),
        (["drill", "--partition", "-1"], "expected a partition (0 or more), got '-1'"),
        (["census", "--partition", "-1"], "expected a partition (0 or more), got '-1'"),
        (["gc", "release-pin", "--partition", "0", "--offset", "-3", "--session", "s"], "got '-3'"),
    ],
)
def test_an_operator_command_refuses_a_partition_no_command_could_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    """A domain only picks its partition by hash, so a typo (`Shop` for `shop`) would truncate or
    restore another partition: a name no command accepts is a usage error, as a negative number is."""
    with pytest.raises(SystemExit) as exited:  # argparse's own refusal of an option's value
        main([*argv, "--data", str(tmp_path / "data")])
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert named in line, line
    assert not (tmp_path / "data").exists()


def cli_json(*args: str) -> Any:
    result = run_keyload(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_noun_verb_commands_against_a_running_service(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = start_service(data, "--partitions", "2", "--gc-interval-s", "0")
    at = ("--data", str(data), "--domain", "shop")
    try:
        created = cli_json("queue", "create", *at, "jobs", "--max-attempts", "3", "--json")
        assert (created["queue"], created["policy"]["max_attempts"]) == ("jobs", 3)
        enqueued = cli_json(
            "queue", "enqueue", *at, "--queue", "jobs", "--message-id", "m-1", "--body", "hello",
            "--header", "kind=demo", "--not-before-ms", "+0s", "--json",
        )  # fmt: skip
        assert enqueued["message_id"] == "m-1"
        received = cli_json("queue", "receive", *at, "--queue", "jobs", "--lease-ms", "60000", "--json")
        [delivery] = received["deliveries"]
        assert (delivery["message_id"], delivery["body"], delivery["headers"]) == ("m-1", "hello", {"kind": "demo"})
        message = cli_json("message", "inspect", *at, "--queue", "jobs", "m-1", "--body", "--json")
        assert (message["message_id"], message["meta"]["state"], message["body"]) == ("m-1", "leased", "hello")
        acked = cli_json("lease", "ack", *at, delivery["token"], "--json")
        assert acked["state"] == "acked"
        view = cli_json("queue", "inspect", *at, "--queue", "jobs", "--json")
        counters = view["counters"]
        assert (counters["enqueued_total"], counters["acked_total"], counters["stored_messages"]) == (1, 1, 0)
        text = run_keyload("queue", "inspect", *at, "--queue", "jobs", "--output", "text")
        assert text.returncode == 0 and text.stdout.startswith("shop/jobs (policy version 1)")
        assert "acked_total" in text.stdout
        assert cli_json("queue", "pause", *at, "jobs", "--json")["paused"] is True  # as `queue create` takes it
        paused = run_keyload("queue", "receive", *at, "--queue", "jobs")
        assert paused.returncode == 1 and paused.stderr.startswith("keyload: rejected: DispatchPaused")
        assert cli_json("queue", "resume", *at, "--queue", "jobs", "--json")["paused"] is False
        closed = run_keyload("queue", "close", *at, "--queue", "jobs", "--output", "text")
        assert closed.returncode == 0 and closed.stdout.startswith("shop/jobs (policy version 1, closed)")
        late = run_keyload("queue", "enqueue", *at, "--queue", "jobs", "--body", "late")
        assert late.returncode == 1 and late.stderr.startswith("keyload: rejected: Conflict")
        cli_json("queue", "create", *at, "jobs-eu", "--json")
        listed = cli_json("queue", "list", *at, "jobs", "--max-queues", "1", "--json")
        assert ([q["queue"] for q in listed["queues"]], listed["next_after"]) == (["jobs"], "jobs")
        later = cli_json("queue", "list", *at, "jobs", "--after", "jobs", "--json")
        assert ([q["queue"] for q in later["queues"]], later["next_after"]) == (["jobs-eu"], None)
        assert cli_json("queue", "delete", *at, "--queue", "jobs", "--json")["closed"] is True
        assert [q["queue"] for q in cli_json("queue", "list", *at, "--json")["queues"]] == ["jobs-eu"]
        cli_json("queue", "enqueue", *at, "jobs-eu", "--body", "x", "--json")
        assert cli_json("queue", "purge", *at, "jobs-eu", "--json")["counters"]["stored_messages"] == 0
        table = run_keyload("queue", "list", *at, "--max-queues", "1", "--output", "text").stdout.splitlines()
        assert table[0].split() == ["queue", "ready", "leased", "scheduled", "dead_lettered", "stored", "flags"]
        assert table[1].split() == ["jobs-eu", "0", "0", "0", "0", "0", "-"] and len(table) == 2
        gone = run_keyload("queue", "inspect", *at, "--queue", "jobs")
        assert gone.returncode == 1 and gone.stderr.startswith("keyload: rejected: NotFound")
        cli_json("topic", "create", *at, "news", "--json")
        assert [t["topic"] for t in cli_json("topic", "list", *at, "--json")["topics"]] == ["news"]
        events = json.dumps(
            [{"event_id": "e-1", "type": "t", "body": "one"}, {"event_id": "e-2", "type": "t", "body": "two"}]
        )
        published = cli_json("topic", "publish", *at, "--topic", "news", "--events-json", events, "--json")
        assert [e["position"] for e in published["events"]] == [1, 2]
        page = cli_json("topic", "read", *at, "news", "--json")
        assert [e["body"] for e in page["events"]] == ["one", "two"]
        for readable in (("topic", "read", *at, "--topic", "news"), ("topic", "inspect", *at, "news")):
            shown = run_keyload(*readable, "--output", "text")
            assert shown.returncode == 0 and shown.stdout.strip() and not shown.stdout.startswith("{"), shown
        assert "body" in run_keyload("topic", "read", *at, "--topic", "news", "--output", "text").stdout
        policy = ("--max-age-ms", "0", "--discard", "old", "--expected-policy-version", "1", "--json")
        configured = cli_json("topic", "configure", *at, "news", *policy)
        assert (configured["policy_version"], configured["policy"]["discard"]) == (2, "old")
        assert cli_json("topic", "close", *at, "news", "--json")["closed"] is True
        group = cli_json("group", "create", *at, "--topic", "news", "g", "--start", "2", "--max-window", "4", "--json")
        assert group["policy"]["max_window"] == 4
        got = cli_json("group", "receive", *at, "--topic", "news", "g", "--json")
        assert [d["position"] for d in got["deliveries"]] == [2]
        doc = cli_json("doc", "put", *at, "k", "--body", "v", "--json")
        assert doc["revision"] == 1
        rotated = run_keyload("keys", "rotate", "--data", str(data), "--partition", "0", "--json")
        assert rotated.returncode == 0 and json.loads(rotated.stdout)[0]["partition"] == 0
        rejected = run_keyload("lease", "ack", *at, delivery["token"])
        # Its queue was deleted: the token names an incarnation that is gone.
        assert rejected.returncode == 1 and rejected.stderr.startswith("keyload: rejected: TokenInvalidated")
    finally:
        assert stop_service(service) == 0
