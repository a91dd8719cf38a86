"""Authorization: one step every command passes before it is applied.

Until access control lands (DESIGN.md §9) every well-formed principal may do
everything; the step exists so that adding policy changes no call site.
"""

from __future__ import annotations

from keyload.processors.context import Context


def authorize(ctx: Context, command_kind: str) -> None:
    """Raise Rejected(PermissionDenied) when `ctx.principal` may not run `command_kind`."""
    return None
