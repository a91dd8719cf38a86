"""Compaction of finished work (processors/horizons.py), from feature level 4.

What a user notices: a finished message answers InspectMessage for its domain's outcome horizon from
when it finished; then, until the receipt horizon, InspectMessage is HistoryUnavailable and its id
is still taken (Enqueue: Conflict); then the id is new. A delivery token of the earlier message
never settles the later one, an inbox entry goes with its message's identity (so a later message
under the id is processed afresh), a target inbox gets its room back, a deleted document's tombstone
goes unless the document was written again, and the projection keeps no row of finished work past
the horizons. A replay removes exactly the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyload import limits
from keyload.operations.census import census
from keyload.processors import tokens
from keyload.processors.features import LEASES_KEPT, WORK_COMPACTED
from keyload.projections import keys
from keyload.sdk.envelope import Outcome

from .support import (
    ACK,
    BATCH,
    CANCEL,
    COMMIT_INBOX,
    COMPLETE_PROCESSING,
    CONFIGURE_DOMAIN,
    CONFIGURE_INBOX,
    CREATE_QUEUE,
    DELETE_DOCUMENT,
    DELETE_QUEUE,
    ENQUEUE,
    GET_DOCUMENT,
    INSPECT_MESSAGE,
    INSPECT_QUEUE,
    PUT_DOCUMENT,
    RAISE_FEATURE_LEVEL,
    RECEIVE,
    TICK,
    Embedded,
    assert_replay_equals_live,
    batch_body,
    close_after_replay_check,
    create_queue_body,
    delete_document_body,
    enqueue_body,
    expect,
    family_rows,
    message_fence,
    mutation,
    pass_time,
    put_document_body,
    receive_body,
    submit_unhalted,
)

D = "acme"
OUTCOME_MS = 1_000
RECEIPT_MS = 5_000
LEASE_MS = 600_000


def ok(embedded: Embedded, kind: str, body: dict[str, Any], command_id: str | None = None) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body, command_id), None)


def at_level(embedded: Embedded, level: int = WORK_COMPACTED, receipt_ms: int = RECEIPT_MS) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": level})
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": OUTCOME_MS, "receipt_horizon_ms": receipt_ms})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))


def later(embedded: Embedded, ms: int) -> None:
    pass_time(embedded, D, ms)


def inspect(embedded: Embedded, message_id: str) -> Outcome:
    return submit_unhalted(embedded, D, INSPECT_MESSAGE, {"queue": "jobs", "message_id": message_id})


def delivered(embedded: Embedded) -> Any:
    [delivery] = ok(embedded, RECEIVE, receive_body("jobs", max_messages=1, lease_ms=LEASE_MS)).deliveries
    return delivery


def test_history_then_identity_then_a_new_id(embedded: Embedded, tmp_path: Path) -> None:
    at_level(embedded)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    first = delivered(embedded)
    assert first.token.startswith("v2.")
    ok(embedded, ACK, {"token": first.token})
    acked_at = embedded.now_ms
    embedded.now_ms += OUTCOME_MS - 1
    assert expect(inspect(embedded, "m1"), None).meta.state == "acked"

    later(embedded, 1)  # the outcome horizon has passed: the identity tombstone is left
    store = embedded.store(D)
    assert (family_rows(store, keys.MESSAGE), family_rows(store, keys.IDENTITY)) == (0, 1)
    gone = inspect(embedded, "m1")
    assert (gone.error_code, gone.detail) == (
        "HistoryUnavailable",
        f"message was acked at {acked_at} ms; its history is past the domain's outcome horizon "
        "(the id stays used until its receipt horizon)",
    )
    taken = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m1"))
    assert (taken.error_code, taken.detail) == ("Conflict", "message id is reserved or retired in this queue")

    later(embedded, RECEIPT_MS - OUTCOME_MS)  # the receipt horizon: the id is new
    assert family_rows(store, keys.IDENTITY) == 0
    assert not [key for key, _ in store.scan(keys.HORIZON, keys.prefix_end(keys.HORIZON)) if keys.horizon_row(key)]
    assert (inspect(embedded, "m1").error_code, inspect(embedded, "m1").detail) == (
        "NotFound",
        "message does not exist",
    )
    assert ok(embedded, ENQUEUE, enqueue_body("jobs", "m1")).state == "ready"
    second = delivered(embedded)
    # The same delivery generation and lease version as the first message's lease: the token's
    # enqueue sequence tells them apart.
    assert (second.delivery_generation, second.attempts) == (first.delivery_generation, first.attempts)
    expect(submit_unhalted(embedded, D, ACK, {"token": first.token}), "StaleLease")
    ok(embedded, ACK, {"token": second.token})
    assert_replay_equals_live(embedded, D, tmp_path)


@pytest.mark.parametrize("ending", ["expired", "cancelled"])
def test_every_ending_is_compacted(embedded: Embedded, ending: str) -> None:
    at_level(embedded)
    if ending == "expired":
        ok(embedded, ENQUEUE, enqueue_body("jobs", "m1", expires_at_ms=embedded.now_ms + 10))
        later(embedded, 10)
    else:
        ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
        ok(embedded, CANCEL, message_fence("jobs", "m1", 1, 1))
    finished_at = embedded.now_ms
    later(embedded, OUTCOME_MS)
    assert inspect(embedded, "m1").detail.startswith(f"message was {ending} at {finished_at} ms;")
    later(embedded, RECEIPT_MS)
    assert ok(embedded, ENQUEUE, enqueue_body("jobs", "m1")).state == "ready"


def test_equal_horizons_leave_no_identity(embedded: Embedded) -> None:
    at_level(embedded, receipt_ms=OUTCOME_MS)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    ok(embedded, ACK, {"token": delivered(embedded).token})
    later(embedded, OUTCOME_MS)
    store = embedded.store(D)
    assert family_rows(store, keys.MESSAGE) == family_rows(store, keys.IDENTITY) == 0
    assert ok(embedded, ENQUEUE, enqueue_body("jobs", "m1")).state == "ready"


def test_a_reused_id_is_processed_afresh(embedded: Embedded, tmp_path: Path) -> None:
    """The first message's inbox entry goes with its identity: the same handler, execution
    generation and effects on the later message under the id apply, not `already_processed`."""
    at_level(embedded)
    done: dict[str, Any] = {"handler_scope": "svc", "execution_generation": 0, "effects": []}
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    first = ok(embedded, COMPLETE_PROCESSING, dict(done, token=delivered(embedded).token))
    store = embedded.store(D)
    assert family_rows(store, keys.INBOX_ENTRY) == 1
    later(embedded, RECEIPT_MS)
    assert family_rows(store, keys.INBOX_ENTRY) == family_rows(store, keys.IDENTITY) == 0
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    second = ok(embedded, COMPLETE_PROCESSING, dict(done, token=delivered(embedded).token))
    assert (first.already_processed, second.already_processed) == (False, False)
    assert ok(embedded, INSPECT_QUEUE, {"queue": "jobs"}).counters.acked_total == 2
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_target_inbox_gets_its_room_back(embedded: Embedded, tmp_path: Path) -> None:
    at_level(embedded)
    ok(embedded, CONFIGURE_INBOX, {"max_receipts": 1, "max_bytes": 10_000})
    source = {"domain": "orders", "queue": "out", "message_id": "m1", "delivery_generation": 1}
    commit = {"source": source, "handler_scope": "svc", "execution_generation": 0, "effects": []}
    assert not ok(embedded, COMMIT_INBOX, commit).already_processed
    assert ok(embedded, COMMIT_INBOX, commit).already_processed  # within the horizon: once
    other = dict(commit, source=dict(source, message_id="m2"))
    expect(submit_unhalted(embedded, D, COMMIT_INBOX, other), "ResourceExhausted")
    later(embedded, RECEIPT_MS)
    assert family_rows(embedded.store(D), keys.TARGET_INBOX_ENTRY) == 0
    inbox = ok(embedded, CONFIGURE_INBOX, {"max_receipts": 1, "max_bytes": 10_000})
    assert (inbox.receipts, inbox.bytes) == (0, 0)
    assert not ok(embedded, COMMIT_INBOX, other).already_processed
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_deleted_queue_reclaims_its_finished_messages_first(embedded: Embedded, tmp_path: Path) -> None:
    at_level(embedded)
    for n in range(3):
        ok(embedded, ENQUEUE, enqueue_body("jobs", f"m{n}"))
        ok(embedded, ACK, {"token": delivered(embedded).token})
    ok(embedded, DELETE_QUEUE, {"queue": "jobs"})
    later(embedded, 1)  # the reclamation runs
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))  # a new incarnation: its ids are its own
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m0"))
    later(embedded, RECEIPT_MS)  # the sweep finds the deleted queue's rows gone, and leaves nothing
    store = embedded.store(D)
    assert family_rows(store, keys.MESSAGE) == 1 and family_rows(store, keys.IDENTITY) == 0
    assert expect(inspect(embedded, "m0"), None).meta.state == "ready"
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_deleted_documents_tombstone_goes_unless_written_again(embedded: Embedded, tmp_path: Path) -> None:
    at_level(embedded)
    for key in ("gone", "back", "twice"):
        ok(embedded, PUT_DOCUMENT, put_document_body(key))
        ok(embedded, DELETE_DOCUMENT, delete_document_body(key))
    embedded.now_ms += 1
    ok(embedded, PUT_DOCUMENT, put_document_body("back", expected_revision=0))  # revision 3: after the tombstone
    ok(embedded, PUT_DOCUMENT, put_document_body("twice"))
    ok(embedded, DELETE_DOCUMENT, delete_document_body("twice"))  # a tombstone of its own, 1 ms later
    later(embedded, RECEIPT_MS - 1)
    store = embedded.store(D)
    assert store.get(keys.document(D, "gone")) is None
    assert ok(embedded, GET_DOCUMENT, {"key": "back"}).revision == 3
    assert store.get(keys.document(D, "twice")) is not None
    later(embedded, 1)
    assert store.get(keys.document(D, "twice")) is None
    assert ok(embedded, PUT_DOCUMENT, put_document_body("gone", expected_revision=0)).revision == 1  # a new key
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_tombstone_outlived_by_an_earlier_ones_entry_keeps_to_its_own_horizon(
    embedded: Embedded, tmp_path: Path
) -> None:
    """Horizons shortened between two deletions of a key: the later tombstone goes first, the key's
    revisions restart, and the earlier tombstone's entry, due later, neither halts on the missing
    row nor takes a newer tombstone of the same revision before its own horizon."""
    at_level(embedded, receipt_ms=10 * RECEIPT_MS)
    ok(embedded, PUT_DOCUMENT, put_document_body("k"))
    ok(embedded, DELETE_DOCUMENT, delete_document_body("k"))  # revision 2, due at +50 s
    embedded.now_ms += 1
    ok(embedded, PUT_DOCUMENT, put_document_body("k"))
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": OUTCOME_MS, "receipt_horizon_ms": RECEIPT_MS})
    ok(embedded, DELETE_DOCUMENT, delete_document_body("k"))  # revision 4, due at +5 s
    later(embedded, RECEIPT_MS)
    store = embedded.store(D)
    assert store.get(keys.document(D, "k")) is None
    embedded.now_ms += 10 * RECEIPT_MS - RECEIPT_MS - 2  # just before the first entry is due
    assert ok(embedded, PUT_DOCUMENT, put_document_body("k", expected_revision=0)).revision == 1
    ok(embedded, DELETE_DOCUMENT, delete_document_body("k"))  # revision 2 again, due in 5 s
    later(embedded, 2)  # the first entry is due: its tombstone is gone, and this one is not it
    assert store.get(keys.document(D, "k")) is not None
    later(embedded, RECEIPT_MS)
    assert store.get(keys.document(D, "k")) is None
    assert_replay_equals_live(embedded, D, tmp_path)


def test_the_census_shows_what_the_sweep_has_left(embedded: Embedded) -> None:
    at_level(embedded, receipt_ms=OUTCOME_MS)
    ok(embedded, CREATE_QUEUE, create_queue_body("bulk", receive_max_messages=100))
    for first in range(0, 300, 100):
        enqueues = (mutation(ENQUEUE, enqueue_body("bulk", f"m{n}")) for n in range(first, first + 100))
        ok(embedded, BATCH, batch_body(*enqueues))
        deliveries = ok(embedded, RECEIVE, receive_body("bulk", max_messages=100)).deliveries
        ok(embedded, "keyload.command.AckBatch", {"tokens": [d.token for d in deliveries]})
    partition = embedded.partition(D)
    assert census(embedded.data, partition).horizon_due == 0  # nothing is due by the last record's time
    embedded.now_ms += OUTCOME_MS  # the 300 messages' metadata and the outcomes are due
    fired = ok(embedded, TICK, {})
    assert fired.budget_exhausted and fired.transitions == limits.TICK_EXAMINATION_BUDGET
    left = census(embedded.data, partition)
    assert left.horizon_due > 300 - limits.TICK_EXAMINATION_BUDGET and left.timers_due == 1  # the sweep, due again
    while ok(embedded, TICK, {}).budget_exhausted:
        pass
    done = census(embedded.data, partition)
    assert (done.horizon_due, done.timers_due) == (0, 0)
    assert not {"message", "identity", "outcome"} & {family.family for family in done.families}


def test_below_level_4_finished_messages_are_kept(embedded: Embedded) -> None:
    at_level(embedded, LEASES_KEPT)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    delivery = delivered(embedded)
    assert delivery.token.startswith("v1.")
    ok(embedded, ACK, {"token": delivery.token})
    later(embedded, RECEIPT_MS)
    assert expect(inspect(embedded, "m1"), None).meta.state == "acked"


def test_a_lease_taken_before_level_4_is_settled_after_it(embedded: Embedded) -> None:
    at_level(embedded, LEASES_KEPT)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    delivery = delivered(embedded)
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    ok(embedded, ACK, {"token": delivery.token})  # a v1 token names a message enqueued before it
    later(embedded, RECEIPT_MS)
    assert inspect(embedded, "m1").error_code == "NotFound"


def test_a_v1_token_names_no_message_enqueued_after_level_4(embedded: Embedded) -> None:
    """A v1 token carries no enqueue sequence: from level 4 it is taken only for a message enqueued
    before the raise, so one of an earlier message under a reused id never settles the later one."""
    at_level(embedded)
    embedded.now_ms += 1  # enqueued after the raise (at the raise's own time, a v1 token is taken)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    delivery = delivered(embedded)
    issued = tokens.parse(delivery.token)
    assert issued.enqueue_sequence == expect(inspect(embedded, "m1"), None).meta.enqueue_sequence
    fields = {
        "domain": D,
        "queue": "jobs",
        "incarnation": issued.incarnation,
        "message_id": "m1",
        "principal": issued.principal,
        "delivery_generation": issued.delivery_generation,
        "lease_version": issued.lease_version,
    }
    keyring = embedded.data.keyring()
    v1 = tokens.issue(keyring, issued.key_id, **fields)
    expect(submit_unhalted(embedded, D, ACK, {"token": v1}), "StaleLease")
    other_sequence = tokens.issue(keyring, issued.key_id, **fields, enqueue_sequence=issued.enqueue_sequence + 1)
    expect(submit_unhalted(embedded, D, ACK, {"token": other_sequence}), "StaleLease")
    ok(embedded, ACK, {"token": delivery.token})


# A model: what each message id answers, from when its message finished and the horizons.

IDS = ("a", "b")
WAITS = (1, 400, OUTCOME_MS, 2_500, RECEIPT_MS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(("enqueue", "settle", "cancel", "inspect")), st.sampled_from(IDS)),
            st.tuples(st.just("wait"), st.sampled_from(WAITS)),
        ),
        max_size=40,
    )
)
def test_compaction_follows_a_reference_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, Any]]
) -> None:
    """Random enqueues, settlements (receive and ack), cancels, inspections and waits over a few
    message ids: every answer is the model's, the projection holds a message's metadata or identity
    row exactly while the model needs it, and the live projection equals its replay."""
    directory = tmp_path_factory.mktemp("compaction")
    embedded = Embedded(directory / "data")
    try:
        at_level(embedded)
        live: list[str] = []  # message ids of live (ready) messages, oldest first
        finished: dict[str, int] = {}  # message id -> when it finished
        for action, arg in steps:
            if action == "wait":
                embedded.now_ms += arg
                continue
            now = embedded.now_ms
            _sweep_model(finished, now)
            if action == "enqueue":
                answer = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", arg))
                if arg in live or arg in finished:
                    assert answer.error_code == "Conflict", answer
                else:
                    assert answer.status == "committed", answer
                    live.append(arg)
            elif action == "inspect":
                _check_inspect(inspect(embedded, arg), arg, live, finished, now)
            elif action == "settle" and live:  # the oldest ready message is the one received
                ok(embedded, ACK, {"token": delivered(embedded).token})
                finished[live.pop(0)] = now
            elif action == "cancel" and arg in live:
                meta = expect(inspect(embedded, arg), None).meta
                ok(embedded, CANCEL, message_fence("jobs", arg, meta.state_version, meta.delivery_generation))
                live.remove(arg)
                finished[arg] = now
        ok(embedded, TICK, {})  # the sweep runs before a record: let it run at the last time
        now, store = embedded.now_ms, embedded.store(D)
        _sweep_model(finished, now)
        queue_id = ok(embedded, INSPECT_QUEUE, {"queue": "jobs"}).incarnation
        for message_id in IDS:
            history = message_id in live or (message_id in finished and now < finished[message_id] + OUTCOME_MS)
            identity = message_id in finished and not history
            assert (
                store.get(keys.message(queue_id, message_id)) is not None,
                store.get(keys.identity(queue_id, message_id)) is not None,
            ) == (history, identity)
    finally:
        close_after_replay_check(embedded, directory)


def _sweep_model(finished: dict[str, int], now: int) -> None:
    for message_id, at in list(finished.items()):
        if now >= at + RECEIPT_MS:
            del finished[message_id]


def _check_inspect(answer: Outcome, message_id: str, live: list[str], finished: dict[str, int], now: int) -> None:
    if message_id in live:
        assert answer.status == "committed", answer
    elif message_id not in finished:
        assert (answer.error_code, answer.detail) == ("NotFound", "message does not exist")
    elif now < finished[message_id] + OUTCOME_MS:
        assert answer.result.meta.state in ("acked", "cancelled"), answer
    else:
        assert answer.error_code == "HistoryUnavailable", answer
