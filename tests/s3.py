"""Which S3-compatible server the tests use: one given by the environment, else a moto server process of our own.

With neither available, S3 tests fail under CI (a broken setup) and skip elsewhere, saying why.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from devtools.s3_server import MotoS3Server, S3ServerError, moto_server_available
from keyload.storage.object_store import S3ObjectStore

from .support import unavailable_in_ci

ENDPOINT_ENV = "KEYLOAD_S3_ENDPOINT"


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    client_options: dict[str, Any] = field(default_factory=dict)  # moto takes any credentials; a given server, env's

    def fresh_store(self, prefix: str = "") -> S3ObjectStore:
        """A store in a new bucket, so tests never see each other's objects."""
        bucket = f"keyload-test-{uuid.uuid4().hex[:16]}"
        return S3ObjectStore(bucket, prefix, endpoint_url=self.url, **self.client_options)


@contextmanager
def s3_server(workdir: Path) -> Iterator[S3Endpoint]:
    given = os.environ.get(ENDPOINT_ENV)
    if given:
        yield S3Endpoint(given, {"region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")})
        return
    problem = moto_server_available()
    if problem is not None:
        raise S3ServerError(f"{ENDPOINT_ENV} is not set; {problem}")
    with MotoS3Server(workdir) as server:
        yield S3Endpoint(
            server.endpoint,
            {"region_name": "us-east-1", "aws_access_key_id": "keyload", "aws_secret_access_key": "keyload"},
        )


def unavailable(reason: str) -> NoReturn:
    """Fail under CI, where a missing S3 server is a broken setup; skip elsewhere."""
    unavailable_in_ci("S3 server", reason)


class HangingEndpoint:
    """A TCP relay in front of an S3 endpoint that can stop answering: while `hung`, it accepts
    connections and reads nothing from either side, as a store that takes a request and never
    answers does; once released, what was held flows on (a request sent meanwhile completes, if
    its client still waits).
    """

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.hung = threading.Event()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        with client, upstream:
            while not self._closed.is_set():
                if self.hung.is_set():
                    time.sleep(0.01)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return
                    peers[source].sendall(data)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
