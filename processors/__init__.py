"""Deterministic command handlers: pure functions of (state, command, log position, log time)."""
