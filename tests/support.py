"""Shared test helpers: build commands, drive processors in-process, run `keyload run`."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import io
import ipaddress
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any, NoReturn

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastavro import parse_schema, schemaless_writer

from keyload.commands import Capability
from keyload.credentials import ADMIN_PRINCIPAL, Credential, contents
from keyload.log.base import CommandLog, LogRecord, partition_for
from keyload.log.codec import HEADER_BYTES, REGISTRY, expanded_current
from keyload.processors.policy import default_group_spec, default_spec, default_topic_spec
from keyload.projections import keys
from keyload.projections.records import Grant
from keyload.projections.store import Store
from keyload.sdk.client import Client
from keyload.sdk.results import Outcome
from keyload.service.access_control import enable_command
from keyload.service.runtime import PartitionProcessor
from keyload.service.ticker import Ticker
from keyload.storage.datadir import DataDir
from keyload.storage.principals import CHECKPOINTER_PRINCIPAL, GC_PRINCIPAL, TICKER_PRINCIPAL, system_credential

CREATE_QUEUE = "keyload.command.CreateQueue"
CONFIGURE_QUEUE = "keyload.command.ConfigureQueue"
ENQUEUE = "keyload.command.Enqueue"
INSPECT_QUEUE = "keyload.command.InspectQueue"
INSPECT_MESSAGE = "keyload.command.InspectMessage"
TICK = "keyload.command.Tick"
CHECKPOINT = "keyload.command.Checkpoint"
CREATE_TOPIC = "keyload.command.CreateTopic"
PUBLISH = "keyload.command.Publish"
READ_TOPIC = "keyload.command.ReadTopic"
INSPECT_TOPIC = "keyload.command.InspectTopic"
PURGE_TOPIC = "keyload.command.PurgeTopic"
CREATE_GROUP = "keyload.command.CreateGroup"
GROUP_RECEIVE = "keyload.command.GroupReceive"
GROUP_ACK = "keyload.command.GroupAck"
GROUP_ACK_BATCH = "keyload.command.GroupAckBatch"
GROUP_NACK = "keyload.command.GroupNack"
GROUP_RENEW = "keyload.command.GroupRenew"
GROUP_STATUS = "keyload.command.GroupStatus"
SEEK_GROUP = "keyload.command.SeekGroup"
CONFIGURE_GROUP = "keyload.command.ConfigureGroup"
PAUSE_GROUP = "keyload.command.PauseGroup"
RESUME_GROUP = "keyload.command.ResumeGroup"
RECEIVE = "keyload.command.Receive"
ACK = "keyload.command.Ack"
NACK = "keyload.command.Nack"
CANCEL = "keyload.command.Cancel"
REDRIVE = "keyload.command.Redrive"
PUT_DOCUMENT = "keyload.command.PutDocument"
DELETE_DOCUMENT = "keyload.command.DeleteDocument"
GET_DOCUMENT = "keyload.command.GetDocument"
LIST_DOCUMENTS = "keyload.command.ListDocuments"
BATCH = "keyload.command.Batch"
COMPLETE_PROCESSING = "keyload.command.CompleteProcessing"
CONFIGURE_INBOX = "keyload.command.ConfigureInbox"
COMMIT_INBOX = "keyload.command.CommitInbox"
RAISE_FEATURE_LEVEL = "keyload.command.RaiseFeatureLevel"
CONFIGURE_DOMAIN = "keyload.command.ConfigureDomain"
CONFIGURE_DOMAIN_CAPS = "keyload.command.ConfigureDomainCaps"
INSPECT_DOMAIN = "keyload.command.InspectDomain"
DELETE_QUEUE = "keyload.command.DeleteQueue"
DELETE_TOPIC = "keyload.command.DeleteTopic"
DELETE_GROUP = "keyload.command.DeleteGroup"


COMMAND = "keyload.Command"


def command(
    domain: str,
    kind: str,
    body: dict[str, Any],
    command_id: str | None = None,
    principal: str = "tester",
    reply_to: int | None = None,
) -> bytes:
    return REGISTRY.encode(
        COMMAND,
        {
            "command_id": command_id or str(uuid.uuid4()),
            "domain": domain,
            "principal": principal,
            "body": (kind, body),
            "reply_to": reply_to,
            "client_time_ms": None,
        },
    )


def signed_command(
    credential: Credential,
    domain: str,
    kind: str,
    body: dict[str, Any],
    command_id: str | None = None,
    reply_to: int | None = None,
) -> bytes:
    """`command` of `credential`'s principal, signed with it: a log record access control accepts."""
    return credential.sign(command(domain, kind, body, command_id, principal=credential.principal, reply_to=reply_to))


def create_queue_body(queue: str, **policy: Any) -> dict[str, Any]:
    return {"queue": queue, "policy": {**default_spec(), **policy}}


def enqueue_body(queue: str, message_id: str, body: bytes = b"x", **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "queue": queue,
        "message_id": message_id,
        "body": body,
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }
    record.update(fields)
    return record


def create_topic_body(topic: str, **policy: Any) -> dict[str, Any]:
    return {"topic": topic, "policy": {**default_topic_spec(), **policy}}


def event(event_id: str, body: bytes = b"x", event_type: str = "t", **headers: str) -> dict[str, Any]:
    return {"event_id": event_id, "type": event_type, "headers": headers, "body": body}


def publish_body(topic: str, *events: dict[str, Any]) -> dict[str, Any]:
    return {"topic": topic, "events": list(events)}


def read_body(
    topic: str,
    from_position: int | None = 1,
    max_events: int | None = None,
    max_bytes: int | None = None,
    cursor: str | None = None,
) -> dict[str, Any]:
    return {
        "topic": topic,
        "from_position": from_position,
        "max_events": max_events,
        "max_bytes": max_bytes,
        "cursor": cursor,
    }


def create_group_body(
    topic: str,
    group: str,
    *,
    event_types: list[str] | None = None,
    headers: dict[str, str] | None = None,
    start: str = "beginning",
    position: int | None = None,
    **policy: Any,
) -> dict[str, Any]:
    return {
        "topic": topic,
        "group": group,
        "filter": {"event_types": event_types or [], "headers": headers or {}},
        "start": start,
        "position": position,
        "policy": {**default_group_spec(), **policy},
    }


def group_receive_body(
    topic: str,
    group: str,
    max_events: int | None = None,
    max_bytes: int | None = None,
    lease_ms: int | None = None,
    wait_ms: int | None = None,
) -> dict[str, Any]:
    return {
        "topic": topic,
        "group": group,
        "max_events": max_events,
        "max_bytes": max_bytes,
        "lease_ms": lease_ms,
        "wait_ms": wait_ms,
    }


def receive_body(queue: str, max_messages: int | None = None, lease_ms: int | None = None) -> dict[str, Any]:
    return {"queue": queue, "max_messages": max_messages, "max_bytes": None, "lease_ms": lease_ms, "wait_ms": None}


def put_document_body(key: str, value: bytes = b"v", expected_revision: int | None = None) -> dict[str, Any]:
    return {"key": key, "value": value, "expected_revision": expected_revision}


def delete_document_body(key: str, expected_revision: int | None = None) -> dict[str, Any]:
    return {"key": key, "expected_revision": expected_revision}


def list_documents_body(
    prefix: str = "", after: str | None = None, max_documents: int | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    return {"prefix": prefix, "after": after, "max_documents": max_documents, "max_bytes": max_bytes}


def mutation(kind: str, body: dict[str, Any], domain: str | None = None) -> dict[str, Any]:
    """A BatchMutation (a Batch's mutation, a processing's effect); `domain` None: the command's own."""
    return {"domain": domain, "mutation": (kind, body)}


def batch_body(*mutations: dict[str, Any]) -> dict[str, Any]:
    return {"mutations": list(mutations)}


def message_fence(queue: str, message_id: str, state_version: int, delivery_generation: int) -> dict[str, Any]:
    """The body of Cancel, Redrive or ParkPending: the message as the operator last saw it."""
    return {
        "queue": queue,
        "message_id": message_id,
        "expected_state_version": state_version,
        "expected_delivery_generation": delivery_generation,
    }


def assert_read_cache_holds_the_store(processor: PartitionProcessor) -> None:
    """What the processor's read cache keeps between groups, rows and decoded records, is what its
    projection holds: no cached record was mutated after it was committed or read."""
    reads = processor.reads
    for key, value in reads._rows.items():
        assert reads.store.get(key) == value, f"read cache row {key!r} differs from the projection's"
    for key, (name, record) in reads._records.items():
        raw = reads.store.get(key)
        assert raw is not None and REGISTRY.decode(name, raw) == record, f"read cache record {key!r} differs"


class Embedded:
    """The embedded deployment driven synchronously: append, then step the processors.

    `clock_ms` is the file log's append clock, so tests control evaluation time.
    """

    def __init__(self, root: Path, partitions: int = 2) -> None:
        from keyload.log.file_log import FileLog, FileLogConfig, FsyncPolicy

        self.now_ms = 1_000_000
        self.data = DataDir.create(root, partitions)
        self.log = FileLog(
            root / "log" / "commands", partitions, FileLogConfig(fsync=FsyncPolicy.NONE), clock_ms=lambda: self.now_ms
        )
        self.outcomes = self.data.outcome_log()
        self.checkpoints = self.data.checkpoints()
        self.stores = [Store(self.data.projection(p)) for p in range(partitions)]
        self.processors = [
            PartitionProcessor(
                p,
                partitions,
                self.log,
                self.stores[p],
                self.outcomes,
                checkpoints=self.checkpoints,
                keyring=self.data.keyring(),
            )
            for p in range(partitions)
        ]

    def partition(self, domain: str) -> int:
        return partition_for(domain, self.data.partitions)

    def ticker(self, interval_ms: int) -> Ticker:
        """The service's ticker over this log, signing as the ticker's principal."""
        return Ticker(self.log, system_credential(self.data.root, TICKER_PRINCIPAL), interval_ms)

    def append(self, domain: str, value: bytes) -> int:
        [position] = self.log.append(self.partition(domain), [value])
        return position.offset

    def run(self) -> None:
        while sum(p.step() for p in self.processors):
            pass
        for processor in self.processors:
            assert_read_cache_holds_the_store(processor)

    def enable_access_control(self) -> Credential:
        """Turn access control on in every partition, as `keyload run` does; the administrator's credential."""
        for partition in range(self.data.partitions):
            self.log.append(partition, [enable_command(self.data.root, partition, self.data.partitions)])
        self.run()
        return system_credential(self.data.root, ADMIN_PRINCIPAL)

    def submit(
        self,
        domain: str,
        kind: str,
        body: dict[str, Any],
        command_id: str | None = None,
        principal: str = "tester",
        credential: Credential | None = None,
    ) -> Outcome:
        """Append, apply, and return the outcome as published to reply partition 0 (sealed or not).
        With a `credential` the command is its principal's, signed with it."""
        command_id = command_id or str(uuid.uuid4())
        cursor = self.outcomes.end_offset(0)
        if credential is None:
            self.append(domain, command(domain, kind, body, command_id, principal=principal, reply_to=0))
        else:
            self.append(domain, signed_command(credential, domain, kind, body, command_id, reply_to=0))
        self.run()
        for record in self.outcomes.read(0, cursor, 1_000):
            decoded = REGISTRY.decode("keyload.Outcome", contents(record.value))
            if decoded["command_id"] == command_id:
                return Outcome.from_record(decoded)
        raise AssertionError(f"no outcome published for {command_id}")

    def store(self, domain: str) -> Store:
        return self.stores[self.partition(domain)]

    def stored_outcome(self, domain: str, command_id: str) -> bytes | None:
        return self.store(domain).get(keys.outcome(domain, command_id))

    def digest(self, domain: str) -> str:
        return self.store(domain).digest()

    def digest_of(self, partition: int) -> str:
        return self.stores[partition].digest()

    def state_digest(self, domain: str) -> str:
        """SHA-256 over the domain's partition projection but what every command moves — the applied
        offset and record, the last time and the stored outcomes: unchanged by a command that has no effect."""
        moved = {keys.APPLIED_OFFSET, keys.LAST_TIME, keys.APPLIED_RECORD}
        digest = hashlib.sha256()
        for key, value in self.store(domain).scan(b"", b"\xff"):
            if key not in moved and key[:1] != keys.OUTCOME:
                digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
        return digest.hexdigest()

    def settled_rows(self, domain: str) -> list[tuple[bytes, bytes]]:
        """The rows of the domain's partition but its position and what commands leave of themselves
        (stored outcomes, receipts and their horizon entries), which differ between one batch command
        and the run of single commands it stands for."""
        moved = {keys.APPLIED_OFFSET, keys.LAST_TIME, keys.APPLIED_RECORD}
        return [
            (key, value)
            for key, value in self.store(domain).scan(b"", b"\xff")
            if key not in moved
            and key[:1] not in (keys.OUTCOME, keys.RECEIPT)
            and not (key[:1] == keys.HORIZON and keys.horizon_row(key) is None)
        ]

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.log.close()
        self.outcomes.close()


def submit_unhalted(
    embedded: Embedded, domain: str, kind: str, body: dict[str, Any], command_id: str | None = None
) -> Outcome:
    """Embedded.submit, asserting that no partition halted on the way."""
    outcome = embedded.submit(domain, kind, body, command_id)
    halted = [p.halt for p in embedded.processors if p.halt is not None]
    assert not halted, halted
    return outcome


def expect(outcome: Outcome, code: str | None) -> Any:
    """A committed outcome's result (`code` None), or check it was rejected with `code`."""
    if code is None:
        assert outcome.status == "committed", outcome
        return outcome.result
    assert (outcome.status, outcome.error_code) == ("rejected", code), outcome
    return None


def pass_time(embedded: Embedded, domain: str, ms: int) -> None:
    """Let log time pass by `ms`: a Tick in `domain`'s partition at the new time fires what is due."""
    embedded.now_ms += ms
    expect(submit_unhalted(embedded, domain, TICK, {}), None)


def family_rows(store: Store, family: bytes) -> int:
    """The rows of one key family (projections/keys.py) in a projection."""
    return sum(1 for _ in store.scan(family, keys.prefix_end(family)))


def close_after_replay_check(embedded: Embedded, directory: Path) -> None:
    """End a model run: partition 0 replayed from offset 0 must reach the live digest; then clean up."""
    import shutil

    from keyload.operations.recovery import replay

    try:
        replayed = replay(embedded.data, 0, directory / "replay", progress=False)
        assert replayed.digest == embedded.digest_of(0)
    finally:
        embedded.close()
        shutil.rmtree(directory, ignore_errors=True)


def assert_replay_equals_live(embedded: Embedded, domain: str, scratch: Path) -> None:
    """The domain's partition rebuilt from offset 0 reaches the live projection's offset and digest."""
    from keyload.operations.recovery import replay

    partition = embedded.partition(domain)
    replayed = replay(embedded.data, partition, scratch / f"replay-{partition}", progress=False)
    live = embedded.stores[partition]
    assert (replayed.applied_offset, replayed.digest) == (live.applied_offset, live.digest())


# The principals whose commands a service appends on its own (a Tick, a checkpoint announcement, a
# retention step): a stop may come between such an append and its apply, left to the next start.
SERVICE_APPENDERS = frozenset({TICKER_PRINCIPAL, CHECKPOINTER_PRINCIPAL, GC_PRINCIPAL})


def records_from(log: CommandLog, partition: int, offset: int) -> list[LogRecord]:
    """The partition's records from `offset` to the log's end."""
    found: list[LogRecord] = []
    end = log.end_offset(partition)
    while offset < end:
        batch = log.read(partition, offset, end - offset)
        found.extend(batch)
        offset = batch[-1].offset + 1
    return found


def assert_live_equals_replay(data: DataDir, scratch: Path) -> None:
    """Each partition's live projection equals a clean replay of its log from offset 0 to the live offset,
    offset and digest (what `keyload drill` checks), and the live projection applied every record of its
    log but the service's own appends that a stop left after it (SERVICE_APPENDERS)."""
    from keyload.operations.recovery import replay

    log = data.command_log()
    try:
        for partition in range(data.partitions):
            live = Store(data.projection(partition), read_only=True)
            try:
                live_state = (live.applied_offset, live.digest())
            finally:
                live.close()
            unapplied = [
                REGISTRY.decode("keyload.Command", contents(record.value))["principal"]
                for record in records_from(log, partition, live_state[0] + 1)
            ]
            assert set(unapplied) <= SERVICE_APPENDERS, f"partition {partition}: left unapplied: {unapplied}"
            replayed = replay(data, partition, scratch / f"replay-{partition}", to_offset=live_state[0], progress=False)
            replayed_state = (replayed.applied_offset, replayed.digest)
            assert live_state == replayed_state, f"partition {partition}: live {live_state}, replayed {replayed_state}"
    finally:
        log.close()


def keyload_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "keyload.cli", *args]


def run_keyload(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(keyload_command(*args), capture_output=True, text=True, timeout=timeout)


def spread_domains(count: int, partitions: int) -> list[str]:
    """`count` (>= partitions) domain names that between them land on every partition."""
    chosen: list[str] = []
    covered: set[int] = set()
    n = 0
    while len(chosen) < count:
        name = f"tenant-{n}"
        n += 1
        partition = partition_for(name, partitions)
        if partition not in covered or len(covered) == partitions:
            chosen.append(name)
            covered.add(partition)
    return chosen


SERVICE_START_TIMEOUT_S = 120.0  # a Kafka service's first start on a loaded machine takes seconds, never this long


def start_service(
    data: Path, *args: str, open_files: int | None = None, output: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `keyload run` over `data` and wait until it serves (with `open_files`: under that hard
    limit of open files; with `output`: every line it writes is appended there as it comes).

    Its stderr is merged into its stdout, and librdkafka writes log lines of its own there (such as
    "%6|...|BGQUEUE|...| Purging 1 unserved events from background queue" when an admin client goes away):
    those may come before the serving line, and are passed over. A service that does not serve within
    SERVICE_START_TIMEOUT_S is killed and the test fails with its output, rather than hanging. A service
    that serves the HTTP API (every one unless `--listen none`) is waited for until the API listens."""
    command = keyload_command("run", "--data", str(data), *args)
    limited = [] if open_files is None else ["prlimit", f"--nofile=64:{open_files}", "--"]
    process = subprocess.Popen([*limited, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def read(stdout: IO[bytes]) -> None:  # drains the pipe for good: a full pipe would block the service
        for raw in stdout:
            lines.put(raw.decode())
            if output is not None:
                output.append(raw.decode())
        lines.put("")  # the service's output ended

    threading.Thread(target=read, args=(process.stdout,), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + SERVICE_START_TIMEOUT_S

    def next_line() -> str:
        """The service's next line of its own (librdkafka's are passed over)."""
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                process.kill()
                process.wait()
                raise AssertionError(
                    f"keyload run did not serve in {SERVICE_START_TIMEOUT_S} s:\n{''.join(seen)}"
                ) from None
            seen.append(line)
            if not re.match(r"%\d\|", line):
                return line

    assert next_line().startswith("keyload: serving"), "".join(seen)
    listen = args[args.index("--listen") + 1] if "--listen" in args else os.environ.get("KEYLOAD_LISTEN")
    if listen != "none":  # serving includes the HTTP API, which says so once it listens
        assert next_line().startswith("keyload: HTTP API on"), "".join(seen)
    return process


def create_principals(root: Path, *names: str) -> None:
    """Create the principals `names`, each with its credential file DATA/credentials/NAME.json, as the
    administrator of the data directory `root` served by `keyload run` (which turns access control on):
    each may do everything on every domain but what only the service's own principals and the
    administrator may (admin, tick, recovery). Call it after the service serves, before a client of
    one of them (`Client(root, principal=NAME)`) sends its first command."""
    reserved = {Capability.admin, Capability.tick, Capability.recovery}
    grants = [Grant(capability=capability, domain="*") for capability in Capability if capability not in reserved]
    with Client(root) as administrator:
        for name in names:
            administrator.create_principal(name, grants)


def stop_service(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    finally:
        if process.poll() is None:
            process.kill()


def wait_until(predicate: Any, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- a foreign writer ------------------------------------------------------------------------------


def _widened(node: Any) -> Any:
    """A schema with every int a long: the same varint on the wire, so the same bytes for values
    that fit, and 64-bit values where a foreign writer put them."""
    if isinstance(node, str):
        return "long" if node == "int" else node
    if isinstance(node, list):
        return [_widened(branch) for branch in node]
    if node.get("type") == "record":
        return dict(node, fields=[dict(f, type=_widened(f["type"])) for f in node["fields"]])
    if node.get("type") == "array":
        return dict(node, items=_widened(node["items"]))
    if node.get("type") == "map":
        return dict(node, values=_widened(node["values"]))
    if node.get("type") == "int":
        return dict(node, type="long")
    return node


_WIDE_COMMAND = parse_schema(_widened(expanded_current(COMMAND)))
SAMPLE_COMMAND: dict[str, Any] = {  # any Command: what its single-object header holds is the schema's
    "command_id": "x",
    "domain": "d",
    "principal": "p",
    "body": ("keyload.command.Tick", {}),
    "reply_to": None,
    "client_time_ms": None,
}
_COMMAND_HEADER = REGISTRY.encode(COMMAND, SAMPLE_COMMAND)[:HEADER_BYTES]  # the schema's fingerprint


def wide_command(envelope: dict[str, Any]) -> bytes:
    """A Command record as a writer that does not check ranges writes it: any 64-bit value in an int
    field (the registry's encoder refuses those)."""
    out = io.BytesIO()
    out.write(_COMMAND_HEADER)
    schemaless_writer(out, _WIDE_COMMAND, envelope)
    return out.getvalue()


def free_port() -> int:
    """A loopback port nothing listens on now: for a service that must come back on the same one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def served_url(root: Path, timeout_s: float = SERVICE_START_TIMEOUT_S) -> str:
    """The URL of the HTTP API `keyload run` serves for `root` (DATA/server.json, written once it listens)."""
    address = root / "server.json"
    wait_until(address.exists, timeout_s, f"{address}")
    url: str = json.loads(address.read_text())["url"]
    return url


def bearer(root: Path, principal: str = ADMIN_PRINCIPAL) -> dict[str, str]:
    """The Authorization header of `principal` (its credential file in DATA/credentials)."""
    credential = Credential.load(root / "credentials" / f"{principal}.json")
    return {"Authorization": f"Bearer {credential.bearer_token}"}


def unavailable_in_ci(what: str, reason: str) -> NoReturn:
    """Fail under CI, where a missing `what` (a Kafka broker, an S3 server, Node.js) is a broken setup;
    skip elsewhere, saying why."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"no {what} for the tests: {reason}", pytrace=False)
    pytest.skip(f"no {what}: {reason}")


RETRY_PAUSE_S = 0.1  # between a producer's tries of one command while the service is away


async def race_under_one_key(url: str, headers: dict[str, str], queue: str, rounds: int) -> None:
    """`rounds` times, three enqueues to the queue at path `queue` sent at once under one new
    Idempotency-Key: a, b and a again (a and b other messages). Exactly one of a and b is
    enqueued (200) and the other is a 409 Conflict; the second a gets the first a's answer."""
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        for n in range(rounds):
            key = {"Idempotency-Key": f"race-{n}-{uuid.uuid4().hex[:8]}"}
            sent = [
                client.post(f"{queue}/messages", json={"message_id": f"m{n}-{side}", "body": "eA=="}, headers=key)
                for side in "aba"
            ]
            answers = [
                (r.status_code, (r.json()["result"] or {}).get("message_id", r.json()["error_code"]))
                for r in await asyncio.gather(*sent)
            ]
            assert answers in (
                [(200, f"m{n}-a"), (409, "Conflict"), (200, f"m{n}-a")],
                [(409, "Conflict"), (200, f"m{n}-b"), (409, "Conflict")],
            ), (n, answers)


def enqueue_retrying(client: Client, domain: str, queue: str, message_id: str, give_up_s: float) -> int:
    """Enqueue `message_id` (also its command id, so a retry is the same command) through a service
    that may be killed and started again meanwhile, retrying while it is away or does not answer in
    time; the number of retries. AssertionError naming the message after `give_up_s`."""
    from keyload.errors import OutcomeTimeout, ServiceUnavailable

    deadline = time.monotonic() + give_up_s
    retries = 0
    while True:
        try:
            client.enqueue(domain, queue, message_id.encode(), message_id=message_id, command_id=message_id)
            return retries
        except (ServiceUnavailable, OutcomeTimeout):
            retries += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{domain} {message_id}: no answer in {give_up_s} s") from None
            time.sleep(RETRY_PAUSE_S)


def assert_each_enqueued_once(admin: Client, domain: str, queue: str, producers: int, messages: int) -> None:
    """The queue holds message p{P}-{N} (its body its id) of every producer P and number N once each:
    none lost, none twice (it is received to the end to look)."""
    counters = admin.inspect_queue(domain, queue).counters
    assert (counters.enqueued_total, counters.stored_messages) == (producers * messages,) * 2
    seen: list[bytes] = []
    while batch := admin.receive(domain, queue, max_messages=10).deliveries:
        seen += [delivery.body for delivery in batch]
    assert sorted(seen) == sorted(f"p{p}-{n}".encode() for p in range(producers) for n in range(messages))


def outcome_json(**fields: Any) -> dict[str, Any]:
    """An Outcome in the HTTP API's JSON form (keyload/wire.py), committed at offset 7 with no result;
    `fields` replace or add members (as a newer server's may)."""
    return {
        "command_id": "c-1",
        "domain": "shop",
        "partition": 0,
        "offset": 7,
        "eval_time_ms": 1,
        "status": "committed",
        "error_code": None,
        "detail": "",
        "result": None,
        "failed_index": None,
        **fields,
    }


def self_signed(folder: Path, passphrase: bytes | None = None) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files (the key encrypted with `passphrase`)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keyload test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
