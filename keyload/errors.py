"""Typed exceptions for rejected commands, one per error code."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .results import Outcome


class KeyloadError(Exception):
    """Base of every error the SDK raises."""


class OutcomeTimeout(KeyloadError):
    """No outcome arrived in time. The command may or may not have been applied:
    submit again with the same `command_id` to learn its outcome without applying it twice."""

    def __init__(self, command_id: str, timeout_s: float) -> None:
        super().__init__(f"no outcome for command {command_id!r} within {timeout_s:g}s (is `keyload run` running?)")
        self.command_id = command_id


class CommandRejected(KeyloadError):
    """The command was applied and rejected; `outcome` is its durable receipt."""

    code = ""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(f"{outcome.error_code}: {outcome.detail}")
        self.outcome = outcome

    @property
    def failed_index(self) -> int | None:
        """A rejected batch or processing: the index of the mutation that failed."""
        return self.outcome.failed_index


class ValidationError(CommandRejected):
    code = "Validation"


class NotFoundError(CommandRejected):
    code = "NotFound"


class ConflictError(CommandRejected):
    code = "Conflict"


class RevisionConflictError(CommandRejected):
    code = "RevisionConflict"


class PermissionDeniedError(CommandRejected):
    code = "PermissionDenied"


class ResourceExhaustedError(CommandRejected):
    code = "ResourceExhausted"


class StaleLeaseError(CommandRejected):
    code = "StaleLease"


class LeaseExpiredError(CommandRejected):
    code = "LeaseExpired"


class TokenInvalidatedError(CommandRejected):
    code = "TokenInvalidated"


class DispatchPausedError(CommandRejected):
    code = "DispatchPaused"


class HistoryUnavailableError(CommandRejected):
    code = "HistoryUnavailable"


class DuplicateEventIdError(CommandRejected):
    code = "DuplicateEventId"


class BudgetExceededError(CommandRejected):
    code = "BudgetExceeded"


class UnsupportedCapabilityError(CommandRejected):
    code = "UnsupportedCapability"


BY_CODE: dict[str, type[CommandRejected]] = {
    cls.code: cls
    for cls in (
        ValidationError,
        NotFoundError,
        ConflictError,
        RevisionConflictError,
        PermissionDeniedError,
        ResourceExhaustedError,
        StaleLeaseError,
        LeaseExpiredError,
        TokenInvalidatedError,
        DispatchPausedError,
        HistoryUnavailableError,
        DuplicateEventIdError,
        BudgetExceededError,
        UnsupportedCapabilityError,
    )
}


def rejection(outcome: Outcome) -> CommandRejected:
    return BY_CODE.get(outcome.error_code or "", CommandRejected)(outcome)
