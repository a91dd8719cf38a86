"""Subscription groups and PurgeTopic through the real processor, file log and RocksDB (DESIGN.md §6)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload import limits
from keyload.errors import DispatchPausedError, ResourceExhaustedError
from keyload.operations.recovery import replay
from keyload.processors.features import PURGES_NAME_LOWEST, TOKEN_CHECKPOINTS
from keyload.sdk.client import Client
from keyload.sdk.results import (
    Event,
    GroupAckBatchResult,
    GroupLeaseResult,
    GroupPolicySpec,
    GroupReceiveResult,
    GroupView,
    ReceiveResult,
    TopicPage,
    TopicView,
)

from .support import (
    CONFIGURE_GROUP,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    GROUP_ACK,
    GROUP_ACK_BATCH,
    GROUP_NACK,
    GROUP_RECEIVE,
    GROUP_RENEW,
    GROUP_STATUS,
    INSPECT_TOPIC,
    PAUSE_GROUP,
    PUBLISH,
    PURGE_TOPIC,
    RAISE_FEATURE_LEVEL,
    READ_TOPIC,
    RESUME_GROUP,
    SEEK_GROUP,
    TICK,
    Embedded,
    create_group_body,
    create_queue_body,
    create_topic_body,
    enqueue_body,
    event,
    group_receive_body,
    publish_body,
    read_body,
    run_keyload,
    start_service,
    stop_service,
)
from .test_topics import resource_digest

D = "acme"
T = "news"


def ok(embedded: Embedded, kind: str, body: dict[str, Any]) -> Any:
    outcome = embedded.submit(D, kind, body)
    assert outcome.status == "committed", outcome
    return outcome.result


def refused(embedded: Embedded, kind: str, body: dict[str, Any]) -> str | None:
    outcome = embedded.submit(D, kind, body)
    assert outcome.status == "rejected", outcome
    return outcome.error_code


def publish(embedded: Embedded, count: int, event_type: str = "t", **headers: str) -> list[int]:
    start = status_topic(embedded).tail + 1
    events = [event(f"e-{start + i}", b"body", event_type, **headers) for i in range(count)]
    result = ok(embedded, PUBLISH, publish_body(T, *events))
    return [e.position for e in result.events]


def status_topic(embedded: Embedded) -> TopicView:
    result = ok(embedded, INSPECT_TOPIC, {"topic": T})
    assert isinstance(result, TopicView)
    return result


def create(embedded: Embedded, group: str = "g", **fields: Any) -> GroupView:
    result = ok(embedded, CREATE_GROUP, create_group_body(T, group, **fields))
    assert isinstance(result, GroupView)
    return result


def status(embedded: Embedded, group: str = "g") -> GroupView:
    result = ok(embedded, GROUP_STATUS, {"topic": T, "group": group})
    assert isinstance(result, GroupView)
    return result


def receive(embedded: Embedded, group: str = "g", **limits_: Any) -> GroupReceiveResult:
    result = ok(embedded, GROUP_RECEIVE, group_receive_body(T, group, **limits_))
    assert isinstance(result, GroupReceiveResult)
    return result


def settle(embedded: Embedded, kind: str, token: str, group: str = "g", **fields: Any) -> GroupLeaseResult:
    result = ok(embedded, kind, {"topic": T, "group": group, "token": token, **fields})
    assert isinstance(result, GroupLeaseResult)
    return result


def token_refusal(embedded: Embedded, kind: str, token: str, group: str = "g", **fields: Any) -> str | None:
    return refused(embedded, kind, {"topic": T, "group": group, "token": token, **fields})


def seek(embedded: Embedded, to: str, position: int | None = None, group: str = "g", **fields: Any) -> GroupView:
    body = {"topic": T, "group": group, "to": to, "position": position, "expected_generation": None, **fields}
    result = ok(embedded, SEEK_GROUP, body)
    assert isinstance(result, GroupView)
    return result


def named(kind: str, group: str = "g") -> tuple[str, dict[str, Any]]:
    return kind, {"topic": T, "group": group}


def purge(embedded: Embedded, through: int, generation: int | None = None) -> Any:
    generation = status_topic(embedded).generation if generation is None else generation
    return embedded.submit(D, PURGE_TOPIC, {"topic": T, "through": through, "expected_generation": generation})


def tick(embedded: Embedded, to_ms: int) -> None:
    embedded.now_ms = to_ms
    ok(embedded, TICK, {})


@pytest.fixture
def news(embedded: Embedded) -> Embedded:
    ok(embedded, CREATE_TOPIC, create_topic_body(T))
    return embedded


def test_create_takes_defaults_and_its_start(news: Embedded) -> None:
    publish(news, 3)
    view = create(news)
    assert (view.checkpoint, view.issued, view.outstanding, view.generation, view.paused) == (0, 0, 0, 1, False)
    assert (view.lag, view.tail, view.parked, view.parked_count, view.gaps) == (3, 3, [], 0, 0)
    assert (view.policy.max_window, view.policy.lease_ms, view.policy.max_attempts) == (1_000, 30_000, 5)
    assert create(news, "late", start="end").checkpoint == 3
    assert create(news, "mid", start="position", position=2).checkpoint == 1
    assert refused(news, CREATE_GROUP, create_group_body(T, "g")) == "Conflict"
    assert refused(news, CREATE_GROUP, create_group_body(T, "x", start="position", position=5)) == "Validation"
    assert refused(news, CREATE_GROUP, create_group_body("none", "x")) == "NotFound"
    assert refused(news, CREATE_GROUP, create_group_body(T, "x", max_window=0)) == "Validation"
    assert refused(news, CREATE_GROUP, create_group_body(T, "x", event_types=["a", "a"])) == "Validation"


def test_gap_holds_the_checkpoint_until_the_lowest_position_is_acked(news: Embedded) -> None:
    publish(news, 5)
    create(news)
    deliveries = receive(news).deliveries
    assert [d.position for d in deliveries] == [1, 2, 3, 4, 5]
    for delivery in deliveries[1:]:
        assert settle(news, GROUP_ACK, delivery.token).checkpoint == 0
    view = status(news)
    assert (view.checkpoint, view.issued, view.outstanding, view.gaps, view.lag) == (0, 5, 1, 4, 5)
    assert settle(news, GROUP_ACK, deliveries[0].token).checkpoint == 5
    view = status(news)
    assert (view.checkpoint, view.outstanding, view.gaps, view.lag, view.acked_total) == (5, 0, 0, 0, 5)


def test_a_full_window_stops_claims_until_an_ack_frees_a_slot(news: Embedded) -> None:
    publish(news, 5)
    create(news, max_window=2)
    first = receive(news)
    assert ([d.position for d in first.deliveries], first.window_full) == ([1, 2], True)
    assert (receive(news).deliveries, receive(news).window_full) == ([], True)
    settle(news, GROUP_ACK, first.deliveries[1].token)  # any outstanding position frees a slot
    again = receive(news)
    assert ([d.position for d in again.deliveries], again.window_full) == ([3], True)
    assert status(news).checkpoint == 0


def test_filters_resolve_non_matching_positions(news: Embedded) -> None:
    publish(news, 1, "a")
    publish(news, 1, "b")
    publish(news, 1, "a", region="eu")
    publish(news, 1, "b")
    create(news, event_types=["a"], headers={"region": "eu"})
    got = receive(news)
    assert [d.position for d in got.deliveries] == [3]
    view = status(news)
    assert (view.checkpoint, view.issued, view.filtered_total, view.gaps) == (2, 4, 3, 1)
    settle(news, GROUP_ACK, got.deliveries[0].token)
    assert status(news).checkpoint == 4


def test_receive_stops_at_max_events_bytes_and_the_examination_budget(news: Embedded) -> None:
    for _ in range(3):
        publish(news, 100, "skip")
    publish(news, 2)
    create(news, event_types=["t"])
    first = receive(news)
    assert (first.deliveries, first.budget_exhausted) == ([], True)
    assert status(news).checkpoint == limits.GROUP_RECEIVE_EXAMINATION_BUDGET
    assert [d.position for d in receive(news, max_events=1).deliveries] == [301]
    assert [d.position for d in receive(news, max_bytes=1).deliveries] == [302]  # the first always goes


def test_lease_expiry_redelivers_first_and_an_old_token_is_stale(news: Embedded) -> None:
    publish(news, 3)
    create(news, retry_base_ms=0, lease_ms=1_000)
    first = receive(news, max_events=1).deliveries[0]
    tick(news, first.lease_until_ms)  # the lease runs out: retried after 0 ms
    tick(news, news.now_ms + 1)  # the retry comes due
    again = receive(news).deliveries
    assert [(d.position, d.attempts) for d in again] == [(1, 2), (2, 1), (3, 1)]
    assert token_refusal(news, GROUP_ACK, first.token) == "StaleLease"
    renewed = settle(news, GROUP_RENEW, again[0].token, lease_ms=5_000)
    assert (renewed.state, renewed.lease_until_ms) == ("leased", news.now_ms + 5_000)
    assert settle(news, GROUP_ACK, again[0].token).checkpoint == 1  # 2 and 3 still outstanding


def test_nack_retries_with_backoff_then_parks_and_the_checkpoint_moves_on(news: Embedded) -> None:
    publish(news, 2)
    create(news, max_attempts=2, retry_base_ms=1_000)
    first = receive(news, max_events=1).deliveries[0]
    nacked = settle(news, GROUP_NACK, first.token)
    assert (nacked.state, nacked.retry_delay_ms, nacked.not_before_ms) == ("retrying", 1_000, news.now_ms + 1_000)
    [other] = receive(news).deliveries  # position 1 waits for its retry
    assert other.position == 2
    tick(news, news.now_ms + 1_000)
    second = receive(news).deliveries
    assert [(d.position, d.attempts) for d in second] == [(1, 2)]
    parked = settle(news, GROUP_NACK, second[0].token)
    assert (parked.state, parked.checkpoint) == ("parked", 1)
    view = status(news)
    assert (view.parked, view.parked_count, view.parked_total, view.outstanding) == ([1], 1, 1, 1)
    assert token_refusal(news, GROUP_NACK, second[0].token) == "StaleLease"
    assert token_refusal(news, GROUP_NACK, other.token, delay_ms=-1) == "Validation"
    assert token_refusal(news, GROUP_RENEW, other.token, lease_ms=13 * 3600 * 1000) == "Validation"


def test_ack_batch_reports_each_token(news: Embedded) -> None:
    publish(news, 3)
    create(news)
    tokens = [d.token for d in receive(news).deliveries]
    result = ok(news, GROUP_ACK_BATCH, {"topic": T, "group": "g", "tokens": [tokens[0], tokens[0], tokens[2]]})
    assert isinstance(result, GroupAckBatchResult)
    assert [(r.status, r.error_code, r.position) for r in result.results] == [
        ("committed", None, 1),
        ("rejected", "StaleLease", None),
        ("committed", None, 3),
    ]
    assert result.checkpoint == 1
    assert [r.checkpoint for r in result.results] == [None, None, None]  # below feature level 10
    assert refused(news, GROUP_ACK_BATCH, {"topic": T, "group": "g", "tokens": []}) == "Validation"


def test_ack_batch_names_each_acked_tokens_checkpoint_from_level_10(news: Embedded) -> None:
    """From feature level 10 each acked token's result holds the checkpoint right after its ack, what
    a lone GroupAck answers; the batch's own is the one after its last token."""
    ok(news, RAISE_FEATURE_LEVEL, {"level": TOKEN_CHECKPOINTS})
    publish(news, 4)
    create(news)
    tokens = [d.token for d in receive(news).deliveries]
    chosen = [tokens[2], tokens[0], tokens[0], tokens[1], tokens[3]]
    result = ok(news, GROUP_ACK_BATCH, {"topic": T, "group": "g", "tokens": chosen})
    assert [(r.status, r.position, r.checkpoint) for r in result.results] == [
        ("committed", 3, 0),
        ("committed", 1, 1),
        ("rejected", None, None),
        ("committed", 2, 3),
        ("committed", 4, 4),
    ]
    assert result.checkpoint == 4


@settings(max_examples=20, deadline=None)
@given(picks=st.lists(st.integers(0, 7), min_size=1, max_size=10), expire_first=st.booleans())
def test_ack_batch_leaves_what_single_acks_leave(picks: list[int], expire_first: bool) -> None:
    """A GroupAckBatch reads and saves its group once: the group, its position rows, timers, due
    entries and checkpoint it leaves are those a run of single GroupAcks of the same tokens, in
    order, leaves (duplicates, an expired lease's token and garbage among them), and each token's
    result (feature level 10) is what its single GroupAck answers: its position and checkpoint, or
    its refusal's code."""
    with tempfile.TemporaryDirectory() as scratch:
        first, second = Path(scratch) / "batch", Path(scratch) / "single"
        embedded = Embedded(first)
        ok(embedded, RAISE_FEATURE_LEVEL, {"level": TOKEN_CHECKPOINTS})
        ok(embedded, CREATE_TOPIC, create_topic_body(T))
        publish(embedded, 6)
        create(embedded, lease_ms=1_000)
        texts = [d.token for d in receive(embedded, max_events=2).deliveries]
        if expire_first:
            tick(embedded, embedded.now_ms + 1_000)  # both leases run out: their tokens are stale
        embedded.now_ms += 10
        texts += [d.token for d in receive(embedded).deliveries] + ["garbage"]
        now_ms = embedded.now_ms
        embedded.close()
        shutil.copytree(first, second)
        chosen = [texts[pick % len(texts)] for pick in picks]

        batched, singly = Embedded(first), Embedded(second)
        try:
            batched.now_ms = singly.now_ms = now_ms + 10
            result = ok(batched, GROUP_ACK_BATCH, {"topic": T, "group": "g", "tokens": chosen})
            for text, token_result in zip(chosen, result.results, strict=True):
                alone = singly.submit(D, GROUP_ACK, {"topic": T, "group": "g", "token": text})
                if token_result.status == "committed":
                    assert alone.error_code is None
                    assert (token_result.position, token_result.checkpoint) == (
                        alone.result.position,
                        alone.result.checkpoint,
                    )
                else:
                    assert (token_result.error_code, token_result.checkpoint) == (alone.error_code, None)
            assert result.checkpoint == status(singly).checkpoint
            assert batched.settled_rows(D) == singly.settled_rows(D)
        finally:
            batched.close()
            singly.close()


def test_seek_invalidates_tokens_and_waits_for_resume(news: Embedded) -> None:
    publish(news, 4)
    create(news)
    old = receive(news, max_events=2).deliveries
    view = seek(news, "position", 3)
    assert (view.checkpoint, view.issued, view.outstanding, view.generation, view.paused) == (2, 2, 0, 2, True)
    assert token_refusal(news, GROUP_ACK, old[0].token) == "TokenInvalidated"
    assert refused(news, GROUP_RECEIVE, group_receive_body(T, "g")) == "DispatchPaused"
    stale = {"topic": T, "group": "g", "to": "end", "position": None, "expected_generation": 1}
    assert refused(news, SEEK_GROUP, stale) == "RevisionConflict"
    ok(news, RESUME_GROUP, {"topic": T, "group": "g"})
    assert [d.position for d in receive(news).deliveries] == [3, 4]
    assert seek(news, "beginning").checkpoint == 0
    assert refused(news, SEEK_GROUP, {**stale, "to": "position", "position": 6, "expected_generation": None}) == (
        "Validation"
    )


def test_configure_only_while_paused_and_the_new_filter_applies_from_the_checkpoint(news: Embedded) -> None:
    publish(news, 1, "a")
    publish(news, 1, "b")
    publish(news, 1, "a")
    create(news, event_types=["a"])
    got = receive(news).deliveries
    assert [d.position for d in got] == [1, 3]
    settle(news, GROUP_ACK, got[0].token)
    assert status(news).checkpoint == 2
    change = {"topic": T, "group": "g", "expected_generation": 1, "filter": {"event_types": ["b"], "headers": {}}}
    change["policy"] = None
    assert refused(news, CONFIGURE_GROUP, change) == "Conflict"  # active
    ok(news, PAUSE_GROUP, {"topic": T, "group": "g"})
    assert ok(news, PAUSE_GROUP, {"topic": T, "group": "g"}).paused  # idempotent
    assert refused(news, CONFIGURE_GROUP, {**change, "expected_generation": 7}) == "RevisionConflict"
    view = ok(news, CONFIGURE_GROUP, change)
    assert (view.event_types, view.generation, view.checkpoint, view.issued, view.paused) == (["b"], 2, 2, 2, True)
    assert token_refusal(news, GROUP_ACK, got[1].token) == "TokenInvalidated"
    assert refused(news, GROUP_RECEIVE, group_receive_body(T, "g")) == "DispatchPaused"
    ok(news, RESUME_GROUP, {"topic": T, "group": "g"})
    assert receive(news).deliveries == []  # position 3 is an "a": filtered under the new definition
    assert status(news).checkpoint == 3
    publish(news, 1, "b")
    assert [d.position for d in receive(news).deliveries] == [4]


def test_purge_is_pinned_by_the_slowest_group_paused_ones_included(news: Embedded) -> None:
    publish(news, 6)
    create(news, "fast")
    create(news, "slow")
    for delivery in receive(news, "fast").deliveries:
        settle(news, GROUP_ACK, delivery.token, "fast")
    slow = receive(news, "slow", max_events=3).deliveries
    for delivery in slow:
        settle(news, GROUP_ACK, delivery.token, "slow")
    ok(news, PAUSE_GROUP, {"topic": T, "group": "slow"})
    before = resource_digest(news)
    refusal = purge(news, 4)
    assert (refusal.status, refusal.error_code) == ("rejected", "ResourceExhausted")
    assert "position 4" in refusal.detail
    assert purge(news, 7).error_code == "ResourceExhausted"  # past the tail
    assert purge(news, 3, generation=2).error_code == "RevisionConflict"
    assert resource_digest(news) == before
    purged = purge(news, 3)
    assert isinstance(purged.result, TopicView)
    view = purged.result
    assert (view.first_available, view.tail, view.generation, view.retained_events) == (4, 6, 2, 3)
    assert view.retained_bytes == 3 * (len(b"body") + len("t"))
    assert refused(news, READ_TOPIC, read_body(T, 3)) == "HistoryUnavailable"
    page = ok(news, READ_TOPIC, read_body(T, 4))
    assert isinstance(page, TopicPage) and [e.position for e in page.events] == [4, 5, 6]
    assert refused(news, PUBLISH, publish_body(T, event("e-1", b"body"))) == "DuplicateEventId"
    assert refused(news, PUBLISH, publish_body(T, event("e-1", b"other"))) == "Conflict"
    assert refused(news, SEEK_GROUP, {**named(SEEK_GROUP, "slow")[1], "to": "position", "position": 2}) == (
        "HistoryUnavailable"
    )
    assert seek(news, "beginning", group="slow").checkpoint == 3


def test_a_refused_purge_names_the_lowest_group_limit_from_level_14(news: Embedded) -> None:
    """The purge limit is the lowest over the topic's groups (§6d). Below feature level 14 a refusal
    named the first group (in name order) whose limit the purge passed; a log replays so."""
    publish(news, 3)
    create(news, "aaa")
    create(news, "zzz")  # completes nothing: its limit is 0
    for delivery in receive(news, "aaa", max_events=2).deliveries:
        settle(news, GROUP_ACK, delivery.token, "aaa")
    ok(news, RAISE_FEATURE_LEVEL, {"level": PURGES_NAME_LOWEST - 1})
    assert purge(news, 3).detail == "a group has not completed position 3"
    ok(news, RAISE_FEATURE_LEVEL, {"level": PURGES_NAME_LOWEST})
    assert purge(news, 3).detail == "a group has not completed position 1"
    assert purge(news, 1).detail == "a group has not completed position 1"


def test_parked_positions_pin_purge_until_a_seek_releases_them(news: Embedded) -> None:
    publish(news, 3)
    create(news, max_attempts=1)
    got = receive(news).deliveries
    settle(news, GROUP_NACK, got[0].token)  # parked
    for delivery in got[1:]:
        settle(news, GROUP_ACK, delivery.token)
    assert (status(news).checkpoint, status(news).parked) == (3, [1])
    assert purge(news, 1).error_code == "ResourceExhausted"
    seek(news, "end")
    purged = purge(news, 2)
    assert purged.status == "committed", purged
    view = status(news)
    assert (view.parked, view.parked_count, view.parked_total) == ([], 0, 1)


def test_queue_and_group_tokens_are_not_interchangeable(news: Embedded) -> None:
    ok(news, CREATE_QUEUE, create_queue_body("jobs"))
    ok(news, ENQUEUE, enqueue_body("jobs", "m1"))
    limits_ = {"max_messages": None, "max_bytes": None, "lease_ms": None, "wait_ms": None}
    queue_token = ok(news, "keyload.command.Receive", {"queue": "jobs", **limits_})
    assert isinstance(queue_token, ReceiveResult)
    publish(news, 1)
    create(news)
    group_token = receive(news).deliveries[0].token
    assert token_refusal(news, GROUP_ACK, queue_token.deliveries[0].token) == "TokenInvalidated"
    assert refused(news, "keyload.command.Ack", {"token": group_token}) == "TokenInvalidated"
    create(news, "other")
    assert token_refusal(news, GROUP_ACK, group_token, "other") == "TokenInvalidated"
    assert settle(news, GROUP_ACK, group_token).state == "acked"


def test_replay_from_offset_zero_equals_the_live_projection(news: Embedded, tmp_path: Path) -> None:
    publish(news, 5)
    create(news, "a", retry_jitter="full", lease_ms=500)
    create(news, "b", event_types=["t"])
    got = receive(news, "a").deliveries
    settle(news, GROUP_NACK, got[0].token, "a")
    settle(news, GROUP_ACK, got[2].token, "a")
    tick(news, news.now_ms + 10_000)
    receive(news, "a")
    receive(news, "b")
    seek(news, "position", 2, "b")
    assert purge(news, 1).error_code == "ResourceExhausted"
    partition = news.partition(D)
    replayed = replay(news.data, partition, tmp_path / "replay", progress=False)
    assert replayed.digest == news.digest_of(partition)


@pytest.mark.slow
def test_sdk_and_cli_against_a_running_service(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = start_service(data, "--partitions", "2")

    def cli(*args: str) -> Any:
        result = run_keyload(*args[:2], "--data", str(data), "--domain", D, *args[2:])
        assert result.returncode == 0, result
        return json.loads(result.stdout)

    try:
        with Client(data) as client:
            client.create_topic(D, T)
            client.publish(D, T, [Event(f"e-{i}", "a" if i % 2 else "b", b"x") for i in range(1, 5)])
            view = client.create_group(D, T, "g", event_types=["a"], policy=GroupPolicySpec(max_window=5))
            assert (view.event_types, view.policy.max_window, view.lag) == (["a"], 5, 4)
            got = client.group_receive(D, T, "g")
            assert [d.position for d in got.deliveries] == [1, 3]
            assert client.group_renew(D, T, "g", got.deliveries[0].token, lease_ms=60_000).state == "leased"
            assert client.group_ack_batch(D, T, "g", [d.token for d in got.deliveries]).checkpoint == 4
            with pytest.raises(ResourceExhaustedError):
                client.purge_topic(D, T, 5, expected_generation=1)  # past the tail
            client.pause_group(D, T, "g")
            view = client.configure_group(D, T, "g", expected_generation=1, event_types=["b"])
            assert (view.event_types, view.generation, view.checkpoint) == (["b"], 2, 4)
            with pytest.raises(DispatchPausedError):
                client.group_receive(D, T, "g")
            client.resume_group(D, T, "g")
        cli("group", "create", "--topic", T, "h", "--start", "end", "--max-window", "2")
        status = cli("group", "status", "--topic", T, "h")
        assert (status["checkpoint"], status["policy"]["max_window"]) == (4, 2)
        cli("group", "seek", "--topic", T, "h", "--to", "3")
        cli("group", "resume", "--topic", T, "h")
        received = cli("group", "receive", "--topic", T, "h")
        assert [d["position"] for d in received["deliveries"]] == [3, 4]
        tokens = [d["token"] for d in received["deliveries"]]
        assert cli("group", "nack", "--topic", T, "h", tokens[0], "--delay-ms", "0")["state"] == "retrying"
        assert cli("group", "ack", "--topic", T, "h", tokens[1])["checkpoint"] == 2
        purged = cli("topic", "purge", T, "--through", "2", "--expected-generation", "1")
        assert (purged["first_available"], purged["generation"]) == (3, 2)
    finally:
        assert stop_service(service) == 0
