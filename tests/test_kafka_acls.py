"""The topic ACLs of ARCHITECTURE.md §7a, on a real broker with SASL users and Kafka's authorizer on.

Each keyload part connects as its own Kafka user ($KEYLOAD_KAFKA_CLIENT_CONFIG): the processor service as
`processor`, the SDK as `client`. Granted exactly the table's ACLs, the whole path works (topics created and
checked, access control turned on, a message enqueued, received and acked, a checkpoint published); and what the
table withholds the broker refuses: a client cannot forge an outcome or read the commands or the catalog, and a
user with no ACLs cannot append a command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from devtools.broker import NativeBroker, native_broker_available
from keyload import Client, Credential
from keyload.operations.catalog import CatalogError
from keyload.storage.datadir import KAFKA_CLIENT_CONFIG_ENV, DataDir, KafkaConfig

from .kafka import unavailable
from .support import served_url, start_service, stop_service, wait_until

pytestmark = pytest.mark.slow

PREFIX = "acl"
USERS = {"processor": "processor-secret", "client": "client-secret", "intruder": "intruder-secret"}
COMMANDS, OUTCOMES, CATALOG = f"{PREFIX}.commands", f"{PREFIX}.outcomes", f"{PREFIX}.checkpoints"
Op = AclOperation

# The table of §7a: user → [(resource type, name, pattern, operations)].
TABLE: dict[str, list[tuple[ResourceType, str, ResourcePatternType, list[AclOperation]]]] = {
    "processor": [
        (ResourceType.TOPIC, COMMANDS, ResourcePatternType.LITERAL, [Op.READ, Op.WRITE, Op.DESCRIBE]),
        # Write: the outcomes; Read: the HTTP API's answers, from the processor's reply partition
        (ResourceType.TOPIC, OUTCOMES, ResourcePatternType.LITERAL, [Op.READ, Op.WRITE, Op.DESCRIBE]),
        (ResourceType.TOPIC, CATALOG, ResourcePatternType.LITERAL, [Op.READ, Op.WRITE, Op.DESCRIBE]),
        # ensure_topics: create what is missing, check the settings of what is there
        (ResourceType.TOPIC, f"{PREFIX}.", ResourcePatternType.PREFIXED, [Op.CREATE, Op.DESCRIBE_CONFIGS]),
        (ResourceType.GROUP, f"{PREFIX}.processors", ResourcePatternType.LITERAL, [Op.READ]),
        (ResourceType.GROUP, f"{PREFIX}.reader", ResourcePatternType.LITERAL, [Op.DESCRIBE]),
    ],
    "client": [
        (ResourceType.TOPIC, COMMANDS, ResourcePatternType.LITERAL, [Op.WRITE, Op.DESCRIBE]),
        (ResourceType.TOPIC, OUTCOMES, ResourcePatternType.LITERAL, [Op.READ, Op.DESCRIBE]),
        (ResourceType.GROUP, f"{PREFIX}.reader", ResourcePatternType.LITERAL, [Op.DESCRIBE]),
    ],
}


@pytest.fixture
def sasl_broker(tmp_path: Path) -> Iterator[NativeBroker]:
    problem = native_broker_available()
    if problem is not None:
        unavailable(problem)
    with NativeBroker(tmp_path / "kafka", quick_jit=True, sasl_users=USERS) as broker:
        yield broker


def grant_table(broker: NativeBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # the harness's super-user listener
    bindings = [
        AclBinding(kind, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW)
        for user, rows in TABLE.items()
        for kind, name, pattern, operations in rows
        for operation in operations
    ]
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result(timeout=30)
    # The broker applies ACLs from the metadata log a moment after the controller commits them: wait
    # until one of them (the processor's Create on the prefix) is in force.
    probe = AdminClient(sasl_config(broker, "processor"))

    def created() -> bool:
        [future] = probe.create_topics([NewTopic(f"{PREFIX}.probe", 1, 1)], request_timeout=10).values()
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            return exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
        return True

    wait_until(created, 60, "the ACLs in force")


def sasl_config(broker: NativeBroker, user: str) -> dict[str, str]:
    return {
        "bootstrap.servers": broker.sasl_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": USERS[user],
    }


def connect_as(monkeypatch: pytest.MonkeyPatch, broker: NativeBroker, user: str, folder: Path) -> None:
    """Make the keyload parts this process creates, and the processes it starts, connect as `user`."""
    path = folder / f"{user}.properties"
    settings = {key: value for key, value in sasl_config(broker, user).items() if key != "bootstrap.servers"}
    path.write_text("# librdkafka settings\n" + "".join(f"{key}={value}\n" for key, value in settings.items()))
    monkeypatch.setenv(KAFKA_CLIENT_CONFIG_ENV, str(path))


def produce_error(broker: NativeBroker, user: str, topic: str) -> KafkaError | None:
    """The error the broker answers `user` producing one record to `topic` with, None if it was accepted."""
    producer = Producer({**sasl_config(broker, user), "message.timeout.ms": 20_000})
    results: list[KafkaError | None] = []
    producer.produce(topic, b"forged", partition=0, on_delivery=lambda err, _msg: results.append(err))
    producer.flush(30)
    assert results, "no delivery report"
    return results[0]


def fetch_error(broker: NativeBroker, user: str, topic: str) -> KafkaError | None:
    """The error the broker answers `user` fetching `topic` from its start with, None if records came back."""
    consumer = Consumer({**sasl_config(broker, user), "group.id": f"{PREFIX}.reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(40):
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                return None
            if error.code() != KafkaError._PARTITION_EOF:
                return error
        raise AssertionError(f"{user} got neither records nor an error from {topic}")
    finally:
        consumer.close()


def test_the_documented_acls_are_enough_and_what_they_withhold_is_refused(
    sasl_broker: NativeBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grant_table(sasl_broker)
    root = tmp_path / "data"
    DataDir.create(root, 2, kafka=KafkaConfig(sasl_broker.sasl_bootstrap, PREFIX), object_store=tmp_path / "objects")

    connect_as(monkeypatch, sasl_broker, "processor", tmp_path)
    service = start_service(root, "--checkpoint-every", "5")
    try:
        connect_as(monkeypatch, sasl_broker, "client", tmp_path)
        with Client(root, timeout_s=60) as client:
            client.create_queue("shop", "orders")
            client.enqueue("shop", "orders", b"one", message_id="m-1")
            [delivery] = client.receive("shop", "orders").deliveries
            assert delivery.body == b"one"
            assert client.ack("shop", delivery.token).state == "acked"
        connect_as(monkeypatch, sasl_broker, "processor", tmp_path)  # the catalog is the processors'
        catalog = DataDir.open(root).catalog()
        try:
            wait_until(lambda: any(catalog.entries(p) for p in range(2)), 60, "a published checkpoint")
        finally:
            catalog.close()
    finally:
        stopped = stop_service(service, 30)
    assert stopped == 0
    service = start_service(root)  # a restart reads the catalog, now not empty, before it fetches
    try:
        connect_as(monkeypatch, sasl_broker, "client", tmp_path)
        with Client(root, timeout_s=60) as client:
            client.enqueue("shop", "orders", b"two", message_id="m-2")
            assert [d.body for d in client.receive("shop", "orders").deliveries] == [b"two"]
        # The processor's HTTP API, which produces as the processor and reads its answers from the outcomes.
        administrator = Credential.load(root / "credentials" / "keyload-admin.json")
        with Client(served_url(root), credential=administrator, timeout_s=60) as remote:
            remote.enqueue("shop", "orders", b"three", message_id="m-3")
            assert [d.body for d in remote.receive("shop", "orders").deliveries] == [b"three"]
    finally:
        stopped = stop_service(service, 30)
    assert stopped == 0

    authorization = KafkaError.TOPIC_AUTHORIZATION_FAILED
    forged = produce_error(sasl_broker, "client", OUTCOMES)
    assert forged is not None and forged.code() == authorization, forged
    refused = fetch_error(sasl_broker, "client", COMMANDS)
    assert refused is not None and refused.code() == authorization, refused
    catalog = DataDir.open(root).catalog()
    try:
        with pytest.raises(CatalogError, match=CATALOG):  # a topic one may not describe is one the broker hides
            catalog.entries(0)
    finally:
        catalog.close()
    stranger = produce_error(sasl_broker, "intruder", COMMANDS)
    assert stranger is not None and stranger.code() == authorization, stranger
    assert produce_error(sasl_broker, "client", COMMANDS) is None  # the client's own right, for contrast
