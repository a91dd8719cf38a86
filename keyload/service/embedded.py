"""The service `keyload run` starts: processors, ticker, doorbell and GC worker over one data directory.

Embedded mode serves every partition of the file log from this process, or with
`--workers N` shares them with the worker processes it starts (`workers.py`); Kafka
mode joins the consumer group (`kafka.py`). Either way a halted
partition stops alone: the others keep serving, and the halt is recorded for
`keyload status` (`halts.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING

from keyload import limits
from keyload.credentials import ADMIN_PRINCIPAL
from keyload.errors import KeyloadError
from keyload.log.base import CommandLog, LogCorruption
from keyload.log.file_log import FileLog
from keyload.operations.catalog import CatalogEntry, CatalogError
from keyload.operations.checkpoints import Announcer, CheckpointPolicy, Checkpoints
from keyload.operations.gc import DEFAULT_GC_INTERVAL_S, GcWorker, LocalRetention, run_worker
from keyload.processors.access import policy_epoch
from keyload.processors.features import feature_level
from keyload.projections.store import ProjectionMemory, Store, use_projection_memory
from keyload.sdk.client import Client
from keyload.server.writer import OutcomeWaiters
from keyload.service import access_control
from keyload.service.checkpoint_uploads import CheckpointUploads
from keyload.service.doorbell import Listener
from keyload.service.halts import Halt, clear_halt, record_halt, recorded_halts
from keyload.service.kafka import DEFAULT_SESSION_TIMEOUT_MS, KafkaService
from keyload.service.outcome_retention import OutcomeRetention
from keyload.service.prctl import name_os_thread
from keyload.service.runtime import PartitionProcessor, Stalled, first_record_ms, run_until, wall_clock_ms
from keyload.service.system_commands import feature_level_command
from keyload.service.ticker import DEFAULT_TICK_INTERVAL_MS, Ticker
from keyload.service.workers import DEFAULT_WORKERS, Ownership, Reporter, WorkerFailed, WorkerPool
from keyload.storage.datadir import DataDir
from keyload.storage.principals import (
    CHECKPOINTER_PRINCIPAL,
    GC_PRINCIPAL,
    TICKER_PRINCIPAL,
    ensure_system,
    system_credential,
)

if TYPE_CHECKING:  # the server is imported when one is served: a worker process serves none
    from keyload.server.runner import HttpServer, Listen

IDLE_WAIT_S = 0.1  # with a doorbell, an idle service wakes at once for clients and at least this often
GC_CLIENT_TIMEOUT_S = 2.0  # the in-service GC worker's outcome wait: short, so a stopping service is not held up
SERVICE_THREAD = "keyload-service"  # the thread of the embedded service's processors and HTTP API
SERVICE_JOIN_S = 0.5  # the calling thread waits for it this long at a time, taking signals between
RUN_LOCK = "run.lock"  # held (flock) by the process serving the directory, which writes its pid into it

log = logging.getLogger(__name__)


class AlreadyServed(KeyloadError):
    """Another `keyload run` serves the data directory."""


@dataclass(frozen=True)
class ServiceSettings:
    """How `keyload run` serves a data directory."""

    checkpoints: CheckpointPolicy
    tick_interval_ms: int = DEFAULT_TICK_INTERVAL_MS
    gc_interval_s: float = DEFAULT_GC_INTERVAL_S  # 0: no GC worker beside the processors
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS  # Kafka mode's consumer-group session
    until_idle: bool = False  # stop once every partition is caught up (tests, batch jobs)
    listen: Listen | None = None  # where the HTTP API is served (embedded mode); None: not served
    fail_fast: bool = False  # exit on a write that fails (a full disk) instead of retrying until it succeeds
    memory: ProjectionMemory = field(default_factory=ProjectionMemory)  # what its projections may hold in memory
    workers: int = DEFAULT_WORKERS  # processes serving the embedded log's partitions (workers.py)


class _GcBeside:
    """The GC worker as a thread of an embedded `keyload run`: it reads retention from the live
    projections and appends only the commands that change something."""

    def __init__(self, data: DataDir, stores: Mapping[int, Store], interval_s: float) -> None:
        credential = system_credential(data.root, GC_PRINCIPAL)
        self.client = Client(data.root, credential=credential, timeout_s=GC_CLIENT_TIMEOUT_S)
        self.checkpoints = data.checkpoints()
        self.halt = Event()
        self.worker = GcWorker(LocalRetention(self.client, stores), self.checkpoints, partitions=sorted(stores))
        self.thread = threading.Thread(target=run_worker, args=(self.worker, self.halt, interval_s), daemon=True)
        self.thread.start()

    def stop(self, processors: list[PartitionProcessor]) -> None:
        """End the worker's pass, applying the commands it still appends, so the service stops caught up."""
        self.halt.set()
        while self.thread.is_alive():
            if not sum(_step_unless_stalled(processor) for processor in processors):
                self.thread.join(0.005)
        self.worker.close()
        self.client.close()
        self.checkpoints.close()


def _settle_checkpoints(uploads: CheckpointUploads, processors: list[PartitionProcessor]) -> None:
    """Wait (bounded) for the checkpoints still being published and announce those that were: the
    announcements are applied at the next start, as any record past the last group is (§10a)."""
    uploads.close()
    for processor in processors:
        processor.settle_checkpoints()


def _file_log(log: CommandLog) -> FileLog:
    assert isinstance(log, FileLog), "an embedded data directory's logs are files"
    return log


def _newest_checkpoint(checkpoints: Checkpoints, partition: int) -> CatalogEntry | None:
    """The partition's newest published checkpoint; None, said once, when its catalog cannot be read
    (the partition serves all the same: its periodic checkpoints count from the log's start)."""
    try:
        return checkpoints.latest(partition)
    except CatalogError as exc:
        log.warning("partition %d: periodic checkpoints count from the log's start: %s", partition, exc)
        return None


def _step_unless_stalled(processor: PartitionProcessor) -> int:
    """Step `processor`; a stalled one (a full disk) applies nothing, and what it has not applied
    waits for the next start."""
    try:
        return processor.step()
    except Stalled:
        return 0


def serve(data: DataDir, settings: ServiceSettings, stop: Event) -> list[Halt]:
    """Serve `data` until `stop` is set; returns the partitions that halted."""
    use_projection_memory(settings.memory)
    with serving(data.root):
        ensure_system(data.root)  # a directory made before access control gets its principals' keys now
        for partition in range(data.partitions):
            clear_halt(data.root, partition)  # a partition that halts again records it again
        with data.checkpoints() as checkpoints:
            checkpoints.clear_abandoned_takes()
        if data.kafka is not None:
            return _serve_kafka(data, settings, stop)
        return _on_service_thread(lambda: _serve_embedded(data, settings, stop), stop)


def _on_service_thread(run: Callable[[], list[Halt]], stop: Event) -> list[Halt]:
    """`run()` on a thread of its own, the service thread, while the calling thread waits for it
    (and, as the main thread, takes the signals that set `stop`; an exception there, such as a
    KeyboardInterrupt, stops the service first and is raised once it has stopped). The embedded service's processors
    and its HTTP server's event loop share that thread; off the main thread, because uvloop on the
    main thread sets up its signal self-pipe (a socket pair, a wakeup fd, a reader) every time the
    loop starts to run, and the processors start it for every turn they give the server
    (bench/README.md, "One thread", measures both forms)."""
    ended: list[list[Halt] | BaseException] = []

    def body() -> None:
        name_os_thread(SERVICE_THREAD)
        try:
            ended.append(run())
        except BaseException as exc:  # raised again on the calling thread
            ended.append(exc)

    thread = threading.Thread(target=body, name=SERVICE_THREAD)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(SERVICE_JOIN_S)
    except BaseException:
        stop.set()
        thread.join()
        raise
    [outcome] = ended
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def is_served(root: Path) -> bool:
    """Whether the process that last served the directory is alive: the pid its run lock file
    names. A diagnosis only (a reused pid reads as served); it takes no lock, so a `keyload run`
    starting meanwhile is never refused for it."""
    try:
        pid = int((root / RUN_LOCK).read_text("ascii").strip() or "0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


@contextmanager
def serving(root: Path) -> Iterator[None]:
    """Hold the directory's run lock while serving it: one service per data directory."""
    fd = os.open(root / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise AlreadyServed(f"{root} is already served by process {pid}") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


class AccessControlOff(KeyloadError):
    """A partition refused to turn access control on; the service does not serve it open."""


def _turn_access_control_on(data: DataDir, log: CommandLog, processors: list[PartitionProcessor]) -> None:
    """Append EnableAccessControl to every partition that has not applied one and apply each of
    them up to it, before anything is served: a partition still without a policy epoch then (its
    EnableAccessControl refused: see `keyload status`, or the log's record) stops the service
    rather than let it serve unauthenticated commands. A partition whose log is damaged gets none: it
    is applied up to the damage and halts there, serving nothing (a projection moved aside over a
    damaged log is rebuilt so; the others are served)."""
    off = [processor for processor in processors if policy_epoch(processor.store) is None]
    ends: dict[int, int] = {}
    for processor in off:
        with contextlib.suppress(LogCorruption):
            ends[processor.partition] = log.end_offset(processor.partition)
    access_control.enable(data.root, log, sorted(ends))
    for processor in off:
        end = ends.get(processor.partition)
        while (end is None or processor.applied_offset < end) and processor.step():
            pass
        if processor.halt is None and policy_epoch(processor.store) is None:
            raise AccessControlOff(
                f"partition {processor.partition} did not turn access control on (its EnableAccessControl at "
                f"offset {end} was refused); it is not served open"
            )


class FeatureLevelAhead(KeyloadError):
    """A partition's projection is at a feature level this processor does not know (a newer
    keyload wrote it): applying more records under older semantics would fork its state."""


def _raise_feature_levels(data: DataDir, log: CommandLog, processors: list[PartitionProcessor]) -> None:
    """Append RaiseFeatureLevel to every partition below the highest level this processor knows
    and apply each up to it (processors/features.py). A partition whose log is damaged gets none
    (it halts at the damage, as it would have); one whose raise was refused (the administrator
    principal lost its grant) is reported and served at its level."""
    admin = system_credential(data.root, ADMIN_PRINCIPAL)
    raised: dict[int, int] = {}
    for processor in processors:
        level = feature_level(processor.store)
        if level > limits.FEATURE_LEVEL:
            raise FeatureLevelAhead(
                f"partition {processor.partition} is at feature level {level}, above the {limits.FEATURE_LEVEL} "
                "this keyload knows: run the keyload that raised it"
            )
        if level < limits.FEATURE_LEVEL:
            with contextlib.suppress(LogCorruption):
                raise_ = feature_level_command(admin, processor.partition, data.partitions)
                [position] = log.append(processor.partition, [raise_])
                raised[processor.partition] = position.offset
    for processor in processors:
        offset = raised.get(processor.partition)
        if offset is None:
            continue
        while processor.applied_offset < offset and processor.step():
            pass
        if processor.halt is None and feature_level(processor.store) < limits.FEATURE_LEVEL:
            print(
                f"keyload: partition {processor.partition} stays at feature level {feature_level(processor.store)}: "
                f"its RaiseFeatureLevel at offset {offset} was refused (is keyload-admin still an administrator?)",
                file=sys.stderr,
                flush=True,
            )


def _serve_embedded(data: DataDir, settings: ServiceSettings, stop: Event) -> list[Halt]:
    """Every partition from this process, or with `--workers N` those of worker 0, the others from
    the worker processes this one starts (workers.py)."""
    ownership = Ownership(settings.workers, data.partitions)
    if settings.workers == 1:
        halts = serve_partitions(data, settings, stop, ownership.owned(0))
        print("keyload: stopped", flush=True)
        return halts
    pool = WorkerPool(data, settings, ownership, reply_partition(data), stop)
    pool.start()
    try:
        halts = serve_partitions(data, settings, stop, ownership.owned(0), pool=pool)
        if settings.until_idle:
            pool.finish()
    except BaseException:
        with contextlib.suppress(WorkerFailed):  # what is raised already says why the service stops
            pool.stop()
        raise
    pool.stop()
    print("keyload: stopped", flush=True)
    # The workers' halts are those recorded in their partitions' halt files (`serve` cleared them all).
    recorded = recorded_halts(data.root)
    elsewhere = [recorded[p] for p in range(data.partitions) if ownership.owner(p) != 0 and p in recorded]
    return sorted([*halts, *elsewhere], key=lambda halt: halt.partition)


def reply_partition(data: DataDir) -> int:
    """The reply partition of the outcome stream a server reads, when it reads one (Kafka mode, or
    beside worker processes): chosen at random, so two servers seldom read each other's answers."""
    return secrets.randbelow(data.outcome_partitions)


def serve_partitions(
    data: DataDir,
    settings: ServiceSettings,
    stop: Event,
    owned: Sequence[int],
    bell: str = "",
    *,
    pool: WorkerPool | None = None,
    reporter: Reporter | None = None,
) -> list[Halt]:
    """Serve the `owned` partitions of the embedded log until `stop` is set, woken through `bell`:
    the serving process (beside its workers' `pool`, if any, whose partitions its HTTP API serves
    too) or a worker process (`reporter`: no HTTP API). Each runs a GC worker for its partitions."""
    log = data.file_command_log()
    outcomes = data.outcome_log()
    checkpoints = data.checkpoints(settings.checkpoints)
    uploads = CheckpointUploads(lambda: data.checkpoints(settings.checkpoints))
    keys = data.keyring()
    stores: dict[int, Store] = {}
    announce = Announcer(log, system_credential(data.root, CHECKPOINTER_PRINCIPAL))
    # The server's commands to the partitions served here name no reply partition (answered in process);
    # those to its workers' partitions name the one it reads (`OutcomeFeed`).
    waiters = OutcomeWaiters(None if pool is None else pool.reply_partition, owned)
    try:
        processors = []
        for partition in owned:
            with contextlib.suppress(LogCorruption):  # its processor applies what precedes the damage, then halts
                log.repair(partition)
            store = stores[partition] = Store(data.projection(partition))
            newest = _newest_checkpoint(checkpoints, partition)
            processors.append(
                PartitionProcessor(
                    partition,
                    data.partitions,
                    log,
                    store,
                    outcomes,
                    checkpoints=checkpoints,
                    keyring=keys,
                    keyring_loader=data.keyring,
                    announce=announce,
                    on_published=waiters.published if reporter is None else reporter.published,
                    uploads=uploads,
                    newest_checkpoint=newest,
                    first_record_ms=first_record_ms(log, partition) if newest is None else None,
                )
            )
        _turn_access_control_on(data, log, processors)
        _raise_feature_levels(data, log, processors)
        if pool is not None:
            pool.wait_ready()
        ticker = Ticker(log, system_credential(data.root, TICKER_PRINCIPAL), settings.tick_interval_ms)
        try:
            listener = Listener(data.root, bell)
        except OSError as exc:
            raise KeyloadError(f"another `keyload run` serves {data.root} ({exc.strerror})") from None
        collector = None
        retention: OutcomeRetention | None = None
        http: HttpServer | None = None
        processing = _Beside({processor.partition: processor for processor in processors}, pool)
        try:
            idle: Callable[[float], object] = listener.wait if pool is None else pool.bells.passing_on(listener.wait)
            if reporter is not None:
                reporter.ready(processors)
                idle = reporter.idle(processors, idle)
            else:  # the serving process speaks for its workers
                applied = sorted(processing.applied_offsets().items())
                positions = ", ".join(f"p{partition}@{offset}" for partition, offset in applied)
                print(f"keyload: serving {data.root} ({_served(data, pool)}; applied {positions})", flush=True)
            if settings.listen is not None:
                from keyload.server.runner import HttpServer

                reads = {processor.partition: processor.reads for processor in processors}
                http = HttpServer.embedded(data, settings.listen, stores, reads, waiters, processing, listener, pool)
                http.start()
                idle = http.turn
                print(f"keyload: HTTP API on {http.url}", flush=True)
            if settings.gc_interval_s > 0:
                collector = _GcBeside(data, stores, settings.gc_interval_s)
            if reporter is None:  # the serving process keeps the outcome stream for every partition
                retention = OutcomeRetention(_file_log(data.outcome_log()), wall_clock_ms)
                retention.start()
            halts = run_until(
                processors,
                stop if http is None else http.drained_after(stop),
                ticker,
                idle_exit=settings.until_idle,
                idle=idle,
                idle_min_s=IDLE_WAIT_S,
                idle_max_s=IDLE_WAIT_S,
                on_halt=lambda halt: record_halt(data.root, halt),
                fail_fast=settings.fail_fast,
            )
        finally:
            try:
                if collector is not None:
                    collector.stop(processors)
                _settle_checkpoints(uploads, processors)
            finally:
                if retention is not None:
                    retention.stop()
                if http is not None:
                    http.stop()
                listener.close()
        if reporter is not None:  # the last pass's progress (an `--until-idle` run ends without an idle wait)
            reporter.report(processors)
        return halts
    finally:
        uploads.close(wait_s=0)  # drained already, unless serving ended early
        for store in stores.values():
            store.close()
        log.close()
        outcomes.close()
        checkpoints.close()


def _served(data: DataDir, pool: WorkerPool | None) -> str:
    return f"{data.partitions} partitions" + ("" if pool is None else f", {pool.ownership.workers} workers")


@dataclass(frozen=True)
class _Beside:
    """The embedded server's view of the partitions' processors (keyload.server.processing): its
    own process's, and its workers' through their pool."""

    processors: dict[int, PartitionProcessor]
    pool: WorkerPool | None

    def applied_offsets(self) -> dict[int, int]:
        offsets = {} if self.pool is None else self.pool.applied_offsets()
        offsets.update({partition: processor.applied_offset for partition, processor in self.processors.items()})
        return offsets

    def halt_of(self, partition: int) -> str | None:
        processor = self.processors.get(partition)
        if processor is None:
            return None if self.pool is None else self.pool.halt_of(partition)
        return None if processor.halt is None else processor.halt.where

    def stall_of(self, partition: int) -> str | None:
        processor = self.processors.get(partition)
        if processor is None:
            return None if self.pool is None else self.pool.stall_of(partition)
        return processor.stall

    def poison_records(self, partition: int) -> int | None:
        processor = self.processors.get(partition)
        return None if processor is None else processor.poison_records


def _serve_kafka(data: DataDir, settings: ServiceSettings, stop: Event) -> list[Halt]:
    from keyload.server.runner import HttpServer

    # Each processor's server has a reply partition of its own choosing, so servers of the group do not
    # read one another's answers.
    waiters = OutcomeWaiters(reply_partition(data))
    service = KafkaService(
        data,
        data.checkpoints(settings.checkpoints),
        settings.tick_interval_ms,
        settings.session_timeout_ms,
        on_published=waiters.published,
    )
    print(
        f"keyload: serving {data.describe_log()} as group {service.group_id} ({data.partitions} partitions)", flush=True
    )
    http = None
    try:
        if settings.listen is not None:
            http = HttpServer.on_kafka(data, settings.listen, waiters, service)
            http.start()
            print(f"keyload: HTTP API on {http.url}", flush=True)
        halts = service.run(stop if http is None else http.drained_after(stop))
    finally:
        if http is not None:
            http.stop()
    print("keyload: stopped", flush=True)
    return halts
