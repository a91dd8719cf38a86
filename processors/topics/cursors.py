"""Opaque read cursors of topic pages.

Its own module, with no state behind it, because stored pages carry cursors: the
projection migration (projections/migration.py) fills the cursor of pages stored
before cursors existed, exactly as a replay would compute it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct

from keyload.processors.errors import ErrorCode, Rejected

_CURSOR_HEAD = struct.Struct(">BQ")  # format version, position; then the check
_CURSOR_CHECK_BYTES = 4  # of SHA-256 over the head: a mistyped or cut cursor is refused
CURSOR_VERSION = 1


def cursor(position: int) -> str:
    """The opaque read cursor of a position: versioned, checked, base64url without padding.

    Clients pass it back as they got it; only this module reads it, so its format can grow.
    """
    head = _CURSOR_HEAD.pack(CURSOR_VERSION, position)
    packed = head + hashlib.sha256(head).digest()[:_CURSOR_CHECK_BYTES]
    return base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")


def cursor_position(text: str) -> int:
    """The position a cursor points at; Validation for anything `cursor` did not make."""
    try:
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        packed = b""
    head, check = packed[: _CURSOR_HEAD.size], packed[_CURSOR_HEAD.size :]
    if (
        len(head) == _CURSOR_HEAD.size
        and head[0] == CURSOR_VERSION
        and check == hashlib.sha256(head).digest()[:_CURSOR_CHECK_BYTES]
    ):
        position: int = _CURSOR_HEAD.unpack(head)[1]
        return position
    raise Rejected(ErrorCode.VALIDATION, "cursor is not one a topic page returned")
