"""ListQueues and ListTopics: pages of a domain's queues or topics, in name order.

A queue's or topic's row key is its kind, its domain and its name (projections/keys.py), so the
rows of a domain's queues (or topics) whose names start with a prefix are one key range in name
order: a page is a scan of that range from just after the last name of the page before. A deleted
resource leaves no row, so every row examined is one returned and a page costs its length.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from keyload import limits
from keyload.bodies import ListQueues, ListTopics
from keyload.log.codec import Record
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.queues.state import bounded, check_name
from keyload.projections import keys
from keyload.projections.records import QueueRecord, TopicRecord
from keyload.projections.store import Staged


@dataclass(frozen=True, slots=True)
class Listed:
    """A kind of named resource a page lists: its row key, stored record and name rule."""

    kind: str  # "queue": the view's name field; "queues": the page's field
    key_of: Callable[[str, str], bytes]  # (domain, name) -> row key
    record: type[QueueRecord] | type[TopicRecord]
    max_chars: int
    pattern: re.Pattern[str]


QUEUES = Listed("queue", keys.queue, QueueRecord, limits.MAX_QUEUE_NAME_CHARS, limits.QUEUE_NAME_PATTERN)
TOPICS = Listed("topic", keys.topic, TopicRecord, limits.MAX_TOPIC_NAME_CHARS, limits.TOPIC_NAME_PATTERN)


def list_queues(stage: Staged, body: ListQueues, ctx: Context) -> Record:
    return page(stage, QUEUES, ctx.domain, body.prefix, body.after, body.max_queues)


def list_topics(stage: Staged, body: ListTopics, ctx: Context) -> Record:
    return page(stage, TOPICS, ctx.domain, body.prefix, body.after, body.max_topics)


def page(stage: Staged, listed: Listed, domain: str, prefix: str, after: str | None, limit: int | None) -> Record:
    """The views (as Inspect shows them) of the domain's resources whose names start with `prefix`, in
    name order after `after`: at most `limit` (null: DEFAULT_LIST_RESOURCES), and the name to read
    on after when more follow."""
    kind = listed.kind
    if prefix:
        check_name(f"{kind} prefix", prefix, listed.max_chars, listed.pattern)
    if after is not None:
        check_name(f"{kind} after", after, listed.max_chars, listed.pattern)
        if not after.startswith(prefix):
            raise Rejected(ErrorCode.VALIDATION, "after must start with the prefix")
    count = bounded(f"max_{kind}s", limit, limits.DEFAULT_LIST_RESOURCES, 1, limits.MAX_LIST_RESOURCES)
    start_prefix = listed.key_of(domain, prefix)
    start = start_prefix if after is None else listed.key_of(domain, after) + b"\x00"
    views: list[Record] = []
    more = False
    for _, row in stage.scan(start, keys.prefix_end(start_prefix)):
        if len(views) == count:
            more = True
            break
        views.append(listed.record.decode(row).view.to_avro())
    return {f"{kind}s": views, "next_after": views[-1][kind] if more else None}
