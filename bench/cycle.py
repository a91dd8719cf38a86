"""Enqueue → receive → ack or complete cycle throughput, receive batches of 1 and 100, against raw references.

    python -m bench.cycle [--messages N] [--body-bytes B] [--window W] [--json]

For each cycle (receive 1 + Ack each; receive 100 + one AckBatch per receive;
receive 100 + Ack each; receive 1 + CompleteProcessing each, without effects;
receive 100 + CompleteProcessing each with one PutDocument of the message body), a
fresh data directory and one queue. In rounds of W messages, the harness plays
producers and consumers against the file log (default fsync policy) while a
PartitionProcessor applies it with the outcome stream on:

    append W Enqueues            → step the processor until caught up   [timed]
    append ceil(W / k) Receives  → step                                 [timed]
    read the deliveries from the Receive outcomes on the outcome stream
    append the settles: Acks / AckBatches / CompleteProcessings → step  [timed]

Only the step() loops are timed (thread CPU and wall). Command encoding, appends and
their fsyncs, outcome reading and every check are the harness's and are not. Then:

(b) replay: recovery.replay() of the cycle's log into an empty directory (digest must equal (a)'s).
(c) raw writes: the exact WriteBatches (a) committed, rebuilt as Store.commit builds them,
            written with rocksdict alone into a fresh Rdict with the Store's options.
(d) raw read + decode: FileLog.read() of the same records in (a)'s groups, REGISTRY.decode of each.

Every rate is messages per second: a message's share of its enqueue, receive and settle.
bench/README.md explains the columns and ratios.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from keyload import limits
from keyload.log.codec import REGISTRY, Record
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
    Settle,
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
COMPLETE_PROCESSING = "keyload.command.CompleteProcessing"
PUT_DOCUMENT = "keyload.command.PutDocument"
PROCESSING_RESULT = "keyload.result.ProcessingResult"
DOCUMENT_RESULT = "keyload.result.DocumentResult"
QUEUE_RECORD = "keyload.QueueRecord"
DOCUMENT_RECORD = "keyload.DocumentRecord"
HANDLER_SCOPE = "bench-handler"

DEFAULTS = Defaults(count=20_000, body_bytes=1024, window=500, warmup=1_000)
LEASE_MS = 600_000  # no lease may expire mid-round, even under the profiler
MESSAGES = Unit("message", "messages", "msg")
# "settle" is the ack step: an Ack, an AckBatch's share or a CompleteProcessing per message
KIND_HEADINGS = {"enqueue": "enq µs", "receive": "recv µs", "settle": "settle µs"}
COMPLETES = (Settle.COMPLETE, Settle.COMPLETE_DOC)

CYCLES = (
    Cycle("1", "receive 1, Ack each", 1, Settle.ACK),
    Cycle("100", "receive 100, AckBatch", 100, Settle.ACK_BATCH),
    Cycle("100-ack", "receive 100, Ack each", 100, Settle.ACK),
    Cycle("complete-1", "receive 1, Complete each", 1, Settle.COMPLETE),
    Cycle("complete-doc", "receive 100, Complete+PutDocument", 100, Settle.COMPLETE_DOC),
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
    """One queue: producers enqueue, consumers receive and settle (ack, or complete exactly once)."""

    kinds = tuple(KIND_HEADINGS)

    def setup(self, count: int, window: int) -> None:
        policy = policy_for(count, self.body_bytes, window)
        self.submit(None, [(CREATE_QUEUE, {"queue": QUEUE, "policy": policy})])
        self.documents: dict[str, bytes] = {}  # complete-doc: each document's key → SHA-256 of its message's body
        self.start_recording()

    def _round(self, count: int) -> None:
        enqueues = []
        for _ in range(count):
            message_id = self.new_id()
            enqueues.append((ENQUEUE, enqueue_body(message_id, self.rng.randbytes(self.body_bytes))))
        self.submit("enqueue", enqueues)
        expected = [body["message_id"] for _, body in enqueues]
        if self.cycle.settle is Settle.COMPLETE_DOC:
            self.documents.update((document_key(body["message_id"]), sha256(body["body"])) for _, body in enqueues)

        batches: list[list[Record]] = []  # the deliveries of each Receive that delivered any
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
                    batches.append(deliveries)
                    delivered += [delivery["message_id"] for delivery in deliveries]
            if len(delivered) == before:
                raise BenchError(f"receives delivered nothing with {wanted} messages ready")
        if delivered != expected:
            raise BenchError("the round's messages were not delivered once each in FIFO order")

        settles = self.settles(batches)
        for (_, body), outcome in zip(settles, self.submit("settle", settles), strict=True):
            self.check_settled(body, outcome)

    def settles(self, batches: list[list[Record]]) -> list[tuple[str, Record]]:
        """The commands that settle a round's deliveries (given per Receive), as the cycle's Settle says."""
        settle = self.cycle.settle
        if settle is Settle.ACK_BATCH:
            return [
                (
                    ACK_BATCH,
                    {"tokens": [delivery["token"] for delivery in deliveries[first : first + limits.MAX_ACK_BATCH]]},
                )
                for deliveries in batches
                for first in range(0, len(deliveries), limits.MAX_ACK_BATCH)
            ]
        every = [delivery for deliveries in batches for delivery in deliveries]
        if settle is Settle.ACK:
            return [(ACK, {"token": delivery["token"]}) for delivery in every]
        return [(COMPLETE_PROCESSING, complete_body(delivery, settle is Settle.COMPLETE_DOC)) for delivery in every]

    def check_settled(self, body: Record, outcome: Record) -> None:
        """The committed outcome of one settle command is what that command should have done."""
        kind, result = outcome["result"]
        settle = self.cycle.settle
        if settle is Settle.ACK_BATCH:
            refused = [item for item in result["results"] if item["status"] != "committed"]
            if refused:
                raise BenchError(f"AckBatch refused {len(refused)} tokens: {refused[0]['error_code']}")
        elif settle is Settle.ACK:
            if result["state"] != "acked":
                raise BenchError(f"an Ack left its message {result['state']}")
        else:
            effects = [
                (DOCUMENT_RESULT, {"key": put["key"], "revision": 1, "deleted": False})
                for _, put in (effect["mutation"] for effect in body["effects"])
            ]
            if (
                kind != PROCESSING_RESULT
                or result["already_processed"]
                or result["command_id"] != outcome["command_id"]
            ):
                raise BenchError(f"a CompleteProcessing at offset {outcome['offset']} returned {kind} {result}")
            if result["results"]["results"] != effects:
                raise BenchError(f"a CompleteProcessing's effects returned {result['results']}, expected {effects}")

    def check_drained(self, messages: int) -> None:
        """Every message acked, nothing stored, leased or ready; an inbox entry per message for the
        complete cycles, and for complete-doc each message's body as its document (not timed)."""
        raw = self.store.get(keys.queue(DOMAIN, QUEUE))
        if raw is None:
            raise BenchError("the queue record is missing")
        counters = REGISTRY.decode(QUEUE_RECORD, raw)["view"]["counters"]
        drained = {"acked_total": messages, "stored_messages": 0, "stored_bytes": 0, "leased": 0, "ready": 0}
        wrong = {name: counters[name] for name, value in drained.items() if counters[name] != value}
        if wrong:
            raise BenchError(f"queue counters after the run: {wrong}, expected {drained}")
        entries = sum(1 for _ in self.store.scan(keys.INBOX_ENTRY, keys.prefix_end(keys.INBOX_ENTRY)))
        if entries != (messages if self.cycle.settle in COMPLETES else 0):
            raise BenchError(f"{entries} inbox entries after {messages} messages settled by {self.cycle.settle.value}")
        documents = {}
        for row, value in self.store.scan(keys.DOCUMENT, keys.prefix_end(keys.DOCUMENT)):
            document = REGISTRY.decode(DOCUMENT_RECORD, value)
            documents[keys.document_key(row)] = (sha256(document["value"]), document["revision"], document["deleted"])
        if len(documents) != len(self.documents):
            raise BenchError(f"{len(documents)} documents after the run, expected {len(self.documents)}")
        if documents != {key: (digest, 1, False) for key, digest in self.documents.items()}:
            raise BenchError("the documents are not the messages' bodies, each at revision 1")


def document_key(message_id: str) -> str:
    return f"order/{message_id}"


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def complete_body(delivery: Record, put_document: bool) -> Record:
    """CompleteProcessing of a delivery; with `put_document`, its one effect writes the body as a new document."""
    put = {"key": document_key(delivery["message_id"]), "value": delivery["body"], "expected_revision": 0}
    return {
        "token": delivery["token"],
        "handler_scope": HANDLER_SCOPE,
        "execution_generation": 0,
        "effects": [{"domain": None, "mutation": (PUT_DOCUMENT, put)}] if put_document else [],
        "topic": None,
        "group": None,
    }


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
        lambda root, cycle: QueueDriver(root, cycle, args.body_bytes, feature_level=args.feature_level),
        lambda results, env: to_json(results, args.body_bytes, args.window, env),
        lambda results, env: table(results, args.body_bytes, args.window, env),
    )


if __name__ == "__main__":
    sys.exit(main())
