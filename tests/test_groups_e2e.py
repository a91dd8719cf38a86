"""Topics and subscription groups end to end: a publisher process and subscriber processes in two groups."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from keyload import Client
from keyload.sdk.results import GroupPolicySpec

from .support import create_principals, run_keyload, start_service, stop_service, wait_until

pytestmark = pytest.mark.slow

DOMAIN = "shop"
TOPIC = "events"
EVENTS = 10_000
PUBLISH_BATCH = 100
SUBSCRIBERS_PER_GROUP = 2
FLAKY_EVERY = 997  # these events fail their first attempt, then succeed
POISON_EVERY = 2_503  # these events always fail: parked after max_attempts
MAX_ATTEMPTS = 3
DRAIN_TIMEOUT_S = 300.0

PUBLISHER = """\
import sys

from keyload.sdk.client import Client
from keyload.sdk.results import Event

data, events, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with Client(data, principal="publisher", timeout_s=60) as client:
    for start in range(0, events, batch):
        chunk = [
            Event(f"e-{i}", "order" if i % 2 == 0 else "note", f"body {i}".encode(), {"n": str(i)})
            for i in range(start, min(start + batch, events))
        ]
        client.publish("shop", "events", chunk, command_id=f"publish-{start}")
"""

SUBSCRIBER = """\
import json
import signal
import sys
import threading

from keyload.sdk.client import Client

data, group, report = sys.argv[1], sys.argv[2], sys.argv[5]
flaky_every, poison_every = int(sys.argv[3]), int(sys.argv[4])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
lock = threading.Lock()
out = open(report, "w")  # a file, not stdout: nobody drains a pipe while the test waits


def handle(delivery):
    n = int(delivery.event_id.split("-")[1])
    if n % poison_every == 0 or (n % flaky_every == 0 and delivery.attempts == 1):
        raise RuntimeError("handler failure")
    with lock:
        out.write(json.dumps({"position": delivery.position, "event_id": delivery.event_id}) + "\\n")


with Client(data, principal=f"subscriber-{group}", timeout_s=60) as client:
    stats = client.subscribe("shop", "events", group, handle, concurrency=16, lease_ms=30_000, stop=stop)
out.write(json.dumps({"stats": stats.__dict__}) + "\\n")
out.close()
"""


def matching(group: str) -> list[int]:
    """Event numbers a group must complete: every event, or the orders only."""
    return [n for n in range(EVENTS) if group == "all" or n % 2 == 0]


def test_two_groups_each_complete_every_matching_event_once(tmp_path: Path) -> None:
    root = tmp_path / "data"
    service = start_service(root, "--tick-interval-ms", "100")
    subscribers: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    try:
        policy = GroupPolicySpec(max_window=64, max_attempts=MAX_ATTEMPTS, retry_base_ms=50, retry_max_ms=200)
        create_principals(root, "publisher", "subscriber-all", "subscriber-orders")
        with Client(root) as client:
            client.create_topic(DOMAIN, TOPIC)
            client.create_group(DOMAIN, TOPIC, "all", policy=policy)
            client.create_group(DOMAIN, TOPIC, "orders", event_types=["order"], policy=policy)
        scripts = tmp_path / "publisher.py", tmp_path / "subscriber.py"
        scripts[0].write_text(PUBLISHER)
        scripts[1].write_text(SUBSCRIBER)
        subscribers = [
            (
                group,
                tmp_path / f"{group}-{k}.jsonl",
                subprocess.Popen(
                    [
                        sys.executable,
                        str(scripts[1]),
                        str(root),
                        group,
                        str(FLAKY_EVERY),
                        str(POISON_EVERY),
                        str(tmp_path / f"{group}-{k}.jsonl"),
                    ],
                    stderr=subprocess.PIPE,
                ),
            )
            for group in ("all", "orders")
            for k in range(SUBSCRIBERS_PER_GROUP)
        ]
        publisher = subprocess.run(
            [sys.executable, str(scripts[0]), str(root), str(EVENTS), str(PUBLISH_BATCH)],
            capture_output=True,
            timeout=DRAIN_TIMEOUT_S,
        )
        assert publisher.returncode == 0, publisher.stderr.decode()

        with Client(root) as client:

            def drained() -> bool:
                return all(client.group_status(DOMAIN, TOPIC, g).checkpoint == EVENTS for g in ("all", "orders"))

            wait_until(drained, DRAIN_TIMEOUT_S, "both groups to complete the topic")
            statuses = {g: client.group_status(DOMAIN, TOPIC, g) for g in ("all", "orders")}
        for _, _, process in subscribers:
            process.send_signal(signal.SIGTERM)
        errors = {id(process): process.communicate(timeout=60)[1] for _, _, process in subscribers}
        assert stop_service(service) == 0
    finally:
        for _, _, process in subscribers:
            if process.poll() is None:
                process.kill()
                process.wait()
        if service.poll() is None:
            service.kill()
            service.wait()

    for group in ("all", "orders"):
        completed: Counter[str] = Counter()
        for name, report, process in subscribers:
            if name != group:
                continue
            assert process.returncode == 0, errors[id(process)].decode()
            lines = [json.loads(line) for line in report.read_text().splitlines()]
            *handled, summary = lines
            assert summary["stats"]["lost_leases"] == 0
            completed.update(line["event_id"] for line in handled)
            # Positions are the publication order: event n is at position n + 1.
            assert all(line["position"] == int(line["event_id"][2:]) + 1 for line in handled)
        poisoned = {n for n in matching(group) if n % POISON_EVERY == 0}
        expected = {f"e-{n}" for n in matching(group) if n not in poisoned}
        assert set(completed) == expected, group
        assert [event_id for event_id, count in completed.items() if count > 1] == [], group
        status = statuses[group]
        assert status.parked == sorted(n + 1 for n in poisoned), group
        assert (status.checkpoint, status.issued, status.outstanding, status.lag) == (EVENTS, EVENTS, 0, 0)

    drill = run_keyload("drill", "--data", str(root), "--domain", DOMAIN, "--quiet", timeout=300)
    assert drill.returncode == 0 and "PASS" in drill.stdout, drill.stdout + drill.stderr
