"""What an operator sees: `keyload status` per partition (empty, halted, corrupt, poison), `keyload poison
list` after another process appended garbage to the command log, and the modes of a new data directory."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from keyload import Client
from keyload.cli import main
from keyload.commands import BY_NAME
from keyload.credentials import ADMIN_PRINCIPAL, Credential, contents
from keyload.log.base import LogCorruption, partition_for
from keyload.log.codec import REGISTRY
from keyload.log.file_log import HEADER_BYTES, FileLog
from keyload.log.kafka_log import ensure_topics
from keyload.sdk.results import PoisonEntry
from keyload.service.halts import Halt, record_halt
from keyload.storage import keyring
from keyload.storage.datadir import DataDir, KafkaConfig

from .support import free_port, keyload_command, served_url, start_service, stop_service

GARBAGE = b"\x00not Avro: what a producer in another language might write by mistake"
UNKNOWN_SCHEMA = b"\xc3\x01" + bytes(8) + b"\x02body"


def keyload_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`keyload ARGS` in this process: exit code, stdout, stderr."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_until_idle(data: Path, *args: str, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    """`keyload run --until-idle` in its own process (no GC worker: it would append commands of its own)."""
    result = subprocess.run(
        keyload_command("run", "--data", str(data), "--until-idle", "--gc-interval-s", "0", *args),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=None if umask is None else lambda: os.umask(umask),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def append_raw(data: Path, partitions: int, partition: int, *values: bytes) -> None:
    """Append records to the command log as another process would: bytes, no client."""
    log = FileLog(data / "log" / "commands", partitions)
    try:
        log.append(partition, list(values))
    finally:
        log.close()


SERVICE_RECORDS = ("EnableAccessControl", "RaiseFeatureLevel")


def assert_only_the_service_records(data: Path, partitions: int) -> None:
    """Each partition holds the records `keyload run` appends before it serves: EnableAccessControl
    (docs/ARCHITECTURE.md §5a), then RaiseFeatureLevel (§7). What another process appends comes
    after them, from offset 2."""
    log = FileLog(data / "log" / "commands", partitions)
    try:
        for partition in range(partitions):
            records = log.read(partition, 0, 10)
            kinds = [REGISTRY.decode("keyload.Command", contents(r.value))["body"][0] for r in records]
            assert kinds == [BY_NAME[name].branch for name in SERVICE_RECORDS], partition
    finally:
        log.close()


def test_poison_list_shows_records_another_process_appended(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    run_until_idle(data, "--partitions", "2")
    assert_only_the_service_records(data, 2)
    append_raw(data, 2, 1, GARBAGE, UNKNOWN_SCHEMA)
    run_until_idle(data)

    code, out, err = keyload_main(capsys, "poison", "list", "--data", str(data))
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert all(isinstance(entry.pop("timestamp_ms"), int) for entry in listed)
    assert listed == [
        {
            "partition": 1,
            "offset": 2,
            "reason": "not an Avro single-object encoded value",
            "size": len(GARBAGE),
            "sha256": hashlib.sha256(GARBAGE).hexdigest(),
            "first_bytes_hex": GARBAGE[:32].hex(),
        },
        {
            "partition": 1,
            "offset": 3,
            "reason": "unknown writer schema fingerprint 0000000000000000",
            "size": len(UNKNOWN_SCHEMA),
            "sha256": hashlib.sha256(UNKNOWN_SCHEMA).hexdigest(),
            "first_bytes_hex": UNKNOWN_SCHEMA.hex(),
        },
    ]
    code, out, _ = keyload_main(capsys, "poison", "list", "--data", str(data), "--partition", "1", "--limit", "1")
    assert code == 0 and [entry["offset"] for entry in json.loads(out)] == [2]
    code, out, _ = keyload_main(capsys, "poison", "list", "--data", str(data), "--partition", "0")
    assert (code, json.loads(out)) == (0, [])
    code, out, err = keyload_main(capsys, "poison", "list", "--data", str(data), "--partition", "2")
    assert (code, out, err) == (1, "", "keyload: partition must be 0..1\n")

    # The same from the SDK, typed.
    with Client(data) as client:
        [first, second] = client.poison_entries()
        assert client.poison_entries(0) == [] and client.poison_entries(limit=1) == [first]
    assert first == PoisonEntry(
        partition=1,
        offset=2,
        timestamp_ms=first.timestamp_ms,
        size=len(GARBAGE),
        sha256=hashlib.sha256(GARBAGE).hexdigest(),
        reason="not an Avro single-object encoded value",
        first_bytes=GARBAGE[:32],
    )
    assert (second.offset, second.first_bytes) == (3, UNKNOWN_SCHEMA)

    code, out, _ = keyload_main(capsys, "status", "--data", str(data))
    assert code == 0
    assert out.splitlines()[1:] == [
        "  p0: log 0..1, applied through 1, lag 0, no checkpoints, recovery floor none, poison 0",
        "  p1: log 0..3, applied through 3, lag 0, no checkpoints, recovery floor none, poison 2",
    ]


def test_status_names_an_empty_a_halted_and_a_corrupt_partition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    run_until_idle(data, "--partitions", "3")
    # Partition 0 keeps nothing but the service's own records; the others get garbage after them.
    assert_only_the_service_records(data, 3)
    append_raw(data, 3, 1, GARBAGE)
    append_raw(data, 3, 2, GARBAGE, GARBAGE + b"!")
    run_until_idle(data)
    # Partition 1 halts at its next record (as `keyload run` records it); partition 2's first frame is
    # damaged afterwards.
    record_halt(data, Halt(1, 3, "Corruption: queue 7 counter ready would go negative"))
    [segment] = (data / "log" / "commands" / "p-0002").glob("*.seg")
    damaged = bytearray(segment.read_bytes())
    damaged[HEADER_BYTES + 3] ^= 0xFF
    segment.write_bytes(bytes(damaged))
    log = FileLog(data / "log" / "commands", 3)
    with pytest.raises(LogCorruption) as corruption:
        log.end_offset(2)
    log.close()
    # Partition 0's catalog holds an entry cut short (a disk that lost the end of a file).
    entry = data / "catalog" / "p-0000" / f"{1:020d}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text('{"broken\n')

    code, out, err = keyload_main(capsys, "status", "--data", str(data))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"{data}: embedded file log, 3 partitions, 8 outcome partitions",
        "  p0: log 0..1, applied through 1, lag 0, checkpoints unknown, recovery floor unknown, poison 0, "
        f"CATALOG UNREADABLE: catalog file {entry} cannot be read: "
        "Invalid control character at: line 1 column 9 (char 8)",
        "  p1: log 0..2, applied through 2, lag 0, no checkpoints, recovery floor none, poison 1, "
        "HALTED at offset 3: Corruption: queue 7 counter ready would go negative",
        "  p2: log unreadable, applied through 3, lag unknown, no checkpoints, recovery floor none, poison 2, "
        f"LOG CORRUPT: {corruption.value}",
    ]
    partitions = "\n".join(out.splitlines()[1:]).replace(str(entry), "ENTRY")  # a path may hold "-1"
    assert "None" not in partitions and "-1" not in partitions


def test_a_local_command_nobody_answers_says_why_the_machine_knows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local client's timeout says no `keyload run` serves the directory, or that the domain's
    partition is halted (as `keyload run` recorded it), rather than only asking whether one runs."""
    data = tmp_path / "data"
    run_until_idle(data, "--partitions", "1")
    enqueue = ("queue", "enqueue", "--data", str(data), "--domain", "d", "--queue", "q", "--body", "x")
    code, _, err = keyload_main(capsys, *enqueue, "--timeout", "0.2")
    assert code == 1
    assert err.strip().endswith(f"no `keyload run` serves {data}: the command waits in the log until one does")
    record_halt(data, Halt(0, 3, "RecoveryRequired: the log lost offset 3"))
    code, _, err = keyload_main(capsys, *enqueue, "--timeout", "0.2")
    assert code == 1
    assert err.strip().endswith(
        "partition 0 is halted at offset 3: RecoveryRequired: the log lost offset 3 (see `keyload status`)"
    )


def test_a_local_command_nobody_answers_on_kafka_names_the_owning_node_as_where_to_look(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kafka_bootstrap: str
) -> None:
    """On Kafka only the node that owns a partition records its halt: a timeout says where to look,
    not whether `keyload run` runs (it may, on other machines)."""
    data = tmp_path / "data"
    ensure_topics(
        DataDir.create(data, 2, kafka=KafkaConfig(kafka_bootstrap, f"quiet-{uuid.uuid4().hex[:10]}")).kafka_settings()
    )
    partition = partition_for("d", 2)
    enqueue = ("queue", "enqueue", "--data", str(data), "--domain", "d", "--queue", "q", "--body", "x")
    code, _, err = keyload_main(capsys, *enqueue, "--timeout", "0.5")
    assert code == 1
    assert err.strip().endswith(
        f"on Kafka the processor that owns partition {partition} answers: `keyload status` on that node's data "
        "directory says whether it is halted (a halt is recorded where it happened)"
    )


def test_status_before_any_run_reads_as_nothing_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    assert keyload_main(capsys, "poison", "list", "--data", str(data))[0] == 1  # no data directory yet
    from keyload.storage.datadir import DataDir

    DataDir.create(data, 1)
    code, out, _ = keyload_main(capsys, "status", "--data", str(data))
    assert code == 0
    assert out.splitlines()[1:] == [
        "  p0: log empty, applied nothing, lag 0, no checkpoints, recovery floor none, poison 0"
    ]
    assert keyload_main(capsys, "poison", "list", "--data", str(data)) == (0, "[]\n", "")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_data_directory_and_its_key_material_are_private(tmp_path: Path) -> None:
    first = tmp_path / "node-a"
    run_until_idle(first, "--partitions", "1", umask=0)
    shared = tmp_path / "shared-keyring.json"  # handed around with a world-readable mode
    shared.write_bytes((first / keyring.FILE).read_bytes())
    shared.chmod(0o644)

    second = tmp_path / "node-b"
    run_until_idle(second, "--partitions", "1", "--keyring-from", str(shared), umask=0)
    for node in (first, second):
        assert mode(node) == 0o700, node
        assert mode(node / keyring.FILE) == 0o600, node
        assert mode(node / "keyload.json") == 0o600, node
        assert not list(node.glob("*.tmp"))
    assert keyring.load(second) == keyring.load(first)
    assert mode(shared) == 0o644  # the source is left as it is

    keyring.add(second, "k1")  # rewriting the keyring keeps it private
    assert mode(second / keyring.FILE) == 0o600 and "k1" in keyring.load(second)

    # A file that is not a keyring is refused before anything is created.
    (tmp_path / "not-a-keyring.json").write_text('{"format": 1, "keys": {"k0": "c2hvcnQ="}}')
    refused = subprocess.run(
        keyload_command(
            "run", "--data", str(tmp_path / "node-c"), "--keyring-from", str(tmp_path / "not-a-keyring.json")
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "shorter than 16 bytes" in refused.stderr and "c2hvcnQ" not in refused.stderr
    assert not (tmp_path / "node-c" / "keyload.json").exists()
    assert not (tmp_path / "node-c" / keyring.FILE).exists()


def test_status_of_a_busy_partition_is_never_ahead_of_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keyload status` beside a service applying a steady load: the projection is read before the
    log's end, so the line never shows the projection ahead of the log (which would mean a log that
    lost its tail), only a lag."""
    data = tmp_path / "data"
    service = start_service(data, "--partitions", "1", "--listen", f"127.0.0.1:{free_port()}", "--gc-interval-s", "0")
    url = served_url(data)
    admin = Credential.load(data / "credentials" / f"{ADMIN_PRINCIPAL}.json")
    with Client(url, credential=admin) as client:
        client.create_queue("shop", "orders")
    stop = threading.Event()
    failures: list[BaseException] = []

    def load() -> None:
        try:
            with Client(url, credential=admin) as client:
                while not stop.is_set():
                    client.enqueue("shop", "orders", b"x")
        except BaseException as exc:  # the test fails on it, not on a status without load
            failures.append(exc)

    producers = [threading.Thread(target=load) for _ in range(4)]
    for producer in producers:
        producer.start()
    try:
        lines = []
        for _ in range(60):
            code, out, _ = keyload_main(capsys, "status", "--data", str(data))
            assert code == 0
            lines.append(out.splitlines()[1])
        assert [line for line in lines if "ahead of the log" in line] == []
        assert all(", lag " in line for line in lines), lines
    finally:
        stop.set()
        for producer in producers:
            producer.join()
        assert stop_service(service) == 0
    assert failures == []
    applied = [int(line.split("applied through ")[1].split(",")[0]) for line in lines]
    assert applied[-1] - applied[0] >= 60, applied  # the partition applied records all along
