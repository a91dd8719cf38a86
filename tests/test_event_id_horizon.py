"""Event-id dedup within the receipt horizon (feature level 6, processors/horizons.py).

What a user notices: within the domain's receipt horizon from a publish, publishing the event id
again is DuplicateEventId (same content) or Conflict (other content); after it the id is new and
the event is published again at a new position. A topic whose events age out keeps no row per
event it ever took, and a deleted topic's pending entries come due without harm. Below level 6
an event id is deduplicated for as long as its topic lives. Every run replays to the same state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.operations.census import census
from keyload.processors.features import DOMAIN_CAPS, EVENT_IDS_KEPT
from keyload.projections import keys

from .support import (
    CONFIGURE_DOMAIN,
    CREATE_TOPIC,
    DELETE_TOPIC,
    PUBLISH,
    RAISE_FEATURE_LEVEL,
    TICK,
    Embedded,
    assert_replay_equals_live,
    close_after_replay_check,
    create_topic_body,
    event,
    expect,
    family_rows,
    pass_time,
    publish_body,
    submit_unhalted,
)

D = "acme"
T = "news"
OUTCOME_MS = 1_000
RECEIPT_MS = 5_000


def ok(embedded: Embedded, kind: str, body: dict[str, Any]) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body), None)


def at_level(embedded: Embedded, level: int, **policy: Any) -> None:
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": level})
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": OUTCOME_MS, "receipt_horizon_ms": RECEIPT_MS})
    ok(embedded, CREATE_TOPIC, create_topic_body(T, **policy))


def row_entries(embedded: Embedded) -> int:
    """Horizon index entries naming rows (not commands' outcomes and receipts)."""
    store = embedded.store(D)
    return sum(1 for key, _ in store.scan(keys.HORIZON, keys.prefix_end(keys.HORIZON)) if keys.horizon_row(key))


def publish(embedded: Embedded, *events: dict[str, Any]) -> tuple[str | None, Any]:
    outcome = submit_unhalted(embedded, D, PUBLISH, publish_body(T, *events))
    return outcome.error_code, outcome.result


def test_an_event_id_is_new_after_the_receipt_horizon(embedded: Embedded, tmp_path: Path) -> None:
    at_level(embedded, EVENT_IDS_KEPT)
    assert publish(embedded, event("e1", b"one"))[1].events[0].position == 1
    embedded.now_ms += RECEIPT_MS - 1
    assert publish(embedded, event("e1", b"one"))[0] == "DuplicateEventId"
    assert publish(embedded, event("e1", b"other"))[0] == "Conflict"

    pass_time(embedded, D, 1)  # the receipt horizon from the first publish: the id is new
    assert (family_rows(embedded.store(D), keys.EVENT_ID), row_entries(embedded)) == (0, 0)
    code, result = publish(embedded, event("e1", b"other"))
    assert code is None and result.events[0].position == 2
    assert publish(embedded, event("e1", b"other"))[0] == "DuplicateEventId"  # kept again, from now
    assert_replay_equals_live(embedded, D, tmp_path)


def test_aged_out_events_leave_no_rows_behind(embedded: Embedded, tmp_path: Path) -> None:
    """A topic that keeps events for less than the receipt horizon: once both have passed, nothing
    of its past publishes is left but the topic itself."""
    at_level(embedded, EVENT_IDS_KEPT, max_age_ms=OUTCOME_MS)
    for round_ in range(3):
        for i in range(40):
            publish(embedded, event(f"r{round_}-{i}"))
        pass_time(embedded, D, 100)
    store = embedded.store(D)
    assert family_rows(store, keys.EVENT_ID) == 120
    pass_time(embedded, D, RECEIPT_MS)
    for _ in range(20):  # aged-out events leave in bounded steps, one per record
        pass_time(embedded, D, 1)
    assert (family_rows(store, keys.EVENT), family_rows(store, keys.EVENT_ID), row_entries(embedded)) == (0, 0, 0)
    assert census(embedded.data, embedded.partition(D)).horizon_due == 0
    assert_replay_equals_live(embedded, D, tmp_path)


def test_a_deleted_topics_event_ids_come_due_harmlessly(embedded: Embedded, tmp_path: Path) -> None:
    """Reclamation may remove a deleted topic's event-id rows before their entries come due (topic
    "early"), or the sweep may remove them while the topic is still being reclaimed ("late"):
    either way nothing is left and the partition goes on."""
    at_level(embedded, EVENT_IDS_KEPT)
    ok(embedded, CREATE_TOPIC, create_topic_body("early"))
    for i in range(150):  # more than one reclamation step each
        for topic in ("early", T):
            ok(embedded, PUBLISH, publish_body(topic, event(f"e{i}")))
    ok(embedded, DELETE_TOPIC, {"topic": "early", "force": True})
    for _ in range(3):  # 300 rows: reclaimed within three records' budgets
        pass_time(embedded, D, 1)
    assert family_rows(embedded.store(D), keys.EVENT_ID) == 150
    embedded.now_ms += RECEIPT_MS - 10
    ok(embedded, DELETE_TOPIC, {"topic": T, "force": True})
    for _ in range(5):  # every entry comes due; the sweep and the late topic's reclamation share the budget
        pass_time(embedded, D, 10)
    assert (family_rows(embedded.store(D), keys.EVENT_ID), row_entries(embedded)) == (0, 0)
    ok(embedded, CREATE_TOPIC, create_topic_body(T))  # a new topic under the name: a new id space
    assert publish(embedded, event("e0"))[1].events[0].position == 1
    assert_replay_equals_live(embedded, D, tmp_path)


def test_below_level_6_an_event_id_is_kept_while_its_topic_lives(embedded: Embedded, tmp_path: Path) -> None:
    at_level(embedded, DOMAIN_CAPS)
    publish(embedded, event("e1"))
    pass_time(embedded, D, 10 * RECEIPT_MS)
    assert family_rows(embedded.store(D), keys.EVENT_ID) == 1
    assert publish(embedded, event("e1"))[0] == "DuplicateEventId"
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": EVENT_IDS_KEPT})  # what was published before stays kept
    pass_time(embedded, D, 10 * RECEIPT_MS)
    assert publish(embedded, event("e1"))[0] == "DuplicateEventId"
    assert_replay_equals_live(embedded, D, tmp_path)


# A model: what publishing an event id answers, from when it was last published and the window.

IDS = ("a", "b", "c")
CONTENTS = (b"one", b"two")
WAITS = (1, 700, 2_000, RECEIPT_MS - 1, RECEIPT_MS)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.sampled_from(IDS), st.sampled_from(CONTENTS)),
            st.tuples(st.just("wait"), st.sampled_from(WAITS), st.just(b"")),
        ),
        max_size=40,
    )
)
def test_dedup_follows_a_reference_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, Any, bytes]]
) -> None:
    """Random publishes of a few ids with a few contents, and waits: each publish is committed at
    the next position, DuplicateEventId or Conflict exactly as the model says; the projection holds
    an id's row exactly while the model does; the live projection equals its replay."""
    directory = tmp_path_factory.mktemp("dedup")
    embedded = Embedded(directory / "data")
    try:
        at_level(embedded, EVENT_IDS_KEPT)
        kept: dict[str, tuple[int, bytes]] = {}  # event id -> (published at, content) within the window
        tail = 0
        for action, arg, content in steps:
            if action == "wait":
                embedded.now_ms += arg
                continue
            kept = {i: (at, c) for i, (at, c) in kept.items() if embedded.now_ms < at + RECEIPT_MS}
            code, result = publish(embedded, event(arg, content))
            if arg not in kept:
                tail += 1
                assert code is None and result.events[0].position == tail
                kept[arg] = (embedded.now_ms, content)
            else:
                assert code == ("DuplicateEventId" if kept[arg][1] == content else "Conflict")
        ok(embedded, TICK, {})  # the sweep runs before a record: let it run at the last time
        kept = {i: (at, c) for i, (at, c) in kept.items() if embedded.now_ms < at + RECEIPT_MS}
        assert family_rows(embedded.store(D), keys.EVENT_ID) == row_entries(embedded) == len(kept)
    finally:
        close_after_replay_check(embedded, directory)
