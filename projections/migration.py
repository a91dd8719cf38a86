"""Bring a projection's stored records to the current schemas when it is opened writable.

A stored record is single-object encoded under the schema current when it was
written, so a projection built (partly) by an older processor holds other bytes
than a replay by this one writes for the same state, and every digest comparison
(drills, checkpoints) would fail after an upgrade. Opening it writable re-encodes
every record written under an older version, in key order and in bounded batches,
then marks the projection with the current schema set. The mark goes last: a crash
part-way leaves it stale and the next open migrates again, skipping rows already
current. A projection already marked costs one read. One at a feature level above
this keyload's was written by a newer keyload: it is refused before any row is
read or rewritten, naming the level (its rows may be of schemas this one lacks).
"""

from __future__ import annotations

from collections.abc import Callable

from rocksdict import Rdict, WriteBatch, WriteOptions

from keyload.limits import FEATURE_LEVEL
from keyload.log.codec import REGISTRY, CodecError, Record
from keyload.processors.topics.cursors import cursor

from . import keys

MIGRATION_BATCH_BYTES = 4 * 1024 * 1024  # keys and values rewritten per WriteBatch, at most (plus one row)


def migrate(db: Rdict, write_options: WriteOptions) -> None:
    """Re-encode every record of `db` not written under the current schemas, then mark it.

    CodecError (naming the key) for a row of no known family or a record that does not decode,
    and (naming the level) for a projection a newer keyload raised above FEATURE_LEVEL.
    """
    if db.get(keys.SCHEMA_SET) == REGISTRY.schema_set:
        return
    level = db.get(keys.FEATURE_LEVEL)
    if level is not None and keys.read_u64(level) > FEATURE_LEVEL:
        raise CodecError(
            f"it is at feature level {keys.read_u64(level)}, above the {FEATURE_LEVEL} this keyload knows: "
            "a newer keyload wrote it; run that one (nothing was changed)"
        )
    batch, batch_bytes = WriteBatch(raw_mode=True), 0
    key: bytes
    value: bytes
    # The iterator reads the state as it was when it started; rows rewritten on the way are current anyway.
    for key, value in db.items():  # type: ignore[assignment]
        current = _current_encoding(key, value)
        if current is None:
            continue
        batch.put(key, current)
        batch_bytes += len(key) + len(current)
        if batch_bytes >= MIGRATION_BATCH_BYTES:
            db.write(batch, write_options)
            batch, batch_bytes = WriteBatch(raw_mode=True), 0
    batch.put(keys.SCHEMA_SET, REGISTRY.schema_set)
    db.write(batch, write_options)


def _current_encoding(key: bytes, value: bytes) -> bytes | None:
    """The value re-encoded under the current schema, or None when it holds no record written under an older one."""
    if key[:1] not in keys.FAMILY_VALUES:
        raise CodecError(f"key {key!r}: no such key family")
    layout = keys.FAMILY_VALUES[key[:1]]
    if layout is None or len(value) == layout.skip:
        return None
    record = value[layout.skip :]
    if REGISTRY.is_current(layout.name, record):
        return None
    try:
        decoded = REGISTRY.decode(layout.name, record)
    except CodecError as exc:
        raise CodecError(f"key {key!r}: {exc}") from exc
    upcast = UPCASTS.get(layout.name)
    return value[: layout.skip] + REGISTRY.encode(layout.name, decoded if upcast is None else upcast(decoded))


def _page_cursor(outcome: Record) -> Record:
    """A TopicPage stored before pages had cursors (Outcome v4) gets the one a replay computes."""
    result = outcome["result"]
    if result is not None and result[0] == "keyload.result.TopicPage" and not result[1]["next_cursor"]:
        result[1]["next_cursor"] = cursor(result[1]["next_position"])
    return outcome


# Fields a newer schema added whose value for old state no constant default can give
# (docs/ARCHITECTURE.md §4): per top-level type, what the current processor computes for them.
UPCASTS: dict[str, Callable[[Record], Record]] = {"keyload.Outcome": _page_cursor}
