"""Error codes (a closed set and a contract) and the exceptions processors raise."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    VALIDATION = "Validation"
    NOT_FOUND = "NotFound"
    CONFLICT = "Conflict"
    REVISION_CONFLICT = "RevisionConflict"
    PERMISSION_DENIED = "PermissionDenied"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    STALE_LEASE = "StaleLease"
    LEASE_EXPIRED = "LeaseExpired"
    TOKEN_INVALIDATED = "TokenInvalidated"
    DISPATCH_PAUSED = "DispatchPaused"
    HISTORY_UNAVAILABLE = "HistoryUnavailable"
    DUPLICATE_EVENT_ID = "DuplicateEventId"
    BUDGET_EXCEEDED = "BudgetExceeded"
    UNSUPPORTED_CAPABILITY = "UnsupportedCapability"
    CORRUPTION = "Corruption"
    RECOVERY_REQUIRED = "RecoveryRequired"


class Rejected(Exception):
    """The command is refused; it leaves no effect and its outcome records why.

    `detail` is shown to the submitter: it never echoes bodies, tokens or keys.
    `failed_index` names the mutation of a batch (or of a processing's effects) that failed.
    """

    def __init__(self, code: ErrorCode, detail: str, failed_index: int | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.failed_index = failed_index


class Corruption(Exception):
    """The projection contradicts itself: the partition halts, nothing is committed."""

    code = ErrorCode.CORRUPTION
