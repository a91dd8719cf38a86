"""The ticker: appends `Tick` commands so that log time, and with it every timer, advances without traffic.

Processors never read the clock (DESIGN §3); a timer fires when a record with a
later log time is applied. The ticker is the service's clock-reading actor: it
looks at each partition's earliest pending timer and appends a Tick to a
partition whose timer is due.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from keyload.log.base import CommandLog, partition_for
from keyload.log.codec import REGISTRY

DEFAULT_TICK_INTERVAL_MS = 1_000
MAX_TICKER_DOMAIN_PROBES = 1_000_000


class Timed(Protocol):
    """What the ticker needs of a partition's processor."""

    @property
    def partition(self) -> int: ...

    @property
    def partitions(self) -> int: ...

    @property
    def applied_offset(self) -> int: ...

    def next_timer_ms(self) -> int | None: ...


def domain_for_partition(partition: int, partitions: int) -> str:
    """A stable domain name that maps to `partition`, for partition-wide commands (Tick)."""
    for n in range(MAX_TICKER_DOMAIN_PROBES):
        candidate = f"keyload-system-{n}"
        if partition_for(candidate, partitions) == partition:
            return candidate
    raise AssertionError("no domain maps to the partition")


def tick_command(partition: int, partitions: int, command_id: str) -> bytes:
    return REGISTRY.encode(
        "keyload.Command",
        {
            "command_id": command_id,
            "domain": domain_for_partition(partition, partitions),
            "principal": "keyload-ticker",
            "body": ("keyload.command.Tick", {}),
            "reply_to": None,
            "client_time_ms": None,
        },
    )


class Ticker:
    """Appends a Tick to partitions whose earliest timer is due, so time advances without traffic.

    At most one Tick per partition is outstanding: the next one is appended only
    after the previous one has been applied.
    """

    def __init__(self, log: CommandLog, interval_ms: int = DEFAULT_TICK_INTERVAL_MS) -> None:
        assert interval_ms > 0
        self.log = log
        self.interval_ms = interval_ms
        self._outstanding: dict[int, int] = {}
        self._last_check_ms = 0

    def poll(self, processors: Sequence[Timed], now_ms: int) -> int:
        if now_ms - self._last_check_ms < self.interval_ms:
            return 0
        self._last_check_ms = now_ms
        appended = 0
        for processor in processors:
            outstanding = self._outstanding.get(processor.partition)
            if outstanding is not None and outstanding > processor.applied_offset:
                continue
            due = processor.next_timer_ms()
            if due is None or due > now_ms:
                continue
            command_id = f"tick-{processor.partition}-{now_ms}"
            value = tick_command(processor.partition, processor.partitions, command_id)
            [position] = self.log.append(processor.partition, [value])
            self._outstanding[processor.partition] = position.offset
            appended += 1
        return appended
