"""Per-domain caps: what a domain holds of each kind its caps bound, kept from feature level 5.

Domains share a partition, so what one can create is bounded: queues, topics, subscription groups,
live documents and their values' bytes (ConfigureDomainCaps, an operator's, processors/domains.py;
the defaults are in keyload/limits.py). A create, or a document write, that would take the domain
past a cap is ResourceExhausted and does nothing; a delete gives its room back at once. Lowering a
cap below what the domain holds removes nothing: growth is refused until deletes bring the domain
under it. Document tombstones and the rows of deleted resources still being reclaimed do not count.

A cap needs the count of what the domain held before the level, and a partition may hold millions
of documents: counting them all in the RaiseFeatureLevel record would stall the partition. So the
raise counts what one record's timer budget allows (all of a small partition) and leaves the rest
to a usage count, a due-index entry (keys.USAGE_COUNT) that, like any timer, looks at a bounded
number of rows before each record: the `f`, `q` and `s` rows in key order from a
cursor (keys.USAGE_COUNT_CURSOR), a topic together with its groups, until it has passed them all.
Meanwhile a change to a row before the cursor is counted as it happens, and a row at or after it is
counted when the cursor reaches it, as it is then. The caps apply once the count is done
(DomainUsage.counted). Log order decides all of it, so a replay counts exactly the same.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import islice

from keyload import limits
from keyload.log.codec import Record
from keyload.processors.context import Context
from keyload.processors.counters import adjusted
from keyload.processors.errors import Corruption, ErrorCode, Rejected
from keyload.processors.features import DOMAIN_CAPS, feature_level
from keyload.processors.queues.state import move_due_entry
from keyload.projections import keys
from keyload.projections.records import DocumentRecord, DomainRecord, TopicRecord, load
from keyload.projections.store import Readable, Staged


@dataclass(frozen=True, slots=True)
class Capped:
    """One kind a domain's caps bound: its field in the usage row, its cap's field in the policy
    (DomainRecord, ConfigureDomainCaps, DomainView), the cap's default, and what the refusal calls it."""

    usage: str
    cap: str
    default: int
    noun: str


# The order of the usage row's u64s (keys.DOMAIN_USAGE) and of every Holding.
CAPPED = (
    Capped("queues", "max_queues", limits.DEFAULT_MAX_QUEUES, "queues"),
    Capped("topics", "max_topics", limits.DEFAULT_MAX_TOPICS, "topics"),
    Capped("groups", "max_groups", limits.DEFAULT_MAX_GROUPS, "subscription groups"),
    Capped("documents", "max_documents", limits.DEFAULT_MAX_DOCUMENTS, "documents"),
    Capped("document_bytes", "max_document_bytes", limits.DEFAULT_MAX_DOCUMENT_BYTES, "bytes of document values"),
)
USAGE = struct.Struct(">" + "Q" * len(CAPPED))
Holding = tuple[int, ...]  # an amount of each kind, in CAPPED order
NOTHING: Holding = (0,) * len(CAPPED)
# The families the count walks, in key order: documents, queues, topics (each topic with its groups).
COUNTED_FAMILIES = (keys.DOCUMENT, keys.QUEUE, keys.TOPIC)
assert list(COUNTED_FAMILIES) == sorted(COUNTED_FAMILIES)


def holding(**amounts: int) -> Holding:
    """A Holding from amounts by kind (CAPPED's `usage` names; a kind not named: 0)."""
    holding = tuple(amounts.pop(kind.usage, 0) for kind in CAPPED)
    assert not amounts, f"no such kinds: {sorted(amounts)}"
    return holding


def _plus(a: Holding, b: Holding) -> Holding:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def counting(stage: Readable) -> bool:
    """Whether the partition is still counting what it held when it reached level 5 (caps wait)."""
    return stage.get(keys.USAGE_COUNT_CURSOR) is not None


def held(stage: Readable, domain: str) -> Holding:
    """What `domain` holds (as counted so far, while the count runs)."""
    raw = stage.get(keys.domain_usage(domain))
    return NOTHING if raw is None else USAGE.unpack(raw)


def _put_held(stage: Staged, domain: str, usage: Holding) -> None:
    """Store what `domain` holds; a domain that holds nothing has no row."""
    if usage == NOTHING:
        stage.delete(keys.domain_usage(domain))
    else:
        stage.put(keys.domain_usage(domain), USAGE.pack(*usage))


def caps(policy: DomainRecord | None) -> Holding:
    """The caps in force under `policy` (None: none set; a null cap: its default)."""
    values = (None if policy is None else getattr(policy, kind.cap) for kind in CAPPED)
    return tuple(kind.default if value is None else value for kind, value in zip(CAPPED, values, strict=True))


def charge(stage: Staged, domain: str, row: bytes, **changes: int) -> None:
    """Count a change to what `domain` holds (`changes` by kind, as `holding` takes them), made at
    `row` (a queue's `q` key, a topic's `s` key for the topic and its groups, a document's `f` key);
    from level 5. ResourceExhausted, before anything is written, when the count is done and a
    growing kind would pass its cap."""
    if feature_level(stage) < DOMAIN_CAPS:
        return
    cursor = stage.get(keys.USAGE_COUNT_CURSOR)
    if cursor is not None and row >= cursor:  # the count has still to reach the row: it takes it as it is then
        return
    deltas = holding(**changes)
    after = tuple(
        adjusted(f"{kind.usage} of domain {domain}", value, delta)
        for kind, value, delta in zip(CAPPED, held(stage, domain), deltas, strict=True)
    )
    if cursor is None:
        bounds = caps(load(stage, keys.domain_policy(domain), DomainRecord))
        for kind, delta, value, cap in zip(CAPPED, deltas, after, bounds, strict=True):
            if delta > 0 and value > cap:
                raise Rejected(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"domain {domain} would hold {value} {kind.noun}, over its cap ({kind.cap} {cap}): delete "
                    "some first, or have an administrator raise the cap (ConfigureDomainCaps)",
                )
    _put_held(stage, domain, after)


def view(stage: Readable, domain: str, policy: DomainRecord) -> Record:
    """A DomainView's caps and usage: from level 5, else null."""
    if feature_level(stage) < DOMAIN_CAPS:
        return {kind.cap: None for kind in CAPPED} | {"usage": None}
    usage: Record = {kind.usage: value for kind, value in zip(CAPPED, held(stage, domain), strict=True)}
    usage["counted"] = not counting(stage)
    return {kind.cap: cap for kind, cap in zip(CAPPED, caps(policy), strict=True)} | {"usage": usage}


def start_count(stage: Staged, now_ms: int) -> None:
    """The raise to level 5: count what the partition holds. The raise itself counts as much as one
    record's timer budget does, so a small partition is counted at once; the rest is counted before
    the records after it (see the module docstring)."""
    _, cursor = _count(stage, COUNTED_FAMILIES[0], limits.TICK_EXAMINATION_BUDGET)
    _go_on(stage, cursor, None, now_ms)


def count_step(stage: Staged, due_ms: int, ctx: Context, budget: int) -> int:
    """The count, due before a record: at most about `budget` rows (see `_count`), then due again
    now, or done. Returns the rows looked at: at least one unless the count is done."""
    cursor = stage.get(keys.USAGE_COUNT_CURSOR)
    if cursor is None:
        raise Corruption("the usage count is due but has no cursor")
    examined, left = _count(stage, cursor, budget)
    _go_on(stage, left, due_ms, ctx.now_ms)
    return examined


def _count(stage: Staged, cursor: bytes, budget: int) -> tuple[int, bytes | None]:
    """Count rows from `cursor` until `budget` of them have been looked at (a topic's groups, at most
    MAX_GROUPS_PER_TOPIC, are looked at with it, so a step may pass the budget by that much), adding
    what they hold to their domains' usage. Returns the rows looked at and where the count goes on
    (None: it is done)."""
    found: dict[str, Holding] = {}
    examined = 0
    next_row: bytes | None = cursor
    while next_row is not None and examined < budget:
        family, room = next_row[:1], budget - examined
        rows = list(islice(stage.scan(next_row, keys.prefix_end(family)), room))
        last = None
        for key, value in rows:
            seen, holds = _row_holds(stage, key, value)
            domain = keys.domain_of(key)
            found[domain] = _plus(found.get(domain, NOTHING), holds)
            examined, last = examined + seen, key
            if examined >= budget:
                break
        if last is not None:
            next_row = last + b"\x00"  # the next key after it
        if len(rows) < room and (not rows or last == rows[-1][0]):  # the family is counted
            later = COUNTED_FAMILIES.index(family) + 1
            next_row = COUNTED_FAMILIES[later] if later < len(COUNTED_FAMILIES) else None
    for domain, holds in found.items():
        _put_held(stage, domain, _plus(held(stage, domain), holds))
    return examined, next_row


def _go_on(stage: Staged, cursor: bytes | None, due_ms: int | None, now_ms: int) -> None:
    """Let the count go on at `cursor`, due again at `now_ms` (its due entry moved from `due_ms`,
    None: it had none), or end it (`cursor` None)."""
    if cursor is None:
        stage.delete(keys.USAGE_COUNT_CURSOR)
    else:
        stage.put(keys.USAGE_COUNT_CURSOR, cursor)
    if due_ms is not None or cursor is not None:
        move_due_entry(stage, keys.USAGE_COUNT, due_ms, None if cursor is None else now_ms)


def _row_holds(stage: Readable, key: bytes, value: bytes) -> tuple[int, Holding]:
    """The rows looked at to count one `f`, `q` or `s` row, and what it adds to its domain's usage."""
    from keyload.processors.groups.group import count_groups  # groups are charged through this module

    family = key[:1]
    if family == keys.DOCUMENT:
        document = DocumentRecord.decode(value)
        return 1, NOTHING if document.deleted else holding(documents=1, document_bytes=len(document.value))
    if family == keys.QUEUE:
        return 1, holding(queues=1)
    groups = count_groups(stage, TopicRecord.decode(value).view.incarnation)
    return 1 + groups, holding(topics=1, groups=groups)
