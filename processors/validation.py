"""Checks of command fields against the named limits (keyload.limits), refusing what is out of range."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from keyload.limits import INTEGER_FIELD_RANGES
from keyload.log.codec import Record
from keyload.processors.errors import ErrorCode, Rejected
from keyload.projections.records import AvroRecord

Body = TypeVar("Body", bound=AvroRecord)


def read_body(kind: type[Body], body: Record) -> Body:
    """A decoded command body as its class (keyload/bodies.py). Decoding checks no range, so a writer
    that does not check can put a value past 32 bits into an Avro int: that body is refused
    (Validation, naming the field), never a halt."""
    try:
        return kind.from_avro(body)
    except msgspec.ValidationError as error:
        raise Rejected(ErrorCode.VALIDATION, f"the body does not fit its schema: {error}") from None


def check_integer(field: str, value: int) -> None:
    """Refuse a command's integer outside the range INTEGER_FIELD_RANGES gives `field` ("Record.field")."""
    rule = INTEGER_FIELD_RANGES[field]
    if not rule.contains(value):
        assert rule.code is not None, f"{field} is never refused"
        raise Rejected(rule.code, rule.describe(field.rsplit(".", 1)[1]))
