"""Authoritative counters: a counter that would go negative means the projection is corrupt.

Every handler changes counters through these, so the corruption they reveal is named the same
way everywhere ("counter X would become -1") and halts the partition.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from keyload.processors.errors import Corruption

S = TypeVar("S", bound=msgspec.Struct)


def adjusted(counter: str, value: int, delta: int) -> int:
    """`value` changed by `delta`; going negative means the projection is corrupt."""
    if value + delta < 0:
        raise Corruption(f"counter {counter} would become {value + delta}")
    return value + delta


def adjusted_fields(record: S, **deltas: int) -> S:
    """`record` with each named counter changed by its delta, checked in the order given."""
    changed = {name: adjusted(name, getattr(record, name), delta) for name, delta in deltas.items()}
    return msgspec.structs.replace(record, **changed)
