"""Running the HTTP API beside the processors of `keyload run`.

Embedded, the server and the processors share one thread, the service thread: between processor
steps the runtime's idle wait (`HttpServer.turn`) runs the server's event loop, which serves
requests until the server appends commands, a local appender rings the doorbell (the loop watches
its socket), or the wait is over. One thread, so no request or outcome crosses threads, and no two
threads hand the GIL to each other at every syscall (bench/README.md, "One thread"). Requests do
not hold the loop long: the slow ones (payload uploads and reads, credentials, census, metrics) run
on worker threads, and the processors get the thread back between turns. On Kafka the server keeps
a thread of its own: the main thread blocks in the consumer's fetch.

The listening socket is bound before serving starts, so a port in use is an error of `keyload run`
itself, and port 0 picks a free one; `keyload run` binds it before it creates or opens the data
directory (`Listen.bound`), so that error leaves nothing behind. The address served is written to
DATA/server.json (0600) for local tools and tests, and removed when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import uvicorn
from starlette.routing import Route

from keyload.errors import KeyloadError
from keyload.log.base import CommandLog, LogError
from keyload.log.file_log import FileLogConfig, FsyncPolicy
from keyload.log.kafka_log import KafkaLog
from keyload.projections.store import Readable, Store
from keyload.server import openapi
from keyload.server.app import Engine, application
from keyload.server.auth import Authenticator
from keyload.server.census import census_route
from keyload.server.connections import MAX_SERVED_CONNECTIONS, guarded_protocol, open_file_connection_limit
from keyload.server.held import HeldProjections
from keyload.server.metrics import PartitionCollector, ServerMetrics
from keyload.server.payloads import payload_headers, payload_routes
from keyload.server.principals import credential_routes, credentials_refused
from keyload.server.processing import Processing
from keyload.server.writer import CommandWriter, Halted, OutcomeFeed, OutcomeTail, OutcomeWaiters
from keyload.service.doorbell import Listener
from keyload.service.workers import EDGE_BELL, WorkerPool
from keyload.storage.datadir import DataDir
from keyload.storage.keyring import LiveKeyring, write_private

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7411
ADDRESS_FILE = "server.json"  # DATA/server.json: {"url": ...} while a server runs
LISTEN_ENV = "KEYLOAD_LISTEN"  # the default of `keyload run --listen`
STARTUP_TIMEOUT_S = 30.0
SHUTDOWN_TIMEOUT_S = 10.0
DRAIN_S = 5.0  # on a stop, requests in flight have this long to get their outcomes before a 503
GRACEFUL_SHUTDOWN_S = 8  # connections still open this long after a stop are closed
WAIT_TURN_S = 0.01  # how often a start or stop looks whether the server is up (or down)
DRAIN_WATCH_S = 0.5  # how soon the drain watcher notices that the server was stopped without a drain
assert DRAIN_S < GRACEFUL_SHUTDOWN_S, "the 503s of a drain are written before uvicorn closes connections"
PassOn = Callable[[Collection[int] | None], frozenset[int] | None]  # workers.WorkerBells.pass_on


class ServerError(KeyloadError):
    """The HTTP API could not start (a port in use, a bad certificate)."""


@dataclass(frozen=True)
class Listen:
    """Where `keyload run` serves its HTTP API; TLS when given a certificate and its key."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_connections: int | None = None  # None: what the open-file limit allows (`connection_limit`)
    # Bound already (`bound`): the server serves on it rather than binding when it starts.
    bound_socket: socket.socket | None = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(
        cls,
        text: str,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        max_connections: int | None = None,
    ) -> Listen:
        """HOST:PORT (an IPv6 host in brackets); ValueError when malformed, or when `max_connections`
        is outside 1..what the open-file limit allows (it may lower the bound, never raise it)."""
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
            raise ValueError(f"--listen takes HOST:PORT, not {text[:64]!r}")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if tls_cert is not None and tls_key is not None:
            _tls_context(tls_cert, tls_key)  # a pair that does not load is found before anything is created
        if max_connections is not None and not 1 <= max_connections <= (ceiling := open_file_connection_limit()):
            raise ValueError(
                f"--max-connections must be 1..{ceiling} (at most {MAX_SERVED_CONNECTIONS:,} and half the "
                f"open-file limit), not {max_connections}"
            )
        return cls(host.strip("[]"), int(port), tls_cert, tls_key, max_connections)

    def tls(self) -> ssl.SSLContext | None:
        """The server's TLS: its certificate and key loaded, with the ssl module's defaults for a server."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return _tls_context(self.tls_cert, self.tls_key)

    def bound(self) -> Listen:
        """This address with its socket bound now: ServerError when it cannot be (a port in use)."""
        return replace(self, bound_socket=_bind(self))

    @property
    def scheme(self) -> str:
        return "http" if self.tls_cert is None else "https"


def _tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The TLS of a server with this certificate and key; ValueError when a file is missing or
    unreadable, they are no PEM of a matching pair, or the key is encrypted (OpenSSL would
    otherwise prompt for its passphrase on the terminal and block the service's start)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except _EncryptedKey:
        raise ValueError(
            f"--tls-key {key} is encrypted: keyload run takes an unencrypted key (keep its file 0600)"
        ) from None
    except OSError as exc:  # ssl.SSLError included
        raise ValueError(f"--tls-cert {cert} with --tls-key {key} cannot be loaded: {exc}") from None
    return context


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    """Asked for by OpenSSL only for an encrypted key: refused rather than prompted for."""
    raise _EncryptedKey


@dataclass(frozen=True)
class LogSide:
    """How the server reaches the log: the writer's log (an instance of its own), how it wakes the
    processors after appending, whether an append blocks (Kafka's acks), and, on Kafka, the
    outcomes topic it tails for answers."""

    open_log: Callable[[], CommandLog]
    wake: Callable[[Collection[int]], None]  # after appending to those partitions
    blocking: bool
    outcomes: Callable[[], CommandLog] | None = None
    # Embedded with worker processes: how the server reads their answers (`OutcomeFeed`).
    feed: Callable[[OutcomeWaiters, asyncio.AbstractEventLoop], OutcomeFeed] | None = None


class Rings:
    """The partitions appended to since the processors last looked, when the server shares their
    thread: the server's writer rings on the event loop after each append, local appenders (SDK,
    CLI, the GC worker) through the doorbell, whose socket the loop watches. Either ends the turn
    the loop is given (`HttpServer.turn`). With worker processes (`pass_on`, workers.py), the rings
    naming their partitions are passed on to them and end no turn here."""

    def __init__(self, listener: Listener, pass_on: PassOn | None = None) -> None:
        self.listener = listener
        self.pass_on = pass_on
        self._named: set[int] | None = set()  # None: a ring named none, look at every partition
        self._rung = False
        self.wakeup: asyncio.Future[None] | None = None  # the turn in progress, ended by a ring

    def ring(self, partitions: Collection[int]) -> None:
        """The server appended to `partitions` (its writer's `wake`)."""
        self._wake(partitions if self.pass_on is None else self.pass_on(partitions))

    def doorbell(self) -> None:
        """The doorbell's socket is readable: take its rings."""
        named = self.listener.wait(0)
        if named != frozenset():
            self._wake(named if self.pass_on is None else self.pass_on(named))

    def _wake(self, named: Collection[int] | None) -> None:
        if named is None:
            self._named = None
        elif not named:  # every partition rung is a worker's
            return
        elif self._named is not None:
            self._named.update(named)
        self._rung = True
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    @property
    def rung(self) -> bool:
        return self._rung

    def take(self) -> frozenset[int] | None:
        """What `Listener.wait` answers: the partitions rung since the last take (empty: none), or
        None for every partition."""
        named, self._named, self._rung = self._named, set(), False
        return None if named is None else frozenset(named)


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: on the main thread uvicorn would take SIGINT
    and SIGTERM from `keyload run`, whose own handlers set `stop`, which drains the server first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """The API server of one data directory: started by `start`, stopped by `stop`. `embedded`
    builds one that shares the caller's thread (turned by `turn`), `on_kafka` one on a thread of
    its own."""

    def __init__(
        self,
        data: DataDir,
        listen: Listen,
        engine: Engine,
        side: LogSide,
        routes: Sequence[Route],
        rings: Rings | None = None,
    ) -> None:
        self.data = data
        self.listen = listen
        self.engine = engine
        self.side = side
        self.rings = rings
        self._writer: CommandWriter | None = None
        self._tail: OutcomeTail | OutcomeFeed | None = None
        routes = [*routes, census_route(engine, data)]  # both kinds of service count the projections held here
        app = application(engine, self._on_start, self._on_stop, openapi.document(), routes)
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # uvicorn's records go to keyload's handler, in the service's --log-format
            access_log=False,
            # Nothing reads a request's client address or scheme, so X-Forwarded-* are not taken
            # either (uvicorn's default takes them from 127.0.0.1): one middleware less a request.
            proxy_headers=False,
            lifespan="on",
            # Bounded connections and request heads, and the TLS under them (connections.py), on
            # uvloop, whose TLS layer the guard's is.
            http=guarded_protocol(engine.metrics.connections, listen.tls(), listen.max_connections),
            loop="uvloop",
            ws="none",  # no WebSocket: an upgrade request is answered as a plain one
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        self._server = _Server(config)
        self._socket = _bind(listen) if listen.bound_socket is None else listen.bound_socket
        self._runner = asyncio.Runner(loop_factory=config.get_loop_factory())
        self._thread = None if rings else threading.Thread(target=self._run, name="keyload-http", daemon=True)
        self._task: asyncio.Task[None] | None = None  # serving on the caller's thread (the loop holds it weakly)
        self._failure: BaseException | None = None
        self._served = threading.Event()  # the server has ended (stopped, or failed)
        self._stopped = threading.Event()

    @classmethod
    def embedded(
        cls,
        data: DataDir,
        listen: Listen,
        stores: Mapping[int, Store],
        policies: Mapping[int, Readable],
        waiters: OutcomeWaiters,
        processing: Processing,
        listener: Listener,
        pool: WorkerPool | None = None,
    ) -> HttpServer:
        """The embedded service's server: the file log's writer, answered in process, on the
        thread of the processors, which turn it while they idle (`turn`) and which it wakes
        through `listener`'s rings; it holds every partition's projection, so it authenticates
        against the policy and serves payloads and credentials itself.

        `policies`: what a request to each partition is authenticated against. The service passes
        its processors' read caches (projections/read_cache.py), which hold the principals every
        request reads: the server's event loop turns on the processors' thread, between their
        groups, so it reads them as a processor would.

        With worker processes (`pool`, keyload/service/workers.py), `stores` and `policies` hold
        worker 0's partitions, partition 0 among them: a request to a worker's partition is
        authenticated against partition 0's policy (every partition holds every principal, §5a),
        and its processor decides again, against its own; its outcome comes through the outcome
        stream (`OutcomeFeed`)."""
        keyring = LiveKeyring(data.root)
        log = data.file_command_log()
        backlog = {partition: _end_or_nothing(log, partition) for partition in range(data.partitions)}
        projections = HeldProjections(data, stores, workers=pool is not None)
        metrics = ServerMetrics(PartitionCollector(log, processing, projections))
        engine = Engine(
            data.partitions,
            [policies.get(partition, policies[0]) for partition in range(data.partitions)].__getitem__,
            Authenticator(keyring),
            waiters,
            processing,
            metrics,
            backlog,
            projections,
            outcome_headers=payload_headers(keyring),
        )
        rings = Rings(listener, None if pool is None else pool.bells.pass_on)
        side = LogSide(
            lambda: data.file_command_log(FileLogConfig(segment_bytes=data.segment_bytes, fsync=FsyncPolicy.NONE)),
            rings.ring,
            blocking=False,
            feed=None if pool is None else partial(_feed, data, pool),
        )
        routes = [
            *credential_routes(engine, data.root, stores[0]),
            *payload_routes(engine, data, keyring, stores),
        ]
        return cls(data, listen, engine, side, routes, rings)

    @classmethod
    def on_kafka(
        cls,
        data: DataDir,
        listen: Listen,
        waiters: OutcomeWaiters,
        processing: Processing,
    ) -> HttpServer:
        """A Kafka processor's server: it produces to the command topic and tails its reply partition
        of the outcomes topic, whichever process owns a command's partition; the keyring alone
        authenticates at the edge (the processor decides the policy). It takes large payloads by
        their upload handles, and reads them by their read handles, from the shared object store."""
        settings = data.kafka_settings()
        projections = HeldProjections(data, {})
        metrics = ServerMetrics(PartitionCollector(KafkaLog.commands(settings), processing, projections))
        keyring = LiveKeyring(data.root)
        engine = Engine(
            data.partitions,
            _no_policy,
            Authenticator(keyring),
            waiters,
            processing,
            metrics,
            {},
            projections,
            outcome_headers=payload_headers(keyring),
        )
        side = LogSide(
            lambda: KafkaLog.commands(settings), _nothing, blocking=True, outcomes=lambda: KafkaLog.outcomes(settings)
        )
        return cls(data, listen, engine, side, [*credentials_refused(), *payload_routes(engine, data, keyring, {})])

    @property
    def url(self) -> str:
        """Where local tools reach the server: the host as `--listen` named it (a certificate may
        name only it), its address when it was one, and the port bound."""
        address, port = self._socket.getsockname()[:2]
        host = address if _is_address(self.listen.host) else self.listen.host
        shown = f"[{host}]" if ":" in host else host
        return f"{self.listen.scheme}://{shown}:{port}"

    def start(self) -> None:
        if self._thread is not None:
            self._thread.start()
        else:
            assert self.rings is not None
            loop = self._runner.get_loop()
            loop.add_reader(self.rings.listener.fileno(), self.rings.doorbell)
            self._task = loop.create_task(self._serve())
        self._wait_for(lambda: self._server.started, STARTUP_TIMEOUT_S)
        if not self._server.started:
            self.stop()
            raise ServerError(f"the HTTP API did not start on {self.url}: {self._failure or 'timed out'}")
        write_private(self.data.root / ADDRESS_FILE, (json.dumps({"url": self.url}) + "\n").encode())

    def turn(self, timeout_s: float) -> frozenset[int] | None:
        """The runtime's idle wait when the server shares its thread (`run_until(idle=...)`): serve
        requests until the server appends or the doorbell rings, or for `timeout_s` (0: take what is
        ready, without waiting); the partitions rung, as `Listener.wait` answers."""
        assert self.rings is not None, "a server on a thread of its own turns by itself"
        loop = self._runner.get_loop()
        if self.rings.rung or timeout_s <= 0:
            loop.run_until_complete(asyncio.sleep(0))
        else:
            self.rings.wakeup = wakeup = loop.create_future()
            timer = loop.call_later(timeout_s, _resolve, wakeup)
            try:
                loop.run_until_complete(wakeup)
            finally:
                timer.cancel()
                self.rings.wakeup = None
        return self.rings.take()

    def drained_after(self, stop: threading.Event) -> threading.Event:
        """An event set once `stop` is set and the server has drained (`drain`): the processors run
        until it is set, so that a request in flight when the service is told to stop gets its
        outcome rather than a 503."""
        drained = threading.Event()

        def watch() -> None:
            while not stop.wait(DRAIN_WATCH_S):
                if self._stopped.is_set():  # stopped without a drain (the service ended by itself)
                    return
            self.drain()
            drained.set()

        threading.Thread(target=watch, name="keyload-drain", daemon=True).start()
        return drained

    def drain(self) -> None:
        """Take no more requests (the listening socket closes, kept-alive connections close after
        their response) and let those in flight finish, for up to DRAIN_S while the processors still
        run (and, sharing their thread, turn the server); the ones still waiting then (a long poll)
        are answered 503: retry by command id. Called from a thread of its own."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.data.root / ADDRESS_FILE)
        self._server.should_exit = True
        self._served.wait(DRAIN_S)
        self._abandon()

    def stop(self) -> None:
        """Answer the requests still waiting 503 (retry by command id), then stop serving (once)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.data.root / ADDRESS_FILE)
        self._abandon()
        self._server.should_exit = True
        self._wait_for(self._served.is_set, SHUTDOWN_TIMEOUT_S)
        if self.rings is not None:  # the loop is this thread's: close it (a thread of its own closes its own)
            self._runner.get_loop().remove_reader(self.rings.listener.fileno())
            self._runner.close()
        self._socket.close()
        self.engine.metrics.close()

    def _abandon(self) -> None:
        """Answer 503 the requests still waiting for their outcomes or for their appends (a broker
        away): resubmit by command id. Thread-safe."""
        stopping = Halted("the service is stopping")
        self.engine.waiters.abandon(stopping)
        if self._writer is not None:
            self._writer.abandon(stopping)

    def _wait_for(self, condition: Callable[[], bool], timeout_s: float) -> None:
        """Until `condition()` holds or the server has ended, for up to `timeout_s`, turning the
        server meanwhile when it shares this thread."""
        deadline = time.monotonic() + timeout_s
        while not condition() and not self._served.is_set() and time.monotonic() < deadline:
            if self._thread is None:
                self._runner.get_loop().run_until_complete(asyncio.sleep(WAIT_TURN_S))
            else:
                self._served.wait(WAIT_TURN_S)

    def _run(self) -> None:
        with self._runner:
            self._runner.run(self._serve())

    async def _serve(self) -> None:
        try:
            await self._server.serve(sockets=[self._socket])
        except BaseException as exc:  # reported by start(); a running server's failure ends serving
            self._failure = exc
        finally:
            self._served.set()

    async def _on_start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._writer = CommandWriter(self.side.open_log(), loop, self.side.wake, blocking=self.side.blocking)
        self.engine.writer = self._writer
        self.engine.waiters.attach(loop, self.engine.key_in_force)
        if self.side.feed is not None:
            self._tail = self.side.feed(self.engine.waiters, loop)
        elif self.side.outcomes is not None:
            self._tail = OutcomeTail(self.side.outcomes(), self.engine.waiters)

    async def _on_stop(self) -> None:
        if self._tail is not None:
            self._tail.close()
        if self._writer is not None:
            self._writer.close()


def _feed(data: DataDir, pool: WorkerPool, waiters: OutcomeWaiters, loop: asyncio.AbstractEventLoop) -> OutcomeFeed:
    return OutcomeFeed(data.outcome_log(), waiters, Listener(data.root, EDGE_BELL), pool.answerable_below, loop)


def _resolve(wakeup: asyncio.Future[None]) -> None:
    if not wakeup.done():
        wakeup.set_result(None)


def _end_or_nothing(log: CommandLog, partition: int) -> int:
    """The partition's log end; 0 for a log that cannot be read (its processor halts on it: a halted
    partition does not hold readiness back)."""
    try:
        return log.end_offset(partition)
    except LogError:
        return 0


def _no_policy(_: int) -> None:
    return None


def _nothing(_: Collection[int]) -> None:
    return None


def _bind(listen: Listen) -> socket.socket:
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        return socket.create_server((listen.host, listen.port), family=family, backlog=1024)
    except OSError as exc:
        raise ServerError(
            f"cannot listen on {listen.host}:{listen.port}: {exc.strerror or exc} "
            f"(keyload run --listen HOST:PORT, or --listen none)"
        ) from None
