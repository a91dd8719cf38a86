"""The embedded deployment with a payload gateway on the log's clock: shared by the payload tests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyload.sdk.payloads import PayloadGateway
from keyload.sdk.results import Delivery, PayloadReservation
from keyload.storage import keyring

from .support import CREATE_QUEUE, RECEIVE, Embedded, create_queue_body, expect, receive_body, submit_unhalted

D = "shop"
Q = "media"
PREPARE = "keyload.command.PrepareLargeSchedule"
COMMIT = "keyload.command.CommitLargeSchedule"
CANCEL_LARGE = "keyload.command.CancelLargeSchedule"
INSPECT_RESERVATION = "keyload.command.InspectReservation"
WINDOW_MS = 60_000


def prepare_body(message_id: str, data: bytes, queue: str = Q, **fields: Any) -> dict[str, Any]:
    """A PrepareLargeSchedule body for `data`; `fields` override the nulls."""
    body = {
        "queue": queue,
        "message_id": message_id,
        "length": len(data),
        "sha256": hashlib.sha256(data).digest(),
        "upload_window_ms": None,
        "headers": {},
        "ordering_key": None,
        "not_before_ms": None,
        "expires_at_ms": None,
    }
    return body | fields


@dataclass
class Large:
    """The embedded deployment with a payload gateway whose clock is the log's."""

    embedded: Embedded
    gateway: PayloadGateway

    def prepare(self, message_id: str, data: bytes, code: str | None = None, **fields: Any) -> Any:
        body = prepare_body(message_id, data, **({"upload_window_ms": WINDOW_MS} | fields))
        return expect(submit_unhalted(self.embedded, D, PREPARE, body), code)

    def handle(self, receipt: PayloadReservation) -> str:
        return self.gateway.upload_handle(receipt, self.embedded.partition(D))

    def upload(self, receipt: PayloadReservation, data: bytes, tmp: Path) -> str:
        handle = self.handle(receipt)
        source = tmp / f"upload-{receipt.reservation_id}"
        source.write_bytes(data)
        self.gateway.upload(handle, source)
        return handle

    def commit(self, receipt: PayloadReservation, proof: dict[str, Any], code: str | None = None) -> Any:
        body = {"reservation_id": receipt.reservation_id, "proof": proof}
        return expect(submit_unhalted(self.embedded, D, COMMIT, body), code)

    def schedule(self, message_id: str, data: bytes, tmp: Path, **fields: Any) -> PayloadReservation:
        receipt = self.prepare(message_id, data, **fields)
        proof = self.gateway.attest(self.upload(receipt, data, tmp))
        committed: PayloadReservation = self.commit(receipt, proof)
        return committed

    def receive(self) -> list[Delivery]:
        deliveries: list[Delivery] = expect(
            submit_unhalted(self.embedded, D, RECEIVE, receive_body(Q)), None
        ).deliveries
        return deliveries

    def read(self, delivery: Delivery, tmp: Path) -> bytes:
        assert delivery.payload is not None and delivery.payload.read_handle is not None
        target = tmp / f"read-{delivery.message_id}"
        self.gateway.read(delivery.payload.read_handle, target)
        return target.read_bytes()


@contextmanager
def large_deployment(root: Path, **policy: Any) -> Iterator[Large]:
    """A deployment with queue Q (of `policy`) and a keyring key outside the trust set."""
    embedded = Embedded(root)
    keyring.add(embedded.data.root, "k-other")  # a keyring key outside the trust set
    for processor in embedded.processors:
        processor.keyring = embedded.data.keyring()
    gateway = PayloadGateway(embedded.data.object_store(), embedded.data.keyring(), clock=lambda: embedded.now_ms)
    expect(submit_unhalted(embedded, D, CREATE_QUEUE, create_queue_body(Q, **policy)), None)
    try:
        yield Large(embedded, gateway)
    finally:
        embedded.close()


def counters(large: Large) -> Any:
    return expect(submit_unhalted(large.embedded, D, "keyload.command.InspectQueue", {"queue": Q}), None).counters
