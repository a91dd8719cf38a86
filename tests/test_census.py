"""`keyload census`: what a projection holds by key family, and the bounded work it has left.

An operator sees state grow with what is live: message metadata for every message a queue ever
took, bodies only for the live ones, a deleted queue's rows until reclamation has walked them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keyload.cli import main
from keyload.operations.census import CensusError, census
from keyload.storage.datadir import DataDir

from .support import (
    ACK,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    PUBLISH,
    RECEIVE,
    TICK,
    Embedded,
    batch_body,
    create_queue_body,
    create_topic_body,
    enqueue_body,
    event,
    expect,
    mutation,
    publish_body,
    receive_body,
    submit_unhalted,
)

D = "acme"


def ok(embedded: Embedded, kind: str, body: dict[str, Any]) -> Any:
    return expect(submit_unhalted(embedded, D, kind, body), None)


def counted(embedded: Embedded, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["census", "--data", str(embedded.data.root), "--output", "json", *args]) == 0
    [partition] = json.loads(capsys.readouterr().out)["partitions"]
    return dict(partition)


def rows_of(partition: dict[str, Any]) -> dict[str, int]:
    return {family["family"]: family["rows"] for family in partition["families"]}


def test_census_counts_rows_by_family_and_the_work_left(embedded: Embedded, capsys: pytest.CaptureFixture[str]) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs", receive_max_messages=100))
    for i in range(10):
        ok(embedded, ENQUEUE, enqueue_body("jobs", f"m{i}"))
    for delivery in ok(embedded, RECEIVE, receive_body("jobs", max_messages=4)).deliveries:
        ok(embedded, ACK, {"token": delivery.token})
    ok(embedded, CREATE_TOPIC, create_topic_body("news"))
    ok(embedded, PUBLISH, publish_body("news", event("e1"), event("e2")))
    partition = counted(embedded, capsys, "--domain", D)
    rows = rows_of(partition)
    assert (rows["message"], rows["body"], rows["ready"]) == (10, 6, 6)  # metadata stays, bodies go with the ack
    assert (rows["queue"], rows["topic"], rows["event"], rows["event_id"]) == (1, 1, 2, 2)
    assert partition["rows"] == sum(1 for _ in embedded.store(D).scan(b"", b"\xff"))
    assert partition["applied_offset"] == embedded.store(D).applied_offset
    assert partition["reclaiming"] == {"queues": 0, "groups": 0, "topics": 0}

    ok(embedded, CREATE_QUEUE, create_queue_body("doomed"))
    for first in range(0, 600, 100):
        enqueues = (mutation(ENQUEUE, enqueue_body("doomed", f"d{i}")) for i in range(first, first + 100))
        ok(embedded, "keyload.command.Batch", batch_body(*enqueues))
    ok(embedded, "keyload.command.DeleteQueue", {"queue": "doomed", "force": True})
    pending = counted(embedded, capsys, "--domain", D)
    assert (pending["reclaiming"]["queues"], pending["timers_due"]) == (1, 1)  # due at the delete's log time
    assert rows_of(pending)["retired"] == 1
    while counted(embedded, capsys, "--domain", D)["reclaiming"]["queues"]:
        ok(embedded, TICK, {})
    done = counted(embedded, capsys, "--domain", D)
    assert "retired" not in rows_of(done) and done["timers_due"] == 0
    assert rows_of(done)["message"] == 10  # only the deleted queue's rows went


def test_census_text_names_every_partition_with_a_projection(
    embedded: Embedded, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))
    assert main(["census", "--data", str(embedded.data.root), "--output", "text"]) == 0
    out = capsys.readouterr().out
    partition = embedded.partition(D)
    assert f"p{partition}: applied through " in out
    assert "reclaiming nothing; 0 retention tasks; 0 timers due; 0 horizon rows due" in out
    assert "  queue " in out


def test_census_of_a_partition_without_a_projection_is_an_error(tmp_path: Path) -> None:
    fresh = DataDir.create(tmp_path / "fresh", 2)
    with pytest.raises(CensusError, match="has no projection yet"):
        census(fresh, 0)
