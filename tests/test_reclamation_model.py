"""Model-based test of queue deletion and the reclamation of its rows, against a reference model.

Random creates, enqueues, drains, deletes (forced or not), purges and Ticks over two queue names. The model knows, per
name, the live incarnation and its messages, and the incarnations deleted. Checked after every
step: a live queue's rows are all there (every message it ever took keeps its metadata); a deleted
incarnation's rows only ever shrink, by at most the tick examination budget per record applied;
one fully reclaimed leaves no reclamation row, resource row or due entry behind. At the end, enough
Ticks reclaim everything, and a replay reaches the live digest.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from keyload import limits
from keyload.processors.reclamation import QUEUE_FAMILIES
from keyload.projections import keys

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    RECEIVE,
    TICK,
    Embedded,
    close_after_replay_check,
    create_queue_body,
    enqueue_body,
    expect,
    receive_body,
    submit_unhalted,
)

D = "acme"
NAMES = st.sampled_from(["a", "b"])


class ReclamationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-reclamation-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        self.live: dict[str, int] = {}  # name -> incarnation
        self.messages: dict[int, int] = {}  # incarnation -> messages it ever took
        self.pending: dict[int, int] = {}  # incarnation -> messages not yet settled
        self.retired: dict[int, int] = {}  # deleted incarnation -> its rows left, as last seen
        self.enqueued = 0
        self.records = self.embedded.log.end_offset(0)

    def submit(self, kind: str, body: dict[str, object], code: str | None = None) -> object:
        return expect(submit_unhalted(self.embedded, D, kind, body), code)

    def rows(self, incarnation: int) -> int:
        store = self.embedded.store(D)
        return sum(
            1
            for family in QUEUE_FAMILIES
            for _ in store.scan(family + keys.u64(incarnation), keys.prefix_end(family + keys.u64(incarnation)))
        )

    @rule(name=NAMES)
    def create(self, name: str) -> None:
        if name in self.live:
            self.submit(CREATE_QUEUE, create_queue_body(name), "Conflict")
            return
        view = self.submit(CREATE_QUEUE, create_queue_body(name, receive_max_messages=100))
        incarnation: int = view.incarnation  # type: ignore[attr-defined]
        self.live[name] = incarnation
        self.messages[incarnation] = self.pending[incarnation] = 0

    @rule(name=NAMES, count=st.integers(1, 30), keyed=st.booleans())
    def enqueue(self, name: str, count: int, keyed: bool) -> None:
        if name not in self.live:
            self.submit(ENQUEUE, enqueue_body(name, "m"), "NotFound")
            return
        incarnation = self.live[name]
        for _ in range(count):
            self.enqueued += 1
            key = f"k{self.enqueued % 3}" if keyed else None
            self.submit(ENQUEUE, enqueue_body(name, f"m{self.enqueued}", ordering_key=key))
        self.messages[incarnation] += count
        self.pending[incarnation] += count

    @rule(name=NAMES)
    def drain(self, name: str) -> None:
        """Receive and ack everything the queue holds (strict keys wait for their heads: loop)."""
        if name not in self.live:
            return
        incarnation = self.live[name]
        while deliveries := self.submit(RECEIVE, receive_body(name, max_messages=100)).deliveries:  # type: ignore[attr-defined]
            self.submit("keyload.command.AckBatch", {"tokens": [d.token for d in deliveries]})
            self.pending[incarnation] -= len(deliveries)
        assert self.pending[incarnation] == 0

    @rule(name=NAMES, force=st.booleans())
    def delete(self, name: str, force: bool) -> None:
        body = {"queue": name, "force": force}
        if name not in self.live:
            self.submit("keyload.command.DeleteQueue", body, "NotFound")
            return
        incarnation = self.live[name]
        if self.pending[incarnation] and not force:
            self.submit("keyload.command.DeleteQueue", body, "Conflict")
            return
        self.submit("keyload.command.DeleteQueue", body)
        del self.live[name]
        self.retired[incarnation] = self.rows(incarnation)

    @rule(name=NAMES)
    def purge(self, name: str) -> None:
        """A purge retires the incarnation as a forced delete does, and a new one holding nothing takes
        the name, configured as the queue was."""
        body = {"queue": name, "expected_incarnation": None}
        if name not in self.live:
            self.submit("keyload.command.PurgeQueue", body, "NotFound")
            return
        incarnation = self.live[name]
        before = self.submit("keyload.command.InspectQueue", {"queue": name})
        view = self.submit("keyload.command.PurgeQueue", body)
        assert view.incarnation > incarnation and view.counters.stored_messages == 0  # type: ignore[attr-defined]
        kept = ("policy", "policy_version", "created_at_ms", "paused", "closed")
        assert all(getattr(view, field) == getattr(before, field) for field in kept)
        self.retired[incarnation] = self.rows(incarnation)
        self.live[name] = view.incarnation  # type: ignore[attr-defined]
        self.messages[view.incarnation] = self.pending[view.incarnation] = 0  # type: ignore[attr-defined]

    @rule(ms=st.integers(0, 50))
    def tick(self, ms: int) -> None:
        self.embedded.now_ms += ms
        self.submit(TICK, {})

    @invariant()
    def live_rows_are_untouched_and_retired_ones_shrink_within_the_budget(self) -> None:
        store = self.embedded.store(D)
        for incarnation in self.live.values():
            prefix = keys.MESSAGE + keys.u64(incarnation)
            assert sum(1 for _ in store.scan(prefix, keys.prefix_end(prefix))) == self.messages[incarnation]
        applied = self.embedded.log.end_offset(0) - self.records
        self.records += applied
        reclaimed = 0
        for incarnation, before in self.retired.items():
            left = self.rows(incarnation)
            assert left <= before
            reclaimed += before - left
            self.retired[incarnation] = left
            if left == 0 and store.get(keys.retired(incarnation)) is None:
                assert store.get(keys.resource_key(incarnation)) is None
        assert reclaimed <= applied * limits.TICK_EXAMINATION_BUDGET

    def teardown(self) -> None:
        try:
            for _ in range(sum(self.retired.values()) // limits.TICK_EXAMINATION_BUDGET + 2):
                self.tick(1)
            store = self.embedded.store(D)
            for incarnation in self.retired:
                assert self.rows(incarnation) == 0
                assert store.get(keys.retired(incarnation)) is None
                assert store.get(keys.resource_key(incarnation)) is None
            due = [
                keys.parse_due_queue(key)[1] for key, _ in store.scan(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))
            ]
            assert not set(due) & set(self.retired)
        finally:
            close_after_replay_check(self.embedded, self.directory)


ReclamationMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
test_reclamation_model = ReclamationMachine.TestCase
