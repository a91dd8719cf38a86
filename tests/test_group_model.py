"""Model-based test of subscription groups: two groups on one topic against a reference model.

The model is plain Python written from the documented behaviour (DESIGN.md §6,
processors/groups/group.py): positions are claimed in order, filtered ones resolve, the
checkpoint is the highest contiguous resolved position, leases expire into retries
and parking, seeks reposition and pause, purges are pinned. It does not import the
processors. Each step checks both groups' status against the model, so a step on
one group that moved the other would fail.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from keyload.sdk.results import GroupLeaseResult, GroupReceiveResult, GroupView, Outcome, TopicView

from .support import (
    CREATE_GROUP,
    CREATE_TOPIC,
    GROUP_ACK,
    GROUP_NACK,
    GROUP_RECEIVE,
    GROUP_STATUS,
    PAUSE_GROUP,
    PUBLISH,
    PURGE_TOPIC,
    RESUME_GROUP,
    SEEK_GROUP,
    TICK,
    Embedded,
    close_after_replay_check,
    create_group_body,
    create_topic_body,
    event,
    expect,
    group_receive_body,
    publish_body,
    submit_unhalted,
)

D = "acme"
T = "news"
POLICY = {"lease_ms": 1_000, "max_attempts": 2, "retry_base_ms": 500, "retry_factor": 2, "retry_max_ms": 800}
GROUPS = {"all": ([], 3), "only-a": (["a"], 2)}  # name -> (event types, max_window)
LEASE, RETRY = 1, 2  # timer kinds, in firing order at the same instant


@dataclass
class Delivery:
    state: str  # leased | retrying | due
    attempts: int = 0
    lease_version: int = 0
    until: int = 0  # lease deadline or retry time


@dataclass
class Group:
    event_types: list[str]
    max_window: int
    checkpoint: int = 0
    issued: int = 0
    generation: int = 1
    paused: bool = False
    pin_floor: int = 0
    outstanding: dict[int, Delivery] = field(default_factory=dict)
    parked: set[int] = field(default_factory=set)

    def matches(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types

    def settle_checkpoint(self) -> None:
        self.checkpoint = min(self.outstanding) - 1 if self.outstanding else self.issued

    def reposition(self, checkpoint: int) -> None:
        self.outstanding.clear()
        self.parked = {p for p in self.parked if p <= checkpoint}
        self.checkpoint = self.issued = checkpoint
        self.generation += 1
        self.paused = True

    def purge_limit(self, first_available: int) -> int:
        pinning = [p for p in self.parked if p > self.pin_floor and p >= first_available]
        return min([self.checkpoint, *(p - 1 for p in pinning)])


@dataclass(frozen=True)
class Token:
    text: str
    group: str
    position: int
    generation: int
    lease_version: int


class Model:
    def __init__(self) -> None:
        self.types: list[str] = []  # event type at position i + 1
        self.first_available = 1
        self.generation = 1
        self.groups = {name: Group(types, window) for name, (types, window) in GROUPS.items()}

    @property
    def tail(self) -> int:
        return len(self.types)

    def fail(self, group: Group, position: int, now: int, delay: int | None = None) -> None:
        delivery = group.outstanding[position]
        if delivery.attempts >= POLICY["max_attempts"]:
            del group.outstanding[position]
            group.parked.add(position)
            group.settle_checkpoint()
            return
        if delay is None:
            backoff = POLICY["retry_base_ms"] * POLICY["retry_factor"] ** (delivery.attempts - 1)
            delay = min(backoff, POLICY["retry_max_ms"])
        delivery.state, delivery.until = "retrying", now + delay

    def fire_due(self, now: int) -> None:
        timers = sorted(
            (d.until, LEASE if d.state == "leased" else RETRY, name, position)
            for name, group in self.groups.items()
            for position, d in group.outstanding.items()
            if d.state != "due" and d.until <= now
        )
        for _, kind, name, position in timers:
            group = self.groups[name]
            if kind == LEASE:
                self.fail(group, position, now)
            else:
                group.outstanding[position].state = "due"

    def receive(self, name: str, max_events: int, now: int) -> list[tuple[int, int]] | None:
        """(position, attempts) delivered, or None when paused."""
        group = self.groups[name]
        if group.paused:
            return None
        taken: list[int] = sorted(p for p, d in group.outstanding.items() if d.state == "due")[:max_events]
        while len(taken) < max_events and group.issued < self.tail and len(group.outstanding) < group.max_window:
            group.issued += 1
            if group.matches(self.types[group.issued - 1]):
                group.outstanding[group.issued] = Delivery("leased")
                taken.append(group.issued)
            elif not group.outstanding:
                group.checkpoint = group.issued
        delivered = []
        for position in taken:
            delivery = group.outstanding[position]
            delivery.state, delivery.until = "leased", now + POLICY["lease_ms"]
            delivery.attempts += 1
            delivery.lease_version += 1
            delivered.append((position, delivery.attempts))
        return delivered

    def check_token(self, token: Token, now: int) -> str | None:
        group = self.groups[token.group]
        if token.generation != group.generation:
            return "TokenInvalidated"
        delivery = group.outstanding.get(token.position)
        if delivery is None or delivery.state != "leased" or delivery.lease_version != token.lease_version:
            return "StaleLease"
        assert delivery.until > now, "a lease past its deadline has fired"
        return None


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-group-model-"))
        self.embedded = Embedded(self.directory / "data")
        self.model = Model()
        self.tokens: list[Token] = []

    @initialize()
    def create(self) -> None:
        assert self.submit(CREATE_TOPIC, create_topic_body(T)).status == "committed"
        for name, (types, window) in GROUPS.items():
            body = create_group_body(T, name, event_types=types, max_window=window, **POLICY)
            assert self.submit(CREATE_GROUP, body).status == "committed"

    def submit(self, kind: str, body: dict[str, Any]) -> Outcome:
        """Append and apply one command; the model fires its due timers at the same log time."""
        self.model.fire_due(self.embedded.now_ms)
        return submit_unhalted(self.embedded, D, kind, body)

    # -- rules ----------------------------------------------------------------------------

    @rule(types=st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=4))
    def publish(self, types: list[str]) -> None:
        start = self.model.tail + 1
        events = [event(f"e-{start + i}", b"x", t) for i, t in enumerate(types)]
        expect(self.submit(PUBLISH, publish_body(T, *events)), None)
        self.model.types.extend(types)

    @rule(name=st.sampled_from(sorted(GROUPS)), max_events=st.integers(1, 4))
    def receive(self, name: str, max_events: int) -> None:
        expected = self.model.receive(name, max_events, self.embedded.now_ms)
        outcome = self.submit(GROUP_RECEIVE, group_receive_body(T, name, max_events=max_events))
        if expected is None:
            expect(outcome, "DispatchPaused")
            return
        result = expect(outcome, None)
        assert isinstance(result, GroupReceiveResult)
        assert [(d.position, d.attempts) for d in result.deliveries] == expected
        generation = self.model.groups[name].generation
        for d in result.deliveries:
            version = self.model.groups[name].outstanding[d.position].lease_version
            self.tokens.append(Token(d.token, name, d.position, generation, version))
            assert d.lease_until_ms == self.model.groups[name].outstanding[d.position].until

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 1_000), nack=st.booleans(), delay=st.none() | st.sampled_from([0, 300]))
    def settle(self, pick: int, nack: bool, delay: int | None) -> None:
        """Ack or nack any token ever issued, most often a recent one: out of order, stale, invalidated."""
        token = self.tokens[-1 - pick % len(self.tokens)]
        code = self.model.check_token(token, self.embedded.now_ms)
        body = {"topic": T, "group": token.group, "token": token.text}
        outcome = self.submit(GROUP_NACK, {**body, "delay_ms": delay}) if nack else self.submit(GROUP_ACK, body)
        result = expect(outcome, code)
        if code is not None:
            return
        group = self.model.groups[token.group]
        if nack:
            self.model.fail(group, token.position, self.embedded.now_ms, delay)
        else:
            del group.outstanding[token.position]
            group.settle_checkpoint()
        assert isinstance(result, GroupLeaseResult)
        assert result.checkpoint == group.checkpoint

    @rule(ms=st.sampled_from([200, 600, 1_000, 1_500]))
    def advance(self, ms: int) -> None:
        """Log time moves: leases run out into retries or parking, retries come due."""
        self.embedded.now_ms += ms
        expect(self.submit(TICK, {}), None)

    @rule(
        name=st.sampled_from(sorted(GROUPS)),
        to=st.sampled_from(["beginning", "end", "position"]),
        at=st.integers(0, 12),
    )
    def seek(self, name: str, to: str, at: int) -> None:
        model = self.model
        body = {"topic": T, "group": name, "to": to, "position": at if to == "position" else None}
        outcome = self.submit(SEEK_GROUP, {**body, "expected_generation": None})
        if to == "position" and at < model.first_available:
            expect(outcome, "HistoryUnavailable")
            return
        if to == "position" and at > model.tail + 1:
            expect(outcome, "Validation")
            return
        target = {"beginning": model.first_available - 1, "end": model.tail}.get(to, at - 1)
        expect(outcome, None)
        group = model.groups[name]
        group.reposition(target)
        group.pin_floor = target

    @rule(name=st.sampled_from(sorted(GROUPS)), paused=st.booleans())
    def pause_or_resume(self, name: str, paused: bool) -> None:
        result = expect(self.submit(PAUSE_GROUP if paused else RESUME_GROUP, {"topic": T, "group": name}), None)
        self.model.groups[name].paused = paused
        assert isinstance(result, GroupView) and result.paused == paused

    @rule(through=st.integers(0, 14), stale=st.booleans())
    def purge(self, through: int, stale: bool) -> None:
        model = self.model
        generation = model.generation - (1 if stale else 0)
        outcome = self.submit(PURGE_TOPIC, {"topic": T, "through": through, "expected_generation": generation})
        limit = min(g.purge_limit(model.first_available) for g in model.groups.values())
        if stale:
            code: str | None = "RevisionConflict"
        elif through < model.first_available:
            code = "Validation"
        elif through > model.tail or through > limit:
            code = "ResourceExhausted"
        else:
            code = None
        result = expect(outcome, code)
        if code is None:
            assert isinstance(result, TopicView)
            model.first_available, model.generation = through + 1, model.generation + 1
            for group in model.groups.values():
                group.parked = {p for p in group.parked if p > through}
            assert (result.first_available, result.generation) == (model.first_available, model.generation)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def groups_match_the_model(self) -> None:
        for name, group in self.model.groups.items():
            view = expect(self.submit(GROUP_STATUS, {"topic": T, "group": name}), None)
            assert isinstance(view, GroupView)
            got = (view.checkpoint, view.issued, view.outstanding, view.generation, view.paused)
            assert got == (group.checkpoint, group.issued, len(group.outstanding), group.generation, group.paused)
            assert view.parked == sorted(p for p in group.parked if p >= self.model.first_available)
            assert view.lag == self.model.tail - group.checkpoint

    @invariant()
    def the_checkpoint_is_the_highest_contiguous_resolved_position(self) -> None:
        """Between the checkpoint and issued nothing is skipped: every position is outstanding or
        resolved, and the checkpoint stops just below the lowest outstanding one."""
        for group in self.model.groups.values():
            resolved = [p for p in range(group.checkpoint + 1, group.issued + 1) if p not in group.outstanding]
            contiguous = group.checkpoint
            while contiguous + 1 <= group.issued and contiguous + 1 in resolved:
                contiguous += 1
            assert contiguous == group.checkpoint
            assert all(group.matches(self.model.types[p - 1]) for p in group.outstanding)
            assert self.model.first_available - 1 <= group.checkpoint <= group.issued <= self.model.tail

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


GroupMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
test_group_model = GroupMachine.TestCase
