"""Each step of the embedded append / commit / checkpoint path, with a file system call failing.

For one step at a time (a FileLog append, a PartitionProcessor step that publishes outcomes, a
checkpoint take with its catalog publication), the step is first run with the call recorder
of tests/faults.py to list the fsync/write/replace/link/unlink calls it makes; then, for each
of those calls in turn, the step is run again over a fresh copy of the same directories with
that call failing (EIO, ENOSPC, a short write that tears a frame). Either the step completes,
or it raises a clear error, and what a restart does (a new FileLog, Store, PartitionProcessor,
Checkpoints over the same directories, the client retrying its command) then reaches the state
a run without faults reaches: the same Store.digest(), applied offset and outcomes, nothing
lost and nothing applied twice.

Two tests assert ordering and repair properties of the integrity fixes (both fail on the code
before them, 0e37100): the command segment is fsynced before an outcome of its records is
written, and a torn tail is truncated even when the torn record's payload holds frame-shaped
bytes. For the processor step, the "clear error" is a LogError or the runtime's Stalled.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keyload.errors import KeyloadError
from keyload.log.base import LogError
from keyload.log.codec import REGISTRY
from keyload.log.file_log import HEADER_BYTES, FileLog, FileLogConfig, FsyncPolicy, _encode_frame
from keyload.operations.catalog import CatalogError
from keyload.operations.checkpoints import CheckpointError, CheckpointPolicy, Checkpoints
from keyload.operations.recovery import replay
from keyload.processors.apply import FINGERPRINT_BYTES
from keyload.projections import keys
from keyload.projections.store import Store, StoreError
from keyload.service.runtime import PartitionProcessor
from keyload.storage.datadir import DataDir
from keyload.storage.object_store import ObjectStoreError

from .faults import Call, Fault, Faults, Op, inject
from .support import ACK, CREATE_QUEUE, ENQUEUE, INSPECT_QUEUE, RECEIVE, command, create_queue_body, enqueue_body

D = "acme"
QUEUE = "jobs"
CLOCK_MS = 1_700_000_000_000  # every append is stamped with this: runs are comparable byte for byte
SEGMENT_BYTES = 1_024  # a few records per segment: appends and reads cross segment rolls
BODY = b"x" * 120
COMMANDS = "log/commands"
OUTCOMES = "log/outcomes"
NO_CHECKPOINTS = CheckpointPolicy(every_records=10**9, interval_s=10**9, retain=2)
# Rows every command moves: where the projection stands in the log (and what it last applied there).
POSITION_ROWS = {keys.APPLIED_OFFSET, keys.LAST_TIME, getattr(keys, "APPLIED_RECORD", keys.APPLIED_OFFSET)}


class Deployment:
    """The embedded deployment of one partition over `root`, opened the way a restart opens it."""

    def __init__(self, root: Path, *, fsync: FsyncPolicy = FsyncPolicy.GROUP) -> None:
        self.data = DataDir.create(root, partitions=1, outcome_partitions=2)
        config = FileLogConfig(segment_bytes=SEGMENT_BYTES, fsync=fsync)
        self.log = FileLog(root / "log" / "commands", 1, config, clock_ms=lambda: CLOCK_MS)
        self.outcomes = self.data.outcome_log()
        self.store = Store(self.data.projection(0))
        self.checkpoints = self.data.checkpoints(NO_CHECKPOINTS)
        self.processor = PartitionProcessor(
            0, 1, self.log, self.store, self.outcomes, checkpoints=self.checkpoints, keyring=self.data.keyring()
        )

    def append(self, *values: bytes) -> None:
        self.log.append(0, list(values))

    def run(self) -> None:
        """Apply everything there is, as a restarted `keyload run` does."""
        while self.processor.step():
            pass
        assert self.processor.halt is None, self.processor.halt

    def close(self) -> None:
        """Close what a crash would leave behind (failures of the old instances do not matter)."""
        for resource in (self.checkpoints, self.outcomes, self.log, self.store):
            with suppress(Exception):
                resource.close()


@dataclass(frozen=True)
class State:
    """What a run ends with, for comparison with the run without faults."""

    applied_offset: int
    digest: str
    effects: str  # the projection but the rows every command moves (POSITION_ROWS, outcomes)
    outcomes: dict[str, dict[str, Any]]  # stored outcome per command id, its offset left out
    published: dict[str, set[bytes]]  # every published copy per command id

    @staticmethod
    def of(deployment: Deployment) -> State:
        store = deployment.store
        effects = hashlib.sha256()
        outcomes = {}
        for key, value in store.scan(b"", b"\xff"):
            if key[:1] == keys.OUTCOME:
                outcome = REGISTRY.decode("keyload.Outcome", value[FINGERPRINT_BYTES:])
                outcomes[outcome["command_id"]] = {k: v for k, v in outcome.items() if k != "offset"}
            elif key not in POSITION_ROWS:
                effects.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
        published: dict[str, set[bytes]] = {}
        for partition in range(deployment.outcomes.partitions):
            offset, end = deployment.outcomes.start_offset(partition), deployment.outcomes.end_offset(partition)
            while offset < end:
                for record in deployment.outcomes.read(partition, offset, 1_000):
                    command_id = REGISTRY.decode("keyload.Outcome", record.value)["command_id"]
                    published.setdefault(command_id, set()).add(record.value)
                    offset = record.offset + 1
        return State(store.applied_offset, store.digest(), effects.hexdigest(), outcomes, published)


def enqueue(n: int, reply_to: int = 0) -> bytes:
    return command(D, ENQUEUE, enqueue_body(QUEUE, f"m{n}", BODY), f"enqueue-{n}", reply_to=reply_to)


def copy_of(template: Path, into: Path) -> Path:
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(template, into)
    return into


def calls_of(faults: Faults, ops: tuple[Op, ...], path: str | None) -> dict[Op, int]:
    """How many calls of each op (touching `path`) the recorded step made."""
    return {op: len(faults.matching(op, path)) for op in ops}


def variants(op: Op) -> Iterator[tuple[str, Callable[[int], Fault]]]:
    """The ways one call of `op` fails: (name, fault at the nth matching call)."""
    yield "EIO", lambda nth: Fault(op, nth)
    if op == "write":
        yield "ENOSPC", lambda nth: Fault(op, nth, error=errno.ENOSPC)
        yield "short write in a header", lambda nth: Fault(op, nth, "partial", errno.ENOSPC, keep=HEADER_BYTES - 5)
        yield "short write in a payload", lambda nth: Fault(op, nth, "partial", errno.ENOSPC, keep=HEADER_BYTES + 60)
    if op == "fsync":
        yield "EIO from then on", lambda nth: Fault(op, nth, count=None)


def assert_clear(exc: BaseException, fault: Fault, *kinds: type[BaseException]) -> None:
    """The step's error is of an expected kind and names the I/O failure."""
    assert isinstance(exc, kinds), f"{type(exc).__name__}: {exc}"
    chain: list[BaseException] = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    texts = " / ".join(str(e) for e in chain)
    assert any(isinstance(e, OSError) and e.errno == fault.error for e in chain) or "[Errno" in texts, texts


# -- FileLog append -----------------------------------------------------------------------------


def test_append_failing_at_any_call_leaves_a_prefix_that_a_retry_completes(tmp_path: Path) -> None:
    template = tmp_path / "template"
    deployment = Deployment(template)
    create = command(D, CREATE_QUEUE, create_queue_body(QUEUE), "create", reply_to=0)
    deployment.append(create, *(enqueue(n) for n in range(6)))
    before = [r.value for r in deployment.log.read(0, 0, 1_000)]
    deployment.close()
    batch = [enqueue(n) for n in range(6, 14)]  # the step: one append of 8 records, crossing segment rolls

    def step(root: Path, *faults: Fault) -> tuple[Faults, BaseException | None]:
        deployment = Deployment(root)
        raised: BaseException | None = None
        try:
            with inject(*faults) as recorded:
                deployment.append(*batch)
        except Exception as exc:
            raised = exc
        finally:
            deployment.close()
        return recorded, raised

    reference_root = copy_of(template, tmp_path / "reference")
    recorded, raised = step(reference_root)
    assert raised is None
    counts = calls_of(recorded, ("write", "fsync"), str(reference_root / COMMANDS))
    assert counts["write"] >= 2 and counts["fsync"] >= 3, counts  # frames in two segments; a roll syncs
    reference = Deployment(reference_root)
    reference.run()
    expected = State.of(reference)
    reference.close()

    problems: list[str] = []
    cases = 0
    for op, count in counts.items():
        for nth in range(1, count + 1):
            for name, make in variants(op):
                cases += 1
                case = f"{op} #{nth} {name}"
                root = copy_of(template, tmp_path / "case")
                fault = make(nth)
                fault.path = str(root / COMMANDS)
                faults, raised = step(root, fault)
                if not faults.fired():
                    problems.append(f"{case}: the fault never fired")
                    continue
                restarted = Deployment(root)
                try:
                    restarted.log.repair(0)
                    found = [r.value for r in restarted.log.read(0, 0, 1_000)]
                    kept = len(found) - len(before)
                    if found[: len(before)] != before or found[len(before) :] != batch[:kept]:
                        problems.append(f"{case}: the log is not the old records plus a prefix of the batch")
                        continue
                    if raised is None:
                        if kept != len(batch):
                            problems.append(f"{case}: the append returned but kept {kept} of {len(batch)} records")
                            continue
                    else:
                        assert_clear(raised, fault, LogError)
                        restarted.append(*batch)  # the client did not learn the outcome: it submits again
                    restarted.run()
                    state = State.of(restarted)
                finally:
                    restarted.close()
                if raised is None or kept == 0:
                    same = (state.applied_offset, state.digest) == (expected.applied_offset, expected.digest)
                else:  # copies of the kept records are in the log too: they had no effect
                    same = state.applied_offset == expected.applied_offset + kept
                same = same and (state.effects, state.outcomes) == (expected.effects, expected.outcomes)
                if not same:
                    problems.append(f"{case}: the state differs from a run without faults (kept {kept})")
    assert problems == [], f"{len(problems)} of {cases} cases:\n" + "\n".join(problems)


# -- PartitionProcessor step ----------------------------------------------------------------------


def processor_template(root: Path) -> None:
    """A projection with 20 enqueues and a receive of 6 applied, and 17 records still to apply:
    acks of the received tokens, enqueues and an inspect, their outcomes going to 2 reply partitions."""
    deployment = Deployment(root)
    deployment.append(command(D, CREATE_QUEUE, create_queue_body(QUEUE), "create", reply_to=0))
    deployment.append(*(enqueue(n) for n in range(20)))
    receive = {"queue": QUEUE, "max_messages": 6, "max_bytes": None, "lease_ms": None, "wait_ms": None}
    deployment.append(command(D, RECEIVE, receive, "receive", reply_to=1))
    deployment.run()
    stored = deployment.store.get(keys.outcome(D, "receive"))
    assert stored is not None
    deliveries = REGISTRY.decode("keyload.Outcome", stored[FINGERPRINT_BYTES:])["result"][1]["deliveries"]
    tokens = [delivery["token"] for delivery in deliveries]
    assert len(tokens) == 6
    deployment.append(*(command(D, ACK, {"token": t}, f"ack-{i}", reply_to=i % 2) for i, t in enumerate(tokens)))
    deployment.append(*(enqueue(n, reply_to=n % 2) for n in range(20, 30)))
    deployment.append(command(D, INSPECT_QUEUE, {"queue": QUEUE}, "inspect", reply_to=1))
    deployment.close()


def test_processor_step_failing_at_any_call_replays_to_the_same_state(tmp_path: Path) -> None:
    template = tmp_path / "template"
    processor_template(template)

    def step(root: Path, *faults: Fault) -> tuple[Faults, int | None, BaseException | None]:
        deployment = Deployment(root)
        applied: int | None = None
        raised: BaseException | None = None
        try:
            with inject(*faults) as recorded:
                applied = deployment.processor.step()
        except Exception as exc:
            raised = exc
        finally:
            deployment.close()
        return recorded, applied, raised

    reference_root = copy_of(template, tmp_path / "reference")
    recorded, applied, raised = step(reference_root)
    assert raised is None and applied == 17
    counts = calls_of(recorded, ("write", "fsync"), str(reference_root))
    assert len(recorded.matching("write", OUTCOMES)) == counts["write"] == 2, recorded.calls  # one per reply partition
    assert len(recorded.matching("fsync", COMMANDS)) == counts["fsync"] >= 1, recorded.calls  # sync_through
    reference = Deployment(reference_root)
    reference.run()
    expected = State.of(reference)
    reference.close()
    assert len(expected.published) == 17 + 22

    problems: list[str] = []
    cases = 0
    for op, count in counts.items():
        for nth in range(1, count + 1):
            for name, make in variants(op):
                cases += 1
                case = f"{op} #{nth} {name}"
                root = copy_of(template, tmp_path / "case")
                fault = make(nth)
                fault.path = str(root)
                faults, applied, raised = step(root, fault)
                if not faults.fired():
                    problems.append(f"{case}: the fault never fired")
                    continue
                if raised is not None:
                    assert_clear(raised, fault, KeyloadError, LogError)  # LogError, or the runtime's Stalled
                elif applied != 17:
                    problems.append(f"{case}: the step returned {applied}, not 17")
                restarted = Deployment(root)
                try:
                    restarted.run()
                    state = State.of(restarted)
                finally:
                    restarted.close()
                if (state.applied_offset, state.digest, state.outcomes) != (
                    expected.applied_offset,
                    expected.digest,
                    expected.outcomes,
                ):
                    problems.append(f"{case}: the projection differs from a run without faults")
                if state.published != expected.published:
                    missing = sorted(set(expected.published) - set(state.published))
                    differing = sorted(
                        c
                        for c in expected.published
                        if c in state.published and state.published[c] != expected.published[c]
                    )
                    problems.append(f"{case}: published outcomes missing {missing}, differing {differing}")
    assert problems == [], f"{len(problems)} of {cases} cases:\n" + "\n".join(problems)


# -- checkpoint take and catalog publication --------------------------------------------------------


def checkpoint_template(root: Path) -> list[int]:
    """A projection with two published checkpoints behind it (retain 2: the next take retires one)."""
    deployment = Deployment(root)
    deployment.append(command(D, CREATE_QUEUE, create_queue_body(QUEUE), "create", reply_to=0))
    offsets = []
    for round_ in range(3):
        deployment.append(*(enqueue(n) for n in range(round_ * 10, round_ * 10 + 10)))
        deployment.run()
        if round_ < 2:
            entry = deployment.checkpoints.take(deployment.store, 0)
            offsets.append(entry.offset)
    deployment.close()
    return offsets


def restorable(data: DataDir, checkpoints: Checkpoints, scratch: Path, live: tuple[int, str]) -> list[str]:
    """Problems with the recovery set: every published entry must restore to its manifest's digest, and a
    replay from the newest must reach the live projection's offset and digest (a drill from it)."""
    problems = []
    entries = checkpoints.entries(0)
    for entry in entries:
        into = scratch / f"restore-{entry.offset}"
        shutil.rmtree(into, ignore_errors=True)
        try:
            checkpoints.restore(entry, into)
            store = Store(into)
            try:
                digest = store.digest()
            finally:
                store.close()
            if digest != entry.manifest.digest:
                problems.append(f"checkpoint {entry.offset} restores to another digest")
            if entry is entries[-1]:
                replayed = replay(data, 0, scratch / f"replay-{entry.offset}", entry.offset + 1, progress=False)
                if (replayed.applied_offset, replayed.digest) != live:
                    problems.append(f"a replay from checkpoint {entry.offset} does not reach the live state")
        except (CheckpointError, StoreError) as exc:
            problems.append(f"checkpoint {entry.offset} cannot be restored: {exc}")
        finally:
            shutil.rmtree(into, ignore_errors=True)
            shutil.rmtree(scratch / f"replay-{entry.offset}", ignore_errors=True)
    return problems


def role_of(call: Call, root: str) -> str:
    """What a call of a checkpoint take is for, the take's random names left out."""
    path = (call.path or "")[len(root) :]
    if path.startswith("/catalog"):
        return "catalog directory" if call.op == "fsync" and path.endswith("p-0000") else "catalog entry"
    if path.startswith("/scratch"):
        return "scratch"
    return "object upload" if "/.tmp-" in path else "object version"


def every_call(calls: list[Call], root: str) -> list[tuple[Op, int, str]]:
    """(op, nth, role) of every recorded call: the cases to run."""
    seen: Counter[Op] = Counter()
    chosen = []
    for call in calls:
        seen[call.op] += 1
        chosen.append((call.op, seen[call.op], role_of(call, root)))
    return chosen


@pytest.mark.slow  # about 50 cases of a second each: a restore and a replay per case
def test_checkpoint_failing_at_any_call_keeps_the_recovery_set_usable(tmp_path: Path) -> None:
    template = tmp_path / "template"
    earlier = checkpoint_template(template)

    def step(root: Path, *faults: Fault) -> tuple[Faults, BaseException | None]:
        deployment = Deployment(root)
        raised: BaseException | None = None
        try:
            with inject(*faults) as recorded:
                deployment.checkpoints.take(deployment.store, 0)
        except Exception as exc:
            raised = exc
        finally:
            deployment.close()
        return recorded, raised

    reference_root = copy_of(template, tmp_path / "reference")
    recorded, raised = step(reference_root)
    assert raised is None
    calls = [c for c in recorded.calls if c.touches(str(reference_root))]
    assert {"fsync", "link", "replace", "unlink"} <= {c.op for c in calls}, calls  # objects, catalog, retirement
    chosen = every_call(calls, str(reference_root))
    reference = Deployment(reference_root)
    live = (reference.store.applied_offset, reference.store.digest())
    expected_offsets = [e.offset for e in reference.checkpoints.entries(0)]
    reference.close()
    assert expected_offsets == [earlier[1], live[0]]

    problems: list[str] = []
    cases = 0
    for op, nth, role in chosen:
        cases += 1
        case = f"{op} #{nth} ({role}) EIO"
        root = copy_of(template, tmp_path / "case")
        fault = Fault(op, nth, path=str(tmp_path / "case"))
        faults, raised = step(root, fault)
        if not faults.fired():
            problems.append(f"{case}: the fault never fired")
            continue
        if raised is not None:
            assert_clear(raised, fault, CheckpointError, CatalogError, ObjectStoreError, StoreError, OSError)
        restarted = Deployment(root)
        try:
            if (restarted.store.applied_offset, restarted.store.digest()) != live:
                problems.append(f"{case}: the live projection changed")
            # What the runtime does next: a later take (which retires beyond the policy), an orphan sweep.
            restarted.checkpoints.take(restarted.store, 0)
            restarted.checkpoints.sweep_orphans(0)
            offsets = [e.offset for e in restarted.checkpoints.entries(0)]
            if offsets != expected_offsets:
                problems.append(f"{case}: the recovery set is {offsets}, not {expected_offsets}")
            problems.extend(
                f"{case}: {p}" for p in restorable(restarted.data, restarted.checkpoints, tmp_path / "scratch", live)
            )
        finally:
            restarted.close()
    assert problems == [], f"{len(problems)} of {cases} cases:\n" + "\n".join(problems)


# -- ordering and repair properties (the integrity issue's fixes) ----------------------------------------


def test_command_segment_is_fsynced_before_an_outcome_of_its_records_is_written(tmp_path: Path) -> None:
    """An appender has written a record but not yet fsynced it (stalled in its fsync); a processor that
    reads it must make it durable before it publishes the outcome, or a power loss could leave an outcome
    whose command the log no longer has."""
    root = tmp_path / "data"
    service = Deployment(root)
    service.append(command(D, CREATE_QUEUE, create_queue_body(QUEUE), "create", reply_to=0))
    service.run()
    appender_log = FileLog(root / "log" / "commands", 1, FileLogConfig(segment_bytes=SEGMENT_BYTES))
    stalled = Fault("fsync", path=COMMANDS, action="stall", where=lambda call: call.thread == "appender")
    appender = threading.Thread(target=appender_log.append, args=(0, [enqueue(1)]), name="appender")
    try:
        with inject(stalled) as faults:
            appender.start()
            assert stalled.reached.wait(10), "the appender never reached its fsync"
            applied = service.processor.step()
            stalled.release.set()
            appender.join(10)
            if not applied:  # a processor that waits for durability applies the record only now
                applied = service.processor.step()
        assert applied == 1
    finally:
        stalled.release.set()
        appender.join(10)
        appender_log.close()
        service.close()
    first_outcome = faults.index_of("write", OUTCOMES)
    assert first_outcome is not None, faults.calls
    synced = [c.seq for c in faults.matching("fsync", COMMANDS) if c.seq < first_outcome and c.result == "ok"]
    order = [(c.seq, c.op, c.thread, (c.path or "").rsplit("/", 3)[-3:]) for c in faults.calls]
    assert synced, f"the outcome was written (call {first_outcome}) before any fsync of the command segment: {order}"


def test_torn_append_whose_payload_holds_a_frame_is_repaired(tmp_path: Path) -> None:
    """A write torn inside a record whose payload embeds a valid frame for the next offset is still a torn
    tail: repair truncates it and the next append reuses the offset, rather than reporting corruption."""
    directory = tmp_path / "log"
    log = FileLog(directory, 1, FileLogConfig(), clock_ms=lambda: CLOCK_MS)
    log.append(0, [b"first"])
    payload = b"A" * 10 + _encode_frame(2, CLOCK_MS, b"frame-shaped bytes") + b"B" * 200
    keep = HEADER_BYTES + 10 + len(_encode_frame(2, CLOCK_MS, b"frame-shaped bytes")) + 50
    with pytest.raises(LogError), inject(Fault("write", action="partial", error=errno.ENOSPC, keep=keep)):
        log.append(0, [payload])
    log.close()
    restarted = FileLog(directory, 1, FileLogConfig(), clock_ms=lambda: CLOCK_MS)
    try:
        assert restarted.repair(0) == 1
        [appended] = restarted.append(0, [b"second"])
        assert appended.offset == 1
        assert [r.value for r in restarted.read(0, 0, 10)] == [b"first", b"second"]
    finally:
        restarted.close()


# -- the helper itself ------------------------------------------------------------------------------


def test_faults_count_filter_fail_and_record_in_order(tmp_path: Path) -> None:
    target = tmp_path / "file"
    other = tmp_path / "other"
    fault = Fault("fsync", nth=2, path="file", error=errno.ENOSPC)
    with inject(fault) as faults, target.open("wb") as a, other.open("wb") as b:
        for handle in (a, b, a):
            try:
                os.fsync(handle.fileno())
            except OSError as exc:
                assert exc.errno == errno.ENOSPC and handle is a
    assert [(Path(c.path or "").name, c.result) for c in faults.matching("fsync")] == [
        ("file", "ok"),
        ("other", "ok"),
        ("file", "failed"),
    ]
    assert fault.seen == 2 and fault.hits == 1 and faults.fired()
