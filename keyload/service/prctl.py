"""Linux's prctl(2) for the service's processes and threads: names operators see in `top -H`, `ps`
and /proc (bench.server reads them), and workers that die with the process that started them.
Elsewhere (no prctl) each is a no-op."""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1  # the signal a process gets when the thread that started it ends
PR_SET_NAME = 15  # name the calling thread (up to 15 bytes)


def _prctl(option: int, argument: object) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, argument, 0, 0, 0)


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the OS too (/proc/PID/task/TID/comm; a process's main thread
    names the process), as Python 3.11 names only its own Thread object."""
    _prctl(PR_SET_NAME, name.encode()[:15])


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (its process killed, even by kill -9)."""
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
