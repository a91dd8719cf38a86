"""The live one-at-a-time cycle's service CPU per message as settled messages pile up: it must stay flat.

    python -m bench.live [--messages N] [--window W] [--body-bytes B] [--json]

One `keyload run --data DIR --listen 127.0.0.1:0` child process serves a fresh data directory on the
embedded file log. One httpx.Client with the administrator's bearer token runs N cycles, one at a
time, against one queue: enqueue → receive(max_messages=1) → ack (bench.server's (b)). At most one
message is ever live; every other one has been settled, and what settling leaves behind (RocksDB
tombstones of deleted index rows, timers and bodies) piles up with N.

Every W cycles (a window) `keyload run`'s CPU is read from /proc: all its threads, and its main
thread alone, which runs the processors. The report shows the window ending at each decade mark
(1k, 10k, 100k, …) and the last window: the service's CPU per message, the main thread's, and wall
time per cycle. The reference is the median window of the first tenth of the run, measured in the
same run; the median window of the last tenth against it is flat when it stays within FLAT_RATIO
(medians, because one window of 1,000 cycles moves by a third with whatever else the machine does). A cost that grows
with the messages already settled (a scan walking the tombstones they left) shows as a ratio that
grows with N; with N ten times larger the work is then a hundred times larger.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from keyload import Client
from keyload.credentials import ADMIN_PRINCIPAL, Credential, credential_path

from .common import DOMAIN, QUEUE, BenchError, environment
from .server import CpuWatch, HttpPath, Messages, Server, run_cycles

DEFAULT_MESSAGES = 100_000
DEFAULT_WINDOW = 1_000
DEFAULT_BODY_BYTES = 1024
WARMUP = 50  # untimed cycles first: connections, imports, the queue's first records
FLAT_RATIO = 1.25  # the last tenth's median service CPU per message against the first tenth's, at most, to be flat
TENTH = 10  # the run is compared in its first and last 1/TENTH of windows


@dataclass(frozen=True)
class Window:
    """One window of cycles, ending after `through` timed messages."""

    through: int
    messages: int
    wall_s: float
    service_cpu_s: float
    main_cpu_s: float

    @property
    def service_us(self) -> float:
        return 1e6 * self.service_cpu_s / self.messages

    @property
    def main_us(self) -> float:
        return 1e6 * self.main_cpu_s / self.messages

    @property
    def wall_ms(self) -> float:
        return 1e3 * self.wall_s / self.messages


def measure(root: Path, messages: int, window: int, body_bytes: int) -> list[Window]:
    """Every window of the run, in order."""
    server = Server(root)
    try:
        client = Client(root)
        try:
            client.create_queue(DOMAIN, QUEUE)
        finally:
            client.close()
        token = Credential.load(credential_path(root, ADMIN_PRINCIPAL)).bearer_token
        http = HttpPath(server.url, token)
        source = Messages(body_bytes)
        try:
            run_cycles(http, source.take(WARMUP), None, server.pid)
            windows: list[Window] = []
            done = 0
            while done < messages:
                size = min(window, messages - done)
                cpu = CpuWatch(server.pid)
                start = time.perf_counter()
                run_cycles(http, source.take(size), None, server.pid)
                wall = time.perf_counter() - start
                spent = cpu.spent().server
                if spent is None:
                    raise BenchError("no /proc: the service's CPU cannot be read")
                done += size
                windows.append(Window(done, size, wall, spent[0], spent[1]))
                server.check_alive()
        finally:
            http.close()
    finally:
        status = server.stop()
    if status != 0:
        raise BenchError(f"`keyload run` exited with status {status}:\n{server.tail()}")
    return windows


def marked(windows: list[Window]) -> list[Window]:
    """The windows ending at each decade mark (the first one window's worth, then ten times as many), and the last."""
    chosen: list[Window] = []
    mark = windows[0].through
    for entry in windows:
        if entry.through >= mark:
            chosen.append(entry)
            mark *= 10
    if chosen[-1] is not windows[-1]:
        chosen.append(windows[-1])
    return chosen


@dataclass(frozen=True)
class Growth:
    """Median service CPU per message of the run's first and last tenth of windows."""

    first_us: float
    last_us: float

    @property
    def ratio(self) -> float:
        return self.last_us / self.first_us


def growth(windows: list[Window]) -> Growth:
    span = max(1, len(windows) // TENTH)
    return Growth(
        statistics.median(entry.service_us for entry in windows[:span]),
        statistics.median(entry.service_us for entry in windows[-span:]),
    )


def table(windows: list[Window], command: str, env: dict[str, Any]) -> str:
    first = windows[0]
    grown = growth(windows)
    lines = [
        f"keyload bench.live: one HTTP client, enqueue → receive(1) → ack one at a time, {windows[-1].through:,} "
        f"messages in windows of {first.messages:,}; python {env['python']}, {env['cpus']} cpus, "
        f"load {env['load_average_1m']:.2f}",
        "",
        f"{'window ending at message':>24} {'service µs/msg':>15} {'main µs/msg':>12} {'wall ms/cycle':>14} "
        f"{'/ first tenth':>14}",
    ]
    for entry in marked(windows):
        lines.append(
            f"{entry.through:>24,} {entry.service_us:>15,.0f} {entry.main_us:>12,.0f} {entry.wall_ms:>14.2f} "
            f"{entry.service_us / grown.first_us:>14.2f}"
        )
    verdict = "flat" if grown.ratio <= FLAT_RATIO else "NOT FLAT"
    lines += [
        "",
        f"(service: every thread of `keyload run`; main: its service thread, which runs the processors and "
        f"the HTTP API's event loop; "
        f"wall: per cycle of three requests, one at a time; {WARMUP} untimed cycles first)",
        f"service µs/msg, median window of the first tenth {grown.first_us:,.0f}, of the last tenth "
        f"{grown.last_us:,.0f}: {grown.ratio:.2f} times; flat is ≤ {FLAT_RATIO}: {verdict}",
        f"command: {command}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=DEFAULT_MESSAGES, help="timed cycles in all (default %(default)s)"
    )
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help="cycles per CPU reading (default %(default)s)"
    )
    parser.add_argument(
        "--body-bytes", type=int, default=DEFAULT_BODY_BYTES, help="message body size (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.window < 1 or args.messages < args.window or args.body_bytes < 1:
        parser.error("--window and --body-bytes must be ≥ 1, and --messages at least one window")
    command = shlex.join(["python", "-m", "bench.live", *(sys.argv[1:] if argv is None else argv)])
    work = Path(tempfile.mkdtemp(prefix="keyload-bench-live-", dir=args.dir))
    try:
        env = environment(WARMUP, work)
        windows = measure(work / "data", args.messages, args.window, args.body_bytes)
    except BenchError as exc:
        print(f"bench.live: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        grown = growth(windows)
        report = {
            "command": command,
            "environment": env,
            "flat_ratio": FLAT_RATIO,
            "windows": [
                {
                    **asdict(entry),
                    "service_us": entry.service_us,
                    "main_us": entry.main_us,
                    "ratio": entry.service_us / grown.first_us,
                }
                for entry in windows
            ],
            "first_tenth_us": grown.first_us,
            "last_tenth_us": grown.last_us,
            "ratio": grown.ratio,
        }
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print(table(windows, command, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
