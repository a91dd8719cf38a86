"""The checkpoint catalog: which checkpoints are published, and so the recovery set and floor.

A checkpoint's files and manifest are stored in the object store first; the
checkpoint counts only once its entry is published here. The recovery set of a
partition is its published entries; the **recovery floor** is the oldest one's
offset: the log below it may be truncated, since every restore starts at a
published checkpoint. Embedded deployments keep the catalog in files; Kafka
deployments in a compacted topic, keyed by partition and offset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from keyload.log.base import LogError
from keyload.log.kafka_log import KafkaLog, KafkaSettings, producer_config, reader_config
from keyload.projections.store import Manifest

CATALOG_READ_TIMEOUT_S = 30.0


class CatalogError(Exception):
    """The catalog cannot be read or written."""


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

    def close(self) -> None: ...


def recovery_floor(catalog: CheckpointCatalog, partition: int) -> int | None:
    """The oldest published checkpoint's offset; None while there is none (nothing may be truncated)."""
    entries = catalog.entries(partition)
    return entries[0].offset if entries else None


class FileCatalog:
    """The embedded catalog: one JSON file per published checkpoint, written by atomic rename."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, partition: int, offset: int) -> Path:
        return self.root / (entry_key(partition, offset) + ".json")

    def publish(self, entry: CatalogEntry) -> None:
        path = self._path(entry.partition, entry.offset)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".tmp-{os.getpid()}")
        with temporary.open("w", encoding="utf-8") as file:
            file.write(entry.to_json())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    def retire(self, partition: int, offset: int) -> None:
        self._path(partition, offset).unlink(missing_ok=True)

    def entries(self, partition: int) -> list[CatalogEntry]:
        folder = self.root / f"p-{partition:04d}"
        return [CatalogEntry.from_json(path.read_text("utf-8")) for path in sorted(folder.glob("*.json"))]

    def close(self) -> None:
        pass


class KafkaCatalog:
    """The Kafka catalog: a compacted topic, key `p-NNNN/OFFSET`, value the entry (a tombstone retires it).

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

    def entries(self, partition: int) -> list[CatalogEntry]:
        latest: dict[str, bytes | None] = {}
        wanted = f"p-{partition:04d}/"
        for key, value in self._fold():
            if key.startswith(wanted):
                latest[key] = value
        return [CatalogEntry.from_json(value) for key, value in sorted(latest.items()) if value is not None]

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(CATALOG_READ_TIMEOUT_S)
            self._producer = None
        self._log.close()
