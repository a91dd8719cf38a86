"""The lease lifecycle through the real processor, file log and RocksDB: tokens, retries, dead letters.

Every refusal is checked to leave the projection as it was apart from the stored
rejection outcome (and the partition's position in the meta family).
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.operations.recovery import replay
from keyload.processors import tokens
from keyload.processors.apply import FINGERPRINT_BYTES
from keyload.projections import keys
from keyload.sdk.results import (
    AckBatchResult,
    DeadLetterPage,
    Delivery,
    EnqueueResult,
    LeaseResult,
    MessageMeta,
    MessageView,
    Outcome,
    QueueCounters,
    QueueView,
    ReceiveResult,
    TickResult,
    TokenResult,
)

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_MESSAGE,
    INSPECT_QUEUE,
    TICK,
    Embedded,
    command,
    create_queue_body,
    enqueue_body,
)

RECEIVE = "keyload.command.Receive"
RENEW = "keyload.command.Renew"
ACK = "keyload.command.Ack"
ACK_BATCH = "keyload.command.AckBatch"
NACK = "keyload.command.Nack"
REDRIVE = "keyload.command.Redrive"
CANCEL = "keyload.command.Cancel"
PARK_PENDING = "keyload.command.ParkPending"
LIST_DEAD_LETTERS = "keyload.command.ListDeadLetters"
ROTATE_KEYS = "keyload.command.RotateKeys"

D = "acme"
LEASE_OPS = ("ack", "renew", "nack")


# -- helpers -----------------------------------------------------------------------------


def submit_as(
    embedded: Embedded,
    kind: str,
    body: dict[str, Any],
    principal: str = "tester",
    domain: str = D,
    command_id: str | None = None,
) -> Outcome:
    """Like Embedded.submit, under any principal and domain."""
    command_id = command_id or str(uuid.uuid4())
    cursor = embedded.outcomes.end_offset(0)
    embedded.append(domain, command(domain, kind, body, command_id, principal=principal, reply_to=0))
    embedded.run()
    for record in embedded.outcomes.read(0, cursor, 1_000):
        decoded = REGISTRY.decode("keyload.Outcome", record.value)
        if decoded["command_id"] == command_id:
            return Outcome.from_record(decoded)
    raise AssertionError(f"no outcome published for {command_id}")


def committed(embedded: Embedded, kind: str, body: dict[str, Any], domain: str = D) -> Any:
    outcome = submit_as(embedded, kind, body, domain=domain)
    assert outcome.status == "committed", outcome
    return outcome.result


def receive(
    embedded: Embedded,
    queue: str = "jobs",
    max_messages: int | None = None,
    max_bytes: int | None = None,
    lease_ms: int | None = None,
    domain: str = D,
) -> list[Delivery]:
    body = {"queue": queue, "max_messages": max_messages, "max_bytes": max_bytes, "lease_ms": lease_ms}
    result = committed(embedded, RECEIVE, body, domain)
    assert isinstance(result, ReceiveResult)
    return result.deliveries


def lease_op(op: str, token: str) -> tuple[str, dict[str, Any]]:
    if op == "ack":
        return ACK, {"token": token}
    if op == "renew":
        return RENEW, {"token": token, "lease_ms": None}
    return NACK, {"token": token, "delay_ms": None}


def lease(embedded: Embedded, op: str, token: str, **fields: Any) -> LeaseResult:
    kind, body = lease_op(op, token)
    result = committed(embedded, kind, {**body, **fields})
    assert isinstance(result, LeaseResult)
    return result


def message(embedded: Embedded, message_id: str, queue: str = "jobs") -> MessageView:
    result = committed(embedded, INSPECT_MESSAGE, {"queue": queue, "message_id": message_id, "include_body": True})
    assert isinstance(result, MessageView)
    return result


def meta(embedded: Embedded, message_id: str, queue: str = "jobs") -> MessageMeta:
    return message(embedded, message_id, queue).meta


def counters(embedded: Embedded, queue: str = "jobs") -> QueueCounters:
    result = committed(embedded, INSPECT_QUEUE, {"queue": queue})
    assert isinstance(result, QueueView)
    return result.counters


def tick(embedded: Embedded) -> TickResult:
    result = committed(embedded, TICK, {})
    assert isinstance(result, TickResult)
    return result


def enqueue(embedded: Embedded, message_id: str, body: bytes = b"x", queue: str = "jobs", **fields: Any) -> None:
    result = committed(embedded, ENQUEUE, enqueue_body(queue, message_id, body, **fields))
    assert isinstance(result, EnqueueResult)


def fence(queue: str, message_id: str, current: MessageMeta) -> dict[str, Any]:
    return {
        "queue": queue,
        "message_id": message_id,
        "expected_state_version": current.state_version,
        "expected_delivery_generation": current.delivery_generation,
    }


def projection(embedded: Embedded, domain: str = D) -> dict[bytes, bytes]:
    return dict(embedded.store(domain).scan(b"\x00", b"\xff"))


def outside_meta_and_outcomes(state: dict[bytes, bytes]) -> dict[bytes, bytes]:
    return {k: v for k, v in state.items() if k[:1] not in (keys.META, keys.OUTCOME)}


def refused(
    embedded: Embedded,
    kind: str,
    body: dict[str, Any],
    code: str,
    principal: str = "tester",
    domain: str = D,
) -> Outcome:
    """Submit a command that must be refused with `code` and change nothing but its stored outcome."""
    before = projection(embedded, domain)
    outcome = submit_as(embedded, kind, body, principal=principal, domain=domain)
    assert (outcome.status, outcome.error_code) == ("rejected", code), outcome
    after = projection(embedded, domain)
    assert outside_meta_and_outcomes(after) == outside_meta_and_outcomes(before)
    new_keys = set(after) - set(before)
    assert new_keys == {keys.outcome(domain, outcome.command_id)}
    assert all(after[k] == v for k, v in before.items() if k[:1] == keys.OUTCOME)
    for text in body.get("tokens", [body.get("token")]):
        if text:
            assert text not in outcome.detail  # details never echo tokens
    return outcome


def fill_due_timers(embedded: Embedded, due_ms: int, records: int) -> None:
    """Enough not-before timers due at `due_ms` that each of the next `records` records spends its
    whole examination budget on them (timers fire earliest first)."""
    committed(embedded, CREATE_QUEUE, create_queue_body("filler"))
    for i in range(limits.TICK_EXAMINATION_BUDGET * records):
        embedded.append(D, command(D, ENQUEUE, enqueue_body("filler", f"f{i}", b"", not_before_ms=due_ms)))
    embedded.run()
    assert counters(embedded, "filler").scheduled == limits.TICK_EXAMINATION_BUDGET * records


def two_key_root(root: Path) -> None:
    """A data directory whose keyring holds k0 and k1, prepared before the deployment opens it."""
    root.mkdir(parents=True)
    material = {k: base64.b64encode(bytes([i + 1]) * 32).decode("ascii") for i, k in enumerate(("k0", "k1"))}
    (root / "keyring.json").write_text(json.dumps({"format": 1, "keys": material}))


# -- 1. token fencing ----------------------------------------------------------------------


@pytest.mark.parametrize("op", LEASE_OPS)
def test_token_of_an_expired_lease_is_stale_before_and_after_redelivery(embedded: Embedded, op: str) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", lease_ms=1_000))
    enqueue(embedded, "m1")
    [first] = receive(embedded)
    embedded.now_ms = first.lease_until_ms
    assert tick(embedded).transitions == 1  # the lease timer ends the attempt
    assert meta(embedded, "m1").state == "scheduled"
    # Expired but not re-received yet: the lease is over, so the token is stale (see LeaseExpired below).
    refused(embedded, *lease_op(op, first.token), "StaleLease")
    embedded.now_ms += 1_000
    [second] = receive(embedded)
    assert (second.message_id, second.attempts, second.delivery_generation) == ("m1", 2, 1)
    refused(embedded, *lease_op(op, first.token), "StaleLease")
    # The current token still works.
    assert lease(embedded, op, second.token).state == {"ack": "acked", "renew": "leased", "nack": "scheduled"}[op]


def test_lease_expired_is_what_a_token_gets_only_while_due_timers_wait_for_budget(embedded: Embedded) -> None:
    """Every record fires due timers first, so a lease past its deadline is normally already
    reclaimed (StaleLease above). LeaseExpired is reached only when more than the examination
    budget of earlier timers is due, so the lease timer has not been examined yet."""
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    enqueue(embedded, "m1")
    start = embedded.now_ms
    [delivery] = receive(embedded, lease_ms=100)
    fill_due_timers(embedded, start + 10, records=3)
    embedded.now_ms = start + 120  # past the lease deadline
    # Each of these records spends its whole budget on 256 filler timers.
    for op in LEASE_OPS:
        outcome = submit_as(embedded, *lease_op(op, delivery.token))
        assert (outcome.status, outcome.error_code) == ("rejected", "LeaseExpired"), outcome
    # The next record reaches the lease timer: the attempt ends, and the token is stale from now on.
    assert (meta(embedded, "m1").state, counters(embedded, "filler").ready) == ("scheduled", 768)
    assert submit_as(embedded, *lease_op("ack", delivery.token)).error_code == "StaleLease"


def test_foreign_principal_is_denied(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    enqueue(embedded, "m1")
    [delivery] = receive(embedded)
    for op in LEASE_OPS:
        refused(embedded, *lease_op(op, delivery.token), "PermissionDenied", principal="mallory")
    batch = submit_as(embedded, ACK_BATCH, {"tokens": [delivery.token]}, principal="mallory").result
    assert batch == AckBatchResult(
        results=[TokenResult(status="rejected", error_code="PermissionDenied", message_id=None)]
    )
    assert lease(embedded, "ack", delivery.token).state == "acked"


def test_tampered_tokens_are_invalid(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    enqueue(embedded, "m1")
    [delivery] = receive(embedded)
    token = delivery.token
    flip = {"A": "B"}

    def flipped(at: int) -> str:
        return token[:at] + flip.get(token[at], "A") + token[at + 1 :]

    # The last base64 character carries padding bits a flip may not change: every other one matters.
    tampered = [flipped(at) for at in range(len(token) - 1)]
    assert len(tampered) <= limits.MAX_ACK_BATCH
    for op in LEASE_OPS:
        refused(embedded, *lease_op(op, tampered[len(token) // 2]), "TokenInvalidated")
    batch = committed(embedded, ACK_BATCH, {"tokens": tampered})
    assert isinstance(batch, AckBatchResult)
    assert batch.results == [TokenResult(status="rejected", error_code="TokenInvalidated", message_id=None)] * len(
        tampered
    )
    assert meta(embedded, "m1").state == "leased"
    assert lease(embedded, "ack", token).state == "acked"


@pytest.mark.parametrize(
    "garbage",
    ["", "garbage", "v1.", "v1.!!!!", "v1.AAAA", "v2." + "A" * 90, "v1." + "A" * 2_000, "v1.\u00fc\u00fc\u00fc\u00fc"],
)
def test_garbage_tokens_are_invalid(embedded: Embedded, garbage: str) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    enqueue(embedded, "m1")
    receive(embedded)
    for op in LEASE_OPS:
        refused(embedded, *lease_op(op, garbage), "TokenInvalidated")


def test_tokens_of_another_domain_deployment_or_queue_are_invalid(embedded: Embedded, tmp_path: Path) -> None:
    partition = embedded.partition(D)
    same = next(f"d{i}" for i in range(1_000) if embedded.partition(f"d{i}") == partition)
    other = next(f"d{i}" for i in range(1_000) if embedded.partition(f"d{i}") != partition)
    for domain in (D, same, other):
        committed(embedded, CREATE_QUEUE, create_queue_body("jobs"), domain)
        committed(embedded, ENQUEUE, enqueue_body("jobs", "m1"), domain)
    committed(embedded, CREATE_QUEUE, create_queue_body("sibling"))
    committed(embedded, ENQUEUE, enqueue_body("sibling", "m1"))
    [delivery] = receive(embedded)
    [sibling] = receive(embedded, "sibling")
    receive(embedded, domain=same)
    receive(embedded, domain=other)
    for domain in (same, other):  # another domain's queue of the same name, in this partition and another
        for op in LEASE_OPS:
            refused(embedded, *lease_op(op, delivery.token), "TokenInvalidated", domain=domain)
    # The same token shape naming the sibling queue's incarnation, signed for "jobs": not valid for either.
    parsed = tokens.parse(sibling.token)
    forged = tokens.issue(
        embedded.data.keyring(),
        parsed.key_id,
        domain=D,
        queue="jobs",
        incarnation=parsed.incarnation,
        message_id="m1",
        principal="tester",
        delivery_generation=1,
        lease_version=1,
    )
    refused(embedded, *lease_op("ack", forged), "TokenInvalidated")
    # A second deployment with the same history signs with its own key.
    twin = Embedded(tmp_path / "twin", partitions=embedded.data.partitions)
    try:
        committed(twin, CREATE_QUEUE, create_queue_body("jobs"))
        committed(twin, ENQUEUE, enqueue_body("jobs", "m1"))
        [twin_delivery] = receive(twin)
        assert tokens.parse(twin_delivery.token).incarnation == tokens.parse(delivery.token).incarnation
        for op in LEASE_OPS:
            refused(twin, *lease_op(op, delivery.token), "TokenInvalidated")
            refused(embedded, *lease_op(op, twin_delivery.token), "TokenInvalidated")
    finally:
        twin.close()
    assert lease(embedded, "ack", delivery.token).state == "acked"
    assert lease(embedded, "ack", sibling.token).state == "acked"


@pytest.mark.parametrize("op", LEASE_OPS)
def test_token_is_stale_after_redrive(embedded: Embedded, op: str) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    enqueue(embedded, "m1")
    [old] = receive(embedded)
    assert lease(embedded, "nack", old.token).state == "dead_lettered"
    refused(embedded, *lease_op(op, old.token), "StaleLease")
    redriven = committed(embedded, REDRIVE, fence("jobs", "m1", meta(embedded, "m1")))
    assert isinstance(redriven, MessageView)
    assert (redriven.meta.state, redriven.meta.attempts, redriven.meta.delivery_generation) == ("ready", 0, 2)
    refused(embedded, *lease_op(op, old.token), "StaleLease")
    [new] = receive(embedded)
    assert (new.attempts, new.delivery_generation) == (1, 2)
    refused(embedded, *lease_op(op, old.token), "StaleLease")
    assert lease(embedded, "ack", new.token).state == "acked"


def test_tokens_signed_before_a_key_rotation_stay_valid(tmp_path: Path) -> None:
    root = tmp_path / "data"
    two_key_root(root)
    embedded = Embedded(root, partitions=1)
    try:
        committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
        for i in range(2):
            enqueue(embedded, f"m{i}")
        [before] = receive(embedded, max_messages=1)
        keys_now = committed(embedded, ROTATE_KEYS, {"token_key_id": "k1", "jitter_key_id": None})
        assert (keys_now.token_key_id, keys_now.jitter_key_id) == ("k1", "k0")
        [after] = receive(embedded, max_messages=1)
        assert tokens.parse(before.token).key_id == "k0" and tokens.parse(after.token).key_id == "k1"
        assert lease(embedded, "ack", before.token).state == "acked"
        assert lease(embedded, "ack", after.token).state == "acked"
    finally:
        embedded.close()


# -- 2. retry schedule -----------------------------------------------------------------------


def test_retry_schedule_is_exact_in_log_time(embedded: Embedded) -> None:
    policy = {"lease_ms": 1_000, "retry_base_ms": 1_000, "retry_factor": 2, "retry_max_ms": 1_500, "max_attempts": 3}
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", **policy))
    enqueue(embedded, "m1", b"payload")
    [first] = receive(embedded)
    assert first.attempts == 1
    # Failure 1: the lease runs out (a record at exactly the deadline reclaims it).
    embedded.now_ms = first.lease_until_ms - 1
    assert tick(embedded).transitions == 0
    embedded.now_ms = first.lease_until_ms
    assert tick(embedded) == TickResult(transitions=1, budget_exhausted=False, next_due_ms=first.lease_until_ms + 1_000)
    current = meta(embedded, "m1")
    assert (current.state, current.attempts, current.last_retry_delay_ms) == ("scheduled", 1, 1_000)
    assert current.not_before_ms == first.lease_until_ms + 1_000
    embedded.now_ms = current.not_before_ms - 1
    assert receive(embedded) == []
    embedded.now_ms += 1
    [second] = receive(embedded)
    assert second.attempts == 2
    # Failure 2: a nack; backoff min(1000 * 2, 1500).
    nacked = lease(embedded, "nack", second.token)
    failed_at = embedded.now_ms
    assert nacked == LeaseResult(
        message_id="m1", state="scheduled", lease_until_ms=None, not_before_ms=failed_at + 1_500, retry_delay_ms=1_500
    )
    assert meta(embedded, "m1").last_retry_delay_ms == 1_500
    embedded.now_ms = failed_at + 1_499
    assert receive(embedded) == []
    embedded.now_ms = failed_at + 1_500
    [third] = receive(embedded)
    assert third.attempts == 3
    # Failure 3: attempts are used up; the lease running out dead-letters, keeping the body.
    embedded.now_ms = third.lease_until_ms
    tick(embedded)
    parked = message(embedded, "m1")
    assert (parked.meta.state, parked.meta.attempts, parked.body) == ("dead_lettered", 3, b"payload")
    assert (parked.meta.parked_sequence, parked.meta.dead_lettered_at_ms) == (1, third.lease_until_ms)
    c = counters(embedded)
    assert (c.dead_lettered, c.dead_letter_bytes, c.stored_messages, c.stored_bytes) == (1, 7, 1, 7)
    assert (c.leased, c.scheduled, c.ready) == (0, 0, 0)


def test_nack_with_its_own_delay(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_lease_ms=60_000, lease_ms=1_000))
    enqueue(embedded, "m1")
    [delivery] = receive(embedded)
    for delay in (-1, 60_001):
        refused(embedded, NACK, {"token": delivery.token, "delay_ms": delay}, "Validation")
    now = embedded.now_ms
    assert lease(embedded, "nack", delivery.token, delay_ms=60_000) == LeaseResult(
        message_id="m1", state="scheduled", lease_until_ms=None, not_before_ms=now + 60_000, retry_delay_ms=60_000
    )
    embedded.now_ms += 60_000
    [again] = receive(embedded)
    # Delay 0: scheduled at its own evaluation time, so the very next record makes it ready.
    assert lease(embedded, "nack", again.token, delay_ms=0).not_before_ms == embedded.now_ms
    [third] = receive(embedded)
    assert third.attempts == 3


def _drive_jitter(root: Path, keyring_from: Path | None, restart: bool) -> tuple[Embedded, list[tuple[str, int]]]:
    """Three rounds of failures under full jitter, with fixed command ids and log times.

    Even messages are nacked, odd ones run out their lease. With `restart`, the
    deployment is closed with round 2's receive appended but not applied, and reopened:
    the processor resumes at the projection's applied offset.
    """
    if keyring_from is not None:
        root.mkdir(parents=True)
        shutil.copy(keyring_from / "keyring.json", root / "keyring.json")
    embedded = Embedded(root, partitions=1)

    def run(cid: str, kind: str, body: dict[str, Any]) -> None:
        embedded.append(D, command(D, kind, body, cid))
        embedded.run()

    def stored(cid: str) -> Any:
        raw = embedded.stored_outcome(D, cid)
        assert raw is not None
        outcome = Outcome.from_record(REGISTRY.decode("keyload.Outcome", raw[FINGERPRINT_BYTES:]))
        assert outcome.status == "committed", outcome
        return outcome.result

    def stored_meta(message_id: str) -> dict[str, Any]:
        raw = embedded.store(D).get(keys.message(1, message_id))
        assert raw is not None
        decoded: dict[str, Any] = REGISTRY.decode("keyload.MessageMeta", raw)
        return decoded

    policy = {"lease_ms": 100, "retry_base_ms": 1_000, "retry_max_ms": 3_000, "max_attempts": 4}
    run("create", CREATE_QUEUE, create_queue_body("jobs", retry_jitter="full", **policy))
    ids = [f"m{i}" for i in range(6)]
    for message_id in ids:
        run(f"enqueue-{message_id}", ENQUEUE, enqueue_body("jobs", message_id))
    delays: list[tuple[str, int]] = []
    for round_ in (1, 2, 3):
        cap = min(1_000 * 2 ** (round_ - 1), 3_000)
        body = {"queue": "jobs", "max_messages": 10, "max_bytes": None, "lease_ms": None}
        embedded.append(D, command(D, RECEIVE, body, f"receive-{round_}"))
        if restart and round_ == 2:
            now = embedded.now_ms
            embedded.close()
            embedded = Embedded(root, partitions=1)
            embedded.now_ms = now
        embedded.run()
        result = stored(f"receive-{round_}")
        assert isinstance(result, ReceiveResult) and sorted(d.message_id for d in result.deliveries) == ids
        assert {d.attempts for d in result.deliveries} == {round_}
        failed_at = embedded.now_ms
        for delivery in result.deliveries[::2]:
            cid = f"nack-{delivery.message_id}-{round_}"
            run(cid, NACK, {"token": delivery.token, "delay_ms": None})
            current = stored_meta(delivery.message_id)
            delay = current["last_retry_delay_ms"]
            assert current["state"] == "scheduled" and 1 <= delay <= cap
            assert current["not_before_ms"] == failed_at + delay
            assert stored(cid).retry_delay_ms == delay
            delays.append((delivery.message_id, delay))
        embedded.now_ms += 100
        run(f"tick-{round_}", TICK, {})  # the odd messages' leases run out
        for delivery in result.deliveries[1::2]:
            current = stored_meta(delivery.message_id)
            delay = current["last_retry_delay_ms"]
            assert current["state"] == "scheduled" and 1 <= delay <= cap
            assert current["not_before_ms"] == failed_at + 100 + delay
            delays.append((delivery.message_id, delay))
        embedded.now_ms += cap + 100
        run(f"tock-{round_}", TICK, {})
    return embedded, delays


def test_full_jitter_is_bounded_recorded_and_survives_restart_and_replay(tmp_path: Path) -> None:
    restarted, delays = _drive_jitter(tmp_path / "a", None, restart=True)
    try:
        assert len(delays) == 18 and len({delay for _, delay in delays}) > 1  # jitter, not the cap every time
        replayed = replay(restarted.data, 0, tmp_path / "replay", progress=False)
        assert replayed.digest == restarted.digest(D)
        straight, straight_delays = _drive_jitter(tmp_path / "b", tmp_path / "a", restart=False)
        try:
            assert straight_delays == delays
            assert straight.digest(D) == restarted.digest(D)
        finally:
            straight.close()
    finally:
        restarted.close()


# -- 3. quotas and dead-letter sublimits -------------------------------------------------------


def _counts(embedded: Embedded) -> tuple[int, ...]:
    c = counters(embedded)
    return (
        c.stored_messages,
        c.stored_bytes,
        c.leased,
        c.dead_lettered,
        c.dead_letter_bytes,
        c.pending_dead_letter,
        c.cancelled_total,
    )


def test_dead_letter_sublimits_are_exact_to_the_byte(embedded: Embedded) -> None:
    policy = {
        "max_stored_messages": 6,
        "max_stored_bytes": 20,
        "max_attempts": 1,
        "max_dead_letter_messages": 3,
        "max_dead_letter_bytes": 10,
    }
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", **policy))
    sizes = {"a": 4, "b": 6, "c": 1, "d": 0, "e": 0}
    for message_id, size in sizes.items():
        enqueue(embedded, message_id, bytes([ord(message_id)]) * size)
    deliveries = {d.message_id: d for d in receive(embedded, max_messages=5)}
    enqueue(embedded, "f", b"f" * 9)  # 6 messages, 20 bytes: the stored grant exactly
    refused(embedded, ENQUEUE, enqueue_body("jobs", "g", b""), "ResourceExhausted")
    assert _counts(embedded) == (6, 20, 5, 0, 0, 0, 0)
    # (stored messages, stored bytes, leased, dead_lettered, dead_letter_bytes, pending, cancelled_total)
    expected = {
        "a": ("dead_lettered", (6, 20, 4, 1, 4, 0, 0)),
        "b": ("dead_lettered", (6, 20, 3, 2, 10, 0, 0)),  # bytes sublimit reached exactly
        "c": ("pending_dead_letter", (6, 20, 2, 2, 10, 1, 0)),  # one byte over
        "d": ("dead_lettered", (6, 20, 1, 3, 10, 1, 0)),  # zero bytes fit; messages sublimit reached
        "e": ("pending_dead_letter", (6, 20, 0, 3, 10, 2, 0)),  # one message over
    }
    for message_id, (state, counts) in expected.items():
        assert lease(embedded, "nack", deliveries[message_id].token).state == state
        assert _counts(embedded) == counts
    page = committed(
        embedded, LIST_DEAD_LETTERS, {"queue": "jobs", "after_sequence": None, "limit": 10, "include_body": True}
    )
    assert [(m.message_id, m.meta.parked_sequence, m.body) for m in page.messages] == [
        ("a", 1, b"aaaa"),
        ("b", 2, b"bbbbbb"),
        ("d", 3, b""),
    ]
    pending = message(embedded, "c")
    assert (pending.meta.parked_sequence, pending.body) == (None, b"c")  # a pending dead letter keeps its body
    for message_id in ("c", "e"):
        refused(embedded, PARK_PENDING, fence("jobs", message_id, meta(embedded, message_id)), "ResourceExhausted")
    # Cancelling a dead letter releases its dead-letter and stored charges once.
    cancelled = committed(embedded, CANCEL, fence("jobs", "a", meta(embedded, "a")))
    assert cancelled.meta.state == "cancelled" and message(embedded, "a").body is None
    assert _counts(embedded) == (5, 16, 0, 2, 6, 2, 1)
    refused(embedded, CANCEL, fence("jobs", "a", meta(embedded, "a")), "Conflict")
    refused(embedded, ENQUEUE, enqueue_body("jobs", "g", b"g" * 5), "ResourceExhausted")  # 21 bytes
    enqueue(embedded, "g", b"g" * 4)  # 20 bytes again
    assert _counts(embedded) == (6, 20, 0, 2, 6, 2, 1)
    parked = committed(embedded, PARK_PENDING, fence("jobs", "c", meta(embedded, "c")))
    assert (parked.meta.state, parked.meta.parked_sequence) == ("dead_lettered", 4)
    assert _counts(embedded) == (6, 20, 0, 3, 7, 1, 1)
    refused(embedded, PARK_PENDING, fence("jobs", "e", meta(embedded, "e")), "ResourceExhausted")
    # Cancelling a pending dead letter works too; its stored charge goes.
    committed(embedded, CANCEL, fence("jobs", "e", meta(embedded, "e")))
    assert _counts(embedded) == (5, 20, 0, 3, 7, 0, 2)


# -- 4. expiry wins over retry -------------------------------------------------------------------


def test_lease_outliving_expiry_ends_in_expired_and_frees_the_slot(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=1, lease_ms=10_000))
    start = embedded.now_ms
    enqueue(embedded, "m1", b"abc", expires_at_ms=start + 500)
    [delivery] = receive(embedded)
    refused(embedded, ENQUEUE, enqueue_body("jobs", "m2"), "ResourceExhausted")
    embedded.now_ms = start + 499
    assert tick(embedded).transitions == 0
    embedded.now_ms = start + 500
    assert tick(embedded).transitions == 1
    view = message(embedded, "m1")
    assert (view.meta.state, view.body, view.meta.terminal_at_ms, view.meta.attempts) == (
        "expired",
        None,
        start + 500,
        1,
    )
    c = counters(embedded)
    assert (c.stored_messages, c.stored_bytes, c.leased, c.expired_total, c.scheduled) == (0, 0, 0, 1, 0)
    for op in LEASE_OPS:
        refused(embedded, *lease_op(op, delivery.token), "StaleLease")
    enqueue(embedded, "m2")  # the slot is free


@pytest.mark.parametrize(
    ("expires_after", "lease_ms"),
    [(500, 1_000), (1_000, 1_000), (1_000, 500)],
    ids=["expiry-first", "same-instant", "lease-first"],
)
def test_expiry_and_lease_deadline_passing_before_one_record(
    embedded: Embedded, expires_after: int, lease_ms: int
) -> None:
    """Both deadlines pass between two records: the message expires, and the partition goes on."""
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", lease_ms=lease_ms))
    start = embedded.now_ms
    enqueue(embedded, "m1", b"abc", expires_at_ms=start + expires_after)
    enqueue(embedded, "keep")
    receive(embedded, max_messages=1)
    embedded.now_ms = start + 5_000
    assert tick(embedded).transitions >= 1
    assert embedded.processors[embedded.partition(D)].halt is None
    view = message(embedded, "m1")
    assert (view.meta.state, view.body) == ("expired", None)
    c = counters(embedded)
    assert (c.stored_messages, c.stored_bytes, c.leased, c.scheduled, c.expired_total) == (1, 1, 0, 0, 1)
    replayed = replay(embedded.data, embedded.partition(D), embedded.data.root.parent / "replay", progress=False)
    assert replayed.digest == embedded.digest(D)


def test_retry_scheduled_past_expiry_expires(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", lease_ms=1_000, retry_base_ms=1_000))
    start = embedded.now_ms
    enqueue(embedded, "m1", expires_at_ms=start + 1_500)
    [delivery] = receive(embedded)
    embedded.now_ms = delivery.lease_until_ms
    tick(embedded)
    assert meta(embedded, "m1").not_before_ms == start + 2_000  # the retry would come after the expiry
    embedded.now_ms = start + 3_000  # both the expiry and the retry are due at the next record
    tick(embedded)
    assert embedded.processors[embedded.partition(D)].halt is None
    current = meta(embedded, "m1")
    assert (current.state, current.terminal_at_ms) == ("expired", start + 3_000)
    assert counters(embedded).expired_total == 1


def test_nack_after_expiry(embedded: Embedded) -> None:
    """A nack arriving after expires_at finds the message already expired by its timer (StaleLease);
    only when the expiry timer has not been examined yet does the nack itself expire it."""
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", lease_ms=10_000))
    start = embedded.now_ms
    enqueue(embedded, "m1", expires_at_ms=start + 100)
    enqueue(embedded, "m2", expires_at_ms=start + 100)
    [d1, d2] = receive(embedded)
    fill_due_timers(embedded, start + 10, records=1)
    embedded.now_ms = start + 200
    # This record's budget goes to the filler timers, so the nack sees a live lease past expiry.
    assert lease(embedded, "nack", d1.token) == LeaseResult(
        message_id="m1", state="expired", lease_until_ms=None, not_before_ms=None, retry_delay_ms=None
    )
    # The next record fires m2's expiry timer before the nack is evaluated.
    assert submit_as(embedded, *lease_op("nack", d2.token)).error_code == "StaleLease"
    assert (meta(embedded, "m1").state, meta(embedded, "m2").state) == ("expired", "expired")
    c = counters(embedded)
    assert (c.stored_messages, c.expired_total, c.scheduled, c.leased) == (0, 2, 0, 0)


# -- 5. receive limits and ack batches ---------------------------------------------------------


def test_receive_respects_count_bytes_in_flight_and_fifo(embedded: Embedded) -> None:
    policy = {"max_in_flight": 4, "receive_max_messages": 3, "receive_max_bytes": 100}
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", **policy))
    sizes = [10, 20, 30, 150, 5, 5, 1]
    for i, size in enumerate(sizes):
        enqueue(embedded, f"m{i}", bytes([i]) * size)
    assert [d.message_id for d in receive(embedded, max_messages=1)] == ["m0"]
    # 20 + 30 = 50 fits exactly; the next would not.
    assert [d.message_id for d in receive(embedded, max_bytes=50)] == ["m1", "m2"]
    # The first message is always delivered, even past max_bytes (and past receive_max_bytes).
    [big] = receive(embedded, max_bytes=1)
    assert (big.message_id, len(big.body)) == ("m3", 150)
    assert receive(embedded) == []  # 4 in flight: max_in_flight
    assert lease(embedded, "ack", big.token).state == "acked"
    assert [d.message_id for d in receive(embedded)] == ["m4"]
    c = counters(embedded)
    assert (c.leased, c.ready, c.acked_total) == (4, 2, 1)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_messages": 0},
        {"max_messages": 4},  # receive_max_messages is 3
        {"max_bytes": 0},
        {"max_bytes": 101},
        {"lease_ms": limits.MIN_LEASE_MS - 1},
        {"lease_ms": 60_001},
    ],
)
def test_receive_bounds(embedded: Embedded, fields: dict[str, int]) -> None:
    policy = {"receive_max_messages": 3, "receive_max_bytes": 100, "max_lease_ms": 60_000, "lease_ms": 1_000}
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", **policy))
    enqueue(embedded, "m1")
    body = {"queue": "jobs", "max_messages": None, "max_bytes": None, "lease_ms": None, **fields}
    refused(embedded, RECEIVE, body, "Validation")
    refused(embedded, RECEIVE, dict(body, queue="nope"), "NotFound")


def test_lease_bounds_and_renew(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_lease_ms=60_000, lease_ms=1_000))
    enqueue(embedded, "m1")
    [low] = receive(embedded, lease_ms=limits.MIN_LEASE_MS)
    assert low.lease_until_ms == embedded.now_ms + limits.MIN_LEASE_MS
    for bad in (limits.MIN_LEASE_MS - 1, 60_001):
        refused(embedded, RENEW, {"token": low.token, "lease_ms": bad}, "Validation")
    embedded.now_ms += 50
    renewed = lease(embedded, "renew", low.token, lease_ms=60_000)
    assert renewed == LeaseResult(
        message_id="m1",
        state="leased",
        lease_until_ms=embedded.now_ms + 60_000,
        not_before_ms=None,
        retry_delay_ms=None,
    )
    embedded.now_ms += 59_999  # past the first deadline, before the renewed one
    assert lease(embedded, "renew", low.token).lease_until_ms == embedded.now_ms + 1_000  # policy lease_ms
    current = meta(embedded, "m1")
    assert (current.state, current.attempts, current.lease_version, current.lease_owner) == ("leased", 1, 1, "tester")


def test_ack_batch_reports_each_token(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", lease_ms=1_000))
    for i in range(4):
        enqueue(embedded, f"m{i}", b"12")
    [d0, d1, d2] = receive(embedded, max_messages=3)
    stale = d2.token
    embedded.now_ms = d2.lease_until_ms
    tick(embedded)  # all three leases run out
    embedded.now_ms += 1_000
    fresh = {d.message_id: d for d in receive(embedded)}
    tokens_ = [fresh["m0"].token, stale, "garbage", fresh["m3"].token, fresh["m0"].token, fresh["m1"].token]
    result = committed(embedded, ACK_BATCH, {"tokens": tokens_})
    assert result == AckBatchResult(
        results=[
            TokenResult(status="committed", error_code=None, message_id="m0"),
            TokenResult(status="rejected", error_code="StaleLease", message_id=None),
            TokenResult(status="rejected", error_code="TokenInvalidated", message_id=None),
            TokenResult(status="committed", error_code=None, message_id="m3"),
            TokenResult(status="rejected", error_code="StaleLease", message_id=None),  # already acked by this batch
            TokenResult(status="committed", error_code=None, message_id="m1"),
        ]
    )
    assert [meta(embedded, f"m{i}").state for i in range(4)] == ["acked", "acked", "leased", "acked"]
    c = counters(embedded)
    assert (c.acked_total, c.leased, c.stored_messages, c.stored_bytes) == (3, 1, 1, 2)
    refused(embedded, ACK_BATCH, {"tokens": []}, "Validation")
    refused(embedded, ACK_BATCH, {"tokens": [fresh["m2"].token] * (limits.MAX_ACK_BATCH + 1)}, "Validation")
    assert d0.token != fresh["m0"].token and d1.token != fresh["m1"].token


@settings(max_examples=20, deadline=None)
@given(
    picks=st.lists(st.integers(0, 7), min_size=1, max_size=10),
    expire_first=st.booleans(),
)
def test_ack_batch_leaves_what_single_acks_leave(picks: list[int], expire_first: bool) -> None:
    """An AckBatch shares its queues between its tokens (one read and one save per queue): the queues,
    messages, indexes, timers and due entries it leaves are those a run of single Acks of the same
    tokens, in order, leaves (duplicates, tokens of two queues, a stale token and garbage among them)."""
    with tempfile.TemporaryDirectory() as scratch:
        first, second = Path(scratch) / "batch", Path(scratch) / "single"
        embedded = Embedded(first)
        texts: list[str] = []
        for queue in ("jobs", "other"):
            committed(embedded, CREATE_QUEUE, create_queue_body(queue, lease_ms=1_000))
            for i in range(3):
                enqueue(embedded, f"{queue}-{i}", b"12", queue=queue)
        texts += [d.token for d in receive(embedded, "jobs", max_messages=1)]
        if expire_first:
            embedded.now_ms += 1_000
            tick(embedded)  # the first jobs lease runs out: its token is stale
        embedded.now_ms += 10
        texts += [d.token for d in receive(embedded, "jobs")] + [d.token for d in receive(embedded, "other")]
        texts += ["garbage"]
        now_ms = embedded.now_ms
        embedded.close()
        shutil.copytree(first, second)
        chosen = [texts[pick % len(texts)] for pick in picks]

        batched = Embedded(first)
        batched.now_ms = now_ms + 10
        committed(batched, ACK_BATCH, {"tokens": chosen})
        singly = Embedded(second)
        singly.now_ms = now_ms + 10
        for text in chosen:
            submit_as(singly, ACK, {"token": text})
        try:
            assert batched.settled_rows(D) == singly.settled_rows(D)
        finally:
            batched.close()
            singly.close()


# -- 6. operator commands: fencing and paging ----------------------------------------------------


def _dead_letter(embedded: Embedded, message_id: str, body: bytes = b"x", **fields: Any) -> MessageMeta:
    enqueue(embedded, message_id, body, **fields)
    [delivery] = receive(embedded, max_messages=1)
    assert delivery.message_id == message_id
    assert lease(embedded, "nack", delivery.token).state == "dead_lettered"
    return meta(embedded, message_id)


def test_operator_commands_are_fenced(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    parked = _dead_letter(embedded, "m1")
    body = fence("jobs", "m1", parked)
    for kind in (REDRIVE, CANCEL, PARK_PENDING):
        refused(embedded, kind, dict(body, expected_state_version=parked.state_version - 1), "RevisionConflict")
        refused(embedded, kind, dict(body, expected_delivery_generation=2), "RevisionConflict")
        refused(embedded, kind, dict(body, message_id="nope"), "NotFound")
    refused(embedded, PARK_PENDING, body, "Conflict")  # not pending
    redriven = committed(embedded, REDRIVE, body)
    assert (redriven.meta.state, redriven.meta.attempts, redriven.meta.delivery_generation) == ("ready", 0, 2)
    assert redriven.meta.parked_sequence is None
    refused(embedded, REDRIVE, body, "RevisionConflict")  # the version it named is gone
    refused(embedded, REDRIVE, fence("jobs", "m1", redriven.meta), "Conflict")  # ready is not a dead letter
    [delivery] = receive(embedded)
    assert (delivery.attempts, delivery.delivery_generation) == (1, 2)
    refused(embedded, REDRIVE, fence("jobs", "m1", meta(embedded, "m1")), "Conflict")  # leased
    assert lease(embedded, "ack", delivery.token).state == "acked"
    acked = meta(embedded, "m1")
    for kind in (REDRIVE, CANCEL, PARK_PENDING):
        refused(embedded, kind, fence("jobs", "m1", acked), "Conflict")  # terminal never resurrects
    c = counters(embedded)
    assert (c.dead_lettered, c.acked_total, c.stored_messages) == (0, 1, 0)


def test_cancel_a_leased_message_makes_its_token_stale(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    enqueue(embedded, "m1", b"abc")
    [delivery] = receive(embedded)
    cancelled = committed(embedded, CANCEL, fence("jobs", "m1", meta(embedded, "m1")))
    assert cancelled.meta.state == "cancelled" and cancelled.meta.lease_until_ms is None
    refused(embedded, ACK, {"token": delivery.token}, "StaleLease")
    c = counters(embedded)
    assert (c.stored_messages, c.stored_bytes, c.leased, c.cancelled_total) == (0, 0, 0, 1)
    assert tick(embedded).next_due_ms is None  # the lease timer went with it


def test_redrive_is_refused_past_expiry(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    start = embedded.now_ms
    parked = _dead_letter(embedded, "m1", b"abc", expires_at_ms=start + 1_000)
    embedded.now_ms = start + 999
    redriven = committed(embedded, REDRIVE, fence("jobs", "m1", parked))
    assert redriven.meta.state == "ready"
    [delivery] = receive(embedded)
    lease(embedded, "nack", delivery.token)
    parked = meta(embedded, "m1")
    embedded.now_ms = start + 1_000
    tick(embedded)
    assert meta(embedded, "m1").state == "dead_lettered"  # a dead letter does not expire
    refused(embedded, REDRIVE, fence("jobs", "m1", parked), "Conflict")
    committed(embedded, CANCEL, fence("jobs", "m1", parked))
    c = counters(embedded)
    assert (c.dead_lettered, c.dead_letter_bytes, c.stored_bytes, c.cancelled_total) == (0, 0, 0, 1)


def _page(embedded: Embedded, after: int | None, limit: int) -> tuple[list[tuple[str, int | None]], int | None]:
    body = {"queue": "jobs", "after_sequence": after, "limit": limit, "include_body": False}
    page = committed(embedded, LIST_DEAD_LETTERS, body)
    assert isinstance(page, DeadLetterPage) and all(m.body is None for m in page.messages)
    return [(m.message_id, m.meta.parked_sequence) for m in page.messages], page.next_after_sequence


def test_list_dead_letters_pages_by_parked_sequence(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    for i in range(5):
        _dead_letter(embedded, f"m{i}")
    # Redriving m1 and parking it again moves it to the end of the parked order.
    committed(embedded, REDRIVE, fence("jobs", "m1", meta(embedded, "m1")))
    [delivery] = receive(embedded)
    lease(embedded, "nack", delivery.token)
    assert _page(embedded, None, 2) == ([("m0", 1), ("m2", 3)], 3)
    assert _page(embedded, 3, 2) == ([("m3", 4), ("m4", 5)], 5)
    assert _page(embedded, 5, 2) == ([("m1", 6)], None)
    assert _page(embedded, 0, 100) == ([("m0", 1), ("m2", 3), ("m3", 4), ("m4", 5), ("m1", 6)], None)
    assert _page(embedded, 6, 1) == ([], None)


def test_list_dead_letters_last_full_page_has_no_next(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    for i in range(4):
        _dead_letter(embedded, f"m{i}")
    assert _page(embedded, None, 2) == ([("m0", 1), ("m1", 2)], 2)
    assert _page(embedded, 2, 2) == ([("m2", 3), ("m3", 4)], None)


@pytest.mark.parametrize(("after", "limit"), [(None, 0), (None, limits.MAX_DEAD_LETTER_PAGE + 1), (-1, 10), (-5, 10)])
def test_list_dead_letters_validates_its_page(embedded: Embedded, after: int | None, limit: int) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    _dead_letter(embedded, "m1")
    body = {"queue": "jobs", "after_sequence": after, "limit": limit, "include_body": False}
    refused(embedded, LIST_DEAD_LETTERS, body, "Validation")
    assert embedded.processors[embedded.partition(D)].halt is None
    assert _page(embedded, None, 10) == ([("m1", 1)], None)


# -- results that would not fit one outcome ----------------------------------------------

BIG = limits.MAX_INLINE_BODY_BYTES


def test_a_receive_stops_before_its_outcome_would_outgrow_a_log_record(embedded: Embedded) -> None:
    # The policy allows 20 messages and 64 MiB a receive; 20 bodies of 256 KiB are 5 MiB, past
    # the 4 MiB outcome limit. The receive delivers what fits and the rest comes next time.
    policy = {"receive_max_messages": 20, "receive_max_bytes": 64 * 1024 * 1024, "max_in_flight": 20}
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", **policy))
    for i in range(20):
        enqueue(embedded, f"m{i}", bytes([i]) * BIG, headers={"h": "v" * 1000})
    first = receive(embedded, max_messages=20)
    item = BIG + len("h") + 1000 + len("m10") + limits.RESULT_ITEM_OVERHEAD_BYTES
    assert len(first) == limits.RESULT_BYTES_BUDGET // item < 20
    second = receive(embedded, max_messages=20)
    assert [d.message_id for d in first + second] == [f"m{i}" for i in range(20)]
    assert all(len(record.value) <= limits.MAX_OUTCOME_BYTES for record in embedded.outcomes.read(0, 0, 10_000))


def test_a_dead_letter_page_with_bodies_ends_before_the_outcome_limit(embedded: Embedded) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs", max_attempts=1))
    for i in range(16):
        _dead_letter(embedded, f"m{i}", bytes([i]) * BIG)
    seen: list[str] = []
    after = None
    while True:
        body = {"queue": "jobs", "after_sequence": after, "limit": 100, "include_body": True}
        page = committed(embedded, LIST_DEAD_LETTERS, body)
        assert isinstance(page, DeadLetterPage) and 1 <= len(page.messages) < 16
        assert all(m.body == bytes([int(m.message_id[1:])]) * BIG for m in page.messages)
        seen += [m.message_id for m in page.messages]
        if page.next_after_sequence is None:
            break
        after = page.next_after_sequence
    assert seen == [f"m{i}" for i in range(16)]


def test_a_result_over_the_outcome_limit_is_refused_and_changes_nothing(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    enqueue(embedded, "m0", b"x" * 5_000)
    monkeypatch.setattr(limits, "MAX_OUTCOME_BYTES", 4_096)
    body = {"queue": "jobs", "max_messages": None, "max_bytes": None, "lease_ms": None}
    outcome = submit_as(embedded, RECEIVE, body, command_id="too-big")
    assert (outcome.status, outcome.error_code) == ("rejected", "BudgetExceeded")
    assert "over the 4096-byte outcome limit" in (outcome.detail or "")
    # The refused receive claimed nothing: the message is still ready, the queue as before.
    assert counters(embedded).ready == 1 and counters(embedded).leased == 0
    monkeypatch.undo()
    assert [d.message_id for d in receive(embedded)] == ["m0"]
