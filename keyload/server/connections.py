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

- at most `open_file_connection_limit()` connections at once (`keyload run --max-connections` may
  lower it): one more is answered 503 `Unavailable` and closed at once;
- a request head (request line and headers) within REQUEST_HEAD_TIMEOUT_S of the connection
  opening or of the request's first byte, else 408 `Timeout` and the connection is closed;
- a request head of at most MAX_REQUEST_HEAD_BYTES (`head_size`), else 431 `Validation` and the
  connection is closed.

Over TLS a connection counts from its accept, through its handshake (`TlsLayer`): asyncio's own TLS
layer hands a connection to the HTTP protocol only once its handshake is done, and never if it fails,
so handshakes that never end would hold open files uncounted. A handshake has REQUEST_HEAD_TIMEOUT_S;
a connection past the bound is closed before it (no answer can be read without one).

Each refusal is the API's JSON error with `Connection: close`, counted in
`keyload_http_connections_refused_total{reason}` (`connections`, `head_timeout`, `head_too_large`);
`keyload_http_connections` is how many are open. A body is not timed: large payload uploads stream
for as long as they need, and the connection bound caps what slow bodies can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import ssl
from dataclasses import dataclass
from typing import Any

import msgspec
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvloop.loop import SSLProtocol  # type: ignore[attr-defined]  # uvloop's stubs leave out its TLS layer

from keyload.server.metrics import ConnectionCounts

MAX_SERVED_CONNECTIONS = 10_000  # connections served at once, at most: the bound when open files allow more
REQUEST_HEAD_TIMEOUT_S = 30.0  # from a connection's opening, or a request's first byte, to its last header
MAX_REQUEST_HEAD_BYTES = 64 * 1024  # the request line and headers of one request, as `head_size` measures them
# A head still arriving is cut off once the reads after its first hold this much: a head under the
# bound may carry optional whitespace `head_size` does not count, so the bound while it arrives is
# looser, and no head is refused for how its bytes were split.
MAX_ARRIVING_HEAD_BYTES = 2 * MAX_REQUEST_HEAD_BYTES
assert MAX_ARRIVING_HEAD_BYTES > MAX_REQUEST_HEAD_BYTES
# The open-file limit is shared with the log, the projections (RocksDB keeps its files open), the
# object store and Kafka clients: connections may take at most this share of it.
CONNECTIONS_SHARE_OF_OPEN_FILES = 0.5
LINGER_S = 1.0  # a refused connection is closed this long after its answer, what the client sends dropped

HEAD_TIMEOUT = ("Timeout", 408)
HEAD_TOO_LARGE = ("Validation", 431)
TOO_MANY_CONNECTIONS = ("Unavailable", 503)
REFUSALS = {HEAD_TIMEOUT: "head_timeout", HEAD_TOO_LARGE: "head_too_large", TOO_MANY_CONNECTIONS: "connections"}
_HEAD_TOO_LARGE = f"the request line and headers are over {MAX_REQUEST_HEAD_BYTES} bytes"
_FRAMING_TOO_LARGE = f"a chunked body's framing and trailers are over {MAX_REQUEST_HEAD_BYTES} bytes"
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def raise_open_file_limit() -> None:
    """Raise the process's soft limit of open files to its hard limit (what Go's runtime does at
    start), so the default of many systems (1,024) does not bound the service below what the
    administrator allows. A limit the system refuses to raise (a hard limit above its own maximum)
    is left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def head_size(method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The bytes of a request line and headers as a client that writes one space after each colon
    sends them (`METHOD SP URL SP HTTP/1.1 CRLF`, `Name: value CRLF` each, a last CRLF): what the
    bound measures, the same however the head was split into reads (the parser keeps no count of the
    bytes it read, and drops the whitespace around a value)."""
    request_line = len(method) + 1 + len(url) + len(" HTTP/1.1\r\n")
    return request_line + sum(len(name) + len(": ") + len(value) + len("\r\n") for name, value in headers) + 2


def connection_limit(open_files: int) -> int:
    """The connections served at once under an open-file limit of `open_files` (RLIM_INFINITY: none)."""
    if open_files == resource.RLIM_INFINITY:
        return MAX_SERVED_CONNECTIONS
    return max(1, min(MAX_SERVED_CONNECTIONS, int(open_files * CONNECTIONS_SHARE_OF_OPEN_FILES)))


def open_file_connection_limit() -> int:
    """`connection_limit` under this process's open-file limit now: the default bound, and the
    highest `keyload run --max-connections` takes."""
    return connection_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


@dataclass
class ConnectionBound:
    """The connections one server holds, against its bound, counted in `counts`."""

    allowed: int
    counts: ConnectionCounts
    held: int = 0

    def take(self) -> bool:
        """Count one connection more, unless the bound is reached."""
        if self.held >= self.allowed:
            return False
        self.held += 1
        self.counts.open.inc()
        return True

    def give_back(self) -> None:
        self.held -= 1
        self.counts.open.dec()

    def refused(self, pair: tuple[str, int]) -> None:
        self.counts.refused.labels(REFUSALS[pair]).inc()


def guarded_protocol(
    counts: ConnectionCounts, tls: ssl.SSLContext | None = None, allowed: int | None = None
) -> type[GuardedHttpProtocol] | type[TlsLayer]:
    """The protocol of a server's connections, counting in `counts`, over `tls` if given: at most
    `allowed` at once, by default what the process's open-file limit allows (`keyload run` raises it
    when it starts: `raise_open_file_limit`). A server given this protocol is given no TLS of its own."""
    if allowed is None:
        allowed = open_file_connection_limit()
    bound = ConnectionBound(allowed, counts)
    guarded = type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"bound": bound})
    if tls is None:
        return guarded
    return type("TlsLayer", (TlsLayer,), {"http": guarded, "context": tls})


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection bound, a request head timeout and a request
    head size bound (the module docstring says why); `guarded_protocol` binds the connection bound.

    The head's size is checked once the head is complete (`head_size`), and while it is still
    arriving by the bytes of every read after the one it began in (all of them head bytes: the read
    that completes a head is checked once complete instead) against MAX_ARRIVING_HEAD_BYTES, so no
    request under the bound is refused, however split. A chunked body's framing and trailers are
    headers httptools joins the same way: reads that bring no body byte may add up to
    MAX_REQUEST_HEAD_BYTES."""

    bound: ConnectionBound  # bound by `guarded_protocol`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counted_below = False  # counted by the TLS layer under it (`TlsLayer`), not by itself
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = None  # bytes of a head still arriving, after its first read; None: no head
        self._head_began = False  # the head began in the read being fed: that read is not counted
        self._in_body = False  # between a head's end and its message's end
        self._body_fed = False  # the read being fed brought body bytes (of any request's)
        self._framing_bytes = 0  # bytes of the reads since the last that brought body bytes
        self._received = False  # the client has sent a byte
        self._refused = False  # refused: what the client sends now is read and dropped until the close

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.counted_below and not self.bound.take():
            self.transport = transport  # uncounted: connection_lost closes it again
            self._refuse(
                TOO_MANY_CONNECTIONS,
                f"the server holds {self.bound.allowed} connections, its limit: retry later, or reuse a connection",
            )
            return
        super().connection_made(transport)
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.counted_below and self in self.connections:  # a refused one was never counted
            self.bound.give_back()
        self._untime_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._received = True
        self._body_fed = False
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._head_bytes is not None:
            if self._head_began:
                self._head_began = False
            else:
                self._head_bytes += len(data)
            if self._head_bytes > MAX_ARRIVING_HEAD_BYTES:
                self._refuse(HEAD_TOO_LARGE, _HEAD_TOO_LARGE)
        elif self._in_body:
            self._framing_bytes = 0 if self._body_fed else self._framing_bytes + len(data)
            if self._framing_bytes > MAX_REQUEST_HEAD_BYTES:
                self._refuse(HEAD_TOO_LARGE, _FRAMING_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._head_began = 0, True
        self._time_head()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._untime_head()
        if self._refused:
            return
        if head_size(self.parser.get_method(), self.url, self.headers) > MAX_REQUEST_HEAD_BYTES:
            self._refuse(HEAD_TOO_LARGE, _HEAD_TOO_LARGE)
            return
        self._in_body, self._framing_bytes = True, 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_fed = True
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        """After an answer, a pipelined head already arriving keeps its own time, afresh (it waited
        for the answer), where uvicorn would give it the keep-alive's 5 s meant for an idle connection."""
        super().on_response_complete()
        if self._head_bytes is not None and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self._untime_head()
            self._time_head()

    def _unsupported_upgrade_warning(self) -> None:
        """Nothing: the API serves no upgrade (runner.py: ws="none"), answers an upgrade request as
        a plain request, and logs nothing a client can send at will."""

    def _time_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_S, self._head_timed_out)

    def _untime_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._refused:
            return
        if self._answering():  # the client waits for the server, not the other way round
            self._time_head()
        elif not self._received:  # nothing asked, nothing to answer (as nginx): a silent close, counted
            self._refused = True
            self.bound.refused(HEAD_TIMEOUT)
            self.transport.close()
        else:
            self._refuse(HEAD_TIMEOUT, f"no complete request line and headers within {REQUEST_HEAD_TIMEOUT_S:g} s")

    def _answering(self) -> bool:
        """Whether a request of this connection is being answered, or waits to be (pipelined)."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def _refuse(self, pair: tuple[str, int], detail: str) -> None:
        """Answer the API's JSON error (no command id: no request was read) and close; while a request
        of the connection is being answered, close without a word, as writing would break into its
        response. The close lingers (what the client sends meanwhile is dropped) so that the kernel
        does not reset the connection, and lose the answer, over unread bytes."""
        code, status = pair
        self._refused = True
        self.bound.refused(pair)
        if self._answering():
            self.transport.close()
            return
        body = msgspec.json.encode({"status": "error", "error_code": code, "detail": detail, "command_id": None})
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))
        )
        self.transport.write(head + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


class TlsLayer(SSLProtocol):  # type: ignore[misc]  # uvloop's TLS layer, which uvicorn's loop runs
    """The TLS layer of an HTTPS server's connection, under its `GuardedHttpProtocol`: it counts the
    connection against the bound from its accept (one past the bound is closed at once: no answer can
    be read before a handshake), gives the handshake REQUEST_HEAD_TIMEOUT_S, and gives the connection
    back when it closes, whether its handshake was done or not (the module docstring says why)."""

    http: type[GuardedHttpProtocol]  # bound by `guarded_protocol`
    context: ssl.SSLContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.app = self.http(*args, **kwargs)
        assert isinstance(self.app.loop, uvloop.Loop), "uvloop's TLS layer runs on uvloop alone"
        self.app.counted_below = True
        self.counted = False
        super().__init__(
            self.app.loop, self.app, self.context, None, server_side=True, ssl_handshake_timeout=REQUEST_HEAD_TIMEOUT_S
        )

    def connection_made(self, transport: asyncio.Transport) -> None:
        if not self.app.bound.take():
            self.app.bound.refused(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self.counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.counted:
            return
        self.counted = False
        self.app.bound.give_back()
        if self.app.transport is None and isinstance(exc, ConnectionAbortedError):  # no handshake done:
            self.app.bound.refused(HEAD_TIMEOUT)  # the error uvloop closes a handshake past its time with
        super().connection_lost(exc)
