"""The replay contract: a command log recorded by keyload 0.2.0 replays to the same state, byte for byte.

`tests/fixtures/workload-v0.2.0/` is a data directory's command log (4 partitions,
the segment files exactly as the embedded file log wrote them), its keyload.json and
its keyring (test-only keys), recorded by `tests/fixtures/record_workload.py` with
the code of 0.2.0 — before the package restructure — through the real processor:
every command kind of the Command union, accepted and rejected, with timers, waiters,
dead letters, payload reservations, retention, key rotation, records written under
older Command schema versions and poison records. `digests.json` holds, per
partition, the state digest (SHA-256 over every key and value of the projection)
and the applied offset a full replay reached then, and the SHA-256 of each segment.

THIS FIXTURE IS A CONTRACT. Every deployment's log is replayed by whatever code runs
it next (restore, drill, a new processor), and a replay must rebuild the state the
log's writers saw. So replaying this log with the current code must reach exactly
the recorded digests. If a change makes this test fail, the change alters what
existing logs replay to: either it is a bug (moving modules must never do it), or it
is a deliberate change of behaviour, which needs a documented migration (a new
processor version and its note in docs/ARCHITECTURE.md §7, as 0.1.0 → 0.2.0 did for
out-of-range integers) and a new fixture recorded next to this one with the new
code. Never edit digests.json or the segments to make the test pass.

A schema version released after 0.2.0 (a branch appended to the Command and Outcome unions, a new
top-level type) changes the bytes every value is written under, the schema header first, without
changing a thing it says: a projection migrates such values on open (docs/ARCHITECTURE.md §4). So
the digest compared is the replayed projection's with every value written as 0.2.0 wrote it: under
the schema versions current then (`RELEASED_WITH`), the schema-set mark theirs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from keyload.log.codec import HEADER_BYTES, REGISTRY, TOP_LEVEL, CodecError, Released
from keyload.operations.recovery import replay
from keyload.projections import keys
from keyload.projections.store import Store
from keyload.storage.datadir import DataDir

FIXTURE = Path(__file__).parent / "fixtures" / "workload-v0.2.0"
PARTITIONS = 4
# The command kinds the fixture's records hold: every branch of the Command union in 0.2.0.
RECORDED_KINDS = 49
# Records that decode as no command at all (poison: bytes that are no Avro value, a truncated
# body). Two more poison records decode: an unusable command id, and a record stamped past the
# log-time range.
UNDECODABLE_RECORDS = 2


# The schema version 0.2.0 wrote each top-level type under, where a later release added one (the
# others are unchanged since), and the types 0.2.0 had: every top-level type but the later ones.
RELEASED_WITH = {
    "keyload.Command": 5,
    "keyload.Outcome": 5,
    "keyload.QueueRecord": 2,
    "keyload.TopicRecord": 1,
    "keyload.GroupRecord": 2,
}
TYPES_OF_0_2_0 = tuple(
    name for name in TOP_LEVEL if name not in ("keyload.PrincipalRecord", "keyload.Signed", "keyload.DomainRecord")
)


def released_with(name: str) -> Released:
    versions = REGISTRY.released(name)
    return versions[RELEASED_WITH.get(name, len(versions)) - 1]


def schema_set_of_0_2_0() -> bytes:
    """The schema-set mark (projections/migration.py) of the schemas 0.2.0 wrote under."""
    marker = hashlib.sha256()
    for name in TYPES_OF_0_2_0:
        marker.update(name.encode("ascii") + b"\x00" + released_with(name).header)
    return marker.digest()


def as_written_by_0_2_0(key: bytes, value: bytes) -> bytes:
    """`value` of the row `key` with its record written under the version 0.2.0 wrote it under."""
    if key == keys.SCHEMA_SET:
        return schema_set_of_0_2_0()
    family = keys.FAMILY_VALUES[key[:1]]
    if family is None or len(value) == family.skip:
        return value
    released = released_with(family.name)
    record = value[family.skip :]
    if record[:HEADER_BYTES] == released.header:
        return value
    encoded = REGISTRY.encode_body_under(released.schema, REGISTRY.decode(family.name, record))
    return value[: family.skip] + released.header + encoded


def digest_as_written_by_0_2_0(projection: Path) -> str:
    """Store.digest's SHA-256, over the projection's rows as 0.2.0 wrote them."""
    digest = hashlib.sha256()
    store = Store(projection, read_only=True)
    try:
        for key, value in store.scan(b"\x00", b"\xff"):
            for part in (key, as_written_by_0_2_0(key, value)):
                digest.update(len(part).to_bytes(4, "big") + part)
    finally:
        store.close()
    return digest.hexdigest()


def recorded() -> dict[str, Any]:
    digests: dict[str, Any] = json.loads((FIXTURE / "digests.json").read_text("utf-8"))
    return digests


def fixture_copy(tmp_path: Path) -> DataDir:
    """The fixture as a data directory of its own: the test never writes into the checked-in files."""
    root = tmp_path / "data"
    shutil.copytree(FIXTURE, root)
    return DataDir.open(root)


def test_the_fixture_is_the_recorded_one() -> None:
    expected = recorded()
    assert expected["recorded_with"]["keyload"] == "0.2.0"
    assert sorted(expected["partitions"]) == [str(p) for p in range(PARTITIONS)]
    for partition, entry in expected["partitions"].items():
        folder = FIXTURE / "log" / "commands" / f"p-{int(partition):04d}"
        found = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.glob("*.seg"))}
        assert found == entry["segments"], f"the segments of partition {partition} are not the recorded ones"
        assert len(found) > 1, "every partition's log spans several segments"


def test_every_partition_replays_to_its_recorded_digest(tmp_path: Path) -> None:
    data = fixture_copy(tmp_path)
    assert data.partitions == PARTITIONS
    log = data.command_log()
    try:
        ends = [log.end_offset(partition) for partition in range(PARTITIONS)]
    finally:
        log.close()
    for partition in range(PARTITIONS):
        expected = recorded()["partitions"][str(partition)]
        # `keyload replay`'s path: from offset 0 into a fresh projection, to the log's end.
        # A halt (Corruption, RecoveryRequired, a processor bug) raises RecoveryError.
        projection = tmp_path / f"replay-{partition}"
        replayed = replay(data, partition, projection, progress=False)
        assert replayed.applied_offset == ends[partition] - 1, "the replay stopped before the log's end"
        assert replayed.records == ends[partition]
        digest = digest_as_written_by_0_2_0(projection)
        assert (replayed.applied_offset, digest) == (expected["applied_offset"], expected["digest"]), (
            f"partition {partition} replays to another state than keyload 0.2.0 recorded: "
            "see this module's docstring before changing anything"
        )


def test_the_fixture_covers_every_recorded_command_kind(tmp_path: Path) -> None:
    data = fixture_copy(tmp_path)
    kinds: dict[str, int] = {}
    undecodable = 0
    log = data.command_log()
    try:
        for partition in range(PARTITIONS):
            offset, end = 0, log.end_offset(partition)
            while offset < end:
                records = log.read(partition, offset, 1_000)
                assert records, f"partition {partition} ends before offset {end}"
                for record in records:
                    try:
                        kind, _ = REGISTRY.decode("keyload.Command", record.value)["body"]
                    except CodecError:
                        undecodable += 1
                        continue
                    kinds[kind] = kinds.get(kind, 0) + 1
                offset = records[-1].offset + 1
    finally:
        log.close()
    assert len(kinds) == RECORDED_KINDS, sorted(kinds)
    assert kinds == recorded()["command_kinds"]
    assert undecodable == UNDECODABLE_RECORDS == recorded()["undecodable_records"]
