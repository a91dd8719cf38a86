"""Fault injection for the file system calls of the log, the catalog, checkpoints and the store.

`inject(*faults)` patches `os.fsync` and `os.fdatasync` (both recorded as "fsync": a sync of the
file), `os.write`, `os.replace`, `os.rename`, `os.link` and `os.unlink` of this process for the
duration of a `with` block. Every call is recorded, in the
order the calls completed, with the file it touched (a descriptor is resolved through
/proc/self/fd), and each `Fault` makes the Nth call matching its filter fail with an OSError,
write only part of its bytes, or stall until the test releases it:

    with inject(Fault("fsync", nth=2, path="log/commands")) as faults:
        log.append(0, values)                # the 2nd fsync of a command segment raises EIO
    first_write = faults.index_of("write", path="log/outcomes")

The modules under test (log/file_log.py, keyload/operations/catalog.py, keyload/operations/checkpoints.py,
keyload/storage/object_store.py, projections/store.py) call these functions through the `os` module
(`os.fsync(fd)`, `os.replace(a, b)`; pathlib's `Path.replace` and `Path.unlink` do too), so
patching the module's attributes reaches them. Writes through Python file objects
(`file.write`) and RocksDB's own I/O do not go through `os.write` and are not seen.
Linux only (descriptor paths come from /proc).
"""

from __future__ import annotations

import errno as errnos
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

Op: TypeAlias = Literal["fsync", "write", "replace", "rename", "link", "unlink"]
OPS: tuple[Op, ...] = ("fsync", "write", "replace", "rename", "link", "unlink")
Action: TypeAlias = Literal["fail", "partial", "stall"]
Result: TypeAlias = Literal["ok", "failed", "partial"]
STALL_TIMEOUT_S = 30.0  # a stalled call nobody releases fails instead of hanging the test

_real: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in (*OPS, "fdatasync")}


@dataclass(frozen=True, slots=True)
class Call:
    """One call, as recorded when it completed (`seq` counts the recorded calls from 0)."""

    op: Op
    path: str | None  # the file written or synced (its descriptor's path), or the source of a rename/link/unlink
    target: str | None = None  # the destination of a rename, replace or link
    fd: int | None = None
    size: int | None = None  # bytes offered to write()
    thread: str = ""
    seq: int = -1
    result: Result = "ok"  # an injected failure is "failed"; a write cut short is "partial"

    def touches(self, fragment: str) -> bool:
        """Whether the path or the target contains `fragment`."""
        return any(fragment in name for name in (self.path, self.target) if name is not None)


@dataclass(eq=False)
class Fault:
    """Make the `nth` (1-based) call of `op` that matches the filters misbehave.

    `op` is one op or a tuple of ops, counted together. Filters: `path` (a fragment of the
    call's path or target), `fd`, `where` (a predicate over the call; its `seq` and `result`
    are not known yet). Actions:

    - "fail": raise OSError(`error`); `count` consecutive matching calls fail (None: every
      matching call from the nth on, a disk that stays broken);
    - "partial" (writes only): write the first `keep` bytes and return that short count, as a
      filling disk does; the next write to the same descriptor fails with `error`;
    - "stall": set `reached`, block until `release` is set, then make the call normally (it
      fails with ETIMEDOUT if nobody releases it within STALL_TIMEOUT_S).
    """

    op: Op | tuple[Op, ...]
    nth: int = 1
    action: Action = "fail"
    error: int = errnos.EIO
    path: str | None = None
    fd: int | None = None
    where: Callable[[Call], bool] | None = None
    count: int | None = 1
    keep: int = 0
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    seen: int = 0  # matching calls so far
    hits: int = 0  # calls this fault acted on

    def __post_init__(self) -> None:
        if not all(op in OPS for op in self.ops):
            raise ValueError(f"unknown op in {self.ops}; known: {OPS}")
        if self.nth < 1 or (self.count is not None and self.count < 1):
            raise ValueError("nth and count must be >= 1")
        if self.action == "partial" and self.ops != ("write",):
            raise ValueError("only a write can be partial")

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.op if isinstance(self.op, tuple) else (self.op,)

    def matches(self, call: Call) -> bool:
        if call.op not in self.ops:
            return False
        if self.path is not None and not call.touches(self.path):
            return False
        if self.fd is not None and call.fd != self.fd:
            return False
        return self.where is None or self.where(call)

    def _count(self, call: Call) -> bool:
        """Count a call; whether this fault acts on it."""
        if not self.matches(call):
            return False
        self.seen += 1
        acts = self.seen >= self.nth and (self.count is None or self.seen < self.nth + self.count)
        self.hits += acts
        return acts


class Faults:
    """What `inject` hands out: the faults, and every call made while they were active."""

    def __init__(self, faults: tuple[Fault, ...]) -> None:
        self.faults = faults
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._broken: dict[int, int] = {}  # descriptor -> errno of its next write (after a partial one)

    def fired(self) -> bool:
        """Whether every fault acted at least once."""
        return all(fault.hits > 0 for fault in self.faults)

    def matching(self, op: Op | None = None, path: str | None = None) -> list[Call]:
        """The recorded calls of `op` (any op if None) touching `path` (any if None), in order."""
        return [c for c in self.calls if (op is None or c.op == op) and (path is None or c.touches(path))]

    def index_of(self, op: Op, path: str | None = None, *, after: int = -1, thread: str | None = None) -> int | None:
        """`seq` of the first call of `op` touching `path` (by `thread`) after call `after`; None if none."""
        for call in self.calls:
            if call.seq <= after or call.op != op or (path is not None and not call.touches(path)):
                continue
            if thread is None or call.thread == thread:
                return call.seq
        return None

    def run(self, probe: Call, real: Callable[[], Any], data: Any = None) -> Any:
        """Make (or refuse) one intercepted call; record it once it is done."""
        with self._lock:
            acting = [fault for fault in self.faults if fault._count(probe)]
            broken = self._broken.pop(probe.fd, None) if probe.op == "write" and probe.fd is not None else None
        error: OSError | None = None
        partial: Fault | None = None
        if broken is not None:
            error = OSError(broken, os.strerror(broken))
        for fault in acting:
            if error is not None:
                break
            if fault.action == "stall":
                fault.reached.set()
                if not fault.release.wait(STALL_TIMEOUT_S):
                    error = OSError(errnos.ETIMEDOUT, "a stalled call was never released")
            elif fault.action == "fail":
                error = OSError(fault.error, os.strerror(fault.error), probe.path)
            else:
                partial = fault
        if error is not None:
            self._record(probe, "failed")
            raise error
        if partial is not None:
            assert probe.fd is not None
            written: int = _real["write"](probe.fd, data[: partial.keep])
            with self._lock:
                self._broken[probe.fd] = partial.error
            self._record(probe, "partial")
            return written
        try:
            result = real()
        except OSError:
            self._record(probe, "failed")
            raise
        self._record(probe, "ok")
        return result

    def _record(self, probe: Call, result: Result) -> None:
        with self._lock:
            self.calls.append(replace(probe, seq=len(self.calls), result=result))


_active: Faults | None = None
_install_lock = threading.Lock()


def fd_path(fd: int) -> str | None:
    """The path behind a descriptor, or None (closed, or no /proc)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _name(path: Any) -> str | None:
    if isinstance(path, int):
        return fd_path(path)
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        return None


def _thread() -> str:
    return threading.current_thread().name


def _sync(name: str) -> Callable[[Any], None]:
    """`os.fsync` or `os.fdatasync`, recorded as an "fsync" call."""

    def patched(fd: Any) -> None:
        active = _active
        if active is None:
            return _real[name](fd)  # type: ignore[no-any-return]
        number = fd if isinstance(fd, int) else fd.fileno()
        probe = Call("fsync", fd_path(number), fd=number, thread=_thread())
        return active.run(probe, lambda: _real[name](fd))  # type: ignore[no-any-return]

    return patched


def _write(fd: int, data: Any) -> int:
    active = _active
    if active is None:
        return _real["write"](fd, data)  # type: ignore[no-any-return]
    probe = Call("write", fd_path(fd), fd=fd, size=len(data), thread=_thread())
    return active.run(probe, lambda: _real["write"](fd, data), data)  # type: ignore[no-any-return]


def _two_paths(op: Op) -> Callable[..., Any]:
    def patched(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        active = _active
        if active is None:
            return _real[op](src, dst, *args, **kwargs)
        probe = Call(op, _name(src), target=_name(dst), thread=_thread())
        return active.run(probe, lambda: _real[op](src, dst, *args, **kwargs))

    return patched


def _unlink(path: Any, *args: Any, **kwargs: Any) -> None:
    active = _active
    if active is None:
        return _real["unlink"](path, *args, **kwargs)  # type: ignore[no-any-return]
    probe = Call("unlink", _name(path), thread=_thread())
    return active.run(probe, lambda: _real["unlink"](path, *args, **kwargs))  # type: ignore[no-any-return]


_PATCHED: dict[str, Callable[..., Any]] = {
    "fsync": _sync("fsync"),
    "fdatasync": _sync("fdatasync"),
    "write": _write,
    "replace": _two_paths("replace"),
    "rename": _two_paths("rename"),
    "link": _two_paths("link"),
    "unlink": _unlink,
}


@contextmanager
def inject(*faults: Fault) -> Iterator[Faults]:
    """Patch the os functions while the block runs; with no faults it only records.

    One injection at a time per process; the originals are back when the block ends, even
    if a stalled call is still waiting (release it first).
    """
    global _active
    with _install_lock:
        if _active is not None:
            raise RuntimeError("fault injection is already active")
        recorder = Faults(faults)
        _active = recorder
        for name, patched in _PATCHED.items():
            setattr(os, name, patched)
    try:
        yield recorder
    finally:
        with _install_lock:
            for name, real in _real.items():
                setattr(os, name, real)
            _active = None


def strerror(code: int) -> str:
    """The text an OSError of `code` carries, to look for in an error message."""
    return os.strerror(code)
