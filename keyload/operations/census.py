"""A partition's census: what its projection holds, by key family, and what bounded work is left.

State should grow with what is live, not with what was ever processed (DESIGN.md's bounded-state
promise), and this is how an operator sees whether it does: rows and bytes per key family
(projections/keys.py), and the work the processor still has queued behind the records it applies —
deleted queues, groups and topics being reclaimed, retention tasks waiting for the GC worker,
timers already due, and the rows kept to a horizon (processors/horizons.py) by family: still within
it, or past it and left for the sweep. And the domains that hold as much as a cap allows
(processors/usage.py): their next create of that kind is refused, which a tenant sees as
ResourceExhausted and an operator sees here. It reads a projection read-only, beside a running service,
with one scan of every row: its cost grows with the projection (about a second per million rows),
so it is an operator's command (`keyload census`, `Client.census`, `GET /v1/census`), never a
processor's.
"""

from __future__ import annotations

from keyload.errors import CensusError as CensusError
from keyload.processors import usage
from keyload.processors.horizons import NAMES_OUTCOME
from keyload.projections import keys
from keyload.projections.records import DomainRecord
from keyload.projections.store import NO_OFFSET, Store
from keyload.sdk.results import Census as Census
from keyload.sdk.results import DomainAtCap as DomainAtCap
from keyload.sdk.results import FamilyCount as FamilyCount
from keyload.sdk.results import HorizonCount as HorizonCount
from keyload.storage.datadir import DataDir

# Each family tag's name, from projections/keys.py's constant for it ("message", "retired_group", ...).
FAMILY_NAMES = {
    value: name.lower()
    for name, value in vars(keys).items()
    if name.isupper() and isinstance(value, bytes) and len(value) == 1 and value in keys.FAMILY_VALUES
}
# The families whose rows are work still queued, by what they count.
RECLAIMING = {keys.RETIRED: "queues", keys.RETIRED_GROUP: "groups", keys.RETIRED_TOPIC: "topics"}
MAX_CENSUS_AT_CAP = 1000  # (domain, kind) pairs at their cap listed per partition; `at_cap_total` counts all


def census(data: DataDir, partition: int) -> Census:
    """Count partition `partition`'s projection, read-only."""
    data.check_partition(partition)
    path = data.projection(partition)
    if not path.is_dir():
        raise CensusError(f"partition {partition} has no projection yet: `keyload run` creates it")
    store = Store(path, read_only=True)
    try:
        return _count(store, partition)
    finally:
        store.close()


def censuses(data: DataDir, partition: int | None = None) -> list[Census]:
    """The census of `partition`, or of every partition whose projection lives in `data` (in Kafka
    mode only the partitions this machine's processor holds or has held)."""
    return [census(data, number) for number in (data.projected_partitions() if partition is None else [partition])]


def _count(store: Store, partition: int) -> Census:
    last = store.get(keys.LAST_TIME)
    now = None if last is None else keys.read_u64(last)
    counts: dict[bytes, list[int]] = {}
    horizons: dict[bytes, list[int]] = {}  # by the family of the rows kept: [kept, due]
    waiting = 0
    at_cap: list[DomainAtCap] = []
    at_cap_total = 0
    counting = usage.counting(store)
    for key, value in store.scan(b"", b"\xff"):
        count = counts.setdefault(key[:1], [0, 0, 0])
        count[0] += 1
        count[1] += len(key)
        count[2] += len(value)
        if key[:1] == keys.OUTCOME and len(value) == keys.SHA256_BYTES:
            waiting += 1  # a long-poll receive still waiting: its fingerprint, no outcome yet
        elif key[:1] == keys.HORIZON:
            past = now is not None and keys.horizon_expiry(key) <= now
            horizons.setdefault(_kept(key, value), [0, 0])[1 if past else 0] += 1
        elif key[:1] == keys.DOMAIN_USAGE and not counting:
            reached = _at_cap(store, key[1:].decode("utf-8"), value)
            at_cap_total += len(reached)
            at_cap.extend(reached[: MAX_CENSUS_AT_CAP - len(at_cap)])
    families = tuple(
        FamilyCount(_name(tag), tag.decode("latin-1"), rows, key_bytes, value_bytes)
        for tag, (rows, key_bytes, value_bytes) in sorted(counts.items())
    )
    by_horizon = tuple(
        sorted((HorizonCount(_name(tag), kept, due) for tag, (kept, due) in horizons.items()), key=lambda h: h.family)
    )
    timers_due = 0
    if now is not None:
        timers_due = sum(1 for _ in store.scan(keys.DUE_QUEUE, keys.DUE_QUEUE + keys.u64(now + 1)))
    return Census(
        partition=partition,
        applied_offset=None if store.applied_offset == NO_OFFSET else store.applied_offset,
        families=families,
        rows=sum(family.rows for family in families),
        bytes=sum(family.key_bytes + family.value_bytes for family in families),
        reclaiming={kind: counts.get(tag, [0])[0] for tag, kind in RECLAIMING.items()},
        retention_tasks=counts.get(keys.RETENTION_TASK, [0])[0],
        timers_due=timers_due,
        horizon_due=sum(horizon.due for horizon in by_horizon),
        horizons=by_horizon,
        outcomes_without_horizon=counts.get(keys.OUTCOME, [0])[0] - waiting - sum(horizons.get(keys.OUTCOME, [0])),
        usage_counting=counting,
        retention_indexing=store.get(keys.RETENTION_INDEX_CURSOR) is not None,
        at_cap=tuple(at_cap),
        at_cap_total=at_cap_total,
    )


def _at_cap(store: Store, domain: str, held: bytes) -> list[DomainAtCap]:
    """The kinds `domain` (its usage row: `held`) holds as much of as its caps allow. A cap of 0 on a
    kind the domain holds none of forbids the kind rather than being reached: not listed."""
    policy = store.get(keys.domain_policy(domain))
    bounds = usage.caps(None if policy is None else DomainRecord.decode(policy))
    return [
        DomainAtCap(domain, kind.usage, amount, cap)
        for kind, amount, cap in zip(usage.CAPPED, usage.USAGE.unpack(held), bounds, strict=True)
        if amount and amount >= cap
    ]


def _kept(key: bytes, entry: bytes) -> bytes:
    """The family tag of the row a horizon index entry keeps: a command's outcome or receipt (its
    entry says which), or the row it names."""
    row = keys.horizon_row(key)
    if row is not None:
        return row[:1]
    return keys.OUTCOME if entry[:1] == NAMES_OUTCOME else keys.RECEIPT


def _name(tag: bytes) -> str:
    return FAMILY_NAMES.get(tag, tag.hex())
