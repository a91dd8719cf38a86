"""Long-poll receives: a Receive (of a queue or a subscription group) that finds nothing
to deliver waits as a logged waiter.

A waiter is served by the first later record that leaves its queue or group with
something deliverable (the claims are made for the waiter's principal, and the
outcome is published under the waiting Receive's command id), or completed empty
when log time passes its deadline. Either way the Receive's stored outcome
becomes that final outcome, so a retry of the same command id returns it.

Queues and groups keep waiters alike: rows `a | incarnation | sequence`, a deadline
timer of kind TIMER_WAITER, and `waiting_receives`, `next_waiter_sequence` and
`waiter_floor` on their record; the result a waiter completes with is theirs. A record
serves at most MAX_WAITERS_SERVED of them; one cut off by that budget with something
left to deliver gets a serve timer (`serve_later`), whose firing saves the queue or
group, which serves its waiters again.
"""

from __future__ import annotations

from msgspec.structs import replace

from keyload import limits
from keyload.log.codec import REGISTRY, Record
from keyload.processors.context import Context
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import feature_level
from keyload.processors.horizons import store_outcome
from keyload.processors.outcomes import OUTCOME, new_outcome
from keyload.processors.queues.state import TimedRecord, remove_index_row, with_timer
from keyload.projections import keys
from keyload.projections.records import Waiter, load, save
from keyload.projections.store import Staged


def wait(
    stage: Staged,
    record: TimedRecord,
    ctx: Context,
    max_messages: int,
    max_bytes: int,
    lease_ms: int,
    deadline_ms: int,
) -> TimedRecord:
    """Record the command as waiting until `deadline_ms` (its outcome is deferred); the queue or
    group record with the waiter counted and its deadline timer added."""
    if record.waiting_receives >= limits.MAX_WAITERS_PER_RESOURCE:
        raise Rejected(ErrorCode.RESOURCE_EXHAUSTED, f"{limits.MAX_WAITERS_PER_RESOURCE} receives are already waiting")
    sequence = record.next_waiter_sequence
    waiter = Waiter(
        command_id=ctx.command_id,
        domain=ctx.domain,
        principal=ctx.principal,
        reply_to=_reply_partition(ctx),
        offset=ctx.offset,
        fingerprint=ctx.fingerprint,
        max_messages=max_messages,
        max_bytes=max_bytes,
        lease_ms=lease_ms,
        deadline_ms=deadline_ms,
    )
    save(stage, keys.waiter(record.view.incarnation, sequence), waiter)
    record = replace(record, next_waiter_sequence=sequence + 1, waiting_receives=record.waiting_receives + 1)
    record = with_timer(stage, record, deadline_ms, keys.TIMER_WAITER, sequence, "")
    ctx.outbox.deferred = True
    return record


def _reply_partition(ctx: Context) -> int | None:
    """The reply partition the command names as a waiter keeps it: one outside 0..MAX_REPLY_PARTITION
    (an Avro int) is one the runtime never publishes to, so the waiter keeps none rather than a value
    its record cannot hold."""
    reply_to = ctx.reply_to
    if reply_to is not None and not limits.INTEGER_FIELD_RANGES["Command.reply_to"].contains(reply_to):
        return None
    return reply_to


def follow_repeat(stage: Staged, record: TimedRecord, ctx: Context) -> None:
    """A repeat of a Receive still waiting on `record` (same command id, same content): from feature
    level 13 the waiter's outcome goes to the reply partition the repeat names, the latest asker's.
    A client resubmits a long poll whose answer it lost when its server stopped; on Kafka the retry
    goes through another server, which reads another reply partition, and would otherwise wait out
    its own time and get no answer while the first one's went to a server that is gone."""
    queue_id = record.view.incarnation
    start = keys.waiter(queue_id, record.waiter_floor)
    for key, _ in stage.scan(start, keys.prefix_end(keys.waiter_prefix(queue_id))):
        waiter = load(stage, key, Waiter)
        assert waiter is not None
        if (waiter.domain, waiter.command_id) == (ctx.domain, ctx.command_id):
            reply_to = _reply_partition(ctx)
            if waiter.reply_to != reply_to:
                save(stage, key, replace(waiter, reply_to=reply_to))
            return


def serve_later(stage: Staged, record: TimedRecord, now_ms: int) -> TimedRecord:
    """The record with a serve timer due at `now_ms` (TIMER_SERVE, sequence 0): the next record fires
    it, and the save that firing makes has the record's waiters served."""
    return with_timer(stage, record, now_ms, keys.TIMER_SERVE, 0, "")


def oldest(stage: Staged, record: TimedRecord, count: int) -> tuple[TimedRecord, list[tuple[int, Waiter]]]:
    """Up to `count` waiters of the queue or group, oldest first, as (sequence, waiter); and the
    record with its waiter floor moved up to the first of them."""
    found: list[tuple[int, Waiter]] = []
    queue_id = record.view.incarnation
    start = keys.waiter(queue_id, record.waiter_floor)
    for key, _ in stage.scan(start, keys.prefix_end(keys.waiter_prefix(queue_id))):
        if len(found) == count:
            break
        waiter = load(stage, key, Waiter)
        assert waiter is not None
        found.append((keys.read_u64(key, 9), waiter))
    if not found:
        return record, found
    return replace(record, waiter_floor=found[0][0]), found  # every waiter before the first found is gone


def complete(
    stage: Staged, record: TimedRecord, ctx: Context, sequence: int, waiter: Waiter, result: tuple[str, Record]
) -> TimedRecord:
    """Finish a waiting Receive with `result` (its Outcome branch and value) and publish its outcome;
    the record without the waiter."""
    queue_id = record.view.incarnation
    outcome = new_outcome(waiter.command_id, waiter.domain, ctx.partition, waiter.offset, ctx.now_ms)
    outcome["result"] = result
    encoded = REGISTRY.encode(OUTCOME, outcome)
    store_outcome(stage, outcome, waiter.fingerprint, encoded, feature_level(stage))
    ctx.outbox.published.append((waiter.reply_to, waiter.principal, encoded))
    stage.delete(keys.waiter(queue_id, sequence))
    remove_index_row(stage, keys.timer(queue_id, waiter.deadline_ms, keys.TIMER_WAITER, sequence), "")
    waiting = record.waiting_receives - 1
    if waiting < 0:
        raise Corruption("waiting receive count would become negative")
    return replace(record, waiting_receives=waiting)


def expire(stage: Staged, record: TimedRecord, ctx: Context, sequence: int, empty: tuple[str, Record]) -> TimedRecord:
    """The waiter's deadline timer fired: it completes with `empty`, a result without deliveries;
    the record without the waiter."""
    waiter = load(stage, keys.waiter(record.view.incarnation, sequence), Waiter)
    if waiter is None:
        raise Corruption("a waiter deadline names a missing waiter")
    return complete(stage, record, ctx, sequence, waiter, empty)
