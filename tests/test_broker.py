"""The test brokers are real Kafka: topics, produce and consume work, a restarted broker keeps its data and address,
and a port taken before the broker binds it does not fail the start."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from devtools import broker
from devtools.broker import NativeBroker, native_broker_available

from .kafka import unavailable


def create_topic(bootstrap: str) -> str:
    topic = f"test-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future, or the request is abandoned
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    return topic


def produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    producer.produce(topic, value, key)
    assert producer.flush(30) == 0


def consume_one(bootstrap: str, topic: str, timeout_s: float = 30) -> Message:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None, message.error()
                return message
        raise AssertionError(f"no record from {topic} within {timeout_s:g}s")
    finally:
        consumer.close()


def test_the_session_broker_round_trips_a_record(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, b"k", b"hello")
    message = consume_one(kafka_bootstrap, topic)
    assert (message.key(), message.value(), message.offset()) == (b"k", b"hello", 0)


def test_a_restarted_broker_keeps_its_records_and_address(native_broker: NativeBroker) -> None:
    bootstrap = native_broker.bootstrap
    topic = create_topic(bootstrap)
    produce(bootstrap, topic, b"k", b"durable")
    native_broker.stop()
    native_broker.start()
    assert native_broker.bootstrap == bootstrap
    message = consume_one(bootstrap, topic)
    assert (message.key(), message.value()) == (b"k", b"durable")


def test_a_port_taken_before_the_broker_binds_it_is_replaced_at_first_and_waited_for_after(tmp_path: Path) -> None:
    """A socket bound to the port the way an outgoing connection's is (no SO_REUSEADDR, not listening)."""
    problem = native_broker_available()
    if problem is not None:
        unavailable(problem)
    native = NativeBroker(tmp_path / "kafka", quick_jit=True)
    picked = native.port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", picked))
        native.start()  # nobody knows its address yet: it takes another port
    try:
        assert native.port != picked
        assert "Address already in use" in native.log_path.read_text()
        bootstrap = native.bootstrap
        topic = create_topic(bootstrap)
        produce(bootstrap, topic, b"k", b"v")
        native.stop()
        holder = socket.socket()
        holder.bind(("127.0.0.1", native.port))
        threading.Timer(3, holder.close).start()
        native.start()  # its clients know this address: it waits for the port
        assert native.bootstrap == bootstrap
        assert consume_one(bootstrap, topic).value() == b"v"
    finally:
        native.stop()


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-storage format takes "-t -..." for a missing argument: one random id in 64 would fail the start."""
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x00" * 16)])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(draws))
    cluster_id = broker.new_cluster_id()
    assert cluster_id == "AAAAAAAAAAAAAAAAAAAAAA"  # the second draw: the first would have begun with "-"
