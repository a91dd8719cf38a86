"""What a command is evaluated against besides the projection: its log position and time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Context:
    partition: int
    offset: int
    now_ms: int  # the record's append time, clamped to be non-decreasing per partition
    domain: str
    principal: str
