"""Schema evolution across a processor upgrade, on real RocksDB projections.

Stored records written under any released version are re-encoded under the current
schemas when a projection is opened writable, so a migrated projection digests like
a fresh one; a retry of a command whose outcome an older processor stored under its
own Command version still gets that outcome.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from keyload.limits import FEATURE_LEVEL
from keyload.log.codec import HEADER_BYTES, REGISTRY, CodecError, Record, Released, encoded_optional_long
from keyload.operations.recovery import replay
from keyload.processors.apply import Applied, apply_record
from keyload.processors.fingerprints import COMMAND, INFORMATIONAL_TAIL
from keyload.processors.outcomes import OUTCOME, new_outcome
from keyload.projections import keys
from keyload.projections.migration import UPCASTS
from keyload.projections.store import Staged, Store, StoreError
from keyload.service.access_control import enable_command

from .payloads import PREPARE, prepare_body
from .support import (
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    GROUP_NACK,
    GROUP_RECEIVE,
    PUBLISH,
    READ_TOPIC,
    Embedded,
    command,
    create_group_body,
    create_queue_body,
    create_topic_body,
    enqueue_body,
    event,
    expect,
    group_receive_body,
    publish_body,
    read_body,
    submit_unhalted,
)
from .test_long_poll import RECEIVE, receive_body

D = "acme"
T = "news"
Rows = dict[bytes, bytes]
STORED = sorted({layout.name for layout in keys.FAMILY_VALUES.values() if layout is not None})
EVERY_ROW = (b"", b"\xff")


def released_version(name: str, version: int) -> Released:
    [released] = [r for r in REGISTRY.released(name) if r.version == version]
    return released


def run_workload(embedded: Embedded) -> None:
    """Every family that holds a record gets rows: queues, messages, a waiter, a poison entry,
    topics, events, a group with outstanding and parked positions, stored and deferred outcomes,
    documents, inbox entries, a domain policy, receipts, a payload reservation, a retention task,
    principals and a deleted
    queue, topic and group still being reclaimed."""

    def ok(kind: str, body: Record) -> Any:
        return expect(submit_unhalted(embedded, D, kind, body), None)

    ok(CREATE_QUEUE, create_queue_body("jobs"))
    reservation = ok(PREPARE, prepare_body("large", b"abc", queue="jobs", upload_window_ms=1_000))
    # Cancelled: the reservation stays, and a retention task takes on whatever an upload left. Its
    # deletion is confirmed, so the queue holds no reservation quota any more: a state older
    # processors could write too.
    ok("keyload.command.CancelLargeSchedule", {"reservation_id": reservation.reservation_id})
    embedded.now_ms = reservation.upload_deadline_ms + 60_000
    ok("keyload.command.AdvanceRecoveryFloor", {"floor_offset": embedded.store(D).applied_offset})
    ok("keyload.command.BeginDelete", {"task_id": 1})
    ok("keyload.command.DeleteConfirmed", {"task_id": 1, "deleted_versions": []})
    ok(ENQUEUE, enqueue_body("jobs", "m-1", headers={"a": "1", "b": "2"}))
    ok(ENQUEUE, enqueue_body("jobs", "m-2", not_before_ms=embedded.now_ms + 60_000))
    ok(CREATE_QUEUE, create_queue_body("q"))  # receive_body's queue: a Receive waits on it
    embedded.append(D, command(D, RECEIVE, receive_body(20_000), "waiting"))
    embedded.append(D, b"not a command")
    embedded.run()
    ok(CREATE_TOPIC, create_topic_body(T))
    ok(PUBLISH, publish_body(T, event("e-1", k="v"), event("e-2"), event("e-3")))
    ok(READ_TOPIC, read_body(T, 1))
    ok(CREATE_GROUP, create_group_body(T, "g", max_attempts=1))
    first, second, _ = ok(GROUP_RECEIVE, group_receive_body(T, "g", max_events=3)).deliveries  # the third stays
    ok(GROUP_NACK, {"topic": T, "group": "g", "token": first.token, "delay_ms": None})  # parked: one attempt
    put = {"domain": None, "mutation": ("keyload.command.PutDocument", {"key": "d-1", "value": b"v"})}
    ok("keyload.command.Batch", {"mutations": [put]})
    done = {"token": second.token, "handler_scope": "svc", "execution_generation": 0, "topic": T, "group": "g"}
    ok("keyload.command.CompleteProcessing", dict(done, effects=[]))
    ok("keyload.command.ConfigureInbox", {"max_receipts": 10, "max_bytes": 10_000})
    source = {"domain": "other", "queue": "jobs", "message_id": "m-1", "delivery_generation": 1}
    ok(
        "keyload.command.CommitInbox",
        {"source": source, "handler_scope": "svc", "execution_generation": 0, "effects": []},
    )
    # Level 2: a domain policy, an outcome in the horizon index, and one already shrunk to its receipt.
    ok("keyload.command.RaiseFeatureLevel", {"level": 2})
    ok("keyload.command.ConfigureDomain", {"outcome_horizon_ms": 1_000, "receipt_horizon_ms": 600_000})
    ok(ENQUEUE, enqueue_body("jobs", "m-3"))
    embedded.now_ms += 2_000
    ok("keyload.command.Tick", {})
    assert any(True for _ in embedded.store(D).scan(keys.RECEIPT, keys.prefix_end(keys.RECEIPT)))
    # A topic deleted by force with its group, with more rows than the records after it reclaim: it is
    # first in the due index (the lowest incarnation due), so its Z row, its group's Y row and the
    # queue's X row below all outlive the workload.
    ok(CREATE_TOPIC, create_topic_body("doomed-topic"))
    for first in range(0, 1_000, 100):
        ok(PUBLISH, publish_body("doomed-topic", *(event(f"x-{i}") for i in range(first, first + 100))))
    ok(CREATE_GROUP, create_group_body("doomed-topic", "g"))
    ok("keyload.command.DeleteTopic", {"topic": "doomed-topic", "force": True})
    # A queue deleted by force with more rows than one record reclaims: its X row outlives the workload.
    ok(CREATE_QUEUE, create_queue_body("doomed"))
    for first in range(0, 300, 100):
        enqueues = [
            {"domain": None, "mutation": (ENQUEUE, enqueue_body("doomed", f"d-{i}"))} for i in range(first, first + 100)
        ]
        ok("keyload.command.Batch", {"mutations": enqueues})
    ok("keyload.command.DeleteQueue", {"queue": "doomed", "force": True})
    partition = embedded.partition(D)
    embedded.append(D, enable_command(embedded.data.root, partition, embedded.data.partitions))  # principals
    embedded.run()


@pytest.fixture(scope="module")
def workload_rows(tmp_path_factory: pytest.TempPathFactory) -> Rows:
    """Every row of the workload's projection, as the current processor wrote it."""
    embedded = Embedded(tmp_path_factory.mktemp("workload") / "data")
    try:
        run_workload(embedded)
        rows = dict(embedded.store(D).scan(*EVERY_ROW))
    finally:
        embedded.close()
    missing = {tag for tag, layout in keys.FAMILY_VALUES.items() if layout is not None} - {
        key[:1] for key, _, _ in stored_records(rows)
    }
    assert not missing, f"run_workload writes no row of the record families {sorted(missing)}: extend it"
    assert any(key[:1] == keys.OUTCOME and len(value) == keys.SHA256_BYTES for key, value in rows.items())  # deferred
    return rows


def stored_records(rows: Rows) -> Iterator[tuple[bytes, keys.RecordValue, bytes]]:
    """(key, what its family holds, the encoded record) of each row holding a record."""
    for key, value in rows.items():
        layout = keys.FAMILY_VALUES[key[:1]]
        if layout is not None and len(value) > layout.skip:
            yield key, layout, value[layout.skip :]


def encoded_under(released: Released, record: Record) -> bytes | None:
    """`record` as a processor of that version wrote it; None where that version cannot hold it."""
    try:
        return released.header + REGISTRY.encode_body_under(released.schema, record)
    except CodecError:
        return None


def rewritten(rows: Rows, encode: Callable[[bytes, str, Record], bytes | None]) -> Rows:
    """`rows` without the mark, each record encoded by `encode` (left as it is where that gives None)."""
    result = dict(rows)
    for key, layout, record in stored_records(rows):
        encoded = encode(key, layout.name, REGISTRY.decode(layout.name, record))
        if encoded is not None:
            result[key] = rows[key][: layout.skip] + encoded
    result.pop(keys.SCHEMA_SET, None)
    return result


def migrated(rows: Rows) -> Rows:
    """What migrating `rows` must leave: every record (upcast) in its current encoding, and the mark."""

    def encode(_: bytes, name: str, record: Record) -> bytes:
        upcast = UPCASTS.get(name)
        return REGISTRY.encode(name, record if upcast is None else upcast(record))

    return {**rewritten(rows, encode), keys.SCHEMA_SET: REGISTRY.schema_set}


def oldest(rows: Rows, lossless: bool = False) -> Rows:
    """Each record under the oldest released version that can write it (and, if `lossless`, read it back).

    A deleted resource's reclamation record (`X`, `Y`, `Z`) is always read back whole: no processor
    before the version that added its `reclaim_from` wrote one."""
    retired = {key for key in rows if key[:1] in (keys.RETIRED, keys.RETIRED_GROUP, keys.RETIRED_TOPIC)}

    def encode(key: bytes, name: str, record: Record) -> bytes | None:
        for released in REGISTRY.released(name):
            value = encoded_under(released, record)
            if value is not None and (not (lossless or key in retired) or REGISTRY.decode(name, value) == record):
                return value
        return None

    return rewritten(rows, encode)


def write_unmigrated(path: Path, rows: Rows) -> None:
    """A projection as an older processor left it: rocksdict directly, so nothing migrates."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(path), options)
    for key, value in rows.items():
        db[key] = value
    db.close()


def sequence_number(path: Path) -> int:
    """RocksDB's last write sequence number: unchanged means nothing was written."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        number: int = db.latest_sequence_number()
        return number
    finally:
        db.close()


def fresh_digest(path: Path, rows: Rows) -> str:
    """The digest of a new store given `rows` by a commit, as a replay by this processor writes them."""
    store = Store(path)
    try:
        store.commit(rows, keys.read_u64(rows[keys.APPLIED_OFFSET]), keys.read_u64(rows[keys.LAST_TIME]))
        return store.digest()
    finally:
        store.close()


def assert_migrates(tmp_path: Path, old: Rows) -> None:
    """Opening `old` writable leaves exactly `migrated(old)`; opening it again writes nothing."""
    write_unmigrated(tmp_path / "old", old)
    store = Store(tmp_path / "old")
    try:
        assert dict(store.scan(*EVERY_ROW)) == migrated(old)
        digest = store.digest()
    finally:
        store.close()
    assert digest == fresh_digest(tmp_path / "fresh", migrated(old))
    before = sequence_number(tmp_path / "old")
    Store(tmp_path / "old").close()
    assert sequence_number(tmp_path / "old") == before
    again = Store(tmp_path / "old", read_only=True)
    try:
        assert again.digest() == digest
    finally:
        again.close()


@pytest.mark.parametrize(
    ("name", "version"), [(name, released.version) for name in STORED for released in REGISTRY.released(name)]
)
def test_records_written_under_every_released_version_migrate_on_open(
    workload_rows: Rows, tmp_path: Path, name: str, version: int
) -> None:
    released = released_version(name, version)
    old = rewritten(workload_rows, lambda _, n, record: encoded_under(released, record) if n == name else None)
    assert any(
        layout.name == name and record.startswith(released.header) for _, layout, record in stored_records(old)
    ), f"no {name} row can be written under v{version}"
    assert_migrates(tmp_path, old)


def test_a_projection_of_mixed_versions_migrates_and_an_interrupted_migration_completes(
    workload_rows: Rows, tmp_path: Path
) -> None:
    old = oldest(workload_rows)
    assert_migrates(tmp_path / "mixed", old)
    # A crash part-way: the rows up to some key are rewritten, the mark is not there yet.
    done = sorted(old)[len(old) // 2]
    partly = {key: (migrated(old)[key] if key < done else value) for key, value in old.items()}
    assert partly != old
    assert_migrates(tmp_path / "interrupted", partly)


def test_a_new_store_is_marked_and_a_read_only_open_never_migrates(workload_rows: Rows, tmp_path: Path) -> None:
    new = Store(tmp_path / "new")
    try:
        assert dict(new.scan(*EVERY_ROW)) == {keys.SCHEMA_SET: REGISTRY.schema_set}
    finally:
        new.close()
    old = oldest(workload_rows)
    write_unmigrated(tmp_path / "old", old)
    frozen = Store(tmp_path / "old", read_only=True)
    try:
        assert dict(frozen.scan(*EVERY_ROW)) == old
    finally:
        frozen.close()


def test_a_value_of_no_known_schema_refuses_the_writable_open(workload_rows: Rows, tmp_path: Path) -> None:
    queue = keys.queue(D, "jobs")
    assert queue in workload_rows
    write_unmigrated(tmp_path / "old", {**oldest(workload_rows), queue: b"\xc3\x01" + bytes(8) + b"?"})
    with pytest.raises(StoreError, match="unknown writer schema"):
        Store(tmp_path / "old")


def test_a_projection_a_newer_keyload_raised_is_refused_by_its_level_before_any_row_is_read(
    workload_rows: Rows, tmp_path: Path
) -> None:
    """Its rows may be of schemas this keyload lacks: the refusal names the level, not a row, and writes
    nothing (the newer keyload opens it as it left it)."""
    queue = keys.queue(D, "jobs")
    newer = {
        **workload_rows,
        keys.SCHEMA_SET: b"a newer keyload's schema set",
        keys.FEATURE_LEVEL: keys.u64(FEATURE_LEVEL + 1),
        queue: b"\xc3\x01" + bytes(8) + b"?",  # a schema this keyload does not know
    }
    write_unmigrated(tmp_path / "newer", newer)
    before = sequence_number(tmp_path / "newer")
    with pytest.raises(StoreError, match=f"feature level {FEATURE_LEVEL + 1}, above the {FEATURE_LEVEL}"):
        Store(tmp_path / "newer")
    assert sequence_number(tmp_path / "newer") == before


def test_a_checkpoint_taken_by_an_older_processor_is_migrated_when_a_replay_restores_it(tmp_path: Path) -> None:
    embedded = Embedded(tmp_path / "data")
    try:
        run_workload(embedded)
        partition = embedded.partition(D)
        # What an older processor's projection held for the same state: each record under the
        # oldest version that holds it without loss, no mark.
        write_unmigrated(tmp_path / "old", oldest(dict(embedded.store(D).scan(*EVERY_ROW)), lossless=True))
        frozen = Store(tmp_path / "old", read_only=True)
        try:
            taken = embedded.checkpoints.take(frozen, partition)
        finally:
            frozen.close()
        submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m-3"))
        replayed = replay(embedded.data, partition, tmp_path / "replay", from_offset=taken.offset + 1, progress=False)
        assert (replayed.applied_offset, replayed.digest) == (embedded.store(D).applied_offset, embedded.digest(D))
    finally:
        embedded.close()


# Command kinds whose fingerprint is checked across versions, each with a body naming its target.
BODIES: dict[str, Callable[[str], Record]] = {
    ENQUEUE: lambda name: enqueue_body(name, "m-1", headers={"a": "1", "b": "2"}),
    RECEIVE: lambda name: dict(receive_body(5_000), queue=name),
    PUBLISH: lambda name: publish_body(name, event("e-1", k="v")),
    READ_TOPIC: lambda name: read_body(name, 2),
    GROUP_RECEIVE: lambda name: group_receive_body(name, "g", max_events=5),
}


def fields(command_schema: Any, kind: str) -> set[str] | None:
    """The field names of a command kind's record in a (parsed) Command schema, None where it has no such kind."""
    [body] = [f for f in command_schema["fields"] if f["name"] == "body"]
    found = next((b for b in body["type"] if b["name"] == kind), None)
    return None if found is None else {f["name"] for f in found["fields"]}


def lacking(kind: str, field: str) -> list[int]:
    """The released Command versions with `kind` but without its `field`, which the current schema has."""
    if field not in (fields(REGISTRY.schema(COMMAND), kind) or set()):
        return []
    return [r.version for r in REGISTRY.released(COMMAND) if field not in (fields(r.schema, kind) or {field})]


def envelope(kind: str, body: Record) -> Record:
    return {
        "command_id": "c-1",
        "domain": D,
        "principal": "tester",
        "body": (kind, body),
        "reply_to": None,
        "client_time_ms": None,
    }


def old_processor_fingerprint(value: bytes) -> bytes:
    """What the processor of the value's own version stored: SHA-256, up to the tail, of the command
    under the oldest version up to its own that writes and reads it back unchanged. (Processors
    before v4 took the bytes as written; for the commands they knew, that is the same encoding.)"""
    decoded = REGISTRY.decode(COMMAND, value)
    versions = list(REGISTRY.released(COMMAND))
    own = next(i for i, r in enumerate(versions) if r.header == value[:HEADER_BYTES])
    encoded = value[HEADER_BYTES:]
    for candidate in versions[: own + 1]:
        older = encoded_under(candidate, decoded)
        if older is not None and REGISTRY.decode(COMMAND, older) == decoded:
            encoded = older[HEADER_BYTES:]
            break
    tail = sum(len(encoded_optional_long(None)) for _ in INFORMATIONAL_TAIL)
    return hashlib.sha256(encoded[:-tail]).digest()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "db")
    yield store
    store.close()


def store_old_outcome(store: Store, value: bytes) -> bytes:
    """Keep an outcome for command c-1 under the fingerprint the processor of `value`'s version gave it
    (the outcome itself as a migration leaves it); the outcome's bytes."""
    outcome = REGISTRY.encode(OUTCOME, new_outcome("c-1", D, 0, 0, 1_000))
    store.commit({keys.outcome(D, "c-1"): old_processor_fingerprint(value) + outcome}, 0, 1_000)
    return outcome


def apply(store: Store, value: bytes) -> tuple[Applied, Staged]:
    stage = Staged(store)
    return apply_record(stage, value, partition=0, partitions=1, offset=1, now_ms=2_000, keyring={}), stage


def error_code(applied: Applied) -> str | None:
    [(_, outcome)] = applied.published
    code: str | None = REGISTRY.decode(OUTCOME, outcome)["error_code"]
    return code


@pytest.mark.parametrize(
    ("version", "kind"),
    [
        (r.version, kind)
        for r in REGISTRY.released(COMMAND)
        if not REGISTRY.is_current(COMMAND, r.header)  # this processor's own: tests/test_idempotency.py
        for kind in BODIES
        if fields(r.schema, kind) is not None
    ],
)
def test_a_retry_matches_the_fingerprint_an_older_processor_stored(store: Store, version: int, kind: str) -> None:
    released = released_version(COMMAND, version)
    as_old_client_wrote_it = encoded_under(released, envelope(kind, BODIES[kind]("target")))
    assert as_old_client_wrote_it is not None
    outcome = store_old_outcome(store, as_old_client_wrote_it)
    as_upgraded_client_retries_it = command(D, kind, BODIES[kind]("target"), "c-1", reply_to=3)
    for value, reply_to in ((as_old_client_wrote_it, None), (as_upgraded_client_retries_it, 3)):
        applied, stage = apply(store, value)
        assert applied.published == ((reply_to, outcome),) and not applied.committed
        assert len(stage) == 0  # no new effect
    applied, stage = apply(store, command(D, kind, BODIES[kind]("another"), "c-1"))
    assert (error_code(applied), len(stage)) == ("Conflict", 0)


@pytest.mark.parametrize("version", lacking(GROUP_RECEIVE, "wait_ms"))
def test_a_field_the_old_version_lacks_never_matches_its_fingerprint(store: Store, version: int) -> None:
    released = released_version(COMMAND, version)
    as_old_client_wrote_it = encoded_under(released, envelope(GROUP_RECEIVE, BODIES[GROUP_RECEIVE]("target")))
    assert as_old_client_wrote_it is not None
    store_old_outcome(store, as_old_client_wrote_it)
    waiting = dict(BODIES[GROUP_RECEIVE]("target"), wait_ms=1_000)
    applied, stage = apply(store, command(D, GROUP_RECEIVE, waiting, "c-1"))
    assert (error_code(applied), len(stage)) == ("Conflict", 0)


def test_a_projection_an_older_processor_wrote_migrates_to_what_this_one_writes(
    workload_rows: Rows, tmp_path: Path
) -> None:
    """The rule for schema authors, checked: every field a version added defaults (or is upcast, as a
    TopicPage's next_cursor is) to what this processor computes for the same state, and command
    fingerprints do not move, so migrating equals replaying, byte for byte."""
    old = oldest(workload_rows)
    results = [
        REGISTRY.decode(OUTCOME, record)["result"]
        for _, layout, record in stored_records(old)
        if layout.name == OUTCOME
    ]
    [page] = [value for kind, value in filter(None, results) if kind == "keyload.result.TopicPage"]
    assert page["next_cursor"] == ""  # as a processor stored it before pages had cursors
    write_unmigrated(tmp_path / "old", old)
    store = Store(tmp_path / "old")
    try:
        assert dict(store.scan(*EVERY_ROW)) == workload_rows
    finally:
        store.close()
