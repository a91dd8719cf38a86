"""`partition_for` (log/base.py), the one domain→partition rule: SHA-256 of the UTF-8 domain, first 8
bytes big-endian, modulo the partition count, whether or not the answer is remembered; only names no
longer than a domain may be are remembered (the HTTP API routes a request before checking its
domain), and a bad partition count is refused every time."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyload import limits
from keyload.log import base
from keyload.log.base import partition_for


def by_the_rule(domain: str, partitions: int) -> int:
    return int.from_bytes(hashlib.sha256(domain.encode("utf-8")).digest()[:8], "big") % partitions


@given(st.text(max_size=200), st.integers(1, 1024))
def test_every_name_follows_the_rule_remembered_or_not(domain: str, partitions: int) -> None:
    assert partition_for(domain, partitions) == by_the_rule(domain, partitions)
    assert partition_for(domain, partitions) == by_the_rule(domain, partitions)  # remembered, if it may be


def test_only_names_no_longer_than_a_domain_are_remembered() -> None:
    base._remembered_partition.cache_clear()
    partition_for("d" * limits.MAX_DOMAIN_CHARS, 4)
    for size in (limits.MAX_DOMAIN_CHARS + 1, 1_000_000):
        partition_for("x" * size, 4)
    assert base._remembered_partition.cache_info().currsize == 1


def test_a_partition_count_below_one_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="partitions must be >= 1"):
            partition_for("orders", 0)
