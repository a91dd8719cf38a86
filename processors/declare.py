"""A create that names a resource which already exists: from feature level 9, a declare.

Services declare what they use when they start (RabbitMQ's queue.declare, SQS's CreateQueue,
JetStream's add-stream), so a second start must not fail on its own queue. From feature level 9
(processors/features.py) a CreateQueue, CreateTopic or CreateGroup naming one that exists with the
same configuration returns it as it stands, changing nothing (no incarnation, no cap charged); with
another configuration it is Conflict, naming what differs, and ConfigureQueue (or ConfigureTopic,
ConfigureGroup) is the way to change it. Below level 9 it is Conflict, as the log's writers saw.
"""

from __future__ import annotations

from collections.abc import Callable

from keyload.log.codec import Record
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.features import CREATES_DECLARE, feature_level
from keyload.projections.store import Readable


def declared(stage: Readable, kind: str, differing: Callable[[], list[str]], view: Callable[[], Record]) -> Record:
    """The existing resource's view (`view()`) when the partition is at level 9 and the resource is
    configured as the create asks (`differing()`, the parts that are not, is empty); Conflict otherwise."""
    if feature_level(stage) < CREATES_DECLARE:
        raise Rejected(ErrorCode.CONFLICT, f"{kind} already exists")
    unlike = differing()
    if unlike:
        raise Rejected(ErrorCode.CONFLICT, f"{kind} already exists with another {' and '.join(unlike)}")
    return view()
