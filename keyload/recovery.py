"""Replay and recovery drills: rebuild a partition from the log and compare digests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from keyload.catalog import NotPublished
from keyload.checkpoints import CheckpointError, recovery_session
from keyload.datadir import DataDir
from keyload.projections.store import Store, StoreError
from keyload.runtime import PartitionProcessor


class RecoveryError(Exception):
    """A replay or drill cannot run as asked (bad offsets, missing checkpoint, busy target)."""


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
        store = _restored(data, partition, from_offset - 1, into) if from_offset > 0 else Store(into)
        try:
            processor = PartitionProcessor(partition, data.partitions, log, store, keyring=data.keyring())
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


def _restored(data: DataDir, partition: int, offset: int, into: Path) -> Store:
    """The published checkpoint at `offset`, restored into `into` and opened.

    It is pinned meanwhile, so that the running service's retention cannot delete
    its objects halfway through the fetch.
    """
    with data.checkpoints() as checkpoints:
        try:
            entry = checkpoints.find(partition, offset)
            with checkpoints.pinned(entry, recovery_session("replay", partition)):
                checkpoints.restore(entry, into)
                return Store(into)
        except (CheckpointError, NotPublished) as exc:
            have = ", ".join(str(e.offset + 1) for e in checkpoints.entries(partition)) or "none"
            raise RecoveryError(f"{exc}; replay can start at 0 or one past a checkpoint ({have})") from None


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
