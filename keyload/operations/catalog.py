"""The checkpoint catalog: which checkpoints are published, and so the recovery set and floor.

A checkpoint's files and manifest are stored in the object store first; the
checkpoint counts only once its entry is published here. The recovery set of a
partition is its published entries; the **recovery floor** is the oldest one's
offset: the log below it may be truncated, since every restore starts at a
published checkpoint. Embedded deployments keep the catalog in files; Kafka
deployments in a compacted topic, keyed by partition and offset.

A restore may **pin** the exact entry it is using (a RecoveryPin, held by a
session) so that retention cannot retire it and delete its objects meanwhile.
A pin has no client-clock expiry: it lasts until the holder releases it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from keyload.errors import KeyloadError
from keyload.log.base import LogError
from keyload.log.file_log import fsync_directory
from keyload.log.kafka_log import KafkaLog, KafkaSettings, producer_config, reader_config
from keyload.projections.store import Manifest

CATALOG_READ_TIMEOUT_S = 30.0
T = TypeVar("T")
PIN_KEY_PREFIX = "pin/"  # Kafka catalog: pin keys, never taken for entry keys (those start with "p-")


MAX_SESSION_CHARS = 128
# A session spelled like this is used as is in pin file names and keys; any other is hashed.
_PLAIN_SESSION = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


class CatalogError(KeyloadError):
    """The catalog cannot be read or written."""


class NotPublished(CatalogError):
    """A pin names an offset that is not (or no longer) a published checkpoint."""


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """A published checkpoint: its manifest and where its objects are."""

    manifest: Manifest
    object_prefix: str  # the manifest is object_prefix + "manifest.json", files under object_prefix + "db/"

    @property
    def partition(self) -> int:
        return self.manifest.partition

    @property
    def offset(self) -> int:
        return self.manifest.offset

    @property
    def key(self) -> str:
        return entry_key(self.partition, self.offset)

    def to_json(self) -> str:
        return json.dumps({"manifest": json.loads(self.manifest.to_json()), "object_prefix": self.object_prefix})

    @staticmethod
    def from_json(text: str | bytes) -> CatalogEntry:
        raw: dict[str, Any] = json.loads(text)
        return CatalogEntry(Manifest.from_json(json.dumps(raw["manifest"])), str(raw["object_prefix"]))


def entry_key(partition: int, offset: int) -> str:
    return f"p-{partition:04d}/{offset:020d}"


@dataclass(frozen=True, slots=True)
class RecoveryPin:
    """A session's claim on one published checkpoint: it is not retired while the pin exists."""

    partition: int
    offset: int
    session: str  # who holds it: 1..128 printable ASCII, e.g. "restore-p3-<hostname>-<pid>-<random>"

    def __post_init__(self) -> None:
        if not 1 <= len(self.session) <= MAX_SESSION_CHARS or not all(" " <= c <= "~" for c in self.session):
            raise ValueError(f"a pin session is 1..{MAX_SESSION_CHARS} printable ASCII characters")

    @property
    def key(self) -> str:
        """`p-NNNN/OFFSET/SESSION`; a session that is no safe file name (`/`, `..`, ...) becomes `~` + its SHA-256."""
        plain = _PLAIN_SESSION.fullmatch(self.session)
        name = self.session if plain else "~" + hashlib.sha256(self.session.encode()).hexdigest()
        return f"{entry_key(self.partition, self.offset)}/{name}"

    def to_json(self) -> str:
        return json.dumps({"partition": self.partition, "offset": self.offset, "session": self.session})

    @staticmethod
    def from_json(text: str | bytes) -> RecoveryPin:
        raw: dict[str, Any] = json.loads(text)
        return RecoveryPin(int(raw["partition"]), int(raw["offset"]), str(raw["session"]))


class CheckpointCatalog(Protocol):
    def publish(self, entry: CatalogEntry) -> None:
        """Make the checkpoint part of the recovery set; durable when it returns."""
        ...

    def retire(self, partition: int, offset: int) -> None:
        """Take a checkpoint out of the recovery set (its objects may be deleted afterwards)."""
        ...

    def entries(self, partition: int) -> list[CatalogEntry]:
        """The partition's recovery set, oldest first."""
        ...

    def pin(self, pin: RecoveryPin) -> None:
        """Durable when it returns; pinning an offset that is not a published entry is NotPublished (a CatalogError)."""
        ...

    def release(self, pin: RecoveryPin) -> None:
        """Idempotent."""
        ...

    def pins(self, partition: int) -> list[RecoveryPin]:
        """Oldest offset first."""
        ...

    def close(self) -> None: ...


def recovery_floor(catalog: CheckpointCatalog, partition: int) -> int | None:
    """The oldest published checkpoint's offset; None while there is none (nothing may be truncated)."""
    entries = catalog.entries(partition)
    return entries[0].offset if entries else None


def _keep_if_published(catalog: CheckpointCatalog, pin: RecoveryPin) -> None:
    """Run after writing `pin`: undo it and raise NotPublished unless its entry is published.

    Checking after the write, not before, closes the race with `Checkpoints.retire_beyond`,
    which reads the pins again after retiring: either this check sees the entry gone, or
    the retirer sees the pin and publishes the entry again.
    """
    if all(entry.offset != pin.offset for entry in catalog.entries(pin.partition)):
        catalog.release(pin)
        raise NotPublished(f"partition {pin.partition} has no published checkpoint at offset {pin.offset}")


def _write_atomically(path: Path, text: str) -> None:
    """Write, fsync, rename into place, fsync the directory: a reader sees the whole file or
    none, and a power cut cannot lose an entry the recovery floor already counts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with temporary.open("w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(str(path.parent))


def _remove_durably(path: Path) -> None:
    """Unlink and fsync the directory: a retired entry never comes back after a power cut."""
    path.unlink(missing_ok=True)
    if path.parent.is_dir():
        fsync_directory(str(path.parent))


def _read(path: Path, parse: Callable[[str], T]) -> T:
    """A catalog file, parsed; CatalogError naming the file when it cannot be (a damaged entry is
    not skipped: the recovery floor it may hold decides what the log may lose)."""
    try:
        return parse(path.read_text("utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CatalogError(f"catalog file {path} cannot be read: {reason}") from exc


class FileCatalog:
    """The embedded catalog: one JSON file per published checkpoint, written by atomic rename.

    Pins are files too: `pins/p-NNNN/OFFSET/SESSION`, holding the pin as JSON.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, partition: int, offset: int) -> Path:
        return self.root / (entry_key(partition, offset) + ".json")

    def _pin_path(self, pin: RecoveryPin) -> Path:
        return self.root / "pins" / pin.key

    def publish(self, entry: CatalogEntry) -> None:
        _write_atomically(self._path(entry.partition, entry.offset), entry.to_json())

    def retire(self, partition: int, offset: int) -> None:
        _remove_durably(self._path(partition, offset))

    def entries(self, partition: int) -> list[CatalogEntry]:
        folder = self.root / f"p-{partition:04d}"
        return [_read(path, CatalogEntry.from_json) for path in sorted(folder.glob("*.json"))]

    def pin(self, pin: RecoveryPin) -> None:
        try:
            _write_atomically(self._pin_path(pin), pin.to_json())
        except OSError as exc:
            raise CatalogError(f"cannot write pin {pin.key}: {exc}") from exc
        _keep_if_published(self, pin)

    def release(self, pin: RecoveryPin) -> None:
        _remove_durably(self._pin_path(pin))

    def pins(self, partition: int) -> list[RecoveryPin]:
        folder = self.root / "pins" / f"p-{partition:04d}"
        paths = sorted(path for path in folder.glob("*/*") if not path.name.startswith("."))
        return [_read(path, RecoveryPin.from_json) for path in paths]

    def close(self) -> None:
        pass


class KafkaCatalog:
    """The Kafka catalog: a compacted topic, key `p-NNNN/OFFSET`, value the entry (a tombstone retires it).

    Pins share the topic: key `pin/p-NNNN/OFFSET/SESSION`, value the pin (a tombstone releases it).

    Reading folds the topic from its beginning to its end; the catalog holds a few
    entries per partition, so that stays small.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.topic = settings.catalog_topic
        self._log = KafkaLog(settings, self.topic, 1)  # its watermarks ride out leader moves
        self._producer: Producer | None = None

    def _produce(self, key: str, value: str | None) -> None:
        if self._producer is None:
            self._producer = Producer(producer_config(self.settings))
        errors: list[str] = []

        def report(error: Any, _message: Any) -> None:
            if error is not None:
                errors.append(str(error))

        self._producer.produce(
            self.topic, key=key.encode(), value=None if value is None else value.encode(), on_delivery=report
        )
        if self._producer.flush(CATALOG_READ_TIMEOUT_S) != 0:
            raise CatalogError(f"catalog topic {self.topic}: no acknowledgement in {CATALOG_READ_TIMEOUT_S:.0f} s")
        if errors:
            raise CatalogError(f"catalog topic {self.topic}: {errors[0]}")

    def publish(self, entry: CatalogEntry) -> None:
        self._produce(entry.key, entry.to_json())

    def retire(self, partition: int, offset: int) -> None:
        self._produce(entry_key(partition, offset), None)

    def _fold(self) -> Iterator[tuple[str, bytes | None]]:
        """(key, value) of every catalog record, oldest first (KafkaLog's records carry no keys)."""
        try:
            high = self._log.end_offset(0)
        except LogError as exc:
            raise CatalogError(str(exc)) from exc
        if high <= 0:
            return
        consumer = Consumer({**reader_config(self.settings), "enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            position = -1
            while position < high - 1:
                message = consumer.poll(CATALOG_READ_TIMEOUT_S)
                if message is None:
                    raise CatalogError(f"catalog topic {self.topic}: no data in {CATALOG_READ_TIMEOUT_S:.0f} s")
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    raise CatalogError(f"catalog topic {self.topic}: {error}")
                offset, key = message.offset(), message.key()
                assert offset is not None and key is not None, "catalog records are keyed"
                position = offset
                yield key.decode(), message.value()
        finally:
            consumer.close()

    def _current(self, prefix: str) -> list[bytes]:
        """The live values of the keys starting with `prefix`, in key order (tombstoned keys left out)."""
        latest: dict[str, bytes | None] = {}
        for key, value in self._fold():
            if key.startswith(prefix):
                latest[key] = value
        return [value for _key, value in sorted(latest.items()) if value is not None]

    def entries(self, partition: int) -> list[CatalogEntry]:
        return [CatalogEntry.from_json(value) for value in self._current(f"p-{partition:04d}/")]

    def pin(self, pin: RecoveryPin) -> None:
        self._produce(PIN_KEY_PREFIX + pin.key, pin.to_json())
        _keep_if_published(self, pin)

    def release(self, pin: RecoveryPin) -> None:
        self._produce(PIN_KEY_PREFIX + pin.key, None)

    def pins(self, partition: int) -> list[RecoveryPin]:
        return [RecoveryPin.from_json(value) for value in self._current(f"{PIN_KEY_PREFIX}p-{partition:04d}/")]

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(CATALOG_READ_TIMEOUT_S)
            self._producer = None
        self._log.close()
