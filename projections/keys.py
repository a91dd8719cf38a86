"""Key families of a partition's projection.

Every key starts with a one-byte family tag. Integers are fixed-width unsigned
big-endian so RocksDB's byte order is numeric order; names are UTF-8 and come
last in a key, or are length-prefixed (u8) when something follows them. Names a
client chooses (queues, command ids) are scoped by their domain: several domains
share a partition. This layout
is a contract: changing it needs a migration and a test over old projections.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

U64 = struct.Struct(">Q")
U16 = struct.Struct(">H")

# Family tags.
META = b"\x00"  # partition metadata (applied offset, last time, allocators)
QUEUE = b"q"  # q | domain (u8-prefixed) | queue name          -> QueueRecord
# i | queue, group or topic id u64 -> the resource's QUEUE, GROUP or TOPIC key (a topic's from when it
#   first has a retention timer), or its RETIRED, RETIRED_GROUP or RETIRED_TOPIC key once deleted
RESOURCE_KEY = b"i"
MESSAGE = b"m"  # m | queue id u64 | message id                 -> MessageMeta
BODY = b"b"  # b | queue id u64 | message id                    -> raw body bytes
READY = b"r"  # r | queue id u64 | ready sequence u64           -> message id
DEAD_LETTER = b"d"  # d | queue id u64 | parked sequence u64    -> message id
PENDING_DEAD_LETTER = b"n"  # n | queue id u64 | enqueue sequence u64 -> message id
WAITER = b"a"  # a | queue id u64 | waiter sequence u64          -> Waiter (a waiting long-poll Receive)
ORDERING = b"k"  # k | queue id u64 | ordering key (u16-prefixed) | enqueue sequence u64 -> message id
KEY_HEAD = b"h"  # h | queue id u64 | ordering key (u16-prefixed)  -> u64 lowest enqueue sequence in `k`
TIMER = b"t"  # t | queue or group id u64 | due ms u64 | kind u8 | sequence u64 -> message id or position
# w | due ms u64 | queue, group or topic id u64 -> empty (earliest timer of a queue or group, a topic's
#   retention timer)
DUE_QUEUE = b"w"
OUTCOME = b"o"  # o | domain (u8-prefixed) | command id         -> fingerprint(32) | Outcome
# O | domain (u8-prefixed) | command id -> fingerprint(32) | offset u64 | applied at ms u64 | error code (UTF-8;
#   empty: committed): the receipt an outcome past its domain's outcome horizon leaves (processors/horizons.py)
RECEIPT = b"O"
# H | expires ms u64 | domain (u8-prefixed) | command id -> "o" naming an outcome, then (when a receipt follows)
#   u64 receipt expiry | the receipt's offset, time and error code as `O` holds them; "r" naming a receipt
# H | expires ms u64 | 0x00 | a row's key (domains are never empty, so no command's entry starts so) -> "m" naming
#   a finished message's metadata, then (when its identity outlives it) u64 identity expiry | the identity
#   tombstone `u` will hold; "t" naming a deleted document's tombstone, then u64 its revision and u64 its
#   deletion time (it goes only if still that tombstone); "d" naming a row that just goes (an identity
#   tombstone, an inbox entry, an event id; a target inbox entry's then u64 its charge, given back to its inbox)
HORIZON = b"H"
DOMAIN = b"D"  # D | domain                                      -> DomainRecord (absent: the default policy)
# U | domain -> u64 queues | u64 topics | u64 groups | u64 documents | u64 document bytes: what the domain holds of
#   each kind its caps bound (processors/usage.py), from feature level 5 (absent: nothing)
DOMAIN_USAGE = b"U"
POISON = b"p"  # p | offset u64                                 -> PoisonEntry
TOPIC = b"s"  # s | domain (u8-prefixed) | topic name           -> TopicRecord
EVENT = b"e"  # e | topic id u64 | position u64                 -> EventRecord (body inline)
# x | topic id u64 | event id (u16-prefixed) -> position u64 | SHA-256 content digest (32); from feature level 6
#   until the domain's receipt horizon from the publish
EVENT_ID = b"x"
GROUP = b"g"  # g | topic id u64 | group name                   -> GroupRecord
POSITION = b"c"  # c | group id u64 | position u64               -> PositionMeta (outstanding: leased, retrying, due)
DUE_POSITION = b"v"  # v | group id u64 | position u64           -> empty (an outstanding position whose retry is due)
PARKED = b"y"  # y | group id u64 | position u64                 -> PositionMeta (parked)
# f | domain (u8-prefixed) | document key -> DocumentRecord (a deleted one: its tombstone; from feature level 4
#   until the domain's receipt horizon)
DOCUMENT = b"f"
# j | queue or group id u64 | delivery generation u64 | execution generation u64 | handler scope (u8-prefixed)
#   | message id (a group's: its position in decimal)              -> InboxEntry (CompleteProcessing)
INBOX_ENTRY = b"j"
# l | domain (u8-prefixed) | source domain (u8-prefixed) | source queue (u8-prefixed) | delivery generation u64
#   | execution generation u64 | handler scope (u8-prefixed) | message id -> InboxEntry (CommitInbox)
TARGET_INBOX_ENTRY = b"l"
INBOX = b"z"  # z | domain (u8-prefixed)                           -> InboxRecord (the target inbox's policy and use)
RESERVATION = b"R"  # R | reservation id u64                      -> PayloadReservation
# u | queue id u64 | message id -> u64 reservation id: a large message's identity, from its reservation on;
#   kept after its history (MessageMeta) is reclaimed, so the id is not used again (for a message finished from
#   feature level 8, until the domain's receipt horizon after it finished; before, for as long as the queue). From
#   feature level 4 also an inline message's identity tombstone once its history is past the outcome horizon
#   (processors/horizons.py): u64 terminal time | terminal state (UTF-8), until the receipt horizon
IDENTITY = b"u"
PUBLISHED_CHECKPOINT = b"K"  # K | offset u64                   -> manifest SHA-256 (a published checkpoint, ≥ floor)
PRINCIPAL_KEY = b"B"  # B | key id                                 -> principal name (a key ever a principal's)
PRINCIPAL = b"A"  # A | principal name                             -> PrincipalRecord (every partition holds each)
RETENTION_TASK = b"G"  # G | task id u64                          -> RetentionTask (a guarded object deletion)
# C | confirmed offset u64 | task id u64 -> empty: a retention task confirmed deleted, which compaction drops once
#   the recovery floor reaches that offset (from feature level 7; processors/payloads/retention.py)
RETENTION_CONFIRMED = b"C"
# X | incarnation u64 -> QueueRecord of a deleted queue whose rows are still being reclaimed
#   (processors/reclamation.py; `reclaim_from` the next row): its `i` row names this key, and it waits
#   in the due index like a timer, at its `next_timer_ms`
RETIRED = b"X"
RETIRED_GROUP = b"Y"  # Y | incarnation u64 -> GroupRecord of a deleted subscription group, as X for queues
RETIRED_TOPIC = b"Z"  # Z | incarnation u64 -> TopicRecord of a deleted topic, as X for queues

APPLIED_OFFSET = META + b"applied_offset"  # u64 offset of the last applied record
LAST_TIME = META + b"last_time"  # u64 evaluation time of the last applied record
# SHA-256 of the last applied record's offset u64 | timestamp i64 | bytes: the log must still hold exactly
# this record at APPLIED_OFFSET for the projection to resume there (a lost and rewritten tail does not)
APPLIED_RECORD = META + b"applied_record"
NEXT_QUEUE_ID = META + b"next_queue_id"  # u64 incarnation allocator of queues, topics, groups (one space)
NEXT_DUE = META + b"next_due"  # u64 due time of the partition's earliest timer (absent: none)
SCHEMA_SET = META + b"schema_set"  # SHA-256 naming the schemas the values are written under (migration.py)
NEXT_RESERVATION_ID = META + b"next_reservation_id"  # u64 allocator of payload reservations
NEXT_TASK_ID = META + b"next_task_id"  # u64 allocator of retention tasks
RECOVERY_FLOOR = META + b"recovery_floor"  # u64 floor offset as last logged by AdvanceRecoveryFloor (absent: none)
FEATURE_LEVEL = META + b"feature_level"  # u64 semantics in force (processors/features.py); absent: 0
POLICY_EPOCH = META + b"policy_epoch"  # u64 changes of principals and grants; present: access control is on
HORIZON_DUE = META + b"horizon_due"  # u64 earliest expiry in the horizon index `H` (absent: none)
# u64 log time the partition reached feature level 4, from which a finished message id can become new: a
#   delivery token without the message's enqueue sequence (v1) names no message enqueued after it
MESSAGE_IDS_REUSABLE_SINCE = META + b"message_ids_reusable_since"
RETIRED_IDENTITIES = META + b"retired_identities"  # u64 retention tasks compacted (their histories reclaimed)
# The next `f`, `q` or `s` row the usage count (processors/usage.py) looks at: present from the raise to feature
# level 5 until the partition has counted what it held then; rows before it are counted, rows from it are not yet
USAGE_COUNT_CURSOR = META + b"usage_count_cursor"
# u64 next task id | u64 end task id: the tasks confirmed before the raise to feature level 7 are still to be given
# their `C` rows, from the next up to the end (the task allocator at the raise); absent once they all have
RETENTION_INDEX_CURSOR = META + b"retention_index_cursor"

# Timer kinds, in the order they fire when due at the same instant.
TIMER_EXPIRY = 0
TIMER_LEASE = 1
TIMER_NOT_BEFORE = 2  # for a group: a position's retry coming due
TIMER_WAITER = 3  # a long-poll Receive's deadline; the timer's sequence is the waiter's
TIMER_RESERVATION = 4  # a payload reservation's upload deadline; the timer's sequence is the reservation id
TIMER_SERVE = 5  # waiters are left with ready messages to serve (sequence 0): the next record serves more

# The due index entry `w | due | HORIZON_SWEEP` is the partition's horizon sweep, due at HORIZON_DUE:
# resource ids start at 1, so it names no queue, group or topic.
HORIZON_SWEEP = 0
MAX_U64_ID = 2**63 - 1  # ids in keys are u64, and Avro longs are signed: ids a command names stay below this
# The due index entry `w | due | USAGE_COUNT` is the usage count, due while USAGE_COUNT_CURSOR is present: ids
# stay below MAX_U64_ID, so it names no resource either.
USAGE_COUNT = 2**64 - 1
assert MAX_U64_ID < USAGE_COUNT < 2**64
TIMER_KEY_BYTES = 1 + 8 + 8 + 1 + 8
EVENT_KEY_BYTES = 1 + 8 + 8
SHA256_BYTES = 32
EVENT_ID_VALUE_BYTES = 8 + SHA256_BYTES


@dataclass(frozen=True, slots=True)
class RecordValue:
    """Values holding a single-object encoded `name` record after `skip` raw bytes.

    A value of only the `skip` bytes holds no record (the outcome row of a long-poll receive still waiting).
    """

    name: str
    skip: int = 0


# What every family's values hold: a record (re-encoded when the schemas change, see
# migration.py) or None for raw bytes. Every family tag must be classified here.
FAMILY_VALUES: dict[bytes, RecordValue | None] = {
    META: None,
    QUEUE: RecordValue("keyload.QueueRecord"),
    RESOURCE_KEY: None,
    MESSAGE: RecordValue("keyload.MessageMeta"),
    BODY: None,
    READY: None,
    DEAD_LETTER: None,
    PENDING_DEAD_LETTER: None,
    WAITER: RecordValue("keyload.Waiter"),
    ORDERING: None,
    KEY_HEAD: None,
    TIMER: None,
    DUE_QUEUE: None,
    OUTCOME: RecordValue("keyload.Outcome", skip=SHA256_BYTES),  # the command's SHA-256 fingerprint first
    RECEIPT: None,
    HORIZON: None,
    DOMAIN: RecordValue("keyload.DomainRecord"),
    DOMAIN_USAGE: None,
    POISON: RecordValue("keyload.PoisonEntry"),
    TOPIC: RecordValue("keyload.TopicRecord"),
    EVENT: RecordValue("keyload.EventRecord"),
    EVENT_ID: None,
    GROUP: RecordValue("keyload.GroupRecord"),
    POSITION: RecordValue("keyload.PositionMeta"),
    DUE_POSITION: None,
    PARKED: RecordValue("keyload.PositionMeta"),
    DOCUMENT: RecordValue("keyload.DocumentRecord"),
    INBOX_ENTRY: RecordValue("keyload.InboxEntry"),
    TARGET_INBOX_ENTRY: RecordValue("keyload.InboxEntry"),
    INBOX: RecordValue("keyload.InboxRecord"),
    RESERVATION: RecordValue("keyload.PayloadReservation"),
    IDENTITY: None,
    RETENTION_TASK: RecordValue("keyload.RetentionTask"),
    RETENTION_CONFIRMED: None,
    RETIRED: RecordValue("keyload.QueueRecord"),
    RETIRED_GROUP: RecordValue("keyload.GroupRecord"),
    RETIRED_TOPIC: RecordValue("keyload.TopicRecord"),
    PRINCIPAL: RecordValue("keyload.PrincipalRecord"),
    PUBLISHED_CHECKPOINT: None,
    PRINCIPAL_KEY: None,
}
# The family tags are this module's one-byte constants: a new one fails here until it is classified.
_TAGS = [value for name, value in globals().items() if name.isupper() and isinstance(value, bytes) and len(value) == 1]
assert len(set(_TAGS)) == len(_TAGS), "two families share a tag"
assert set(_TAGS) == set(FAMILY_VALUES), "classify every family's values in FAMILY_VALUES"


def u64(value: int) -> bytes:
    return U64.pack(value)


def read_u64(data: bytes, at: int = 0) -> int:
    value: int = U64.unpack_from(data, at)[0]
    return value


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    assert stripped, "prefix of only 0xff bytes has no end"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _domain(domain: str) -> bytes:
    return _short(domain)


def _short(name: str) -> bytes:
    """A name (domain, queue, handler scope: all under 256 bytes) u8-length-prefixed."""
    encoded = name.encode("utf-8")
    assert len(encoded) < 256, "u8-prefixed names are under 256 bytes"
    return bytes([len(encoded)]) + encoded


def queue(domain: str, name: str) -> bytes:
    return QUEUE + _domain(domain) + name.encode("utf-8")


def resource_key(incarnation: int) -> bytes:
    return RESOURCE_KEY + U64.pack(incarnation)


def message(queue_id: int, message_id: str) -> bytes:
    return MESSAGE + U64.pack(queue_id) + message_id.encode("utf-8")


def message_id_of(key: bytes) -> str:
    """The message id of a `m` row."""
    assert key[:1] == MESSAGE
    return key[9:].decode("utf-8")


def body(queue_id: int, message_id: str) -> bytes:
    return BODY + U64.pack(queue_id) + message_id.encode("utf-8")


def ready(queue_id: int, ready_sequence: int) -> bytes:
    return READY + U64.pack(queue_id) + U64.pack(ready_sequence)


def ready_prefix(queue_id: int) -> bytes:
    return READY + U64.pack(queue_id)


def dead_letter(queue_id: int, parked_sequence: int) -> bytes:
    return DEAD_LETTER + U64.pack(queue_id) + U64.pack(parked_sequence)


def pending_dead_letter(queue_id: int, enqueue_sequence: int) -> bytes:
    return PENDING_DEAD_LETTER + U64.pack(queue_id) + U64.pack(enqueue_sequence)


def waiter(queue_id: int, waiter_sequence: int) -> bytes:
    return WAITER + U64.pack(queue_id) + U64.pack(waiter_sequence)


def waiter_prefix(queue_id: int) -> bytes:
    return WAITER + U64.pack(queue_id)


def ordering_prefix(queue_id: int, ordering_key: str) -> bytes:
    encoded = ordering_key.encode("utf-8")
    return ORDERING + U64.pack(queue_id) + U16.pack(len(encoded)) + encoded


def key_head(queue_id: int, ordering_key: str) -> bytes:
    return KEY_HEAD + ordering_prefix(queue_id, ordering_key)[1:]


def ordering(queue_id: int, ordering_key: str, enqueue_sequence: int) -> bytes:
    return ordering_prefix(queue_id, ordering_key) + U64.pack(enqueue_sequence)


def timer(queue_id: int, due_ms: int, kind: int, enqueue_sequence: int) -> bytes:
    return TIMER + U64.pack(queue_id) + U64.pack(due_ms) + bytes([kind]) + U64.pack(enqueue_sequence)


def timer_prefix(queue_id: int) -> bytes:
    return TIMER + U64.pack(queue_id)


def parse_timer(key: bytes) -> tuple[int, int, int]:
    """(due ms, kind, enqueue sequence) of a timer key."""
    assert len(key) == TIMER_KEY_BYTES and key[:1] == TIMER
    return read_u64(key, 9), key[17], read_u64(key, 18)


def due_queue(due_ms: int, queue_id: int) -> bytes:
    """The due-index entry of a queue or a group (they share the incarnation space)."""
    return DUE_QUEUE + U64.pack(due_ms) + U64.pack(queue_id)


def parse_due_queue(key: bytes) -> tuple[int, int]:
    """(due ms, queue id) of a due-queue key."""
    return read_u64(key, 1), read_u64(key, 9)


def outcome(domain: str, command_id: str) -> bytes:
    return OUTCOME + _domain(domain) + command_id.encode("utf-8")


def receipt(domain: str, command_id: str) -> bytes:
    return RECEIPT + _domain(domain) + command_id.encode("utf-8")


def horizon(expires_ms: int, domain: str, command_id: str) -> bytes:
    return HORIZON + U64.pack(expires_ms) + _domain(domain) + command_id.encode("utf-8")


def horizon_of_row(expires_ms: int, row: bytes) -> bytes:
    """The horizon index key of a row that is not a command's outcome or receipt."""
    return HORIZON + U64.pack(expires_ms) + b"\x00" + row


def horizon_expiry(key: bytes) -> int:
    return read_u64(key, 1)


def horizon_row(key: bytes) -> bytes | None:
    """The row a horizon index key of `horizon_of_row` names; None for a command's entry."""
    return key[10:] if key[9] == 0 else None


def parse_horizon(key: bytes) -> tuple[str, str]:
    """(domain, command id) of a command's horizon index key."""
    length = key[9]
    assert length, "a row's horizon entry names no command"
    return key[10 : 10 + length].decode("utf-8"), key[10 + length :].decode("utf-8")


def domain_policy(domain: str) -> bytes:
    return DOMAIN + domain.encode("utf-8")


def domain_usage(domain: str) -> bytes:
    return DOMAIN_USAGE + domain.encode("utf-8")


def domain_of(key: bytes) -> str:
    """The domain of a row keyed by domain first (u8-prefixed): `q`, `s`, `f`, `o`, `z`, and `l`
    (the domain whose target inbox holds it)."""
    return key[2 : 2 + key[1]].decode("utf-8")


def published_checkpoint(offset: int) -> bytes:
    return PUBLISHED_CHECKPOINT + u64(offset)


def principal_key(key_id: str) -> bytes:
    return PRINCIPAL_KEY + key_id.encode("utf-8")


def principal(name: str) -> bytes:
    return PRINCIPAL + name.encode("utf-8")


def poison(offset: int) -> bytes:
    return POISON + U64.pack(offset)


def topic(domain: str, name: str) -> bytes:
    return TOPIC + _domain(domain) + name.encode("utf-8")


def event(topic_id: int, position: int) -> bytes:
    return EVENT + U64.pack(topic_id) + U64.pack(position)


def event_position(key: bytes) -> int:
    """The position of an event key."""
    assert len(key) == EVENT_KEY_BYTES and key[:1] == EVENT
    return read_u64(key, 9)


def event_id(topic_id: int, identifier: str) -> bytes:
    encoded = identifier.encode("utf-8")
    return EVENT_ID + U64.pack(topic_id) + U16.pack(len(encoded)) + encoded


def event_id_value(position: int, digest: bytes) -> bytes:
    assert len(digest) == SHA256_BYTES
    return U64.pack(position) + digest


def parse_event_id_value(value: bytes) -> tuple[int, bytes]:
    """(position, content digest) of an event-id index row."""
    assert len(value) == EVENT_ID_VALUE_BYTES
    return read_u64(value), value[8:]


def group(topic_id: int, name: str) -> bytes:
    return GROUP + U64.pack(topic_id) + name.encode("utf-8")


def group_prefix(topic_id: int) -> bytes:
    return GROUP + U64.pack(topic_id)


def position(group_id: int, at: int) -> bytes:
    return POSITION + U64.pack(group_id) + U64.pack(at)


def due_position(group_id: int, at: int) -> bytes:
    return DUE_POSITION + U64.pack(group_id) + U64.pack(at)


def parked(group_id: int, at: int) -> bytes:
    return PARKED + U64.pack(group_id) + U64.pack(at)


def group_row_end(row: bytes) -> bytes:
    """The end of the family of a group's position rows (`c`, `v`, `y`) that `row` belongs to."""
    assert len(row) == 17 and row[:1] in (POSITION, DUE_POSITION, PARKED)
    return prefix_end(row[:9])


def row_position(key: bytes) -> int:
    """The position of a `c`, `v` or `y` row."""
    assert len(key) == 17 and key[:1] in (POSITION, DUE_POSITION, PARKED)
    return read_u64(key, 9)


def document(domain: str, key: str) -> bytes:
    """A document's row; with a key prefix, where the domain's documents under it start."""
    return DOCUMENT + _domain(domain) + key.encode("utf-8")


def document_key(row: bytes) -> str:
    return row[2 + row[1] :].decode("utf-8")


def inbox_entry(
    resource_id: int, delivery_generation: int, execution_generation: int, scope: str, message_id: str
) -> bytes:
    return (
        INBOX_ENTRY
        + U64.pack(resource_id)
        + U64.pack(delivery_generation)
        + U64.pack(execution_generation)
        + _short(scope)
        + message_id.encode("utf-8")
    )


def target_inbox_entry(
    domain: str,
    source_domain: str,
    source_queue: str,
    delivery_generation: int,
    execution_generation: int,
    scope: str,
    message_id: str,
) -> bytes:
    return (
        TARGET_INBOX_ENTRY
        + _domain(domain)
        + _domain(source_domain)
        + _short(source_queue)
        + U64.pack(delivery_generation)
        + U64.pack(execution_generation)
        + _short(scope)
        + message_id.encode("utf-8")
    )


def inbox_config(domain: str) -> bytes:
    return INBOX + _domain(domain)


def reservation(reservation_id: int) -> bytes:
    return RESERVATION + U64.pack(reservation_id)


def identity(queue_id: int, message_id: str) -> bytes:
    return IDENTITY + U64.pack(queue_id) + message_id.encode("utf-8")


def retention_task(task_id: int) -> bytes:
    return RETENTION_TASK + U64.pack(task_id)


def retention_confirmed(confirmed_offset: int, task_id: int) -> bytes:
    return RETENTION_CONFIRMED + U64.pack(confirmed_offset) + U64.pack(task_id)


def retired(incarnation: int, family: bytes = RETIRED) -> bytes:
    """Where a deleted resource's record waits while its rows are reclaimed: X (a queue), Y (a
    subscription group) or Z (a topic)."""
    return family + U64.pack(incarnation)
