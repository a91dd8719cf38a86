"""What the HTTP server reads of the processors it runs beside, from its own thread: for `/readyz`,
`/metrics` and the 503 of a request to a halted partition. The embedded service holds every
partition's processor, or with worker processes reads their progress from shared memory
(keyload/service/workers.py); a Kafka service those of the partitions it owns now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Processing(Protocol):
    def applied_offsets(self) -> Mapping[int, int]:
        """The applied offset of each partition served here."""
        ...

    def halt_of(self, partition: int) -> str | None:
        """Why the partition halted (where, and the reason); None while it serves or is not served here."""
        ...

    def stall_of(self, partition: int) -> str | None:
        """Why the partition cannot make its next group durable (a full disk), until it can; else None."""
        ...

    def poison_records(self, partition: int) -> int | None:
        """The poison records of the partition's projection as its processor in this process counts
        them; None for any other (a worker process's: `/metrics` reads its projection instead)."""
        ...
