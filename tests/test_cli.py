"""The command line as a person uses it: clear one-line errors, and the README's main command."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from keyload import Client
from keyload.errors import InvalidCommand
from keyload.log.base import partition_for
from keyload.storage.datadir import DataDir

from .support import keyload_command, run_keyload, self_signed, spread_domains, start_service, stop_service

ROOT = Path(__file__).resolve().parent.parent


def assert_one_clear_line(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_errors_without_a_service_are_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    assert_one_clear_line(run_keyload("status", "--data", missing), 1, "is not a keyload data directory")
    assert_one_clear_line(run_keyload("poison", "list", "--data", missing), 1, "is not a keyload data directory")
    result = run_keyload(
        "enqueue", "--data", missing, "--domain", "d", "--queue", "q", "--body", "x", "--body-file", "f"
    )
    assert_one_clear_line(result, 2, "exactly one of --body or --body-file")
    result = run_keyload("drill", "--data", missing, "--partition", "0")
    assert_one_clear_line(result, 1, "is not a keyload data directory")
    assert_one_clear_line(run_keyload("frobnicate"), 2, "invalid choice: 'frobnicate'")  # argparse's, one line too
    result = run_keyload("log", "truncate", "--data", missing, "--partition", "0", "--before", "-5")
    assert_one_clear_line(result, 2, "argument --before: expected a log offset (0 or more), got '-5'")
    assert "`keyload log truncate --help` shows the options" in result.stderr
    result = run_keyload("queue", "inspect", "--domain", "d", "--queue", "q", "--bogus")
    assert_one_clear_line(result, 2, "unrecognized arguments: --bogus (`keyload queue inspect --help` shows")
    assert run_keyload("run", "--data", missing, "--tick-interval-ms", "0").returncode == 2
    assert "Traceback" not in run_keyload("run", "--data", missing, "--tick-interval-ms", "0").stderr
    result = run_keyload("run", "--data", missing, "--projection-memtable-mib", "2048")
    assert_one_clear_line(result, 2, "a projection's memtable must be 1 to 1024 MiB, not 2048")
    assert not Path(missing).exists()
    result = run_keyload("run", "--data", missing, "--listen", "bogus")
    assert_one_clear_line(result, 2, "--listen takes HOST:PORT, not 'bogus'")
    assert not Path(missing).exists()  # a usage error creates nothing, so it fixes no partition count
    (tmp_path / "garbage.pem").write_text("garbage")
    for cert, key in (("no-cert.pem", "no-key.pem"), ("garbage.pem", "garbage.pem")):
        tls = ("--tls-cert", str(tmp_path / cert), "--tls-key", str(tmp_path / key))
        result = run_keyload("run", "--data", missing, "--listen", "127.0.0.1:0", *tls)
        assert_one_clear_line(result, 2, f"{' '.join(tls).replace(' --tls-key', ' with --tls-key')} cannot be loaded")
    # An encrypted key is refused, never prompted for on a terminal (where the start would block).
    cert, key = self_signed(tmp_path, passphrase=b"secret")
    result = run_keyload(
        "run", "--data", missing, "--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)
    )
    assert_one_clear_line(result, 2, f"--tls-key {key} is encrypted: keyload run takes an unencrypted key")
    assert not Path(missing).exists()
    result = run_keyload("run", "--data", missing, "--partitions", "100000")
    assert_one_clear_line(result, 2, "partition counts must be 1..1024")
    result = run_keyload("run", "--data", missing, "--segment-bytes", "100")
    assert_one_clear_line(result, 2, "segment bytes must be 4096..2147483648")
    insync = ("--replication-factor", "1", "--min-insync-replicas", "2", "--listen", "none")
    result = run_keyload("run", "--data", missing, "--kafka", "127.0.0.1:9", *insync)
    assert_one_clear_line(result, 2, "--min-insync-replicas must be in 1..--replication-factor")
    assert not Path(missing).exists()  # nothing recorded that no later start could run with
    # A Kafka processor runs no GC worker: the option would be ignored, and no GC would run.
    result = run_keyload("run", "--data", missing, "--listen", "none", "--kafka", "127.0.0.1:1", "--gc-interval-s", "5")
    assert_one_clear_line(result, 2, "--gc-interval-s is for the embedded log: on Kafka, run `keyload gc run")
    assert not Path(missing).exists()
    for option, value in (
        ("--checkpoint-interval-s", "0"),
        ("--gc-interval-s", "-1"),
        ("--gc-interval-s", "nan"),
        ("--timeout", "inf"),
    ):
        result = run_keyload("run", "--data", missing, option, value)
        assert result.returncode == 2 and f"argument {option}: expected a number of seconds" in result.stderr, result
        assert "Traceback" not in result.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_keyload("run", "--data", missing, "--listen", f"127.0.0.1:{port}")
    assert_one_clear_line(result, 1, f"cannot listen on 127.0.0.1:{port}")
    assert not Path(missing).exists()  # the port is bound before the data directory is created

    DataDir.create(tmp_path / "data")
    data = str(tmp_path / "data")
    result = run_keyload(
        "enqueue", "--data", data, "--domain", "d", "--queue", "q", "--body", "x", "--command-id", "a b"
    )
    assert_one_clear_line(result, 2, "command id must be 1..128 printable ASCII characters")  # a usage error
    result = run_keyload("enqueue", "--data", data, "--domain", "d", "--queue", "q", "--body", "x", "--command-id", "")
    assert_one_clear_line(result, 2, "command id must be 1..128 printable ASCII characters")
    result = run_keyload("drill", "--data", data, "--partition", "0", "--from-checkpoint", "abc")
    assert_one_clear_line(result, 2, "--from-checkpoint must be 'latest' or a checkpoint offset")
    result = run_keyload("drill", "--data", data, "--partition", "0", "--from-checkpoint", "latest")
    assert_one_clear_line(result, 1, "partition 0 has no checkpoint; take one with `keyload checkpoint`")
    result = run_keyload("gc", "status", "--data", data)  # at once, not a timeout per partition
    assert_one_clear_line(result, 1, f"gc status asks the running service: start `keyload run --data {data}` first")
    for broken in ("[]", '{"format": 1}', '{"format": 1, "partitions": 0, "outcome_partitions": 8}'):
        (tmp_path / "data" / "keyload.json").write_text(broken)
        assert_one_clear_line(run_keyload("status", "--data", data), 1, "keyload.json")


def test_output_to_a_reader_that_left_ends_quietly_with_141(tmp_path: Path) -> None:
    """`keyload ... | head`: the status of 1,024 partitions (about 90 KB) outgrows the pipe, whose reader
    takes 100 bytes and leaves; the writer stops as a shell's SIGPIPE would, and says nothing."""
    DataDir.create(tmp_path / "data", 1024)
    status = subprocess.Popen(
        keyload_command("status", "--data", str(tmp_path / "data")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert status.stdout is not None and status.stderr is not None
    assert status.stdout.read(100)
    status.stdout.close()
    assert status.wait(60) == 141
    assert status.stderr.read() == b""


def test_a_key_the_keyring_lacks_is_refused_before_it_is_appended(tmp_path: Path) -> None:
    """`keys rotate` or a PutPrincipal naming a key the keyring lacks would halt every partition it
    reaches (RecoveryRequired) until the key is added: a local client refuses it, appending nothing."""
    data = DataDir.create(tmp_path / "data")

    def log_ends() -> list[int]:
        with data.file_command_log() as log:
            return [log.end_offset(partition) for partition in range(data.partitions)]

    result = run_keyload("keys", "rotate", "--data", str(data.root), "--partition", "0", "--token-key", "nosuch")
    assert_one_clear_line(result, 1, "token_key_id names no key of the keyring: add it first (keyload keys add)")
    with Client(data.root) as admin, pytest.raises(InvalidCommand, match=r"^key_id names no key of the keyring"):
        admin.put_principal("late", key_id="nosuch", grants=[])
    assert log_ends() == [0] * data.partitions


def test_a_restore_prints_its_result_as_json_and_needs_a_record(tmp_path: Path) -> None:
    """The replaced projection's path is a string in JSON (it once stopped `--json` with a traceback);
    a partition whose log is still empty has nothing to restore, and says so."""
    root = tmp_path / "data"
    DataDir.create(root)
    empty = run_keyload("restore", "--data", str(root), "--partition", "0", "--quiet")
    assert_one_clear_line(empty, 1, "partition 0's log holds no record yet: there is nothing to restore")
    assert run_keyload("run", "--data", str(root), "--listen", "none", "--until-idle").returncode == 0
    result = run_keyload("restore", "--data", str(root), "--partition", "0", "--quiet", "--json")
    assert result.returncode == 0, result.stderr
    restored = json.loads(result.stdout)
    assert (restored["partition"], restored["start"]) == (0, "offset 0")
    assert Path(restored["kept_aside"]).is_dir()


def test_a_restore_of_a_partition_whose_log_lost_every_record_empties_its_projection(tmp_path: Path) -> None:
    """Every segment of a partition's log deleted: the projection is ahead of a log that holds
    nothing, and the partition halts RecoveryRequired pointing at `keyload restore`, which must then
    rebuild what a replay of nothing gives (not say there is nothing to restore)."""
    root = tmp_path / "data"
    DataDir.create(root, 2)
    domain = next(d for d in spread_domains(2, 2) if partition_for(d, 2) == 1)
    service = start_service(root)
    try:
        with Client(root) as client:
            client.create_queue(domain, "q")
            client.enqueue(domain, "q", b"lost", message_id="m")
    finally:
        assert stop_service(service) == 0
    for segment in (root / "log" / "commands" / "p-0001").glob("*.seg"):
        segment.unlink()
    until_idle = ("run", "--data", str(root), "--listen", "none", "--until-idle")
    assert run_keyload(*until_idle).returncode == 1  # stopped with partition 1 halted
    assert "HALTED" in run_keyload("status", "--data", str(root)).stdout
    restored = run_keyload("restore", "--data", str(root), "--partition", "1", "--quiet")
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.startswith("restored partition 1 from offset 0: applied nothing"), restored.stdout
    assert "the replaced projection is kept at" in restored.stdout
    assert run_keyload(*until_idle).returncode == 0
    assert "HALTED" not in run_keyload("status", "--data", str(root)).stdout


def test_a_cli_long_poll_waits_its_wait_ms_before_its_timeout(tmp_path: Path) -> None:
    """`queue receive --wait-ms` longer than `--timeout`: the CLI waits out the poll, then its
    timeout, as the SDK's receive does; a message enqueued meanwhile is delivered to it (not leased
    to a waiter its caller gave up on)."""
    root = tmp_path / "data"
    service = start_service(root)
    at = ("--data", str(root), "--domain", "shop")
    try:
        assert run_keyload("queue", "create", *at, "q").returncode == 0
        polling = subprocess.Popen(
            keyload_command("queue", "receive", *at, "--queue", "q", "--wait-ms", "4000", "--timeout", "1", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.5)  # past the 1 s timeout, within the poll
        assert (
            run_keyload("queue", "enqueue", *at, "--queue", "q", "--body", "late", "--message-id", "m").returncode == 0
        )
        out, err = polling.communicate(timeout=30)
        assert polling.returncode == 0, err
        [delivery] = json.loads(out)["deliveries"]
        assert (delivery["message_id"], delivery["body"]) == ("m", "late")
    finally:
        assert stop_service(service) == 0


@pytest.mark.slow
def test_commands_against_a_running_service(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    service = start_service(tmp_path / "data", "--partitions", "2")
    try:
        created = run_keyload(
            "queue", "create", "--data", data, "--domain", "shop", "orders", "--max-stored-messages", "1"
        )
        assert created.returncode == 0 and '"queue": "orders"' in created.stdout
        domain = ("--data", data, "--domain", "shop")
        configured = run_keyload("domain", "configure", *domain, "--outcome-horizon-ms", "60000")
        assert configured.returncode == 0 and '"outcome_horizon_ms": 60000' in configured.stdout, configured
        assert '"receipt_horizon_ms": 604800000' in run_keyload("domain", "inspect", *domain).stdout
        stale = run_keyload("domain", "configure", *domain, "--expected-policy-version", "0")
        assert_one_clear_line(stale, 1, "rejected: RevisionConflict")
        frozen = ("--data", data, "--domain", "frozen")
        assert run_keyload("domain", "caps", *frozen, "--max-queues", "0").returncode == 0  # a cap of none
        assert_one_clear_line(run_keyload("queue", "create", *frozen, "q"), 1, "rejected: ResourceExhausted")
        args = ("enqueue", "--data", data, "--domain", "shop", "--queue", "orders", "--body", "hi")
        assert run_keyload(*args, "--message-id", "a").returncode == 0
        assert_one_clear_line(run_keyload(*args, "--message-id", "b"), 1, "rejected: ResourceExhausted")
        assert_one_clear_line(run_keyload(*args[:5], "--queue", "nope", "--body", "x"), 1, "rejected: NotFound")
        bad = run_keyload("queue", "create", "--data", data, "--domain", "shop", "orders", "--max-attempts", "0")
        assert_one_clear_line(bad, 1, "policy.max_attempts must be between 1 and 1000")
        assert_one_clear_line(run_keyload("drill", "--data", data, "--partition", "7"), 1, "partition must be 0..1")
        assert_one_clear_line(
            run_keyload(
                "replay", "--data", data, "--domain", "shop", "--from-offset", "2", "--into", str(tmp_path / "r")
            ),
            1,
            "no checkpoint at offset 1",
        )
        truncate = ("log", "truncate", "--data", data, "--domain", "shop", "--before")
        assert_one_clear_line(
            run_keyload(*truncate, "1"), 1, "has no published checkpoint: its log cannot be truncated"
        )
        # Replay from one past a checkpoint, into an existing empty directory.
        checkpoint = run_keyload("checkpoint", "--data", data, "--domain", "shop")
        assert checkpoint.returncode == 0, checkpoint.stderr
        offset = int(checkpoint.stdout.split("at offset ")[1].split(":")[0])
        (tmp_path / "empty").mkdir()
        replayed = run_keyload(
            "replay",
            "--data",
            data,
            "--domain",
            "shop",
            "--from-offset",
            str(offset + 1),
            "--to-offset",  # the service's GC worker may log the new recovery floor after the checkpoint
            str(offset),
            "--into",
            str(tmp_path / "empty"),
        )
        assert replayed.returncode == 0 and f"offset {offset}," in replayed.stdout, replayed
        # The log may be truncated up to the recovery floor (the file log keeps whole segments), not past it.
        assert_one_clear_line(run_keyload(*truncate, str(offset + 2)), 1, "would pass its recovery floor")
        truncated = run_keyload(*truncate, str(offset + 1))
        assert truncated.returncode == 0 and "log now starts at offset 0" in truncated.stdout, truncated
        inspected = run_keyload(
            "inspect", "--data", data, "--domain", "shop", "--queue", "orders", "--message", "a", "--body"
        )
        assert '"body": "hi"' in inspected.stdout and '"state": "ready"' in inspected.stdout
        # The queue as `queue inspect` takes it: a positional too, given once.
        counters = run_keyload("inspect", "--data", data, "--domain", "shop", "orders", "--json")
        assert counters.returncode == 0 and '"enqueued_total": 1' in counters.stdout, counters
        twice = run_keyload("inspect", "--data", data, "--domain", "shop", "orders", "--queue", "orders")
        assert_one_clear_line(twice, 2, "give the queue once")
    finally:
        assert stop_service(service) == 0


@pytest.mark.slow
def test_queue_work_from_the_command_line(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    service = start_service(tmp_path / "data", "--partitions", "2")
    try:
        assert (
            run_keyload("queue", "create", "--data", data, "--domain", "shop", "jobs", "--max-attempts", "1").returncode
            == 0
        )
        for message_id in ("a", "b"):
            enqueue = ("enqueue", "--data", data, "--domain", "shop", "--queue", "jobs", "--message-id", message_id)
            assert run_keyload(*enqueue, "--body", message_id).returncode == 0
        received = run_keyload("receive", "--data", data, "--domain", "shop", "--queue", "jobs", "--max-messages", "2")
        deliveries = json.loads(received.stdout)["deliveries"]
        assert [d["message_id"] for d in deliveries] == ["a", "b"] and deliveries[0]["body"] == "a"
        tokens = {d["message_id"]: d["token"] for d in deliveries}
        renewed = run_keyload("renew", "--data", data, "--domain", "shop", tokens["a"], "--lease-ms", "60000")
        assert json.loads(renewed.stdout)["state"] == "leased"
        assert (
            json.loads(run_keyload("ack", "--data", data, "--domain", "shop", tokens["a"]).stdout)["state"] == "acked"
        )
        nacked = run_keyload("nack", "--data", data, "--domain", "shop", tokens["b"])
        assert json.loads(nacked.stdout)["state"] == "dead_lettered"
        assert_one_clear_line(run_keyload("ack", "--data", data, "--domain", "shop", tokens["a"]), 1, "StaleLease")
        assert_one_clear_line(run_keyload("ack", "--data", data, "--domain", "shop", "garbage"), 1, "TokenInvalidated")
        page = json.loads(run_keyload("dlq", "list", "--data", data, "--domain", "shop", "--queue", "jobs").stdout)
        [dead] = page["messages"]
        version, generation = dead["meta"]["state_version"], dead["meta"]["delivery_generation"]
        args = ("--data", data, "--domain", "shop", "--queue", "jobs", "b", "--generation", str(generation))
        assert_one_clear_line(run_keyload("redrive", *args, "--state-version", "999"), 1, "RevisionConflict")
        redriven = run_keyload("redrive", *args, "--state-version", str(version))
        assert json.loads(redriven.stdout)["meta"]["state"] == "ready"
        stats = run_keyload("stats", "--data", data, "--domain", "shop", "--queue", "jobs").stdout
        counted = dict(line.split() for line in stats.splitlines()[1:])
        assert (counted["acked_total"], counted["ready"]) == ("1", "1")
        assert run_keyload("keys", "add", "--data", data, "k1").returncode == 0
        assert "token key k1" in run_keyload("keys", "rotate", "--data", data, "--token-key", "k1").stdout
        relet = run_keyload("receive", "--data", data, "--domain", "shop", "--queue", "jobs")
        assert json.loads(relet.stdout)["deliveries"][0]["token"] != tokens["b"]
    finally:
        assert stop_service(service) == 0
