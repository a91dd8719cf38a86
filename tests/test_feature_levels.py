"""Feature levels (processors/features.py): new semantics start at a logged RaiseFeatureLevel.

What a user notices: from level 1 a read keeps no outcome (the projection does not grow with reads)
and its repeat is answered afresh, while a mutation's repeat still returns its stored outcome; a
log without the raise replays exactly as before (tests/test_fixture_replay.py), and one with it
replays to the live state; `keyload run` raises every partition it serves.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from keyload import limits
from keyload.commands import COMMANDS
from keyload.credentials import ADMIN_PRINCIPAL
from keyload.log.base import partition_for
from keyload.processors.features import LEVEL_1_READS, feature_level
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.sdk.results import QueueView
from keyload.service.access_control import enable_command
from keyload.service.halts import recorded_halts
from keyload.storage.datadir import DataDir
from keyload.storage.principals import system_credential

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_QUEUE,
    RAISE_FEATURE_LEVEL,
    Embedded,
    assert_replay_equals_live,
    create_queue_body,
    enqueue_body,
    expect,
    keyload_command,
    spread_domains,
    submit_unhalted,
)

D = "acme"


def ok(embedded: Embedded, kind: str, body: dict[str, Any], command_id: str | None = None) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body, command_id), None)


def stored_messages(embedded: Embedded, command_id: str) -> int:
    view: QueueView = ok(embedded, INSPECT_QUEUE, {"queue": "jobs"}, command_id)
    return view.counters.stored_messages


def test_from_level_1_a_read_keeps_no_outcome_and_its_repeat_is_answered_afresh(
    embedded: Embedded, tmp_path: Path
) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    assert feature_level(embedded.store(D)) == 0
    assert stored_messages(embedded, "look-0") == 0
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    assert stored_messages(embedded, "look-0") == 0  # level 0: the stored outcome, as it was
    assert embedded.stored_outcome(D, "look-0") is not None

    assert ok(embedded, RAISE_FEATURE_LEVEL, {"level": 1}).feature_level == 1
    assert stored_messages(embedded, "look-1") == 1
    assert embedded.stored_outcome(D, "look-1") is None  # nothing kept
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m2"), "enqueue-m2")
    assert stored_messages(embedded, "look-1") == 2  # the repeat is a fresh read
    assert stored_messages(embedded, "look-0") == 2  # an id stored before the raise is read afresh too
    # A mutation still keeps its outcome: its repeat returns it, another command under its id is refused.
    again = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m2"), "enqueue-m2")
    assert (again.status, again.result.stored_messages) == ("committed", 2)  # type: ignore[union-attr]
    other = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m3"), "enqueue-m2")
    assert (other.error_code, other.detail) == ("Conflict", "command id was used for a different command")
    assert_replay_equals_live(embedded, D, tmp_path)


def test_raising_is_idempotent_and_a_level_this_processor_does_not_know_is_refused(embedded: Embedded) -> None:
    assert ok(embedded, RAISE_FEATURE_LEVEL, {"level": 1}).feature_level == 1
    before = embedded.state_digest(D)
    assert ok(embedded, RAISE_FEATURE_LEVEL, {"level": 1}).feature_level == 1
    assert ok(embedded, RAISE_FEATURE_LEVEL, {"level": 0}).feature_level == 1  # never lowered
    assert embedded.state_digest(D) == before
    refused = submit_unhalted(embedded, D, RAISE_FEATURE_LEVEL, {"level": limits.FEATURE_LEVEL + 1})
    assert (refused.error_code, refused.detail) == ("Validation", f"level must be between 0 and {limits.FEATURE_LEVEL}")
    assert embedded.state_digest(D) == before


def test_keyload_run_raises_every_partition_it_serves(tmp_path: Path) -> None:
    root = tmp_path / "data"
    data = DataDir.create(root, 2)
    run = [*keyload_command("run", "--data", str(root), "--until-idle", "--gc-interval-s", "0", "--listen", "none")]
    subprocess.run(run, check=True, capture_output=True, timeout=120)
    for partition in range(data.partitions):
        store = Store(data.projection(partition), read_only=True)
        try:
            assert feature_level(store) == limits.FEATURE_LEVEL
            assert store.get(keys.FEATURE_LEVEL) == keys.u64(limits.FEATURE_LEVEL)
        finally:
            store.close()
    log = data.command_log()
    try:
        ends = [log.end_offset(partition) for partition in range(data.partitions)]
    finally:
        log.close()
    subprocess.run(run, check=True, capture_output=True, timeout=120)  # a restart appends no second raise
    log = data.command_log()
    try:
        assert [log.end_offset(partition) for partition in range(data.partitions)] == ends
    finally:
        log.close()


def test_the_level_1_reads_are_the_command_tables_reads() -> None:
    """Level 1's reads are frozen: a command made a read later would replay differently in logs
    already raised to 1, so it needs a later level."""
    # Reads from their first version, so no log holds them stored at 1: InspectDomain (it came with
    # level 2), ListQueues and ListTopics (Command v11).
    later = {"InspectDomain", "ListQueues", "ListTopics"}
    assert {kind.name for kind in COMMANDS if kind.reads} == LEVEL_1_READS | later


def test_a_partition_with_a_damaged_log_halts_alone_when_the_level_is_raised(tmp_path: Path) -> None:
    """The first start after an upgrade appends a raise to every partition still at level 0; one
    whose log is damaged halts at its damage, as it would have, and the others are raised and served.
    The directory is set up as a service before feature levels left it: access control on, level 0."""
    root = tmp_path / "data"
    embedded = Embedded(root, partitions=2)
    damaged, healthy = spread_domains(2, 2)
    try:
        for partition in range(2):
            embedded.log.append(partition, [enable_command(root, partition, 2)])
        embedded.run()
        admin = system_credential(root, ADMIN_PRINCIPAL)
        for domain in (damaged, healthy):
            for n in range(3):
                body = create_queue_body(f"q{n}")
                assert embedded.submit(domain, CREATE_QUEUE, body, credential=admin).status == "committed"
    finally:
        embedded.close()
    [segment] = sorted((root / "log" / "commands" / f"p-{partition_for(damaged, 2):04d}").glob("*.seg"))
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    segment.write_bytes(bytes(raw))
    run = keyload_command("run", "--data", str(root), "--until-idle", "--gc-interval-s", "0", "--listen", "none")
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert partition_for(damaged, 2) in recorded_halts(root), done.stderr
    store = Store(DataDir.open(root).projection(partition_for(healthy, 2)), read_only=True)
    try:
        assert feature_level(store) == limits.FEATURE_LEVEL
    finally:
        store.close()
