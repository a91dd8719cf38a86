"""Every integer field a client controls, at the extremes of its range and of Avro's.

The fields are found by walking the Command schema (the envelope, every union branch,
nested records, arrays and the mutations of a batch), so a field added later is tested
without anyone remembering to. Each one is set, in an otherwise valid command, to
-2^63, -1, 0, 2^63 - 1, an Avro int's ends, and the ends of its named range
(`limits.INTEGER_FIELD_RANGES`) and one past them, then to random 64-bit values.
Whatever the value, the partition must not halt; the command gets a committed outcome
or a rejection with a closed error code — outside the field's range exactly the code
its range names (Validation, naming the field, unless told otherwise) — and the next
ordinary command still applies.

Avro writers refuse an `int` outside 32 bits, but the wire format is the same varint
as a long's and readers take any 64-bit value: commands here are written under the
current schema with every `int` widened to `long`, as a foreign producer could.
"""

from __future__ import annotations

import hashlib
import itertools
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyload import limits
from keyload.log.base import MAX_LOG_TIME_MS, MIN_LOG_TIME_MS
from keyload.log.codec import REGISTRY, expanded_current
from keyload.processors.apply import UNSTORED_KINDS
from keyload.processors.errors import ErrorCode
from keyload.processors.fingerprints import CHANGED_KINDS
from keyload.processors.payloads import proofs
from keyload.processors.policy import default_group_spec, default_spec, default_topic_spec
from keyload.projections import keys

from .support import (
    CANCEL,
    COMMAND,
    CONFIGURE_INBOX,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    DELETE_DOCUMENT,
    ENQUEUE,
    GROUP_RECEIVE,
    INSPECT_MESSAGE,
    NACK,
    PUBLISH,
    PUT_DOCUMENT,
    RECEIVE,
    REDRIVE,
    Embedded,
    create_group_body,
    enqueue_body,
    event,
    group_receive_body,
    list_documents_body,
    message_fence,
    mutation,
    publish_body,
    put_document_body,
    read_body,
    receive_body,
    wide_command,
)

D = "acme"
ENVELOPE = "envelope"  # the kind of the envelope's own fields: tested with every kind below
PARK_PENDING = "keyload.command.ParkPending"
PREPARE = "keyload.command.PrepareLargeSchedule"
PAUSE_GROUP = "keyload.command.PauseGroup"
AVRO_LONG_MIN, AVRO_LONG_MAX = -(2**63), 2**63 - 1
AVRO_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (AVRO_LONG_MIN, AVRO_LONG_MAX)}
HALTING = {str(ErrorCode.CORRUPTION), str(ErrorCode.RECOVERY_REQUIRED)}
CLOSED_CODES = {str(code) for code in ErrorCode} - HALTING


# -- the integer fields of the Command schema -------------------------------------------------------

Step = tuple[str, str]  # ("field", name), ("item", ""): an array's first item, ("branch", record): a union's


@dataclass(frozen=True, slots=True)
class IntegerField:
    kind: str  # the command kind whose body holds it, or ENVELOPE
    path: tuple[Step, ...]  # from the body (the envelope for ENVELOPE)
    name: str  # "Record.field", as limits.INTEGER_FIELD_RANGES names it
    avro_type: str

    @property
    def id(self) -> str:
        steps = [arg.rsplit(".", 1)[-1] if step == "branch" else (arg or "0") for step, arg in self.path]
        return f"{self.kind.rsplit('.', 1)[-1]}:{'.'.join(steps)}"


def _full_name(record: dict[str, Any]) -> str:
    name: str = record["name"]
    return name if "." in name else f"{record['namespace']}.{name}"


def integer_fields(schema: dict[str, Any]) -> list[IntegerField]:
    """Every int or long reachable from the Command schema, with the path that sets it."""
    named: dict[str, Any] = {}
    found: list[IntegerField] = []

    def none_within(node: Any, kind: str, path: tuple[Step, ...], name: str) -> None:
        before = len(found)
        value(node, kind, path, name)
        assert len(found) == before, f"{name}: an integer where this test cannot set it (a map, a mixed union)"

    def value(node: Any, kind: str, path: tuple[Step, ...], name: str) -> None:
        if isinstance(node, str):
            if node in ("int", "long"):
                found.append(IntegerField(kind, path, name, node))
            elif node in named:
                value(named[node], kind, path, name)
            return
        if isinstance(node, list):
            branches = [branch for branch in node if branch != "null"]
            if len(branches) == 1:  # an optional value: set in place
                value(branches[0], kind, path, name)
                return
            for branch in branches:
                target = named.get(branch, branch) if isinstance(branch, str) else branch
                if isinstance(target, dict) and target.get("type") == "record":
                    record(target, kind, (*path, ("branch", _full_name(target))))
                else:
                    none_within(target, kind, path, name)
            return
        if node["type"] == "record":
            record(node, kind, path)
        elif node["type"] == "array":
            value(node["items"], kind, (*path, ("item", "")), name)
        elif node["type"] == "map":
            none_within(node["values"], kind, path, name)
        elif node["type"] in ("int", "long"):
            found.append(IntegerField(kind, path, name, node["type"]))
        elif node["type"] in ("enum", "fixed"):
            named[_full_name(node)] = node

    def record(node: dict[str, Any], kind: str, path: tuple[Step, ...]) -> None:
        named[_full_name(node)] = node
        short = node["name"].rsplit(".", 1)[-1]
        for field in node["fields"]:
            value(field["type"], kind, (*path, ("field", field["name"])), f"{short}.{field['name']}")

    for field in schema["fields"]:
        if field["name"] == "body":
            for branch in field["type"]:
                assert isinstance(branch, dict), "every command kind is defined in the body union"
                record(branch, _full_name(branch), ())
        else:
            value(field["type"], ENVELOPE, (("field", field["name"]),), f"Command.{field['name']}")
    return found


SCHEMA = expanded_current(COMMAND)
FIELDS = integer_fields(SCHEMA)
BODY_FIELDS = [f for f in FIELDS if f.kind != ENVELOPE]
ENVELOPE_FIELDS = [f for f in FIELDS if f.kind == ENVELOPE]


# -- driving the embedded deployment ------------------------------------------------------------------

Outcome = dict[str, Any]
DEFERRED: Outcome = {"status": "deferred"}  # a long-poll receive waiting: its outcome comes later


class World:
    """The embedded deployment with fresh names on demand; `submit` writes any 64-bit value."""

    def __init__(self, embedded: Embedded) -> None:
        self.embedded = embedded
        self.names = itertools.count(1)

    def fresh(self, prefix: str) -> str:
        return f"{prefix}-{next(self.names)}"

    def submit(
        self, kind: str, body: dict[str, Any], *, reply_to: int | None = 0, client_time_ms: int | None = None
    ) -> Outcome | None:
        """Append and apply; the outcome as published to partition 0, or as stored (None: neither)."""
        embedded = self.embedded
        command_id = str(uuid.uuid4())
        envelope = {
            "command_id": command_id,
            "domain": D,
            "principal": "tester",
            "body": (kind, body),
            "reply_to": reply_to,
            "client_time_ms": client_time_ms,
        }
        cursor = embedded.outcomes.end_offset(0)
        offset = embedded.append(D, wide_command(envelope))
        embedded.run()
        halted = [p.halt for p in embedded.processors if p.halt is not None]
        assert not halted, halted
        for record in embedded.outcomes.read(0, cursor, 1_000):
            decoded = REGISTRY.decode("keyload.Outcome", record.value)
            if decoded["command_id"] == command_id:
                return decoded
        stored = embedded.stored_outcome(D, command_id)
        if stored is None:
            # Not published to partition 0, not stored: poison, or an unstored kind replying elsewhere.
            poison = embedded.store(D).get(keys.poison(offset)) is not None
            assert poison or kind in UNSTORED_KINDS or reply_to != 0, f"{kind} has no outcome"
            return None
        if len(stored) == 32:
            return DEFERRED
        return REGISTRY.decode("keyload.Outcome", stored[32:])

    def ok(self, kind: str, body: dict[str, Any]) -> Any:
        outcome = self.submit(kind, body)
        assert outcome is not None and outcome["status"] == "committed", outcome
        return outcome["result"][1]

    def still_applies(self) -> None:
        """An ordinary command after the one under test commits."""
        self.ok(ENQUEUE, enqueue_body("canary", self.fresh("m")))


def _queue(world: World, **policy: Any) -> str:
    name = world.fresh("q")
    world.ok(CREATE_QUEUE, {"queue": name, "policy": {**default_spec(), **policy}})
    return name


def _ready(world: World, queue: str) -> str:
    message_id = world.fresh("m")
    world.ok(ENQUEUE, enqueue_body(queue, message_id))
    return message_id


def _receive_body(queue: str, max_messages: int | None = None) -> dict[str, Any]:
    return {"queue": queue, "max_messages": max_messages, "max_bytes": None, "lease_ms": None, "wait_ms": None}


def _lease(world: World, queue: str) -> str:
    """The delivery token of the queue's one ready message."""
    [delivery] = world.ok(RECEIVE, _receive_body(queue, 1))["deliveries"]
    token: str = delivery["token"]
    return token


def _token(world: World) -> str:
    """A live delivery token of a fresh queue's only message."""
    queue = _queue(world)
    _ready(world, queue)
    return _lease(world, queue)


def _fence(world: World, queue: str, message_id: str) -> dict[str, Any]:
    meta = world.ok(INSPECT_MESSAGE, {"queue": queue, "message_id": message_id, "include_body": False})["meta"]
    return message_fence(queue, message_id, meta["state_version"], meta["delivery_generation"])


def _exhausted(world: World, **policy: Any) -> dict[str, Any]:
    """The fence of a message that used up its one attempt: dead-lettered, or pending under `policy`."""
    queue = _queue(world, max_attempts=1, **policy)
    message_id = _ready(world, queue)
    world.ok(NACK, {"token": _lease(world, queue), "delay_ms": None})
    return _fence(world, queue, message_id)


def _topic(world: World, events: int = 2) -> str:
    name = world.fresh("t")
    world.ok(CREATE_TOPIC, {"topic": name, "policy": default_topic_spec()})
    if events:
        world.ok(PUBLISH, publish_body(name, *(event(f"e{i}") for i in range(events))))
    return name


def _group(world: World, events: int = 2) -> tuple[str, str]:
    topic, group = _topic(world, events), world.fresh("g")
    world.ok(CREATE_GROUP, create_group_body(topic, group))
    return topic, group


def _group_token(world: World) -> dict[str, Any]:
    topic, group = _group(world)
    [delivery] = world.ok(GROUP_RECEIVE, group_receive_body(topic, group, max_events=1))["deliveries"]
    return {"topic": topic, "group": group, "token": delivery["token"]}


def _reservation_body(world: World) -> dict[str, Any]:
    data = b"large"
    return {
        "queue": "jobs",
        "message_id": world.fresh("big"),
        "length": len(data),
        "sha256": hashlib.sha256(data).digest(),
        "upload_window_ms": None,
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }


def _reservation(world: World) -> dict[str, Any]:
    reservation: dict[str, Any] = world.ok(PREPARE, _reservation_body(world))
    return reservation


def _commit(world: World) -> dict[str, Any]:
    """A CommitLargeSchedule of a fresh reservation, its proof unsigned (see _signed)."""
    reservation = _reservation(world)
    return {"reservation_id": reservation["reservation_id"], "proof": _proof(world, reservation)}


def _proof(world: World, reservation: dict[str, Any]) -> dict[str, Any]:
    return {
        "domain": D,
        "reservation_id": reservation["reservation_id"],
        "object_key": reservation["object_key"],
        "object_version": "v1",
        "length": reservation["length"],
        "sha256": reservation["sha256"],
        "trust_set_version": reservation["trust_set_version"],
        "key_id": reservation["trust_key_id"],
        "attested_at_ms": world.embedded.now_ms,
        "signature": b"",
    }


def _signed(world: World, body: dict[str, Any]) -> dict[str, Any]:
    """A CommitLargeSchedule whose proof is signed after the field under test was set: the check
    that follows the signature's sees the value."""
    proof = body["proof"]
    return dict(body, proof=dict(proof, signature=proofs.sign(world.embedded.data.keyring()[proof["key_id"]], proof)))


def _receive(world: World) -> dict[str, Any]:
    queue = _queue(world)
    _ready(world, queue)
    return _receive_body(queue)


def _paused_group(world: World) -> dict[str, Any]:
    topic, group = _group(world)
    world.ok(PAUSE_GROUP, {"topic": topic, "group": group})
    return {"topic": topic, "group": group, "expected_generation": 1, "filter": None, "policy": default_group_spec()}


def _document(world: World) -> str:
    key = world.fresh("doc")
    world.ok(PUT_DOCUMENT, put_document_body(key))
    return key


def _effects(world: World) -> list[dict[str, Any]]:
    return [mutation(PUT_DOCUMENT, put_document_body(world.fresh("doc")))]


Builder = Callable[[World], dict[str, Any]]

# A valid body of every command kind that has integer fields (a batch's mutations too).
BASES: dict[str, Builder] = {
    CREATE_QUEUE: lambda w: {"queue": w.fresh("q"), "policy": default_spec()},
    "keyload.command.ConfigureQueue": lambda w: {
        "queue": _queue(w),
        "policy": default_spec(),
        "expected_policy_version": None,
    },
    "keyload.command.DeleteQueue": lambda w: {"queue": _queue(w), "force": False, "expected_incarnation": None},
    "keyload.command.PurgeQueue": lambda w: {"queue": _queue(w), "expected_incarnation": None},
    ENQUEUE: lambda w: enqueue_body("jobs", w.fresh("m")),
    RECEIVE: _receive,
    "keyload.command.Renew": lambda w: {"token": _token(w), "lease_ms": None},
    NACK: lambda w: {"token": _token(w), "delay_ms": None},
    REDRIVE: lambda w: _exhausted(w),
    CANCEL: lambda w: _fence(w, "jobs", _ready(w, "jobs")),
    PARK_PENDING: lambda w: _exhausted(w, max_dead_letter_messages=0),
    "keyload.command.ListDeadLetters": lambda w: {
        "queue": "jobs",
        "after_sequence": None,
        "limit": 10,
        "include_body": False,
    },
    CREATE_TOPIC: lambda w: {"topic": w.fresh("t"), "policy": default_topic_spec()},
    "keyload.command.ReadTopic": lambda w: read_body(_topic(w), 1),
    CREATE_GROUP: lambda w: create_group_body(_topic(w), w.fresh("g"), start="position", position=1),
    GROUP_RECEIVE: lambda w: group_receive_body(*_group(w)),
    "keyload.command.GroupNack": lambda w: {**_group_token(w), "delay_ms": None},
    "keyload.command.GroupRenew": lambda w: {**_group_token(w), "lease_ms": None},
    "keyload.command.SeekGroup": lambda w: dict(
        zip(("topic", "group"), _group(w), strict=True), to="position", position=1, expected_generation=None
    ),
    "keyload.command.ConfigureGroup": _paused_group,
    "keyload.command.PurgeTopic": lambda w: {"topic": _topic(w), "through": 1, "expected_generation": 1},
    "keyload.command.DeleteTopic": lambda w: {"topic": _topic(w), "force": True, "expected_incarnation": None},
    "keyload.command.DeleteGroup": lambda w: {
        **dict(zip(("topic", "group"), _group(w), strict=True)),
        "force": True,
        "expected_incarnation": None,
    },
    "keyload.command.ConfigureTopic": lambda w: {
        "topic": _topic(w),
        "policy": default_topic_spec(),
        "expected_policy_version": None,
    },
    PUT_DOCUMENT: lambda w: put_document_body(w.fresh("doc")),
    DELETE_DOCUMENT: lambda w: {"key": _document(w), "expected_revision": 1},
    "keyload.command.ListDocuments": lambda w: list_documents_body(),
    "keyload.command.ListQueues": lambda w: {"prefix": "", "after": None, "max_queues": None},
    "keyload.command.ListTopics": lambda w: {"prefix": "", "after": None, "max_topics": None},
    "keyload.command.Batch": lambda w: {"mutations": _effects(w)},
    "keyload.command.CompleteProcessing": lambda w: {
        "token": _token(w),
        "handler_scope": "billing",
        "execution_generation": 0,
        "effects": _effects(w),
        "topic": None,
        "group": None,
    },
    CONFIGURE_INBOX: lambda w: {"max_receipts": 100, "max_bytes": 100_000},
    "keyload.command.CommitInbox": lambda w: {
        "source": {"domain": "orders", "queue": "jobs", "message_id": w.fresh("m"), "delivery_generation": 1},
        "handler_scope": "billing",
        "execution_generation": 0,
        "effects": _effects(w),
    },
    PREPARE: _reservation_body,
    "keyload.command.CancelLargeSchedule": lambda w: {"reservation_id": _reservation(w)["reservation_id"]},
    "keyload.command.CommitLargeSchedule": _commit,
    "keyload.command.InspectReservation": lambda w: {"reservation_id": _reservation(w)["reservation_id"]},
    "keyload.command.AdvanceRecoveryFloor": lambda w: {"floor_offset": 0},
    "keyload.command.ListRetention": lambda w: {"after_task": None, "limit": None},
    "keyload.command.BeginDelete": lambda w: {"task_id": 1},
    "keyload.command.DeleteConfirmed": lambda w: {"task_id": 1, "deleted_versions": []},
    "keyload.command.CheckpointPublished": lambda w: {"offset": 0, "manifest_sha256": bytes(32)},
    "keyload.command.RaiseFeatureLevel": lambda w: {"level": 0},
    # The least outcome horizon, so that every receipt horizon in range is at least it.
    "keyload.command.ConfigureDomain": lambda w: {
        "outcome_horizon_ms": limits.MIN_OUTCOME_HORIZON_MS,
        "receipt_horizon_ms": None,
        "expected_policy_version": None,
    },
    "keyload.command.ConfigureDomainCaps": lambda w: {
        "max_queues": None,
        "max_topics": None,
        "max_groups": None,
        "max_documents": None,
        "max_document_bytes": None,
        "expected_policy_version": None,
    },
    "keyload.command.PutPrincipal": lambda w: {
        "principal": w.fresh("p"),
        "key_id": "k0",
        "enabled": None,
        "grants": None,
        "expected_revision": None,
    },
}
# What a kind's body needs once the field under test is set.
FINISH: dict[str, Callable[[World, dict[str, Any]], dict[str, Any]]] = {
    "keyload.command.CommitLargeSchedule": _signed,
}


def with_value(world: World, node: Any, path: tuple[Step, ...], value: int) -> Any:
    """`node` with the integer at `path` set to `value` (a union's other branch replaced by a valid
    value of the branch the path takes)."""
    if not path:
        return value
    step, arg = path[0]
    if step == "field":
        return dict(node, **{arg: with_value(world, node[arg], path[1:], value)})
    if step == "item":
        assert node, "a base body has an item in every array the path steps into"
        return [with_value(world, node[0], path[1:], value), *node[1:]]
    branch, inner = node
    if branch != arg:
        branch, inner = arg, BASES[arg](world)
    return (branch, with_value(world, inner, path[1:], value))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """One partition, in memory where the machine has a tmpfs: these tests apply thousands of
    commands, and each group commit syncs the log."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else tmp_path) as root:
        embedded = Embedded(Path(root) / "data", partitions=1)
        try:
            w = World(embedded)
            for name in ("jobs", "canary"):
                w.ok(CREATE_QUEUE, {"queue": name, "policy": default_spec()})
            w.ok(CONFIGURE_INBOX, {"max_receipts": 1_000_000, "max_bytes": limits.MAX_INBOX_BYTES})
            # A retention task (task 1): an abandoned reservation's.
            w.ok("keyload.command.CancelLargeSchedule", {"reservation_id": _reservation(w)["reservation_id"]})
            yield w
        finally:
            embedded.close()


def extremes(field: IntegerField) -> list[int]:
    """-2^63, -1, 0, 2^63 - 1, an Avro int's ends, and the ends of the field's range and one past
    them: those an Avro long holds."""
    int_low, int_high = AVRO_RANGE["int"]
    values = {AVRO_LONG_MIN, -1, 0, AVRO_LONG_MAX, int_low - 1, int_low, int_high, int_high + 1}
    bound = limits.INTEGER_FIELD_RANGES[field.name]
    values |= {bound.minimum - 1, bound.minimum, bound.maximum, bound.maximum + 1}
    return sorted(v for v in values if AVRO_LONG_MIN <= v <= AVRO_LONG_MAX)


# processors/apply.py fingerprints these kinds (their record changed between Command versions)
# by encoding the command again under a schema, and fastavro cannot write an int past 32 bits
# there: a foreign writer's 64-bit value in an int field (or in reply_to) of one of them is
# refused with Validation (it has no fingerprint to be stored under), and the partition goes on.
REENCODED = frozenset(CHANGED_KINDS)


def writable(kind: str, field: IntegerField, value: int) -> bool:
    """Whether a command of `kind` with `field` at `value` gets past its fingerprint today."""
    low, high = AVRO_RANGE["int"]
    return field.avro_type == "long" or low <= value <= high or kind not in REENCODED


def check(world: World, field: IntegerField, value: int, outcome: Outcome | None) -> None:
    """The command under test ended with a closed code, out of range with its range's own; the
    partition goes on."""
    bound = limits.INTEGER_FIELD_RANGES[field.name]
    # Only an envelope's reply_to elsewhere (or poison, which a well-formed command never is) leaves none.
    assert outcome is not None or field.kind == ENVELOPE, (field.id, value)
    if outcome is not None and outcome is not DEFERRED:
        assert outcome["status"] in ("committed", "rejected"), outcome
        if outcome["status"] == "rejected":
            assert outcome["error_code"] in CLOSED_CODES, outcome
        if bound.code is not None and not bound.contains(value):
            assert (outcome["status"], outcome["error_code"]) == ("rejected", bound.code), (field.id, value, outcome)
            if bound.code == str(ErrorCode.VALIDATION):
                assert field.name.rsplit(".", 1)[1] in outcome["detail"], (field.id, outcome["detail"])
    world.still_applies()


def submit_with(world: World, field: IntegerField, value: int) -> Outcome | None:
    body = with_value(world, BASES[field.kind](world), field.path, value)
    finish = FINISH.get(field.kind)
    return world.submit(field.kind, body if finish is None else finish(world, body))


def test_the_schema_walk_finds_the_known_fields() -> None:
    names = {f.name for f in FIELDS}
    assert {"Enqueue.not_before_ms", "QueuePolicySpec.lease_ms", "InboxSource.delivery_generation"} <= names
    assert {"Command.reply_to", "Command.client_time_ms"} <= names
    ids = {f.id for f in FIELDS}
    assert "Batch:mutations.0.mutation.Enqueue.expires_at_ms" in ids
    assert "CommitLargeSchedule:proof.length" in ids


def test_every_integer_field_has_a_named_range_and_every_kind_a_base() -> None:
    assert {f.name for f in FIELDS} == set(limits.INTEGER_FIELD_RANGES)  # none missing, none stale
    assert {f.kind for f in BODY_FIELDS} <= set(BASES)


def test_widened_encoding_is_the_registry_encoding_for_values_that_fit() -> None:
    envelope = {
        "command_id": "c",
        "domain": D,
        "principal": "p",
        "body": (
            "keyload.command.Receive",
            {"queue": "q", "max_messages": 7, "max_bytes": 9, "lease_ms": None, "wait_ms": 5},
        ),
        "reply_to": 3,
        "client_time_ms": -(2**40),
    }
    assert wide_command(envelope) == REGISTRY.encode(COMMAND, envelope)


@pytest.mark.parametrize("field", BODY_FIELDS, ids=lambda f: f.id)
def test_extreme_values_never_halt_and_out_of_range_ones_are_refused(world: World, field: IntegerField) -> None:
    for value in extremes(field):
        if writable(field.kind, field, value):
            check(world, field, value, submit_with(world, field, value))


def test_a_wide_int_meets_the_handler_checks_in_their_order(world: World) -> None:
    """A value past 32 bits in an Avro int reaches the handler as it is (a body's integers have no
    range of their own, keyload/bodies.py): refused by the handler's checks in the order they run,
    with their words, as before bodies were typed."""
    missing = world.submit(RECEIVE, receive_body("no-such-queue", max_messages=2**31))
    assert missing is not None and (missing["error_code"], missing["detail"]) == ("NotFound", "queue does not exist")
    topic = _topic(world)
    refused = world.submit(CREATE_GROUP, create_group_body(topic, world.fresh("g"), max_attempts=2**40))
    assert refused is not None and refused["error_code"] == "Validation"
    assert refused["detail"] == f"policy.max_attempts must be between 1 and {limits.MAX_ATTEMPTS}"


ENVELOPE_KINDS = [
    RECEIVE,
    GROUP_RECEIVE,
    "keyload.command.ReadTopic",
    CREATE_GROUP,
    ENQUEUE,
    "keyload.command.ListRetention",
]


def submit_envelope(world: World, field: IntegerField, kind: str, value: int) -> Outcome | None:
    body = BASES[kind](world)
    # Receives find nothing and wait: a waiter keeps its reply_to.
    if kind == RECEIVE:
        body = dict(body, queue=_queue(world), wait_ms=limits.MAX_WAIT_MS)
    elif kind == GROUP_RECEIVE:
        body = group_receive_body(*_group(world, events=0), wait_ms=limits.MAX_WAIT_MS)
    if field.path == (("field", "reply_to"),):
        return world.submit(kind, body, reply_to=value)
    assert field.path == (("field", "client_time_ms"),), f"an envelope field this test does not know: {field}"
    return world.submit(kind, body, client_time_ms=value)


@pytest.mark.parametrize("kind", ENVELOPE_KINDS, ids=lambda k: k.rsplit(".", 1)[-1])
@pytest.mark.parametrize("field", ENVELOPE_FIELDS, ids=lambda f: f.id)
def test_envelope_integers_at_the_extremes(world: World, field: IntegerField, kind: str) -> None:
    for value in extremes(field):
        if writable(kind, field, value):
            check(world, field, value, submit_envelope(world, field, kind, value))


RE_ENCODED_INTS = [
    *((f, f.kind) for f in BODY_FIELDS if f.avro_type == "int" and f.kind in REENCODED),
    *((f, kind) for f in ENVELOPE_FIELDS if f.avro_type == "int" for kind in ENVELOPE_KINDS if kind in REENCODED),
]


@pytest.mark.parametrize(
    ("field", "kind"), RE_ENCODED_INTS, ids=[f"{f.id}-{k.rsplit('.', 1)[-1]}" for f, k in RE_ENCODED_INTS]
)
def test_ints_past_32_bits_in_re_encoded_kinds(world: World, field: IntegerField, kind: str) -> None:
    for value in extremes(field):
        if not writable(kind, field, value):
            outcome = (
                submit_with(world, field, value)
                if field.kind != ENVELOPE
                else submit_envelope(world, field, kind, value)
            )
            check(world, field, value, outcome)


UNSORTED = {"z": "1", "a": "2"}  # a map out of key order: the fingerprint encodes the command again, sorted


@pytest.mark.parametrize("field", ["max_attempts", "reply_to"])
def test_ints_past_32_bits_in_commands_with_unsorted_maps(world: World, field: str) -> None:
    """A group policy's int past 32 bits beside an unsorted filter; a reply_to past 32 bits beside
    unsorted headers."""
    if field == "max_attempts":
        body = create_group_body(_topic(world), world.fresh("g"), headers=UNSORTED, max_attempts=AVRO_LONG_MAX)
        outcome = world.submit(CREATE_GROUP, body)
    else:
        body = enqueue_body("jobs", world.fresh("m"), headers=UNSORTED)
        outcome = world.submit(ENQUEUE, body, reply_to=AVRO_RANGE["int"][1] + 1)
    assert outcome is None or outcome["status"] == "rejected", outcome  # poison, or refused
    world.still_applies()


def _values(field: IntegerField) -> st.SearchStrategy[int]:
    """Any Avro long; for an int of a kind apply.py re-encodes, any Avro int (see REENCODED)."""
    low, high = AVRO_RANGE["int" if field.avro_type == "int" and field.kind in REENCODED else "long"]
    return st.integers(low, high)


@pytest.mark.parametrize("field", BODY_FIELDS, ids=lambda f: f.id)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_64_bit_values_never_halt(world: World, field: IntegerField, data: st.DataObject) -> None:
    value = data.draw(_values(field))
    check(world, field, value, submit_with(world, field, value))


def test_named_ranges_hold_their_relations() -> None:
    for kind in ("Enqueue", "PrepareLargeSchedule"):
        not_before = limits.INTEGER_FIELD_RANGES[f"{kind}.not_before_ms"]
        assert (not_before.minimum, not_before.maximum) == (AVRO_LONG_MIN, MAX_LOG_TIME_MS)  # at or before now: ready
        expires_at = limits.INTEGER_FIELD_RANGES[f"{kind}.expires_at_ms"]
        assert (expires_at.minimum, expires_at.maximum) == (MIN_LOG_TIME_MS, AVRO_LONG_MAX)  # past the range: never
    for bound in limits.INTEGER_FIELD_RANGES.values():
        assert AVRO_LONG_MIN <= bound.minimum <= bound.maximum <= AVRO_LONG_MAX
        assert bound.code is None or str(bound.code) in CLOSED_CODES
    for field in FIELDS:
        if field.avro_type == "int":  # what a conforming writer can put there covers the range
            low, high = AVRO_RANGE["int"]
            assert low <= limits.INTEGER_FIELD_RANGES[field.name].minimum
            assert limits.INTEGER_FIELD_RANGES[field.name].maximum <= high
    # Every key a client's in-range value is packed into is a u64, with room for one record's growth.
    assert 0 <= limits.MAX_SEQUENCE + limits.MAX_SEQUENCE_STEP <= keys.MAX_U64_ID
