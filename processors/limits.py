"""Named limits of the command surface. docs/ARCHITECTURE.md lists each one."""

from __future__ import annotations

import re

MAX_COMMAND_ID_CHARS = 128
MAX_DOMAIN_CHARS = 64
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
RECEIVE_EXAMINATION_BUDGET = 256  # ready rows one Receive looks at (held keys are skipped)
MAX_DETAIL_CHARS = 512  # an outcome's error detail is cut to this
# An outcome is one log record, and both logs take records up to 4 MiB: a larger
# result is refused (BudgetExceeded) rather than left to fail its publication.
MAX_OUTCOME_BYTES = 4 * 1024 * 1024
# Receives and dead-letter pages stop adding items past this many result bytes
# (the first item always goes), so they stay inside MAX_OUTCOME_BYTES.
RESULT_BYTES_BUDGET = 3 * 1024 * 1024
RESULT_ITEM_OVERHEAD_BYTES = 2048  # per item beyond body, headers and ids: token (≤ 1024), counters, encoding
MAX_KEY_ID_CHARS = 64
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
MAX_PURGE_EVENTS = 10_000  # events one PurgeTopic deletes: larger purges go in steps
MAX_REPOSITION_PARKED = 10_000  # parked positions above its target a seek or configure may drop
MAX_DOCUMENT_KEY_CHARS = 512  # printable ASCII without spaces, like ids: "order/42" reads well
MAX_DOCUMENT_BYTES = MAX_INLINE_BODY_BYTES  # a document's value
DEFAULT_LIST_DOCUMENTS = 100
MAX_LIST_DOCUMENTS = 1_000
DEFAULT_LIST_BYTES = 1024 * 1024
MAX_LIST_BYTES = MAX_READ_BYTES  # values of one page, the first always included: inside MAX_OUTCOME_BYTES
LIST_EXAMINATION_BUDGET = 256  # document rows (tombstones too) one ListDocuments looks at
MAX_BATCH_MUTATIONS = 100  # mutations per Batch, effects per CompleteProcessing or CommitInbox
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

# Large payloads (processors/payloads.py) and their retention (processors/retention.py).
MAX_PAYLOAD_BYTES = 5 * 1024**4  # one object: S3's largest
DEFAULT_UPLOAD_WINDOW_MS = 15 * 60 * 1000  # from PrepareLargeSchedule to its upload deadline
MIN_UPLOAD_WINDOW_MS = 1_000
MAX_UPLOAD_WINDOW_MS = 24 * 3600 * 1000
MAX_OBJECT_VERSION_CHARS = 1024
DEFAULT_RETENTION_PAGE = 100
MAX_RETENTION_PAGE = 1_000
RETENTION_COMPACTION_BUDGET = 256  # task rows one AdvanceRecoveryFloor examines for compaction
MAX_DELETED_VERSIONS = 100  # versions one DeleteConfirmed may report
