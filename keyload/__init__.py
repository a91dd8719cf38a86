"""keyload: a durable messaging engine built as an event-sourced log processor."""
