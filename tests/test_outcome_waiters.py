"""A request waiting for its outcome (keyload/server/writer.py): answered by the outcome sealed for
it, given up on after its timeout, and a late outcome then changes nothing. On a real event loop."""

from __future__ import annotations

import asyncio
import os

import pytest

from keyload.credentials import Credential
from keyload.log.codec import REGISTRY
from keyload.processors.outcomes import new_outcome
from keyload.server.writer import OUTCOME, OutcomeWaiters

DOMAIN = "orders"
ALICE = Credential("alice", "k-alice", os.urandom(32))
BOB = Credential("bob", "k-bob", os.urandom(32))


def outcome_for(credential: Credential, command_id: str, offset: int = 7) -> bytes:
    return credential.sign(REGISTRY.encode(OUTCOME, new_outcome(command_id, DOMAIN, 0, offset, 1_000)))


def test_the_outcome_sealed_for_the_waiter_answers_it() -> None:
    async def scenario() -> int:
        waiters = OutcomeWaiters(None)
        waiters.attach(asyncio.get_running_loop())
        waiter = waiters.expect(DOMAIN, "c-1", ALICE)
        waiter.position = (0, 7)
        # Bob's outcome under the same command id (his own command's) is not Alice's answer.
        waiters.published(None, [outcome_for(BOB, "c-1", 8), outcome_for(ALICE, "c-1")])
        answer = await waiter.answer(5.0)
        waiters.forget(DOMAIN, "c-1", waiter)
        offset: int = answer.record["offset"]
        return offset

    assert asyncio.run(scenario()) == 7


def test_a_waiter_gives_up_after_its_timeout_and_a_late_outcome_changes_nothing() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        waiters = OutcomeWaiters(None)
        waiters.attach(loop)
        waiter = waiters.expect(DOMAIN, "c-2", ALICE)
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
        waiters.attach(asyncio.get_running_loop())
        gone, staying = waiters.expect(DOMAIN, "c-3", ALICE), waiters.expect(DOMAIN, "c-3", ALICE)
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
