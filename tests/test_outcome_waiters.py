"""A request waiting for its outcome (keyload/server/writer.py): answered by the outcome sealed for
it, given up on after its timeout, and a late outcome then changes nothing. On a real event loop."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from keyload.credentials import Credential
from keyload.errors import ErrorCode
from keyload.log.codec import REGISTRY
from keyload.processors.errors import Rejected
from keyload.processors.outcomes import new_outcome, reject
from keyload.server.writer import OUTCOME, CommandWriter, Halted, OutcomeFeed, OutcomeWaiters, open_outcome
from keyload.service.doorbell import Listener
from keyload.service.workers import EDGE_BELL
from keyload.storage.datadir import DataDir

DOMAIN = "orders"
ALICE = Credential("alice", "k-alice", os.urandom(32))
BOB = Credential("bob", "k-bob", os.urandom(32))


def outcome_for(credential: Credential, command_id: str, offset: int = 7) -> bytes:
    return credential.sign(REGISTRY.encode(OUTCOME, new_outcome(command_id, DOMAIN, 0, offset, 1_000)))


def test_the_outcome_sealed_for_the_waiter_answers_it() -> None:
    async def scenario() -> int:
        waiters = OutcomeWaiters(None)
        waiters.attach(asyncio.get_running_loop(), no_key)
        waiter = waiters.expect(DOMAIN, "c-1", ALICE, b"c-1")
        waiter.position = (0, 7)
        # Bob's outcome under the same command id (his own command's) is not Alice's answer.
        waiters.published(None, [outcome_for(BOB, "c-1", 8), outcome_for(ALICE, "c-1")])
        answer = await waiter.answer(5.0)
        waiters.forget(DOMAIN, "c-1", waiter)
        offset: int = answer.record["offset"]
        return offset

    assert asyncio.run(scenario()) == 7


def no_key(principal: str, partition: int) -> None:
    """No principal's key in force is known (a Kafka server's policy)."""


def test_an_outcome_of_the_waiters_own_position_sealed_with_its_principals_new_key_answers_it() -> None:
    """A long poll served after its principal's rotation is sealed with the key then in force: an
    outcome of the waiter's own position sealed with the key its principal holds now answers it. Not
    one sealed with another principal's key (Bob's, though the service's keyring holds it: anyone who
    can write the outcome stream could seal with their own), nor with a key id the principal holds
    but another secret, nor one at another position (another command's under the same id)."""
    rotated = Credential("alice", "k-alice-2", os.urandom(32))
    forged = Credential("alice", "k-alice-2", os.urandom(32))  # the key id, not its secret
    keys = {"alice": (rotated.key_id, rotated.secret), "bob": (BOB.key_id, BOB.secret)}

    def in_force(principal: str, partition: int) -> tuple[str, bytes] | None:
        return keys.get(principal) if partition == 0 else None

    async def scenario() -> list[bool]:
        waiters = OutcomeWaiters(None)
        waiters.attach(asyncio.get_running_loop(), in_force)
        waiter = waiters.expect(DOMAIN, "c-9", ALICE, b"c-9")
        waiter.position = (0, 7)
        offered = [
            outcome_for(BOB, "c-9", 7),
            outcome_for(forged, "c-9", 7),
            outcome_for(rotated, "c-9", 8),
            outcome_for(rotated, "c-9", 7),
        ]
        answers = []
        for value in offered:
            opened = open_outcome(value)
            assert opened is not None
            answers.append(waiter.answered_by(value, *opened, in_force))
        waiters.published(None, offered)
        assert (await waiter.answer(5.0)).record["offset"] == 7
        waiters.forget(DOMAIN, "c-9", waiter)
        return answers

    assert asyncio.run(scenario()) == [False, False, False, True]


def test_a_waiter_gives_up_after_its_timeout_and_a_late_outcome_changes_nothing() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        waiters = OutcomeWaiters(None)
        waiters.attach(loop, no_key)
        waiter = waiters.expect(DOMAIN, "c-2", ALICE, b"c-2")
        started = loop.time()
        with pytest.raises(TimeoutError):
            await waiter.answer(0.05)
        waited = loop.time() - started
        waiters.published(None, [outcome_for(ALICE, "c-2")])  # after the request gave up: skipped
        await asyncio.sleep(0)
        assert isinstance(waiter.future.exception(), TimeoutError)
        waiters.forget(DOMAIN, "c-2", waiter)
        return waited

    assert asyncio.run(scenario()) >= 0.05


def test_a_request_that_goes_away_cancels_only_its_own_wait() -> None:
    async def scenario() -> tuple[bool, int]:
        waiters = OutcomeWaiters(None)
        waiters.attach(asyncio.get_running_loop(), no_key)
        gone, staying = waiters.expect(DOMAIN, "c-3", ALICE, b"c-3"), waiters.expect(DOMAIN, "c-3", ALICE, b"c-3")
        task = asyncio.create_task(gone.answer(5.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        waiters.forget(DOMAIN, "c-3", gone)
        waiters.published(None, [outcome_for(ALICE, "c-3")])
        answer = await staying.answer(5.0)
        return gone.future.cancelled(), answer.record["offset"]

    assert asyncio.run(scenario()) == (True, 7)


def test_a_refusal_of_a_record_published_before_its_append_is_acknowledged_answers_it() -> None:
    """On Kafka the processor in this process may refuse a record (a principal disabled since the
    edge checked it: unsealed) before the broker acknowledges its append: the refusal is held until
    the position is known, then answers the request it refused, and only that one."""

    async def scenario() -> tuple[str, bool]:
        waiters = OutcomeWaiters(None)
        waiters.attach(asyncio.get_running_loop(), no_key)
        waiter = waiters.expect(DOMAIN, "c-4", ALICE, b"c-4")
        other = waiters.expect(DOMAIN, "c-4", ALICE, b"c-4 other content")
        refusal = new_outcome("c-4", DOMAIN, 0, 9, 1_000)
        reject(refusal, Rejected(ErrorCode.PERMISSION_DENIED, "principal is disabled"))
        waiters.published(None, [REGISTRY.encode(OUTCOME, refusal)])
        await asyncio.sleep(0)
        waiters.appended(DOMAIN, "c-4", other, (0, 8))
        waiters.appended(DOMAIN, "c-4", waiter, (0, 9))
        answer = await waiter.answer(5.0)
        return answer.record["error_code"], other.future.done()

    assert asyncio.run(scenario()) == ("PermissionDenied", False)


def test_the_outcome_feed_answers_a_workers_outcome_once_committed_and_holds_back_nothing_else(
    tmp_path: Path,
) -> None:
    """`keyload run --workers 2` (partitions 1 and 3 the worker's): the server's feed of its reply
    partition answers a worker's outcome only once the worker says it is committed (below its
    `answered` offset), while an outcome behind it that is committed is answered at once; each once."""
    data = DataDir.create(tmp_path / "data")
    reply = 3
    answered = {"below": 0}  # the worker's Progress.answered: nothing of it committed yet

    def answerable_below(partition: int) -> int | None:
        return None if partition % 2 == 0 else answered["below"]

    async def scenario() -> list[tuple[str, bool]]:
        loop = asyncio.get_running_loop()
        waiters = OutcomeWaiters(reply, in_process=[0, 2])
        waiters.attach(loop, no_key)
        held, free = waiters.expect(DOMAIN, "c-held", ALICE, b"h"), waiters.expect(DOMAIN, "c-free", ALICE, b"f")
        outcomes = data.outcome_log()
        feed = OutcomeFeed(data.outcome_log(), waiters, Listener(data.root, EDGE_BELL), answerable_below, loop)
        try:
            first = REGISTRY.encode(OUTCOME, new_outcome("c-held", DOMAIN, 1, 5, 1_000))
            second = REGISTRY.encode(OUTCOME, new_outcome("c-free", DOMAIN, 2, 6, 1_000))
            outcomes.append(reply, [ALICE.sign(first), ALICE.sign(second)])
            feed.read()
            seen = [("after the first read", held.future.done()), ("behind it", free.future.done())]
            feed.read()
            seen.append(("read again, still uncommitted", held.future.done()))
            answered["below"] = outcomes.end_offset(reply)  # the worker committed, and says so
            feed.read()
            seen.append(("once committed", held.future.done()))
            assert (await held.answer(1.0)).record["command_id"] == "c-held"
            assert (await free.answer(1.0)).record["command_id"] == "c-free"
            return seen
        finally:
            feed.close()
            outcomes.close()

    assert asyncio.run(scenario()) == [
        ("after the first read", False),
        ("behind it", True),
        ("read again, still uncommitted", False),
        ("once committed", True),
    ]


def test_work_unless_abandoned_ends_with_the_waiters_or_with_its_request() -> None:
    """An upload's work (`unless_abandoned`) returns its result; ends with `reason` once the waiters are
    abandoned (the service stopping), itself cancelled; and is cancelled with its request."""

    async def scenario() -> None:
        waiters = OutcomeWaiters(None)
        waiters.attach(asyncio.get_running_loop(), no_key)
        assert await waiters.unless_abandoned(asyncio.sleep(0, "stored"), Halted("stopping")) == "stored"
        ran: list[asyncio.Future[None]] = []

        async def forever() -> None:
            ran.append(asyncio.ensure_future(asyncio.sleep(3600)))
            await ran[-1]

        request = asyncio.ensure_future(waiters.unless_abandoned(forever(), Halted("stopping")))
        await asyncio.sleep(0.01)
        request.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0)
        assert ran[-1].cancelled()
        request = asyncio.ensure_future(waiters.unless_abandoned(forever(), Halted("stopping")))
        await asyncio.sleep(0.01)
        waiters.abandon(Halted("stopping"))
        with pytest.raises(Halted):
            await request
        await asyncio.sleep(0)
        assert ran[-1].cancelled()

    asyncio.run(scenario())


def test_once_abandoned_later_requests_and_appends_fail_with_the_same_reason(tmp_path: Path) -> None:
    """A stop stays in effect: a request that comes after the abandon (the next batch of a coalesced
    line, a request that waited its turn, a pipelined one) fails with the same reason at once, as
    does an append asked of the writer then: nothing of it is appended."""
    data = DataDir.create(tmp_path / "data")

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        waiters = OutcomeWaiters(None)
        waiters.attach(loop, no_key)
        with data.file_command_log() as log:
            writer = CommandWriter(log, loop, lambda partitions: None, blocking=False)
            queued = writer.append(0, b"queued before the stop")
            stopping = Halted("stopping")
            waiters.abandon(stopping)
            writer.abandon(stopping)
            await asyncio.sleep(0.01)
            with pytest.raises(Halted):
                waiters.expect(DOMAIN, "c-late", ALICE, b"c-late")
            assert await queued == 0  # flushed in the turn it was asked in, before the stop
            with pytest.raises(Halted):
                await writer.append(0, b"asked after the stop")
            return log.end_offset(0)

    assert asyncio.run(scenario()) == 1
