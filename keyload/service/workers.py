"""`keyload run --workers N`: the embedded log's partitions served by N processes, one core each.

One process applies commands on one core, and the HTTP edge shares that core with it (§10a). With
N workers, worker w owns the partitions p with p % N == w: worker 0 is the serving process itself
(with the HTTP edge and the credential issuer), workers 1..N-1 are processes it starts. A
partition's log, projection, checkpoints, GC and halt file have one owner, which runs the same
processor as one process would: what a partition applies, and its digest, do not depend on N.

Between the processes there is only the data directory and:
- **rings**: appenders ring the serving process's bell, which passes the rings naming a worker's
  partitions on to that worker's bell (`WorkerBells`); the edge's writer wakes them the same way.
- **outcomes**: the edge's commands to a worker's partitions name the edge's reply partition; the
  worker publishes their outcomes to the outcome stream, as it does for local clients, and once
  they are committed says how far (`Progress.answered`) and rings the edge's bell; the edge reads
  its reply partition from where it left off (`OutcomeFeed`).
- **progress**: each worker writes its partitions' applied offsets and states (serving, halted,
  stalled) to shared memory, which the edge reads for /readyz, /metrics and the 503 of a request to
  a halted partition (`Progress`). Why a partition halted is in its halt file, as ever.
- **supervision** (`WorkerPool`): the serving process serves HTTP once every worker has turned
  access control on and raised its feature level; a worker killed by SIGKILL (the OOM killer, a
  kill -9) once ready is started again after `RESTART_PAUSE_S` and resumes from its projections;
  a worker that ends otherwise (an exception, as a process of its own would fail) stops the
  service. Workers die with the serving process (PR_SET_PDEATHSIG), so a kill -9 of `keyload run`
  leaves none holding a projection.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

from keyload import logs
from keyload.errors import KeyloadError
from keyload.service.doorbell import Doorbell
from keyload.service.halts import clear_halt, recorded_halts
from keyload.service.prctl import die_with_parent, name_os_thread

if TYPE_CHECKING:
    from keyload.service.embedded import ServiceSettings
    from keyload.service.runtime import PartitionProcessor
    from keyload.storage.datadir import DataDir

# One process unless asked: the serving process alone starts fastest and holds the whole of each
# partition's state for its HTTP edge; `--workers 2` needs a core per worker to pay (bench/workers.py).
DEFAULT_WORKERS = 1
WORKER_BELL = "worker-{}"  # the bell worker w listens on
EDGE_BELL = "edge"  # the bell the HTTP edge listens on for its outcomes
RESTART_PAUSE_S = 1.0  # before a killed worker is started again
STOP_WAIT_S = 30.0  # a stopping worker finishes its group and closes its projections; then it is killed
READY_POLL_S = 0.01  # how often the serving process looks whether its workers are ready
WORKER_NAME = "keyload-w{}"  # worker w's process name (`ps -o comm`, /proc/PID/comm)

SERVING, HALTED, STALLED, DOWN = 0, 1, 2, 3  # a partition's state in `Progress` (DOWN: its worker is restarting)

log = logging.getLogger("keyload.service.workers")


class WorkerFailed(KeyloadError):
    """A worker process failed (an exception, not a signal): the service stops, as one process would."""


@dataclass(frozen=True)
class Ownership:
    """Which worker owns which partition: partition p is worker p % N's, so the domains' partitions,
    spread by hash, spread evenly over the workers."""

    workers: int
    partitions: int

    def __post_init__(self) -> None:
        assert 1 <= self.workers <= self.partitions, "every worker owns a partition (`keyload run` checks --workers)"

    def owner(self, partition: int) -> int:
        return partition % self.workers

    def owned(self, worker: int) -> list[int]:
        return list(range(worker, self.partitions, self.workers))

    def named(self, worker: int) -> str:
        """`worker 1 (partitions 1, 3)`, as the service's lines name a worker."""
        return f"worker {worker} (partitions {', '.join(map(str, self.owned(worker)))})"


class Progress:
    """What the workers tell the edge, in shared memory with one writer per slot, so no lock (an
    aligned 8-byte store is atomic): each partition's applied offset and state, each worker's
    readiness, and the offset of the edge's reply partition below which every outcome the worker
    published there is committed (`answered`: the edge answers nothing of a worker's above it)."""

    def __init__(self, ownership: Ownership, context: SpawnContext) -> None:
        self.applied = context.Array("q", [-1] * ownership.partitions, lock=False)
        self.states = context.Array("b", ownership.partitions, lock=False)
        self.ready = context.Array("b", ownership.workers, lock=False)
        self.answered = context.Array("q", ownership.workers, lock=False)

    def report(self, processors: Sequence[PartitionProcessor]) -> None:
        for processor in processors:
            self.applied[processor.partition] = processor.applied_offset
            self.states[processor.partition] = (
                HALTED if processor.halt is not None else STALLED if processor.stall is not None else SERVING
            )


class WorkerBells:
    """Passes rings on to the workers that own the partitions they name."""

    def __init__(self, root: Path, ownership: Ownership) -> None:
        self.ownership = ownership
        self._bells = [Doorbell(root, WORKER_BELL.format(worker)) for worker in range(1, ownership.workers)]

    def pass_on(self, named: Collection[int] | None) -> frozenset[int] | None:
        """Ring the owners of the partitions in `named` (every worker, when None names every
        partition); what is left for the serving process's own processors."""
        if named is None:
            for bell in self._bells:
                bell.ring()
            return None
        own: set[int] = set()
        elsewhere: dict[int, list[int]] = {}
        for partition in named:
            owner = self.ownership.owner(partition)
            if owner == 0:
                own.add(partition)
            else:
                elsewhere.setdefault(owner, []).append(partition)
        for owner, partitions in elsewhere.items():
            self._bells[owner - 1].ring(partitions)
        return frozenset(own)

    def passing_on(self, wait: Callable[[float], frozenset[int] | None]) -> Callable[[float], frozenset[int] | None]:
        """The serving process's idle wait on its bell (`Listener.wait`), passing rings on."""

        def waiting(timeout_s: float) -> frozenset[int] | None:
            return self.pass_on(wait(timeout_s))

        return waiting

    def close(self) -> None:
        for bell in self._bells:
            bell.close()


class WorkerPool:
    """The serving process's side of its workers: starts and supervises them, passes rings on, and
    answers for their partitions what the edge asks of processors (keyload.server.processing)."""

    def __init__(
        self,
        data: DataDir,
        settings: ServiceSettings,
        ownership: Ownership,
        reply_partition: int,
        stop: threading.Event,
    ) -> None:
        self.data = data
        self.until_idle = settings.until_idle
        self.ownership = ownership
        self.reply_partition = reply_partition  # what the edge's commands to the workers' partitions name
        level, json = logs.settings()
        # A worker serves no HTTP API: the serving process does, for every partition.
        worker_settings = replace(settings, listen=None)
        self.assignment = Assignment(
            str(data.root), worker_settings, ownership, reply_partition, level, json, os.getpid()
        )
        self.bells = WorkerBells(data.root, ownership)
        self.failure: str | None = None
        self._stop = stop  # the service's: set when a worker fails
        self._context = multiprocessing.get_context("spawn")
        self.progress = Progress(ownership, self._context)
        self._remote = [p for p in range(ownership.partitions) if ownership.owner(p) != 0]
        self._processes: dict[int, BaseProcess] = {}
        self._halts: dict[int, str] = {}
        self._restarting: int | None = None  # the worker being started again after a kill
        self._stopping = threading.Event()
        # The workers stop when this pipe's one writing end is closed (a multiprocessing Event would
        # hang its setter on a worker killed while waiting on it).
        self._told, self._telling = self._context.Pipe(duplex=False)
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._supervise, name="keyload-workers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self) -> None:
        """Until every worker has turned access control on and raised its feature level (the edge
        may serve their partitions then), or the service is stopping; WorkerFailed when one failed."""
        while not all(self.progress.ready[1:]) and not self._stop.wait(READY_POLL_S):
            pass
        if self.failure is not None:
            raise WorkerFailed(self.failure)

    def finish(self) -> None:
        """`--until-idle`: until every worker has caught up and ended."""
        while (self._processes or self._restarting is not None) and not self._stop.wait(READY_POLL_S):
            pass

    def stop(self) -> None:
        """Stop the workers (each finishes its group and closes its projections); WorkerFailed when
        one had failed."""
        if not self._stopping.is_set():
            self._stopping.set()
            os.write(self._wake_write, b"\0")
            self._thread.join()
            os.close(self._wake_read)
            os.close(self._wake_write)
            self.bells.close()
        if self.failure is not None:
            raise WorkerFailed(self.failure)

    # -- what the edge asks of its partitions' processors (keyload.server.processing) ----------------

    def answerable_below(self, partition: int) -> int | None:
        """The reply-partition offset below which the outcomes of `partition`'s worker are committed
        (`Progress.answered`); None for the serving process's own partitions, answered in process."""
        owner = self.ownership.owner(partition)
        return None if owner == 0 else self.progress.answered[owner]

    def applied_offsets(self) -> dict[int, int]:
        return {partition: self.progress.applied[partition] for partition in self._remote}

    def halt_of(self, partition: int) -> str | None:
        if self.progress.states[partition] != HALTED:
            return None
        if partition not in self._halts:  # read once: a halt lasts as long as its worker runs
            halt = recorded_halts(self.data.root).get(partition)
            if halt is None:  # halted, its file not written yet: read again next time
                return "halted (see `keyload status`)"
            self._halts[partition] = halt.where
        return self._halts[partition]

    def stall_of(self, partition: int) -> str | None:
        state = self.progress.states[partition]
        if state == DOWN:
            return f"its worker {self.ownership.owner(partition)} was killed and is being started again"
        if state == STALLED:
            return f"worker {self.ownership.owner(partition)} cannot make a group durable (see its log)"
        return None

    # -- supervision, on a thread of its own (the workers' parent thread: they die when it ends) ----

    def _supervise(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # the workers are not watched any more: stop the service
            self.failure = f"the workers' supervisor failed: {exc!r}"
            self._stop.set()
            raise
        finally:
            self._stop_all()

    def _watch(self) -> None:
        for worker in range(1, self.ownership.workers):
            self._spawn(worker)
        while not self._stopping.is_set() and self._processes:
            by_sentinel = {process.sentinel: worker for worker, process in self._processes.items()}
            ended = multiprocessing.connection.wait([*by_sentinel, self._wake_read])
            for sentinel in ended:
                if sentinel in by_sentinel and not self._stopping.is_set():
                    self._ended(by_sentinel[sentinel])

    def _spawn(self, worker: int) -> None:
        self.progress.ready[worker] = 0
        process = self._context.Process(
            target=work,
            args=(self.assignment, worker, self.progress, self._told),
            name=f"keyload-worker-{worker}",
            daemon=True,
        )
        process.start()
        self._processes[worker] = process

    def _ended(self, worker: int) -> None:
        """A worker's process ended by itself: done (`--until-idle`), killed by SIGKILL once it was
        ready (started again), or failed."""
        process = self._processes[worker]
        process.join()  # its sentinel is readable: it has ended, reap it
        code = process.exitcode
        process.close()
        del self._processes[worker]
        if code == 0 and self.until_idle:
            return
        if code == -signal.SIGKILL and self.progress.ready[worker]:  # kill -9, the OOM killer
            log.warning("%s was killed: starting it again", self.ownership.named(worker))
            for partition in self.ownership.owned(worker):
                self.progress.states[partition] = DOWN
                self._halts.pop(partition, None)
            self._restarting = worker  # `finish` waits for it
            try:
                if not self._stopping.wait(RESTART_PAUSE_S):
                    self._spawn(worker)
            finally:
                self._restarting = None
            return
        how = f"exited with status {code}"
        if code is not None and code < 0:
            how = f"was ended by {signal.Signals(-code).name}"
            if code == -signal.SIGKILL:
                how += " before it was ready"  # started again, it would only be killed again
        self.failure = f"{self.ownership.named(worker)} {how}: see its log"
        self._stop.set()

    def _stop_all(self) -> None:
        """Tell every worker to stop; one that has not within STOP_WAIT_S of that is killed."""
        self._telling.close()
        deadline = time.monotonic() + STOP_WAIT_S
        for worker, process in self._processes.items():
            process.join(max(deadline - time.monotonic(), 0))
            if process.exitcode is None:
                log.error("worker %d did not stop within %ss: killed", worker, STOP_WAIT_S)
                process.kill()
                process.join()
            elif process.exitcode != 0 and self.failure is None:
                self.failure = f"{self.ownership.named(worker)} exited with status {process.exitcode} while stopping"
            process.close()
        self._processes.clear()
        self._told.close()


@dataclass(frozen=True)
class Assignment:
    """What every worker process of one `keyload run` is started with."""

    root: str
    settings: ServiceSettings  # a worker's: no HTTP API
    ownership: Ownership
    reply_partition: int  # the edge's: outcomes published to it ring the edge's bell
    log_level: int  # the serving process's logging (`--log-level`, `--log-format`)
    log_json: bool
    parent: int  # the serving process


class Reporter:
    """A worker's side: its partitions' progress for the edge, and, once outcomes it published to
    the edge's reply partition are committed, how far they go (`Progress.answered`) and a ring on
    the edge's bell: the edge answers a request only then, as one process answers after its step."""

    def __init__(self, data: DataDir, worker: int, progress: Progress, reply_partition: int) -> None:
        self.worker = worker
        self.progress = progress
        self.reply_partition = reply_partition
        self._outcomes = data.outcome_log()  # an instance of its own: for the reply partition's end
        self._edge = Doorbell(data.root, EDGE_BELL)
        self._owed = False  # outcomes for the edge were published since the last report

    def published(self, reply_partition: int | None, outcomes: list[bytes]) -> None:
        if reply_partition == self.reply_partition:
            self._owed = True

    def report(self, processors: Sequence[PartitionProcessor]) -> None:
        """Between steps (every group committed): the progress, then how far the edge may answer."""
        self.progress.report(processors)
        if self._owed:
            self._owed = False
            self.progress.answered[self.worker] = self._outcomes.end_offset(self.reply_partition)
            self._edge.ring()

    def ready(self, processors: Sequence[PartitionProcessor]) -> None:
        self.report(processors)
        self.progress.ready[self.worker] = 1

    def idle(
        self, processors: Sequence[PartitionProcessor], wait: Callable[[float], object]
    ) -> Callable[[float], object]:
        """The runtime's idle wait, reporting first (it is called between steps)."""

        def idle(timeout_s: float) -> object:
            self.report(processors)
            return wait(timeout_s)

        return idle

    def close(self) -> None:
        self._edge.close()
        self._outcomes.close()


def work(assignment: Assignment, worker: int, progress: Progress, told: Connection) -> None:
    """A worker process: serve `worker`'s partitions until the serving process tells it to stop."""
    from keyload.projections.store import use_projection_memory
    from keyload.service.embedded import serve_partitions
    from keyload.storage.datadir import DataDir

    # The serving process says when to stop (`told`), after it has drained its HTTP API, which
    # waits for answers from us: a ^C in a terminal, or a service manager's SIGTERM to every
    # process of the service, reaches it as well.
    for ignored in (signal.SIGINT, signal.SIGTERM):
        signal.signal(ignored, signal.SIG_IGN)
    die_with_parent()
    name_os_thread(WORKER_NAME.format(worker))
    if os.getppid() != assignment.parent:  # the serving process died before the line above took effect
        return
    logs.configure(assignment.log_level, assignment.log_json)
    stop = threading.Event()

    def relay() -> None:
        with contextlib.suppress(EOFError, OSError):
            told.recv_bytes()  # nothing is sent: it ends when the serving process closes its end
        stop.set()

    threading.Thread(target=relay, name="keyload-told", daemon=True).start()
    settings = assignment.settings
    owned = assignment.ownership.owned(worker)
    use_projection_memory(settings.memory)
    try:
        data = DataDir.open(assignment.root)
        for partition in owned:  # one that halts again records it again (as `serve` does at start)
            clear_halt(data.root, partition)
        reporter = Reporter(data, worker, progress, assignment.reply_partition)
        try:
            serve_partitions(data, settings, stop, owned, WORKER_BELL.format(worker), reporter=reporter)
        finally:
            reporter.close()
    except Exception as exc:  # one line, as `keyload run` reports its own failure; the pool stops the service
        what = str(exc) if isinstance(exc, KeyloadError) else f"{type(exc).__name__}: {exc}"
        log.error("%s failed: %s", assignment.ownership.named(worker), what)
        sys.exit(1)
