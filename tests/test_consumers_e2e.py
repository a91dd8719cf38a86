"""End to end: consumer processes using the consumer helper drain a producer's 5,000 messages."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from keyload import Client
from keyload.log.base import partition_for
from keyload.operations.recovery import drill
from keyload.sdk.results import QueuePolicySpec
from keyload.storage.datadir import DataDir

from .support import create_principals, start_service, stop_service

pytestmark = pytest.mark.slow

MESSAGES = 5_000
CONSUMERS = 3
FAILURE_RATE = 0.1
MAX_ATTEMPTS = 3
# A guard against a hang, not a speed requirement: one-at-a-time enqueues through the live path take
# 30-60 ms each on a loaded two-core machine with three consumers beside them (10,000 of them once
# took over 600 s in CI), so the budget is several times what the work needs.
DRAIN_TIMEOUT_S = 1200

PRODUCER = """\
import sys
from keyload import Client

data, count = sys.argv[1], int(sys.argv[2])
with Client(data, principal="producer") as client:
    for i in range(count):
        client.enqueue("shop", "jobs", b"order %d" % i, message_id=f"m{i}", command_id=f"enqueue-m{i}")
"""

CONSUMER = """\
import json, random, signal, sys, threading
from keyload import Client

data, name, failure_rate, log_path = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
rng = random.Random(name)
lock = threading.Lock()
log = open(log_path, "w")

def handler(delivery):
    with lock:
        failed = rng.random() < failure_rate
        log.write(json.dumps([delivery.message_id, delivery.attempts, "fail" if failed else "ok"]) + "\\n")
    if failed:
        raise RuntimeError("simulated handler failure")

with Client(data, principal=name) as client:
    stats = client.consume("shop", "jobs", handler, concurrency=8, wait_ms=1000, stop=stop)
log.close()
print(json.dumps(stats.__dict__))
"""


def test_consumer_processes_drain_a_producer_exactly_once_or_dead_letter(tmp_path: Path) -> None:
    root = tmp_path / "data"
    service = start_service(root)
    client = Client(root)
    consumers: list[subprocess.Popen[bytes]] = []
    try:
        create_principals(root, "producer", *(f"consumer-{n}" for n in range(CONSUMERS)))
        client.create_queue(
            "shop", "jobs", QueuePolicySpec(max_attempts=MAX_ATTEMPTS, retry_base_ms=10, retry_max_ms=50)
        )
        (tmp_path / "producer.py").write_text(PRODUCER)
        (tmp_path / "consumer.py").write_text(CONSUMER)
        for n in range(CONSUMERS):
            args = [str(root), f"consumer-{n}", str(FAILURE_RATE), str(tmp_path / f"consumer-{n}.log")]
            consumers.append(
                subprocess.Popen([sys.executable, str(tmp_path / "consumer.py"), *args], stdout=subprocess.PIPE)
            )
        started = time.monotonic()
        producer = subprocess.run(
            [sys.executable, str(tmp_path / "producer.py"), str(root), str(MESSAGES)], timeout=DRAIN_TIMEOUT_S
        )
        assert producer.returncode == 0
        while True:
            counters = client.inspect_queue("shop", "jobs").counters
            if counters.acked_total + counters.dead_lettered == MESSAGES:
                break
            assert time.monotonic() - started < DRAIN_TIMEOUT_S, counters
            time.sleep(0.5)
        print(f"drained {MESSAGES} messages in {time.monotonic() - started:.1f}s")
        for consumer in consumers:
            consumer.terminate()
        stats = [json.loads(consumer.communicate(timeout=60)[0]) for consumer in consumers]
    finally:
        for consumer in consumers:
            if consumer.poll() is None:
                consumer.kill()
        client.close()
        assert stop_service(service) == 0

    attempts: list[tuple[str, int, str]] = []
    for n in range(CONSUMERS):
        attempts += [tuple(json.loads(line)) for line in (tmp_path / f"consumer-{n}.log").read_text().splitlines()]
    succeeded = Counter(message_id for message_id, _, result in attempts if result == "ok")
    failed = Counter(message_id for message_id, _, result in attempts if result == "fail")
    dead = {m for m, n in failed.items() if n == MAX_ATTEMPTS}
    # Every message completed exactly once, or failed max_attempts times and was dead-lettered.
    assert set(succeeded) | dead == {f"m{i}" for i in range(MESSAGES)}
    assert all(n == 1 for n in succeeded.values())
    assert not set(succeeded) & dead
    assert counters.acked_total == len(succeeded) and counters.dead_lettered == len(dead)
    assert counters.stored_messages == len(dead)  # dead letters keep their bodies; acked ones are gone
    assert sum(s["acked"] for s in stats) == len(succeeded) and sum(s["lost_leases"] for s in stats) == 0
    # Attempts were numbered by the log: 1, 2, ... per message, never skipped or repeated.
    for message_id in list(succeeded)[:500]:
        numbers = sorted(a for m, a, _ in attempts if m == message_id)
        assert numbers == list(range(1, len(numbers) + 1))
    data = DataDir.open(root)
    report = drill(data, partition_for("shop", data.partitions), tmp_path / "drill", progress=False)
    assert report.passed, report
