"""The HTTP API in Kafka mode: each processor serves it, produces its requests to the command topic
and answers from the outcomes topic, whichever processor owns the command's partition."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from keyload import Client, Credential
from keyload.credentials import CredentialError
from keyload.storage.datadir import DataDir, KafkaConfig
from keyload.storage.keyring import FILE as KEYRING_FILE

from .support import bearer, served_url, spread_domains, start_service, stop_service, wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 4


def test_each_processor_serves_every_partition(kafka_bootstrap: str, tmp_path: Path) -> None:
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
        urls = [served_url(first_root), served_url(second_root)]
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
        wait_until(lambda: httpx.get(f"{urls[1]}/readyz", timeout=30).status_code == 200, 30, "readiness")
    finally:
        assert stop_service(first, 30) == 0
        assert stop_service(second, 30) == 0
