"""The ticker: appends `Tick` commands so that log time, and with it every timer, advances without traffic.

Processors never read the clock (DESIGN §3); a timer fires when a record with a
later log time is applied. The ticker is the service's clock-reading actor: it
looks at each partition's earliest pending timer and appends a Tick to a
partition whose timer is due.

When it looks, per partition (at most one Tick outstanding, always):

- **Catch-up.** As soon as its Tick has been applied, a partition whose earliest
  timer is still due at or before that Tick's own log time gets the next Tick at
  once: the Tick spent its whole examination budget (it fires everything due by
  its time otherwise), so a backlog drains at the processor's pace, one budget
  per apply pass, not one budget per interval.
- **Idle.** Otherwise the partition's next timer is read once per `interval_ms`,
  or at that timer's due time if it is known to come sooner, and a Tick goes out
  when it is due; after a Tick the next ordinary look is one interval later, so
  outside catch-up a partition gets at most one Tick per interval however many
  timers fall due in it.

So a timer is fired at most `interval_ms` plus one apply pass after its due
time, plus the time the partition needs to fire the timers due before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from keyload.credentials import Credential
from keyload.log.base import Appended, CommandLog
from keyload.service.system_commands import system_command

DEFAULT_TICK_INTERVAL_MS = 100


class Timed(Protocol):
    """What the ticker needs of a partition's processor."""

    @property
    def partition(self) -> int: ...

    @property
    def partitions(self) -> int: ...

    @property
    def applied_offset(self) -> int: ...

    def next_timer_ms(self) -> int | None: ...


def tick_command(partition: int, partitions: int, command_id: str, credential: Credential) -> bytes:
    """A Tick signed by the ticker's principal (keyload/storage/principals.py)."""
    return system_command(credential, "Tick", {}, partition=partition, partitions=partitions, command_id=command_id)


@dataclass
class _Partition:
    """The ticker's view of one partition."""

    outstanding: Appended | None = None  # the Tick appended and not yet applied
    next_look_ms: int = 0  # the wall clock from which the next ordinary look may happen


class Ticker:
    """Appends a Tick to partitions whose earliest timer is due, so time advances without traffic.

    At most one Tick per partition is outstanding: the next one is appended only
    after the previous one has been applied, at once while the partition is
    catching up on a backlog of due timers, else at the next look (module doc).
    """

    def __init__(self, log: CommandLog, credential: Credential, interval_ms: int = DEFAULT_TICK_INTERVAL_MS) -> None:
        assert interval_ms > 0
        self.log = log
        self.credential = credential
        self.interval_ms = interval_ms
        self._partitions: dict[int, _Partition] = {}
        self._polled: list[_Partition] = []  # the partitions the last poll was given

    def poll(self, processors: Sequence[Timed], now_ms: int) -> int:
        """Look at the partitions that are due a look; returns how many Ticks were appended."""
        appended = 0
        self._polled = []
        for processor in processors:
            state = self._partitions.setdefault(processor.partition, _Partition())
            self._polled.append(state)
            looked, due = False, None
            tick = state.outstanding
            if tick is not None:
                if tick.offset > processor.applied_offset:
                    continue
                state.outstanding = None
                looked, due = True, processor.next_timer_ms()
                if due is not None and due <= tick.timestamp_ms:
                    self._append(processor, state, now_ms)  # catch-up: the Tick's budget ran out
                    appended += 1
                    continue
            if now_ms < state.next_look_ms:
                continue
            if not looked:
                due = processor.next_timer_ms()
            if due is None or due > now_ms:
                state.next_look_ms = now_ms + self.interval_ms if due is None else min(now_ms + self.interval_ms, due)
                continue
            self._append(processor, state, now_ms)
            appended += 1
        return appended

    def next_poll_ms(self, now_ms: int) -> int:
        """How long after `now_ms` a partition of the last poll is due its next ordinary look (0: now).

        A caller that idles may sleep this long without delaying a Tick. A partition
        with a Tick outstanding is left out: applying the Tick is work, so the caller
        does not idle before it polls again.
        """
        looks = [state.next_look_ms for state in self._polled if state.outstanding is None]
        return max(0, min(looks, default=now_ms + self.interval_ms) - now_ms)

    def _append(self, processor: Timed, state: _Partition, now_ms: int) -> None:
        command_id = f"tick-{processor.partition}-{now_ms}"
        value = tick_command(processor.partition, processor.partitions, command_id, self.credential)
        [state.outstanding] = self.log.append(processor.partition, [value])
        state.next_look_ms = now_ms + self.interval_ms
