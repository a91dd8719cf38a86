"""A deployment's data directory: which log it uses, and where its local state lives.

DATA/keyload.json                  partition counts (fixed at creation); the Kafka
                                   settings when the log is Kafka; the object store:
                                   "object_store": FOLDER or {"s3": {"bucket", "prefix",
                                   "endpoint_url", "region_name"}} (default DATA/objects)
DATA/keyring.json                  key material by id (keyload/storage/keyring.py)
DATA/log/commands/p-NNNN/          command log (file log segments; embedded only)
DATA/log/outcomes/p-NNNN/          outcome stream (embedded only)
DATA/projections/p-NNNN/           RocksDB projection of a partition
DATA/objects/                      the object store (checkpoints/, payloads/), unless configured elsewhere
DATA/catalog/p-NNNN/OFFSET.json    published checkpoints (embedded only; Kafka: a compacted topic)
DATA/catalog/pins/p-NNNN/OFFSET/S  recovery pins held by restores (Kafka: records of the same topic)
DATA/scratch/                      checkpoints being taken or restored

In Kafka mode every processor of a group has a data directory of its own (its
projections) with the same Kafka settings, a copy of the same keyring, and one
shared object store: a folder on shared storage, or an S3 bucket. S3 credentials
never go into keyload.json: boto3's usual chain (AWS_* environment variables,
profiles, instance roles) provides them, so a data directory can be copied safely.
Kafka credentials never go into it either: $KEYLOAD_KAFKA_CLIENT_CONFIG names a
file of librdkafka settings (`key=value` lines, `#` comment lines; SASL user and
password, TLS files) that every Kafka client of the process uses, so processors,
clients and the GC worker each connect as their own Kafka user (kafka_client_config).

A data directory keyload creates is mode 0700, and keyload.json and keyring.json
(a `--keyring-from` copy too) are 0600, written so that no wider mode ever exists.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from keyload.errors import KeyloadError
from keyload.log.base import CommandLog
from keyload.log.file_log import DEFAULT_CONFIG as DEFAULT_FILE_LOG
from keyload.log.file_log import FileLog, FileLogConfig, FsyncPolicy
from keyload.storage.object_store import FileObjectStore, ObjectStore, S3ObjectStore

# Kafka, the checkpoint machinery and the keyring (which names the processors' default key) are
# imported where they are used: the SDK opens a data directory without loading them.
if TYPE_CHECKING:
    from keyload.log.kafka_log import KafkaSettings
    from keyload.operations.catalog import CheckpointCatalog
    from keyload.operations.checkpoints import CheckpointPolicy, Checkpoints

DEFAULT_PARTITIONS = 4
DEFAULT_OUTCOME_PARTITIONS = 8
MAX_PARTITIONS = 1024
DEFAULT_SEGMENT_BYTES = DEFAULT_FILE_LOG.segment_bytes  # 64 MiB
MIN_SEGMENT_BYTES = 4096  # a segment holds many records (a record still fits a segment of its own)
MAX_SEGMENT_BYTES = 2**31
FORMAT = 1
CONFIG = "keyload.json"
DIRECTORY_MODE = 0o700  # a data directory keyload creates: the owner only (its files are 0600)
KAFKA_CLIENT_CONFIG_ENV = "KEYLOAD_KAFKA_CLIENT_CONFIG"


def check_layout(
    partitions: int, outcome_partitions: int = DEFAULT_OUTCOME_PARTITIONS, segment_bytes: int | None = None
) -> None:
    """ValueError when a new data directory's partition counts or segment size are out of range
    (`keyload run` checks its options with it before it creates anything)."""
    for count in (partitions, outcome_partitions):
        if not 1 <= count <= MAX_PARTITIONS:
            raise ValueError(f"partition counts must be 1..{MAX_PARTITIONS}")
    if segment_bytes is not None and not MIN_SEGMENT_BYTES <= segment_bytes <= MAX_SEGMENT_BYTES:
        raise ValueError(f"segment bytes must be {MIN_SEGMENT_BYTES}..{MAX_SEGMENT_BYTES}")


class DataDirError(KeyloadError):
    """The data directory is missing, unreadable or of another format."""


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The Kafka part of keyload.json; partition counts are the data directory's."""

    bootstrap: str
    topic_prefix: str = "keyload"
    replication_factor: int = 1
    min_insync_replicas: int = 1


@dataclass(frozen=True, slots=True)
class FileStoreConfig:
    """The object store is a versioned folder (`FileObjectStore`)."""

    root: Path


@dataclass(frozen=True, slots=True)
class S3StoreConfig:
    """The object store is an S3 bucket (`S3ObjectStore`), created with versioning on if missing.

    Only where the bucket is: credentials come from boto3's chain, never from keyload.json.
    `endpoint_url` None is AWS itself; `region_name` None is boto3's default region.
    """

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region_name: str | None = None


ObjectStoreConfig: TypeAlias = FileStoreConfig | S3StoreConfig


@dataclass(frozen=True, slots=True)
class DataDir:
    root: Path
    partitions: int
    outcome_partitions: int
    kafka: KafkaConfig | None = None
    object_store_config: ObjectStoreConfig | None = None  # None: a folder, DATA/objects
    # The embedded command log's segment size: every appender of the directory must agree on it.
    segment_bytes: int = DEFAULT_SEGMENT_BYTES

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
        kafka = raw.get("kafka")
        try:
            kafka_config = None if kafka is None else KafkaConfig(**kafka)
        except TypeError as exc:
            raise DataDirError(f"{path / CONFIG}: bad kafka settings: {exc}") from None
        return DataDir(
            path,
            _count(raw, "partitions", path),
            _count(raw, "outcome_partitions", path),
            kafka_config,
            _object_store_config(raw.get("object_store"), path),
            _segment_bytes(raw.get("file_log", {}), path),
        )

    @staticmethod
    def create(
        root: str | os.PathLike[str],
        partitions: int = DEFAULT_PARTITIONS,
        outcome_partitions: int = DEFAULT_OUTCOME_PARTITIONS,
        kafka: KafkaConfig | None = None,
        object_store: ObjectStoreConfig | str | os.PathLike[str] | None = None,
        keyring_from: Path | None = None,
        segment_bytes: int | None = None,
    ) -> DataDir:
        """Open `root`, creating it with the given settings if it is new.

        `segment_bytes` is the embedded command log's segment size (default 64 MiB;
        MIN_SEGMENT_BYTES..MAX_SEGMENT_BYTES), fixed at creation.

        `object_store` is where checkpoint (and payload) objects go: a config, or a folder
        path (short for `FileStoreConfig`); None is the folder DATA/objects.
        `keyring_from` copies an existing keyring file (every processor over one log
        needs the same keys); otherwise a new keyring with one random key is made.
        A directory it makes is mode 0700; keyload.json and keyring.json are 0600.
        An existing directory must not be asked for other Kafka settings.
        """
        path = Path(root)
        if (path / CONFIG).exists():
            existing = DataDir.open(path)
            if kafka is not None and existing.kafka != kafka:
                raise DataDirError(f"{path} was created with other log settings ({existing.describe_log()})")
            return existing
        try:
            check_layout(partitions, outcome_partitions, segment_bytes)
        except ValueError as exc:
            raise DataDirError(str(exc)) from None
        try:
            DataDir._create(path, partitions, outcome_partitions, kafka, object_store, keyring_from, segment_bytes)
        except OSError as exc:
            raise DataDirError(f"cannot create the data directory {path}: {exc.strerror or exc}") from exc
        return DataDir.open(path)

    @staticmethod
    def _create(
        path: Path,
        partitions: int,
        outcome_partitions: int,
        kafka: KafkaConfig | None,
        object_store: ObjectStoreConfig | str | os.PathLike[str] | None,
        keyring_from: Path | None,
        segment_bytes: int | None,
    ) -> None:
        try:
            path.mkdir(DIRECTORY_MODE, parents=True)
        except FileExistsError:
            pass  # a folder the caller made keeps its mode
        else:
            os.chmod(path, DIRECTORY_MODE)  # exactly 0700, whatever the umask
        config: dict[str, Any] = {
            "format": FORMAT,
            "partitions": partitions,
            "outcome_partitions": outcome_partitions,
        }
        if kafka is not None:
            config["kafka"] = {
                "bootstrap": kafka.bootstrap,
                "topic_prefix": kafka.topic_prefix,
                "replication_factor": kafka.replication_factor,
                "min_insync_replicas": kafka.min_insync_replicas,
            }
        if segment_bytes is not None:
            config["file_log"] = {"segment_bytes": segment_bytes}
        if isinstance(object_store, S3StoreConfig):
            config["object_store"] = {"s3": asdict(object_store)}
        elif object_store is not None:
            folder = object_store.root if isinstance(object_store, FileStoreConfig) else Path(object_store)
            config["object_store"] = str(folder.resolve())
        from keyload.storage import keyring, principals  # lazily: see the imports

        if keyring_from is not None:
            keyring.copy(keyring_from, path)  # checked to be a keyring first
        keyring.create(path)
        principals.ensure_system(path)
        # Written last: a directory with keyload.json is complete.
        keyring.write_private(path / CONFIG, (json.dumps(config, indent=2) + "\n").encode("utf-8"))

    def describe_log(self) -> str:
        if self.kafka is None:
            return "embedded file log"
        return f"Kafka at {self.kafka.bootstrap}, topics {self.kafka.topic_prefix}.*"

    def kafka_settings(self) -> KafkaSettings:
        from keyload.log.kafka_log import KafkaSettings  # lazily: see the imports

        if self.kafka is None:
            raise DataDirError(f"{self.root} uses the embedded file log, not Kafka")
        return KafkaSettings(
            bootstrap=self.kafka.bootstrap,
            topic_prefix=self.kafka.topic_prefix,
            partitions=self.partitions,
            outcome_partitions=self.outcome_partitions,
            replication_factor=self.kafka.replication_factor,
            min_insync_replicas=self.kafka.min_insync_replicas,
            client_config=kafka_client_config(),
        )

    def file_command_log(self, config: FileLogConfig | None = None) -> FileLog:
        if self.kafka is not None:
            raise DataDirError(f"{self.root} uses {self.describe_log()}, not the file log")
        return FileLog(
            self.root / "log" / "commands", self.partitions, config or FileLogConfig(segment_bytes=self.segment_bytes)
        )

    def command_log(self) -> CommandLog:
        if self.kafka is not None:
            from keyload.log.kafka_log import KafkaLog  # lazily: see the imports

            return KafkaLog.commands(self.kafka_settings())
        return self.file_command_log()

    def outcome_log(self) -> CommandLog:
        if self.kafka is not None:
            from keyload.log.kafka_log import KafkaLog  # lazily: see the imports

            return KafkaLog.outcomes(self.kafka_settings())
        # Outcomes are derived data: replaying the command log reproduces every
        # one of them, so the stream is not fsynced.
        return FileLog(
            self.root / "log" / "outcomes",
            self.outcome_partitions,
            FileLogConfig(fsync=FsyncPolicy.NONE),
        )

    def catalog(self) -> CheckpointCatalog:
        from keyload.operations.catalog import FileCatalog, KafkaCatalog  # lazily: see the imports

        if self.kafka is not None:
            return KafkaCatalog(self.kafka_settings())
        return FileCatalog(self.root / "catalog")

    @property
    def object_root(self) -> Path | None:
        """The object store's folder (default DATA/objects); None when it is an S3 bucket."""
        config = self.object_store_config
        if isinstance(config, S3StoreConfig):
            return None
        return self.root / "objects" if config is None else config.root

    def object_store(self) -> ObjectStore:
        """A new client of the object store. Nothing is cached (a DataDir pickles and forks as plain
        settings); an S3 store costs two requests to open, so open it once per worker."""
        config = self.object_store_config
        if isinstance(config, S3StoreConfig):
            return S3ObjectStore(
                config.bucket, config.prefix, endpoint_url=config.endpoint_url, region_name=config.region_name
            )
        return FileObjectStore(self.root / "objects" if config is None else config.root)

    def checkpoints(self, policy: CheckpointPolicy | None = None) -> Checkpoints:
        from keyload.operations.checkpoints import Checkpoints  # lazily: see the imports

        return Checkpoints(None, self.catalog(), self.root / "scratch", policy, open_objects=self.object_store)

    def keyring(self) -> dict[str, bytes]:
        from keyload.storage import keyring  # lazily: see the imports

        return keyring.load(self.root)

    def projection(self, partition: int) -> Path:
        return self.root / "projections" / f"p-{partition:04d}"

    def projected_partitions(self) -> list[int]:
        """The partitions whose projection lives here: each one `keyload run` has served (embedded),
        or that this machine's processor holds or has held (Kafka), in partition order."""
        return [partition for partition in range(self.partitions) if self.projection(partition).is_dir()]

    def check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise DataDirError(f"partition must be 0..{self.partitions - 1}")


def _object_store_config(raw: object, path: Path) -> ObjectStoreConfig | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return FileStoreConfig(Path(raw))
    s3 = raw.get("s3") if isinstance(raw, dict) and len(raw) == 1 else None
    if isinstance(s3, dict):
        try:
            config = S3StoreConfig(**s3)
        except TypeError as exc:
            raise DataDirError(f"{path / CONFIG}: bad S3 object store settings: {exc}") from None
        optional = (config.endpoint_url, config.region_name)
        if (
            isinstance(config.bucket, str)
            and isinstance(config.prefix, str)
            and all(isinstance(value, str | None) for value in optional)
        ):
            return config
    raise DataDirError(f'{path / CONFIG}: "object_store" must be a folder or {{"s3": {{"bucket": ..., ...}}}}')


def _segment_bytes(raw: object, path: Path) -> int:
    value = raw.get("segment_bytes", DEFAULT_SEGMENT_BYTES) if isinstance(raw, dict) else None
    if type(value) is not int or not MIN_SEGMENT_BYTES <= value <= MAX_SEGMENT_BYTES:
        raise DataDirError(f"{path / CONFIG}: file_log.segment_bytes must be {MIN_SEGMENT_BYTES}..{MAX_SEGMENT_BYTES}")
    return value


def _count(raw: dict[str, object], name: str, path: Path) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise DataDirError(f"{path / CONFIG}: {name} must be 1..{MAX_PARTITIONS}")
    return value


# Settings of the deployment (keyload.json) or of keyload itself, which a client config may not change;
# metadata.broker.list is librdkafka's other name for bootstrap.servers.
KAFKA_OWN_SETTINGS = frozenset({"bootstrap.servers", "metadata.broker.list", "group.id"})


def kafka_client_config() -> dict[str, str]:
    """The librdkafka settings of the file $KEYLOAD_KAFKA_CLIENT_CONFIG names (none when it is unset
    or empty). One `key=value` per line, both stripped of surrounding spaces (a value is the rest of
    the line after the first `=`); a line whose first character past spaces is `#` is a comment, and
    blank lines are skipped. A key given twice, or one of KAFKA_OWN_SETTINGS, is a DataDirError."""
    name = os.environ.get(KAFKA_CLIENT_CONFIG_ENV)
    if not name:
        return {}
    try:
        text = Path(name).read_text("utf-8")
    except OSError as exc:
        raise DataDirError(f"${KAFKA_CLIENT_CONFIG_ENV}: cannot read {name}: {exc}") from None
    settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = (part.strip() for part in line.partition("="))
        if not equals or not key:
            raise DataDirError(f"${KAFKA_CLIENT_CONFIG_ENV}: {name} line {number} is not key=value")
        if key in KAFKA_OWN_SETTINGS:
            raise DataDirError(f"${KAFKA_CLIENT_CONFIG_ENV}: {name} line {number}: {key} is keyload's own setting")
        if key in settings:
            raise DataDirError(f"${KAFKA_CLIENT_CONFIG_ENV}: {name} line {number}: {key} is given twice")
        settings[key] = value
    return settings
