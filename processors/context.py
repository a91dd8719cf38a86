"""What a command is evaluated against besides the projection: its log position and time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Context:
    partition: int
    offset: int
    now_ms: int  # the record's append time, clamped to be non-decreasing per partition
    domain: str
    principal: str
    fired: dict[str, Any]  # what advancing log time to now_ms did before this command (a TickResult)
