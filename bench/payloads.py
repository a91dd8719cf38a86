"""Large payloads against raw references, measured in one run on one machine.

    python -m bench.payloads [--messages N] [--payload-bytes B] [--json]

Two questions, each answered as a ratio against a reference measured in the same run:

(a) Bytes: what the gateway's upload + attestation (conditional create, then a full
    read-back and SHA-256 for the proof) costs per payload, against (r1) a plain
    `put_if_absent` of the same file into the same kind of store. Wall-clock time;
    the file object store under a temporary folder.
(b) Processor: what applying PrepareLargeSchedule + CommitLargeSchedule (an Ed25519
    verification, a reservation, an identity row, a timer) costs per message, against
    (r2) applying one Enqueue of a 1 KiB inline body. Processor CPU time of
    `PartitionProcessor.step()` until caught up, with outcomes published.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY
from keyload.processors.payloads import proofs
from keyload.processors.payloads.handles import UploadHandle, open_handle
from keyload.processors.policy import default_spec
from keyload.projections.store import Store
from keyload.sdk.payloads import PayloadGateway
from keyload.sdk.results import PayloadReservation
from keyload.service.runtime import MAX_GROUP_RECORDS, PartitionProcessor
from keyload.storage.datadir import DataDir
from keyload.storage.object_store import FileObjectStore

from .common import DOMAIN, OUTCOME, QUEUE, BenchError, encode_command, environment

DEFAULT_MESSAGES = 2_000
DEFAULT_PAYLOAD_BYTES = 1024 * 1024
INLINE_BODY_BYTES = 1024
UPLOAD_SAMPLES = 50  # payloads timed for (a) and (r1)


def _apply(root: Path, values: list[bytes]) -> tuple[float, list[Any]]:
    """Append `values` to a fresh partition log and apply them: (processor CPU seconds, outcomes)."""
    data = DataDir.open(root)
    partition = partition_for(DOMAIN, data.partitions)
    log, outcomes = data.command_log(), data.outcome_log()
    start = log.end_offset(partition)
    for at in range(0, len(values), MAX_GROUP_RECORDS):
        log.append(partition, values[at : at + MAX_GROUP_RECORDS])
    store = Store(data.projection(partition))
    try:
        processor = PartitionProcessor(partition, data.partitions, log, store, outcomes, keyring=data.keyring())
        cursor = outcomes.end_offset(0)
        began = time.process_time()
        while processor.applied_offset < start + len(values) - 1:
            if processor.step() == 0 or processor.halt is not None:
                raise BenchError(f"the processor stopped: {processor.halt}")
        spent = time.process_time() - began
        decoded = [REGISTRY.decode(OUTCOME, r.value) for r in outcomes.read(0, cursor, len(values) + 16)]
    finally:
        store.close()
        log.close()
        outcomes.close()
    failed = [o for o in decoded if o["status"] != "committed"]
    if failed:
        raise BenchError(f"{len(failed)} commands were rejected, first: {failed[0]['detail']}")
    return spent, decoded


def _timed(action: Callable[[], object], samples: int) -> float:
    began = time.perf_counter()
    for _ in range(samples):
        action()
    return (time.perf_counter() - began) / samples


def run(directory: Path, messages: int, payload_bytes: int) -> dict[str, Any]:
    data = DataDir.create(directory / "data")
    gateway = PayloadGateway(data.object_store(), data.keyring())
    create = {"queue": QUEUE, "policy": default_spec() | {"max_stored_bytes": 1 << 40}}
    _apply(data.root, [encode_command("create", "keyload.command.CreateQueue", create)])
    payload = directory / "payload"
    payload.write_bytes(os.urandom(payload_bytes))
    sha256 = hashlib.sha256(payload.read_bytes()).digest()

    # (b) PrepareLargeSchedule for every message, then the commits of attested uploads.
    prepares = [
        encode_command(
            f"prepare-{n}",
            "keyload.command.PrepareLargeSchedule",
            {
                "queue": QUEUE,
                "message_id": f"large-{n}",
                "length": payload_bytes,
                "sha256": sha256,
                "upload_window_ms": 3_600_000,
                "headers": {},
                "ordering_key": None,
                "not_before_ms": None,
                "expires_at_ms": None,
            },
        )
        for n in range(messages)
    ]
    prepare_cpu, receipts = _apply(data.root, prepares)
    handles = []
    for outcome in receipts:
        receipt = PayloadReservation(**outcome["result"][1])
        handles.append(gateway.upload_handle(receipt, partition_for(DOMAIN, data.partitions)))
    # (a) against (r1): the first UPLOAD_SAMPLES uploads and attestations, and plain puts.
    samples = min(UPLOAD_SAMPLES, messages)
    pending = iter(handles[:samples])
    upload_s = _timed(lambda: gateway.attest(_upload(gateway, next(pending), payload)), samples)
    raw = FileObjectStore(directory / "raw")
    counter = iter(range(samples))
    raw_put_s = _timed(lambda: raw.put_if_absent(f"raw/{next(counter)}", payload), samples)
    # Every commit proves the first object under its own reservation: the processor never reads it.
    proven = gateway.attest(handles[0])
    commits = [
        encode_command(
            f"commit-{n}",
            "keyload.command.CommitLargeSchedule",
            {"reservation_id": n + 1, "proof": _resigned(gateway, proven, handle)},
        )
        for n, handle in enumerate(handles)
    ]
    commit_cpu, _ = _apply(data.root, commits)
    body = os.urandom(INLINE_BODY_BYTES)
    enqueues = [
        encode_command(
            f"enqueue-{n}",
            "keyload.command.Enqueue",
            {
                "queue": QUEUE,
                "message_id": f"inline-{n}",
                "body": body,
                "headers": {},
                "ordering_key": None,
                "not_before_ms": None,
                "expires_at_ms": None,
            },
        )
        for n in range(messages)
    ]
    enqueue_cpu, _ = _apply(data.root, enqueues)
    large_us = (prepare_cpu + commit_cpu) / messages * 1e6
    enqueue_us = enqueue_cpu / messages * 1e6
    return {
        "environment": environment(0, directory),
        "messages": messages,
        "payload_bytes": payload_bytes,
        "a_upload_and_attest_ms": round(upload_s * 1e3, 3),
        "r1_plain_put_ms": round(raw_put_s * 1e3, 3),
        "a_over_r1": round(upload_s / raw_put_s, 2),
        "b_prepare_us": round(prepare_cpu / messages * 1e6, 1),
        "b_commit_us": round(commit_cpu / messages * 1e6, 1),
        "r2_enqueue_us": round(enqueue_us, 1),
        "b_over_r2": round(large_us / enqueue_us, 2),
    }


def _upload(gateway: PayloadGateway, handle: str, payload: Path) -> str:
    gateway.upload(handle, payload)
    return handle


def _resigned(gateway: PayloadGateway, proof: dict[str, Any], handle: str) -> dict[str, Any]:
    """`proof` re-signed for the handle's reservation."""
    opened = open_handle(gateway.keyring, handle, UploadHandle)
    mine = proof | {"reservation_id": opened.reservation_id, "object_key": opened.object_key}
    return mine | {"signature": proofs.sign(gateway.keyring[opened.trust_key_id], mine)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.payloads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    parser.add_argument("--payload-bytes", type=int, default=DEFAULT_PAYLOAD_BYTES)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dir", type=Path, help="parent of the temporary directory")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.payload_bytes < 1:
        raise SystemExit("--messages and --payload-bytes must be >= 1")
    directory = Path(tempfile.mkdtemp(prefix="keyload-bench-payloads-", dir=args.dir))
    try:
        result = run(directory, args.messages, args.payload_bytes)
    except BenchError as exc:
        print(f"bench.payloads: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            if key != "environment":
                print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
