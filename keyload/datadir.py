"""The embedded deployment's data directory: one place for logs, projections and checkpoints.

DATA/keyload.json                  partition counts (fixed at creation)
DATA/keyring.json                  key material by id (keyload/keyring.py)
DATA/log/commands/p-NNNN/          command log (file log segments)
DATA/log/outcomes/p-NNNN/          outcome stream
DATA/projections/p-NNNN/           RocksDB projection of a partition
DATA/checkpoints/p-NNNN/OFFSET/    checkpoint: db/ + manifest.json
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from keyload import keyring
from keyload.log.file_log import FileLog, FileLogConfig, FsyncPolicy
from keyload.projections.store import MANIFEST, Manifest, StoreError

DEFAULT_PARTITIONS = 4
DEFAULT_OUTCOME_PARTITIONS = 8
MAX_PARTITIONS = 1024
FORMAT = 1
CONFIG = "keyload.json"


class DataDirError(Exception):
    """The data directory is missing, unreadable or of another format."""


@dataclass(frozen=True, slots=True)
class DataDir:
    root: Path
    partitions: int
    outcome_partitions: int

    @staticmethod
    def open(root: str | os.PathLike[str]) -> DataDir:
        path = Path(root)
        try:
            raw = json.loads((path / CONFIG).read_text("utf-8"))
        except FileNotFoundError:
            raise DataDirError(
                f"{path} is not a keyload data directory (no {CONFIG}); run `keyload run --data {path}` first"
            ) from None
        except (OSError, ValueError) as exc:
            raise DataDirError(f"cannot read {path / CONFIG}: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            found = raw.get("format") if isinstance(raw, dict) else None
            raise DataDirError(f"{path / CONFIG} is not data format {FORMAT} (found {found!r})")
        return DataDir(path, _count(raw, "partitions", path), _count(raw, "outcome_partitions", path))

    @staticmethod
    def create(
        root: str | os.PathLike[str],
        partitions: int = DEFAULT_PARTITIONS,
        outcome_partitions: int = DEFAULT_OUTCOME_PARTITIONS,
    ) -> DataDir:
        """Open `root`, creating it with the given partition counts if it is new."""
        path = Path(root)
        if (path / CONFIG).exists():
            return DataDir.open(path)
        for count in (partitions, outcome_partitions):
            if not 1 <= count <= MAX_PARTITIONS:
                raise DataDirError(f"partition counts must be 1..{MAX_PARTITIONS}")
        path.mkdir(parents=True, exist_ok=True)
        config = {
            "format": FORMAT,
            "partitions": partitions,
            "outcome_partitions": outcome_partitions,
        }
        temporary = path / (CONFIG + ".tmp")
        temporary.write_text(json.dumps(config, indent=2) + "\n", "utf-8")
        keyring.create(path)
        os.replace(temporary, path / CONFIG)
        return DataDir.open(path)

    def command_log(self, config: FileLogConfig | None = None) -> FileLog:
        return FileLog(self.root / "log" / "commands", self.partitions, config or FileLogConfig())

    def outcome_log(self) -> FileLog:
        # Outcomes are derived data: replaying the command log reproduces every
        # one of them, so the stream is not fsynced.
        return FileLog(
            self.root / "log" / "outcomes",
            self.outcome_partitions,
            FileLogConfig(fsync=FsyncPolicy.NONE),
        )

    def keyring(self) -> dict[str, bytes]:
        return keyring.load(self.root)

    def projection(self, partition: int) -> Path:
        return self.root / "projections" / f"p-{partition:04d}"

    def checkpoint(self, partition: int, offset: int) -> Path:
        return self.root / "checkpoints" / f"p-{partition:04d}" / f"{offset:020d}"

    def checkpoints(self, partition: int) -> list[Manifest]:
        """Manifests of the partition's complete checkpoints, oldest first."""
        folder = self.root / "checkpoints" / f"p-{partition:04d}"
        manifests = []
        for entry in sorted(folder.iterdir()) if folder.exists() else []:
            try:
                manifests.append(Manifest.from_json((entry / MANIFEST).read_text("utf-8")))
            except (OSError, ValueError, TypeError, KeyError):
                continue  # a checkpoint without a manifest was never completed
        return manifests

    def check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise DataDirError(f"partition must be 0..{self.partitions - 1}")


def _count(raw: dict[str, object], name: str, path: Path) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise DataDirError(f"{path / CONFIG}: {name} must be 1..{MAX_PARTITIONS}")
    return value


def find_checkpoint(data: DataDir, partition: int, offset: int) -> Manifest:
    for manifest in data.checkpoints(partition):
        if manifest.offset == offset:
            return manifest
    raise StoreError(f"partition {partition} has no checkpoint at offset {offset}")
