"""What a command is evaluated against besides the projection: its log position, time and keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keyload.processors.outcomes import Outbox
from keyload.projections.records import PrincipalRecord


@dataclass(frozen=True, slots=True)
class Context:
    partition: int
    offset: int
    now_ms: int  # the record's append time, clamped to be non-decreasing per partition
    command_id: str  # for a record without one (poison), "@<offset>"
    domain: str
    principal: str
    keyring: Mapping[str, bytes]  # configured key material by key id; never logged
    fired: dict[str, Any] = field(default_factory=dict)  # what advancing log time did first (a TickResult)
    reply_to: int | None = None
    fingerprint: bytes = b""
    outbox: Outbox = field(default_factory=Outbox)
    caller: PrincipalRecord | None = None  # the authenticated principal; None while access control is off
