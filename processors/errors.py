"""The exceptions processors raise; the error codes they carry are `keyload.errors.ErrorCode`."""

from __future__ import annotations

from keyload.errors import ErrorCode

__all__ = ["ErrorCode", "Rejected"]


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
