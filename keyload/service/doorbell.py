"""A doorbell between processes of one data directory: appenders ring, `keyload run` wakes.

The runtime would otherwise poll the log on a timer, adding up to the poll
interval to every command's latency when traffic is sparse. A client rings after
each append (a one-byte datagram on a Linux abstract Unix socket named after the
data directory, so no file is left behind); the runtime waits on the socket with
a timeout instead of sleeping. A lost ring only costs that timeout: the log stays
the only source of truth.
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
from pathlib import Path

MAX_DRAIN = 1024  # datagrams read per wake-up


def _address(data_root: Path) -> str:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(data_root))).hexdigest()[:32]
    return f"\0keyload-doorbell-{digest}"


class Doorbell:
    """The ringing side: never blocks, never fails the caller."""

    def __init__(self, data_root: Path) -> None:
        self._address = _address(data_root)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def ring(self) -> None:
        try:
            self._socket.sendto(b"\x01", self._address)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN):
                raise

    def close(self) -> None:
        self._socket.close()


class Listener:
    """The runtime's side: wait until rung or a timeout passes."""

    def __init__(self, data_root: Path) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(_address(data_root))  # EADDRINUSE: another `keyload run` serves this directory
        self._socket.setblocking(False)

    def wait(self, timeout_s: float) -> None:
        readable, _, _ = select.select([self._socket], [], [], timeout_s)
        if readable:
            for _ in range(MAX_DRAIN):
                try:
                    self._socket.recv(16)
                except BlockingIOError:
                    break

    def close(self) -> None:
        self._socket.close()
