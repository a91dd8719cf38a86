"""A doorbell between processes of one data directory: appenders ring, `keyload run` wakes.

The runtime would otherwise poll the log on a timer, adding up to the poll
interval to every command's latency when traffic is sparse. A client rings after
each append (a one-byte datagram on a Linux abstract Unix socket named after the
data directory, so no file is left behind); the runtime waits on the socket with
a timeout instead of sleeping. A lost ring only costs that timeout: the log stays
the only source of truth.

A ring names the partitions appended to (4 bytes each, big-endian), so the
runtime reads those and not every partition on each wake-up; a one-byte ring
names none, and wakes a look at them all.

A data directory has one bell appenders ring (`bell` ""): the serving process's. With
`keyload run --workers N` each worker process listens on a bell of its own, to which the serving
process passes on the rings for its partitions, and the HTTP edge on one its workers ring when they
publish outcomes it waits for (keyload/service/workers.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
from collections.abc import Collection
from pathlib import Path

MAX_DRAIN = 1024  # datagrams read per wake-up
PARTITION_BYTES = 4
MAX_RING_BYTES = 1024  # a longer ring is read cut short: it wakes a look at every partition
UNNAMED = b"\x01"  # a ring naming no partition


def _address(data_root: Path, bell: str) -> str:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(data_root))).hexdigest()[:32]
    return f"\0keyload-doorbell-{digest}{bell and '-' + bell}"


class Doorbell:
    """The ringing side: never blocks, never fails the caller."""

    def __init__(self, data_root: Path, bell: str = "") -> None:
        self._address = _address(data_root, bell)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def ring(self, partitions: Collection[int] = ()) -> None:
        """Wake the runtime to read `partitions` (every partition when none is named)."""
        named = b"".join(partition.to_bytes(PARTITION_BYTES, "big") for partition in partitions)
        try:
            self._socket.sendto(named or UNNAMED, self._address)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN):
                raise

    def close(self) -> None:
        self._socket.close()


class Listener:
    """The runtime's side: wait until rung or a timeout passes."""

    def __init__(self, data_root: Path, bell: str = "") -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(_address(data_root, bell))  # EADDRINUSE: another `keyload run` serves this directory
        self._socket.setblocking(False)

    def wait(self, timeout_s: float) -> frozenset[int] | None:
        """The partitions the rings since the last wait named (empty when the timeout passed with
        none); None when a ring named none (look at every partition)."""
        readable, _, _ = select.select([self._socket], [], [], timeout_s)
        if not readable:
            return frozenset()
        named: set[int] | None = set()
        for _ in range(MAX_DRAIN):
            try:
                ring = self._socket.recv(MAX_RING_BYTES)
            except BlockingIOError:
                break
            if named is not None and ring and len(ring) % PARTITION_BYTES == 0 and len(ring) < MAX_RING_BYTES:
                named.update(
                    int.from_bytes(ring[at : at + PARTITION_BYTES], "big")
                    for at in range(0, len(ring), PARTITION_BYTES)
                )
            else:
                named = None
        return None if named is None else frozenset(named)

    def fileno(self) -> int:
        """The socket an event loop watches for rings (`wait(0)` then takes them)."""
        return self._socket.fileno()

    def close(self) -> None:
        self._socket.close()
