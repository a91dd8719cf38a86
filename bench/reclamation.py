"""Rows removed in bounded steps by Ticks, per CPU-second against raw RocksDB deletes, and their cost to other commands.

    python -m bench.reclamation [--kind queue|topic|age] [--messages N] [--settled S] [--json]

One data directory, one domain, the embedded file log and a PartitionProcessor with the outcome
stream on, as `keyload run` has them. Each command is appended and applied on its own; only step()
is timed (thread CPU). The kinds:

- queue (default): a queue gets N messages in Batches of 100 Enqueues; the first S are received
  (100 at a time) and acked, so they keep only their metadata, and the rest stay ready (metadata,
  body, ready row). Removed by `DeleteQueue --force`.
- topic: a topic gets N events in Publishes of 100, read by one group that received and acked the
  first S (100 at a time). Removed by `DeleteTopic --force`: its events, event ids and the group's rows.
- age: a topic gets N events as above, no group. Removed by `ConfigureTopic` with max_age_ms 1: the
  topic's retention timer ages every event out (the event-id rows stay).

(a) reclamation: Ticks alone until the rows are gone; rows removed per CPU-second
(b) raw deletes: the same keys deleted by rocksdict alone, in WriteBatches of the tick budget (256
    keys), from a reopened Rdict holding exactly those rows (the Store's options)
(c) a second resource like it, removed the same way, then Enqueues into another queue until its rows
    are gone (each record pays a step first), then as many Enqueues again: thread-CPU µs per Enqueue
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from keyload import limits
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY, Record
from keyload.processors.policy import default_group_spec, default_spec, default_topic_spec
from keyload.processors.reclamation import QUEUE_FAMILIES
from keyload.processors.topics.deletion import GROUP_FAMILIES, TOPIC_FAMILIES
from keyload.projections import keys
from keyload.projections.records import TopicRecord
from keyload.projections.store import Store
from keyload.service.runtime import PartitionProcessor
from keyload.storage.datadir import DataDir

from .common import DOMAIN, OUTCOME, REPLY_TO, BenchError, Stopwatch, encode_command, environment

DEFAULT_MESSAGES = 20_000
DEFAULT_SETTLED = 10_000
BATCH = 100
SPENT, OTHER = "spent", "other"


class Deployment:
    """One partition's processor over the file log, driven one appended group at a time."""

    def __init__(self, root: Path) -> None:
        self.data = DataDir.create(root)
        self.partition = partition_for(DOMAIN, self.data.partitions)
        self.log = self.data.file_command_log()
        self.outcomes = self.data.outcome_log()
        self.store = Store(self.data.projection(self.partition))
        self.processor = PartitionProcessor(
            self.partition,
            self.data.partitions,
            self.data.file_command_log(),
            self.store,
            self.outcomes,
            keyring=self.data.keyring(),
        )
        self.cursor = self.outcomes.end_offset(REPLY_TO)

    def apply(self, kind: str, body: Record, watch: Stopwatch | None = None) -> Record:
        """Append one command, step until caught up (timed by `watch`), and return its outcome's result."""
        command_id = str(uuid.uuid4())
        self.log.append(self.partition, [encode_command(command_id, f"keyload.command.{kind}", body)])
        if watch is not None:
            watch.start()
        while self.processor.step():
            pass
        if watch is not None:
            watch.stop()
        if self.processor.halt is not None:
            raise BenchError(f"the partition halted: {self.processor.halt}")
        records = self.outcomes.read(REPLY_TO, self.cursor, 100_000)
        self.cursor += len(records)
        for record in records:
            outcome = REGISTRY.decode(OUTCOME, record.value)
            if outcome["command_id"] == command_id:
                if outcome["status"] != "committed":
                    raise BenchError(f"{kind} was refused: {outcome['error_code']} {outcome['detail']}")
                result: Record = outcome["result"][1]
                return result
        raise BenchError(f"no outcome for {kind}")

    def rows(self, incarnations: list[int], families: tuple[bytes, ...]) -> list[tuple[bytes, bytes]]:
        found: list[tuple[bytes, bytes]] = []
        for incarnation in incarnations:
            for family in families:
                prefix = family + keys.u64(incarnation)
                found.extend(self.store.scan(prefix, keys.prefix_end(prefix)))
        return found

    def close(self) -> None:
        self.store.close()
        self.log.close()
        self.outcomes.close()


def enqueue(queue: str, message_id: str) -> Record:
    return {
        "queue": queue,
        "message_id": message_id,
        "body": b"x" * 1024,
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }


def fill_queue(run: Deployment, queue: str, messages: int, settled: int) -> list[int]:
    """A queue of `messages` 1 KiB messages, the first `settled` received and acked; its incarnation."""
    policy = {"max_stored_messages": messages + BATCH, "max_stored_bytes": 2**40, "receive_max_messages": BATCH}
    incarnation: int = run.apply("CreateQueue", {"queue": queue, "policy": _spec(policy)})["incarnation"]
    for first in range(0, messages, BATCH):
        mutations = [
            {"domain": None, "mutation": ("keyload.command.Enqueue", enqueue(queue, f"m{i}"))}
            for i in range(first, min(first + BATCH, messages))
        ]
        run.apply("Batch", {"mutations": mutations})
    acked = 0
    while acked < settled:
        wanted = min(BATCH, settled - acked)
        body = {"queue": queue, "max_messages": wanted, "max_bytes": None, "lease_ms": None, "wait_ms": None}
        tokens = [d["token"] for d in run.apply("Receive", body)["deliveries"]]
        run.apply("AckBatch", {"tokens": tokens})
        acked += len(tokens)
    return [incarnation]


def fill_topic(run: Deployment, topic: str, events: int, settled: int, group: bool = True) -> list[int]:
    """A topic of `events` 1 KiB events and (with `group`) a group that acked the first `settled`;
    the topic's incarnation and the group's."""
    policy = {**default_topic_spec(), "max_retained_events": events + BATCH, "max_retained_bytes": 2**40}
    incarnations: list[int] = [run.apply("CreateTopic", {"topic": topic, "policy": policy})["incarnation"]]
    if group:
        body = {"topic": topic, "group": "g", "filter": {"event_types": [], "headers": {}}, "start": "beginning"}
        created = run.apply("CreateGroup", {**body, "position": None, "policy": default_group_spec()})
        incarnations.append(created["state"]["incarnation"])
    for first in range(0, events, BATCH):
        published = [
            {"event_id": f"e{i}", "type": "t", "headers": {}, "body": b"x" * 1024}
            for i in range(first, min(first + BATCH, events))
        ]
        run.apply("Publish", {"topic": topic, "events": published})
    acked = 0
    while acked < settled:
        wanted = {"max_events": min(BATCH, settled - acked), "max_bytes": None, "lease_ms": None, "wait_ms": None}
        got = run.apply("GroupReceive", {"topic": topic, "group": "g", **wanted})["deliveries"]
        run.apply("GroupAckBatch", {"topic": topic, "group": "g", "tokens": [d["token"] for d in got]})
        acked += len(got)
    return incarnations


def retained_events(run: Deployment, topic: str) -> int:
    raw = run.store.get(keys.topic(DOMAIN, topic))
    return 0 if raw is None else TopicRecord.decode(raw).view.retained_events


@dataclass(frozen=True)
class Kind:
    """A way to leave rows to be removed in bounded steps, and to tell when they are."""

    removed_by: str
    fill: Callable[[Deployment, str, int, int], list[int]]
    families: tuple[bytes, ...]
    remove: Callable[[Deployment, str], Record]
    pending: Callable[[Deployment, str, list[int]], bool]


def _age_out(run: Deployment, topic: str) -> Record:
    return run.apply("ConfigureTopic", {"topic": topic, "policy": {**default_topic_spec(), "max_age_ms": 1}})


KINDS = {
    "queue": Kind(
        "DeleteQueue --force",
        fill_queue,
        QUEUE_FAMILIES,
        lambda run, name: run.apply("DeleteQueue", {"queue": name, "force": True, "expected_incarnation": None}),
        lambda run, name, ids: run.store.get(keys.resource_key(ids[0])) is not None,
    ),
    "topic": Kind(
        "DeleteTopic --force",
        fill_topic,
        TOPIC_FAMILIES + GROUP_FAMILIES,
        lambda run, name: run.apply("DeleteTopic", {"topic": name, "force": True, "expected_incarnation": None}),
        lambda run, name, ids: any(run.store.get(keys.resource_key(i)) is not None for i in ids),
    ),
    "age": Kind(
        "ConfigureTopic max_age_ms=1",
        lambda run, name, events, settled: fill_topic(run, name, events, settled, group=False),
        (keys.EVENT,),
        _age_out,
        lambda run, name, ids: retained_events(run, name) > 0,
    ),
}


def measure(root: Path, kind: Kind, messages: int, settled: int) -> dict[str, Any]:
    if not 0 <= settled <= messages:
        raise BenchError("--settled must be between 0 and --messages")
    run = Deployment(root / "data")
    try:
        run.apply(
            "CreateQueue", {"queue": OTHER, "policy": _spec({"max_stored_messages": 10**7, "max_stored_bytes": 2**40})}
        )
        # (a): Ticks alone remove resource A's rows.
        spent = kind.fill(run, "spent-a", messages, settled)
        rows = run.rows(spent, kind.families)
        kind.remove(run, "spent-a")
        ticks = Stopwatch()
        tick_records = 0
        while kind.pending(run, "spent-a", spent):
            run.apply("Tick", {}, ticks)
            tick_records += 1
        if run.rows(spent, kind.families):
            raise BenchError("the removal ended with rows left")
        # (c): the same again, removed before Enqueues into another queue; then as many Enqueues with nothing to do.
        spent = kind.fill(run, "spent-c", messages, settled)
        kind.remove(run, "spent-c")
        during, after = Stopwatch(), Stopwatch()
        enqueues = 0
        while kind.pending(run, "spent-c", spent):
            run.apply("Enqueue", enqueue(OTHER, f"during-{enqueues}"), during)
            enqueues += 1
        for i in range(enqueues):
            run.apply("Enqueue", enqueue(OTHER, f"after-{i}"), after)
    finally:
        run.close()
    reference = raw_deletes(root / "raw", rows)
    reclaimed = len(rows)
    return {
        "removed_by": kind.removed_by,
        "messages": messages,
        "settled": settled,
        "rows": reclaimed,
        "tick_records": tick_records,
        "rows_per_record_budget": limits.TICK_EXAMINATION_BUDGET,
        "reclamation_rows_per_cpu_s": reclaimed / ticks.cpu_seconds,
        "raw_delete_rows_per_cpu_s": reclaimed / reference.cpu_seconds,
        "ratio": (reclaimed / ticks.cpu_seconds) / (reclaimed / reference.cpu_seconds),
        "enqueue_records": enqueues,
        "enqueue_us_while_reclaiming": during.cpu_seconds / enqueues * 1e6,
        "enqueue_us_after": after.cpu_seconds / enqueues * 1e6,
    }


def raw_deletes(path: Path, rows: list[tuple[bytes, bytes]]) -> Stopwatch:
    """rocksdict alone, with the Store's options: the rows put and the store reopened (untimed), then
    deleted in WriteBatches of the tick examination budget's size (timed)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(path), options)
    for first in range(0, len(rows), 4096):
        batch = WriteBatch(raw_mode=True)
        for key, value in rows[first : first + 4096]:
            batch.put(key, value)
        db.write(batch)
    db.close()
    db = Rdict(str(path), options)
    write_options = WriteOptions()
    write_options.sync = False
    budget = limits.TICK_EXAMINATION_BUDGET
    watch = Stopwatch()
    try:
        watch.start()
        for first in range(0, len(rows), budget):
            batch = WriteBatch(raw_mode=True)
            for key, _ in rows[first : first + budget]:
                batch.delete(key)
            db.write(batch, write_options)
        watch.stop()
    finally:
        db.close()
    return watch


def _spec(fields: dict[str, Any]) -> Record:
    return {**default_spec(), **fields}


def table(result: dict[str, Any], env: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"bench.reclamation: {result['messages']} messages (events) of 1 KiB, {result['settled']} acked, "
            f"{result['removed_by']}; {env['cpus']} CPUs, load {env['load_average_1m']:.2f}",
            "",
            "| | rows | records | rows/CPU-s | ratio |",
            "|---|---:|---:|---:|---:|",
            f"| (a) reclamation (Ticks) | {result['rows']:,} | {result['tick_records']:,} "
            f"| {result['reclamation_rows_per_cpu_s']:,.0f} | {result['ratio']:.2f} |",
            f"| (b) raw deletes | {result['rows']:,} | - | {result['raw_delete_rows_per_cpu_s']:,.0f} | 1 |",
            "",
            f"(c) an Enqueue record ({result['enqueue_records']} of each): "
            f"{result['enqueue_us_while_reclaiming']:,.0f} µs CPU with a reclamation step before it, "
            f"{result['enqueue_us_after']:,.0f} µs without",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reclamation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=sorted(KINDS), default="queue", help="what leaves the rows (default queue)")
    parser.add_argument(
        "--messages", type=int, default=DEFAULT_MESSAGES, help="messages or events of A (default %(default)s)"
    )
    parser.add_argument(
        "--settled",
        type=int,
        default=None,
        help=f"of them acked first (default {DEFAULT_SETTLED}; age: 0, it has no group)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory (default: $TMPDIR)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="keyload-bench-", dir=args.dir))
    try:
        settled = (0 if args.kind == "age" else DEFAULT_SETTLED) if args.settled is None else args.settled
        if args.kind == "age" and settled:
            raise BenchError("--kind age has no group: --settled must be 0")
        result = measure(root, KINDS[args.kind], args.messages, settled)
        env = environment(0, root)
        print(
            json.dumps({"benchmark": "bench.reclamation", **result, "environment": env}, indent=2)
            if args.json
            else table(result, env)
        )
    except BenchError as exc:
        print(f"bench.reclamation: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
