"""The HTTP API in Kafka mode: each processor serves it, produces its requests to the command topic
and answers from the outcomes topic, whichever processor owns the command's partition."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.broker import NativeBroker
from keyload import Capability, Client, Credential, Grant, KeyloadError
from keyload.credentials import CredentialError
from keyload.errors import NotFoundError
from keyload.log.base import partition_for
from keyload.log.kafka_log import KafkaLog
from keyload.sdk.payloads import PayloadError
from keyload.storage.datadir import DataDir, KafkaConfig
from keyload.storage.keyring import FILE as KEYRING_FILE
from keyload.wire import UPLOAD_HANDLE_HEADER

from .support import (
    bearer,
    race_under_one_key,
    served_url,
    spread_domains,
    start_service,
    stop_service,
    wait_until,
)

pytestmark = pytest.mark.slow

PARTITIONS = 4


@contextlib.contextmanager
def two_processors(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """Two processors of one Kafka deployment (one keyring, one object store), each serving the API:
    the first's data directory and both URLs."""
    prefix = f"http-{uuid.uuid4().hex[:10]}"
    objects = tmp_path / "objects"
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    DataDir.create(first_root, PARTITIONS, kafka=KafkaConfig(kafka_bootstrap, prefix), object_store=objects)
    DataDir.create(
        second_root,
        PARTITIONS,
        kafka=KafkaConfig(kafka_bootstrap, prefix),
        object_store=objects,
        keyring_from=first_root / KEYRING_FILE,
    )
    args = ("--session-timeout-ms", "6000")
    first = start_service(first_root, *args)
    second = start_service(second_root, *args)
    try:
        yield first_root, [served_url(first_root), served_url(second_root)]
    finally:
        assert stop_service(first, 30) == 0
        assert stop_service(second, 30) == 0


def test_each_processor_serves_every_partition(kafka_bootstrap: str, tmp_path: Path) -> None:
    with two_processors(kafka_bootstrap, tmp_path) as (first_root, urls):
        credential = Credential.load(first_root / "credentials" / "keyload-admin.json")
        domains = spread_domains(PARTITIONS, PARTITIONS)
        with Client(urls[0], credential=credential, timeout_s=60) as client:
            for domain in domains:  # one on each partition: both processors own some
                client.create_queue(domain, "jobs")
        for url in urls:  # either server answers for any partition
            with Client(url, credential=credential, timeout_s=60) as client:
                for domain in domains:
                    client.enqueue(domain, "jobs", url.encode(), message_id=f"from-{url}")
        with Client(urls[1], credential=credential, timeout_s=60) as client:
            for domain in domains:
                bodies = sorted(d.body for d in client.receive(domain, "jobs", max_messages=10).deliveries)
                assert bodies == sorted(url.encode() for url in urls)
            assert client.inspect_queue(domains[0], "jobs").counters.leased == 2
        wrong = Credential("keyload-admin", "keyload-admin-1", b"\x00" * 32)
        with Client(urls[0], credential=wrong, timeout_s=60) as client, pytest.raises(CredentialError):
            client.inspect_queue(domains[0], "jobs")
        metrics = httpx.get(f"{urls[0]}/metrics", headers=bearer(first_root), timeout=30)
        assert metrics.status_code == 200 and "keyload_http_requests_total" in metrics.text
        # A record no command can be read from is counted by the processor that owns its partition.
        poisoned = partition_for(domains[0], PARTITIONS)
        with KafkaLog.commands(DataDir.open(first_root).kafka_settings()) as log:
            log.append(poisoned, [b"\x00not avro at all"])
        counted = f'keyload_poison_records{{partition="{poisoned}"}} 1.0'

        def scraped_poison() -> bool:
            return any(
                counted in httpx.get(f"{url}/metrics", headers=bearer(first_root), timeout=30).text for url in urls
            )

        wait_until(scraped_poison, 60, "the poison record in the owner's /metrics")
        # Any credential reads the census here (no policy to check inspect against): it names no domain.
        with Client(urls[0], credential=credential, timeout_s=60) as client:
            client.configure_domain_caps(domains[0], max_queues=1)  # it holds 1 queue: at its cap
        at_cap = []
        for url in urls:
            with Client(url, credential=credential, timeout_s=60) as client:
                at_cap += [
                    (found.at_cap, found.at_cap_total)
                    for found in client.census()
                    if found.partition == partition_for(domains[0], PARTITIONS)
                ]
        assert max(at_cap, key=lambda pair: pair[1]) == ((), 1)
        # Credentials come from the CLI and a copied keyring on Kafka: a typed refusal, nothing appended.
        issue = {"principal": "svc", "grants": []}
        refused = httpx.post(f"{urls[0]}/v1/principals", json=issue, headers=bearer(first_root), timeout=30)
        assert (refused.status_code, refused.json()["error_code"]) == (501, "UnsupportedCapability")
        assert "keyload principal create NAME --key-id ID" in refused.json()["detail"]  # the way that works
        with Client(urls[1], credential=credential, timeout_s=60) as client:
            with pytest.raises(KeyloadError, match="issues no credentials") as raised:
                client.rotate_credential("keyload-admin")
            assert not isinstance(raised.value, PayloadError)
            with pytest.raises(NotFoundError):
                client.inspect_principal("svc")
        wait_until(lambda: httpx.get(f"{urls[1]}/readyz", timeout=30).status_code == 200, 30, "readiness")


def test_large_payloads_are_taken_by_either_processor(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A reservation made through one processor's server is uploaded through the other's by its
    upload handle (neither reads it from a projection), and a large delivery is read through either."""
    with two_processors(kafka_bootstrap, tmp_path) as (first_root, urls):
        credential = Credential.load(first_root / "credentials" / "keyload-admin.json")
        [domain] = spread_domains(1, PARTITIONS)
        payload = bytes(range(256)) * 5000
        reserve = {
            "message_id": "clip",
            "length": len(payload),
            "sha256": base64.b64encode(hashlib.sha256(payload).digest()).decode(),
            "headers": {},
        }
        auth = {"Authorization": f"Bearer {credential.bearer_token}"}
        with (
            httpx.Client(base_url=urls[0], headers=auth, timeout=60) as first,
            httpx.Client(base_url=urls[1], headers=auth, timeout=60) as second,
        ):
            assert first.put(f"/v1/domains/{domain}/queues/media", json={"policy": {}}).status_code == 200
            reserved = first.post(f"/v1/domains/{domain}/queues/media/reservations", json=reserve)
            assert reserved.status_code == 200, reserved.text
            content = f"/v1/domains/{domain}/reservations/{reserved.json()['result']['reservation_id']}/content"
            raw = {"content-type": "application/octet-stream"}
            unhandled = second.put(content, content=payload, headers=raw)
            assert (unhandled.status_code, unhandled.json()["error_code"]) == (400, "Validation")
            assert UPLOAD_HANDLE_HEADER in unhandled.json()["detail"] and "Keyload-Command-Id" not in unhandled.headers
            brief = first.post(
                f"/v1/domains/{domain}/queues/media/reservations",
                json={**reserve, "message_id": "brief", "upload_window_ms": 1000},
            )
            time.sleep(1.1)  # past its upload deadline: the handle is refused before a byte is read
            late = second.put(
                f"/v1/domains/{domain}/reservations/{brief.json()['result']['reservation_id']}/content",
                content=payload,
                headers={**raw, UPLOAD_HANDLE_HEADER: brief.headers[UPLOAD_HANDLE_HEADER]},
            )
            assert (late.status_code, late.json()["error_code"]) == (410, "Gone")
            handle = {UPLOAD_HANDLE_HEADER: reserved.headers[UPLOAD_HANDLE_HEADER]}
            uploaded = second.put(content, content=payload, headers={**raw, **handle})
            assert (uploaded.status_code, uploaded.json()["result"]["state"]) == (200, "committed"), uploaded.text
        with Client(urls[1], credential=credential, timeout_s=60) as client:
            client.schedule_large(domain, "media", payload[::-1], message_id="clip-2")  # the SDK over HTTP
            deliveries = client.receive(domain, "media", max_messages=10).deliveries
            assert sorted(d.message_id for d in deliveries) == ["clip", "clip-2"]
        with Client(urls[0], credential=credential, timeout_s=60) as client:
            read = {d.message_id: client.read_payload(d) for d in deliveries}
        assert read == {"clip": payload, "clip-2": payload[::-1]}


def test_a_command_id_used_again_for_other_content_is_conflict_not_the_first_outcome(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A processor's outcomes reach its server twice on Kafka: in process, and read back from its
    reply partition. The copy read back must not answer a later request under the same command id:
    other content under the id is a 409 Conflict, never the first command's 200 (which would tell
    the caller its other message was enqueued)."""
    root = tmp_path / "node"
    DataDir.create(root, PARTITIONS, kafka=KafkaConfig(kafka_bootstrap, f"ids-{uuid.uuid4().hex[:10]}"))
    service = start_service(root, "--session-timeout-ms", "6000")
    try:
        url = served_url(root)
        with httpx.Client(base_url=url, headers=bearer(root), timeout=60) as api:
            assert api.put("/v1/domains/shop/queues/jobs", json={}).status_code == 200
            statuses = []
            for n in range(40):
                key = {"Idempotency-Key": f"enqueue-{n}"}
                first = api.post("/v1/domains/shop/queues/jobs/messages", json={"body": "YQ=="}, headers=key)
                assert first.status_code == 200, first.text
                again = api.post("/v1/domains/shop/queues/jobs/messages", json={"body": "Yg=="}, headers=key)
                statuses.append((again.status_code, again.json()["error_code"]))
                key = {"Idempotency-Key": f"receive-{n}"}
                first = api.post("/v1/domains/shop/queues/jobs/receive", json={"max_messages": 1}, headers=key)
                assert first.status_code == 200, first.text
                again = api.post("/v1/domains/shop/queues/jobs/receive", json={"max_messages": 2}, headers=key)
                statuses.append((again.status_code, again.json()["error_code"]))
            assert statuses == [(409, "Conflict")] * 80
            # Sent at once: one of two other messages is enqueued, the other is told Conflict.
            asyncio.run(race_under_one_key(url, bearer(root), "/v1/domains/shop/queues/jobs", 10))
            counters = api.get("/v1/domains/shop/queues/jobs").json()["result"]["counters"]
            assert (counters["enqueued_total"], counters["leased"]) == (50, 40)
    finally:
        assert stop_service(service, 30) == 0


def test_a_principal_disabled_since_the_edge_checked_it_is_refused_at_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The keyring alone authenticates at a Kafka server's edge; the processor refuses a disabled
    principal's command with an unsealed PermissionDenied. That refusal may be published before the
    broker acknowledges the append: it must still answer its request (403), not leave it to time out."""
    root = tmp_path / "node"
    DataDir.create(root, PARTITIONS, kafka=KafkaConfig(kafka_bootstrap, f"off-{uuid.uuid4().hex[:10]}"))
    service = start_service(root, "--session-timeout-ms", "6000")
    try:
        url = served_url(root)
        with Client(root, timeout_s=60) as operator:
            clerk = operator.create_principal("clerk", [Grant(capability=Capability.resource_manage, domain="shop")])
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {clerk.bearer_token}"}, timeout=60
            ) as api:
                assert api.put("/v1/domains/shop/queues/before", json={}).status_code == 200
                operator.put_principal("clerk", enabled=False)
                refused = [api.put(f"/v1/domains/shop/queues/q{n}", json={}) for n in range(12)]
        assert [(r.status_code, r.json()["error_code"]) for r in refused] == [(403, "PermissionDenied")] * 12
    finally:
        assert stop_service(service, 30) == 0


def test_a_request_whose_append_a_broker_away_holds_is_answered_503_when_the_service_stops(
    native_broker: NativeBroker, tmp_path: Path
) -> None:
    """A request whose append the broker holds (killed) when the service is stopped is answered 503
    `Unavailable` with its command id at the end of the drain, in the API's JSON form, rather than cut
    off when the server closes (a plain-text 500); sent again by its Idempotency-Key once the broker
    and the service are back, it applies once."""
    root = tmp_path / "data"
    DataDir.create(root, 2, kafka=KafkaConfig(native_broker.bootstrap, f"drain-{uuid.uuid4().hex[:8]}"))
    service = start_service(root)
    url, auth = served_url(root), bearer(root)
    queue = f"{url}/v1/domains/shop/queues/orders"
    assert httpx.put(queue, json={"policy": {}}, headers=auth, timeout=60).status_code == 200
    native_broker.kill()
    answered: list[httpx.Response] = []
    enqueue = {"message_id": "held", "body": base64.b64encode(b"x").decode()}
    keyed = {**auth, "Idempotency-Key": "held-by-the-broker"}
    sender = threading.Thread(
        target=lambda: answered.append(httpx.post(f"{queue}/messages", json=enqueue, headers=keyed, timeout=60))
    )
    sender.start()
    time.sleep(1)
    stop_service(service, 60)
    sender.join(60)
    [response] = answered
    assert (response.status_code, response.json()["error_code"]) == (503, "Unavailable")
    assert response.json()["command_id"] == "held-by-the-broker"
    native_broker.start()
    service = start_service(root)
    try:
        url = served_url(root)
        again = httpx.post(f"{url}/v1/domains/shop/queues/orders/messages", json=enqueue, headers=keyed, timeout=60)
        assert again.status_code == 200, again.text
        counters = httpx.get(f"{url}/v1/domains/shop/queues/orders", headers=auth, timeout=60).json()
        assert counters["result"]["counters"]["enqueued_total"] == 1
    finally:
        assert stop_service(service, 30) == 0
