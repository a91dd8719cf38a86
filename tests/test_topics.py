"""Topics through the real processor, file log and RocksDB: positions, byte accounting, dedup, caps, reads."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.operations.recovery import replay
from keyload.processors.apply import fingerprint
from keyload.projections import keys
from keyload.sdk.results import PublishedEvent, PublishResult, TopicPage, TopicView

from .support import (
    CREATE_QUEUE,
    CREATE_TOPIC,
    INSPECT_QUEUE,
    INSPECT_TOPIC,
    PUBLISH,
    READ_TOPIC,
    Embedded,
    close_after_replay_check,
    command,
    create_queue_body,
    create_topic_body,
    event,
    publish_body,
    read_body,
    run_keyload,
    start_service,
    stop_service,
)

D = "acme"


def topic_view(embedded: Embedded, topic: str = "news") -> TopicView:
    outcome = embedded.submit(D, INSPECT_TOPIC, {"topic": topic})
    assert isinstance(outcome.result, TopicView), outcome
    return outcome.result


def published(embedded: Embedded, *events: dict[str, Any], topic: str = "news") -> PublishResult:
    outcome = embedded.submit(D, PUBLISH, publish_body(topic, *events))
    assert isinstance(outcome.result, PublishResult), outcome
    return outcome.result


def page(embedded: Embedded, *args: Any, topic: str = "news") -> TopicPage:
    outcome = embedded.submit(D, READ_TOPIC, read_body(topic, *args))
    assert isinstance(outcome.result, TopicPage), outcome
    return outcome.result


def rejected(embedded: Embedded, kind: str, body: dict[str, Any]) -> tuple[str | None, str]:
    outcome = embedded.submit(D, kind, body)
    assert outcome.status == "rejected", outcome
    return outcome.error_code, outcome.detail


def resource_digest(embedded: Embedded) -> str:
    """SHA-256 over every key/value but the partition metadata and stored outcomes, which every command moves."""
    digest = hashlib.sha256()
    for key, value in embedded.store(D).scan(b"\x01", b"\xff"):
        if key[:1] != keys.OUTCOME:
            digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()


@pytest.fixture
def news(embedded: Embedded) -> Embedded:
    assert embedded.submit(D, CREATE_TOPIC, create_topic_body("news")).status == "committed"
    return embedded


def test_create_topic_takes_documented_defaults_and_shares_the_incarnation_allocator(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    outcome = embedded.submit(D, CREATE_TOPIC, create_topic_body("jobs"))  # its own namespace
    assert isinstance(outcome.result, TopicView)
    view = outcome.result
    assert (view.policy.max_retained_events, view.policy.max_retained_bytes) == (1_000_000, 1024**3)
    assert (view.first_available, view.tail, view.generation) == (1, 0, 1)
    assert (view.retained_events, view.retained_bytes, view.published_total) == (0, 0, 0)
    assert view.created_at_ms == outcome.eval_time_ms and view.domain == D and view.topic == "jobs"
    embedded.submit(D, CREATE_QUEUE, create_queue_body("later"))
    queues = [embedded.submit(D, INSPECT_QUEUE, {"queue": q}).result for q in ("jobs", "later")]
    assert [q.incarnation for q in queues] == [1, 3] and view.incarnation == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "policy", "detail"),
    [
        ("", {}, "topic name"),
        ("has space", {}, "topic name"),
        ("x" * (limits.MAX_TOPIC_NAME_CHARS + 1), {}, "topic name"),
        ("news", {"max_retained_events": 0}, "policy.max_retained_events must be between 1 and 100000000"),
        ("news", {"max_retained_bytes": 1024**4 + 1}, "policy.max_retained_bytes"),
    ],
)
def test_create_topic_validates_name_and_policy(
    embedded: Embedded, name: str, policy: dict[str, Any], detail: str
) -> None:
    code, text = rejected(embedded, CREATE_TOPIC, create_topic_body(name, **policy))
    assert code == "Validation" and detail in text


def test_create_existing_topic_is_a_conflict_like_a_queue(news: Embedded) -> None:
    assert rejected(news, CREATE_TOPIC, create_topic_body("news"))[0] == "Conflict"


def test_positions_are_dense_and_bytes_are_charged_exactly(news: Embedded) -> None:
    first = published(news, event("a", b"12345", "created", k="v"), event("b", b"", "x"))
    assert first.events == [PublishedEvent(event_id="a", position=1), PublishedEvent(event_id="b", position=2)]
    # body 5 + type 7 + header "k"+"v" 2; body 0 + type 1
    assert (first.retained_events, first.retained_bytes) == (2, 14 + 1)
    second_outcome = news.submit(D, PUBLISH, publish_body("news", event("c", b"\xff" * 3, "t", h="é")))
    assert isinstance(second_outcome.result, PublishResult)
    assert second_outcome.result.events == [PublishedEvent(event_id="c", position=3)]
    assert second_outcome.result.retained_bytes == 15 + 3 + 1 + 1 + 2  # "é" is two bytes of UTF-8
    view = topic_view(news)
    assert (view.first_available, view.tail, view.retained_events, view.retained_bytes) == (1, 3, 3, 22)
    assert view.published_total == 3
    events = page(news).events
    assert [(e.position, e.event_id, e.type, e.body, e.headers) for e in events] == [
        (1, "a", "created", b"12345", {"k": "v"}),
        (2, "b", "x", b"", {}),
        (3, "c", "t", b"\xff\xff\xff", {"h": "é"}),
    ]
    assert events[2].published_at_ms == second_outcome.eval_time_ms


def test_same_content_again_is_a_duplicate_naming_the_original_position(news: Embedded) -> None:
    published(news, event("a"), event("b", b"body", "t", y="2", x="1"))
    before = resource_digest(news)
    # The same content with its headers in another order, behind a new event: the whole command is refused.
    code, detail = rejected(news, PUBLISH, publish_body("news", event("new"), event("b", b"body", "t", x="1", y="2")))
    assert (code, detail) == ("DuplicateEventId", "event 1 was already published at position 2")
    assert resource_digest(news) == before
    assert published(news, event("new")).events == [PublishedEvent(event_id="new", position=3)]  # its id was not taken


def test_other_content_under_a_used_id_is_a_conflict_and_wins_over_a_duplicate(news: Embedded) -> None:
    published(news, event("a"), event("b"))
    before = resource_digest(news)
    for changed in (event("b", b"y"), event("b", event_type="other"), event("b", k="v")):
        code, detail = rejected(news, PUBLISH, publish_body("news", event("a"), changed))
        assert code == "Conflict" and detail == "event 1: its id was published at position 2 with other content"
    assert resource_digest(news) == before


def test_duplicate_ids_within_one_command_are_invalid(news: Embedded) -> None:
    code, detail = rejected(news, PUBLISH, publish_body("news", event("a"), event("b"), event("a")))
    assert (code, detail) == ("Validation", "events 0 and 2 have the same event id")
    assert topic_view(news).tail == 0


def test_details_never_echo_client_strings(news: Embedded) -> None:
    secret = "secret-event-id"
    published(news, event(secret, b"secret body", "secret-type"))
    outcomes = [
        news.submit(D, PUBLISH, publish_body("news", event(secret, b"secret body", "secret-type"))),
        news.submit(D, PUBLISH, publish_body("news", event(secret, b"other", "secret-type"))),
        news.submit(D, PUBLISH, publish_body("news", event(secret + " x"))),
        news.submit(D, PUBLISH, publish_body(secret, event("z"))),
    ]
    assert [o.error_code for o in outcomes] == ["DuplicateEventId", "Conflict", "Validation", "NotFound"]
    assert all("secret" not in o.detail for o in outcomes)


@pytest.mark.parametrize(
    ("events", "detail"),
    [
        ([], "a publish carries 1..100 events"),
        ([event(f"e{i}") for i in range(limits.MAX_PUBLISH_EVENTS + 1)], "a publish carries 1..100 events"),
        ([event("ok"), event("")], "event 1: event id must be 1..128"),
        ([event("has space")], "event 0: event id"),
        ([event("a", event_type="")], "event 0: event type must be 1..128"),
        ([event("a", event_type="t" * (limits.MAX_EVENT_TYPE_CHARS + 1))], "event 0: event type"),
        ([event("a"), event("b", b"x", "t", **{"bad name": "v"})], "event 1: header name"),
        ([event("a", h="v" * limits.MAX_HEADERS_BYTES)], "event 0: headers exceed 16384 bytes"),
        ([event("a", b"x" * (limits.MAX_INLINE_BODY_BYTES + 1))], "event 0: body exceeds 262144 bytes"),
        ([event(f"e{i}", b"x" * limits.MAX_INLINE_BODY_BYTES) for i in range(5)], "bodies together exceed 1048576"),
    ],
)
def test_publish_validation_changes_nothing(news: Embedded, events: list[dict[str, Any]], detail: str) -> None:
    before = resource_digest(news)
    code, text = rejected(news, PUBLISH, publish_body("news", *events))
    assert code == "Validation" and detail in text, text
    assert resource_digest(news) == before


def test_caps_refuse_the_whole_publish_and_change_nothing(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_TOPIC, create_topic_body("news", max_retained_events=3, max_retained_bytes=30))
    published(embedded, event("a", b"123456789"), event("b", b"123456789"))  # 10 bytes each with type "t"
    before = resource_digest(embedded)
    code, detail = rejected(embedded, PUBLISH, publish_body("news", event("c", b"1"), event("d", b"1")))
    assert (code, detail) == ("ResourceExhausted", "the topic would exceed max_retained_events")
    code, detail = rejected(embedded, PUBLISH, publish_body("news", event("c", b"1234567890")))
    assert (code, detail) == ("ResourceExhausted", "the topic would exceed max_retained_bytes")
    assert resource_digest(embedded) == before
    assert published(embedded, event("c", b"123456789")).retained_bytes == 30  # exactly at the cap fits


def test_unknown_topic_is_not_found(embedded: Embedded) -> None:
    for kind, body in (
        (PUBLISH, publish_body("nope", event("a"))),
        (READ_TOPIC, read_body("nope")),
        (INSPECT_TOPIC, {"topic": "nope"}),
    ):
        assert rejected(embedded, kind, body)[0] == "NotFound"


def test_reads_page_through_in_position_order(news: Embedded) -> None:
    published(news, *(event(f"e{i}", str(i).encode()) for i in range(7)))
    first = page(news, 1, 3)
    assert [e.position for e in first.events] == [1, 2, 3] and first.next_position == 4
    assert (first.first_available, first.tail, first.budget_exhausted) == (1, 7, False)
    rest = page(news, first.next_position, 10)
    assert [e.event_id for e in rest.events] == ["e3", "e4", "e5", "e6"] and rest.next_position == 8
    caught_up = page(news, 8)
    assert caught_up.events == [] and caught_up.next_position == 8 and not caught_up.budget_exhausted


def test_read_default_and_bounds(news: Embedded) -> None:
    for _ in range(2):
        start = topic_view(news).tail
        published(news, *(event(f"e{start + i}") for i in range(limits.MAX_PUBLISH_EVENTS)))
    assert len(page(news).events) == limits.DEFAULT_READ_EVENTS
    for body, detail in (
        (read_body("news", 1, 0), "max_events must be between 1 and 1000"),
        (read_body("news", 1, limits.MAX_READ_EVENTS + 1), "max_events must be between 1 and 1000"),
        (read_body("news", 1, None, 0), "max_bytes must be between 1 and 2097152"),
        (read_body("news", -1), "from_position must not be negative"),
        (read_body("news", 202), "from_position is past the tail + 1 (201)"),
    ):
        assert rejected(news, READ_TOPIC, body) == ("Validation", detail)


def test_history_before_first_available_is_unavailable(news: Embedded) -> None:
    """Positions start at 1, so position 0 is before first_available even before any purge exists."""
    published(news, event("a"))
    assert rejected(news, READ_TOPIC, read_body("news", 0)) == (
        "HistoryUnavailable",
        "position 0 is before first_available 1",
    )


def test_byte_ceiling_always_returns_the_first_event(news: Embedded) -> None:
    published(news, *(event(f"e{i}", b"123456789") for i in range(4)))  # 10 charged bytes each
    assert [e.position for e in page(news, 1, None, 25).events] == [1, 2]
    assert [e.position for e in page(news, 1, None, 30).events] == [1, 2, 3]
    one = page(news, 2, None, 1)
    assert [e.position for e in one.events] == [2] and one.next_position == 3 and not one.budget_exhausted


def test_a_read_examines_a_bounded_number_of_rows(news: Embedded) -> None:
    total = limits.READ_EXAMINATION_BUDGET + 44
    while topic_view(news).tail < total:
        start = topic_view(news).tail
        published(news, *(event(f"e{p}") for p in range(start, min(start + limits.MAX_PUBLISH_EVENTS, total))))
    first = page(news, 1, limits.MAX_READ_EVENTS)
    assert len(first.events) == limits.READ_EXAMINATION_BUDGET and first.budget_exhausted
    assert first.next_position == limits.READ_EXAMINATION_BUDGET + 1
    rest = page(news, first.next_position, limits.MAX_READ_EVENTS)
    assert len(rest.events) == 44 and not rest.budget_exhausted and rest.next_position == total + 1
    exact = page(news, 1, limits.READ_EXAMINATION_BUDGET)
    assert not exact.budget_exhausted  # stopped at max_events, not at the budget


def test_publish_fingerprint_ignores_header_order_inside_events(news: Embedded) -> None:
    forward = publish_body("news", event("a", b"1", "t", x="1", y="2"))
    backward = publish_body("news", event("a", b"1", "t", y="2", x="1"))
    values = [command(D, PUBLISH, body, "c-1") for body in (forward, backward)]
    assert values[0] != values[1]
    prints = [fingerprint(REGISTRY.decode("keyload.Command", v), v) for v in values]
    assert prints[0] == prints[1]
    first = news.submit(D, PUBLISH, forward, command_id="c-1")
    assert news.submit(D, PUBLISH, backward, command_id="c-1") == first  # a retry, not a conflict


def test_commands_of_one_group_see_each_others_events(news: Embedded) -> None:
    """Group commit stages many commands before one write: dedup and reads must see the staged events."""
    bodies = [
        publish_body("news", event("a", b"1")),
        publish_body("news", event("a", b"1")),
        read_body("news"),
        publish_body("news", event("a", b"2")),
    ]
    kinds = [PUBLISH, PUBLISH, READ_TOPIC, PUBLISH]
    for index, (kind, body) in enumerate(zip(kinds, bodies, strict=True)):
        news.append(D, command(D, kind, body, f"group-{index}", reply_to=0))
    news.run()
    outcomes = {
        o["command_id"]: o for o in (REGISTRY.decode("keyload.Outcome", r.value) for r in news.outcomes.read(0, 0, 100))
    }
    assert outcomes["group-0"]["status"] == "committed"
    assert (outcomes["group-1"]["error_code"], outcomes["group-1"]["detail"]) == (
        "DuplicateEventId",
        "event 0 was already published at position 1",
    )
    assert [e["event_id"] for e in outcomes["group-2"]["result"][1]["events"]] == ["a"]
    assert outcomes["group-3"]["error_code"] == "Conflict"


def test_replay_from_offset_zero_reproduces_the_projection(news: Embedded, tmp_path: Path) -> None:
    published(news, event("a", b"1", "t", k="v"), event("b", b"22"))
    rejected(news, PUBLISH, publish_body("news", event("a", b"1", "t", k="v")))
    rejected(news, PUBLISH, publish_body("news", event("b", b"changed")))
    page(news, 1, 1)
    news.now_ms += 1_000
    published(news, event("c"))
    replayed = replay(news.data, news.partition(D), tmp_path / "replay", progress=False)
    assert replayed.digest == news.digest(D)


@pytest.mark.slow
def test_topics_through_the_sdk_and_cli_against_a_running_service(tmp_path: Path) -> None:
    from keyload import Client
    from keyload.errors import ConflictError, DuplicateEventIdError
    from keyload.sdk.results import Event, TopicPolicySpec

    data = str(tmp_path / "data")
    service = start_service(tmp_path / "data", "--partitions", "2")
    client = Client(data)
    try:
        view = client.create_topic("shop", "orders", TopicPolicySpec(max_retained_events=10))
        assert view.policy.max_retained_events == 10 and view.tail == 0
        result = client.publish(
            "shop", "orders", [Event("o-1", "created", b"one", {"k": "v"}), Event("o-2", "created", b"two")]
        )
        assert [e.position for e in result.events] == [1, 2]
        with pytest.raises(DuplicateEventIdError) as duplicate:
            client.publish("shop", "orders", [Event("o-2", "created", b"two")])
        assert "position 2" in duplicate.value.outcome.detail
        with pytest.raises(ConflictError):
            client.publish("shop", "orders", [Event("o-2", "created", b"changed")])

        topic = ("--data", data, "--domain", "shop")
        created = run_keyload("topic", "create", *topic, "audit", "--max-retained-bytes", "1000")
        assert created.returncode == 0 and json.loads(created.stdout)["policy"]["max_retained_bytes"] == 1000
        publish = ("publish", *topic, "--topic", "orders", "--type", "shipped")
        done = run_keyload(*publish, "--event-id", "o-3", "--body", "three", "--header", "carrier=ups")
        assert done.returncode == 0 and json.loads(done.stdout)["events"] == [{"event_id": "o-3", "position": 3}]
        again = run_keyload(*publish, "--event-id", "o-3", "--body", "three", "--header", "carrier=ups")
        assert (
            again.returncode == 1
            and "rejected: DuplicateEventId: event 'o-3' was already published at position 3" in (again.stderr)
        )
        read = json.loads(run_keyload("read", *topic, "--topic", "orders", "--from", "2", "--max-events", "5").stdout)
        assert [(e["position"], e["body"]) for e in read["events"]] == [(2, "two"), (3, "three")]
        assert read["events"][1]["headers"] == {"carrier": "ups"} and read["next_position"] == 4
        unavailable = run_keyload("read", *topic, "--topic", "orders", "--from", "0")
        assert unavailable.returncode == 1 and "rejected: HistoryUnavailable" in unavailable.stderr
        inspected = json.loads(run_keyload("topic", "inspect", *topic, "orders").stdout)
        assert (inspected["tail"], inspected["retained_events"], inspected["published_total"]) == (3, 3, 3)
        page = client.read_topic("shop", "orders", max_events=2)
        assert [e.event_id for e in page.events] == ["o-1", "o-2"] and page.next_position == 3
        assert client.inspect_topic("shop", "orders").retained_bytes == (3 + 7 + 2) + (3 + 7) + (5 + 7 + 10)
    finally:
        client.close()
        assert stop_service(service) == 0


# -- model: random publishes (some repeated, some conflicting) and reads against a reference topic ------------------

TYPES = ("a", "bb")
BODIES = (b"", b"x", b"hello", b"\x00" * 30)
HEADERS: tuple[dict[str, str], ...] = ({}, {"k": "v"}, {"a": "1", "b": "22"})
MODEL_MAX_EVENTS = 12
MODEL_MAX_BYTES = 200

Content = tuple[str, bytes, int]  # type, body, index into HEADERS


def _charge(content: Content) -> int:
    event_type, body, headers = content
    return len(body) + len(event_type) + sum(len(k) + len(v) for k, v in HEADERS[headers].items())


class TopicMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-topic-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        policy = create_topic_body("news", max_retained_events=MODEL_MAX_EVENTS, max_retained_bytes=MODEL_MAX_BYTES)
        assert self.embedded.submit(D, CREATE_TOPIC, policy).status == "committed"
        self.log: list[tuple[str, Content]] = []  # position - 1 -> (event id, content)
        self.positions: dict[str, int] = {}

    @rule(
        batch=st.lists(
            st.tuples(
                st.integers(0, 30), st.sampled_from(TYPES), st.sampled_from(BODIES), st.integers(0, len(HEADERS) - 1)
            ),
            min_size=1,
            max_size=4,
        )
    )
    def publish(self, batch: list[tuple[int, str, bytes, int]]) -> None:
        self.check_publish([(f"e{n}", (event_type, body, headers)) for n, event_type, body, headers in batch])

    @precondition(lambda self: len(self.log) > 0)
    @rule(picks=st.lists(st.integers(0, 1_000), min_size=1, max_size=3, unique=True), fresh=st.booleans())
    def republish(self, picks: list[int], fresh: bool) -> None:
        """Publish events again exactly as they were, maybe behind a new one."""
        again = [self.log[index] for index in sorted({pick % len(self.log) for pick in picks})]
        self.check_publish([("fresh", ("a", b"", 0))] * fresh + again)

    def check_publish(self, events: list[tuple[str, Content]]) -> None:
        outcome = self.embedded.submit(
            D, PUBLISH, publish_body("news", *(event(i, c[1], c[0], **HEADERS[c[2]]) for i, c in events))
        )
        ids = [event_id for event_id, _ in events]
        used = [(index, self.positions[i]) for index, i in enumerate(ids) if i in self.positions]
        if len(set(ids)) != len(ids):
            assert outcome.error_code == "Validation", outcome
        elif any(self.log[self.positions[i] - 1][1] != c for i, c in events if i in self.positions):
            assert outcome.error_code == "Conflict", outcome
        elif used:
            assert outcome.error_code == "DuplicateEventId", outcome
            assert outcome.detail == f"event {used[0][0]} was already published at position {used[0][1]}"
        elif (
            len(self.log) + len(events) > MODEL_MAX_EVENTS
            or sum(_charge(c) for _, c in self.log + events) > MODEL_MAX_BYTES
        ):
            assert outcome.error_code == "ResourceExhausted", outcome
        else:
            assert isinstance(outcome.result, PublishResult), outcome
            expected = [PublishedEvent(event_id=i, position=len(self.log) + n + 1) for n, i in enumerate(ids)]
            assert outcome.result.events == expected
            for (event_id, content), position in zip(events, expected, strict=True):
                self.log.append((event_id, content))
                self.positions[event_id] = position.position

    @rule(pick=st.integers(0, 1_000), max_events=st.integers(1, 5), max_bytes=st.integers(1, 60))
    def read(self, pick: int, max_events: int, max_bytes: int) -> None:
        start = pick % (len(self.log) + 3)  # 0 (before first_available) .. tail + 2 (past the end)
        outcome = self.embedded.submit(D, READ_TOPIC, read_body("news", start, max_events, max_bytes))
        if start == 0:
            assert outcome.error_code == "HistoryUnavailable", outcome
            return
        if start > len(self.log) + 1:
            assert outcome.error_code == "Validation", outcome
            return
        expected: list[tuple[int, str, Content]] = []
        size = 0
        for position in range(start, min(start + max_events, len(self.log) + 1)):
            event_id, content = self.log[position - 1]
            if expected and size + _charge(content) > max_bytes:
                break
            size += _charge(content)
            expected.append((position, event_id, content))
        assert isinstance(outcome.result, TopicPage), outcome
        result = outcome.result
        got = [(e.position, e.event_id, (e.type, e.body, HEADERS.index(e.headers))) for e in result.events]
        assert got == expected
        assert result.next_position == start + len(expected) and result.tail == len(self.log)
        assert not result.budget_exhausted and result.first_available == 1

    @rule(ms=st.integers(0, 1_000))
    def advance(self, ms: int) -> None:
        self.embedded.now_ms += ms

    @invariant()
    def topic_matches_the_model(self) -> None:
        raw = self.embedded.store(D).get(keys.topic(D, "news"))
        assert raw is not None
        view = REGISTRY.decode("keyload.TopicRecord", raw)["view"]
        assert (view["first_available"], view["tail"], view["generation"]) == (1, len(self.log), 1)
        assert view["retained_events"] == view["published_total"] == len(self.log)
        assert view["retained_bytes"] == sum(_charge(c) for _, c in self.log)

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


TopicMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_topic_model = TopicMachine.TestCase
