"""Enqueue → receive → ack cycle throughput, with receive batches of 1 and 100, against raw references.

    python -m bench.cycle [--messages N] [--body-bytes B] [--window W] [--json]

For each cycle (receive 1 + Ack each; receive 100 + one AckBatch per receive;
receive 100 + Ack each), a fresh data directory and one queue. In rounds of W
messages, the harness plays producers and consumers against the file log (default
fsync policy) while a PartitionProcessor applies it with the outcome stream on:

    append W Enqueues            → step the processor until caught up   [timed]
    append ceil(W / k) Receives  → step                                 [timed]
    read the tokens from the Receive outcomes on the outcome stream
    append the Acks / AckBatches → step                                 [timed]

Only the step() loops are timed (thread CPU and wall). Command encoding, appends and
their fsyncs, outcome reading and every check are the harness's and are not. Then:

(b) replay: recovery.replay() of the cycle's log into an empty directory (digest must equal (a)'s).
(c) raw writes: the exact WriteBatches (a) committed, rebuilt as Store.commit builds them,
            written with rocksdict alone into a fresh Rdict with the Store's options.
(d) raw read + decode: FileLog.read() of the same records in (a)'s groups, REGISTRY.decode of each.

Every rate is messages per second: a message's share of its enqueue, receive and ack.
bench/README.md explains the columns and ratios.
"""

from __future__ import annotations

import sys
from typing import Any

from keyload.log.codec import REGISTRY
from keyload.processors import limits
from keyload.processors.policy import INTEGER_FIELDS, default_spec
from keyload.projections import keys

from .common import (
    DOMAIN,
    QUEUE,
    BenchError,
    Cycle,
    CycleResult,
    Defaults,
    Driver,
    Record,
    Unit,
    chosen_cycles,
    cycle_parser,
    cycles_json,
    cycles_table,
    run_cycles,
)

CREATE_QUEUE = "keyload.command.CreateQueue"
ENQUEUE = "keyload.command.Enqueue"
RECEIVE = "keyload.command.Receive"
ACK = "keyload.command.Ack"
ACK_BATCH = "keyload.command.AckBatch"
QUEUE_RECORD = "keyload.QueueRecord"

DEFAULTS = Defaults(count=20_000, body_bytes=1024, window=500, warmup=1_000)
LEASE_MS = 600_000  # no lease may expire mid-round, even under the profiler
MESSAGES = Unit("message", "messages", "msg")
KIND_HEADINGS = {"enqueue": "enq µs", "receive": "recv µs", "ack": "ack µs"}

CYCLES = (
    Cycle("1", "receive 1, Ack each", 1, False),
    Cycle("100", "receive 100, AckBatch", 100, True),
    Cycle("100-ack", "receive 100, Ack each", 100, False),
)


def policy_for(messages: int, body_bytes: int, window: int) -> Record:
    return {
        **default_spec(),
        "max_stored_messages": messages,
        "max_stored_bytes": max(messages * body_bytes, 1),
        "max_in_flight": window,  # a round's messages are the most that are ever leased
        "receive_max_messages": max(cycle.receive_max for cycle in CYCLES),
        "receive_max_bytes": INTEGER_FIELDS["receive_max_bytes"].maximum,
        "lease_ms": LEASE_MS,
    }


class QueueDriver(Driver):
    """One queue: producers enqueue, consumers receive and ack."""

    kinds = tuple(KIND_HEADINGS)

    def setup(self, count: int, window: int) -> None:
        policy = policy_for(count, self.body_bytes, window)
        self.submit(None, [(CREATE_QUEUE, {"queue": QUEUE, "policy": policy})])
        self.start_recording()

    def _round(self, count: int) -> None:
        enqueues = []
        for _ in range(count):
            message_id = self.new_id()
            enqueues.append((ENQUEUE, enqueue_body(message_id, self.rng.randbytes(self.body_bytes))))
        self.submit("enqueue", enqueues)
        expected = [body["message_id"] for _, body in enqueues]

        batches: list[list[str]] = []  # the tokens of each Receive that delivered any
        delivered: list[str] = []
        while len(delivered) < count:
            wanted = count - len(delivered)
            receives = -(-wanted // self.cycle.receive_max)
            body = {
                "queue": QUEUE,
                "max_messages": self.cycle.receive_max,
                "max_bytes": None,
                "lease_ms": None,
                "wait_ms": None,  # no long poll: the round's messages are ready
            }
            before = len(delivered)
            for outcome in self.submit("receive", [(RECEIVE, body)] * receives):
                deliveries = outcome["result"][1]["deliveries"]
                if deliveries:
                    batches.append([delivery["token"] for delivery in deliveries])
                    delivered += [delivery["message_id"] for delivery in deliveries]
            if len(delivered) == before:
                raise BenchError(f"receives delivered nothing with {wanted} messages ready")
        if delivered != expected:
            raise BenchError("the round's messages were not delivered once each in FIFO order")

        acks: list[tuple[str, Record]]
        if self.cycle.ack_batch:
            acks = [
                (ACK_BATCH, {"tokens": tokens[first : first + limits.MAX_ACK_BATCH]})
                for tokens in batches
                for first in range(0, len(tokens), limits.MAX_ACK_BATCH)
            ]
        else:
            acks = [(ACK, {"token": token}) for tokens in batches for token in tokens]
        for outcome in self.submit("ack", acks):
            result = outcome["result"][1]
            if self.cycle.ack_batch:
                refused = [item for item in result["results"] if item["status"] != "committed"]
                if refused:
                    raise BenchError(f"AckBatch refused {len(refused)} tokens: {refused[0]['error_code']}")
            elif result["state"] != "acked":
                raise BenchError(f"an Ack left its message {result['state']}")

    def check_drained(self, messages: int) -> None:
        """Every message acked, nothing stored, leased or ready (not timed)."""
        raw = self.store.get(keys.queue(DOMAIN, QUEUE))
        if raw is None:
            raise BenchError("the queue record is missing")
        counters = REGISTRY.decode(QUEUE_RECORD, raw)["view"]["counters"]
        drained = {"acked_total": messages, "stored_messages": 0, "stored_bytes": 0, "leased": 0, "ready": 0}
        wrong = {name: counters[name] for name, value in drained.items() if counters[name] != value}
        if wrong:
            raise BenchError(f"queue counters after the run: {wrong}, expected {drained}")


def enqueue_body(message_id: str, payload: bytes) -> Record:
    return {
        "queue": QUEUE,
        "message_id": message_id,
        "body": payload,
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }


# -- reporting -------------------------------------------------------------------------


def to_json(results: list[CycleResult], body_bytes: int, window: int, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "bench.cycle",
        "messages": results[0].count,
        "partitions": results[0].partitions,
        "body_bytes": body_bytes,
        "window": window,
        "cycles": cycles_json(results, MESSAGES),
        "environment": env,
    }


def table(results: list[CycleResult], body_bytes: int, window: int, env: dict[str, Any]) -> str:
    first = results[0]
    warmup = env["warmup_commands"]
    lines = [
        f"keyload bench.cycle: {first.count} messages per cycle, body {body_bytes} B, rounds of {window} messages, "
        f"1 domain (1 of {first.partitions} partitions)",
        f"python {env['python']}, fastavro {env['fastavro']}, rocksdict {env['rocksdict']}, {env['cpus']} cpus, "
        f"load {env['load_average_1m']:.2f}; "
        + (f"warm-up of {warmup} messages per cycle excluded" if warmup else "COLD START (no warm-up)"),
        "(a) = PartitionProcessor.step() loops only; rates are messages/s; µs = thread CPU per message",
        "",
        *cycles_table(results, MESSAGES, KIND_HEADINGS),
    ]
    return "\n".join(lines)


def _check_sizes(messages: int, body_bytes: int, window: int) -> None:
    if messages < 1:
        raise BenchError("--messages must be >= 1")
    if not 0 <= body_bytes <= limits.MAX_INLINE_BODY_BYTES:
        raise BenchError(f"--body-bytes must be 0..{limits.MAX_INLINE_BODY_BYTES}")
    if messages > INTEGER_FIELDS["max_stored_messages"].maximum:
        raise BenchError("--messages exceeds the largest max_stored_messages a queue may have")
    if messages * body_bytes > INTEGER_FIELDS["max_stored_bytes"].maximum:
        raise BenchError("--messages x --body-bytes exceeds the largest max_stored_bytes a queue may have")
    if not 1 <= window <= INTEGER_FIELDS["max_in_flight"].maximum:
        raise BenchError(f"--window must be 1..{INTEGER_FIELDS['max_in_flight'].maximum} (the largest max_in_flight)")


def main(argv: list[str] | None = None) -> int:
    parser = cycle_parser("python -m bench.cycle", __doc__.split("\n\n")[0], MESSAGES, CYCLES, DEFAULTS, repeat=False)
    args = parser.parse_args(argv)
    cycles = chosen_cycles(parser, args, CYCLES, _check_sizes)
    return run_cycles(
        "bench.cycle",
        args,
        CYCLES,
        cycles,
        MESSAGES,
        lambda root, cycle: QueueDriver(root, cycle, args.body_bytes),
        lambda results, env: to_json(results, args.body_bytes, args.window, env),
        lambda results, env: table(results, args.body_bytes, args.window, env),
    )


if __name__ == "__main__":
    sys.exit(main())
