"""The embedded HTTP API shares the processors' thread (docs/ARCHITECTURE.md §10a): the runtime's
idle wait is a turn of the server's event loop (`HttpServer.turn`). A turn serves requests, ends
when the server appends a command or a local appender rings the doorbell, naming their partitions
as the doorbell's own wait does, and otherwise lasts its timeout.

These drive a real server (uvicorn on a real socket, a real HTTP client) whose turns the test gives
by hand, in place of a runtime, so what ends a turn is seen directly; the service as a whole is
tests/test_server_http.py's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keyload.log.base import partition_for
from keyload.projections.store import Store
from keyload.server.runner import HttpServer, Listen
from keyload.server.writer import OutcomeWaiters
from keyload.service.doorbell import Doorbell, Listener
from keyload.storage.datadir import DataDir

from .support import bearer, run_keyload

TURN_S = 0.05
LOOP_CLOCK_S = 0.001  # the resolution of the event loop's timers (libuv: milliseconds)
DEADLINE_S = 30.0


class _Idle:
    """No processor serves here: nothing applied, nothing halted."""

    def applied_offsets(self) -> dict[int, int]:
        return {}

    def halt_of(self, partition: int) -> str | None:
        return None

    def stall_of(self, partition: int) -> str | None:
        return None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    """A server on a data directory whose access control is on (a `keyload run` went before)."""
    root = tmp_path / "data"
    args = ("run", "--data", str(root), "--until-idle", "--gc-interval-s", "0", "--listen", "none")
    assert run_keyload(*args).returncode == 0
    data = DataDir.open(root)
    stores = {partition: Store(data.projection(partition)) for partition in range(data.partitions)}
    listener = Listener(data.root)
    served = HttpServer.embedded(data, Listen(port=0), stores, stores, OutcomeWaiters(None), _Idle(), listener)
    served.start()
    try:
        yield served
    finally:
        served.stop()
        listener.close()
        for store in stores.values():
            store.close()


def _turn_until(server: HttpServer, done: threading.Event) -> list[frozenset[int] | None]:
    """Give the server turns until `done`: what each turn answered."""
    answers = []
    deadline = time.monotonic() + DEADLINE_S
    while not done.is_set() and time.monotonic() < deadline:
        answers.append(server.turn(TURN_S))
    assert done.is_set(), "the request was not served within the deadline"
    return answers


def _in_thread(request: object) -> tuple[threading.Event, list[httpx.Response]]:
    """Run `request()` on a thread of its own: the event set once it answered, and its response."""
    done = threading.Event()
    responses: list[httpx.Response] = []

    def send() -> None:
        try:
            responses.append(request())  # type: ignore[operator]
        finally:
            done.set()

    threading.Thread(target=send, daemon=True).start()
    return done, responses


def test_a_turn_with_nothing_to_do_lasts_its_timeout_and_names_nothing(server: HttpServer) -> None:
    assert server.turn(0) == frozenset()
    started = time.monotonic()
    assert server.turn(TURN_S) == frozenset()
    # uvloop (libuv) times its timers on a loop clock of whole milliseconds, read when an iteration
    # starts, so a timer can end up to a millisecond before time.monotonic reaches it (CI saw 0.56 ms).
    assert time.monotonic() - started >= TURN_S - LOOP_CLOCK_S


def test_requests_are_served_during_turns(server: HttpServer) -> None:
    done, responses = _in_thread(lambda: httpx.get(f"{server.url}/healthz", timeout=DEADLINE_S))
    answers = _turn_until(server, done)
    assert responses[0].status_code == 200
    assert set(answers) == {frozenset()}  # serving a read appended nothing: no turn named a partition


def test_a_doorbell_ring_ends_a_turn_naming_its_partitions(server: HttpServer) -> None:
    doorbell = Doorbell(server.data.root)
    try:
        doorbell.ring((2, 3))
        assert server.turn(DEADLINE_S) == frozenset({2, 3})
        doorbell.ring()  # a ring naming none: look at every partition
        assert server.turn(DEADLINE_S) is None
        assert server.turn(0) == frozenset()  # taken: nothing left
    finally:
        doorbell.close()


def test_an_append_of_the_server_ends_a_turn_naming_its_partition(server: HttpServer) -> None:
    """The command is appended and its partition named at once; with no processor to apply it, its
    request waits until the server stops and is answered 503 then (retry by command id)."""
    root = server.data.root
    domain = "turns"
    partition = partition_for(domain, server.data.partitions)
    with server.data.file_command_log() as log:
        before = log.end_offset(partition)
    done, responses = _in_thread(
        lambda: httpx.put(
            f"{server.url}/v1/domains/{domain}/queues/q", json={}, headers=bearer(root), timeout=DEADLINE_S
        )
    )
    deadline = time.monotonic() + DEADLINE_S
    answer = server.turn(TURN_S)
    while answer == frozenset() and time.monotonic() < deadline:
        answer = server.turn(TURN_S)
    assert answer == frozenset({partition})
    with server.data.file_command_log() as log:
        assert log.end_offset(partition) == before + 1
    server.stop()
    assert done.wait(DEADLINE_S)
    assert responses[0].status_code == 503
