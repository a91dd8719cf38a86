"""One documented exception root: everything the SDK and the CLI raise is a `KeyloadError`, with a short
message; a command the client cannot append raises `InvalidCommand` and appends nothing; duplicate-event
refusals name the event id the caller gave."""

from __future__ import annotations

import importlib
import inspect
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

import keyload.errors
from keyload import Client
from keyload.cli import main
from keyload.errors import (
    CommandTooLarge,
    DuplicateEventIdError,
    InvalidCommand,
    KeyloadError,
    ValidationError,
)
from keyload.log.base import LogError
from keyload.log.file_log import DEFAULT_CONFIG, FileLog
from keyload.sdk.results import Event, PublishEvents
from keyload.storage.datadir import DataDir, DataDirError
from keyload.storage.keyring import KeyringError

from .support import start_service, stop_service

SHORT = 200  # characters: one line a person reads

# Every module whose exceptions can reach an SDK or CLI user (not the processors' internal signals,
# not the development servers).
USER_FACING = (
    "keyload.errors",
    "keyload.cli",
    "keyload.sdk.client",
    "keyload.sdk.consumer",
    "keyload.sdk.coalescer",
    "keyload.sdk.results",
    "keyload.storage.datadir",
    "keyload.storage.keyring",
    "keyload.service.halts",
    "keyload.operations.catalog",
    "keyload.operations.checkpoints",
    "keyload.operations.recovery",
    "keyload.operations.census",
    "keyload.storage.object_store",
    "keyload.sdk.payloads",
    "keyload.operations.gc",
    "keyload.service.runtime",
    "keyload.service.embedded",
    "keyload.service.kafka",
    "keyload.service.ticker",
    "keyload.service.doorbell",
    "keyload.log.base",
    "keyload.log.codec",
    "keyload.log.file_log",
    "keyload.log.kafka_log",
    "keyload.projections.store",
    "keyload.projections.migration",
)


def test_every_exception_class_keyload_defines_derives_from_the_documented_root() -> None:
    found = []
    for name in USER_FACING:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found.append(cls)
                assert issubclass(cls, KeyloadError), f"{name}.{cls.__name__} does not derive from KeyloadError"
    named = {cls.__name__ for cls in found} - {"KeyloadError"}
    doc = keyload.errors.__doc__ or ""
    per_code = {cls.__name__ for cls in keyload.errors.BY_CODE.values()}  # documented as "one per error code"
    assert {name for name in named - per_code if name not in doc} == set()
    for base in ("DataDirError", "PayloadError", "LogError", "CodecError", "StoreError", "KeyringError"):
        assert base in named


def assert_short(exc: BaseException) -> None:
    """One short line, and a short traceback too (no 15 KB schema dump chained behind it)."""
    message = str(exc)
    assert len(message) < SHORT and "\n" not in message, message
    assert len("".join(traceback.format_exception(exc))) < 4_000


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    """A client of a data directory nobody serves: what it refuses, it refuses before appending."""
    DataDir.create(tmp_path / "data", 2)
    with Client(tmp_path / "data", timeout_s=0.2) as sdk:
        yield sdk


def log_ends(sdk: Client) -> list[int]:
    log = sdk.data.command_log()
    try:
        return [log.end_offset(partition) for partition in range(sdk.data.partitions)]
    finally:
        log.close()


def test_an_unknown_kind_or_a_body_that_does_not_match_appends_nothing(client: Client) -> None:
    with pytest.raises(InvalidCommand) as unknown:
        client.submit("shop", "keyload.command.Frobnicate", {"queue": "q"})
    assert str(unknown.value) == "unknown command kind 'keyload.command.Frobnicate'; nothing was appended"
    assert isinstance(unknown.value, KeyloadError) and isinstance(unknown.value, ValueError)
    assert_short(unknown.value)

    with pytest.raises(InvalidCommand) as mismatched:
        client.submit("shop", "keyload.command.CreateQueue", {"queue": "q", "policy": {"max_attempts": "SECRET"}})
    assert str(mismatched.value) == (
        "keyload.command.CreateQueue does not match its schema at keyload.QueuePolicySpec.max_attempts; "
        "nothing was appended"
    )
    assert_short(mismatched.value)

    with pytest.raises(InvalidCommand) as wrong_type:
        client.submit("shop", "keyload.command.Enqueue", {"queue": "q", "body": "not bytes"})
    assert "keyload.command.Enqueue does not match its schema" in str(wrong_type.value)
    assert "not bytes" not in str(wrong_type.value)
    assert_short(wrong_type.value)

    for bad_id in ("has spaces", ""):  # an empty id is refused, never replaced by a random one
        with pytest.raises(InvalidCommand, match=r"command id must be 1\.\.128 printable ASCII characters"):
            client.enqueue("shop", "q", b"x", command_id=bad_id)
    assert log_ends(client) == [0, 0]


def test_a_command_over_the_log_record_limit_is_refused_with_the_limit(client: Client) -> None:
    limit = DEFAULT_CONFIG.max_record_bytes
    with pytest.raises(CommandTooLarge) as too_large:
        client.enqueue("shop", "q", b"x" * (limit + 1))
    message = str(too_large.value)
    assert message.startswith("the command is ") and f"record limit of {limit} bytes" in message
    assert message.endswith("nothing was appended")
    assert isinstance(too_large.value, InvalidCommand)
    assert_short(too_large.value)
    assert log_ends(client) == [0, 0]

    # The log's own refusal (a producer appending straight to it) is under the root too.
    log = FileLog(client.data.root / "log" / "commands", 2)
    with pytest.raises(KeyloadError) as refused:
        log.append(0, [b"x" * (limit + 1)])
    log.close()
    assert isinstance(refused.value, LogError) and str(limit) in str(refused.value)
    assert_short(refused.value)


def test_setup_errors_are_under_the_root(tmp_path: Path) -> None:
    with pytest.raises(KeyloadError) as missing:
        Client(tmp_path / "nowhere")
    assert isinstance(missing.value, DataDirError) and "is not a keyload data directory" in str(missing.value)
    DataDir.create(tmp_path / "data", 1)
    (tmp_path / "data" / "keyring.json").write_text("garbage")
    with pytest.raises(KeyringError) as keyring:
        DataDir.open(tmp_path / "data").keyring()
    assert isinstance(keyring.value, KeyloadError) and "garbage" not in str(keyring.value)
    with pytest.raises(InvalidCommand):
        Client(tmp_path / "data", reply_partition=99)


def test_duplicate_events_are_named_by_the_ids_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    service = start_service(data, "--partitions", "1", "--gc-interval-s", "0")
    try:
        common = ("--data", str(data), "--domain", "shop")
        assert main(["topic", "create", *common, "events"]) == 0
        publish = ["publish", *common, "--topic", "events", "--event-id", "order-17", "--type", "order"]
        assert main([*publish, "--body", "secret body"]) == 0
        capsys.readouterr()
        assert main([*publish, "--body", "secret body"]) == 1
        assert capsys.readouterr().err == (
            "keyload: rejected: DuplicateEventId: event 'order-17' was already published at position 1\n"
        )
        assert main([*publish, "--body", "other secret"]) == 1
        err = capsys.readouterr().err
        assert err == (
            "keyload: rejected: Conflict: event 'order-17': its id was published at position 1 with other content\n"
        )

        with Client(data) as client:
            events = [Event("a-1", "order", b"1"), Event("b-2", "order", b"2"), Event("b-2", "order", b"2")]
            with pytest.raises(ValidationError) as twice:
                client.publish("shop", "events", events)
            assert str(twice.value) == "Validation: events 'b-2' and 'b-2' have the same event id"
            assert twice.value.outcome.detail == "events 1 and 2 have the same event id"  # as stored
            with pytest.raises(DuplicateEventIdError) as again:
                client.batch("shop", [PublishEvents("events", [Event("order-17", "order", b"secret body")])])
            assert str(again.value) == (
                "DuplicateEventId: mutation 0: event 'order-17' was already published at position 1"
            )
    finally:
        assert stop_service(service) == 0
