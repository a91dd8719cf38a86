"""Large payloads through the SDK and the CLI against a running `keyload run`, over a folder and an
S3 object store: reserve, upload (single PUT and multipart), attest, commit, receive, read; refused
uploads; `payload schedule`, `payload get`, `gc status` and `gc run`."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from keyload import Client
from keyload.log.base import partition_for
from keyload.operations.checkpoints import DEFAULT_RETAINED_CHECKPOINTS
from keyload.operations.gc import GcWorker
from keyload.sdk.payloads import PART_BYTES, PayloadConflict
from keyload.sdk.results import Delivery, QueuePolicySpec
from keyload.storage.datadir import DataDir, KafkaConfig, S3StoreConfig
from keyload.wire import UPLOAD_HANDLE_HEADER

from .s3 import S3Endpoint
from .support import bearer, run_keyload, served_url, start_service, stop_service, wait_until

pytestmark = pytest.mark.slow

D = "shop"
Q = "media"
SMALL_BYTES = 300 * 1024
UPLOAD_WINDOW_MS = 3_000  # short: a deleted object waits for its upload handle to expire
LARGE_BYTES = PART_BYTES + 1024 * 1024  # more than one part: the multipart path


@pytest.fixture(params=["file", "s3", "kafka"])
def client(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """A client of a running `keyload run` whose object store is DATA/objects or a fresh S3 bucket;
    its log the file log, or ("kafka") the real Kafka broker with DATA/objects."""
    if request.param == "kafka":
        bootstrap: str = request.getfixturevalue("kafka_bootstrap")
        DataDir.create(tmp_path / "data", kafka=KafkaConfig(bootstrap, f"payloads-{uuid.uuid4().hex[:10]}"))
    if request.param == "s3":
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        # Credentials come from the environment, which the service process inherits.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "keyload")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "keyload")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        bucket = f"keyload-test-{uuid.uuid4().hex[:16]}"
        config = S3StoreConfig(bucket=bucket, endpoint_url=endpoint.url, region_name="us-east-1")
        DataDir.create(tmp_path / "data", object_store=config)
    # An embedded service collects by itself; a Kafka processor runs no GC worker (the test runs one).
    collecting = () if request.param == "kafka" else ("--gc-interval-s", "0.5")
    service = start_service(tmp_path / "data", "--tick-interval-ms", "50", *collecting)
    sdk = Client(tmp_path / "data")
    try:
        yield sdk
    finally:
        sdk.close()
        assert stop_service(service) == 0


def random_file(path: Path, length: int) -> bytes:
    data = os.urandom(length)
    path.write_bytes(data)
    return data


def receive_all(client: Client, count: int) -> dict[str, Delivery]:
    """`count` deliveries by message id. A large message counts its whole length against the
    receive's max_bytes (4 MiB by default), so the 9 MiB one comes in a receive of its own."""
    deliveries: dict[str, Delivery] = {}
    for _ in range(count):
        deliveries.update((d.message_id, d) for d in client.receive(D, Q, max_messages=count).deliveries)
        if len(deliveries) == count:
            break
    assert len(deliveries) == count, deliveries
    return deliveries


def keyload(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI over `data`; fails the test unless it exits 0."""
    ran = run_keyload(*args, "--data", str(data))
    assert ran.returncode == 0, ran.stderr
    return ran


def test_schedule_large_delivers_exactly_the_uploaded_bytes(client: Client, tmp_path: Path) -> None:
    client.create_queue(D, Q)
    small = os.urandom(SMALL_BYTES)
    large = random_file(tmp_path / "large.bin", LARGE_BYTES)
    progress: dict[str, list[tuple[int, int]]] = {"small": [], "large": []}

    committed = client.schedule_large(
        D, Q, small, message_id="small", progress=lambda done, total: progress["small"].append((done, total))
    )
    assert (committed.state, committed.length, committed.sha256) == (
        "committed",
        SMALL_BYTES,
        hashlib.sha256(small).digest(),
    )
    committed_large = client.schedule_large(
        D,
        Q,
        tmp_path / "large.bin",
        message_id="large",
        progress=lambda done, total: progress["large"].append((done, total)),
        request_id="req-large",
    )
    assert (committed_large.state, committed_large.length) == ("committed", LARGE_BYTES)
    assert progress["small"][-1] == (SMALL_BYTES, SMALL_BYTES)
    assert progress["large"][-1] == (LARGE_BYTES, LARGE_BYTES)
    assert (PART_BYTES, LARGE_BYTES) in progress["large"]  # the first part reported on its own
    assert all(done <= total == LARGE_BYTES for done, total in progress["large"])

    objects = client.data.object_store()  # the configured store (the bucket, for s3) holds both objects
    for reservation in (committed, committed_large):
        stored = objects.head(reservation.object_key)
        assert stored is not None and stored.length == reservation.length

    deliveries = receive_all(client, 2)
    for message_id, data in [("small", small), ("large", large)]:
        delivery = deliveries[message_id]
        assert delivery.body == b""
        assert delivery.payload is not None
        assert (delivery.payload.length, delivery.payload.sha256) == (len(data), hashlib.sha256(data).digest())
        assert client.read_payload(delivery) == data
    into = tmp_path / "read-large.bin"
    assert client.read_payload(deliveries["large"], into) is None
    assert into.read_bytes() == large
    for delivery in deliveries.values():
        client.ack(D, delivery.token)

    # The same request again after success: the committed reservation, no second message.
    again = client.schedule_large(D, Q, tmp_path / "large.bin", message_id="large", request_id="req-large")
    assert again == committed_large
    counters = client.inspect_queue(D, Q).counters
    assert counters.acked_total == 2
    assert client.receive(D, Q).deliveries == []


def test_an_upload_of_other_bytes_is_refused_and_the_reservation_stays_reserved(client: Client, tmp_path: Path) -> None:
    client.create_queue(D, Q)
    data = os.urandom(4096)
    receipt = client.prepare_large_schedule(D, Q, "m", len(data), hashlib.sha256(data).digest())
    handle = client.payloads.upload_handle(receipt, partition_for(D, client.data.partitions))
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(len(data)))  # same length, other bytes
    with pytest.raises(PayloadConflict):
        client.payloads.upload(handle, other)
    assert client.data.object_store().head(receipt.object_key) is None  # nothing was stored
    assert client.inspect_reservation(D, receipt.reservation_id).state == "reserved"
    assert client.receive(D, Q).deliveries == []


def test_uploads_of_one_reservation_sent_to_the_service_at_once_store_one_object(client: Client) -> None:
    """A client that retries an upload while its first attempt still runs (a timeout, two threads)
    sends the same bytes to the service twice at once: it stores them once, so the reservation's key
    holds one version, not one per attempt for the GC to find (an S3 store need not hold concurrent
    conditional completes of one key to one version)."""
    client.create_queue(D, Q)
    data = os.urandom(LARGE_BYTES)  # the multipart path
    url, authorized = served_url(client.data.root), bearer(client.data.root)
    sha256 = base64.b64encode(hashlib.sha256(data).digest()).decode()
    reserve = {"message_id": "twice", "length": len(data), "sha256": sha256, "headers": {}}
    reserved = httpx.post(f"{url}/v1/domains/{D}/queues/{Q}/reservations", json=reserve, headers=authorized)
    receipt = reserved.json()["result"]
    content = f"{url}/v1/domains/{D}/reservations/{receipt['reservation_id']}/content"
    headers = {
        **authorized,
        UPLOAD_HANDLE_HEADER: reserved.headers[UPLOAD_HANDLE_HEADER],  # a Kafka processor's server takes only this
        "content-type": "application/octet-stream",
    }
    with concurrent.futures.ThreadPoolExecutor(3) as senders:
        answers = list(senders.map(lambda _: httpx.put(content, content=data, headers=headers, timeout=60), range(3)))
    assert [answer.status_code for answer in answers] == [200] * 3, [answer.text for answer in answers]
    versions = {answer.json()["result"]["object_version"] for answer in answers}
    assert client.data.object_store().version_ids(receipt["object_key"]) == list(versions)


def test_the_gc_worker_deletes_an_acked_payload_once_the_recovery_floor_passes(client: Client, tmp_path: Path) -> None:
    client.create_queue(D, "brief", QueuePolicySpec(lease_ms=1_000, payload_request_horizon_ms=0))
    data = random_file(tmp_path / "payload", SMALL_BYTES)
    committed = client.schedule_large(D, "brief", data, message_id="m", upload_window_ms=UPLOAD_WINDOW_MS)
    [delivery] = client.receive(D, "brief").deliveries
    assert client.read_payload(delivery) == data
    client.ack(D, delivery.token)
    partition = partition_for(D, client.data.partitions)

    def confirmed() -> bool:
        tasks = client.list_retention(partition).tasks
        return bool(tasks) and all(status.task.state == "confirmed" for status in tasks)

    [status] = client.list_retention(partition).tasks
    assert "recovery_floor" in status.blocked_by
    # Past the upload handle's deadline and the read handle's lease (the horizon is 0).
    handles_until_ms = max(committed.upload_deadline_ms, delivery.lease_until_ms)
    time.sleep(max(0.0, handles_until_ms / 1000 - time.time()) + 0.1)
    with client.data.checkpoints() as checkpoints:
        for _ in range(DEFAULT_RETAINED_CHECKPOINTS):  # the service keeps 3: the last 3 all follow the ack
            offset = client.request_checkpoint(partition).offset
            wait_until(lambda at=offset: any(e.offset == at for e in checkpoints.entries(partition)), what="checkpoint")
        if client.data.kafka is not None:  # an embedded `keyload run` collects by itself (every 0.5 s here)
            with GcWorker(client, checkpoints) as worker:
                assert worker.run_once().confirmed == 1
        wait_until(confirmed, what="the deletion confirmed")
    assert client.data.object_store().versions(committed.object_key) == []
    [status] = client.list_retention(partition).tasks
    assert status.task.deleted_versions == [committed.object_version]
    assert client.inspect_queue(D, "brief").counters.payload_object_bytes == 0


def test_cli_schedules_gets_and_reports_retention(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = start_service(data, "--tick-interval-ms", "50", "--gc-interval-s", "0")
    try:
        with Client(data) as client:
            client.create_queue(D, Q)
            payload = random_file(tmp_path / "upload.bin", SMALL_BYTES)
            scheduled = keyload(
                data,
                "payload",
                "schedule",
                "--domain",
                D,
                "--message-id",
                "m1",
                Q,
                str(tmp_path / "upload.bin"),
                "--quiet",
            )
            reservation = json.loads(scheduled.stdout)
            assert (reservation["state"], reservation["message_id"], reservation["length"]) == (
                "committed",
                "m1",
                SMALL_BYTES,
            )

            out = tmp_path / "out.bin"
            keyload(data, "payload", "get", "--domain", D, "--out", str(out), Q, "m1")
            assert out.read_bytes() == payload

            [delivery] = client.receive(D, Q).deliveries
            client.ack(D, delivery.token)
            # A message with an inline body: the arguments are right, the read fails (1, not usage's 2).
            client.enqueue(D, Q, b"inline", message_id="inline-1")
            inline = run_keyload("payload", "get", "--domain", D, "--out", str(out), Q, "inline-1", "--data", str(data))
            assert (inline.returncode, inline.stderr) == (
                1,
                "keyload: the message has no large payload (inspect shows its inline body)\n",
            )

        status = json.loads(keyload(data, "gc", "status").stdout)
        partitions = DataDir.open(data).partitions
        partition = partition_for(D, partitions)
        assert [entry["partition"] for entry in status] == list(range(partitions))  # one entry per partition
        for entry in status:
            if entry["partition"] != partition:
                assert entry["tasks"] == []
        [task] = status[partition]["tasks"]
        assert (task["kind"], task["domain"], task["queue"], task["message_id"], task["state"]) == (
            "message_payload",
            D,
            Q,
            "m1",
            "waiting",
        )
        assert "recovery_floor" in task["blocked_by"]  # no checkpoint since the ack

        # A GC pass deletes nothing while the task is blocked.
        ran = json.loads(keyload(data, "gc", "run", "--once").stdout)
        assert ran["confirmed"] == 0 and ran["blocked"].get("recovery_floor") == 1
        keyload(data, "payload", "get", "--domain", D, "--out", str(tmp_path / "again.bin"), Q, "m1")
        assert (tmp_path / "again.bin").read_bytes() == payload
    finally:
        assert stop_service(service) == 0
