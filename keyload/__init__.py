"""keyload: a durable messaging engine built as an event-sourced log processor."""

from keyload.sdk.client import Client
from keyload.version import __version__

__all__ = ["Client", "__version__"]
