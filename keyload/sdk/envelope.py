"""A command's envelope as the client builds it: the checks a command passes before it is appended,
and its encoding (the log record a credential signs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keyload import limits
from keyload.errors import CommandTooLarge, InvalidCommand
from keyload.log.codec import REGISTRY
from keyload.log.file_log import DEFAULT_CONFIG as FILE_LOG_CONFIG
from keyload.sdk.results import Outcome

COMMAND = "keyload.Command"
# Both logs accept records up to the file log's limit (log/kafka_log.py MAX_RECORD_BYTES); a
# command's signature takes up to this many bytes around it (key id, MAC, framing).
MAX_COMMAND_BYTES = FILE_LOG_CONFIG.max_record_bytes - limits.SIGNATURE_BYTES
SHOWN_NAME_CHARS = 64  # of a caller's kind or event id quoted back in a client-side message
_FIELDS_SHOWN = 3


def _command_kinds() -> frozenset[str]:
    body = next(f for f in REGISTRY.schema(COMMAND)["fields"] if f["name"] == "body")
    return frozenset(branch["name"] for branch in body["type"])


COMMAND_KINDS = _command_kinds()


def shown(name: str) -> str:
    """A caller's own name, quoted and cut short for an error message."""
    return repr(name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS] + "…")


def mismatched_fields(envelope: dict[str, Any]) -> str:
    """Which schema fields a command does not match, named by schema path (never by value), as
    " at PATH, ..." ("" when it cannot say)."""
    found = REGISTRY.mismatched_fields(COMMAND, envelope)
    if not found:  # the schema's types fit: a string UTF-8 cannot carry is what is left to fail
        kind, body = envelope["body"]
        where = _unencodable(body, kind) or _unencodable({**envelope, "body": None}, COMMAND)
        return "" if where is None else f" at {where} (a string holding a lone surrogate, which UTF-8 cannot carry)"
    more = f" and {len(found) - _FIELDS_SHOWN} more" if len(found) > _FIELDS_SHOWN else ""
    return f" at {', '.join(found[:_FIELDS_SHOWN])}{more}"


def _unencodable(value: Any, path: str) -> str | None:
    """The path of the first string within `value` that UTF-8 cannot carry (a lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _unencodable(key, f"{path} (a key)") or _unencodable(item, f"{path}.{key}")
        if found is not None:
            return found
    return None


def encode_command(envelope: dict[str, Any]) -> bytes:
    """The command's log record; InvalidCommand (short, nothing echoed but names) when it cannot be one."""
    kind = envelope["body"][0]
    if not isinstance(kind, str) or kind not in COMMAND_KINDS:
        named = shown(kind) if isinstance(kind, str) else type(kind).__name__
        raise InvalidCommand(f"unknown command kind {named}; nothing was appended")
    try:
        value = REGISTRY.encode(COMMAND, envelope)
    except Exception:  # fastavro raises ValueError, TypeError, ... whose text may hold the schema or the body
        where = mismatched_fields(envelope)
        raise InvalidCommand(f"{kind} does not match its schema{where}; nothing was appended") from None
    if len(value) > MAX_COMMAND_BYTES:
        raise CommandTooLarge(
            f"the command is {len(value)} bytes, over the {MAX_COMMAND_BYTES} bytes a command may take (the "
            f"log's record limit of {FILE_LOG_CONFIG.max_record_bytes} bytes less {limits.SIGNATURE_BYTES} for "
            "its signature); nothing was appended"
        )
    return value


def long_poll_s(body: dict[str, Any]) -> float:
    """How long a command's own long poll may keep its outcome back (a Receive's or GroupReceive's
    `wait_ms`, up to MAX_WAIT_MS; a bound the processor refuses counts as that bound): a client
    waits that long before its timeout starts."""
    wait_ms = body.get("wait_ms")
    return min(max(wait_ms, 0), limits.MAX_WAIT_MS) / 1000 if isinstance(wait_ms, int) else 0.0


def unsealed_note(unsealed: Sequence[Outcome]) -> str:
    """What the timeout says of outcomes for the command that were not sealed with the client's key."""
    if not unsealed:
        return ""
    claim = f"{unsealed[0].error_code}: {unsealed[0].detail}" if unsealed[0].status != "committed" else "committed"
    return (
        f"; {len(unsealed)} outcome(s) for it were not sealed with this client's key and were ignored "
        f"(unverified, the first says {claim!r}: the service answers so when it cannot authenticate a "
        "command, for an unknown principal or key or a bad signature)"
    )


def check_command_id(command_id: str) -> None:
    """The processor's rule, checked before appending: a bad id would never get an outcome."""
    well_formed = isinstance(command_id, str) and 1 <= len(command_id) <= limits.MAX_COMMAND_ID_CHARS
    if not well_formed or not limits.ID_PATTERN.fullmatch(command_id):
        raise InvalidCommand(f"command id must be 1..{limits.MAX_COMMAND_ID_CHARS} printable ASCII characters")
