"""What one client's connections may hold of the service: a bounded number of them, a request head
that arrives in time, and one of bounded size.

The HTTP API shares its process, its thread and its open files with the processors (runner.py),
so a client that opens connections and sends nothing, or sends a request head slowly or without
end, must not be able to stall the partitions. uvicorn's httptools protocol bounds none of it: it
keeps a connection that has not finished a request head for as long as the client likes (only an
idle keep-alive connection times out), takes header lines of any size (httptools joins a header
value chunk by chunk, so a value streamed for long costs the thread quadratic time), and accepts
connections until the process runs out of file descriptors, when the log's and RocksDB's files no
longer open either. `GuardedHttpProtocol` is that protocol with three bounds (the same idea as
nginx's `client_header_timeout`, `large_client_header_buffers` and `worker_connections`):

- at most `connection_limit()` connections at once: one more is answered 503 `Unavailable` and
  closed at once;
- a request head (request line and headers) within REQUEST_HEAD_TIMEOUT_S of the connection
  opening or of the request's first byte, else 408 `Timeout` and the connection is closed;
- a request head of at most MAX_REQUEST_HEAD_BYTES, else 431 `Validation` and the connection is
  closed.

Each refusal is the API's JSON error with `Connection: close`, counted in
`keyload_http_connections_refused_total{reason}` (`connections`, `head_timeout`, `head_too_large`);
`keyload_http_connections` is how many are open. A body is not timed: large payload uploads stream
for as long as they need, and the connection bound caps what slow bodies can hold.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from keyload.server.metrics import ServerMetrics

MAX_SERVED_CONNECTIONS = 10_000  # connections served at once, at most: the bound when open files allow more
REQUEST_HEAD_TIMEOUT_S = 30.0  # from a connection's opening, or a request's first byte, to its last header
MAX_REQUEST_HEAD_BYTES = 64 * 1024  # the request line and headers of one request
# The open-file limit is shared with the log, the projections (RocksDB keeps its files open), the
# object store and Kafka clients: connections may take at most this share of it.
CONNECTIONS_SHARE_OF_OPEN_FILES = 0.5

HEAD_TIMEOUT = ("Timeout", 408)
HEAD_TOO_LARGE = ("Validation", 431)
TOO_MANY_CONNECTIONS = ("Unavailable", 503)
REFUSALS = {HEAD_TIMEOUT: "head_timeout", HEAD_TOO_LARGE: "head_too_large", TOO_MANY_CONNECTIONS: "connections"}
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def raise_open_file_limit() -> None:
    """Raise the process's soft limit of open files to its hard limit (what Go's runtime does at
    start), so the default of many systems (1,024) does not bound the service below what the
    administrator allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def connection_limit(open_files: int) -> int:
    """The connections served at once under an open-file limit of `open_files` (RLIM_INFINITY: none)."""
    if open_files == resource.RLIM_INFINITY:
        return MAX_SERVED_CONNECTIONS
    return max(1, min(MAX_SERVED_CONNECTIONS, int(open_files * CONNECTIONS_SHARE_OF_OPEN_FILES)))


def guarded_protocol(metrics: ServerMetrics) -> type[GuardedHttpProtocol]:
    """The protocol of this process's server, its connection bound taken from the process's open-file
    limit (`keyload run` raises it when it starts: `raise_open_file_limit`), counting in `metrics`."""
    allowed = connection_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"connections_allowed": allowed, "metrics": metrics})


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection bound, a request head timeout and a request
    head size bound (the module docstring says why); `guarded_protocol` binds the connection bound."""

    connections_allowed = MAX_SERVED_CONNECTIONS
    metrics: ServerMetrics | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = None  # bytes of a request head being read; None between heads

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.connections_allowed:
            self.transport = transport  # connection_lost closes it again
            self._refuse(
                TOO_MANY_CONNECTIONS,
                f"the server holds {self.connections_allowed} connections, its limit: retry later, "
                "or reuse a connection",
            )
            return
        super().connection_made(transport)
        if self.metrics is not None:
            self.metrics.connections.inc()
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.metrics is not None and self in self.connections:  # a refused one was never counted
            self.metrics.connections.dec()
        self._untime_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_bytes is not None and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
                self._refuse(HEAD_TOO_LARGE, f"the request line and headers are over {MAX_REQUEST_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._time_head()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._untime_head()
        super().on_headers_complete()

    def _time_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_S, self._head_timed_out)

    def _untime_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self._refuse(HEAD_TIMEOUT, f"no complete request line and headers within {REQUEST_HEAD_TIMEOUT_S:g} s")

    def _refuse(self, pair: tuple[str, int], detail: str) -> None:
        """Answer the API's JSON error (no command id: no request was read) and close."""
        code, status = pair
        if self.metrics is not None:
            self.metrics.connections_refused.labels(REFUSALS[pair]).inc()
        body = msgspec.json.encode({"status": "error", "error_code": code, "detail": detail, "command_id": None})
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))
        )
        self.transport.write(head + body)
        self.transport.close()
