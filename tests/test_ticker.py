"""The ticker: catch-up on a backlog of due timers, one Tick outstanding per partition, idle partitions left alone.

Ticker.poll is driven with a fake wall clock over a real embedded log and real
processors; the file log stamps records with the same fake clock, so every
assertion is about outcomes and counts, never about how long anything took.
"""

from __future__ import annotations

from collections.abc import Sequence

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.projections import keys
from keyload.service.runtime import PartitionProcessor
from keyload.service.ticker import Ticker, Timed

from .support import (
    CREATE_QUEUE,
    ENQUEUE,
    RECEIVE,
    Embedded,
    command,
    create_queue_body,
    enqueue_body,
    spread_domains,
)

D = "acme"
INTERVAL_MS = 1_000


class Counted:
    """A processor whose next_timer_ms() reads are counted (how often the ticker looks)."""

    def __init__(self, processor: PartitionProcessor) -> None:
        self.processor = processor
        self.looks = 0

    @property
    def partition(self) -> int:
        return self.processor.partition

    @property
    def partitions(self) -> int:
        return self.processor.partitions

    @property
    def applied_offset(self) -> int:
        return self.processor.applied_offset

    def next_timer_ms(self) -> int | None:
        self.looks += 1
        return self.processor.next_timer_ms()


def ticks_in_log(embedded: Embedded, partition: int) -> int:
    return sum(1 for r in embedded.log.read(partition, 0, 100_000) if b"keyload-ticker" in r.value)


def schedule(embedded: Embedded, domain: str, count: int, due_ms: int) -> None:
    """`count` messages of queue `jobs` in `domain`, each scheduled for `due_ms`: one timer each."""
    embedded.append(domain, command(domain, CREATE_QUEUE, create_queue_body("jobs")))
    for i in range(count):
        embedded.append(domain, command(domain, ENQUEUE, enqueue_body("jobs", f"m{i}", not_before_ms=due_ms)))
    embedded.run()


def ready(embedded: Embedded, domain: str) -> int:
    raw = embedded.store(domain).get(keys.queue(domain, "jobs"))
    assert raw is not None
    return int(REGISTRY.decode("keyload.QueueRecord", raw)["view"]["counters"]["ready"])


def drive(embedded: Embedded, ticker: Ticker, processors: Sequence[Timed], now_ms: int, rounds: int) -> list[int]:
    """`rounds` of the service loop at a fixed wall clock: poll, then apply what was appended."""
    embedded.now_ms = now_ms
    appended = []
    for _ in range(rounds):
        appended.append(ticker.poll(processors, now_ms))
        embedded.run()
    return appended


def test_a_backlog_far_beyond_one_budget_drains_without_waiting_an_interval_per_budget(embedded: Embedded) -> None:
    budgets = 6
    count = limits.TICK_EXAMINATION_BUDGET * budgets + 10
    due = embedded.now_ms + 5_000
    schedule(embedded, D, count, due)
    partition = embedded.partition(D)
    ticker = embedded.ticker(INTERVAL_MS)
    assert ticker.poll(embedded.processors, due - 1) == 0  # not due yet
    # The wall clock stands still at the due time: no interval ever passes, yet every timer fires,
    # one Tick per budget, each appended as soon as the one before it was applied.
    appended = drive(embedded, ticker, embedded.processors, due, rounds=budgets + 5)
    assert appended == [1] * (budgets + 1) + [0] * 4
    assert ticks_in_log(embedded, partition) == budgets + 1
    assert ready(embedded, D) == count
    assert embedded.processors[partition].next_timer_ms() is None


def test_catch_up_continues_while_due_timers_remain_and_stops_when_none_is_due(embedded: Embedded) -> None:
    """A backlog Tick fires everything due by its own time within the budget; timers due only later
    wait for the next look (one interval), they are not a backlog."""
    count = limits.TICK_EXAMINATION_BUDGET * 2
    start = embedded.now_ms
    schedule(embedded, D, count, start + 1_000)
    embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", "later", not_before_ms=start + 1_500)))
    embedded.run()
    ticker = embedded.ticker(INTERVAL_MS)
    assert drive(embedded, ticker, embedded.processors, start + 1_000, rounds=4) == [1, 1, 0, 0]
    assert ready(embedded, D) == count
    # "later" is due at +1,500: the next ordinary look is one interval after the last Tick.
    assert drive(embedded, ticker, embedded.processors, start + 1_500, rounds=2) == [0, 0]
    assert drive(embedded, ticker, embedded.processors, start + 2_000, rounds=2) == [1, 0]
    assert ready(embedded, D) == count + 1
    assert embedded.processors[embedded.partition(D)].next_timer_ms() is None


def test_at_most_one_tick_is_outstanding_per_partition(embedded: Embedded) -> None:
    first, second = spread_domains(2, embedded.data.partitions)
    assert embedded.partition(first) != embedded.partition(second)
    due = embedded.now_ms + 100
    for domain in (first, second):
        schedule(embedded, domain, limits.TICK_EXAMINATION_BUDGET * 3, due)
    ticker = embedded.ticker(INTERVAL_MS)
    embedded.now_ms = due
    ends = [embedded.log.end_offset(p) for p in range(embedded.data.partitions)]
    assert ticker.poll(embedded.processors, due) == 2  # one each
    # Unapplied, they stay the only ones, however often and however late the ticker looks.
    for later in (due, due + 1, due + INTERVAL_MS, due + 10 * INTERVAL_MS):
        assert ticker.poll(embedded.processors, later) == 0
    assert [embedded.log.end_offset(p) - end for p, end in enumerate(ends)] == [1, 1]
    # One partition applies its Tick: only that one gets the next (its backlog goes on).
    embedded.now_ms = due + 10 * INTERVAL_MS
    while embedded.processors[embedded.partition(first)].step():
        pass
    assert ticker.poll(embedded.processors, due + 10 * INTERVAL_MS) == 1
    assert ticker.poll(embedded.processors, due + 10 * INTERVAL_MS) == 0
    ticks = {d: ticks_in_log(embedded, embedded.partition(d)) for d in (first, second)}
    assert ticks == {first: 2, second: 1}


def test_an_idle_partition_gets_no_tick_and_is_looked_at_once_an_interval(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))  # a queue, no timer anywhere
    processors = [Counted(p) for p in embedded.processors]
    ticker = embedded.ticker(INTERVAL_MS)
    start = embedded.now_ms
    ends = [embedded.log.end_offset(p) for p in range(embedded.data.partitions)]
    for step_ms in range(0, 10 * INTERVAL_MS, 10):  # a poll every 10 ms for ten intervals
        assert ticker.poll(processors, start + step_ms) == 0
    assert [embedded.log.end_offset(p) for p in range(embedded.data.partitions)] == ends
    assert [p.looks for p in processors] == [10] * len(processors)
    assert ticker.next_poll_ms(start + 10 * INTERVAL_MS - 10) == 10


def test_a_known_timer_is_ticked_at_its_due_time_then_at_most_once_an_interval(embedded: Embedded) -> None:
    """Outside catch-up a partition gets at most one Tick per interval, however many timers fall due in it;
    a timer the ticker already knows of is ticked when it is due, not at the end of the interval."""
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    start = embedded.now_ms
    for i in range(20):  # one timer every 100 ms, from +250 on
        embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", f"m{i}", not_before_ms=start + 250 + 100 * i)))
    embedded.run()
    partition = embedded.partition(D)
    ticker = embedded.ticker(INTERVAL_MS)
    tick_times = []
    for step_ms in range(0, 3_000, 10):
        if drive(embedded, ticker, embedded.processors, start + step_ms, rounds=1) == [1]:
            tick_times.append(step_ms)
    assert tick_times == [250, 1_250, 2_250]
    assert ticks_in_log(embedded, partition) == 3
    assert ready(embedded, D) == 20


def test_every_waiter_is_answered_within_one_interval_of_its_deadline(embedded: Embedded) -> None:
    """The stated bound, in log time: without a backlog an empty long poll completes at most one
    ticker interval after its deadline (the loop polls every millisecond here)."""
    interval = 100
    embedded.submit(D, CREATE_QUEUE, create_queue_body("q"))
    cursor = embedded.outcomes.end_offset(0)
    start = embedded.now_ms
    arrivals = {37 * i: f"w{i}" for i in range(40)}  # a Receive every 37 ms, each waiting 500 ms
    body = {"queue": "q", "max_messages": 1, "max_bytes": None, "lease_ms": None, "wait_ms": 500}
    deadlines = {}
    ticker = embedded.ticker(interval)
    for step_ms in range(3_000):
        embedded.now_ms = start + step_ms
        if step_ms in arrivals:
            embedded.append(D, command(D, RECEIVE, body, arrivals[step_ms], reply_to=0))
            deadlines[arrivals[step_ms]] = embedded.now_ms + 500
        drive(embedded, ticker, embedded.processors, start + step_ms, rounds=1)
    answered = {}
    for record in embedded.outcomes.read(0, cursor, 1_000):
        outcome = REGISTRY.decode("keyload.Outcome", record.value)
        assert outcome["result"][1]["deliveries"] == []
        answered[outcome["command_id"]] = outcome["eval_time_ms"]
    assert set(answered) == set(deadlines)
    late = [answered[w] - deadlines[w] for w in deadlines]
    assert all(0 <= ms <= interval for ms in late), late
    assert ticks_in_log(embedded, embedded.partition(D)) <= 3_000 // interval
