"""Idempotency horizons (processors/horizons.py), from feature level 2.

What a user notices: within the domain's outcome horizon a repeated command id gets the stored
outcome; after it, until the receipt horizon, the repeat is refused with HistoryUnavailable naming
the offset and how the command ended (nothing applies twice); after that the id is new. The
projection keeps no outcome, receipt or index row past the horizons, the sweep removes a bounded
number of rows per record, and a replay removes exactly the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyload import limits
from keyload.processors.features import feature_level
from keyload.projections import keys
from keyload.sdk.envelope import Outcome

from .support import (
    COMPLETE_PROCESSING,
    CONFIGURE_DOMAIN,
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_DOMAIN,
    RAISE_FEATURE_LEVEL,
    RECEIVE,
    TICK,
    Embedded,
    assert_replay_equals_live,
    close_after_replay_check,
    create_queue_body,
    enqueue_body,
    expect,
    family_rows,
    pass_time,
    receive_body,
    submit_unhalted,
)

D = "acme"
OUTCOME_MS = 1_000
RECEIPT_MS = 5_000


def ok(embedded: Embedded, kind: str, body: dict[str, Any], command_id: str | None = None) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body, command_id), None)


def at_level_2(embedded: Embedded, outcome_ms: int = OUTCOME_MS, receipt_ms: int | None = RECEIPT_MS) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": 2})
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": outcome_ms, "receipt_horizon_ms": receipt_ms})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))


def later(embedded: Embedded, ms: int) -> None:
    pass_time(embedded, D, ms)


def test_a_repeat_gets_the_outcome_then_history_unavailable_then_the_id_is_new(
    embedded: Embedded, tmp_path: Path
) -> None:
    at_level_2(embedded)
    first = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    assert first.status == "committed"
    embedded.now_ms += OUTCOME_MS - 1
    again = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    assert (again.status, again.offset, again.result) == ("committed", first.offset, first.result)

    later(embedded, 1)  # the outcome horizon has passed: only the receipt is left
    store = embedded.store(D)
    assert embedded.stored_outcome(D, "send-1") is None
    assert store.get(keys.receipt(D, "send-1")) is not None
    past = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    assert (past.status, past.error_code) == ("rejected", "HistoryUnavailable")
    assert past.detail == (
        f"command id was applied at offset {first.offset} (committed); its outcome is past the domain's outcome horizon"
    )
    other = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m9"), "send-1")
    assert (other.error_code, other.detail) == ("Conflict", "command id was used for a different command")
    assert ok(embedded, "keyload.command.InspectQueue", {"queue": "jobs"}).counters.stored_messages == 1

    later(embedded, RECEIPT_MS - OUTCOME_MS)  # the receipt horizon too: the id is new
    assert store.get(keys.receipt(D, "send-1")) is None
    anew = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m2"), "send-1")
    assert anew.status == "committed" and anew.offset > first.offset
    assert ok(embedded, "keyload.command.InspectQueue", {"queue": "jobs"}).counters.stored_messages == 2
    assert_replay_equals_live(embedded, D, tmp_path)


def test_nothing_is_left_once_both_horizons_pass(embedded: Embedded, tmp_path: Path) -> None:
    at_level_2(embedded)
    for n in range(20):
        ok(embedded, ENQUEUE, enqueue_body("jobs", f"m{n}"))
    refused = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("nowhere", "m0"), "refused")
    assert refused.error_code == "NotFound"
    store = embedded.store(D)
    assert family_rows(store, keys.OUTCOME) >= 21 and family_rows(store, keys.HORIZON) >= 21
    later(embedded, OUTCOME_MS)
    past = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("nowhere", "m0"), "refused")
    assert (past.error_code, past.detail.split(";")[0]) == (
        "HistoryUnavailable",
        f"command id was applied at offset {refused.offset} (rejected with NotFound)",
    )
    later(embedded, RECEIPT_MS)
    # Ticks and reads keep no outcome: nothing is left, and the sweep is no longer armed.
    assert family_rows(store, keys.OUTCOME) == family_rows(store, keys.RECEIPT) == family_rows(store, keys.HORIZON) == 0
    assert store.get(keys.HORIZON_DUE) is None
    assert store.first(keys.due_queue(0, 0), keys.prefix_end(keys.DUE_QUEUE)) is None
    assert_replay_equals_live(embedded, D, tmp_path)


def test_equal_horizons_leave_no_receipt(embedded: Embedded) -> None:
    at_level_2(embedded, OUTCOME_MS, OUTCOME_MS)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    later(embedded, OUTCOME_MS)
    assert embedded.store(D).get(keys.receipt(D, "send-1")) is None
    again = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    # The id is new, so the command applies again: the message id is still taken, which the queue refuses.
    assert (again.error_code, again.detail) == ("Conflict", "message id is already used in this queue")
    assert embedded.stored_outcome(D, "send-1") is not None


def test_the_sweep_removes_a_bounded_number_of_rows_per_record(embedded: Embedded, tmp_path: Path) -> None:
    at_level_2(embedded, OUTCOME_MS, OUTCOME_MS)
    count = 3 * limits.TICK_EXAMINATION_BUDGET
    store = embedded.store(D)
    for n in range(count):  # appended at one time, applied together: they expire together
        embedded.append(D, _command(ENQUEUE, enqueue_body("jobs", f"m{n}"), f"send-{n}"))
    embedded.run()
    before = family_rows(store, keys.OUTCOME)
    assert before == count + 2  # and ConfigureDomain's and CreateQueue's
    embedded.now_ms += OUTCOME_MS
    fired = ok(embedded, TICK, {})
    assert fired.budget_exhausted and fired.transitions == limits.TICK_EXAMINATION_BUDGET
    assert before - family_rows(store, keys.OUTCOME) == limits.TICK_EXAMINATION_BUDGET
    while fired.budget_exhausted:
        fired = ok(embedded, TICK, {})
    assert family_rows(store, keys.OUTCOME) == family_rows(store, keys.HORIZON) == 0
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_horizon_change_applies_to_outcomes_stored_after_it(embedded: Embedded) -> None:
    at_level_2(embedded, OUTCOME_MS, OUTCOME_MS)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"), "short")
    view = ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 60_000, "expected_policy_version": 1})
    assert (view.domain, view.outcome_horizon_ms, view.receipt_horizon_ms, view.policy_version) == (
        D,
        60_000,
        limits.DEFAULT_RECEIPT_HORIZON_MS,
        2,
    )
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m2"), "long")
    later(embedded, OUTCOME_MS)
    assert embedded.stored_outcome(D, "short") is None
    assert embedded.stored_outcome(D, "long") is not None


def test_configure_domain_is_fenced_and_checked(embedded: Embedded, tmp_path: Path) -> None:
    default = ok(embedded, INSPECT_DOMAIN, {})
    assert (default.outcome_horizon_ms, default.receipt_horizon_ms, default.policy_version) == (
        limits.DEFAULT_OUTCOME_HORIZON_MS,
        limits.DEFAULT_RECEIPT_HORIZON_MS,
        0,
    )
    stale = submit_unhalted(embedded, D, CONFIGURE_DOMAIN, {"expected_policy_version": 3})
    assert (stale.error_code, stale.detail) == ("RevisionConflict", "policy version is 0, expected 3")
    inverted = submit_unhalted(
        embedded, D, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 10_000, "receipt_horizon_ms": 5_000}
    )
    assert (inverted.error_code, inverted.detail) == (
        "Validation",
        "receipt_horizon_ms must be at least outcome_horizon_ms",
    )
    short = submit_unhalted(embedded, D, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 999})
    assert short.error_code == "Validation"
    long = ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 30 * limits.DAY_MS, "expected_policy_version": 0})
    assert (long.receipt_horizon_ms, long.policy_version) == (30 * limits.DAY_MS, 1)  # at least the outcome's
    assert ok(embedded, INSPECT_DOMAIN, {}) == long
    assert_replay_equals_live(embedded, D, tmp_path)


def test_below_level_2_outcomes_are_kept_as_before(embedded: Embedded) -> None:
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": OUTCOME_MS, "receipt_horizon_ms": OUTCOME_MS})
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    later(embedded, 30 * limits.DAY_MS)
    store = embedded.store(D)
    assert feature_level(store) == 0 and family_rows(store, keys.HORIZON) == 0
    assert embedded.stored_outcome(D, "send-1") is not None
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": 2})
    later(embedded, 30 * limits.DAY_MS)
    # Stored before the raise: kept. The repeat still gets it.
    again = submit_unhalted(embedded, D, ENQUEUE, enqueue_body("jobs", "m1"), "send-1")
    assert again.status == "committed" and embedded.stored_outcome(D, "send-1") is not None


def test_a_long_poll_receive_keeps_its_outcome_from_when_it_is_answered(embedded: Embedded) -> None:
    at_level_2(embedded)
    embedded.append(D, _command(RECEIVE, dict(receive_body("jobs"), wait_ms=20_000), "waiting"))
    embedded.run()
    later(embedded, 10_000)  # past the outcome horizon of its arrival: still waiting, nothing swept
    waiting = embedded.stored_outcome(D, "waiting")
    assert waiting is not None and len(waiting) == keys.SHA256_BYTES  # the fingerprint of a deferred receive
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    served = embedded.stored_outcome(D, "waiting")
    assert served is not None and len(served) > 32
    later(embedded, OUTCOME_MS - 1)
    assert embedded.stored_outcome(D, "waiting") == served
    later(embedded, 1)
    assert embedded.stored_outcome(D, "waiting") is None
    assert embedded.store(D).get(keys.receipt(D, "waiting")) is not None


def _command(kind: str, body: dict[str, Any], command_id: str) -> bytes:
    from .support import command

    return command(D, kind, body, command_id, reply_to=0)


def test_a_repeated_completion_past_the_horizon_is_still_already_processed(embedded: Embedded) -> None:
    at_level_2(embedded, OUTCOME_MS, OUTCOME_MS)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    [delivery] = ok(embedded, RECEIVE, receive_body("jobs", lease_ms=600_000)).deliveries
    done = {"token": delivery.token, "handler_scope": "svc", "execution_generation": 0, "effects": []}
    first = ok(embedded, COMPLETE_PROCESSING, done, "done-1")
    assert not first.already_processed
    later(embedded, OUTCOME_MS)
    repeat = ok(embedded, COMPLETE_PROCESSING, done, "done-2")  # another id: the inbox entry decides
    assert (repeat.already_processed, repeat.command_id, repeat.offset) == (True, "done-1", first.offset)
    assert repeat.results.results == []


@pytest.mark.parametrize("reuse", ["enqueue", "waiting receive"])
def test_a_repeated_completion_after_its_command_id_was_reused_is_still_already_processed(
    embedded: Embedded, tmp_path: Path, reuse: str
) -> None:
    """The inbox entry names the first command by id and offset: once that id is new again and used
    by another command, the entry's outcome is gone, not that command's."""
    at_level_2(embedded, OUTCOME_MS, OUTCOME_MS)
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    [delivery] = ok(embedded, RECEIVE, receive_body("jobs", lease_ms=600_000)).deliveries
    done = {"token": delivery.token, "handler_scope": "svc", "execution_generation": 0, "effects": []}
    first = ok(embedded, COMPLETE_PROCESSING, done, "done-1")
    later(embedded, OUTCOME_MS)  # no receipt: the id is new
    if reuse == "enqueue":
        ok(embedded, ENQUEUE, enqueue_body("jobs", "m2"), "done-1")
    else:  # nothing is ready: it waits, its row only the fingerprint
        embedded.append(D, _command(RECEIVE, dict(receive_body("jobs"), wait_ms=20_000), "done-1"))
        embedded.run()
    repeat = ok(embedded, COMPLETE_PROCESSING, done, "done-2")
    assert (repeat.already_processed, repeat.command_id, repeat.offset, repeat.results.results) == (
        True,
        "done-1",
        first.offset,
        [],
    )
    assert_replay_equals_live(embedded, D, tmp_path)


# A model: each command id's answer, from the times its outcome was stored and the horizons then.

IDS = ("a", "b", "c")
Kept = tuple[int, int, int, int]
"""What the model keeps of a command id: its body variant, offset, outcome kept until, receipt kept until."""


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("send"), st.sampled_from(IDS), st.integers(0, 1)),
            st.tuples(st.just("wait"), st.sampled_from((1, 400, 1_000, 2_500, 6_000)), st.just(0)),
            st.tuples(st.just("policy"), st.sampled_from((1_000, 3_000)), st.sampled_from((0, 2_000))),
        ),
        max_size=40,
    )
)
def test_repeats_follow_the_horizons_of_a_reference_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, Any, int]]
) -> None:
    """Random sends of a few command ids (two bodies each), waits and policy changes: every answer
    is the one the model gives, an outcome or receipt is kept exactly while the model needs it, and
    the live projection equals its replay."""
    directory = tmp_path_factory.mktemp("horizons")
    embedded = Embedded(directory / "data")
    try:
        ok(embedded, RAISE_FEATURE_LEVEL, {"level": 2})
        ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
        horizons = (limits.DEFAULT_OUTCOME_HORIZON_MS, limits.DEFAULT_RECEIPT_HORIZON_MS)
        model: dict[str, Kept] = {}
        applied: dict[str, int] = {}
        for action, arg, extra in steps:
            if action == "wait":
                embedded.now_ms += arg
                continue
            if action == "policy":
                outcome_ms, receipt_ms = arg, arg + extra
                ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": outcome_ms, "receipt_horizon_ms": receipt_ms})
                horizons = (outcome_ms, receipt_ms)
                continue
            now = embedded.now_ms
            new = arg not in model or now >= model[arg][3]
            applied[arg] = applied.get(arg, 0) + new  # each application enqueues another message
            body = enqueue_body("jobs", f"m-{arg}-{applied[arg]}", b"x" * (extra + 1))
            answer = submit_unhalted(embedded, D, ENQUEUE, body, arg)
            _check(model, arg, extra, now, answer)
            if new:
                model[arg] = (extra, answer.offset, now + horizons[0], now + horizons[1])
        ok(embedded, TICK, {})  # the sweep runs before a record: let it run at the last time
        now, store = embedded.now_ms, embedded.store(D)
        for command_id, (_, _, outcome_until, receipt_until) in model.items():
            kept = now < outcome_until, outcome_until <= now < receipt_until
            assert (
                embedded.stored_outcome(D, command_id) is not None,
                store.get(keys.receipt(D, command_id)) is not None,
            ) == kept
    finally:
        close_after_replay_check(embedded, directory)


def _check(model: dict[str, Kept], command_id: str, variant: int, now: int, answer: Outcome) -> None:
    if command_id not in model or now >= model[command_id][3]:
        assert answer.status == "committed", answer  # a new id: applied
        return
    stored_variant, offset, outcome_until, _ = model[command_id]
    if stored_variant != variant:
        assert (answer.error_code, answer.detail) == ("Conflict", "command id was used for a different command")
    elif now < outcome_until:
        assert (answer.status, answer.offset) == ("committed", offset)  # the stored outcome
    else:
        assert answer.error_code == "HistoryUnavailable", answer
        assert f"applied at offset {offset} (committed)" in answer.detail
