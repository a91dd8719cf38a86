"""The test brokers are real Kafka: topics, produce and consume work, and a restarted broker keeps its data."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from keyload.broker import NativeBroker


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
