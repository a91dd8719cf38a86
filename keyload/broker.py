"""A real single-node Apache Kafka broker (KRaft) run natively from Maven Central jars.

For development, tests and benchmarks on machines without Docker: `kafka_classpath` fetches the broker's jars once
with Maven into a cache, `NativeBroker` formats storage and runs `kafka.Kafka` as a child JVM.
From a shell: `python -m keyload.broker start DIR` (prints the bootstrap) and `python -m keyload.broker stop DIR`.
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from keyload.dev_server import LOG_TAIL_CHARS, DevServer, DevServerError, cli, free_port

# The newest Kafka on Maven Central (4.0.0..4.4.0 served); its broker bytecode targets Java 17 (class file 61).
KAFKA_VERSION = "4.4.0"
# Kafka's jars log through slf4j 1.7 and ship no binding; the broker distribution uses log4j2 through this bridge.
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
HEAP = "-Xmx512m"

# Internal topics that fit one node, and no hidden waits or implicit topics in tests; tests/kafka.py gives a Docker
# broker the same settings, and docker/docker-compose.yml repeats them.
SINGLE_NODE_SETTINGS = {
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
}

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>keyload</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

# Everything at WARN goes to stdout, which the broker's log file captures together with JVM crashes.
_LOG4J2 = """status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
"""


class BrokerError(DevServerError):
    """The broker could not be fetched, started or stopped; the message says why."""


def default_cache() -> Path:
    """Shared across checkouts so the jars are fetched once per machine."""
    base = os.environ.get("KEYLOAD_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "keyload"
    return root / f"kafka-{KAFKA_VERSION}"


def kafka_classpath(cache: Path | None = None) -> list[Path]:
    """The broker's runtime jars, fetched with Maven on first use; concurrent callers wait on a file lock."""
    cache = cache or default_cache()
    manifest = cache / "classpath.txt"
    cached = _read_manifest(manifest)
    if cached is not None:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_manifest(manifest)  # another process may have fetched while we waited
        if cached is not None:
            return cached
        mvn = shutil.which("mvn")
        if mvn is None or java_executable() is None:
            raise BrokerError(f"Kafka jars are not cached in {cache} and fetching them needs java and mvn on PATH")
        (cache / "pom.xml").write_text(_POM.format(kafka=KAFKA_VERSION, log4j=LOG4J_VERSION))
        lib = cache / "lib"
        shutil.rmtree(lib, ignore_errors=True)
        command = [mvn, "-q", "-B", "-f", str(cache / "pom.xml"), f"{DEPENDENCY_PLUGIN}:copy-dependencies"]
        command += [f"-DoutputDirectory={lib}", "-DincludeScope=runtime"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise BrokerError(
                f"mvn could not fetch Kafka {KAFKA_VERSION}:\n{(done.stdout + done.stderr)[-LOG_TAIL_CHARS:]}"
            )
        jars = sorted(lib.glob("*.jar"))
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text("".join(f"{jar.name}\n" for jar in jars))
        tmp.replace(manifest)  # the manifest appears only once every jar is in place
        return jars


def _read_manifest(manifest: Path) -> list[Path] | None:
    if not manifest.exists():
        return None
    jars = [manifest.parent / "lib" / name for name in manifest.read_text().split()]
    return jars if jars and all(jar.exists() for jar in jars) else None


def java_executable() -> str | None:
    """`$JAVA_HOME/bin/java` when set, so the JDK Maven uses is also the one that runs the broker."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def native_broker_available() -> str | None:
    """None when a NativeBroker can start here, else the reason it cannot."""
    if java_executable() is None:
        return "java is not on PATH"
    if _read_manifest(default_cache() / "classpath.txt") is None and shutil.which("mvn") is None:
        return f"mvn is not on PATH and the Kafka jars are not cached in {default_cache()}"
    return None


class NativeBroker(DevServer):
    """One KRaft broker+controller whose ports, data and logs live in `workdir`, so a restart keeps its address."""

    NAME = "broker"
    ERROR = BrokerError
    START_TIMEOUT_S = 90.0
    STOP_TIMEOUT_S = 60.0  # a clean shutdown, so a restart needs no log recovery

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        super().__init__(workdir)
        ports_path = self.workdir / "ports"
        saved = [int(p) for p in ports_path.read_text().split()] if ports_path.exists() else []
        self.port = port or (saved[0] if saved else free_port())
        self.controller_port = saved[1] if saved else free_port()
        ports_path.write_text(f"{self.port} {self.controller_port}\n")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.bootstrap

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Format storage on first start and launch the JVM."""
        java = java_executable()
        if java is None:
            raise BrokerError("java is not on PATH (Kafka 4.x needs Java 17+)")
        classpath = os.pathsep.join(str(jar) for jar in kafka_classpath())
        config = self.workdir / "server.properties"
        config.write_text(self._server_properties())
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        jvm = [java, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}", "-cp", classpath]
        if not (self.workdir / "data" / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            fmt = [*jvm[:2], "-Xmx256m", *jvm[2:], "kafka.tools.StorageTool", "format"]
            done = subprocess.run([*fmt, "-t", cluster_id, "-c", str(config)], stdout=log, stderr=log)
            if done.returncode != 0:
                raise BrokerError(f"formatting Kafka storage failed:\n{self.log_tail()}")
        return subprocess.Popen(
            [*jvm[:2], HEAP, *jvm[2:], "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    def _wait_ready(self, timeout_s: float) -> None:
        meta = (self.workdir / "data" / "meta.properties").read_text()
        cluster_id = next(line.split("=", 1)[1] for line in meta.splitlines() if line.startswith("cluster.id="))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exited = self.exited_while_starting()
            if exited is not None:
                raise exited
            try:  # a plain connect first: librdkafka logs every refused connection to stderr
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                if metadata.cluster_id == cluster_id and metadata.brokers:  # ours, not another broker on the port
                    return
            except (OSError, KafkaException):
                pass
            time.sleep(0.2)
        raise BrokerError(f"Kafka did not answer on {self.bootstrap} within {timeout_s:g}s:\n{self.log_tail()}")

    def _owns(self, args: str) -> bool:
        return str(self.workdir / "server.properties") in args  # a JVM running our config

    def _server_properties(self) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            **SINGLE_NODE_SETTINGS,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())


def main(argv: list[str] | None = None) -> int:
    return cli(NativeBroker, argv, "python -m keyload.broker", __doc__)


if __name__ == "__main__":
    sys.exit(main())
