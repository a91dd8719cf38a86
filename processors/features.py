"""Feature levels: new semantics take effect at a logged point, so every log replays as it was written.

A replay must rebuild the state the log's writers saw, so a processor cannot change what an old
record does (tests/test_fixture_replay.py holds it to a log 0.2.0 wrote). A change that would is
given a feature level instead. A partition applies the semantics of its level, a meta row (absent:
0, the semantics 0.2.0 logs were written under), which only a logged RaiseFeatureLevel moves: the
records before it replay as before, the records after it with the new semantics, on any processor
that knows the level. `keyload run` raises every partition it serves to the highest level it knows
(limits.FEATURE_LEVEL) when it starts; a level above that is refused (Validation), so an older
processor never applies a log meant for newer semantics under its own.

The levels:

1. Reads keep no outcome. A command that only reads state (the command table's `reads` rows:
   inspect, list, get, read, status) stores nothing under its command id: a repeat is answered
   afresh from the state of then, and the id is not reserved. Read pages, message views with
   bodies and principal views no longer accumulate in the projection.
2. Outcomes keep to their domain's horizons (processors/horizons.py). An outcome stored from here
   on is kept for the domain's outcome horizon, then as a receipt until its receipt horizon (a
   repeat meanwhile: HistoryUnavailable), then its command id is new. A repeated CompleteProcessing
   or CommitInbox whose first outcome is gone answers `already_processed` without the first
   results.
3. Receives keep leases, not bodies. The outcome a Receive or GroupReceive stores keeps each
   delivery's token and lease but not its body; a repeat is answered with each lease as it stands
   then (processors/repeats.py): a lease still held with its body and current deadline, one settled,
   expired or invalidated since with its error code and no body.
4. Finished work is compacted (processors/horizons.py). A message that finishes from here on (acked,
   expired, cancelled; not a large one, whose history goes with its object) keeps its metadata for
   its domain's outcome horizon from when it finished, then an identity tombstone until the receipt
   horizon (its id stays taken), then its id is new. Inbox entries written from here on go at the
   receipt horizon, a target inbox's with their room, and so do the tombstones of documents deleted
   from here on (unless written again first). A queue's delivery tokens name the message's
   enqueue sequence (v2, processors/tokens.py), so a token of an earlier message under a reused id
   never names a later one's lease.
5. Domains have caps (processors/usage.py). Each domain's queues, topics, subscription groups, live
   documents and document bytes are counted, and a create or document write past the domain's cap
   (ConfigureDomainCaps; defaults in keyload/limits.py) is ResourceExhausted. The raise counts what
   the partition held then, one timer budget itself and the rest in bounded steps before the
   records after it; the caps apply once it is done.
6. Event ids keep to the receipt horizon (processors/horizons.py). A topic's event-id row written
   from here on (the dedup of Publish) goes at its domain's receipt horizon counted from the
   publish, so a topic's rows grow with its retained events and the ids published within the
   horizon, not with every event it ever took; after it the event id is new, as a message id is
   after its message's.
7. Compaction finds confirmed retention tasks by an index (processors/payloads/retention.py). A
   task confirmed deleted from here on gets a row by its confirmation offset, and an
   AdvanceRecoveryFloor compacts the tasks the floor has passed from that index, so tasks still
   waiting in front never hold the later ones back. The tasks confirmed before the raise are
   indexed first, within the same budget.
8. A large message's identity keeps to the receipt horizon. A large message that finishes from
   here on (or a reservation abandoned) has its identity row go at its domain's receipt horizon
   as it is then, as its inbox entries do; once its retention task is compacted too (its object
   deleted, its history gone), its id is new. Before it the identity stayed for as long as the
   queue, and still does for what finished earlier.
9. Creating is declaring (processors/declare.py). A CreateQueue, CreateTopic or CreateGroup naming
   one that exists with the same configuration (policy; a group's filter too) returns it as it
   stands, as a declare does in RabbitMQ and CreateQueue in SQS, instead of Conflict; another
   configuration is still Conflict, now naming what differs.
10. A group's ack batch names each token's checkpoint (processors/groups/leases.py). Each acked
    token's result in a GroupAckBatch's outcome holds the group's checkpoint right after that
    token's ack, what a lone GroupAck answers (the batch's own `checkpoint` stays the one after its
    last token), so the HTTP API can carry concurrent GroupAcks in one GroupAckBatch and answer
    each as alone (keyload/server/coalescing.py). Before it the per-token checkpoint is null.
11. Principal commands check what they name (processors/principals.py). A PutPrincipal without a
    key_id naming a principal that does not exist (an enable, disable or grants change) is
    NotFound, as a grant, revoke or inspect of it is, instead of Validation ("a new principal
    needs a key_id"); a new principal's name and every grant given anew (PutPrincipal,
    EnableAccessControl, GrantCapability) hold no control character (Unicode Cc), grants held from
    before staying as they are; a RevokeCapability of a grant the principal does not hold is
    checked as a grant is, where before it was a quiet no-op whatever its patterns.
12. A group's declare does not look where its start points (processors/groups/group.py). A
    CreateGroup naming a group that exists checks its start's form only (a position given with
    `position` start alone) and is answered as a declare (level 9), as Kafka's auto.offset.reset
    applies to a new group only; before it the start was held against the topic first, so a
    service declaring its group with a fixed position failed once a purge or retention had passed
    it (HistoryUnavailable) or the position lay past the tail + 1 (Validation).
13. A waiting long poll answers where its latest repeat asks (processors/waiters.py). A Receive or
    GroupReceive repeated (same command id and content) while it still waits has its outcome
    published to the reply partition the repeat names, not the first one's: on Kafka a client whose
    server stopped resubmits through another, which reads another reply partition. Before it the
    answer went to the first reply partition only, and the retry waited out its time unanswered.
14. A refused PurgeTopic names the purge limit (processors/topics/topic.py): "a group has not
    completed position N" with N the lowest, over the topic's groups, of a group's limit + 1, as a
    discard-old publish names it. Before it N was the first group's (in name order) whose limit
    the purge passed, so an operator who purged through N - 1 could be refused again lower down.
15. In a strict_per_key queue a ready message that is not its key's head is held out of the ready
    index (processors/queues/lifecycle.py): it enters the index when it becomes the head, at the
    back. A receive that meets such a row left from before holds it too. Before it every held
    message kept a ready row and receives skipped them, counted against the examination budget,
    from a floor that could not pass them: with more than RECEIVE_EXAMINATION_BUDGET held rows in
    front, a retried head (back of the ready order) and every other key behind them were never
    reached again.
16. A reservation's object key ends in a digest of the reserving command's id and log time
    (processors/payloads/reservations.py: `payloads/p-NNNN/<reservation id>-<16 hex digits>`).
    Before it the key was the partition and reservation id alone, and a restore after the log lost
    its tail allocated the lost reservations' ids again: the upload of a new reservation met the
    object a lost one had stored under its key and was refused ("already holds other bytes").
17. A PutPrincipal naming a key the principal held before and was rotated away from is Conflict
    (processors/principals.py): a rotation may retire a key because it leaked. Before it such a
    key was taken back, as a rotation repeated by its command id past the receipt horizon (when the
    id is new again) did with the key derived from that id.
18. A PutPrincipal, GrantCapability or RevokeCapability that would change the key of one of the
    service's actors (keyload-ticker, keyload-gc, keyload-checkpointer), disable it, or leave it
    without its capability (tick, recovery, checkpoint) on every domain is Conflict
    (processors/principals.py). Before it such a change applied, and the service's Ticks (or GC
    passes, or checkpoint records) were refused from then on: leases, delays and long polls never
    ran out. The one key change taken is back to the actor's fixed key (`<principal>-1`), though it
    held it before (level 17 refuses any other key a principal was rotated from): the mend of an
    actor whose key was changed below the level.
"""

from __future__ import annotations

from keyload import limits
from keyload.bodies import RaiseFeatureLevel
from keyload.log.codec import Record
from keyload.processors import validation
from keyload.processors.context import Context
from keyload.projections import keys
from keyload.projections.store import Readable, Staged

READS_UNSTORED = 1  # the level from which reads keep no outcome
OUTCOME_HORIZONS = 2  # the level from which outcomes keep to their domain's horizons
LEASES_KEPT = 3  # the level from which receives store leases, not bodies, and a repeat re-checks them
WORK_COMPACTED = 4  # the level from which finished messages and inbox entries go after the horizons
DOMAIN_CAPS = 5  # the level from which domains' holdings are counted and capped
EVENT_IDS_KEPT = 6  # the level from which a topic's event ids are deduplicated within the receipt horizon
CONFIRMED_INDEXED = 7  # the level from which compaction finds confirmed retention tasks by an index
LARGE_IDENTITIES_KEPT = 8  # the level from which a compacted large message's identity keeps to the receipt horizon
CREATES_DECLARE = 9  # the level from which a create of an existing resource, configured the same, returns it
TOKEN_CHECKPOINTS = 10  # the level from which a GroupAckBatch's result names each acked token's checkpoint
PRINCIPALS_CHECKED = 11  # the level from which principal commands check the names and patterns they are given
DECLARES_UNSTARTED = 12  # the level from which a CreateGroup of an existing group does not check its start's range
WAITERS_FOLLOW_REPEATS = 13  # the level from which a waiting receive answers where its latest repeat asks
PURGES_NAME_LOWEST = 14  # the level from which a refused PurgeTopic names the lowest group limit
HELD_OUT_OF_READY = 15  # the level from which a strict queue's held messages have no ready row
OBJECT_KEYS_UNIQUE = 16  # the level from which an object key carries its reserving command's digest
RETIRED_KEYS_REFUSED = 17  # the level from which a principal never takes back a key it was rotated from
SERVICE_ACTORS_KEPT = 18  # the level from which the service's actors keep their keys, enablement and capability
# The reads level 1 covers, frozen: tests/test_feature_levels.py holds the command table's `reads`
# rows to it. Making an existing command a read changes how level-1 logs replay: a later level.
LEVEL_1_READS = frozenset(
    {
        "InspectQueue",
        "InspectMessage",
        "ListDeadLetters",
        "ReadTopic",
        "InspectTopic",
        "GroupStatus",
        "GetDocument",
        "ListDocuments",
        "InspectReservation",
        "InspectPrincipal",
    }
)


def feature_level(stage: Readable) -> int:
    """The partition's feature level (0 until a RaiseFeatureLevel moves it)."""
    raw = stage.get(keys.FEATURE_LEVEL)
    return 0 if raw is None else keys.read_u64(raw)


def raise_feature_level(stage: Staged, body: RaiseFeatureLevel, ctx: Context) -> Record:
    """Move the partition to `level` when it is above the current one; the level in force."""
    validation.check_integer("RaiseFeatureLevel.level", body.level)
    current = feature_level(stage)
    if body.level > current:
        stage.put(keys.FEATURE_LEVEL, keys.u64(body.level))
        if current < WORK_COMPACTED <= body.level:
            stage.put(keys.MESSAGE_IDS_REUSABLE_SINCE, keys.u64(ctx.now_ms))
        if current < DOMAIN_CAPS <= body.level:
            from keyload.processors import usage  # it builds on this module's levels

            usage.start_count(stage, ctx.now_ms)
        if current < CONFIRMED_INDEXED <= body.level:
            from keyload.processors.payloads import retention  # so does it

            retention.start_indexing(stage)
        current = body.level
    return {"feature_level": current}


assert READS_UNSTORED < OUTCOME_HORIZONS < LEASES_KEPT < WORK_COMPACTED < DOMAIN_CAPS < EVENT_IDS_KEPT
assert EVENT_IDS_KEPT < CONFIRMED_INDEXED < LARGE_IDENTITIES_KEPT < CREATES_DECLARE < TOKEN_CHECKPOINTS
assert TOKEN_CHECKPOINTS < PRINCIPALS_CHECKED < DECLARES_UNSTARTED < WAITERS_FOLLOW_REPEATS < PURGES_NAME_LOWEST
assert PURGES_NAME_LOWEST < HELD_OUT_OF_READY < OBJECT_KEYS_UNIQUE < RETIRED_KEYS_REFUSED < SERVICE_ACTORS_KEPT
assert SERVICE_ACTORS_KEPT <= limits.FEATURE_LEVEL
