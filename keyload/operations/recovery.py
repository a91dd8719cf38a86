"""Replay and recovery drills: rebuild a partition from the log and compare digests."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from keyload.errors import KeyloadError
from keyload.operations.catalog import NotPublished
from keyload.operations.checkpoints import CheckpointDamaged, CheckpointError, recovery_session
from keyload.projections.store import Store, StoreError
from keyload.service.embedded import serving
from keyload.service.halts import clear_halt
from keyload.service.runtime import PartitionProcessor
from keyload.storage.datadir import DataDir
from keyload.storage.object_store import ObjectStoreUnavailable


class RecoveryError(KeyloadError):
    """A replay or drill cannot run as asked (bad offsets, missing checkpoint, busy target)."""


class ReplayDiverged(RecoveryError):
    """The log does not hold the record the replay's start state applied last: no replay from there
    can reproduce what the log now says."""


class CheckpointUnusable(RecoveryError):
    """The checkpoint a replay starts from cannot be fetched or verified; `damaged`: its objects are
    missing or not the published bytes, so it never will be."""

    def __init__(self, reason: str, hint: str, damaged: bool) -> None:
        super().__init__(f"{reason}; {hint}")
        self.reason = reason
        self.damaged = damaged


@dataclass(frozen=True, slots=True)
class Replayed:
    partition: int
    applied_offset: int
    digest: str
    records: int


@dataclass(frozen=True, slots=True)
class DrillReport:
    partition: int
    live_offset: int
    live_digest: str
    replay_offset: int
    replay_digest: str
    start: str  # "offset 0" or "checkpoint at offset N"

    @property
    def passed(self) -> bool:
        return self.live_offset == self.replay_offset and self.live_digest == self.replay_digest


def replay(
    data: DataDir,
    partition: int,
    into: Path,
    from_offset: int = 0,
    to_offset: int | None = None,
    progress: bool = True,
) -> Replayed:
    """Rebuild `partition` in the empty directory `into` from `from_offset` through `to_offset`.

    From offset 0 the projection starts empty; from offset N > 0 it starts from
    the published checkpoint taken at offset N - 1 (fetched from the object store
    and verified, pinned while that runs). No outcome is published and no
    checkpoint is taken: a replay only rebuilds state.
    """
    data.check_partition(partition)
    if into.exists() and any(into.iterdir()):
        raise RecoveryError(f"{into} is not empty")
    if from_offset < 0:
        raise RecoveryError("--from-offset must be >= 0")
    log = data.command_log()
    try:
        end = log.end_offset(partition) - 1
        target = end if to_offset is None else to_offset
        if target > end:
            raise RecoveryError(f"partition {partition} ends at offset {end}, cannot replay to {target}")
        if from_offset > target + 1:
            raise RecoveryError(f"--from-offset {from_offset} is past the target offset {target}")
        start = log.start_offset(partition)
        if from_offset < start:
            raise RecoveryError(
                f"partition {partition}'s log was truncated before offset {start}: "
                "replay from a checkpoint at or past it"
            )
        store = _restored(data, partition, from_offset - 1, into, start) if from_offset > 0 else Store(into)
        try:
            processor = PartitionProcessor(partition, data.partitions, log, store, keyring=data.keyring())
            if processor.halt is not None:  # the log does not hold the record the start state applied last
                raise ReplayDiverged(f"replay cannot start at offset {from_offset}: {processor.halt.reason}")
            total = target - processor.applied_offset
            with tqdm(total=total, desc=f"replay p{partition}", unit="cmd", disable=not progress) as bar:
                while processor.applied_offset < target:
                    applied = processor.step(stop_after=target)
                    if processor.halt is not None:
                        raise RecoveryError(f"replay halted at offset {processor.halt.offset}: {processor.halt.reason}")
                    if applied == 0:
                        raise RecoveryError(f"log of partition {partition} ended before offset {target}")
                    bar.update(applied)
            return Replayed(partition, store.applied_offset, store.digest(), total)
        finally:
            store.close()
    finally:
        log.close()


def _restored(data: DataDir, partition: int, offset: int, into: Path, log_start: int) -> Store:
    """The published checkpoint at `offset`, restored into `into` and opened.

    It is pinned meanwhile, so that the running service's retention cannot delete
    its objects halfway through the fetch. `log_start` is the log's first offset:
    a refusal names only the starts the log still allows.
    """
    try:
        opened = data.checkpoints()
    except ObjectStoreUnavailable as exc:  # the store does not answer: it may later
        hint = "replay can start later from the checkpoint" + (", or at 0" if log_start == 0 else "")
        raise CheckpointUnusable(str(exc), hint, False) from None
    with opened as checkpoints:
        try:
            entry = checkpoints.find(partition, offset)
            with checkpoints.pinned(entry, recovery_session("replay", partition)):
                checkpoints.restore(entry, into)
                return Store(into)
        except (CheckpointError, NotPublished) as exc:
            starts = [e.offset + 1 for e in checkpoints.entries(partition) if e.offset + 1 >= log_start]
            have = ", ".join(map(str, starts)) or "none"
            at_zero = "at 0 or " if log_start == 0 else f"(the log was truncated before offset {log_start}) "
            hint = f"replay can start {at_zero}one past a checkpoint ({have})"
            raise CheckpointUnusable(str(exc), hint, isinstance(exc, CheckpointDamaged)) from None


def drill(
    data: DataDir,
    partition: int,
    scratch: Path,
    from_checkpoint: int | None = None,
    progress: bool = True,
) -> DrillReport:
    """Rebuild the partition in `scratch` to the live projection's offset and compare digests.

    The live projection is opened read-only, so a drill runs beside `keyload run`.
    `from_checkpoint` starts from the checkpoint at that offset instead of offset 0.
    """
    data.check_partition(partition)
    try:
        live = Store(data.projection(partition), read_only=True)
    except StoreError as exc:
        raise RecoveryError(f"partition {partition} has no live projection yet: {exc}") from None
    try:
        live_offset, live_digest = live.applied_offset, live.digest()
    finally:
        live.close()
    if live_offset < 0:
        raise RecoveryError(f"partition {partition} has applied nothing yet")
    start_offset = 0 if from_checkpoint is None else from_checkpoint + 1
    if start_offset > live_offset + 1:
        raise RecoveryError(f"checkpoint {from_checkpoint} is newer than the live projection ({live_offset})")
    replayed = replay(data, partition, scratch, start_offset, live_offset, progress)
    start = "offset 0" if from_checkpoint is None else f"checkpoint at offset {from_checkpoint}"
    return DrillReport(partition, live_offset, live_digest, replayed.applied_offset, replayed.digest, start)


@dataclass(frozen=True, slots=True)
class Restored:
    partition: int
    start: str  # "offset 0" or "checkpoint at offset N"
    applied_offset: int
    digest: str
    retired: tuple[int, ...]  # offsets of checkpoints the log cannot reproduce, or damaged: now retired
    kept_aside: Path | None  # where the replaced projection was moved
    passed_over: tuple[str, ...] = ()  # why each newer checkpoint could not be used (retired or not)


def restore(data: DataDir, partition: int, scratch: Path, progress: bool = True) -> Restored:
    """Rebuild the partition's projection from the newest checkpoint the log still agrees with, then replay.

    The way out of `RecoveryRequired` after the log lost records the projection
    had applied (a truncated tail, a broker that lost acknowledged records): the
    newest published checkpoint at or below the log's end whose last applied
    record the log still holds, and whose stored bytes can be fetched and
    verified, is restored and the log replayed on it to its end (from offset 0
    when none qualifies). Checkpoints past the log's end, disagreeing with it or
    damaged (objects missing or not the published bytes) are retired: no replay
    can use them; one the object store does not answer for now is passed over and
    kept. The old projection is moved aside, not deleted. Run it while `keyload
    run` is stopped.
    """
    data.check_partition(partition)
    with serving(data.root):  # refused while `keyload run` serves the directory
        return _restore(data, partition, scratch, progress)


def _projection_holds_anything(data: DataDir, partition: int) -> bool:
    """Whether the partition's projection applied a record, or cannot be read to tell: then a log
    that holds none lost them all (its segments deleted), and the restore is the empty projection
    a replay of nothing gives, every checkpoint retired."""
    path = data.projection(partition)
    if not path.exists():
        return False
    try:
        live = Store(path, read_only=True)
    except StoreError:
        return True
    try:
        return live.applied_offset >= 0
    finally:
        live.close()


def _restore(data: DataDir, partition: int, scratch: Path, progress: bool) -> Restored:
    log = data.command_log()
    try:
        end = log.end_offset(partition)
    finally:
        log.close()
    if end == 0 and not _projection_holds_anything(data, partition):
        raise RecoveryError(f"partition {partition}'s log holds no record yet: there is nothing to restore")
    catalog = data.catalog()  # not the object store: a restore from offset 0 needs none
    try:
        candidates = sorted(catalog.entries(partition), key=lambda entry: entry.offset, reverse=True)
    finally:
        catalog.close()
    retired: list[int] = [entry.offset for entry in candidates if entry.offset >= end]
    passed_over: list[str] = []
    rebuilt: Replayed | None = None
    start = "offset 0"
    try:
        for entry in (entry for entry in candidates if entry.offset < end):
            attempt = scratch / f"from-{entry.offset}"
            try:
                rebuilt = replay(data, partition, attempt, entry.offset + 1, progress=progress)
            except ReplayDiverged:
                retired.append(entry.offset)  # its applied record is not the log's: the log diverged before it
                continue
            except CheckpointUnusable as exc:
                passed_over.append(exc.reason)
                if exc.damaged:
                    retired.append(entry.offset)
                continue
            scratch, start = attempt, f"checkpoint at offset {entry.offset}"
            break
        else:
            scratch = scratch / "from-0"
            rebuilt = replay(data, partition, scratch, 0, progress=progress)
    except RecoveryError as exc:
        if not passed_over:
            raise
        raise RecoveryError(f"{exc} (checkpoints passed over: {'; '.join(passed_over)})") from None
    catalog = data.catalog()
    try:
        for offset in retired:
            catalog.retire(partition, offset)
    finally:
        catalog.close()
    live = data.projection(partition)
    aside = None
    if live.exists():
        aside = live.with_name(f"{live.name}.replaced-{os.getpid()}-{time.time_ns()}")
        live.rename(aside)
    scratch.rename(live)
    clear_halt(data.root, partition)
    return Restored(
        partition, start, rebuilt.applied_offset, rebuilt.digest, tuple(sorted(retired)), aside, tuple(passed_over)
    )
