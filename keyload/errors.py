"""Every exception the SDK and the CLI raise derives from `KeyloadError`.

Catch `KeyloadError` to handle anything keyload refuses or cannot do; messages
are one short line and never echo bodies, tokens or key material. The
hierarchy (each class lives in the module named; the base classes of
subsystems other than the SDK are defined there so that those modules stay
free of SDK imports):

    KeyloadError                          keyload.errors
    ├── CommandRejected                   the command was applied and rejected (`outcome` is its receipt)
    │   └── ValidationError, NotFoundError, ConflictError, ... one per error code (`BY_CODE`)
    ├── OutcomeTimeout                    no outcome in time: resubmit with the same command id
    ├── ServiceUnavailable                a keyload server cannot take the command now: resubmit with the same id
    ├── UnreadableOutcome                 applied, but its outcome holds what this SDK cannot read (a newer server's)
    ├── CoalescerTimeout (also TimeoutError)  keyload.sdk.coalescer: no room for a call, or no answers, in time
    ├── InvalidCommand (also ValueError)  refused by the client before appending: nothing was appended
    │   └── CommandTooLarge               the encoded command is over the log's record limit
    ├── DataDirError                      keyload.storage.datadir: the data directory is missing or unreadable
    ├── KeyringError                      keyload.storage.keyring: the keyring file is missing or malformed
    ├── LogError                          keyload.log.base: the log cannot serve the request
    │   ├── LogCorruption                 a record inside a partition fails its checksum
    │   ├── LogTruncated                  an offset below the log's start (its records were truncated)
    │   └── TopicMismatch                 keyload.log.kafka_log: Kafka topics not as configured
    ├── CodecError                        keyload.log.codec: bytes that are not the expected Avro value
    │   └── UnknownSchema                 an unknown writer schema fingerprint
    ├── StoreError                        keyload.projections.store: a projection cannot be opened or written
    ├── CheckpointError                   keyload.operations.checkpoints: a checkpoint cannot be fetched or published
    │   └── CheckpointDamaged             objects missing or not the published bytes: no restore can use it
    ├── CatalogError                      keyload.operations.catalog: the checkpoint catalog cannot be read or written
    │   └── NotPublished                  a pin names an offset that is not a published checkpoint
    ├── RecoveryError                     keyload.operations.recovery: a replay or drill cannot run as asked
    │   ├── ReplayDiverged                the log does not hold the record the start state applied last
    │   └── CheckpointUnusable            the checkpoint a replay starts from cannot be fetched or verified
    ├── ObjectStoreError                  keyload.storage.object_store: the object store cannot serve the request
    │   └── ObjectConflict, ObjectCorrupt, ObjectStoreUnavailable (no answer: the same request may succeed later)
    ├── PayloadError                      keyload.sdk.payloads: a large payload cannot be uploaded or read
    │   └── PayloadConflict
    ├── EnvironmentFault (also OSError)   an OSError met on the way, translated by `map_exceptions`
    ├── BrokerError                       a Kafka client exception, translated by `map_exceptions`
    ├── AlreadyServed                     keyload.service.embedded: another `keyload run` serves the data directory
    ├── AccessControlOff                  keyload.service.embedded: a partition refused to turn access control on
    ├── FeatureLevelAhead                 keyload.service.embedded: a projection above this keyload's feature level
    ├── CensusError                       a partition has no projection to count (`keyload census`, `Client.census`)
    ├── CredentialError                   keyload.credentials: a credential file is missing or malformed
    ├── Stalled                           keyload.service.runtime: a partition could not make its group durable
    └── UsageError                        keyload.cli: bad command-line input (the CLI exits 2)

The CLI runs every command inside `map_exceptions()` (below: OSError, JSON decoding errors,
ValueError and Kafka client exceptions become errors of this tree), prints any of them as one
line, `keyload: <message>` on stderr, and exits with the code of its class in one table
(keyload/cli/main.py: 2 for a UsageError, 1 for everything else; 130 on Ctrl-C).

Not part of it: the processors' internal signals (`keyload.processors`:
`Rejected`, `Corruption`, `MissingKey`, `HandleError`), which the runtime turns
into outcomes, halts or one of the errors above, and the development servers'
`DevServerError` (tests and benchmarks only).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyload.sdk.results import Outcome


class ErrorCode(StrEnum):
    """The error codes of refused commands: a closed set and a contract (keyload.ErrorCode.avsc)."""

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


class KeyloadError(Exception):
    """The root of every error the SDK and the CLI raise (the module docstring lists them)."""


class InvalidCommand(KeyloadError, ValueError):
    """The client refused the command before appending it: nothing was appended, so nothing was applied.

    An unknown command kind, a body that does not match the kind's schema, a bad command id or
    argument. Fix the call; a retry of the same call fails the same way. Also a `ValueError`.
    """


class CommandTooLarge(InvalidCommand):
    """The encoded command is over the log's record limit: nothing was appended.

    Send a large body through the object store (`Client.schedule_large`)."""


class OutcomeTimeout(KeyloadError):
    """No outcome arrived in time. The command may or may not have been applied:
    submit again with the same `command_id` to learn its outcome without applying it twice."""

    def __init__(self, command_id: str, timeout_s: float, note: str = "") -> None:
        super().__init__(f"no outcome for command {command_id!r} within {timeout_s:g}s{note}")
        self.command_id = command_id


class ServiceUnavailable(KeyloadError):
    """A keyload server could not take the command now: it cannot be reached, the partition is halted,
    or its log cannot be written. Nothing may have been applied, or it may: resubmit with the same
    `command_id` to learn its outcome without applying it twice."""


class UnreadableOutcome(KeyloadError):
    """The command was applied, but the server's answer holds what this SDK cannot represent: a
    newer server's value (an enum symbol this SDK does not know in a result) or an answer that is
    not an outcome at all. Nothing is lost: the outcome is stored. Upgrade the SDK, then submit
    again with the same `command_id` to read it without applying the command twice. (A rejected
    outcome whose error code this SDK does not know is still a `CommandRejected`, its
    `outcome.error_code` the code as a string.)"""

    def __init__(self, command_id: str, reason: str) -> None:
        super().__init__(f"the outcome of command {command_id!r} cannot be read by this SDK: {reason}")
        self.command_id = command_id


class CoalescerTimeout(KeyloadError, TimeoutError):
    """A caller of a coalescer (keyload/sdk/coalescer.py) waited longer than it allows: for room to hand
    a call in (`block_s`: nothing was handed in), or for the answers of `flush` or `close`. Defined
    here so that the tree above names it. Also a `TimeoutError`."""


class CensusError(KeyloadError):
    """A partition's projection cannot be counted (`keyload census`, `Client.census`): it has none here
    yet, or it is not a projection. Defined here rather than beside the census (keyload/operations/census.py)
    so that a client of a server raises it without loading the engine."""


class CommandRejected(KeyloadError):
    """The command was applied and rejected; `outcome` is its durable receipt."""

    code = ""

    def __init__(self, outcome: Outcome, message: str | None = None) -> None:
        """`message` replaces the default "code: detail" text (the SDK names a batch's events by
        their ids there); `outcome.detail` stays as the processor stored it."""
        super().__init__(message or f"{outcome.error_code}: {outcome.detail}")
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


def rejection(outcome: Outcome, message: str | None = None) -> CommandRejected:
    """The typed exception of a rejected outcome (`CommandRejected` itself for an unknown code)."""
    return BY_CODE.get(outcome.error_code or "", CommandRejected)(outcome, message)


# -- translating foreign exceptions ------------------------------------------------------------

FOREIGN_KAFKA_MODULES = ("confluent_kafka", "cimpl")  # KafkaException's module, matched by name


class EnvironmentFault(KeyloadError, OSError):
    """The operating system refused what keyload asked of it (a missing or unreadable file or
    directory, no permission, a full disk). Also an `OSError`, with its `errno` and `filename`."""


class BrokerError(KeyloadError):
    """Kafka (confluent_kafka) failed a request keyload made of it."""


def _oserror_message(exc: OSError) -> str:
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{reason}: {exc.filename}" if exc.filename is not None else reason


@contextmanager
def map_exceptions() -> Iterator[None]:
    """Translate the foreign exceptions the SDK and the CLI can meet into the `KeyloadError` tree.

    KeyloadError passes as it is. Otherwise:

        OSError (PermissionError, FileNotFoundError, a full disk, ...)  → EnvironmentFault
        json.JSONDecodeError (a config or keyring file that is not JSON) → KeyloadError (where, and why)
        ValueError (a malformed argument or body)                        → InvalidCommand
        confluent_kafka.KafkaException (matched by module, never imported) → BrokerError

    The original exception is chained (`__cause__`) for a debugger; the message is one line.
    KeyboardInterrupt and SystemExit are not touched.
    """
    try:
        yield
    except KeyloadError:
        raise
    except json.JSONDecodeError as exc:
        raise KeyloadError(f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except OSError as exc:
        fault = EnvironmentFault(exc.errno, _oserror_message(exc))
        fault.filename = exc.filename
        raise fault from exc
    except ValueError as exc:
        raise InvalidCommand(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in FOREIGN_KAFKA_MODULES:
            raise BrokerError(f"kafka: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        raise
