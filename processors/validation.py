"""Checks of command fields against the named limits (keyload.limits), refusing what is out of range."""

from __future__ import annotations

from keyload.limits import INTEGER_FIELD_RANGES
from keyload.processors.errors import ErrorCode, Rejected


def check_integer(field: str, value: int) -> None:
    """Refuse a command's integer outside the range INTEGER_FIELD_RANGES gives `field` ("Record.field")."""
    rule = INTEGER_FIELD_RANGES[field]
    if not rule.contains(value):
        assert rule.code is not None, f"{field} is never refused"
        raise Rejected(rule.code, rule.describe(field.rsplit(".", 1)[1]))


def check_fence(field: str, expected: int | None, current: int, detail: str) -> None:
    """An optional expected revision (a policy version, an incarnation, a generation): none, or in
    its range and equal to `current`; else RevisionConflict with `detail`."""
    if expected is None:
        return
    check_integer(field, expected)
    if expected != current:
        raise Rejected(ErrorCode.REVISION_CONFLICT, detail)
