"""bench.server's Go HTTP client (bench/go/httpclient): the same workloads as its httpx client, at a
fraction of the client CPU, so that a run shows what the server gives rather than what a Python
client can ask of it.

The program is built from source with `go build` (standard library only: no module downloads) into
the bench's temporary directory, started once per server with the URL and the administrator's bearer
token, and fed one JSON job per line; it answers each with one JSON line (its main.go says how).
Without `go` on PATH there is no Go client, and bench.server says so.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import BenchError

SOURCE = Path(__file__).resolve().parent / "go" / "httpclient"
BUILD_TIMEOUT_S = 600.0  # a first build compiles the standard library's packages it uses
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Job:
    """What one job measured: wall and Go CPU seconds over its timed part, latencies by step (seconds)."""

    seconds: float
    cpu_s: float
    latencies: dict[str, list[float]]


def build(directory: Path) -> Path | None:
    """The client's binary, built into `directory`; None without `go` on PATH."""
    go = shutil.which("go")
    if go is None:
        return None
    binary = directory / "keyload-bench-httpclient"
    built = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=SOURCE,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if built.returncode != 0:
        raise BenchError(f"go build of {SOURCE} failed:\n{built.stderr[-4000:]}")
    return binary


class GoClient:
    """The Go client as a child process: one keep-alive connection for cycles (kept across jobs), one per
    client for each fan-in job. `statuses`: the HTTP statuses of every job's requests."""

    def __init__(self, binary: Path, url: str, token: str, errors: Path) -> None:
        self.errors = errors  # the child's stderr: a crash's trace, quoted when it stops answering
        with errors.open("w") as stderr:
            self.process = subprocess.Popen(
                [str(binary), url, token],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.statuses: Counter[int] = Counter()

    def _run(self, job: dict[str, Any]) -> Job:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it exited: the empty answer below says so, with its stderr
        line = self.process.stdout.readline()
        if not line:
            raise BenchError(
                f"the Go client exited ({self.process.poll()}) without answering a {job['kind']} job:\n"
                + self.errors.read_text(errors="replace")[-4000:]
            )
        answer = json.loads(line)
        if answer.get("error"):
            raise BenchError(f"Go client {job['kind']}: {answer['error']}")
        self.statuses.update({int(code): count for code, count in (answer["statuses"] or {}).items()})
        return Job(answer["seconds"], answer["cpu_s"], answer["latencies"])

    def cycles(self, domain: str, queue: str, messages: Sequence[tuple[str, str]]) -> Job:
        """enqueue → receive(max_messages 1) → ack of each (message id, base64 body), one at a time."""
        listed = [{"id": message_id, "body": body} for message_id, body in messages]
        return self._run({"kind": "cycles", "domain": domain, "queue": queue, "messages": listed})

    def fanin(
        self,
        domain: str,
        queue: str,
        warmup: int,
        clients: Sequence[Sequence[tuple[str, str]]],
        domains: Sequence[str] = (),
    ) -> Job:
        """Each client's first `warmup` Enqueues untimed, then all released together on the rest; with
        `domains`, client i enqueues to the queue of domains[i % len(domains)] instead of `domain`'s."""
        listed = [[{"id": message_id, "body": body} for message_id, body in mine] for mine in clients]
        job = {"kind": "fanin", "domain": domain, "queue": queue, "warmup": warmup, "clients": listed}
        return self._run({**job, "domains": list(domains)})

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # the child is gone already
                self.process.stdin.close()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
