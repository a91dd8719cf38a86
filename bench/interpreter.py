"""What share of keyload's CPU is the Python interpreter's own work, and what share native code's.

    python -m bench.interpreter [--messages N] [--batches C] [--frequency HZ] [--json]

The hot-path issue asks, before anyone weighs a compiled core, what fraction of the CPU left is
interpreter overhead. `perf record` (Linux perf, cpu-clock sampling at HZ, default 999) samples the
on-CPU function of each thread, and each sample is put in one class by that function and the shared
object it is in:

  bytecode             libpython's `_PyEval_EvalFrameDefault`: the eval loop and the opcodes inlined
                       in it, the cost of running Python code as such
  interpreter runtime  the rest of libpython (or of the python executable, when it is linked in):
                       objects made and freed, dicts, strings, ints, calls, the garbage collector;
                       much of it a compiled core would still pay in some form
  RocksDB (rocksdict, libstdc++), msgspec, hashlib and OpenSSL (HMAC, SHA-256), uvloop and
  httptools, other extensions: the native libraries, by the file name of their shared object
  libc, kernel         memcpy and friends; system calls (write, fsync, futex) and page faults (the
                       kernel is sampled only where perf_event_paranoid allows it, or as root)

Interpreter overhead is bytecode + interpreter runtime. Four workloads:

(a) processor, cycle `1`: bench.cycle's QueueDriver on a fresh data directory (receive 1, Ack each,
            rounds of 500 messages, 1 KiB bodies), this process; perf is enabled only around
            PartitionProcessor.step() loops (perf's control fifo), so the client's work (encoding
            commands, appending, reading outcomes) is not sampled.
(b) processor, cycle `100`: the same with receive 100 + AckBatch.
(c) service, HTTP one at a time: a `keyload run --listen` child on a fresh data directory, sampled as
            a whole process (perf -p, every thread) while one httpx client runs enqueue → receive(1)
            → ack cycles, after WARMUP untimed ones.
(d) service, HTTP batched: the same server, sampled while the client runs batched cycles (a Batch of
            100 Enqueues → a Receive of 100 → an AckBatch of their tokens) in a domain of another
            partition, after WARMUP messages' worth of untimed ones.

N (default 10,000) is the messages of (a), (b) and (c); C (default 100) the batched cycles of (d).
perf's own sampling costs the sampled threads a little; no rate is reported, only shares.
Without `perf` on PATH (Debian: `apt-get install linux-perf`) the command says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import DOMAIN, QUEUE, BenchError, drive, environment
from bench.cycle import CYCLES, QueueDriver
from bench.server import (
    BATCH,
    BATCH_QUEUE,
    HttpPath,
    Messages,
    SdkPath,
    Server,
    run_batches,
    run_cycles,
    sdk_reply_partition,
    spare_domain,
)
from keyload import limits
from keyload.credentials import ADMIN_PRINCIPAL, Credential, credential_path
from keyload.sdk.results import QueuePolicySpec
from keyload.storage.datadir import DataDir

DEFAULT_MESSAGES = 10_000
DEFAULT_BATCHES = 100
DEFAULT_FREQUENCY_HZ = 999  # not a multiple of common timer rates, so samples do not beat with them
WINDOW = 500  # bench.cycle's rounds
BODY_BYTES = 1024
WARMUP = 200  # untimed messages of (c), and of (d)'s batched cycles, before perf is enabled
assert WARMUP % BATCH == 0, "(d) warms up on whole batched cycles"
PERF_ACK_S = 10.0  # perf acknowledges a command on its control fifo within this
PERF_POLL_S = 0.05  # how often a wait for perf's acknowledgement looks whether perf is still running
PERF_STOP_S = 60.0  # perf writes its samples out within this of SIGINT
TOP_SYMBOLS = 8  # of the interpreter runtime, named in the report
BYTECODE = "bytecode"
RUNTIME = "interpreter runtime"
INTERPRETER = (BYTECODE, RUNTIME)
# (class, what names its shared object), first match wins; libpython is classed by symbol first.
LIBRARIES = (
    ("fastavro", ("fastavro",)),
    ("RocksDB (rocksdict, libstdc++)", ("rocksdict", "libstdc++")),  # rocksdict alone links libstdc++
    ("msgspec", ("msgspec",)),
    ("hashlib, OpenSSL (HMAC, SHA-256)", ("libcrypto", "_hashlib", "libssl")),
    ("uvloop and httptools", ("uvloop", "httptools")),
    ("libc", ("libc.so", "libc-", "libm.so", "ld-linux")),
    ("kernel", ("[kernel", "[vdso]")),
)
OTHER_EXTENSIONS = "other extensions"
SITE_PACKAGES = "/site-packages/"
UNKNOWN = "unknown"
CLASSES = (BYTECODE, RUNTIME, *(name for name, _ in LIBRARIES), OTHER_EXTENSIONS, UNKNOWN)


def classify(dso: str, symbol: str) -> str:
    """The class of one sample, by the shared object its function is in and the function's name.
    The interpreter is libpython, or the python executable when it is linked in. A library is named
    by its file name, an extension module by its path inside site-packages (msgspec/_core…so)."""
    name = os.path.basename(dso)
    if name.startswith(("libpython", "python")):
        return BYTECODE if symbol == "_PyEval_EvalFrameDefault" else RUNTIME
    _, packaged, inside = dso.partition(SITE_PACKAGES)
    where = inside if packaged else name
    for label, marks in LIBRARIES:
        if any(mark in where for mark in marks):
            return label
    return OTHER_EXTENSIONS if name.endswith(".so") or ".so." in name else UNKNOWN


@dataclass
class Split:
    """The samples of one workload, by class, and the interpreter runtime's by function."""

    workload: str
    samples: Counter[str]
    runtime_symbols: Counter[str]

    @property
    def total(self) -> int:
        return sum(self.samples.values())

    def share(self, label: str) -> float:
        return self.samples[label] / self.total if self.total else 0.0

    @property
    def interpreter(self) -> float:
        return sum(self.share(label) for label in INTERPRETER)


class Perf:
    """`perf record` attached to every thread of `pid`, its events off until `enable()`; `split()`
    classes what it sampled. Enable and disable wait for perf's acknowledgement on its ack fifo.
    Both fifos are opened read-write here, as perf opens them, so that neither open waits for perf
    (which may exit before it opens them) and a read of the ack fifo never sees its end."""

    def __init__(self, pid: int, out: Path, frequency: int) -> None:
        self.out = out
        self._errors = out.with_suffix(".err")
        control, ack = out.with_suffix(".ctl"), out.with_suffix(".ack")
        for fifo in (control, ack):
            os.mkfifo(fifo)
        self._control = os.open(control, os.O_RDWR)
        self._ack = os.open(ack, os.O_RDWR | os.O_NONBLOCK)
        command = ["perf", "record", "-F", str(frequency), "-e", "cpu-clock", "-D", "-1"]
        command += ["--control", f"fifo:{control},{ack}", "-o", str(out), "-p", str(pid)]
        with self._errors.open("w") as errors:  # perf says "Events enabled" at each command: a file holds it all
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)

    def _send(self, command: str) -> None:
        os.write(self._control, f"{command}\n".encode())
        reply = b""
        deadline = time.monotonic() + PERF_ACK_S
        while b"ack\n" not in reply:  # perf writes "ack\n" and a NUL
            if self.process.poll() is not None:
                raise BenchError(f"perf record exited with {self.process.returncode}: {self._said()}")
            if time.monotonic() > deadline:
                raise BenchError(f"perf did not acknowledge {command!r} within {PERF_ACK_S:g} s: {self._said()}")
            if select.select([self._ack], [], [], PERF_POLL_S)[0]:
                reply += os.read(self._ack, 16)

    def _said(self) -> str:
        return self._errors.read_text(errors="replace")[-2000:].strip()

    def enable(self) -> None:
        self._send("enable")

    def disable(self) -> None:
        self._send("disable")

    def stop(self) -> None:
        """perf writes its samples out on SIGINT; killed if it has not within PERF_STOP_S."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(PERF_STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise BenchError(f"perf record did not stop within {PERF_STOP_S:g} s") from None
        finally:
            os.close(self._control)
            os.close(self._ack)
        if self.process.returncode not in (0, -signal.SIGINT):
            raise BenchError(f"perf record exited with {self.process.returncode}: {self._said()}")

    def split(self, workload: str) -> Split:
        script = subprocess.run(
            ["perf", "script", "-i", str(self.out), "-F", "ip,sym,dso"], capture_output=True, text=True
        )
        if script.returncode != 0:
            raise BenchError(f"perf script exited with {script.returncode}: {script.stderr[-2000:]}")
        samples: Counter[str] = Counter()
        runtime: Counter[str] = Counter()
        for line in script.stdout.splitlines():
            _, _, located = line.strip().partition(" ")  # "<ip> <function> (<shared object>)"
            if not located:
                continue
            symbol, _, dso = located.rpartition(" (")
            symbol = symbol.strip()
            label = classify(dso.rstrip(")"), symbol)
            samples[label] += 1
            if label == RUNTIME:
                runtime[symbol] += 1
        if not samples:
            raise BenchError(f"perf sampled nothing of {workload}")
        return Split(workload, samples, runtime)


@contextmanager
def sampled(pid: int, out: Path, frequency: int) -> Iterator[Perf]:
    perf = Perf(pid, out, frequency)
    try:
        yield perf
    finally:
        perf.stop()


def processor_split(cycle_name: str, messages: int, work: Path, frequency: int) -> Split:
    """(a)/(b): bench.cycle's cycle `cycle_name` in this process, perf on around its step() loops."""
    cycle = next(cycle for cycle in CYCLES if cycle.key == cycle_name)
    out = work / f"processor-{cycle_name}.data"
    driver = QueueDriver(work / f"cycle-{cycle_name}", cycle, BODY_BYTES, feature_level=limits.FEATURE_LEVEL)
    with sampled(os.getpid(), out, frequency) as perf:
        driver.profiler = perf  # enabled and disabled around each timed step() loop
        drive(driver, messages, WINDOW)
    return perf.split(f"processor, cycle `{cycle_name}` ({cycle.label})")


def service_splits(messages: int, batches: int, work: Path, frequency: int) -> list[Split]:
    """(c) and (d): one `keyload run` serving one httpx client, perf on around each workload's loop."""
    root = work / "service"
    server = Server(root)
    try:
        data = DataDir.open(root)
        batch_domain = spare_domain("bench-batch", data.partitions, [DOMAIN])
        sdk = SdkPath(root, sdk_reply_partition(data))
        try:
            sdk.client.create_queue(DOMAIN, QUEUE)
            sdk.client.create_queue(batch_domain, BATCH_QUEUE, QueuePolicySpec(receive_max_messages=BATCH))
        finally:
            sdk.close()
        http = HttpPath(server.url, Credential.load(credential_path(root, ADMIN_PRINCIPAL)).bearer_token)
        bodies = Messages(BODY_BYTES)

        def one_at_a_time(count: int) -> None:
            run_cycles(http, bodies.take(count), None, server.pid)

        def batched(count: int) -> None:
            run_batches(http, batch_domain, [bodies.take(BATCH) for _ in range(count // BATCH)], None, server.pid)

        workloads: list[tuple[str, Callable[[int], None], int]] = [
            ("service, HTTP one at a time (enqueue → receive 1 → ack)", one_at_a_time, messages),
            (f"service, HTTP batched ({BATCH} Enqueues → Receive {BATCH} → AckBatch)", batched, batches * BATCH),
        ]
        splits = []
        try:
            for index, (name, play, count) in enumerate(workloads):
                play(WARMUP)
                with sampled(server.pid, work / f"service-{index}.data", frequency) as perf:
                    perf.enable()
                    play(count)
                    perf.disable()
                server.check_alive()
                splits.append(perf.split(name))
        finally:
            http.close()
        return splits
    finally:
        if server.stop() != 0:
            raise BenchError(f"`keyload run` did not exit cleanly:\n{server.tail()}")


def table(splits: list[Split], env: dict[str, Any]) -> str:
    width = max(len(label) for label in CLASSES)
    lines = [
        "keyload bench.interpreter: where the CPU goes, by the function on CPU (perf, cpu-clock)",
        f"python {env['python']}, fastavro {env['fastavro']}, rocksdict {env['rocksdict']}, "
        f"{env['cpus']} cpus, load {env['load_average_1m']:.2f}",
        "",
        f"{'share of samples':{width}}" + "".join(f"{f'({chr(97 + i)})':>10}" for i in range(len(splits))),
    ]
    for label in CLASSES:
        if any(split.samples[label] for split in splits):
            lines.append(f"{label:{width}}" + "".join(f"{split.share(label) * 100:9.1f}%" for split in splits))
    lines.append(f"{'interpreter overhead':{width}}" + "".join(f"{s.interpreter * 100:9.1f}%" for s in splits))
    lines.append(f"{'samples':{width}}" + "".join(f"{split.total:10,}" for split in splits))
    lines.append("")
    for index, split in enumerate(splits):
        lines.append(f"({chr(97 + index)}) {split.workload}")
    lines.append("")
    lines.append(f"the interpreter runtime's top {TOP_SYMBOLS} functions, share of all samples:")
    for index, split in enumerate(splits):
        top = ", ".join(
            f"{name} {count / split.total * 100:.1f}%" for name, count in split.runtime_symbols.most_common(TOP_SYMBOLS)
        )
        lines.append(f"({chr(97 + index)}) {top}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.interpreter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES, help="(a), (b), (c) (default %(default)s)")
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES, help="(d) batched cycles (default %(default)s)")
    parser.add_argument("--frequency", type=int, default=DEFAULT_FREQUENCY_HZ, help="samples/s (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.messages < WINDOW or args.messages % WINDOW or args.batches < 1 or args.frequency < 1:
        parser.error(f"--messages must be a positive multiple of {WINDOW}, --batches and --frequency at least 1")
    if shutil.which("perf") is None:
        print("bench.interpreter needs Linux perf on PATH (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="keyload-bench-interpreter-") as tmp:
        work = Path(tmp)
        env = environment(WARMUP, work)
        splits = [processor_split(name, args.messages, work, args.frequency) for name in ("1", "100")]
        splits += service_splits(args.messages, args.batches, work, args.frequency)
    if args.json:
        print(
            json.dumps(
                {
                    "environment": env,
                    "workloads": [
                        {
                            "workload": split.workload,
                            "samples": split.total,
                            "shares": {label: split.share(label) for label in CLASSES},
                            "interpreter_overhead": split.interpreter,
                            "runtime_top": dict(split.runtime_symbols.most_common(TOP_SYMBOLS)),
                        }
                        for split in splits
                    ],
                },
                indent=2,
            )
        )
    else:
        print(table(splits, env))
        print(f"command: python -m bench.interpreter {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
