"""`keyload census`: what a projection holds by key family, and the bounded work it has left.

An operator sees state grow with what is live: message metadata for every message a queue ever
took, bodies only for the live ones, a deleted queue's rows until reclamation has walked them, and
the rows kept to a horizon, within it and then past it until the sweep removes them. The same
census reaches a client of the data directory and, for an operator, a client of the HTTP API.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyload import AsyncClient, Capability, Client, Credential, Grant, KeyloadError, limits
from keyload.cli import main
from keyload.credentials import ADMIN_PRINCIPAL
from keyload.errors import InvalidCommand
from keyload.log.base import partition_for
from keyload.operations.census import Census, CensusError, census
from keyload.processors.features import WORK_COMPACTED
from keyload.storage.datadir import DataDir
from keyload.storage.principals import system_credential

from .support import (
    ACK,
    BATCH,
    CONFIGURE_DOMAIN,
    CREATE_QUEUE,
    CREATE_TOPIC,
    ENQUEUE,
    PUBLISH,
    RAISE_FEATURE_LEVEL,
    RECEIVE,
    TICK,
    Embedded,
    batch_body,
    bearer,
    command,
    create_queue_body,
    create_topic_body,
    enqueue_body,
    event,
    expect,
    mutation,
    pass_time,
    publish_body,
    receive_body,
    served_url,
    start_service,
    stop_service,
    submit_unhalted,
)

D = "acme"
OUTCOME_MS = 1_000
RECEIPT_MS = 5_000


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
    with Client(fresh.root, credential=system_credential(fresh.root, ADMIN_PRINCIPAL)) as client:
        assert client.census() == []  # none has a projection yet
        with pytest.raises(CensusError, match="has no projection yet"):
            client.census(1)


def horizons_of(found: Census) -> dict[str, tuple[int, int]]:
    """(kept within the horizon, past it) by the family of the rows kept."""
    return {horizon.family: (horizon.kept, horizon.due) for horizon in found.horizons}


def finish(embedded: Embedded, queue: str, count: int) -> None:
    """Enqueue, receive and ack `count` messages (a multiple of 100), a hundred per command."""
    for first in range(0, count, 100):
        enqueues = (mutation(ENQUEUE, enqueue_body(queue, f"m{n}")) for n in range(first, first + 100))
        ok(embedded, BATCH, batch_body(*enqueues))
        deliveries = ok(embedded, RECEIVE, receive_body(queue, max_messages=100)).deliveries
        ok(embedded, "keyload.command.AckBatch", {"tokens": [d.token for d in deliveries]})


def test_rows_kept_to_a_horizon_are_kept_then_past_it_then_gone(embedded: Embedded) -> None:
    partition = embedded.partition(D)
    ok(embedded, CREATE_QUEUE, create_queue_body("early"))
    ok(embedded, ENQUEUE, enqueue_body("early", "m"))
    early = census(embedded.data, partition)
    assert (early.outcomes_without_horizon, early.horizons) == (2, ())  # below level 2: kept forever
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    ok(embedded, CONFIGURE_DOMAIN, {"outcome_horizon_ms": OUTCOME_MS, "receipt_horizon_ms": RECEIPT_MS})
    ok(embedded, CREATE_QUEUE, create_queue_body("bulk", receive_max_messages=100))
    finish(embedded, "bulk", 300)
    outcomes = 2 + 3 * 3  # ConfigureDomain, CreateQueue, then a Batch, Receive and AckBatch per hundred
    within = census(embedded.data, partition)
    assert horizons_of(within) == {"message": (300, 0), "outcome": (outcomes, 0)}
    assert (within.horizon_due, within.outcomes_without_horizon) == (0, 2)

    embedded.now_ms += OUTCOME_MS  # everything is past the outcome horizon: one record sweeps one budget
    budget = limits.TICK_EXAMINATION_BUDGET
    assert budget < 300 and ok(embedded, TICK, {}).budget_exhausted
    past = census(embedded.data, partition)  # finished messages first: their entries sort before commands'
    assert horizons_of(past) == {"identity": (budget, 0), "message": (0, 300 - budget), "outcome": (0, outcomes)}
    assert (past.horizon_due, past.timers_due) == (300 - budget + outcomes, 1)  # the sweep, due again
    while ok(embedded, TICK, {}).budget_exhausted:
        pass
    swept = census(embedded.data, partition)
    assert horizons_of(swept) == {"identity": (300, 0), "receipt": (outcomes, 0)}  # until the receipt horizon
    assert swept.horizon_due == 0

    pass_time(embedded, D, RECEIPT_MS)
    while ok(embedded, TICK, {}).budget_exhausted:
        pass
    gone = census(embedded.data, partition)
    assert (gone.horizons, gone.horizon_due, gone.outcomes_without_horizon) == ((), 0, 2)
    rows = {family.family: family.rows for family in gone.families}
    assert (rows["outcome"], rows["message"]) == (2, 1)  # what was stored early, and the one message still live
    assert not {"identity", "receipt"} & set(rows)
    waiting = {**receive_body("bulk"), "wait_ms": 60_000}  # nothing ready: it waits, with no outcome yet
    embedded.append(D, command(D, RECEIVE, waiting, "waits", reply_to=0))
    embedded.run()
    assert census(embedded.data, partition).outcomes_without_horizon == 2  # its fingerprint row is no outcome


def test_the_sdk_reads_the_census_the_cli_prints(embedded: Embedded, capsys: pytest.CaptureFixture[str]) -> None:
    ok(embedded, CREATE_QUEUE, create_queue_body("jobs"))  # below level 2: an outcome kept without a horizon
    ok(embedded, RAISE_FEATURE_LEVEL, {"level": WORK_COMPACTED})
    ok(embedded, ENQUEUE, enqueue_body("jobs", "m1"))
    assert main(["census", "--data", str(embedded.data.root), "--output", "json"]) == 0
    printed = [Census.from_json(found) for found in json.loads(capsys.readouterr().out)["partitions"]]
    operator = system_credential(embedded.data.root, ADMIN_PRINCIPAL)
    with Client(embedded.data.root, credential=operator) as client:
        assert client.census() == printed
        partition = embedded.partition(D)
        [one] = client.census(partition)
        assert one == printed[partition] and horizons_of(one) == {"outcome": (1, 0)}
        with pytest.raises(KeyloadError, match="partition must be"):
            client.census(embedded.data.partitions)
    assert main(["census", "--data", str(embedded.data.root), "--domain", D, "--output", "text"]) == 0
    out = capsys.readouterr().out
    assert "; 1 outcomes kept without a horizon" in out
    table = [line.split() for line in out.splitlines()]
    assert ["kept", "to", "a", "horizon", "within", "horizon", "past", "horizon"] in table
    assert ["outcome", "1", "0"] in table  # the Enqueue's, within its horizon


def test_an_operator_reads_the_census_over_http(tmp_path: Path) -> None:
    root = tmp_path / "data"
    service = start_service(root)
    try:
        url = served_url(root)
        operator = Credential.load(root / "credentials" / f"{ADMIN_PRINCIPAL}.json")
        with Client(url, credential=operator) as admin:
            admin.create_queue(D, "jobs")
            admin.enqueue(D, "jobs", b"x", message_id="m1")
            partition = partition_for(D, admin.partitions)
            [remote] = admin.census(partition)
            assert remote == census(DataDir.open(root), partition)
            assert horizons_of(remote)["outcome"] == (2, 0)  # `keyload run` raised the level: outcomes keep to one
            assert [found.partition for found in admin.census()] == list(range(admin.partitions))
            with pytest.raises(InvalidCommand, match="partition must be"):
                admin.census(admin.partitions)

            async def asked() -> list[Census]:
                async with AsyncClient(url, credential=operator) as client:
                    return await client.census(partition)

            assert asyncio.run(asked()) == [remote]
            tenant = admin.create_principal(
                f"tenant-{uuid.uuid4().hex[:8]}", [Grant(capability=Capability.inspect, domain=D)]
            )
        assert httpx.get(f"{url}/v1/census").status_code == 401
        refused = httpx.get(f"{url}/v1/census", headers={"Authorization": f"Bearer {tenant.bearer_token}"})
        assert (refused.status_code, refused.json()["error_code"]) == (403, "PermissionDenied")
        with Client(url, credential=tenant) as client, pytest.raises(KeyloadError, match="inspect on every domain"):
            client.census()
        allowed = httpx.get(f"{url}/v1/census", params={"partition": partition}, headers=bearer(root))
        assert allowed.status_code == 200 and allowed.json()["partitions"][0]["partition"] == partition
        for wrong in ("99", "9" * 5_000, "-1"):
            out_of_range = httpx.get(f"{url}/v1/census", params={"partition": wrong}, headers=bearer(root))
            assert (out_of_range.status_code, out_of_range.json()["error_code"]) == (400, "Validation")
        unknown = httpx.get(f"{url}/v1/census", params={"partition": partition, "domain": D}, headers=bearer(root))
        assert (unknown.status_code, unknown.json()["detail"]) == (400, "domain is not a parameter of the census")
    finally:
        assert stop_service(service) == 0
