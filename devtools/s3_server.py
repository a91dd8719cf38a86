"""A real S3-compatible server (moto's, from PyPI: the `dev` extra) run as a child process, for tests and development.

`MotoS3Server(workdir)` runs `python -m moto.server` on a loopback port and returns once it answers S3 requests;
its pid, port and log live in `workdir`. Objects live in the server's memory: a restart starts empty.
From a shell: `python -m devtools.s3_server start DIR` (prints the endpoint URL) and `... stop DIR`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from devtools.dev_server import DevServer, DevServerError, cli, free_port


class S3ServerError(DevServerError):
    """The server could not be started or stopped; the message says why."""


def moto_server_available() -> str | None:
    """None when moto's server can run here, else the reason it cannot."""
    try:
        found = importlib.util.find_spec("moto.server") is not None and importlib.util.find_spec("flask") is not None
    except ImportError:
        found = False
    return None if found else "moto[server] is not installed (pip install -e '.[dev]')"


class MotoS3Server(DevServer):
    """One moto server process whose port, pid and log live in `workdir`, so `stop` works from another process."""

    NAME = "s3-server"
    ERROR = S3ServerError
    START_TIMEOUT_S = 30.0
    STOP_TIMEOUT_S = 10.0

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        super().__init__(workdir)
        port_path = self.workdir / "port"
        self.port = port or (int(port_path.read_text()) if port_path.exists() else free_port())
        port_path.write_text(f"{self.port}\n")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.endpoint

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        problem = moto_server_available()
        if problem is not None:
            raise S3ServerError(problem)
        return subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exited = self.exited_while_starting()
            if exited is not None:
                raise exited
            try:  # ListBuckets: an S3 answer, not just any server on the port
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as answer:
                    if b"ListAllMyBucketsResult" in answer.read():
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise S3ServerError(f"moto did not answer on {self.endpoint} within {timeout_s:g}s:\n{self.log_tail()}")

    def _owns(self, args: str) -> bool:
        return "moto.server" in args and str(self.port) in args


def main(argv: list[str] | None = None) -> int:
    return cli(MotoS3Server, argv, "python -m devtools.s3_server", __doc__)


if __name__ == "__main__":
    sys.exit(main())
