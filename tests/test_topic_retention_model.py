"""Model-based test of topic retention (age, caps under discard new or old) against a reference model.

Random publishes, ticks, group consumption (acked or left outstanding), group seeks, group deletion
(forced or not) and re-creation, and policy changes on one topic read by up to two subscription
groups. The model is a plain list of (position, publish time, charged bytes) with the
rules of docs/ARCHITECTURE.md §6 ("Topic retention") written out directly: before every record the
retention timer fires when due; a publish at a cap is refused (discard new) or pushes the oldest
events out (discard old), never past the slowest group's checkpoint. The groups themselves are not
modelled: their checkpoints are read from the projection, as the processor would see them. Checked
after every step: the retained range, counters and the timer are the model's, and no group has lost
an event it has not completed. At the end, a replay reaches the live digest.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from keyload import limits
from keyload.processors.policy import default_topic_spec
from keyload.projections import keys
from keyload.projections.records import GroupRecord, TopicRecord

from .support import (
    CREATE_GROUP,
    CREATE_TOPIC,
    DELETE_GROUP,
    GROUP_ACK_BATCH,
    GROUP_RECEIVE,
    PUBLISH,
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
GROUPS = ("g1", "g2")
RECHECK = limits.TOPIC_RETENTION_RECHECK_MS
POLICIES = st.fixed_dictionaries(
    {
        "max_age_ms": st.sampled_from([0, 2_000, 10_000]),
        "max_retained_events": st.sampled_from([2, 4, 50]),
        "max_retained_bytes": st.sampled_from([12, 40, 10_000]),
        "discard": st.sampled_from(["new", "old"]),
    }
)


@dataclass
class Retained:
    position: int
    published_at_ms: int
    charged_bytes: int


class TopicRetentionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-topic-retention-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        self.events: list[Retained] = []
        self.tail = 0
        self.policy: dict[str, Any] = {}
        self.due: int | None = None
        self.published = 0

    # -- the reference model -----------------------------------------------------------------

    def group(self, name: str) -> GroupRecord | None:
        topic_id = TopicRecord.decode(self.stored(keys.topic(D, T))).view.incarnation
        raw = self.embedded.store(D).get(keys.group(topic_id, name))
        return None if raw is None else GroupRecord.decode(raw)

    def checkpoints(self) -> list[int]:
        return [group.view.checkpoint for name in GROUPS if (group := self.group(name)) is not None]

    def limit(self) -> int:
        """The purge limit: no group parks here (nothing is nacked), so the slowest checkpoint."""
        return min(self.checkpoints(), default=self.tail)

    def stored(self, key: bytes) -> bytes:
        raw = self.embedded.store(D).get(key)
        assert raw is not None
        return raw

    def over_caps(self) -> bool:
        return len(self.events) > self.policy["max_retained_events"] or (
            sum(e.charged_bytes for e in self.events) > self.policy["max_retained_bytes"]
        )

    def due_now(self, now: int) -> int | None:
        if not self.events:
            return None
        if self.policy["discard"] == "old" and self.over_caps():
            return now
        age = self.policy["max_age_ms"]
        return self.events[0].published_at_ms + age if age else None

    def before_record(self) -> None:
        """The retention timer fires before a record when log time has reached it."""
        now = self.embedded.now_ms
        if self.due is None or self.due > now:
            return
        limit = self.limit()
        age = self.policy["max_age_ms"]
        self.due = None
        while self.events:
            front = self.events[0]
            over = self.policy["discard"] == "old" and self.over_caps()
            if not (over or (age and front.published_at_ms + age <= now)):
                self.due = front.published_at_ms + age if age else None
                break
            if front.position > limit:
                self.due = now + RECHECK
                break
            self.events.pop(0)

    def submit(self, kind: str, body: dict[str, Any], code: str | None = None) -> Any:
        self.before_record()
        return expect(submit_unhalted(self.embedded, D, kind, body), code)

    # -- rules ---------------------------------------------------------------------------------

    @initialize(policy=POLICIES)
    def create(self, policy: dict[str, Any]) -> None:
        self.policy = policy
        self.submit(CREATE_TOPIC, create_topic_body(T, **policy))
        for name in GROUPS:
            self.submit(CREATE_GROUP, create_group_body(T, name))

    @rule(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=3), ms=st.integers(0, 3_000))
    def publish(self, sizes: list[int], ms: int) -> None:
        self.embedded.now_ms += ms
        self.before_record()
        now = self.embedded.now_ms
        charges = [size + len("t") for size in sizes]
        events = [event(f"e{self.published + i}", b"b" * size) for i, size in enumerate(sizes)]
        self.published += len(sizes)
        max_events, max_bytes = self.policy["max_retained_events"], self.policy["max_retained_bytes"]
        kept = list(self.events)
        if len(kept) + len(sizes) > max_events or sum(e.charged_bytes for e in kept) + sum(charges) > max_bytes:
            limit = self.limit()
            while kept and (
                len(kept) + len(sizes) > max_events or sum(e.charged_bytes for e in kept) + sum(charges) > max_bytes
            ):
                if self.policy["discard"] == "new" or kept[0].position > limit:
                    break
                kept.pop(0)
            if len(kept) + len(sizes) > max_events or sum(e.charged_bytes for e in kept) + sum(charges) > max_bytes:
                expect(submit_unhalted(self.embedded, D, PUBLISH, publish_body(T, *events)), "ResourceExhausted")
                return
        expect(submit_unhalted(self.embedded, D, PUBLISH, publish_body(T, *events)), None)
        front = self.events[0].position if self.events else None
        self.events = kept + [Retained(self.tail + 1 + i, now, charge) for i, charge in enumerate(charges)]
        self.tail += len(sizes)
        if front is None or self.events[0].position != front:
            self.due = self.due_now(now)

    @rule(ms=st.integers(0, 2 * RECHECK))
    def tick(self, ms: int) -> None:
        self.embedded.now_ms += ms
        self.submit(TICK, {})

    @rule(group=st.sampled_from(GROUPS), count=st.integers(1, 4), ack=st.booleans())
    def consume(self, group: str, count: int, ack: bool) -> None:
        if self.group(group) is None:
            self.submit(GROUP_RECEIVE, group_receive_body(T, group), "NotFound")
            return
        result = self.submit(GROUP_RECEIVE, group_receive_body(T, group, max_events=count))
        if result.deliveries and ack:
            tokens = [delivery.token for delivery in result.deliveries]
            self.submit(GROUP_ACK_BATCH, {"topic": T, "group": group, "tokens": tokens})

    @rule(group=st.sampled_from(GROUPS))
    def seek_to_the_end(self, group: str) -> None:
        body = {"topic": T, "group": group, "to": "end", "position": None, "expected_generation": None}
        if self.group(group) is None:
            self.submit(SEEK_GROUP, body, "NotFound")
            return
        self.submit(SEEK_GROUP, body)
        self.submit("keyload.command.ResumeGroup", {"topic": T, "group": group})

    @rule(group=st.sampled_from(GROUPS), force=st.booleans())
    def delete_group(self, group: str, force: bool) -> None:
        """Its pins go at once: retention looks at the front again at the next record."""
        body = {"topic": T, "group": group, "force": force}
        found = self.group(group)
        if found is None:
            self.submit(DELETE_GROUP, body, "NotFound")
        elif found.view.outstanding and not force:
            self.submit(DELETE_GROUP, body, "Conflict")
        else:
            self.submit(DELETE_GROUP, body)
            if self.due is not None and self.due > self.embedded.now_ms:
                self.due = self.embedded.now_ms

    @rule(group=st.sampled_from(GROUPS))
    def create_group(self, group: str) -> None:
        self.submit(CREATE_GROUP, create_group_body(T, group), None if self.group(group) is None else "Conflict")

    @rule(policy=POLICIES)
    def configure(self, policy: dict[str, Any]) -> None:
        body = {"topic": T, "policy": {**default_topic_spec(), **policy}, "expected_policy_version": None}
        self.submit("keyload.command.ConfigureTopic", body)
        self.policy = policy
        self.due = self.due_now(self.embedded.now_ms)

    # -- what the user would notice --------------------------------------------------------------

    @invariant()
    def the_topic_retains_what_the_model_does_and_no_group_loses_an_event(self) -> None:
        if not self.policy:
            return
        record = TopicRecord.decode(self.stored(keys.topic(D, T)))
        topic = record.view
        first = self.events[0].position if self.events else self.tail + 1
        assert (topic.first_available, topic.tail, topic.retained_events) == (first, self.tail, len(self.events))
        assert topic.retained_bytes == sum(e.charged_bytes for e in self.events)
        assert record.next_timer_ms == self.due
        assert all(topic.first_available - 1 <= checkpoint for checkpoint in self.checkpoints())

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


TopicRetentionMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_topic_retention_model = TopicRetentionMachine.TestCase
