"""Per-domain caps (processors/usage.py, processors/domains.py), from feature level 5.

What a user notices: a domain holds at most its caps of queues, topics, subscription groups, live
documents and document bytes; a create or document write past one is ResourceExhausted and changes
nothing, a delete gives its room back at once, and InspectDomain shows the caps and what the domain
holds. Only an administrator sets the caps. What a partition held before it reached the level is
counted in bounded steps after the raise; until that count is done the caps do not apply, and once
it is, the usage is exactly what the domain holds. A replay reaches the same state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from keyload import Capability, limits
from keyload.cli import main
from keyload.operations import census as census_module
from keyload.operations.census import Census, census
from keyload.processors import usage as usage_module
from keyload.processors.features import DOMAIN_CAPS, WORK_COMPACTED
from keyload.projections import keys
from keyload.sdk.envelope import Outcome

from .support import (
    ACK,
    BATCH,
    COMPLETE_PROCESSING,
    CONFIGURE_DOMAIN,
    CONFIGURE_DOMAIN_CAPS,
    CREATE_GROUP,
    CREATE_QUEUE,
    CREATE_TOPIC,
    DELETE_DOCUMENT,
    DELETE_GROUP,
    DELETE_QUEUE,
    DELETE_TOPIC,
    ENQUEUE,
    INSPECT_DOMAIN,
    PUT_DOCUMENT,
    RAISE_FEATURE_LEVEL,
    RECEIVE,
    TICK,
    Embedded,
    assert_replay_equals_live,
    batch_body,
    close_after_replay_check,
    create_group_body,
    create_queue_body,
    create_topic_body,
    delete_document_body,
    enqueue_body,
    expect,
    mutation,
    pass_time,
    put_document_body,
    receive_body,
    submit_unhalted,
)
from .test_access_control import Secured, can

D = "acme"


def send(embedded: Embedded, kind: str, body: dict[str, Any], domain: str = D) -> Outcome:
    return submit_unhalted(embedded, domain, kind, body)


def ok(embedded: Embedded, kind: str, body: dict[str, Any], domain: str = D) -> Any:
    return expect(send(embedded, kind, body, domain), None)


def usage(embedded: Embedded, domain: str = D) -> dict[str, Any]:
    view = ok(embedded, INSPECT_DOMAIN, {}, domain)
    return {kind.usage: getattr(view.usage, kind.usage) for kind in usage_module.CAPPED}


def refused(embedded: Embedded, kind: str, body: dict[str, Any]) -> str:
    answer = send(embedded, kind, body)
    expect(answer, "ResourceExhausted")
    return str(answer.detail)


def count_to_the_end(embedded: Embedded, records: int, domain: str = D) -> None:
    """Ticks until the usage count is done, failing after `records` of them."""
    store = embedded.store(domain)
    for _ in range(records):
        if not usage_module.counting(store):
            return
        ok(embedded, TICK, {}, domain)
    assert not usage_module.counting(store), f"the usage count is not done after {records} records"


def test_each_cap_bounds_its_kind_and_a_delete_gives_room_back(embedded: Embedded, tmp_path: Path) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    caps = {"max_queues": 2, "max_topics": 1, "max_groups": 1, "max_documents": 2, "max_document_bytes": 10}
    view = ok(embedded, CONFIGURE_DOMAIN_CAPS, caps)
    assert {name: getattr(view, name) for name in caps} == caps
    assert view.usage.counted

    for name in ("q1", "q2"):
        ok(embedded, CREATE_QUEUE, create_queue_body(name))
    assert refused(embedded, CREATE_QUEUE, create_queue_body("q3")) == (
        "domain acme would hold 3 queues, over its cap (max_queues 2): delete some first, or have an administrator "
        "raise the cap (ConfigureDomainCaps)"
    )
    ok(embedded, DELETE_QUEUE, {"queue": "q1"})
    ok(embedded, CREATE_QUEUE, create_queue_body("q3"))

    ok(embedded, CREATE_TOPIC, create_topic_body("t1"))
    assert refused(embedded, CREATE_TOPIC, create_topic_body("t2")).startswith(
        "domain acme would hold 2 topics, over its cap (max_topics 1)"
    )
    ok(embedded, CREATE_GROUP, create_group_body("t1", "g1"))
    assert refused(embedded, CREATE_GROUP, create_group_body("t1", "g2")).startswith(
        "domain acme would hold 2 subscription groups, over its cap (max_groups 1)"
    )

    ok(embedded, PUT_DOCUMENT, put_document_body("a", b"1234"))
    ok(embedded, PUT_DOCUMENT, put_document_body("b", b"1234"))
    assert refused(embedded, PUT_DOCUMENT, put_document_body("c", b"")).startswith(
        "domain acme would hold 3 documents, over its cap (max_documents 2)"
    )
    assert refused(embedded, PUT_DOCUMENT, put_document_body("a", b"1234567")).startswith(
        "domain acme would hold 11 bytes of document values, over its cap (max_document_bytes 10)"
    )
    ok(embedded, PUT_DOCUMENT, put_document_body("a", b"123456"))  # exactly at the byte cap
    assert usage(embedded) == {"queues": 2, "topics": 1, "groups": 1, "documents": 2, "document_bytes": 10}

    ok(embedded, DELETE_DOCUMENT, delete_document_body("b"))  # a tombstone holds nothing
    ok(embedded, PUT_DOCUMENT, put_document_body("c", b"1234"))
    ok(embedded, DELETE_GROUP, {"topic": "t1", "group": "g1"})
    ok(embedded, CREATE_GROUP, create_group_body("t1", "g2"))
    ok(embedded, DELETE_TOPIC, {"topic": "t1", "force": True})  # its group goes with it
    ok(embedded, CREATE_TOPIC, create_topic_body("t2"))
    ok(embedded, CREATE_GROUP, create_group_body("t2", "g1"))
    assert usage(embedded) == {"queues": 2, "topics": 1, "groups": 1, "documents": 2, "document_bytes": 10}
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_lowered_cap_removes_nothing_and_refuses_only_growth(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    for name in ("q1", "q2", "q3"):
        ok(embedded, CREATE_QUEUE, create_queue_body(name))
    ok(embedded, PUT_DOCUMENT, put_document_body("a", b"12345678"))
    view = ok(embedded, CONFIGURE_DOMAIN_CAPS, {"max_queues": 1, "max_document_bytes": 4})
    assert (view.usage.queues, view.max_queues, view.max_topics) == (3, 1, limits.DEFAULT_MAX_TOPICS)
    ok(embedded, DELETE_QUEUE, {"queue": "q1"})
    refused(embedded, CREATE_QUEUE, create_queue_body("q1"))  # 2 held, still over the cap
    ok(embedded, PUT_DOCUMENT, put_document_body("a", b"123456"))  # shrinking is always allowed
    refused(embedded, PUT_DOCUMENT, put_document_body("a", b"1234567"))
    for name in ("q2", "q3"):
        ok(embedded, DELETE_QUEUE, {"queue": name})
    ok(embedded, CREATE_QUEUE, create_queue_body("q1"))


def test_horizons_and_caps_are_set_apart_under_one_policy_version(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    capped = ok(embedded, CONFIGURE_DOMAIN_CAPS, {"max_queues": 3})
    horizons = ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 60_000, "expected_policy_version": 1})
    assert (horizons.max_queues, horizons.outcome_horizon_ms, horizons.policy_version) == (3, 60_000, 2)
    expect(send(embedded, CONFIGURE_DOMAIN_CAPS, {"max_queues": 4, "expected_policy_version": 1}), "RevisionConflict")
    again = ok(embedded, CONFIGURE_DOMAIN_CAPS, {"expected_policy_version": 2})  # every cap to its default
    assert (again.max_queues, again.outcome_horizon_ms) == (limits.DEFAULT_MAX_QUEUES, 60_000)
    assert capped.policy_version == 1


def test_a_batch_or_an_effect_past_a_cap_writes_none_of_its_documents(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    ok(embedded, CONFIGURE_DOMAIN_CAPS, {"max_documents": 1})
    puts = [mutation(PUT_DOCUMENT, put_document_body(key)) for key in ("a", "b")]
    answer = send(embedded, BATCH, batch_body(*puts))
    expect(answer, "ResourceExhausted")
    assert answer.failed_index == 1
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    [delivery] = ok(embedded, RECEIVE, receive_body("jobs", max_messages=1)).deliveries
    done = {"token": delivery.token, "handler_scope": "svc", "execution_generation": 0, "effects": puts}
    expect(send(embedded, COMPLETE_PROCESSING, done), "ResourceExhausted")
    assert usage(embedded)["documents"] == 0
    assert embedded.store(D).get(keys.document(D, "a")) is None
    ok(embedded, ACK, {"token": delivery.token})  # the lease was left as it was


def test_a_document_written_again_after_its_tombstone_went_counts_once(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 1_000, "receipt_horizon_ms": 2_000})
    ok(embedded, PUT_DOCUMENT, put_document_body("a", b"12"))
    ok(embedded, DELETE_DOCUMENT, delete_document_body("a"))
    pass_time(embedded, D, 2_000)  # the tombstone goes
    assert embedded.store(D).get(keys.document(D, "a")) is None
    assert ok(embedded, PUT_DOCUMENT, put_document_body("a", b"123")).revision == 1
    assert usage(embedded) == {"queues": 0, "topics": 0, "groups": 0, "documents": 1, "document_bytes": 3}


def test_a_partition_smaller_than_a_budget_is_counted_by_the_raise(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    for name in ("q1", "q2"):
        ok(embedded, CREATE_QUEUE, create_queue_body(name))
    monkeypatch.setattr(limits, "TICK_EXAMINATION_BUDGET", 3)  # more than the rows it holds
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    assert not usage_module.counting(embedded.store(D))
    ok(embedded, CONFIGURE_DOMAIN_CAPS, {"max_queues": 2})
    refused(embedded, CREATE_QUEUE, create_queue_body("q3"))


def test_below_level_5_the_policy_has_no_caps(embedded: Embedded) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    answer = send(embedded, CONFIGURE_DOMAIN_CAPS, {"max_queues": 5})
    expect(answer, "Validation")
    assert answer.detail == "per-domain caps apply from feature level 5; the partition is at level 4"
    view = ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 60_000})
    assert (view.max_queues, view.usage) == (None, None)
    ok(embedded, CREATE_QUEUE, create_queue_body("q1"))
    assert embedded.store(D).get(keys.domain_usage(D)) is None


@pytest.mark.parametrize("cap", [kind.cap for kind in usage_module.CAPPED])
def test_a_cap_out_of_range_is_refused(embedded: Embedded, cap: str) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    expect(send(embedded, CONFIGURE_DOMAIN_CAPS, {cap: -1}), "Validation")
    too_many = limits.INTEGER_FIELD_RANGES[f"ConfigureDomainCaps.{cap}"].maximum + 1
    expect(send(embedded, CONFIGURE_DOMAIN_CAPS, {cap: too_many}), "Validation")


def test_only_an_operator_sets_the_caps(tmp_path: Path) -> None:
    """A tenant that manages its domain's resources sets its horizons, but not the caps that bound it,
    and neither does the domain's own administrator: only an administrator of every domain does."""
    secured = Secured(tmp_path / "data")
    try:
        secured.everywhere("RaiseFeatureLevel", {"level": DOMAIN_CAPS})
        tenant = secured.principal("tenant", can(Capability.resource_manage, domain=D))
        assert secured.ok(tenant, D, CONFIGURE_DOMAIN, {"outcome_horizon_ms": 60_000}).policy_version == 1
        owner = secured.principal("owner", can(Capability.admin, domain=D))
        for principal in (tenant, owner):
            denied = secured.refused(principal, D, CONFIGURE_DOMAIN_CAPS, {"max_queues": 1_000_000})
            assert denied.detail == "the principal holds no admin grant on every domain"
        assert secured.ok(secured.admin, D, CONFIGURE_DOMAIN_CAPS, {"max_queues": 1}).max_queues == 1
        secured.ok(tenant, D, CREATE_QUEUE, create_queue_body("q1"))
        past, _ = secured.submit_as(tenant, D, CREATE_QUEUE, create_queue_body("q2"))
        assert (past.status, past.error_code) == ("rejected", "ResourceExhausted")
    finally:
        secured.close()


def test_what_a_partition_held_before_the_level_is_counted_in_steps(embedded: Embedded, tmp_path: Path) -> None:
    """More rows than one record's budget: the count takes several records, the changes made
    meanwhile behind and ahead of its cursor are each counted once, and the caps apply after it."""
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    # Six records' budgets of documents (the raise counts the first): the count is still on them when
    # "zzz" and "q3" are written.
    keys_ = [f"doc{n:04}" for n in range(6 * limits.TICK_EXAMINATION_BUDGET + 20)]
    for start in range(0, len(keys_), limits.MAX_BATCH_MUTATIONS):
        chunk = keys_[start : start + limits.MAX_BATCH_MUTATIONS]
        ok(embedded, BATCH, batch_body(*(mutation(PUT_DOCUMENT, put_document_body(key, b"xy")) for key in chunk)))
    ok(embedded, DELETE_DOCUMENT, delete_document_body(keys_[-1]))  # a tombstone: not counted
    for name in ("q1", "q2"):
        ok(embedded, CREATE_QUEUE, create_queue_body(name))
    ok(embedded, CREATE_TOPIC, create_topic_body("t1"))
    for name in ("g1", "g2"):
        ok(embedded, CREATE_GROUP, create_group_body("t1", name))

    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    ok(embedded, CONFIGURE_DOMAIN_CAPS, {"max_queues": 2, "max_documents": len(keys_)})  # after 512 rows
    assert not ok(embedded, INSPECT_DOMAIN, {}).usage.counted
    ok(embedded, DELETE_DOCUMENT, delete_document_body(keys_[0]))  # behind the cursor: counted now
    ok(embedded, PUT_DOCUMENT, put_document_body("zzz", b"abc"))  # ahead of it: counted when reached
    ok(embedded, CREATE_QUEUE, create_queue_body("q3"))  # not counted yet: the caps do not apply
    counting = census(embedded.data, embedded.partition(D))
    assert counting.usage_counting and counting.at_cap_total == 0  # 3 queues held, but the caps wait for the count
    count_to_the_end(embedded, 10)
    counted = census(embedded.data, embedded.partition(D))
    assert not counted.usage_counting
    assert [(entry.kind, entry.held, entry.cap) for entry in counted.at_cap] == [("queues", 3, 2)]
    assert ok(embedded, INSPECT_DOMAIN, {}).usage.counted
    documents = len(keys_) - 2 + 1
    held = {"queues": 3, "topics": 1, "groups": 2, "documents": documents, "document_bytes": documents * 2 + 1}
    assert usage(embedded) == held
    refused(embedded, CREATE_QUEUE, create_queue_body("q4"))
    store = embedded.store(D)
    due = [keys.parse_due_queue(key)[1] for key, _ in store.scan(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))]
    assert keys.USAGE_COUNT not in due
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_step_stops_at_its_budget_among_topics_with_groups(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A topic is looked at with its groups: a step of budget 8 over topics of 3 groups each counts
    two topics (8 rows), not a page of eight (32 rows). The raise counts the first two itself."""
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    for topic in range(6):
        ok(embedded, CREATE_TOPIC, create_topic_body(f"t{topic}"))
        for group in range(3):
            ok(embedded, CREATE_GROUP, create_group_body(f"t{topic}", f"g{group}"))
    monkeypatch.setattr(limits, "TICK_EXAMINATION_BUDGET", 8)
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    store, steps = embedded.store(D), 0
    while usage_module.counting(store) and steps < 6:
        ok(embedded, TICK, {})
        steps += 1
    assert steps == 2  # 6 topics of 4 rows each, 2 a step
    assert usage(embedded) == {"queues": 0, "topics": 6, "groups": 18, "documents": 0, "document_bytes": 0}
    assert_replay_equals_live(embedded, D, tmp_path)


# -- the model ---------------------------------------------------------------------------------

DOMAINS = ("acme", "beta")
NAMES = ("a", "b", "c")
MODEL_LIMITS = {"queues": 1, "topics": 1, "groups": 2, "documents": 2, "document_bytes": 6}
MODEL_CAPS = {f"max_{kind}": cap for kind, cap in MODEL_LIMITS.items()}


class Holdings:
    """What the model says each domain holds."""

    def __init__(self) -> None:
        self.queues: dict[str, set[str]] = {d: set() for d in DOMAINS}
        self.topics: dict[str, dict[str, set[str]]] = {d: {} for d in DOMAINS}
        self.documents: dict[str, dict[str, int]] = {d: {} for d in DOMAINS}

    def of(self, domain: str) -> dict[str, int]:
        return {
            "queues": len(self.queues[domain]),
            "topics": len(self.topics[domain]),
            "groups": sum(len(groups) for groups in self.topics[domain].values()),
            "documents": len(self.documents[domain]),
            "document_bytes": sum(self.documents[domain].values()),
        }


STEP = st.one_of(
    st.tuples(
        st.sampled_from(("create_queue", "delete_queue", "create_topic", "delete_topic")), st.sampled_from(NAMES)
    ),
    st.tuples(st.sampled_from(("create_group", "delete_group")), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("put"), st.sampled_from(NAMES), st.integers(0, 5)),
    st.tuples(st.just("delete_document"), st.sampled_from(NAMES)),
    st.tuples(st.just("tick")),
)
# What a partition holds before the raise: mostly creates, so that the count takes many records.
GROWTH = st.one_of(
    st.tuples(st.sampled_from(("create_queue", "create_topic", "delete_document")), st.sampled_from(NAMES)),
    st.tuples(st.just("create_group"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("put"), st.sampled_from(NAMES), st.integers(0, 5)),
    st.tuples(st.sampled_from(("delete_queue", "delete_topic")), st.sampled_from(NAMES)),
    st.tuples(st.just("delete_group"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
)
# Two runs that cover both phases whatever hypothesis draws: the second domain's rows are counted
# after "acme" creates past its caps uncounted; then, counted, "acme" is refused.
_HELD_BEFORE = [(domain, ("create_queue", name)) for domain in DOMAINS for name in NAMES]
_PAST_THE_CAPS = [
    ("acme", ("create_topic", "a")),
    ("acme", ("create_topic", "b")),
    ("acme", ("tick",)),
    ("acme", ("tick",)),
    ("acme", ("tick",)),
    ("acme", ("create_topic", "c")),
    ("beta", ("put", "a", 5)),
    ("beta", ("put", "b", 2)),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(before=_HELD_BEFORE, after=_PAST_THE_CAPS)
@given(
    before=st.lists(st.tuples(st.sampled_from(DOMAINS), GROWTH), min_size=6, max_size=20),
    after=st.lists(st.tuples(st.sampled_from(DOMAINS), STEP), min_size=5, max_size=30),
)
def test_usage_follows_a_reference_model(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    before: list[tuple[str, tuple[Any, ...]]],
    after: list[tuple[str, tuple[Any, ...]]],
) -> None:
    """Random creates and deletes of queues, topics, groups and documents in two domains of one
    partition, before and after the raise to level 5, with a timer budget of 1 row so the count
    takes many records: once counted, each domain's usage is the model's, a command is refused
    exactly when it would take a counted domain past a cap, and the live projection equals its replay."""
    monkeypatch.setattr(limits, "TICK_EXAMINATION_BUDGET", 1)
    directory = tmp_path_factory.mktemp("caps")
    embedded = Embedded(directory / "data", partitions=1)
    model = Holdings()
    try:
        for domain in DOMAINS:
            ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED}, domain)
        for domain, step in before:
            _apply(embedded, model, domain, step, capped=False)
        ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
        for domain in DOMAINS:
            ok(embedded, CONFIGURE_DOMAIN_CAPS, MODEL_CAPS, domain)
        for domain, step in after:
            _apply(embedded, model, domain, step, capped=True)
        count_to_the_end(embedded, 10 * (len(before) + 2))
        for domain in DOMAINS:
            assert usage(embedded, domain) == model.of(domain)
    finally:
        close_after_replay_check(embedded, directory)


def _apply(embedded: Embedded, model: Holdings, domain: str, step: tuple[Any, ...], capped: bool) -> None:
    """Send one step; check its answer against the model, then move the model."""
    action, *args = step
    held = model.of(domain)
    topics = model.topics[domain]
    growth: dict[str, int] = {}
    if action == "create_queue":
        kind, body, fits = CREATE_QUEUE, create_queue_body(args[0]), args[0] not in model.queues[domain]
        growth = {"queues": 1}
    elif action == "delete_queue":
        kind, body, fits = DELETE_QUEUE, {"queue": args[0]}, args[0] in model.queues[domain]
    elif action == "create_topic":
        kind, body, fits = CREATE_TOPIC, create_topic_body(args[0]), args[0] not in topics
        growth = {"topics": 1}
    elif action == "delete_topic":
        kind, body, fits = DELETE_TOPIC, {"topic": args[0]}, args[0] in topics
    elif action == "create_group":
        kind, body = CREATE_GROUP, create_group_body(args[0], args[1])
        fits = args[0] in topics and args[1] not in topics[args[0]]
        growth = {"groups": 1}
    elif action == "delete_group":
        kind, body = DELETE_GROUP, {"topic": args[0], "group": args[1]}
        fits = args[0] in topics and args[1] in topics[args[0]]
    elif action == "put":
        kind, body, fits = PUT_DOCUMENT, put_document_body(args[0], b"x" * args[1]), True
        growth = {
            "documents": 0 if args[0] in model.documents[domain] else 1,
            "document_bytes": args[1] - model.documents[domain].get(args[0], 0),
        }
    elif action == "delete_document":
        kind, body, fits = DELETE_DOCUMENT, delete_document_body(args[0]), args[0] in model.documents[domain]
    else:
        ok(embedded, TICK, {}, domain)
        return
    answer = send(embedded, kind, body, domain)
    counted = not usage_module.counting(embedded.store(domain))  # as it was when the command applied
    over = (
        capped
        and counted
        and any(delta > 0 and held[kind] + delta > MODEL_LIMITS[kind] for kind, delta in growth.items())
    )
    if not fits:
        assert answer.status == "rejected" and answer.error_code != "ResourceExhausted", answer
        return
    if capped:
        event("refused at a cap" if over else "counted" if counted else "not counted yet")
    if over:
        expect(answer, "ResourceExhausted")
        return
    expect(answer, None)
    if action == "create_queue":
        model.queues[domain].add(args[0])
    elif action == "delete_queue":
        model.queues[domain].discard(args[0])
    elif action == "create_topic":
        topics[args[0]] = set()
    elif action == "delete_topic":
        del topics[args[0]]
    elif action == "create_group":
        topics[args[0]].add(args[1])
    elif action == "delete_group":
        topics[args[0]].discard(args[1])
    elif action == "put":
        model.documents[domain][args[0]] = args[1]
    else:
        del model.documents[domain][args[0]]
    if capped and counted:
        assert usage(embedded, domain) == model.of(domain)


def test_the_census_lists_the_domains_at_a_cap(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator finds the domains whose next create is refused without asking each one: the census
    lists every kind a domain holds as much of as its cap allows (or more, after a lowered cap), and
    stops listing it once a delete makes room."""
    partition = embedded.partition(D)

    def at_cap() -> list[tuple[str, str, int, int]]:
        found = census(embedded.data, partition)
        assert found.at_cap_total == len(found.at_cap)
        return [(entry.domain, entry.kind, entry.held, entry.cap) for entry in found.at_cap]

    ok(embedded, RAISE_FEATURE_LEVEL, {"level": DOMAIN_CAPS})
    caps = {"max_queues": 2, "max_topics": 0, "max_documents": 5, "max_document_bytes": 10}
    ok(embedded, CONFIGURE_DOMAIN_CAPS, caps)
    ok(embedded, CREATE_QUEUE, create_queue_body("q1"))
    ok(embedded, PUT_DOCUMENT, put_document_body("a", b"123456"))
    assert at_cap() == []  # below every cap; a cap of 0 on topics it holds none of forbids, it is not reached
    ok(embedded, CREATE_QUEUE, create_queue_body("q2"))
    ok(embedded, PUT_DOCUMENT, put_document_body("b", b"1234"))  # exactly at the byte cap
    assert at_cap() == [(D, "queues", 2, 2), (D, "document_bytes", 10, 10)]
    refused(embedded, CREATE_QUEUE, create_queue_body("q3"))  # what the listing says: the next create fails

    ok(embedded, CONFIGURE_DOMAIN_CAPS, {**caps, "max_queues": 1})  # lowered below what it holds: past it
    ok(embedded, DELETE_DOCUMENT, delete_document_body("b"))
    assert at_cap() == [(D, "queues", 2, 1)]

    ok(embedded, PUT_DOCUMENT, put_document_body("b", b"1234"))
    monkeypatch.setattr(census_module, "MAX_CENSUS_AT_CAP", 1)
    found = census(embedded.data, partition)
    assert (len(found.at_cap), found.at_cap_total) == (1, 2)
    assert main(["census", "--data", str(embedded.data.root), "--domain", D, "--output", "text"]) == 0
    assert "; at a cap: acme queues 2/1 and 1 more\n" in capsys.readouterr().out
    assert main(["census", "--data", str(embedded.data.root), "--domain", D, "--output", "json"]) == 0
    [printed] = json.loads(capsys.readouterr().out)["partitions"]
    assert printed["at_cap"] == [{"domain": D, "kind": "queues", "held": 2, "cap": 1}]
    newer = {**printed, "a_later_field": 1, "at_cap": [{**printed["at_cap"][0], "a_later_field": 2}]}
    assert Census.from_json(newer) == found  # a newer server's census: what this SDK does not know is left out

    ok(embedded, DELETE_QUEUE, {"queue": "q1"})
    ok(embedded, DELETE_DOCUMENT, delete_document_body("b"))
    monkeypatch.undo()
    assert at_cap() == [(D, "queues", 1, 1)]  # a queue deleted gives its room back at once
