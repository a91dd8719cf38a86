"""Compaction of confirmed retention tasks that waiting ones never hold back (feature level 7).

What a user notices: once the recovery floor passes a task's confirmed deletion, the next
AdvanceRecoveryFloor drops it (ListRetention no longer lists it), however many tasks still wait
in front of it. Before level 7 compaction examined the first tasks only, so a front of tasks
waiting on their upload horizon held every later one back. Tasks confirmed before the raise to
level 7 are indexed first, within the same per-command budget. Replay equals live throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from keyload import limits
from keyload.operations.census import census
from keyload.processors.features import CONFIRMED_INDEXED, EVENT_IDS_KEPT, LARGE_IDENTITIES_KEPT
from keyload.projections import keys
from keyload.sdk.results import RetentionPage, RetentionStatus

from .payloads import CANCEL_LARGE, D, Large, large_deployment
from .support import ACK, assert_replay_equals_live, expect, family_rows, pass_time, submit_unhalted

RAISE = "keyload.command.RaiseFeatureLevel"
BUDGET = 2  # tasks one AdvanceRecoveryFloor examines: fewer than the waiting ones in front
WAITING = 3
HOUR_MS = 3_600_000


@pytest.fixture
def large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Large]:
    monkeypatch.setattr(limits, "RETENTION_COMPACTION_BUDGET", BUDGET)
    with large_deployment(tmp_path / "data", payload_request_horizon_ms=1_000) as deployment:
        yield deployment


def send(large: Large, kind: str, body: dict[str, Any]) -> Any:
    return expect(submit_unhalted(large.embedded, D, f"keyload.command.{kind}", body), None)


def abandon(large: Large, message_id: str, window_ms: int) -> int:
    """A reservation cancelled unused: a retention task waiting on its upload horizon; its offset."""
    receipt = large.prepare(message_id, b"x" * 10_000, upload_window_ms=window_ms)
    outcome = submit_unhalted(large.embedded, D, CANCEL_LARGE, {"reservation_id": receipt.reservation_id})
    expect(outcome, None)
    return outcome.offset


def floor_at(large: Large, offset: int) -> RetentionPage:
    page: RetentionPage = send(large, "AdvanceRecoveryFloor", {"floor_offset": offset})
    return page


def task_ids(large: Large) -> list[int]:
    page: RetentionPage = send(large, "ListRetention", {"after_task": None, "limit": None})
    return [status.task.task_id for status in page.tasks]


def confirmed_behind_waiting_ones(large: Large) -> int:
    """WAITING tasks blocked for an hour, then one deleted and confirmed: its confirmation offset."""
    for i in range(WAITING):
        abandon(large, f"waiting-{i}", HOUR_MS)
    retired_at = abandon(large, "done", limits.MIN_UPLOAD_WINDOW_MS)
    large.embedded.now_ms += limits.MIN_UPLOAD_WINDOW_MS + 2_000  # past its deadline and request horizon
    floor_at(large, retired_at)
    send(large, "BeginDelete", {"task_id": WAITING + 1})
    status: RetentionStatus = send(large, "DeleteConfirmed", {"task_id": WAITING + 1, "deleted_versions": []})
    assert status.task.confirmed_offset is not None
    return status.task.confirmed_offset


@pytest.mark.parametrize(("level", "left"), [(EVENT_IDS_KEPT, WAITING + 1), (CONFIRMED_INDEXED, WAITING)])
def test_waiting_tasks_in_front_hold_compaction_back_only_before_level_7(
    large: Large, tmp_path: Path, level: int, left: int
) -> None:
    send(large, "RaiseFeatureLevel", {"level": level})
    confirmed = confirmed_behind_waiting_ones(large)
    floor_at(large, confirmed)
    assert len(task_ids(large)) == left
    assert family_rows(large.embedded.store(D), keys.RETENTION_CONFIRMED) == 0
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def test_tasks_confirmed_before_the_raise_are_indexed_within_the_budget(large: Large, tmp_path: Path) -> None:
    send(large, "RaiseFeatureLevel", {"level": EVENT_IDS_KEPT})
    confirmed = confirmed_behind_waiting_ones(large)
    send(large, "RaiseFeatureLevel", {"level": CONFIRMED_INDEXED})
    store = large.embedded.store(D)
    assert store.get(keys.RETENTION_INDEX_CURSOR) is not None
    floor_at(large, confirmed)  # indexes tasks 1 and 2: the budget is spent
    assert store.get(keys.RETENTION_INDEX_CURSOR) is not None
    assert census(large.embedded.data, large.embedded.partition(D)).retention_indexing
    floor_at(large, confirmed + 1)  # indexes tasks 3 and 4, the last ones to look at: done
    assert not census(large.embedded.data, large.embedded.partition(D)).retention_indexing
    assert (store.get(keys.RETENTION_INDEX_CURSOR), family_rows(store, keys.RETENTION_CONFIRMED)) == (None, 1)
    assert len(task_ids(large)) == WAITING + 1
    floor_at(large, confirmed + 2)  # compacts the confirmed task from its index row
    assert task_ids(large) == list(range(1, WAITING + 1))
    assert family_rows(store, keys.RETENTION_CONFIRMED) == 0
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def test_a_task_confirmed_after_the_raise_is_not_indexed_twice(large: Large, tmp_path: Path) -> None:
    """A task of before the raise confirmed after it gets its index row at confirmation; the look at
    the tasks of before the raise then finds the row there already, writes the same one, and the
    compaction in the same command drops the task with it."""
    retired_at = abandon(large, "early", limits.MIN_UPLOAD_WINDOW_MS)
    large.embedded.now_ms += limits.MIN_UPLOAD_WINDOW_MS + 2_000
    floor_at(large, retired_at)  # below level 7: nothing to compact; the task may now be deleted
    send(large, "RaiseFeatureLevel", {"level": CONFIRMED_INDEXED})
    send(large, "BeginDelete", {"task_id": 1})
    confirmed = send(large, "DeleteConfirmed", {"task_id": 1, "deleted_versions": []}).task.confirmed_offset
    store = large.embedded.store(D)
    assert store.get(keys.RETENTION_INDEX_CURSOR) is not None  # the look has not run: no floor advance since
    assert family_rows(store, keys.RETENTION_CONFIRMED) == 1
    floor_at(large, confirmed)  # looks at task 1 (one of the budget), then compacts it (the other)
    assert (store.get(keys.RETENTION_INDEX_CURSOR), family_rows(store, keys.RETENTION_CONFIRMED)) == (None, 0)
    assert task_ids(large) == []
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def finish_large(large: Large, tmp_path: Path, message_id: str) -> int:
    """A large message scheduled, received and acked: its retention task's retirement offset."""
    large.schedule(message_id, b"b" * 70_000, tmp_path)
    [delivery] = large.receive()
    acked: int = submit_unhalted(large.embedded, D, ACK, {"token": delivery.token}).offset
    return acked


def compact(large: Large, task_id: int, retired_at: int) -> None:
    """Past its handles: the floor to its retirement, its deletion confirmed, the floor past that."""
    large.embedded.now_ms += 2 * HOUR_MS  # past its read and upload handles and the request horizon
    floor_at(large, retired_at)
    send(large, "BeginDelete", {"task_id": task_id})
    status: RetentionStatus = send(large, "DeleteConfirmed", {"task_id": task_id, "deleted_versions": []})
    assert status.task.confirmed_offset is not None
    floor_at(large, status.task.confirmed_offset)
    assert task_id not in task_ids(large)


def horizons(large: Large, receipt_ms: int) -> None:
    send(large, "ConfigureDomain", {"outcome_horizon_ms": HOUR_MS, "receipt_horizon_ms": receipt_ms})


@pytest.mark.parametrize(("level", "reusable"), [(CONFIRMED_INDEXED, False), (LARGE_IDENTITIES_KEPT, True)])
def test_a_large_messages_identity_keeps_to_the_receipt_horizon_from_level_8(
    large: Large, tmp_path: Path, level: int, reusable: bool
) -> None:
    """A large message acked, its object deleted and its task compacted: the id stays taken (its
    identity row) until the domain's receipt horizon after the ack, then it is new; below level 8
    it stays taken for as long as the queue."""
    send(large, "RaiseFeatureLevel", {"level": level})
    horizons(large, 10 * HOUR_MS)
    finished_ms = large.embedded.now_ms
    compact(large, 1, finish_large(large, tmp_path, "big"))
    store = large.embedded.store(D)
    assert family_rows(store, keys.IDENTITY) == 1
    large.prepare("big", b"again", "Conflict")  # the id is still taken

    large.embedded.now_ms = finished_ms + 10 * HOUR_MS - 1
    pass_time(large.embedded, D, 1)  # the receipt horizon after the ack
    assert family_rows(store, keys.IDENTITY) == (0 if reusable else 1)
    large.prepare("big", b"again", None if reusable else "Conflict")
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def test_a_large_identity_keeps_the_horizon_of_when_its_message_finished(large: Large, tmp_path: Path) -> None:
    """A horizon shortened after the ack does not shorten the identity's (nor its inbox entries'):
    it goes at the horizon in force when the message finished."""
    send(large, "RaiseFeatureLevel", {"level": LARGE_IDENTITIES_KEPT})
    horizons(large, 10 * HOUR_MS)
    finished_ms = large.embedded.now_ms
    retired_at = finish_large(large, tmp_path, "big")
    horizons(large, HOUR_MS)
    compact(large, 1, retired_at)
    large.embedded.now_ms = finished_ms + 5 * HOUR_MS
    pass_time(large.embedded, D, 1)
    large.prepare("big", b"again", "Conflict")
    large.embedded.now_ms = finished_ms + 10 * HOUR_MS
    pass_time(large.embedded, D, 1)
    large.prepare("big", b"again")
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def test_a_large_identity_past_its_horizon_goes_with_the_compaction(large: Large, tmp_path: Path) -> None:
    """The horizon passes before the object is deleted: the history still holds the id until the
    task is compacted, and then the id is new at once."""
    send(large, "RaiseFeatureLevel", {"level": LARGE_IDENTITIES_KEPT})
    horizons(large, HOUR_MS)
    retired_at = finish_large(large, tmp_path, "big")
    pass_time(large.embedded, D, HOUR_MS)  # the identity row goes; the history stays
    assert family_rows(large.embedded.store(D), keys.IDENTITY) == 0
    large.prepare("big", b"again", "Conflict")
    compact(large, 1, retired_at)
    large.prepare("big", b"again")
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


def test_a_large_identity_retired_before_level_8_stays(large: Large, tmp_path: Path) -> None:
    send(large, "RaiseFeatureLevel", {"level": CONFIRMED_INDEXED})
    horizons(large, HOUR_MS)
    retired_at = finish_large(large, tmp_path, "big")
    send(large, "RaiseFeatureLevel", {"level": LARGE_IDENTITIES_KEPT})
    compact(large, 1, retired_at)
    pass_time(large.embedded, D, 10 * HOUR_MS)
    assert family_rows(large.embedded.store(D), keys.IDENTITY) == 1
    large.prepare("big", b"again", "Conflict")
    assert_replay_equals_live(large.embedded, D, tmp_path / "replay")


# A model: which tasks compaction has dropped, from confirmations, floors, the raise and the budget.

SHORT = limits.MIN_UPLOAD_WINDOW_MS
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("abandon"), st.sampled_from((SHORT, SHORT, HOUR_MS))),
        st.tuples(st.just("wait"), st.just(SHORT + 2_000)),  # past a short reservation's deadline and horizon
        st.tuples(st.just("delete"), st.integers(1, 7)),
        st.tuples(st.just("floor"), st.just(0)),
        st.tuples(st.just("raise"), st.just(0)),
    ),
    max_size=40,
)
# Two tasks compacted at level 6; one confirmed before the raise, indexed by the look after it and then
# compacted; one confirmed and compacted after it.
EXAMPLE = [("abandon", SHORT), ("abandon", SHORT), ("abandon", SHORT), ("abandon", HOUR_MS), ("wait", SHORT + 2_000)]
EXAMPLE += [("delete", 3), ("floor", 0), ("delete", 1), ("raise", 0), ("abandon", SHORT), ("floor", 0)]
EXAMPLE += [("abandon", HOUR_MS), ("floor", 0), ("wait", SHORT + 2_000), ("delete", 7), ("floor", 0)]


class Model:
    """The tasks left, and what compaction has to go on: the floor, the index, the look after the raise."""

    def __init__(self) -> None:
        self.tasks: dict[int, int | None] = {}  # task id -> its confirmation offset (None: not confirmed)
        self.level, self.floor = EVENT_IDS_KEPT, -1
        self.unlooked: list[int] = []  # the tasks of before the raise the index has still to look at
        self.indexed: set[int] = set()

    def passed(self, task_id: int) -> bool:
        offset = self.tasks[task_id]
        return offset is not None and offset <= self.floor

    def compact(self, floor: int) -> None:
        self.floor = floor
        if self.level < CONFIRMED_INDEXED:
            dropped = [task_id for task_id in sorted(self.tasks)[:BUDGET] if self.passed(task_id)]
        else:
            looked = [task_id for task_id in self.unlooked if task_id in self.tasks][:BUDGET]
            del self.unlooked[: self.unlooked.index(looked[-1]) + 1 if looked else len(self.unlooked)]
            self.indexed.update(task_id for task_id in looked if self.tasks[task_id] is not None)
            by_confirmation = sorted((self.tasks[i] or 0, i) for i in self.indexed if self.passed(i))
            dropped = [task_id for _, task_id in by_confirmation[: BUDGET - len(looked)]]
        for task_id in dropped:
            del self.tasks[task_id]
            self.indexed.discard(task_id)


@settings(max_examples=100, deadline=None)
@example(steps=EXAMPLE)
@given(steps=STEPS)
def test_compaction_follows_a_reference_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]]
) -> None:
    """Random abandoned reservations (blocked for a second or an hour), waits, deletions (floor
    advanced to the last record, then BeginDelete and DeleteConfirmed of some unconfirmed tasks,
    where the service allows them), floor advances and the raise to level 7, from level 6: after each floor advance the
    tasks left are the model's. The live projection equals its replay."""
    directory = tmp_path_factory.mktemp("retention")
    with (
        pytest.MonkeyPatch.context() as patch,
        large_deployment(directory / "data", payload_request_horizon_ms=1_000) as large,
    ):
        patch.setattr(limits, "RETENTION_COMPACTION_BUDGET", BUDGET)
        send(large, "RaiseFeatureLevel", {"level": EVENT_IDS_KEPT})
        model, last, created = Model(), 0, 0

        def advance() -> None:
            if last > model.floor:
                floor_at(large, last)
                model.compact(last)
                assert task_ids(large) == sorted(model.tasks)

        for action, arg in steps:
            if action == "abandon":
                last = abandon(large, f"m{created}", arg)
                created += 1
                model.tasks[created] = None
            elif action == "wait":
                large.embedded.now_ms += arg
            elif action == "delete":  # the unconfirmed tasks at positions p with bit p % 3 of arg set
                advance()
                unconfirmed = sorted(task_id for task_id, offset in model.tasks.items() if offset is None)
                for task_id in [task_id for p, task_id in enumerate(unconfirmed) if arg >> p % 3 & 1]:
                    begun = submit_unhalted(large.embedded, D, "keyload.command.BeginDelete", {"task_id": task_id})
                    if begun.status == "committed":
                        body = {"task_id": task_id, "deleted_versions": []}
                        confirmed = expect(
                            submit_unhalted(large.embedded, D, "keyload.command.DeleteConfirmed", body), None
                        )
                        model.tasks[task_id] = last = confirmed.task.confirmed_offset
                        if model.level == CONFIRMED_INDEXED:
                            model.indexed.add(task_id)
            elif action == "raise" and model.level < CONFIRMED_INDEXED:
                model.level = CONFIRMED_INDEXED
                last = submit_unhalted(large.embedded, D, RAISE, {"level": CONFIRMED_INDEXED}).offset
                model.unlooked = sorted(model.tasks)
            elif action == "floor":
                advance()
        assert_replay_equals_live(large.embedded, D, directory / "replay")
