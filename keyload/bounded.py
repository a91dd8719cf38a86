"""Bounded memories of recent answers: the processor's read cache of small rows, the HTTP API's
accepted bearer tokens, a client's upload handles. Each holds at most a named number of entries,
and the oldest one goes first (a dict keeps its insertion order)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(memory: dict[K, V], key: K, value: V, bound: int) -> None:
    """`memory[key] = value`, forgetting the oldest entry first when `bound` are kept and `key` is
    not one of them."""
    if key not in memory and len(memory) >= bound:
        del memory[next(iter(memory))]
    memory[key] = value
