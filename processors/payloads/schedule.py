"""Large payloads: reserve, commit from a proof, cancel, expire by log time (DESIGN.md §8).

PrepareLargeSchedule pins everything a large message will be before any byte moves:
its identity in the queue, the object key (chosen here, from the reservation id), the
expected length and SHA-256, the upload deadline (log time), the trust set whose key
must sign its proof, and its quota (held in `reserved_messages`/`reserved_bytes` and
`payload_object_bytes`). Upload and attestation happen outside the log
(keyload/sdk/payloads.py). CommitLargeSchedule checks the proof's signature and fields
against the reservation, never the object store, and creates the message in the same
batch that consumes the reservation.

How a reservation ends otherwise (cancel, deadline) is processors/payloads/reservations.py.
"""

from __future__ import annotations

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import CommitLargeSchedule, PayloadCommitProof, PrepareLargeSchedule
from keyload.commands import Capability
from keyload.log.codec import Record
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.key_rotation import MissingKey, trust_set
from keyload.processors.payloads import proofs
from keyload.processors.payloads.reservations import close, load_reservation, object_key, queue_of, refuse_closed, view
from keyload.processors.queues.resource import admit, check_new_message, check_open, check_room
from keyload.processors.queues.state import Working, allocate, bounded, load_queue, save_queue, with_timer
from keyload.projections import keys
from keyload.projections.records import LargePayload, PayloadReservation, ReservationState, save
from keyload.projections.store import Staged


def prepare_large_schedule(stage: Staged, body: PrepareLargeSchedule, ctx: Context) -> Record:
    work = Working(load_queue(stage, ctx.domain, body.queue))
    queue = work.view
    check_new_message(stage, queue, body, ctx)
    length = bounded("length", body.length, 0, 0, limits.MAX_PAYLOAD_BYTES)
    window = bounded(
        "upload_window_ms",
        body.upload_window_ms,
        limits.DEFAULT_UPLOAD_WINDOW_MS,
        limits.MIN_UPLOAD_WINDOW_MS,
        limits.MAX_UPLOAD_WINDOW_MS,
    )
    deadline = ctx.now_ms + window
    if body.expires_at_ms is not None and body.expires_at_ms <= deadline:
        raise Rejected(ErrorCode.VALIDATION, "expires_at_ms must be after the upload deadline")
    check_room(queue, 1, length)
    reservation_id = allocate(stage, keys.NEXT_RESERVATION_ID)
    version, key_id = trust_set(stage)
    reservation = PayloadReservation(
        reservation_id=reservation_id,
        domain=ctx.domain,
        queue=queue.queue,
        queue_id=queue.incarnation,
        message_id=body.message_id,
        object_key=object_key(stage, ctx, reservation_id),
        length=length,
        sha256=body.sha256,
        headers=dict(sorted(body.headers.items())),
        ordering_key=body.ordering_key,
        not_before_ms=body.not_before_ms,
        expires_at_ms=body.expires_at_ms,
        upload_deadline_ms=deadline,
        trust_set_version=version,
        trust_key_id=key_id,
        state=ReservationState.reserved,
        reserved_at_ms=ctx.now_ms,
        closed_at_ms=None,
        object_version=None,
    )
    work.adjust(reserved_messages=1, reserved_bytes=length, payload_object_bytes=length)
    stage.put(keys.identity(queue.incarnation, body.message_id), keys.u64(reservation_id))
    work.record = with_timer(stage, work.record, deadline, keys.TIMER_RESERVATION, reservation_id, body.message_id)
    save(stage, keys.reservation(reservation_id), reservation)
    save_queue(stage, work.record)
    return view(reservation, ctx.now_ms)


def check_proof(reservation: PayloadReservation, proof: PayloadCommitProof, ctx: Context) -> None:
    """The proof's trust set, signature and fields against the reservation; no object-store call."""
    if (proof.key_id, proof.trust_set_version) != (reservation.trust_key_id, reservation.trust_set_version):
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "the proof is not signed by the reservation's trust set")
    if proof.key_id not in ctx.keyring:
        # Not a refusal: a replay with the key present would decide otherwise. The runtime
        # reloads the keyring or halts (as for a token key).
        raise MissingKey(f"keyring has no key {proof.key_id!r} (a payload trust set's)")
    if not proofs.signature_valid(ctx.keyring, proof):
        raise Rejected(ErrorCode.TOKEN_INVALIDATED, "the proof's signature is not valid")
    pinned = (
        ("domain", proof.domain, reservation.domain),
        ("reservation_id", proof.reservation_id, reservation.reservation_id),
        ("object_key", proof.object_key, reservation.object_key),
    )
    for name, proven, reserved in pinned:
        if proven != reserved:
            raise Rejected(ErrorCode.CONFLICT, f"the proof's {name} is not the reservation's")
    if proof.length != reservation.length:
        raise Rejected(ErrorCode.CONFLICT, "the proven object's length is not the reserved length")
    if proof.sha256 != reservation.sha256:
        raise Rejected(ErrorCode.CONFLICT, "the proven object's SHA-256 is not the reserved one")
    if not 1 <= len(proof.object_version) <= limits.MAX_OBJECT_VERSION_CHARS:
        raise Rejected(ErrorCode.VALIDATION, f"object_version must be 1..{limits.MAX_OBJECT_VERSION_CHARS} characters")


def commit_large_schedule(stage: Staged, body: CommitLargeSchedule, ctx: Context) -> Record:
    reservation = load_reservation(stage, ctx, body.reservation_id, Capability.enqueue)
    proof = body.proof
    check_proof(reservation, proof, ctx)
    if reservation.state == ReservationState.committed:
        if proof.object_version != reservation.object_version:
            raise Rejected(ErrorCode.CONFLICT, "the reservation is committed with another object version")
        return view(reservation, ctx.now_ms)  # the first equivalent proof's commit stands
    refuse_closed(reservation, ctx.now_ms)
    work = Working(queue_of(stage, reservation))
    check_open(work.view)
    length = reservation.length
    work.adjust(reserved_messages=-1, reserved_bytes=-length)
    large = LargePayload(
        reservation_id=reservation.reservation_id,
        object_key=reservation.object_key,
        object_version=proof.object_version,
        length=length,
        sha256=reservation.sha256,
        read_handle=None,
    )
    # admit reads the new message's fields (id, headers, ordering key, times) from the reservation.
    admit(stage, work, reservation, ctx, b"", large)
    committed = close(stage, work.view.incarnation, reservation, ReservationState.committed, ctx)
    committed = replace(committed, object_version=proof.object_version)
    save(stage, keys.reservation(committed.reservation_id), committed)
    save_queue(stage, work.record)
    return view(committed, ctx.now_ms)
