"""Model-based test of batches: random batches of document writes, enqueues and cancels against a
reference model.

The model is plain Python written from the documented behaviour (DESIGN.md §4 and §7,
processors/documents/document.py): expected revision null = any, 0 = absent, n = exactly n; a
delete needs a live document and leaves a tombstone one revision up; revisions never
repeat; a message id is never reused; the queue holds at most MAX_STORED messages. A
batch applies in order and all or nothing: the first refusal rejects it with its
index and code, and a mutation naming another domain rejects it before anything runs.
It does not import the processors.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyload.log.codec import REGISTRY
from keyload.projections import keys
from keyload.sdk.results import BatchResult, Document, DocumentResult, EnqueueResult, MessageView, Outcome

from .support import (
    BATCH,
    CANCEL,
    CREATE_QUEUE,
    DELETE_DOCUMENT,
    ENQUEUE,
    GET_DOCUMENT,
    PUT_DOCUMENT,
    Embedded,
    batch_body,
    close_after_replay_check,
    create_queue_body,
    delete_document_body,
    enqueue_body,
    expect,
    message_fence,
    mutation,
    put_document_body,
    submit_unhalted,
)

D = "acme"
KEYS = ("k0", "k1", "k2")
MESSAGES = tuple(f"m{i}" for i in range(20))
MAX_STORED = 2
FRESH_FENCE = (1, 1)  # state version and delivery generation of a message just enqueued (ready)


@dataclass
class Doc:
    value: bytes
    revision: int
    deleted: bool
    updated_at_ms: int


@dataclass
class State:
    docs: dict[str, Doc] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # message id -> ready | cancelled

    @property
    def stored(self) -> int:
        return sum(state == "ready" for state in self.messages.values())


class Refused(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


def live_revision(doc: Doc | None) -> int | None:
    return None if doc is None or doc.deleted else doc.revision


def check_expected(doc: Doc | None, expected: int | None) -> None:
    live = live_revision(doc)
    if (expected == 0 and live is not None) or (expected is not None and expected > 0 and live != expected):
        raise Refused("RevisionConflict")


def apply(state: State, op: tuple[Any, ...], now: int) -> tuple[Any, ...]:
    """One mutation on `state`; its expected result, or Refused."""
    kind = op[0]
    if kind == "put":
        _, key, value, expected = op
        doc = state.docs.get(key)
        check_expected(doc, expected)
        revision = 1 if doc is None else doc.revision + 1
        state.docs[key] = Doc(value, revision, False, now)
        return ("document", key, revision, False)
    if kind == "delete":
        _, key, expected = op
        doc = state.docs.get(key)
        if expected == 0:
            raise Refused("Validation")
        check_expected(doc, expected)
        if doc is None or doc.deleted:
            raise Refused("NotFound")
        state.docs[key] = Doc(b"", doc.revision + 1, True, now)
        return ("document", key, doc.revision, True)
    if kind == "enqueue":
        _, message_id = op
        if message_id in state.messages:
            raise Refused("Conflict")
        if state.stored + 1 > MAX_STORED:
            raise Refused("ResourceExhausted")
        state.messages[message_id] = "ready"
        return ("enqueued", message_id, state.stored)
    assert kind == "cancel"
    _, message_id = op
    if message_id not in state.messages:
        raise Refused("NotFound")
    if state.messages[message_id] != "ready":
        raise Refused("RevisionConflict")  # cancelling moved its state version past the fresh fence
    state.messages[message_id] = "cancelled"
    return ("cancelled", message_id)


def resolve(ops: list[tuple[Any, ...]], state: State) -> list[tuple[Any, ...]]:
    """The drawn ops made concrete against the state each will find (earlier ops of the batch
    applied), so that most are right and some are wrong.

    Expected revisions: "any" null, "current" the document's revision (wrong for a tombstone:
    the document is absent), "stale" one below it, "ahead" one above, "absent" 0, or an int as
    drawn. Message ids: "fresh" the first id never used, "ready" the oldest ready message
    (else m0), or an id as drawn (often a used one: Conflict, or NotFound for a cancel).
    """
    trial = copy.deepcopy(state)
    resolved = []
    for op in ops:
        if op[0] in ("put", "delete"):
            doc = trial.docs.get(op[1])
            current = 0 if doc is None else doc.revision
            choices = {"any": None, "current": current, "stale": current - 1, "ahead": current + 1, "absent": 0}
            expected = choices[op[-1]] if isinstance(op[-1], str) else op[-1]
            op = (*op[:-1], None if expected is not None and expected < 0 else expected)
        elif op[0] in ("enqueue", "cancel"):
            fresh = next((m for m in MESSAGES if m not in trial.messages), MESSAGES[0])
            ready = next((m for m, s in trial.messages.items() if s == "ready"), MESSAGES[0])
            op = (op[0], {"fresh": fresh, "ready": ready}.get(op[1], op[1]))
        resolved.append(op)
        if op[0] != "foreign":
            with contextlib.suppress(Refused):
                apply(trial, op, 0)
    return resolved


def encode(op: tuple[Any, ...]) -> dict[str, Any]:
    kind = op[0]
    if kind == "put":
        return mutation(PUT_DOCUMENT, put_document_body(op[1], op[2], op[3]))
    if kind == "delete":
        return mutation(DELETE_DOCUMENT, delete_document_body(op[1], op[2]))
    if kind == "enqueue":
        return mutation(ENQUEUE, enqueue_body("jobs", op[1], b"job"))
    if kind == "cancel":
        return mutation(CANCEL, message_fence("jobs", op[1], *FRESH_FENCE))
    assert kind == "foreign"
    return mutation(PUT_DOCUMENT, put_document_body(op[1]), "elsewhere")


def observed(result: Any) -> tuple[Any, ...]:
    """A mutation result in the model's terms."""
    if isinstance(result, DocumentResult):
        return ("document", result.key, result.revision, result.deleted)
    if isinstance(result, EnqueueResult):
        assert result.state == "ready"
        return ("enqueued", result.message_id, result.stored_messages)
    assert isinstance(result, MessageView) and result.meta.state == "cancelled"
    return ("cancelled", result.message_id)


def drawn(kind: str, key: str, value: bytes, revision: str | int, message: str) -> tuple[Any, ...]:
    """An op as drawn, before `resolve`."""
    if kind == "put":
        return (kind, key, value, revision)
    if kind == "delete":
        return (kind, key, revision)
    return (kind, message)


# sampled_from draws its elements about evenly (and shrinks towards the first): repeats weigh.
operations = st.builds(
    drawn,
    st.sampled_from(["put", "put", "put", "delete", "enqueue", "enqueue", "cancel"]),
    st.sampled_from(KEYS),
    st.binary(max_size=3),
    st.sampled_from(["current", "any", "current", "any", "current", "stale", "ahead", "absent", 2, 5]),
    st.sampled_from(["fresh", "ready", "fresh", "ready", "fresh", *MESSAGES[:3]]),
)
# Now and then a batch holds a mutation naming another domain, anywhere in it.
strays = st.tuples(st.sampled_from([False] * 7 + [True]), st.sampled_from(KEYS), st.integers(0, 5))


class BatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-batch-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        expect(self.submit(CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=MAX_STORED)), None)
        self.model = State()
        self.last: tuple[str, dict[str, Any], Outcome] | None = None

    def submit(self, kind: str, body: dict[str, Any], command_id: str | None = None) -> Outcome:
        return submit_unhalted(self.embedded, D, kind, body, command_id)

    def run(self, ops: list[tuple[Any, ...]]) -> None:
        ops = resolve(ops, self.model)
        body = batch_body(*(encode(op) for op in ops))
        command_id = str(uuid.uuid4())
        outcome = self.submit(BATCH, body, command_id)
        self.last = (command_id, body, outcome)
        foreign_at = next((i for i, op in enumerate(ops) if op[0] == "foreign"), None)
        if foreign_at is not None:
            assert (outcome.status, outcome.error_code, outcome.failed_index) == ("rejected", "Validation", foreign_at)
            return
        trial = copy.deepcopy(self.model)
        expected: list[tuple[Any, ...]] = []
        for index, op in enumerate(ops):
            try:
                expected.append(apply(trial, op, self.embedded.now_ms))
            except Refused as refusal:
                got = (outcome.status, outcome.error_code, outcome.failed_index)
                assert got == ("rejected", refusal.code, index), outcome
                return
        result = expect(outcome, None)
        assert isinstance(result, BatchResult) and outcome.failed_index is None
        assert [observed(r) for r in result.results] == expected
        self.model = trial

    @rule(ops=st.lists(operations, min_size=1, max_size=5), stray=strays)
    def batch(self, ops: list[tuple[Any, ...]], stray: tuple[bool, str, int]) -> None:
        wanted, key, at = stray
        self.run([*ops[:at], ("foreign", key), *ops[at:]] if wanted else ops)

    @precondition(lambda self: self.last is not None)
    @rule()
    def retry_the_last_batch(self) -> None:
        """The same command id again: the first outcome, whatever happened since, and no effect
        (the invariants check the documents and the queue still match the model)."""
        assert self.last is not None
        command_id, body, first = self.last
        again = self.submit(BATCH, body, command_id)
        assert (again.offset, again.status, again.error_code, again.failed_index, again.result) == (
            first.offset,
            first.status,
            first.error_code,
            first.failed_index,
            first.result,
        )

    @rule(ms=st.integers(1, 5_000))
    def time_passes(self, ms: int) -> None:
        self.embedded.now_ms += ms

    @invariant()
    def documents_match_the_model(self) -> None:
        store = self.embedded.store(D)
        for key in KEYS:
            raw = store.get(keys.document(D, key))
            doc = self.model.docs.get(key)
            stored = None if raw is None else REGISTRY.decode("keyload.DocumentRecord", raw)
            assert stored == (None if doc is None else asdict(doc)), key
            outcome = self.submit(GET_DOCUMENT, {"key": key})
            if doc is None or doc.deleted:
                expect(outcome, "NotFound")
            else:
                assert outcome.result == Document(
                    key=key, value=doc.value, revision=doc.revision, updated_at_ms=doc.updated_at_ms
                )

    @invariant()
    def the_queue_matches_the_model(self) -> None:
        raw = self.embedded.store(D).get(keys.queue(D, "jobs"))
        assert raw is not None
        counters = REGISTRY.decode("keyload.QueueRecord", raw)["view"]["counters"]
        assert counters["stored_messages"] == self.model.stored
        assert counters["enqueued_total"] == len(self.model.messages)
        assert counters["cancelled_total"] == sum(s == "cancelled" for s in self.model.messages.values())

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


BatchMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_batch_model = BatchMachine.TestCase
