"""Logging setup for keyload's processes: the standard `logging` module, configured once.

`configure(level, json=False)` sends keyload's records to stderr: by default one
human-readable line each, `keyload: <message>`; with `json=True` one JSON object per line
(`{"ts": ..., "level": ..., "logger": ..., "message": ...}`, plus `"error"` when a record
carries an exception). Libraries' own loggers stay at WARNING whatever `level` is, so their
chatter stays out of the output. The handler writes to whatever `sys.stderr` is when a
record is emitted (a test capturing stderr sees the lines), and configuring again replaces it.
"""

from __future__ import annotations

import json as jsonlib
import logging
import sys
import time

LOGGER = "keyload"
_MARK = "_keyload_handler"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on the current `sys.stderr`, looked up at each record."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class HumanFormatter(logging.Formatter):
    """`keyload: message` (an exception adds its one-line text, never a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message = f"{message}: {record.exc_info[1]}"
        return f"keyload: {message}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        return jsonlib.dumps(entry, ensure_ascii=False)


def configure(level: int | str = logging.WARNING, json: bool = False) -> logging.Logger:
    """Send keyload's log records at `level` and above to stderr, as text or as JSON lines."""
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(handler)
    handler = _Stderr()
    setattr(handler, _MARK, True)
    handler.setFormatter(JsonFormatter() if json else HumanFormatter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # libraries: warnings and errors only
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    return logger


def settings() -> tuple[int, bool]:
    """The level and form (`json`) `configure` last set, for a child process to configure alike."""
    root = logging.getLogger()
    json = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers if getattr(h, _MARK, False))
    return logging.getLogger(LOGGER).getEffectiveLevel(), json


def get(name: str = LOGGER) -> logging.Logger:
    """A keyload logger (`keyload` or `keyload.<part>`)."""
    return logging.getLogger(name if name.startswith(LOGGER) else f"{LOGGER}.{name}")
