"""ListQueues and ListTopics (processors/listing.py) through the real processor, file log and RocksDB:
a model of the domains' names against every page, views, validation and the page bound. (The CLI's
`queue list` / `topic list`: tests/test_cli_grammar.py; the HTTP routes: tests/test_server_http.py.)"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.sdk.results import QueueList, TopicList

from .support import (
    CREATE_QUEUE,
    CREATE_TOPIC,
    DELETE_QUEUE,
    DELETE_TOPIC,
    Embedded,
    assert_replay_equals_live,
    close_after_replay_check,
    create_queue_body,
    create_topic_body,
    expect,
    submit_unhalted,
)

LIST_QUEUES = "keyload.command.ListQueues"
LIST_TOPICS = "keyload.command.ListTopics"
D = "acme"

# Short names over few letters, so prefixes, neighbours and reused names are common.
names = st.text("ab", min_size=1, max_size=1).flatmap(lambda first: st.text("ab.-", max_size=3).map(first.__add__))


def list_body(kind: str, prefix: str = "", after: str | None = None, limit: int | None = None) -> dict[str, Any]:
    return {"prefix": prefix, "after": after, f"max_{kind}s": limit}


def pages(embedded: Embedded, kind: str, domain: str, prefix: str = "", limit: int | None = None) -> list[Any]:
    """Every page of the listing, read on with `next_after` until it is null."""
    command = LIST_QUEUES if kind == "queue" else LIST_TOPICS
    found: list[Any] = []
    after: str | None = None
    while True:
        page = expect(submit_unhalted(embedded, domain, command, list_body(kind, prefix, after, limit)), None)
        assert isinstance(page, QueueList if kind == "queue" else TopicList)
        found.append(page)
        if page.next_after is None:
            return found
        after = page.next_after


def listed(embedded: Embedded, kind: str, domain: str, prefix: str = "", limit: int | None = None) -> list[str]:
    return [
        getattr(view, kind)
        for page in pages(embedded, kind, domain, prefix, limit)
        for view in (page.queues if kind == "queue" else page.topics)
    ]


class ListingMachine(RuleBasedStateMachine):
    """Queues and topics created and deleted in two domains of one partition; every listing, by any
    prefix and page size, is the model's names in order, and each page is full but the last."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-listing-model-"))
        self.embedded = Embedded(self.directory / "data", partitions=1)
        self.model: dict[tuple[str, str], set[str]] = {}

    def names_of(self, kind: str, domain: str) -> set[str]:
        return self.model.setdefault((kind, domain), set())

    @rule(kind=st.sampled_from(["queue", "topic"]), domain=st.sampled_from([D, "other"]), name=names)
    def create(self, kind: str, domain: str, name: str) -> None:
        command, body = (
            (CREATE_QUEUE, create_queue_body(name)) if kind == "queue" else (CREATE_TOPIC, create_topic_body(name))
        )
        taken = name in self.names_of(kind, domain)
        expect(submit_unhalted(self.embedded, domain, command, body), "Conflict" if taken else None)
        self.names_of(kind, domain).add(name)

    @rule(kind=st.sampled_from(["queue", "topic"]), domain=st.sampled_from([D, "other"]), name=names)
    def delete(self, kind: str, domain: str, name: str) -> None:
        command = DELETE_QUEUE if kind == "queue" else DELETE_TOPIC
        body = {kind: name, "force": True, "expected_incarnation": None}
        present = name in self.names_of(kind, domain)
        expect(submit_unhalted(self.embedded, domain, command, body), None if present else "NotFound")
        self.names_of(kind, domain).discard(name)

    @rule(
        kind=st.sampled_from(["queue", "topic"]),
        domain=st.sampled_from([D, "other"]),
        prefix=st.sampled_from(["", "a", "b", "a.", "ab", "b-a"]),
        limit=st.sampled_from([None, 1, 2, 3]),
    )
    def list_them(self, kind: str, domain: str, prefix: str, limit: int | None) -> None:
        found = pages(self.embedded, kind, domain, prefix, limit)
        sizes = [len(page.queues if kind == "queue" else page.topics) for page in found]
        expected = sorted(n for n in self.names_of(kind, domain) if n.startswith(prefix))
        assert listed(self.embedded, kind, domain, prefix, limit) == expected
        full = limit or limits.DEFAULT_LIST_RESOURCES
        assert all(size == full for size in sizes[:-1]) and sizes[-1] <= full, sizes

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


ListingMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None, derandomize=True)
test_listing_model = ListingMachine.TestCase


def test_each_listed_view_is_what_inspect_shows(embedded: Embedded, tmp_path: Path) -> None:
    expect(submit_unhalted(embedded, D, CREATE_QUEUE, create_queue_body("orders", max_attempts=3)), None)
    expect(submit_unhalted(embedded, D, CREATE_TOPIC, create_topic_body("events")), None)
    [queue_page] = pages(embedded, "queue", D)
    inspected = expect(submit_unhalted(embedded, D, "keyload.command.InspectQueue", {"queue": "orders"}), None)
    assert queue_page.queues == [inspected] and inspected.policy.max_attempts == 3
    [topic_page] = pages(embedded, "topic", D)
    assert topic_page.topics == [
        expect(submit_unhalted(embedded, D, "keyload.command.InspectTopic", {"topic": "events"}), None)
    ]
    assert listed(embedded, "queue", "nobody") == [] and listed(embedded, "topic", "nobody") == []
    assert_replay_equals_live(embedded, D, tmp_path)


@pytest.mark.parametrize("kind", ["queue", "topic"])
@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"prefix": "a", "after": "b"}, "after must start with the prefix"),
        ({"prefix": "-a"}, "prefix must be 1..80 characters"),
        ({"after": "x" * 81}, "after must be 1..80 characters"),
        ({"limit": 0}, "s must be between 1 and 1000"),
        ({"limit": limits.MAX_LIST_RESOURCES + 1}, "s must be between 1 and 1000"),
    ],
)
def test_list_validation(embedded: Embedded, kind: str, fields: dict[str, Any], what: str) -> None:
    command = LIST_QUEUES if kind == "queue" else LIST_TOPICS
    outcome = submit_unhalted(embedded, D, command, list_body(kind, **fields))
    expect(outcome, "Validation")
    assert what in outcome.detail


def test_a_full_page_of_the_largest_views_is_one_outcome(embedded: Embedded) -> None:
    """Views of the longest names stay inside the named view bound, so a full page of them stays
    inside MAX_OUTCOME_BYTES (keyload/limits.py asserts the product)."""
    domain = "d" * limits.MAX_DOMAIN_CHARS
    for i in range(3):
        name = f"{i}" + "q" * (limits.MAX_QUEUE_NAME_CHARS - 1)
        expect(submit_unhalted(embedded, domain, CREATE_QUEUE, create_queue_body(name)), None)
        expect(submit_unhalted(embedded, domain, CREATE_TOPIC, create_topic_body(name)), None)
    for command, kind in ((LIST_QUEUES, "queue"), (LIST_TOPICS, "topic")):
        page = expect(submit_unhalted(embedded, domain, command, list_body(kind)), None)
        views = page.queues if kind == "queue" else page.topics
        assert len(views) == 3
        full, empty = (outcome_bytes(page.AVRO_NAME, {f"{kind}s": v, "next_after": None}) for v in ([*views], []))
        assert (full - empty) / 3 <= limits.MAX_RESOURCE_VIEW_BYTES // 2, (kind, full, empty)


def outcome_bytes(result_name: str, result: dict[str, Any]) -> int:
    """The encoded size of an outcome carrying `result` (its views as records)."""
    record = {key: [v.to_avro() for v in value] if isinstance(value, list) else value for key, value in result.items()}
    outcome = {
        "command_id": "c",
        "domain": "d",
        "partition": 0,
        "offset": 0,
        "eval_time_ms": 0,
        "status": "committed",
        "result": (result_name, record),
    }
    return len(REGISTRY.encode("keyload.Outcome", outcome))
