"""keyload: a durable messaging engine built as an event-sourced log processor.

The public surface is what this module exports: the `Client`, the exception root and the
error codes, the typed results a client sends and receives, and the consumer helpers'
options. Everything else (`keyload.sdk`, `keyload.service`, `keyload.processors`, ...) is
reachable for operators and tests but not promised to stay where it is.
"""

from keyload.errors import CommandRejected, ErrorCode, KeyloadError, OutcomeTimeout
from keyload.projections.records import MessageState, PositionState
from keyload.sdk.client import Client
from keyload.sdk.consumer import ConsumeStats, ExactlyOnce
from keyload.sdk.results import (
    CancelMessage,
    DeleteDocument,
    Delivery,
    Document,
    EnqueueMessage,
    Event,
    GroupDelivery,
    GroupPolicy,
    Mutation,
    ParkPendingMessage,
    PublishEvents,
    PutDocument,
    QueuePolicy,
    RedriveMessage,
    TopicPolicy,
)
from keyload.version import __version__

__all__ = [
    "CancelMessage",
    "Client",
    "CommandRejected",
    "ConsumeStats",
    "DeleteDocument",
    "Delivery",
    "Document",
    "EnqueueMessage",
    "ErrorCode",
    "Event",
    "ExactlyOnce",
    "GroupDelivery",
    "GroupPolicy",
    "KeyloadError",
    "MessageState",
    "Mutation",
    "OutcomeTimeout",
    "ParkPendingMessage",
    "PositionState",
    "PublishEvents",
    "PutDocument",
    "QueuePolicy",
    "RedriveMessage",
    "TopicPolicy",
    "__version__",
]
