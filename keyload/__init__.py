"""keyload: a durable messaging engine built as an event-sourced log processor."""

__version__ = "0.1.0"
