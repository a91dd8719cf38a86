"""keyload: a durable messaging engine built as an event-sourced log processor.

The public surface is what this module exports: the `Client`, the exception root and the
error codes, the typed results a client sends and receives, the consumer helpers'
options, and the `Coalescer` (many threads' enqueues and acks as batch commands).
Everything else (`keyload.sdk`, `keyload.service`, `keyload.processors`, ...) is
reachable for operators and tests but not promised to stay where it is.

Names are loaded when first used (PEP 562), so `import keyload.cli` or `keyload.errors`
does not load the SDK and its schema registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from keyload.version import __version__

if TYPE_CHECKING:
    from keyload.commands import Capability
    from keyload.credentials import Credential
    from keyload.errors import CommandRejected, ErrorCode, KeyloadError, OutcomeTimeout
    from keyload.projections.records import MessageState, PositionState
    from keyload.sdk.async_client import AsyncClient
    from keyload.sdk.client import Client, Lane, LaneOutcome
    from keyload.sdk.coalescer import Coalescer
    from keyload.sdk.consumer import ConsumeStats, ExactlyOnce
    from keyload.sdk.results import (
        CancelMessage,
        DeleteDocument,
        Delivery,
        Document,
        EnqueueMessage,
        Event,
        Grant,
        GroupDelivery,
        GroupPolicySpec,
        Mutation,
        ParkPendingMessage,
        PrincipalView,
        PublishEvents,
        PutDocument,
        QueuePolicySpec,
        RedriveMessage,
        TopicPolicySpec,
    )

_HOMES = {
    "Capability": "keyload.commands",
    "Credential": "keyload.credentials",
    "CommandRejected": "keyload.errors",
    "ErrorCode": "keyload.errors",
    "KeyloadError": "keyload.errors",
    "OutcomeTimeout": "keyload.errors",
    "MessageState": "keyload.projections.records",
    "PositionState": "keyload.projections.records",
    "Client": "keyload.sdk.client",
    "Lane": "keyload.sdk.client",
    "LaneOutcome": "keyload.sdk.client",
    "AsyncClient": "keyload.sdk.async_client",
    "Coalescer": "keyload.sdk.coalescer",
    "ConsumeStats": "keyload.sdk.consumer",
    "ExactlyOnce": "keyload.sdk.consumer",
}


def __getattr__(name: str) -> Any:
    if name not in __all__ or name == "__version__":
        raise AttributeError(f"module 'keyload' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES.get(name, "keyload.sdk.results")), name)
    globals()[name] = value
    return value


__all__ = [
    "AsyncClient",
    "CancelMessage",
    "Capability",
    "Client",
    "Coalescer",
    "CommandRejected",
    "ConsumeStats",
    "Credential",
    "DeleteDocument",
    "Delivery",
    "Document",
    "EnqueueMessage",
    "ErrorCode",
    "Event",
    "ExactlyOnce",
    "Grant",
    "GroupDelivery",
    "GroupPolicySpec",
    "KeyloadError",
    "Lane",
    "LaneOutcome",
    "MessageState",
    "Mutation",
    "OutcomeTimeout",
    "ParkPendingMessage",
    "PositionState",
    "PrincipalView",
    "PublishEvents",
    "PutDocument",
    "QueuePolicySpec",
    "RedriveMessage",
    "TopicPolicySpec",
    "__version__",
]
