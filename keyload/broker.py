"""A real single-node Apache Kafka broker (KRaft) run natively from Maven Central jars.

For development, tests and benchmarks on machines without Docker: `kafka_classpath` fetches the broker's jars once
with Maven into a cache, `NativeBroker` formats storage and runs `kafka.Kafka` as a child JVM.
From a shell: `python -m keyload.broker start DIR` (prints the bootstrap) and `python -m keyload.broker stop DIR`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# The newest Kafka on Maven Central (4.0.0..4.4.0 served); its broker bytecode targets Java 17 (class file 61).
KAFKA_VERSION = "4.4.0"
# Kafka's jars log through slf4j 1.7 and ship no binding; the broker distribution uses log4j2 through this bridge.
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
HEAP = "-Xmx512m"
LOG_TAIL_CHARS = 4000

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


class BrokerError(RuntimeError):
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
            raise BrokerError(f"mvn could not fetch Kafka {KAFKA_VERSION}:\n{_tail(done.stdout + done.stderr)}")
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(text: str) -> str:
    return text[-LOG_TAIL_CHARS:]


class NativeBroker:
    """One KRaft broker+controller whose ports, data and logs live in `workdir`, so a restart keeps its address."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "broker.log"
        self.pid_path = self.workdir / "broker.pid"
        ports_path = self.workdir / "ports"
        saved = [int(p) for p in ports_path.read_text().split()] if ports_path.exists() else []
        self.port = port or (saved[0] if saved else free_port())
        self.controller_port = saved[1] if saved else free_port()
        ports_path.write_text(f"{self.port} {self.controller_port}\n")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90) -> None:
        """Format storage on first start, launch the JVM, and return once the broker answers metadata requests."""
        running = self._pid()
        if running is not None:
            raise BrokerError(f"a broker (pid {running}) already runs in {self.workdir}; stop it first")
        java = java_executable()
        if java is None:
            raise BrokerError("java is not on PATH (Kafka 4.x needs Java 17+)")
        classpath = os.pathsep.join(str(jar) for jar in kafka_classpath())
        config = self.workdir / "server.properties"
        config.write_text(self._server_properties())
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        jvm = [java, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}", "-cp", classpath]
        with open(self.log_path, "ab") as log:
            if not (self.workdir / "data" / "meta.properties").exists():
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
                fmt = [*jvm[:2], "-Xmx256m", *jvm[2:], "kafka.tools.StorageTool", "format"]
                done = subprocess.run([*fmt, "-t", cluster_id, "-c", str(config)], stdout=log, stderr=log)
                if done.returncode != 0:
                    raise BrokerError(f"formatting Kafka storage failed:\n{self.log_tail()}")
            self._proc = subprocess.Popen(
                [*jvm[:2], HEAP, *jvm[2:], "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C in the parent's terminal must not skip the clean shutdown
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self._proc is not None
        meta = (self.workdir / "data" / "meta.properties").read_text()
        cluster_id = next(line.split("=", 1)[1] for line in meta.splitlines() if line.startswith("cluster.id="))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(f"Kafka exited with code {self._proc.returncode} while starting:\n{self.log_tail()}")
            try:  # a plain connect first: librdkafka logs every refused connection to stderr
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                if metadata.cluster_id == cluster_id and metadata.brokers:  # ours, not another broker on the port
                    return
            except (OSError, KafkaException):
                pass
            time.sleep(0.2)
        raise BrokerError(f"Kafka did not answer on {self.bootstrap} within {timeout_s:g}s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM for a clean shutdown (so a restart needs no log recovery), SIGKILL if it takes too long."""
        pid = self._pid()
        if pid is None:
            return
        self._signal(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, 10)
        self._forget()

    def kill(self) -> None:
        """SIGKILL, like a machine crash: the next start recovers from the data on disk."""
        pid = self._pid()
        if pid is None:
            return
        self._signal(pid, signal.SIGKILL)
        self._wait_exit(pid, 10)
        self._forget()

    def log_tail(self) -> str:
        return _tail(self.log_path.read_text(errors="replace")) if self.log_path.exists() else ""

    def _pid(self) -> int | None:
        """The JVM this object started, or else the live one recorded in the workdir (another process's `start`)."""
        if self._proc is not None:
            return self._proc.pid if self._proc.poll() is None else None
        if not self.pid_path.exists():
            return None
        pid = int(self.pid_path.read_text())
        # A stale file's pid may belong to an unrelated process by now: only a JVM running our config counts.
        args = subprocess.run(["ps", "-p", str(pid), "-o", "args="], capture_output=True, text=True).stdout
        return pid if str(self.workdir / "server.properties") in args else None

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)  # the JVM leads its own process group

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        if self._proc is not None:
            try:
                self._proc.wait(timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout_s
        while _alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _forget(self) -> None:
        self._proc = None
        self.pid_path.unlink(missing_ok=True)

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

    def __enter__(self) -> NativeBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`start DIR` leaves the broker running in the background and prints its bootstrap; `stop DIR` ends it."""
    parser = argparse.ArgumentParser(prog="python -m keyload.broker", description=__doc__)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--port", type=int, help="PLAINTEXT port (default: the one used before, else a free one)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait (default 90)")
    args = parser.parse_args(argv)
    broker = NativeBroker(args.dir, args.port)
    try:
        if args.action == "start":
            broker.start(args.timeout)
            (broker.workdir / "bootstrap").write_text(f"{broker.bootstrap}\n")
            print(broker.bootstrap)
        else:
            broker.stop(args.timeout)
    except BrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
