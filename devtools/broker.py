"""A real single-node Apache Kafka broker (KRaft) run natively from Maven Central jars.

For development, tests and benchmarks on machines without Docker: `kafka_classpath` fetches the broker's jars once
with Maven into a cache, `NativeBroker` formats storage and runs `kafka.Kafka` as a child JVM.
From a shell: `python -m devtools.broker start DIR` (prints the bootstrap) and `python -m devtools.broker stop DIR`.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from devtools.dev_server import LOG_TAIL_CHARS, DevServer, DevServerError, cli, free_port

# The newest Kafka on Maven Central (4.0.0..4.4.0 served); its broker bytecode targets Java 17 (class file 61).
KAFKA_VERSION = "4.4.0"
# Kafka's jars log through slf4j 1.7 and ship no binding; the broker distribution uses log4j2 through this bridge.
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
HEAP = "-Xmx512m"
# C1 only: a broker JVM starts in about half the time on a loaded two-core machine, at some cost to peak throughput, so
# for brokers that tests stop and start again (NativeBroker(quick_jit=True)), not for long-lived or benchmarked ones.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
CDS_QUIET = "-Xlog:cds=off,cds+dynamic=off"  # which classes a class archive leaves out and why: no news for the log

# The readiness probe (BrokerProbe) writes to and reads from this topic, so a started broker has served every kind of
# request the tests make first: metadata, topic creation, an idempotent produce, a consumer group's join and commit.
PROBE_TOPIC = "devtools.broker-ready"
PROBE_ATTEMPT_S = 10.0  # one probe request: one a busy broker leaves unanswered this long is sent again
PROBE_RETRY_S = 0.2
# librdkafka's warnings about what the probe waits out (COORDINATOR_LOAD_IN_PROGRESS for a producer id, say) are no
# news: only its errors reach stderr.
PROBE_CLIENT = {"log_level": 3}
# Ports are picked below the kernel's ephemeral range: a port in it can be taken between the pick and the broker's bind,
# or while the broker restarts, by any process's outgoing connection or bind(0), even by a client reconnecting to
# this very port (a TCP self-connect); nothing takes a port below the range without asking for it by number.
PORT_FLOOR = 20_000
PORT_BUSY_WAIT_S = 1.0  # a restart finds its port taken: try again this much later

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
    "offsets.topic.num.partitions": "1",  # not 50, each of which a broker creates on a group's first join and loads
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


class NotServing(BrokerError):
    """The broker did not serve within the time given (wait_serving); the message says which step it failed."""


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


def new_cluster_id() -> str:
    """A random cluster id as Kafka's own Uuid.randomUuid() makes one: never starting with "-", which kafka-storage
    would take for an option ("argument --cluster-id/-t: expected one argument"): one draw in 64 does."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def class_archive(java: str, classpath: str) -> Path:
    """Where the class archive of this JDK and classpath is kept (NativeBroker._class_archive_options)."""
    real = Path(java).resolve()
    stat = real.stat()
    key = hashlib.sha256(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0{classpath}".encode()).hexdigest()[:16]
    return default_cache() / "cds" / f"broker-{key}.jsa"


def listen_port(avoid: frozenset[int] = frozenset()) -> int:
    """A port on 127.0.0.1 that nothing is bound to, below the ephemeral range where one can be had (see PORT_FLOOR)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - PORT_FLOOR >= 1000:
        for _ in range(200):
            port = random.randrange(PORT_FLOOR, low)
            if port not in avoid and _bindable(port, reuse=False):
                return port
    port = free_port()
    while port in avoid:
        port = free_port()
    return port


def _bindable(port: int, reuse: bool) -> bool:
    """Whether a listener could bind 127.0.0.1:`port` now; `reuse` as the JVM does, past connections in TIME_WAIT."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class NativeBroker(DevServer):
    """One KRaft broker+controller whose ports, data and logs live in `workdir`, so a restart keeps its address.

    start() returns once the broker serves (BrokerProbe). Ports it picked itself that turn out taken when the JVM binds
    are picked again; a port the broker's clients know (given, or used before) is waited for instead.

    With `sasl_users` (name → password) the broker also listens for SASL/PLAIN clients on `sasl_bootstrap` and turns on
    Kafka's StandardAuthorizer with no ACLs, so a SASL user may do only what ACLs then grant it. The PLAINTEXT
    listener stays open as the harness's own door: it is the super user ANONYMOUS, for the readiness probe and for
    creating those ACLs.
    """

    NAME = "broker"
    ERROR = BrokerError
    START_TIMEOUT_S = 180.0  # two JVMs' start-up, topic creation and a group join, on a loaded two-core machine
    STOP_TIMEOUT_S = 60.0  # a clean shutdown, so a restart needs no log recovery

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        quick_jit: bool = False,
        sasl_users: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(workdir)
        self.quick_jit = quick_jit
        self.sasl_users = dict(sasl_users or {})
        self._class_dump = self.workdir / "classes.jsa.tmp"  # a class archive the running JVM writes when it exits
        self._class_dump_target: Path | None = None
        self._ports_path = self.workdir / "ports"
        saved = [int(p) for p in self._ports_path.read_text().split()] if self._ports_path.exists() else []
        self.port = port or (saved[0] if saved else listen_port())
        self.controller_port = saved[1] if saved else listen_port(frozenset({self.port}))
        self.sasl_port = saved[2] if len(saved) > 2 else listen_port(frozenset({self.port, self.controller_port}))
        # Ports that may not change: one clients were given, or one the broker already served on.
        if saved:
            self._fixed = self._served_ports() if len(saved) > 2 else {self.port, self.controller_port}
        else:
            self._fixed = {self.port} if port else set()
        self._save_ports()
        self._launch_log_start: int | None = None  # where the latest launch's output starts in the log

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """Where SASL/PLAIN clients connect (a broker made with `sasl_users`)."""
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def address(self) -> str:
        return self.bootstrap

    def start(self, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (self.START_TIMEOUT_S if timeout_s is None else timeout_s)
        while True:
            held = [port for port in sorted(self._fixed) if not _bindable(port, reuse=True)]
            if held and time.monotonic() < deadline and self._pid() is None:
                time.sleep(PORT_BUSY_WAIT_S)  # its clients know this address: wait for whoever holds it to let go
                continue
            self._launch_log_start = None
            try:
                super().start(max(deadline - time.monotonic(), 1.0))
            except BrokerError:
                taken = self._port_taken_at_launch()
                if taken is None or time.monotonic() >= deadline:
                    raise
                if taken in self._fixed:
                    time.sleep(PORT_BUSY_WAIT_S)  # its clients know this address: wait for whoever holds it
                else:
                    self._repick(taken)
                continue
            self._fixed = self._served_ports()
            return

    def stop(self, timeout_s: float | None = None) -> None:
        process = self._proc
        super().stop(timeout_s)
        self._keep_class_archive(process)

    def kill(self) -> None:
        super().kill()
        self._class_dump.unlink(missing_ok=True)  # a JVM killed while it wrote it leaves no usable archive

    def _keep_class_archive(self, process: subprocess.Popen[bytes] | None) -> None:
        """Moves the class archive the JVM wrote at exit into the cache, if it exited by itself on SIGTERM."""
        if not self._class_dump.exists():
            return
        target, self._class_dump_target = self._class_dump_target, None
        clean = process is not None and process.returncode is not None and process.returncode != -signal.SIGKILL
        if clean and target is not None and self._class_dump.stat().st_size > 0:
            staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")  # the cache may be on another file system
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self._class_dump, staged)
                os.replace(staged, target)  # atomic: a JVM starting now maps the old archive or the new one
            except OSError:  # no archive, then: the next broker starts without one and writes one in its turn
                staged.unlink(missing_ok=True)
        self._class_dump.unlink(missing_ok=True)

    def _served_ports(self) -> set[int]:
        return {self.port, self.controller_port, *([self.sasl_port] if self.sasl_users else [])}

    def _repick(self, taken: int) -> None:
        fresh = listen_port(frozenset({self.port, self.controller_port, self.sasl_port}))
        if taken == self.port:
            self.port = fresh
        elif taken == self.controller_port:
            self.controller_port = fresh
        else:
            self.sasl_port = fresh
        self._save_ports()

    def _save_ports(self) -> None:
        self._ports_path.write_text(f"{self.port} {self.controller_port} {self.sasl_port}\n")

    def _port_taken_at_launch(self) -> int | None:
        """The port the latest launch could not bind because another socket had it, if that is why it exited."""
        if self._launch_log_start is None:
            return None
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._launch_log_start)
                text = log.read().decode(errors="replace")
        except OSError:
            return None
        for match in re.finditer(r"failed to bind to [^\s:]*:(\d+): Address already in use", text):
            port = int(match.group(1))
            if port in (self.port, self.controller_port, self.sasl_port):
                return port
        return None

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Format storage on first start and launch the JVM."""
        self._launch_log_start = log.tell()
        java = java_executable()
        if java is None:
            raise BrokerError("java is not on PATH (Kafka 4.x needs Java 17+)")
        classpath = os.pathsep.join(str(jar) for jar in kafka_classpath())
        config = self.workdir / "server.properties"
        config.write_text(self._server_properties())
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        jvm = [java, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}", "-cp", classpath]
        if not (self.workdir / "data" / "meta.properties").exists():
            cluster_id = new_cluster_id()
            archive = class_archive(java, classpath)
            shared = [f"-XX:SharedArchiveFile={archive}", CDS_QUIET] if archive.exists() else []
            fmt = [*jvm[:2], "-Xmx256m", QUICK_JIT, *shared, *jvm[2:], "kafka.tools.StorageTool", "format"]
            done = subprocess.run([*fmt, "-t", cluster_id, "-c", str(config)], stdout=log, stderr=log)
            if done.returncode != 0:
                raise BrokerError(f"formatting Kafka storage failed:\n{self.log_tail()}")
        options = [HEAP, *([QUICK_JIT] if self.quick_jit else []), *self._class_archive_options(java, classpath)]
        return subprocess.Popen(
            [*jvm[:2], *options, *jvm[2:], "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    def _class_archive_options(self, java: str, classpath: str) -> list[str]:
        """Map the broker's classes from an archive (AppCDS) that an earlier broker wrote, else write one at exit.

        Loading Kafka's classes from their jars is most of a broker JVM's start-up; mapped from an archive, a start on a
        loaded two-core machine takes about half as long. A JVM that cannot use the archive (another JDK, say) ignores
        it and starts as without.
        """
        archive = class_archive(java, classpath)
        self._class_dump.unlink(missing_ok=True)
        if archive.exists():
            self._class_dump_target = None
            return [f"-XX:SharedArchiveFile={archive}", CDS_QUIET]
        self._class_dump_target = archive
        return [f"-XX:ArchiveClassesAtExit={self._class_dump}", CDS_QUIET]

    def _wait_ready(self, timeout_s: float) -> None:
        meta = (self.workdir / "data" / "meta.properties").read_text()
        cluster_id = next(line.split("=", 1)[1] for line in meta.splitlines() if line.startswith("cluster.id="))
        try:
            wait_serving(self.bootstrap, timeout_s, cluster_id, self._check_running)
        except NotServing as e:
            raise NotServing(f"{e}\n{self.log_tail()}") from None

    def _check_running(self) -> None:
        exited = self.exited_while_starting()
        if exited is not None:
            raise exited

    def _owns(self, args: str) -> bool:
        return str(self.workdir / "server.properties") in args  # a JVM running our config

    def _server_properties(self) -> str:
        plain, controller = f"PLAINTEXT://127.0.0.1:{self.port}", f"CONTROLLER://127.0.0.1:{self.controller_port}"
        sasl = [f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"] if self.sasl_users else []
        protocols = [
            "PLAINTEXT:PLAINTEXT",
            *(["SASL_PLAINTEXT:SASL_PLAINTEXT"] if sasl else []),
            "CONTROLLER:PLAINTEXT",
        ]
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": ",".join([plain, *sasl, controller]),
            "advertised.listeners": ",".join([plain, *sasl]),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(self.workdir / "data"),
            **SINGLE_NODE_SETTINGS,
            **self._authorizer_properties(),
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _authorizer_properties(self) -> dict[str, str]:
        """SASL/PLAIN users (test passwords: quotes and backslashes are not expected) and ACLs enforced."""
        if not self.sasl_users:
            return {}
        users = " ".join(f'user_{name}="{password}"' for name, password in self.sasl_users.items())
        return {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",  # the PLAINTEXT and CONTROLLER listeners: the harness and the node itself
            "allow.everyone.if.no.acl.found": "false",
        }


class BrokerProbe:
    """Proves step by step that a broker serves what a client needs first, each step retried until it succeeds.

    A broker that answers metadata requests may not yet create topics, elect a new partition's leader, hand out
    producer ids (COORDINATOR_LOAD_IN_PROGRESS) or coordinate a group (COORDINATOR_NOT_AVAILABLE while the offsets topic
    is created or loaded); every such first request then waits on librdkafka's retries, which on a loaded machine may
    take longer than the caller allows. So the probe does each of them once: it connects, checks the cluster id,
    creates PROBE_TOPIC, waits for its leader, produces a record idempotently with acks=all, and reads one back in a
    new consumer group that commits its offset.
    """

    def __init__(self, bootstrap: str, cluster_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.cluster_id = cluster_id
        self.problem = "not probed yet"  # why the broker does not serve yet, for an error message
        self._steps: list[Callable[[float], bool]] = [
            self._connects,
            self._answers_metadata,
            self._has_probe_topic,
            self._probe_topic_has_leader,
            self._accepts_a_record,
            self._serves_a_group,
        ]
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None
        self._delivered: KafkaError | Message | None = None
        self._consumer: Consumer | None = None

    @property
    def passed(self) -> bool:
        return not self._steps

    def step(self, timeout_s: float) -> bool:
        """Tries the first step not passed yet for at most about `timeout_s`: whether it passed."""
        if self._steps and not self._steps[0](timeout_s):
            return False
        if self._steps:
            self._steps.pop(0)
        return True

    def close(self) -> None:
        consumer, self._consumer, self._producer, self._admin = self._consumer, None, None, None
        if consumer is not None:
            consumer.close()

    def _connects(self, timeout_s: float) -> bool:
        host, _, port = self.bootstrap.split(",")[0].rpartition(":")
        try:  # a plain connect first: librdkafka logs every refused connection to stderr
            socket.create_connection((host, int(port)), timeout=min(timeout_s, 1.0)).close()
        except OSError as e:
            self.problem = f"no connection ({e})"
            return False
        return True

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, **PROBE_CLIENT})
        return self._admin

    def _answers_metadata(self, timeout_s: float) -> bool:
        if not self._connects(timeout_s):  # the port may belong to a process that is not (or no longer) the broker
            return False
        try:
            metadata = self._admin_client().list_topics(timeout=timeout_s)
        except KafkaException as e:
            self.problem = f"no metadata ({e})"
            return False
        if self.cluster_id is not None and metadata.cluster_id != self.cluster_id:  # another broker on the port
            self.problem = f"the broker there is of cluster {metadata.cluster_id}, not {self.cluster_id}"
            return False
        if not metadata.brokers:
            self.problem = "the metadata lists no broker (the broker is not unfenced yet)"
            return False
        return True

    def _has_probe_topic(self, timeout_s: float) -> bool:
        admin = self._admin_client()
        try:
            if PROBE_TOPIC in admin.list_topics(timeout=timeout_s).topics:
                return True
            future = admin.create_topics(
                [NewTopic(PROBE_TOPIC, 1, 1)], operation_timeout=timeout_s, request_timeout=timeout_s
            )[PROBE_TOPIC]
            future.result(timeout=timeout_s + 1)
        except KafkaException as e:
            if _code(e) == KafkaError.TOPIC_ALREADY_EXISTS:
                return True
            self.problem = f"cannot create topic {PROBE_TOPIC} ({e})"
            return False
        except TimeoutError:
            self.problem = f"creating topic {PROBE_TOPIC} takes longer than {timeout_s:g}s"
            return False
        return True

    def _probe_topic_has_leader(self, timeout_s: float) -> bool:
        try:
            topic = self._admin_client().list_topics(PROBE_TOPIC, timeout=timeout_s).topics.get(PROBE_TOPIC)
        except KafkaException as e:
            self.problem = f"no metadata for topic {PROBE_TOPIC} ({e})"
            return False
        partition = None if topic is None or topic.error is not None else topic.partitions.get(0)
        if partition is None or partition.error is not None or partition.leader < 0:
            self.problem = f"topic {PROBE_TOPIC} has no partition leader yet"
            return False
        return True

    def _accepts_a_record(self, timeout_s: float) -> bool:
        if self._producer is None or isinstance(self._delivered, KafkaError):
            self._producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    **PROBE_CLIENT,
                    "enable.idempotence": True,  # as keyload's producers: the first one needs a producer id
                    "acks": "all",
                    "message.timeout.ms": int(PROBE_ATTEMPT_S * 3 * 1000),
                }
            )
            self._delivered = None
            self._producer.produce(PROBE_TOPIC, uuid.uuid4().bytes, partition=0, on_delivery=self._on_delivery)
        self._producer.flush(timeout_s)
        if isinstance(self._delivered, Message):
            return True
        self.problem = f"a record to {PROBE_TOPIC} is not acknowledged" + (
            f" ({self._delivered.str()})" if self._delivered is not None else ""
        )
        return False

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        self._delivered = message if error is None else error

    def _serves_a_group(self, timeout_s: float) -> bool:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    **PROBE_CLIENT,
                    "group.id": f"{PROBE_TOPIC}-{uuid.uuid4().hex}",  # a group of its own: no member to wait for
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
            self._consumer.subscribe([PROBE_TOPIC])
        deadline = time.monotonic() + timeout_s
        self.problem = f"no record from {PROBE_TOPIC} in a consumer group (is the group coordinator there?)"
        while time.monotonic() < deadline:
            message = self._consumer.poll(max(min(1.0, deadline - time.monotonic()), 0.01))
            if message is None or message.error() is not None:
                continue
            try:
                committed = self._consumer.commit(message=message, asynchronous=False)
            except KafkaException as e:
                self.problem = f"the consumer group cannot commit ({e})"
                return False
            failed = [tp.error for tp in committed or [] if tp.error is not None]
            if failed:
                self.problem = f"the consumer group cannot commit ({failed[0]})"
                return False
            return True
        return False


def wait_serving(
    bootstrap: str, timeout_s: float, cluster_id: str | None = None, check: Callable[[], None] | None = None
) -> None:
    """Returns once the broker at `bootstrap` serves (BrokerProbe), else raises NotServing after `timeout_s`.

    `check` runs between attempts and may raise to give up early (the broker's process exited, say).
    """
    deadline = time.monotonic() + timeout_s
    probe = BrokerProbe(bootstrap, cluster_id)
    try:
        while not probe.passed:
            if check is not None:
                check()
            left = deadline - time.monotonic()
            if probe.step(max(min(PROBE_ATTEMPT_S, left), 0.1)):
                continue
            if time.monotonic() >= deadline:
                raise NotServing(f"Kafka on {bootstrap} does not serve after {timeout_s:g}s: {probe.problem}")
            time.sleep(PROBE_RETRY_S)
    finally:
        probe.close()


def _code(exc: KafkaException) -> object:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


def main(argv: list[str] | None = None) -> int:
    return cli(NativeBroker, argv, "python -m devtools.broker", __doc__)


if __name__ == "__main__":
    sys.exit(main())
