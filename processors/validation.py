"""Checks of command fields against the named limits (keyload.limits), refusing what is out of range."""

from __future__ import annotations

from keyload.limits import INTEGER_FIELD_RANGES
from keyload.processors.errors import Rejected


def check_integer(field: str, value: int) -> None:
    """Refuse a command's integer outside the range INTEGER_FIELD_RANGES gives `field` ("Record.field")."""
    rule = INTEGER_FIELD_RANGES[field]
    if not rule.contains(value):
        assert rule.code is not None, f"{field} is never refused"
        raise Rejected(rule.code, rule.describe(field.rsplit(".", 1)[1]))
