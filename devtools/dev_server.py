"""Servers the project runs as child processes for development and tests: a Kafka broker
(devtools/broker.py) and an S3 server (devtools/s3_server.py).

Each keeps its pid, ports and log in a work folder, so `stop` works from another process
(`python -m devtools.broker stop DIR`), and leads its own process group, so a Ctrl-C in the
parent's terminal does not kill it behind the owner's back.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Self

LOG_TAIL_CHARS = 4000
KILL_WAIT_S = 10.0  # how long a SIGKILLed server may take to be gone


class DevServerError(RuntimeError):
    """The server could not be started or stopped; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DevServer(ABC):
    """One server process whose pid and log live in `workdir` (files named after `NAME`)."""

    NAME: str  # "broker", "s3-server": its log and pid files
    ERROR: type[DevServerError] = DevServerError
    START_TIMEOUT_S: float  # defaults of start() and stop()
    STOP_TIMEOUT_S: float

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir.resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.NAME}.log"
        self.pid_path = self.workdir / f"{self.NAME}.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    @abstractmethod
    def address(self) -> str:
        """What clients connect to (a bootstrap, an endpoint URL)."""

    @abstractmethod
    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start the process (in its own session), its output going to `log`."""

    @abstractmethod
    def _wait_ready(self, timeout_s: float) -> None:
        """Return once the server answers as itself; raise ERROR on exit or timeout."""

    @abstractmethod
    def _owns(self, args: str) -> bool:
        """Whether a process with this command line is this server (a stale pid file's pid may not be)."""

    def start(self, timeout_s: float | None = None) -> None:
        running = self._pid()
        if running is not None:
            raise self.ERROR(f"a {self.NAME} (pid {running}) already runs in {self.workdir}; stop it first")
        with open(self.log_path, "ab") as log:
            self._proc = self._launch(log)
        self.pid_path.write_text(f"{self._proc.pid}\n")
        try:
            self._wait_ready(self.START_TIMEOUT_S if timeout_s is None else timeout_s)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM for a clean shutdown, SIGKILL if it takes longer than `timeout_s`."""
        pid = self._pid()
        if pid is None:
            return
        self._signal(pid, signal.SIGTERM)
        if not self._wait_exit(pid, self.STOP_TIMEOUT_S if timeout_s is None else timeout_s):
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, KILL_WAIT_S)
        self._forget()

    def kill(self) -> None:
        """SIGKILL, like a machine crash."""
        pid = self._pid()
        if pid is None:
            return
        self._signal(pid, signal.SIGKILL)
        self._wait_exit(pid, KILL_WAIT_S)
        self._forget()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log_path.exists() else ""

    def exited_while_starting(self) -> DevServerError | None:
        """The error to raise when the process this object started has already exited."""
        assert self._proc is not None
        if self._proc.poll() is None:
            return None
        return self.ERROR(f"{self.NAME} exited with code {self._proc.returncode} while starting:\n{self.log_tail()}")

    def _pid(self) -> int | None:
        """The process this object started, or else the live one recorded in the workdir (another process's start)."""
        if self._proc is not None:
            return self._proc.pid if self._proc.poll() is None else None
        if not self.pid_path.exists():
            return None
        pid = int(self.pid_path.read_text())
        # -ww: the whole command line (`ps` cuts it to $COLUMNS otherwise, and a JVM's is long)
        args = subprocess.run(["ps", "-ww", "-p", str(pid), "-o", "args="], capture_output=True, text=True).stdout
        return pid if self._owns(args) else None

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)  # the server leads its own process group

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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cli(
    open_server: Callable[[Path, int | None], DevServer], argv: list[str] | None, prog: str, doc: str | None
) -> int:
    """`start DIR` leaves the server running in the background and prints its address (also
    written to DIR/address); `stop DIR` ends it."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--port", type=int, help="port (default: the one used before, else a free one)")
    parser.add_argument("--timeout", type=float, help="seconds to wait (default: the server's)")
    args = parser.parse_args(argv)
    server = open_server(args.dir, args.port)
    try:
        if args.action == "start":
            server.start(args.timeout)
            (server.workdir / "address").write_text(f"{server.address}\n")
            print(server.address)
        else:
            server.stop(args.timeout)
    except DevServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
