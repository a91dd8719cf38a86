"""Halted partitions: why a partition stopped, as the service reports it to operators.

A partition halts on a real integrity failure (`Corruption`, `RecoveryRequired`)
and nothing of the failing group is committed; the other partitions keep
serving. `keyload run` records each halt in `<data>/halts/p-NNNN.json` so that
`keyload status`, in another process, can say which partition is down, at which
offset and why; a partition that is served again at start-up has its file removed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

HALTS_DIR = "halts"
FILE_FORMAT = "p-{:04d}.json"


@dataclass(frozen=True, slots=True)
class Halt:
    """A partition that stopped at `offset` (the first record not applied) for `reason`."""

    partition: int
    offset: int
    reason: str

    @property
    def where(self) -> str:
        """`at offset X: reason`, as the HTTP API reports it."""
        return f"at offset {self.offset}: {self.reason}"


def _path(root: Path, partition: int) -> Path:
    return root / HALTS_DIR / FILE_FORMAT.format(partition)


def record_halt(root: str | os.PathLike[str], halt: Halt) -> None:
    """Write the halt's file atomically (a reader never sees half of it). A file that cannot be
    written (a full disk) is reported, not raised: the halt itself is already in effect."""
    path = _path(Path(root), halt.partition)
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(halt)) + "\n", "utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        logging.getLogger("keyload.service.halts").error(
            "cannot record the halt of partition %d: %s", halt.partition, exc
        )


def clear_halt(root: str | os.PathLike[str], partition: int) -> None:
    _path(Path(root), partition).unlink(missing_ok=True)


def recorded_halts(root: str | os.PathLike[str]) -> dict[int, Halt]:
    """The halts `keyload run` recorded, by partition (unreadable files are skipped)."""
    directory = Path(root) / HALTS_DIR
    halts: dict[int, Halt] = {}
    for path in sorted(directory.glob("p-*.json")) if directory.is_dir() else ():
        try:
            halt = Halt(**json.loads(path.read_text("utf-8")))
        except (OSError, ValueError, TypeError):
            continue
        halts[halt.partition] = halt
    return halts
