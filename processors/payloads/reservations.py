"""A payload reservation's state and how it ends: committed, cancelled, or expired by log time.

The deadline is decided by log time alone: a reservation still `reserved` at an
evaluation time at or past its deadline is expired, whether or not its deadline timer
has fired yet. The timer only writes that decision down and hands the reservation to
retention (an abandoned reservation's object, if an upload left one, is deleted there).
Whichever comes first in the log among commit, cancel and the deadline wins.
"""

from __future__ import annotations

import hashlib
import json

from msgspec.structs import replace

from keyload import limits
from keyload.bodies import CancelLargeSchedule, InspectReservation
from keyload.commands import Capability
from keyload.log.codec import Record
from keyload.processors import access
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import OBJECT_KEYS_UNIQUE, feature_level
from keyload.processors.payloads import retention
from keyload.processors.queues.state import load_queue_by_id, queue_retired, save_queue
from keyload.projections import keys
from keyload.projections.records import PayloadReservation, QueueRecord, QueueView, ReservationState, load, save
from keyload.projections.store import Readable, Staged

OBJECT_KEY_ORIGIN_DIGITS = 16  # hex digits of the reserving command's digest in an object key (64 bits)


def object_key(stage: Readable, ctx: Context, reservation_id: int) -> str:
    """The service-chosen key of a reservation's object: no path a caller chooses, never reused.

    From feature level 16 it ends in a digest of the reserving command's id and log time: a restore
    after the log lost its tail replays to a reservation counter from before the loss and allocates
    the lost reservations' ids again, and their objects may already be stored under the bare id."""
    key = f"payloads/p-{ctx.partition:04d}/{reservation_id:020d}"
    if feature_level(stage) < OBJECT_KEYS_UNIQUE:
        return key
    origin = hashlib.sha256(json.dumps([ctx.command_id, ctx.now_ms]).encode()).hexdigest()
    return f"{key}-{origin[:OBJECT_KEY_ORIGIN_DIGITS]}"


def effective_state(reservation: PayloadReservation, now_ms: int) -> ReservationState:
    """The state at `now_ms`: a reserved one whose deadline has passed is expired, timer or not."""
    if reservation.state == ReservationState.reserved and now_ms >= reservation.upload_deadline_ms:
        return ReservationState.expired
    return reservation.state


def view(reservation: PayloadReservation, now_ms: int) -> Record:
    return dict(reservation.to_avro(), state=effective_state(reservation, now_ms).value)


def load_reservation(stage: Staged, ctx: Context, reservation_id: int, capability: Capability) -> PayloadReservation:
    """The reservation of the command's domain, once its principal holds `capability` (its command's)
    on the reservation's queue: the id names no resource a grant could be checked against before."""
    # An id outside its range (limits.RESERVATION_ID) names no reservation: never packed into a key.
    if not limits.RESERVATION_ID.contains(reservation_id):
        raise Rejected(ErrorCode.NOT_FOUND, "reservation does not exist")
    reservation = load(stage, keys.reservation(reservation_id), PayloadReservation)
    if reservation is None or reservation.domain != ctx.domain:
        raise Rejected(ErrorCode.NOT_FOUND, "reservation does not exist")
    access.require(ctx, capability, reservation.queue)
    return reservation


def queue_of(stage: Staged, reservation: PayloadReservation) -> QueueRecord:
    """The reservation's queue record; NotFound once the queue is deleted (its open reservations are
    cancelled as its rows are reclaimed, processors/reclamation.py)."""
    record = load_queue_by_id(stage, reservation.queue_id)
    if record is None:
        # Open reservations are cancelled before a retired queue's last row goes: only a retired
        # one can still have them.
        if queue_retired(stage, reservation.queue_id):
            raise Rejected(ErrorCode.NOT_FOUND, f"the queue of reservation {reservation.reservation_id} was deleted")
        raise Corruption(f"reservation {reservation.reservation_id} names a missing queue")
    return record


def refuse_closed(reservation: PayloadReservation, now_ms: int) -> None:
    """Refuse a change to a reservation that is no longer open (the log decided first)."""
    state = effective_state(reservation, now_ms)
    if state == ReservationState.expired:
        raise Rejected(ErrorCode.LEASE_EXPIRED, "the reservation's upload deadline has passed")
    if state == ReservationState.cancelled:
        raise Rejected(ErrorCode.CONFLICT, "the reservation was cancelled")
    if state == ReservationState.committed:
        raise Rejected(ErrorCode.CONFLICT, "the reservation is already committed")


def close(
    stage: Staged, queue_id: int, reservation: PayloadReservation, state: ReservationState, ctx: Context
) -> PayloadReservation:
    """End an open reservation of queue `queue_id`: drop its deadline timer; the reservation as it
    ended (the caller saves it)."""
    timer = keys.timer(queue_id, reservation.upload_deadline_ms, keys.TIMER_RESERVATION, reservation.reservation_id)
    if stage.get(timer) is None:
        raise Corruption(f"open reservation {reservation.reservation_id} has no deadline timer")
    stage.delete(timer)
    return replace(reservation, state=state, closed_at_ms=ctx.now_ms)


def cancel_large_schedule(stage: Staged, body: CancelLargeSchedule, ctx: Context) -> Record:
    reservation = load_reservation(stage, ctx, body.reservation_id, Capability.enqueue)
    if reservation.state == ReservationState.cancelled:
        return view(reservation, ctx.now_ms)
    refuse_closed(reservation, ctx.now_ms)
    record = queue_of(stage, reservation)
    cancelled = _abandon(stage, record.view, reservation, ReservationState.cancelled, ctx)
    save_queue(stage, record)  # unchanged but for its due-index entry: the deadline timer is gone
    return view(cancelled, ctx.now_ms)


def _abandon(
    stage: Staged, queue: QueueView, reservation: PayloadReservation, state: ReservationState, ctx: Context
) -> PayloadReservation:
    closed = close(stage, queue.incarnation, reservation, state, ctx)
    save(stage, keys.reservation(closed.reservation_id), closed)
    retention.abandon_reservation(stage, queue, closed, ctx)
    return closed


def abandon_open(
    stage: Staged, queue: QueueView, ctx: Context, reservation_id: int, otherwise: ReservationState
) -> None:
    """An open reservation of `queue` ends uncommitted: `expired` once its deadline has passed (its
    timer firing, or a forced deletion that reached it late), else `otherwise` (`cancelled`, by its
    queue's forced deletion). Whatever an upload left goes to the retention workflow, and its
    deadline timer goes."""
    reservation = load(stage, keys.reservation(reservation_id), PayloadReservation)
    if reservation is None or reservation.state != ReservationState.reserved:
        raise Corruption(f"deadline timer of reservation {reservation_id}, which is not open")
    ended = (
        ReservationState.expired if effective_state(reservation, ctx.now_ms) == ReservationState.expired else otherwise
    )
    _abandon(stage, queue, reservation, ended, ctx)


def inspect_reservation(stage: Staged, body: InspectReservation, ctx: Context) -> Record:
    return view(load_reservation(stage, ctx, body.reservation_id, Capability.inspect), ctx.now_ms)
