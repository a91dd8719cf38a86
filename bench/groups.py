"""Publish → group delivery → ack cycle throughput, with receive batches of 1 and 100, against raw references.

    python -m bench.groups [--events N] [--body-bytes B] [--window W] [--repeat R] [--json]

For each cycle (GroupReceive 1 + GroupAck each; GroupReceive 100 + one GroupAckBatch
per receive; GroupReceive 100 + GroupAck each), a fresh data directory, one topic and
one subscription group on it that takes every event. In rounds of W events, the
harness plays publishers and one group's consumers against the file log (default
fsync policy) while a PartitionProcessor applies it with the outcome stream on:

    append ceil(W / 100) Publishes of ≤ 100 events  → step the processor until caught up   [timed]
    append ceil(W / k) GroupReceives                 → step                                 [timed]
    read the tokens from the GroupReceive outcomes on the outcome stream
    append the GroupAcks / GroupAckBatches           → step                                 [timed]

Only the step() loops are timed, as in bench.cycle, whose docstring describes the
references measured after them: (b) replay, (c) raw writes, (d) raw read + decode.

Every rate is events per second: an event's share of its publish, receive and ack.
bench/README.md explains the columns and ratios.
"""

from __future__ import annotations

import sys
from typing import Any

from keyload import limits
from keyload.log.codec import REGISTRY, Record
from keyload.processors.policy import GROUP_INTEGER_FIELDS, TOPIC_INTEGER_FIELDS, default_group_spec
from keyload.projections import keys

from .common import (
    DOMAIN,
    BenchError,
    Cycle,
    CycleResult,
    Defaults,
    Driver,
    Settle,
    Unit,
    chosen_cycles,
    cycle_parser,
    cycles_json,
    cycles_table,
    run_cycles,
)

CREATE_TOPIC = "keyload.command.CreateTopic"
PUBLISH = "keyload.command.Publish"
CREATE_GROUP = "keyload.command.CreateGroup"
GROUP_RECEIVE = "keyload.command.GroupReceive"
GROUP_ACK = "keyload.command.GroupAck"
GROUP_ACK_BATCH = "keyload.command.GroupAckBatch"
TOPIC_RECORD = "keyload.TopicRecord"
GROUP_RECORD = "keyload.GroupRecord"

TOPIC = "bench-topic"
GROUP = "bench-group"
EVENT_TYPE = "bench.event"
DEFAULTS = Defaults(count=20_000, body_bytes=1024, window=500, warmup=1_000)
LEASE_MS = 600_000  # no lease may expire mid-round, even under the profiler
EVENTS = Unit("event", "events", "ev")
KIND_HEADINGS = {"publish": "pub µs", "receive": "recv µs", "ack": "ack µs"}

CYCLES = (
    Cycle("1", "receive 1, GroupAck each", 1, Settle.ACK),
    Cycle("100", "receive 100, GroupAckBatch", 100, Settle.ACK_BATCH),
    Cycle("100-ack", "receive 100, GroupAck each", 100, Settle.ACK),
)


def publish_batch(body_bytes: int) -> int:
    """Events per Publish: the most one may carry, unless their bodies together would pass its byte limit."""
    if body_bytes == 0:
        return limits.MAX_PUBLISH_EVENTS
    return min(limits.MAX_PUBLISH_EVENTS, limits.MAX_PUBLISH_BODY_BYTES // body_bytes)


def charged_bytes(body_bytes: int) -> int:
    """What one event counts against the topic's max_retained_bytes: its body and type (no headers)."""
    return body_bytes + len(EVENT_TYPE.encode("utf-8"))


def topic_policy(events: int, body_bytes: int) -> Record:
    """Room for every event of the run: nothing is purged, so the topic retains them all."""
    return {"max_retained_events": events, "max_retained_bytes": events * charged_bytes(body_bytes)}


def group_policy(window: int) -> Record:
    return {
        **default_group_spec(),
        "max_window": window,  # a round's events are the most that are ever outstanding
        "lease_ms": LEASE_MS,
    }


def event(event_id: str, payload: bytes) -> Record:
    return {"event_id": event_id, "type": EVENT_TYPE, "headers": {}, "body": payload}


class GroupDriver(Driver):
    """One topic with one group on it: publishers publish, the group's consumers receive and ack."""

    kinds = tuple(KIND_HEADINGS)

    def setup(self, count: int, window: int) -> None:
        self.tail = 0  # the topic's last position, as the Publish outcomes report it
        self.submit(None, [(CREATE_TOPIC, {"topic": TOPIC, "policy": topic_policy(count, self.body_bytes)})])
        group: Record = {
            "topic": TOPIC,
            "group": GROUP,
            "filter": {"event_types": [], "headers": {}},  # every event matches
            "start": "beginning",
            "position": None,
            "policy": group_policy(window),
        }
        self.submit(None, [(CREATE_GROUP, group)])
        self.start_recording()

    def _round(self, count: int) -> None:
        events = [event(self.new_id(), self.rng.randbytes(self.body_bytes)) for _ in range(count)]
        batch = publish_batch(self.body_bytes)
        publishes = [
            (PUBLISH, {"topic": TOPIC, "events": events[first : first + batch]}) for first in range(0, count, batch)
        ]
        published = [
            item["position"] for outcome in self.submit("publish", publishes) for item in outcome["result"][1]["events"]
        ]
        expected = list(range(self.tail + 1, self.tail + count + 1))
        if published != expected:
            raise BenchError(f"the round's events were not published at positions {expected[0]}..{expected[-1]}")
        self.tail += count

        batches: list[list[str]] = []  # the tokens of each GroupReceive that delivered any
        delivered: list[Record] = []
        while len(delivered) < count:
            wanted = count - len(delivered)
            receives = -(-wanted // self.cycle.receive_max)
            body = {
                "topic": TOPIC,
                "group": GROUP,
                "max_events": self.cycle.receive_max,
                "max_bytes": limits.MAX_GROUP_RECEIVE_BYTES,
                "lease_ms": None,  # the group's: LEASE_MS
            }
            before = len(delivered)
            for outcome in self.submit("receive", [(GROUP_RECEIVE, body)] * receives):
                deliveries = outcome["result"][1]["deliveries"]
                if deliveries:
                    batches.append([delivery["token"] for delivery in deliveries])
                    delivered += deliveries
            if len(delivered) == before:
                raise BenchError(f"group receives delivered nothing with {wanted} events published and not delivered")
        if (
            [delivery["position"] for delivery in delivered] != expected
            or [(delivery["event_id"], delivery["body"]) for delivery in delivered]
            != [(item["event_id"], item["body"]) for item in events]
            or any(delivery["attempts"] != 1 for delivery in delivered)
        ):
            raise BenchError("the round's events were not delivered once each in position order")
        del delivered

        acks: list[tuple[str, Record]]
        if self.cycle.settle is Settle.ACK_BATCH:
            acks = [
                (
                    GROUP_ACK_BATCH,
                    {"topic": TOPIC, "group": GROUP, "tokens": tokens[first : first + limits.MAX_ACK_BATCH]},
                )
                for tokens in batches
                for first in range(0, len(tokens), limits.MAX_ACK_BATCH)
            ]
        else:
            acks = [
                (GROUP_ACK, {"topic": TOPIC, "group": GROUP, "token": token}) for tokens in batches for token in tokens
            ]
        acked: list[int] = []
        checkpoint = 0
        for outcome in self.submit("ack", acks):
            result = outcome["result"][1]
            if self.cycle.settle is Settle.ACK_BATCH:
                refused = [item for item in result["results"] if item["status"] != "committed"]
                if refused:
                    raise BenchError(f"GroupAckBatch refused {len(refused)} tokens: {refused[0]['error_code']}")
                acked += [item["position"] for item in result["results"]]
            else:
                if result["state"] != "acked":
                    raise BenchError(f"a GroupAck left position {result['position']} {result['state']}")
                acked.append(result["position"])
            checkpoint = result["checkpoint"]
        if acked != expected:
            raise BenchError("the acks did not resolve the round's positions once each, in order")
        if checkpoint != self.tail:
            raise BenchError(f"the group's checkpoint is {checkpoint} with every position through {self.tail} acked")

    def check_drained(self, events: int) -> None:
        """Every event published, delivered once and acked; nothing outstanding (not timed)."""
        raw = self.store.get(keys.topic(DOMAIN, TOPIC))
        if raw is None:
            raise BenchError("the topic record is missing")
        topic = REGISTRY.decode(TOPIC_RECORD, raw)["view"]
        raw = self.store.get(keys.group(topic["incarnation"], GROUP))
        if raw is None:
            raise BenchError("the group record is missing")
        group = REGISTRY.decode(GROUP_RECORD, raw)["view"]
        drained = {
            ("topic", "tail"): events,
            ("topic", "published_total"): events,
            ("group", "checkpoint"): events,
            ("group", "issued"): events,
            ("group", "outstanding"): 0,
            ("group", "redeliverable"): 0,
            ("group", "parked_count"): 0,
            ("group", "delivered_total"): events,
            ("group", "acked_total"): events,
            ("group", "filtered_total"): 0,
        }
        views = {"topic": topic, "group": group}
        wrong = {
            f"{view}.{name}": views[view][name] for (view, name), value in drained.items() if views[view][name] != value
        }
        if wrong:
            raise BenchError(f"topic and group after the run: {wrong}, expected {events} published and acked")


# -- reporting -------------------------------------------------------------------------


def to_json(
    results: list[CycleResult], body_bytes: int, window: int, repeats: int, env: dict[str, Any]
) -> dict[str, Any]:
    return {
        "benchmark": "bench.groups",
        "events": results[0].count,
        "partitions": results[0].partitions,
        "body_bytes": body_bytes,
        "window": window,
        "publish_batch": publish_batch(body_bytes),
        "repeats": repeats,
        "cycles": cycles_json(results, EVENTS),
        "environment": env,
    }


def table(results: list[CycleResult], body_bytes: int, window: int, repeats: int, env: dict[str, Any]) -> str:
    first = results[0]
    warmup = env["warmup_commands"]
    lines = [
        f"keyload bench.groups: {first.count} events per cycle, body {body_bytes} B, rounds of {window} events, "
        f"Publishes of {publish_batch(body_bytes)}, 1 topic + 1 group in 1 domain (1 of {first.partitions} partitions)",
        f"python {env['python']}, fastavro {env['fastavro']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus, "
        f"load {env['load_average_1m']:.2f}; {f'best of {repeats}' if repeats > 1 else '1 run'}; "
        + (f"warm-up of {warmup} events per cycle excluded" if warmup else "COLD START (no warm-up)"),
        "(a) = PartitionProcessor.step() loops only; rates are events/s; µs = thread CPU per event",
        "",
        *cycles_table(results, EVENTS, KIND_HEADINGS),
    ]
    return "\n".join(lines)


def _check_sizes(events: int, body_bytes: int, window: int) -> None:
    if events < 1:
        raise BenchError("--events must be >= 1")
    if not 0 <= body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        raise BenchError(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    if events > TOPIC_INTEGER_FIELDS["max_retained_events"].maximum:
        raise BenchError("--events exceeds the largest max_retained_events a topic may have")
    if events * charged_bytes(body_bytes) > TOPIC_INTEGER_FIELDS["max_retained_bytes"].maximum:
        raise BenchError("--events x --body-bytes exceeds the largest max_retained_bytes a topic may have")
    if not 1 <= window <= GROUP_INTEGER_FIELDS["max_window"].maximum:
        raise BenchError(f"--window must be 1..{GROUP_INTEGER_FIELDS['max_window'].maximum} (the largest max_window)")


def main(argv: list[str] | None = None) -> int:
    parser = cycle_parser("python -m bench.groups", __doc__.split("\n\n")[0], EVENTS, CYCLES, DEFAULTS, repeat=True)
    args = parser.parse_args(argv)
    cycles = chosen_cycles(parser, args, CYCLES, _check_sizes)
    return run_cycles(
        "bench.groups",
        args,
        CYCLES,
        cycles,
        EVENTS,
        lambda root, cycle: GroupDriver(root, cycle, args.body_bytes, feature_level=args.feature_level),
        lambda results, env: to_json(results, args.body_bytes, args.window, args.repeat, env),
        lambda results, env: table(results, args.body_bytes, args.window, args.repeat, env),
    )


if __name__ == "__main__":
    sys.exit(main())
