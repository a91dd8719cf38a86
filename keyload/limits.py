"""Named limits of the command surface. docs/ARCHITECTURE.md lists each one.

The range of every integer field of a command is here too (INTEGER_FIELD_RANGES, at the
end, with a table of the kinds of range), with the relations between limits asserted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keyload.errors import ErrorCode
from keyload.log.base import MAX_LOG_TIME_MS, MIN_LOG_TIME_MS, ROUTED_DOMAIN_CHARS

MAX_COMMAND_ID_CHARS = 128
MAX_DOMAIN_CHARS = 64
assert MAX_DOMAIN_CHARS <= ROUTED_DOMAIN_CHARS, "every valid domain's partition may be remembered"
MAX_PRINCIPAL_CHARS = 256
MAX_QUEUE_NAME_CHARS = 80
MAX_MESSAGE_ID_CHARS = 128
MAX_ORDERING_KEY_CHARS = 128
MAX_INLINE_BODY_BYTES = 256 * 1024
MAX_HEADERS = 64
MAX_HEADER_NAME_CHARS = 128
MAX_HEADERS_BYTES = 16 * 1024
MAX_SCHEDULE_AHEAD_MS = 365 * 24 * 3600 * 1000
TICK_EXAMINATION_BUDGET = 256  # timers examined before one record
# The highest feature level this processor applies (processors/features.py); `keyload run` raises
# every partition to it.
FEATURE_LEVEL = 18
RECEIVE_EXAMINATION_BUDGET = 256  # ready rows one Receive looks at (held keys are skipped)
MAX_DETAIL_CHARS = 512  # an outcome's error detail is cut to this
# An outcome is one log record, and both logs take records up to 4 MiB: a larger
# result is refused (BudgetExceeded) rather than left to fail its publication.
SIGNATURE_BYTES = 128  # what a Signed record adds around a command or an outcome (key id ≤ 64, MAC, framing)
MAX_OUTCOME_BYTES = 4 * 1024 * 1024 - SIGNATURE_BYTES  # an outcome, sealed, is still one record
# Receives and dead-letter pages stop adding items past this many result bytes
# (the first item always goes), so they stay inside MAX_OUTCOME_BYTES.
RESULT_BYTES_BUDGET = 3 * 1024 * 1024
RESULT_ITEM_OVERHEAD_BYTES = 2048  # per item beyond body, headers and ids: token (≤ 1024), counters, encoding
MAX_KEY_ID_CHARS = 64
# A keyring key's id: printable ASCII with the space (0x20..0x7E), as PutPrincipal has always checked
# it (a replay decides as the first apply did), unlike the identifiers below.
KEY_ID_PATTERN = re.compile(rf"[\x20-\x7e]{{1,{MAX_KEY_ID_CHARS}}}")
# In a refusal PutPrincipal has stored since level 0: its words stay as they were.
KEY_ID_RULE = f"a key id is 1..{MAX_KEY_ID_CHARS} printable ASCII characters"
# A Signed record: header 10, key id (1 + ≤ 64 ASCII), MAC (1 + 32), the record's length (≤ 4 bytes).
assert 10 + 1 + MAX_KEY_ID_CHARS + 1 + 32 + 4 <= SIGNATURE_BYTES
MAX_GRANTS = 64  # grants one principal holds
MAX_GRANT_PATTERN_CHARS = 256  # a grant's domain or resource pattern
MAX_BOOTSTRAP_PRINCIPALS = 8  # principals one EnableAccessControl installs
MIN_LEASE_MS = 100
MAX_ACK_BATCH = 100  # tokens per AckBatch
MAX_DEAD_LETTER_PAGE = 100  # messages per ListDeadLetters page
MAX_WAIT_MS = 20_000  # longest long-poll Receive
MAX_WAITERS_PER_RESOURCE = 1_000  # waiting long-poll receives a queue or a group holds at once
MAX_WAITERS_SERVED = 64  # waiters one record may serve
MAX_TOPIC_NAME_CHARS = 80
MAX_EVENT_ID_CHARS = 128
MAX_EVENT_TYPE_CHARS = 128
MAX_PUBLISH_EVENTS = 100  # events per Publish
MAX_PUBLISH_BODY_BYTES = 1024 * 1024  # the bodies of one Publish together (each also ≤ MAX_INLINE_BODY_BYTES)
DEFAULT_READ_EVENTS = 100
MAX_READ_EVENTS = 1_000
DEFAULT_READ_BYTES = 1024 * 1024
# A page is an outcome, and an outcome is one log record (≤ 4 MiB): 2 MiB of charged
# bytes, plus one oversized first event and the per-event framing, stays well inside.
MAX_READ_BYTES = 2 * 1024 * 1024
READ_EXAMINATION_BUDGET = 256  # event rows one ReadTopic looks at
MAX_GROUP_NAME_CHARS = 80
MAX_GROUPS_PER_TOPIC = 64  # a purge checks every group of its topic
MAX_FILTER_EVENT_TYPES = 64  # event types one group filter lists
DEFAULT_GROUP_RECEIVE_EVENTS = 10
MAX_GROUP_RECEIVE_EVENTS = 1_000
DEFAULT_GROUP_RECEIVE_BYTES = 1024 * 1024
MAX_GROUP_RECEIVE_BYTES = MAX_READ_BYTES  # charged bytes, like a read page
GROUP_RECEIVE_EXAMINATION_BUDGET = 256  # due positions and event rows one GroupReceive looks at
# issued - checkpoint at most: acked positions above a stuck one leave tombstones that
# checkpoint moves and seeks walk, so the distance a group runs ahead stays bounded.
MAX_GROUP_SPAN = 100_000
MAX_STATUS_PARKED = 100  # parked positions a GroupView lists
MAX_PURGE_EVENTS = 10_000  # events one PurgeTopic deletes (larger purges go in steps), or one Publish discards
MAX_REPOSITION_PARKED = 10_000  # parked positions above its target a seek or configure may drop
MAX_DOCUMENT_KEY_CHARS = 512  # printable ASCII without spaces, like ids: "order/42" reads well
MAX_DOCUMENT_BYTES = MAX_INLINE_BODY_BYTES  # a document's value
DEFAULT_LIST_DOCUMENTS = 100
MAX_LIST_DOCUMENTS = 1_000
DEFAULT_LIST_BYTES = 1024 * 1024
MAX_LIST_BYTES = MAX_READ_BYTES  # values of one page, the first always included: inside MAX_OUTCOME_BYTES
DEFAULT_LIST_RESOURCES = 100  # queues or topics one ListQueues or ListTopics page holds
MAX_LIST_RESOURCES = 1_000
MAX_RESOURCE_VIEW_BYTES = 1024  # a QueueView or TopicView: two names and about 40 numbers of ≤ 10 bytes
assert DEFAULT_LIST_RESOURCES <= MAX_LIST_RESOURCES
assert MAX_LIST_RESOURCES * MAX_RESOURCE_VIEW_BYTES <= MAX_OUTCOME_BYTES  # a full page is one outcome
LIST_EXAMINATION_BUDGET = 256  # document rows (tombstones too) one ListDocuments looks at
MAX_BATCH_MUTATIONS = 100  # mutations per Batch, effects per CompleteProcessing or CommitInbox
# What coalescing puts in one command at most, by default (the SDK's Coalescer) or always (the server's):
# bodies, headers and tokens of 1 MiB leave room in a log record (≤ 4 MiB) for ids and framing, in base64 too.
COALESCED_BATCH_BYTES = 1024 * 1024
MAX_HANDLER_SCOPE_CHARS = 128
MAX_INBOX_RECEIPTS = 10_000_000  # the largest max_receipts a target inbox may be configured with
MAX_INBOX_BYTES = 1024 * 1024 * 1024  # the largest max_bytes

# Identifiers: printable ASCII without spaces (command, message and event ids, event
# types); stricter names for domains, queues, topics and header names so they read
# well in URLs and CLIs.
ID_PATTERN = re.compile(r"[\x21-\x7e]+")
DOMAIN_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*")
QUEUE_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
HEADER_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
TOPIC_NAME_PATTERN = QUEUE_NAME_PATTERN
GROUP_NAME_PATTERN = QUEUE_NAME_PATTERN

# Large payloads (processors/payloads/schedule.py) and their retention (processors/payloads/retention.py).
MAX_PAYLOAD_BYTES = 5 * 1024**4  # one object: S3's largest
DEFAULT_UPLOAD_WINDOW_MS = 15 * 60 * 1000  # from PrepareLargeSchedule to its upload deadline
MIN_UPLOAD_WINDOW_MS = 1_000
MAX_UPLOAD_WINDOW_MS = 24 * 3600 * 1000
MAX_OBJECT_VERSION_CHARS = 1024
DEFAULT_RETENTION_PAGE = 100
MAX_RETENTION_PAGE = 1_000
RETENTION_COMPACTION_BUDGET = 256  # task rows one AdvanceRecoveryFloor examines for compaction
MAX_DELETED_VERSIONS = 100  # versions one DeleteConfirmed may report

# -- integer ranges ------------------------------------------------------------------------
#
# Every integer a client puts in a command has a named range, checked before it reaches a
# key (u64 big-endian) or arithmetic: a value outside it is refused with `code` and a detail
# naming the field and its range, never an OverflowError that would halt the partition.
# Ranges a client's integers fall in, by what they are:
#
#   what                                   range                                  e.g.
#   absolute log times, only compared      not_before_ms: ..MAX_LOG_TIME_MS       not_before_ms (≤ now: ready now),
#     (a timer key holds any long ≥ 0)     expires_at_ms: MIN_LOG_TIME_MS..       expires_at_ms (past the range: never)
#   durations added to log time            0 or a minimum..a named max,           lease_ms, wait_ms, delay_ms,
#                                          all ≤ MAX_DURATION_MS                  retry_*_ms, upload_window_ms
#   counts, sizes and page limits          1 (or 0)..a named max                  max_messages, max_bytes, limit
#   positions, sequences, offsets, ids,    0 (ids: 1)..MAX_SEQUENCE               from_position, after_sequence,
#     versions, generations, revisions                                            expected_*, execution_generation
#   informational or only compared         any Avro long                          client_time_ms, a proof's fields
#
# State and policy bound many of them further (a lease ≤ the queue's max_lease_ms, a
# position ≤ the topic's tail + 1); INTEGER_FIELD_RANGES notes where.

AVRO_INT_MAX = 2**31 - 1
AVRO_LONG_MIN = -(2**63)
AVRO_LONG_MAX = 2**63 - 1  # every Avro long ≥ 0 packs as a u64 key
U64_MAX = 2**64 - 1

SECOND_MS = 1_000
HOUR_MS = 3600 * SECOND_MS
DAY_MS = 24 * HOUR_MS
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

# Durations (ms) a command or a policy adds to log time.
MAX_LEASE_MS = 12 * HOUR_MS  # a lease (Receive, Renew, policy lease_ms and max_lease_ms) and a nack's delay
MAX_RETRY_MS = 24 * HOUR_MS  # policy retry_base_ms and retry_max_ms
MAX_PAYLOAD_REQUEST_HORIZON_MS = HOUR_MS  # policy payload_request_horizon_ms
MAX_DURATION_MS = MAX_SCHEDULE_AHEAD_MS  # the longest of them all
assert MIN_LEASE_MS <= MAX_LEASE_MS
assert MIN_UPLOAD_WINDOW_MS <= DEFAULT_UPLOAD_WINDOW_MS <= MAX_UPLOAD_WINDOW_MS
assert all(
    duration <= MAX_DURATION_MS
    for duration in (
        MAX_LEASE_MS,
        MAX_RETRY_MS,
        MAX_WAIT_MS,
        MAX_UPLOAD_WINDOW_MS,
        MAX_PAYLOAD_REQUEST_HORIZON_MS,
        MAX_SCHEDULE_AHEAD_MS,
    )
)
# The latest time the engine computes: a not-before up to a year past log time, a handle's
# expiry (a lease or an upload window) plus the request horizon. Every time it stores or
# keys by stays an Avro long and a u64.
assert MAX_LOG_TIME_MS + 2 * MAX_DURATION_MS <= AVRO_LONG_MAX

# Counts and sizes of policies (processors/policy.py) and of a command's pages.
MAX_STORED_MESSAGES = 100_000_000
MAX_STORED_BYTES = TIB
MAX_IN_FLIGHT = 120_000
MAX_ATTEMPTS = 1_000
MAX_RETRY_FACTOR = 10  # an integer: no floats in state
MAX_RECEIVE_MESSAGES = 1_000  # policy receive_max_messages, and so a Receive's max_messages
MAX_RECEIVE_BYTES = 64 * MIB  # policy receive_max_bytes, and so a Receive's max_bytes
MAX_RETAINED_EVENTS = 100_000_000
MAX_RETAINED_BYTES = TIB
MAX_TOPIC_AGE_MS = 10 * 365 * DAY_MS  # topic policy max_age_ms (0: no age limit)
# Idempotency horizons of a domain (ConfigureDomain; processors/horizons.py), in log time, from
# feature level 2: a stored outcome is kept for the outcome horizon, then only its receipt until the
# receipt horizon (equal: no receipt), then the command id is new. The defaults are a day (SQS
# deduplicates for 5 minutes, JetStream for 2) and a week (Kafka's transactional.id.expiration.ms).
DEFAULT_OUTCOME_HORIZON_MS = DAY_MS
DEFAULT_RECEIPT_HORIZON_MS = 7 * DAY_MS
MIN_OUTCOME_HORIZON_MS = SECOND_MS
MAX_HORIZON_MS = 365 * DAY_MS
assert MIN_OUTCOME_HORIZON_MS <= DEFAULT_OUTCOME_HORIZON_MS <= DEFAULT_RECEIPT_HORIZON_MS <= MAX_HORIZON_MS
assert MAX_HORIZON_MS <= MAX_DURATION_MS  # an expiry is a log time plus a duration: a u64 key
# Caps on what one domain holds (ConfigureDomainCaps, an administrator's; processors/usage.py), from
# feature level 5: a create (or a document write) that would take the domain past one is
# ResourceExhausted. A null cap is its default. Deleted resources stop counting at once; document
# tombstones and rows still being reclaimed never count. RabbitMQ's vhost max-queues and JetStream's
# account max_streams are unlimited by default; these defaults are finite so that one tenant cannot
# fill a partition by accident, and high enough not to be met by design. A domain without caps of
# its own is held to them, so what a replay accepts depends on them: changing one needs a new feature
# level, like any change of what a record does (processors/features.py).
DEFAULT_MAX_QUEUES = 10_000
DEFAULT_MAX_TOPICS = 10_000
DEFAULT_MAX_GROUPS = 10_000
DEFAULT_MAX_DOCUMENTS = 1_000_000
DEFAULT_MAX_DOCUMENT_BYTES = 10 * GIB  # the documents' values together: 40,960 of the largest
MAX_DOMAIN_RESOURCES = 1_000_000  # the largest max_queues, max_topics and max_groups
MAX_DOMAIN_DOCUMENTS = 1_000_000_000
MAX_DOMAIN_DOCUMENT_BYTES = TIB
assert max(DEFAULT_MAX_QUEUES, DEFAULT_MAX_TOPICS, DEFAULT_MAX_GROUPS) <= MAX_DOMAIN_RESOURCES
assert DEFAULT_MAX_DOCUMENTS <= MAX_DOMAIN_DOCUMENTS and DEFAULT_MAX_DOCUMENT_BYTES <= MAX_DOMAIN_DOCUMENT_BYTES
# A topic whose expired front events a group still pins looks at its front again this much later.
TOPIC_RETENTION_RECHECK_MS = 60_000
MAX_GROUP_WINDOW = 10_000  # group policy max_window
# The largest backoff before the cap stops it (lifecycle.retry_delay_ms) stays a long; what
# stored records keep in Avro ints (a policy's max_attempts, retry_factor and
# receive_max_messages, a message's or position's attempts, a waiter's max_messages) stays an int.
assert MAX_RETRY_MS * MAX_RETRY_FACTOR <= AVRO_LONG_MAX
assert max(MAX_ATTEMPTS, MAX_RETRY_FACTOR, MAX_RECEIVE_MESSAGES, MAX_GROUP_RECEIVE_EVENTS) <= AVRO_INT_MAX

# Positions, sequence numbers, log offsets, ids, versions, generations and revisions: the
# engine allocates each from 0 or 1, by at most MAX_SEQUENCE_STEP per record (a batch of
# publishes), so none comes near MAX_SEQUENCE in any log's life; a client's value above it
# names nothing that exists, and a value up to it plus one record's growth still fits an
# Avro long and a u64 key.
MAX_SEQUENCE = 2**62 - 1
MAX_SEQUENCE_STEP = MAX_BATCH_MUTATIONS * MAX_PUBLISH_EVENTS
assert MAX_SEQUENCE + MAX_SEQUENCE_STEP <= AVRO_LONG_MAX < U64_MAX
MAX_REPLY_PARTITION = AVRO_INT_MAX  # an envelope's reply_to: an outcome partition (an Avro int)


@dataclass(frozen=True, slots=True)
class IntegerRange:
    """The range of one integer field of a command, and the code refusing a value outside it.

    `code` None: a value outside is not refused (see `note`). `note`: what bounds the value
    further (policy, state) or where it goes.
    """

    minimum: int
    maximum: int
    code: ErrorCode | None = ErrorCode.VALIDATION
    note: str = ""

    def contains(self, value: int) -> bool:
        return self.minimum <= value <= self.maximum

    def describe(self, field: str) -> str:
        return f"{field} must be between {self.minimum} and {self.maximum}"


SEQUENCE = IntegerRange(0, MAX_SEQUENCE)
# A time at or before the evaluation time (0 and negative too, as before ranges were named) is "ready now";
# only compared, never packed into a key, so it keeps every value an Avro long holds up to the log-time range.
NOT_BEFORE = IntegerRange(AVRO_LONG_MIN, MAX_LOG_TIME_MS, note="≤ evaluation time + MAX_SCHEDULE_AHEAD_MS")
LEASE = IntegerRange(MIN_LEASE_MS, MAX_LEASE_MS, note="≤ the queue's or group's max_lease_ms")
DELAY = IntegerRange(0, MAX_LEASE_MS, note="≤ the queue's or group's max_lease_ms")
WAIT = IntegerRange(0, MAX_WAIT_MS)
RETRY = IntegerRange(0, MAX_RETRY_MS, note="retry_base_ms ≤ retry_max_ms")
ATTEMPTS = IntegerRange(1, MAX_ATTEMPTS)
RETRY_FACTOR = IntegerRange(1, MAX_RETRY_FACTOR)
RESERVATION_ID = IntegerRange(1, MAX_SEQUENCE, ErrorCode.NOT_FOUND, "an id that names no reservation: NotFound")
TASK_ID = IntegerRange(1, MAX_SEQUENCE, ErrorCode.NOT_FOUND, "an id that names no task: NotFound")
REVISION = IntegerRange(0, MAX_SEQUENCE, note="0: absent; else RevisionConflict unless the live revision")
FENCE = IntegerRange(0, MAX_SEQUENCE, note="RevisionConflict unless the current one")

# Every integer field of keyload.Command (schemas/keyload.Command.avsc), by "Record.field":
# tests/test_integer_ranges.py walks the schema and fails on a field missing here, and
# submits each at the extremes of its range and of Avro's.
INTEGER_FIELD_RANGES: dict[str, IntegerRange] = {
    # envelope
    "Command.reply_to": IntegerRange(
        0, MAX_REPLY_PARTITION, None, "not refused: the outcome is published only to a partition of the outcome log"
    ),
    "Command.client_time_ms": IntegerRange(AVRO_LONG_MIN, AVRO_LONG_MAX, None, "informational, never evaluated"),
    # queue policy (QueuePolicySpec, of CreateQueue and ConfigureQueue)
    "QueuePolicySpec.max_stored_messages": IntegerRange(1, MAX_STORED_MESSAGES),
    "QueuePolicySpec.max_stored_bytes": IntegerRange(1, MAX_STORED_BYTES),
    "QueuePolicySpec.max_in_flight": IntegerRange(1, MAX_IN_FLIGHT),
    "QueuePolicySpec.max_attempts": ATTEMPTS,
    "QueuePolicySpec.lease_ms": IntegerRange(MIN_LEASE_MS, MAX_LEASE_MS, note="≤ max_lease_ms"),
    "QueuePolicySpec.max_lease_ms": IntegerRange(MIN_LEASE_MS, MAX_LEASE_MS),
    "QueuePolicySpec.retry_base_ms": RETRY,
    "QueuePolicySpec.retry_max_ms": RETRY,
    "QueuePolicySpec.retry_factor": RETRY_FACTOR,
    "QueuePolicySpec.max_dead_letter_messages": IntegerRange(0, MAX_STORED_MESSAGES, note="≤ max_stored_messages"),
    "QueuePolicySpec.max_dead_letter_bytes": IntegerRange(0, MAX_STORED_BYTES, note="≤ max_stored_bytes"),
    "QueuePolicySpec.receive_max_messages": IntegerRange(1, MAX_RECEIVE_MESSAGES),
    "QueuePolicySpec.receive_max_bytes": IntegerRange(1, MAX_RECEIVE_BYTES),
    "QueuePolicySpec.payload_request_horizon_ms": IntegerRange(0, MAX_PAYLOAD_REQUEST_HORIZON_MS),
    "ConfigureQueue.expected_policy_version": FENCE,
    "DeleteQueue.expected_incarnation": FENCE,
    "PurgeQueue.expected_incarnation": FENCE,
    # messages
    "Enqueue.not_before_ms": NOT_BEFORE,
    "Enqueue.expires_at_ms": IntegerRange(
        MIN_LOG_TIME_MS, AVRO_LONG_MAX, note="after the evaluation time and not_before_ms; past MAX_LOG_TIME_MS: never"
    ),
    # leases
    "Receive.max_messages": IntegerRange(1, MAX_RECEIVE_MESSAGES, note="≤ the queue's receive_max_messages"),
    "Receive.max_bytes": IntegerRange(1, MAX_RECEIVE_BYTES, note="≤ the queue's receive_max_bytes"),
    "Receive.lease_ms": LEASE,
    "Receive.wait_ms": WAIT,
    "Renew.lease_ms": LEASE,
    "Nack.delay_ms": DELAY,
    # dead letters
    "Redrive.expected_state_version": FENCE,
    "Redrive.expected_delivery_generation": FENCE,
    "Cancel.expected_state_version": FENCE,
    "Cancel.expected_delivery_generation": FENCE,
    "ParkPending.expected_state_version": FENCE,
    "ParkPending.expected_delivery_generation": FENCE,
    "ListDeadLetters.after_sequence": SEQUENCE,
    "ListDeadLetters.limit": IntegerRange(1, MAX_DEAD_LETTER_PAGE),
    # topics and groups
    "TopicPolicySpec.max_retained_events": IntegerRange(1, MAX_RETAINED_EVENTS),
    "TopicPolicySpec.max_retained_bytes": IntegerRange(1, MAX_RETAINED_BYTES),
    "TopicPolicySpec.max_age_ms": IntegerRange(0, MAX_TOPIC_AGE_MS, note="0: no age limit"),
    "ConfigureTopic.expected_policy_version": FENCE,
    "DeleteTopic.expected_incarnation": FENCE,
    "RaiseFeatureLevel.level": IntegerRange(0, FEATURE_LEVEL, note="above it: a later processor's, refused"),
    "DeleteGroup.expected_incarnation": FENCE,
    "ReadTopic.from_position": IntegerRange(
        0, MAX_SEQUENCE, note="≤ tail + 1; below first_available: HistoryUnavailable"
    ),
    "ReadTopic.max_events": IntegerRange(1, MAX_READ_EVENTS),
    "ReadTopic.max_bytes": IntegerRange(1, MAX_READ_BYTES),
    "CreateGroup.position": IntegerRange(0, MAX_SEQUENCE, note="≤ tail + 1; below first_available: HistoryUnavailable"),
    "GroupPolicySpec.max_window": IntegerRange(1, MAX_GROUP_WINDOW),
    "GroupPolicySpec.lease_ms": IntegerRange(MIN_LEASE_MS, MAX_LEASE_MS, note="≤ max_lease_ms"),
    "GroupPolicySpec.max_lease_ms": IntegerRange(MIN_LEASE_MS, MAX_LEASE_MS),
    "GroupPolicySpec.max_attempts": ATTEMPTS,
    "GroupPolicySpec.retry_base_ms": RETRY,
    "GroupPolicySpec.retry_max_ms": RETRY,
    "GroupPolicySpec.retry_factor": RETRY_FACTOR,
    "GroupReceive.max_events": IntegerRange(1, MAX_GROUP_RECEIVE_EVENTS),
    "GroupReceive.max_bytes": IntegerRange(1, MAX_GROUP_RECEIVE_BYTES),
    "GroupReceive.lease_ms": LEASE,
    "GroupReceive.wait_ms": WAIT,
    "GroupNack.delay_ms": DELAY,
    "GroupRenew.lease_ms": LEASE,
    "SeekGroup.position": IntegerRange(0, MAX_SEQUENCE, note="≤ tail + 1; below first_available: HistoryUnavailable"),
    "SeekGroup.expected_generation": FENCE,
    "ConfigureGroup.expected_generation": FENCE,
    "PurgeTopic.through": IntegerRange(
        0, MAX_SEQUENCE, note="first_available..tail (past it: ResourceExhausted), ≤ MAX_PURGE_EVENTS of them"
    ),
    "PurgeTopic.expected_generation": FENCE,
    # documents
    "PutDocument.expected_revision": REVISION,
    "DeleteDocument.expected_revision": IntegerRange(1, MAX_SEQUENCE, note=REVISION.note),
    "ListQueues.max_queues": IntegerRange(1, MAX_LIST_RESOURCES),
    "ListTopics.max_topics": IntegerRange(1, MAX_LIST_RESOURCES),
    "ListDocuments.max_documents": IntegerRange(1, MAX_LIST_DOCUMENTS),
    "ListDocuments.max_bytes": IntegerRange(1, MAX_LIST_BYTES),
    # processing and inboxes
    "CompleteProcessing.execution_generation": SEQUENCE,
    "ConfigureDomain.outcome_horizon_ms": IntegerRange(MIN_OUTCOME_HORIZON_MS, MAX_HORIZON_MS),
    "ConfigureDomain.receipt_horizon_ms": IntegerRange(
        MIN_OUTCOME_HORIZON_MS, MAX_HORIZON_MS, note="≥ outcome_horizon_ms (equal: no receipts)"
    ),
    "ConfigureDomain.expected_policy_version": FENCE,
    "ConfigureDomainCaps.max_queues": IntegerRange(0, MAX_DOMAIN_RESOURCES),
    "ConfigureDomainCaps.max_topics": IntegerRange(0, MAX_DOMAIN_RESOURCES),
    "ConfigureDomainCaps.max_groups": IntegerRange(0, MAX_DOMAIN_RESOURCES),
    "ConfigureDomainCaps.max_documents": IntegerRange(0, MAX_DOMAIN_DOCUMENTS),
    "ConfigureDomainCaps.max_document_bytes": IntegerRange(0, MAX_DOMAIN_DOCUMENT_BYTES),
    "ConfigureDomainCaps.expected_policy_version": FENCE,
    "ConfigureInbox.max_receipts": IntegerRange(1, MAX_INBOX_RECEIPTS),
    "ConfigureInbox.max_bytes": IntegerRange(1, MAX_INBOX_BYTES),
    "InboxSource.delivery_generation": SEQUENCE,
    "CommitInbox.execution_generation": SEQUENCE,
    # large payloads and retention
    "PrepareLargeSchedule.length": IntegerRange(0, MAX_PAYLOAD_BYTES),
    "PrepareLargeSchedule.upload_window_ms": IntegerRange(MIN_UPLOAD_WINDOW_MS, MAX_UPLOAD_WINDOW_MS),
    "PrepareLargeSchedule.not_before_ms": NOT_BEFORE,
    "PrepareLargeSchedule.expires_at_ms": IntegerRange(
        MIN_LOG_TIME_MS, AVRO_LONG_MAX, note="after the upload deadline and not_before_ms; past MAX_LOG_TIME_MS: never"
    ),
    "CancelLargeSchedule.reservation_id": RESERVATION_ID,
    "CommitLargeSchedule.reservation_id": RESERVATION_ID,
    "PayloadCommitProof.reservation_id": IntegerRange(
        AVRO_LONG_MIN, AVRO_LONG_MAX, None, "only compared: Conflict unless the reservation's"
    ),
    "PayloadCommitProof.length": IntegerRange(
        AVRO_LONG_MIN, AVRO_LONG_MAX, None, "only compared: Conflict unless the reserved length"
    ),
    "PayloadCommitProof.trust_set_version": IntegerRange(
        AVRO_LONG_MIN, AVRO_LONG_MAX, None, "only compared: TokenInvalidated unless the reservation's"
    ),
    "PayloadCommitProof.attested_at_ms": IntegerRange(
        AVRO_LONG_MIN, AVRO_LONG_MAX, None, "the attester's clock: signed, never evaluated"
    ),
    "InspectReservation.reservation_id": RESERVATION_ID,
    "AdvanceRecoveryFloor.floor_offset": IntegerRange(0, MAX_SEQUENCE, note="below the command's own offset"),
    "ListRetention.after_task": SEQUENCE,
    "ListRetention.limit": IntegerRange(1, MAX_RETENTION_PAGE),
    "BeginDelete.task_id": TASK_ID,
    "DeleteConfirmed.task_id": TASK_ID,
    "CheckpointPublished.offset": IntegerRange(0, MAX_SEQUENCE, note="below the command's own offset"),
    # access control
    "PutPrincipal.expected_revision": REVISION,
}
