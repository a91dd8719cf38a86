"""The runtime: group commit, halting on corruption, checkpoints at exact offsets, the ticker."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from keyload.log.codec import REGISTRY
from keyload.operations.catalog import CatalogEntry
from keyload.operations.checkpoints import Announcer, CheckpointPolicy, Checkpoints
from keyload.projections import keys
from keyload.service.checkpoint_uploads import MAX_PENDING_CHECKPOINTS, CheckpointUploads
from keyload.service.runtime import PartitionProcessor, first_record_ms, run_until, wall_clock_ms
from keyload.service.system_commands import domain_for_partition
from keyload.storage.object_store import ObjectStoreError
from keyload.storage.principals import CHECKPOINTER_PRINCIPAL, system_credential

from .support import (
    CHECKPOINT,
    CREATE_QUEUE,
    ENQUEUE,
    TICK,
    Embedded,
    command,
    create_queue_body,
    enqueue_body,
    wait_until,
)

D = "acme"


def test_corruption_halts_the_partition_and_commits_nothing_of_the_bad_command(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", not_before_ms=embedded.now_ms + 10))
    # Make the projection contradict itself: the queue forgets its scheduled message.
    store = embedded.store(D)
    record = REGISTRY.decode("keyload.QueueRecord", store.get(keys.queue(D, "jobs")) or b"")
    record["view"]["counters"]["scheduled"] = 0
    store._db.put(keys.queue(D, "jobs"), REGISTRY.encode("keyload.QueueRecord", record))  # bit rot, outside the log
    # The processor reads the rows it wrote itself from its read cache until they leave it (a restart):
    # here the rot shows at once.
    embedded.processors[embedded.partition(D)].reads.clear()
    embedded.log.append(embedded.partition(D), [command(D, ENQUEUE, enqueue_body("jobs", "m2"))])
    good_offset = embedded.log.end_offset(embedded.partition(D)) - 1
    embedded.now_ms += 10
    tick_offset = embedded.append(D, command(D, TICK, {}))
    embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", "m3")))
    digest_before = None
    processor = embedded.processors[embedded.partition(D)]
    while processor.step():
        digest_before = store.digest()
    assert processor.halt is not None
    assert processor.halt.offset == tick_offset
    assert processor.halt.reason == "Corruption: counter scheduled would become -1"
    assert store.applied_offset == good_offset == tick_offset - 1
    # Nothing more is applied, however often it is asked.
    assert processor.step() == 0
    assert store.applied_offset == tick_offset - 1
    assert digest_before is None or store.digest() == digest_before


def test_group_commit_applies_many_commands_per_write_batch(embedded: Embedded) -> None:
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs")))
    for i in range(1_000):
        embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", f"m{i}")))
    processor = embedded.processors[embedded.partition(D)]
    groups = 0
    while processor.step():
        groups += 1
    assert groups == 2  # 1,001 records in groups of at most 512
    assert embedded.store(D).applied_offset == 1_000


def test_checkpoint_command_cuts_the_group_and_records_its_offset(embedded: Embedded, tmp_path: Path) -> None:
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs")))
    for i in range(5):
        embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", f"m{i}")))
    checkpoint_offset = embedded.append(D, command(D, CHECKPOINT, {}))
    for i in range(5, 10):
        embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", f"m{i}")))
    embedded.run()
    [manifest] = [e.manifest for e in embedded.checkpoints.entries(embedded.partition(D))]
    assert manifest.offset == checkpoint_offset
    assert embedded.store(D).applied_offset == checkpoint_offset + 5


def test_ticker_appends_a_tick_only_when_a_timer_is_due(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    partition = embedded.partition(D)
    due = embedded.now_ms + 1_000
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "later", not_before_ms=due))
    ticker = embedded.ticker(100)
    end = embedded.log.end_offset(partition)
    assert ticker.poll(embedded.processors, due - 1_000) == 0
    assert embedded.log.end_offset(partition) == end
    embedded.now_ms = due  # the log stamps the tick at the time it is appended
    assert ticker.poll(embedded.processors, due) == 1
    # One outstanding tick per partition: nothing more until it is applied.
    assert ticker.poll(embedded.processors, due + 500) == 0
    embedded.run()
    assert embedded.processors[partition].next_timer_ms() is None
    assert ticker.poll(embedded.processors, due + 1_000) == 0


def test_a_missing_index_row_is_corruption_not_repaired(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1", expires_at_ms=embedded.now_ms + 10))
    store = embedded.store(D)
    [(ready_key, _)] = store.scan(keys.READY, keys.prefix_end(keys.READY))
    store._db.delete(ready_key)  # bit rot, outside the log
    embedded.now_ms += 10
    offset = embedded.append(D, command(D, TICK, {}))
    embedded.run()
    halt = embedded.processors[embedded.partition(D)].halt
    assert halt is not None and halt.offset == offset and "index row" in halt.reason
    assert store.applied_offset == offset - 1


def test_a_rejected_checkpoint_command_takes_no_checkpoint(embedded: Embedded) -> None:
    embedded.append(D, command(D, CHECKPOINT, {}, principal=""))
    embedded.run()
    assert embedded.checkpoints.entries(embedded.partition(D)) == []


def test_a_projection_ahead_of_its_log_halts_instead_of_skipping_records(tmp_path: Path) -> None:
    """After a crash that lost the log's tail, new records would reuse applied offsets: refuse."""
    import shutil

    first = Embedded(tmp_path / "data")
    first.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    first.submit(D, ENQUEUE, enqueue_body("jobs", "m1"))
    first.close()
    segments = tmp_path / "data" / "log" / "commands" / f"p-{first.partition(D):04d}"
    shutil.rmtree(segments)  # the log lost everything the projection applied
    second = Embedded(tmp_path / "data")
    try:
        processor = second.processors[second.partition(D)]
        assert processor.halt is not None and processor.halt.reason.startswith("RecoveryRequired")
        second.append(D, command(D, ENQUEUE, enqueue_body("jobs", "m2")))
        assert processor.step() == 0
    finally:
        second.close()


def test_until_idle_applies_the_announcement_of_a_checkpoint_it_took(embedded: Embedded) -> None:
    """The checkpoint announcer appends to the partition while it is being stepped (and rings for
    nobody): a service told to stop once idle applies that record first."""
    processor = embedded.processors[0]
    processor.announce = Announcer(embedded.log, system_credential(embedded.data.root, CHECKPOINTER_PRINCIPAL))
    domain = domain_for_partition(0, embedded.data.partitions)
    embedded.log.append(0, [command(domain, CHECKPOINT, {}, "checkpoint-1")])
    assert run_until([processor], threading.Event(), idle_exit=True) == []
    assert processor.last_checkpoint is not None and processor.last_checkpoint.offset == 0
    assert processor.applied_offset == embedded.log.end_offset(0) - 1 == 1


def test_a_checkpoint_published_on_the_uploads_thread_is_announced_at_the_next_step(embedded: Embedded) -> None:
    """With `uploads` the step that takes a checkpoint only snapshots it; a later step of the same
    processor finds it published and announces it, and the announcement is applied like any record."""
    processor = embedded.processors[0]
    processor.announce = Announcer(embedded.log, system_credential(embedded.data.root, CHECKPOINTER_PRINCIPAL))
    processor.uploads = uploads = CheckpointUploads(embedded.data.checkpoints)
    try:
        domain = domain_for_partition(0, embedded.data.partitions)
        embedded.log.append(0, [command(domain, CHECKPOINT, {}, "checkpoint-1")])
        assert processor.step() == 1
        assert processor.last_checkpoint is None  # being published on the uploads' thread
        wait_until(lambda: processor.step() >= 0 and processor.last_checkpoint is not None, what="the publication")
        assert run_until([processor], threading.Event(), idle_exit=True) == []
        assert processor.last_checkpoint is not None and processor.last_checkpoint.offset == 0
        assert processor.applied_offset == embedded.log.end_offset(0) - 1 == 1
        assert embedded.stores[0].get(keys.published_checkpoint(0)) is not None
    finally:
        assert uploads.close() == 0


def test_no_snapshot_is_taken_while_earlier_ones_fill_the_uploads_and_one_warning_says_so(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While MAX_PENDING_CHECKPOINTS snapshots of a partition wait for a slow object store, a periodic
    checkpoint is skipped before its snapshot (which flushes the projection's memtable) is taken, one
    warning says so for the whole run of them, and the next one taken counts them."""
    processor = embedded.processors[0]
    released = threading.Event()

    def slow_to_open() -> Checkpoints:
        released.wait(30)
        return embedded.data.checkpoints()

    processor.uploads = uploads = CheckpointUploads(slow_to_open)
    taken: list[int] = []
    snapshot = Checkpoints.snapshot
    monkeypatch.setattr(Checkpoints, "snapshot", lambda self, *a: (taken.append(1), snapshot(self, *a))[1])
    domain = domain_for_partition(0, embedded.data.partitions)
    try:
        embedded.log.append(0, [command(domain, CREATE_QUEUE, create_queue_body("q"))])
        assert run_until([processor], threading.Event(), idle_exit=True) == []
        for _ in range(5):
            assert processor.take_checkpoint() is None
        assert len(taken) == MAX_PENDING_CHECKPOINTS == 2
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 1 and "checkpoint at offset 0 skipped" in skipped[0], skipped
        released.set()
        published: list[object] = []
        wait_until(lambda: published.extend(uploads.finished(0)) or len(published) == 2, what="the two publications")
        with caplog.at_level(logging.INFO, logger="keyload.service.runtime"):
            processor.take_checkpoint()
        assert len(taken) == 3
        assert "checkpoint at offset 0 taken, after 3 skipped" in caplog.text
    finally:
        released.set()
        assert uploads.close() == 0


def test_with_none_published_the_checkpoint_interval_counts_from_the_logs_first_record(embedded: Embedded) -> None:
    """A partition with no published checkpoint counts the interval from the log time of its first
    record, which the services look up (`first_record_ms`), not from each restart: a deployment
    restarted more often than the interval still takes its first checkpoint."""
    checkpoints = embedded.data.checkpoints(CheckpointPolicy(every_records=1000, interval_s=3600, retain=10))
    partition = embedded.partition(D)
    empty = next(p for p in range(embedded.data.partitions) if p != partition)
    assert first_record_ms(embedded.log, empty) is None
    began = embedded.now_ms = wall_clock_ms() - 2 * 3_600_000  # the first record's log time: two hours ago
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs")))
    embedded.now_ms = wall_clock_ms()
    assert first_record_ms(embedded.log, partition) == began

    def apply(first: int | None, message_id: str) -> list[int]:
        processor = PartitionProcessor(
            partition,
            embedded.data.partitions,
            embedded.log,
            embedded.stores[partition],
            checkpoints=checkpoints,
            first_record_ms=first,
        )
        embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", message_id)))
        while processor.step():
            pass
        return [entry.offset for entry in checkpoints.entries(partition)]

    assert apply(None, "m1") == []  # counted from this processor's start: an hour has not passed
    assert apply(began, "m2") == [2]  # counted from the first record: two hours have
    checkpoints.close()


def test_a_publication_is_announced_before_older_checkpoints_are_retired_and_whether_they_are(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Retiring the checkpoints beyond `retain` comes after the publication is handed over (on Kafka
    it reads the catalog topic again, about a second): a kill meanwhile no longer leaves the new
    checkpoint unannounced, and a retirement that fails (an object store refusing deletes) leaves it
    published and announced, not reported failed; the next publication retires what is left."""
    processor = embedded.processors[0]
    processor.announce = Announcer(embedded.log, system_credential(embedded.data.root, CHECKPOINTER_PRINCIPAL))
    processor.uploads = uploads = CheckpointUploads(embedded.data.checkpoints)
    domain = domain_for_partition(0, embedded.data.partitions)
    retiring = threading.Event()
    announced_first: list[bool] = []
    retire_beyond = Checkpoints.retire_beyond

    def refused_once(self: Checkpoints, partition: int) -> list[CatalogEntry]:
        announced_first.append(embedded.checkpoints.latest(0) is not None and retiring.wait(30))
        if len(announced_first) == 1:
            raise ObjectStoreError("the object store refused the delete")
        return retire_beyond(self, partition)

    monkeypatch.setattr(Checkpoints, "retire_beyond", refused_once)

    def announced(offset: int) -> bool:
        return processor.last_checkpoint is not None and processor.last_checkpoint.offset == offset

    try:
        for number in (1, 2):
            embedded.log.append(0, [command(domain, CHECKPOINT, {}, f"checkpoint-{number}")])
            taken = embedded.log.end_offset(0) - 1
            wait_until(lambda: processor.step() >= 0 and announced(taken), what="the announcement")  # noqa: B023
            retiring.set()  # announced while the retirement still waits
            assert run_until([processor], threading.Event(), idle_exit=True) == []
            assert embedded.stores[0].get(keys.published_checkpoint(taken)) is not None
            wait_until(lambda: len(announced_first) == number, what="the retirement")  # noqa: B023
            retiring.clear()
        assert announced_first == [True, True]
        assert "older checkpoints not retired after the one at offset 0: ObjectStoreError" in caplog.text
        assert "checkpoint at offset 0 failed" not in caplog.text
    finally:
        retiring.set()
        assert uploads.close() == 0


def test_a_restart_announces_the_newest_checkpoint_its_publisher_never_announced(embedded: Embedded) -> None:
    """A publisher killed between publishing a checkpoint and announcing it leaves the catalog with
    a checkpoint the partition never recorded (the floor could not move onto it): the next
    processor, once caught up with the log's end, announces it. One whose announcement waits in the
    log's backlog (a stop leaves it there) is recorded by applying it, and announced no second
    time, also by a processor reading a feed that has not fetched the backlog yet (Kafka mode)."""
    announce = Announcer(embedded.log, system_credential(embedded.data.root, CHECKPOINTER_PRINCIPAL))
    domain = domain_for_partition(0, embedded.data.partitions)

    def start(announcing: bool) -> PartitionProcessor:
        return PartitionProcessor(
            0,
            embedded.data.partitions,
            embedded.log,
            embedded.stores[0],
            checkpoints=None if announcing else embedded.checkpoints,  # test log time is 1970: none periodic
            announce=announce if announcing else None,
            newest_checkpoint=embedded.checkpoints.latest(0),
        )

    def checkpoint_unannounced(command_id: str) -> CatalogEntry:
        [appended] = embedded.log.append(0, [command(domain, CHECKPOINT, {}, command_id)])
        offset = appended.offset
        processor = start(announcing=False)
        assert run_until([processor], threading.Event(), idle_exit=True) == []
        assert processor.last_checkpoint is not None and processor.last_checkpoint.offset == offset
        assert embedded.stores[0].get(keys.published_checkpoint(offset)) is None
        return processor.last_checkpoint

    checkpoint_unannounced("checkpoint-1")
    assert run_until([start(announcing=True)], threading.Event(), idle_exit=True) == []
    assert embedded.log.end_offset(0) == 2  # the announcement, applied
    assert embedded.stores[0].get(keys.published_checkpoint(0)) is not None

    newest = checkpoint_unannounced("checkpoint-2")
    announce(0, newest)  # appended, not applied: the backlog a stop leaves
    end = embedded.log.end_offset(0)
    # Kafka mode's processor reads a feed its consumer fills: empty before the first fetch, it reads
    # short, but the log's end says the backlog is still to come.
    from keyload.service.kafka import PartitionFeed

    feed = PartitionFeed(0, embedded.log.end_offset)
    fed = PartitionProcessor(
        0,
        embedded.data.partitions,
        feed,
        embedded.stores[0],
        identity_log=embedded.log,
        verify_on_resume=False,
        announce=announce,
        newest_checkpoint=newest,
    )
    assert fed.step() == 0 and fed.caught_up
    assert embedded.log.end_offset(0) == end  # nothing announced while the backlog is unread
    for record in embedded.log.read(0, fed.applied_offset + 1, 10):
        feed.push(record)
    assert fed.step() == end - 1 - newest.offset
    assert fed.step() == 0
    assert embedded.log.end_offset(0) == end  # recorded by the backlog's announcement: not announced again
    assert embedded.stores[0].get(keys.published_checkpoint(newest.offset)) is not None


def test_periodic_checkpoints_count_from_the_newest_published_one_across_a_restart(embedded: Embedded) -> None:
    """Every 4 records or an hour, counted from the newest published checkpoint, also when the
    processor restarted meanwhile: a restart an hour past the newest checkpoint's last record
    takes one at its first commit, and a restart two records after one takes the next two records
    later; with none published yet, records count from the log's start across restarts. (Counting
    from the restart, a service restarted more often than its checkpoint period would never take one.)"""
    checkpoints = embedded.data.checkpoints(CheckpointPolicy(every_records=4, interval_s=3600, retain=10))
    partition = embedded.partition(D)

    def restart() -> PartitionProcessor:
        return PartitionProcessor(
            partition,
            embedded.data.partitions,
            embedded.log,
            embedded.stores[partition],
            checkpoints=checkpoints,
            newest_checkpoint=checkpoints.latest(partition),
        )

    def apply(by: PartitionProcessor, *message_ids: str) -> list[int]:
        for message_id in message_ids:
            embedded.append(D, command(D, ENQUEUE, enqueue_body("jobs", message_id)))
            while by.step():
                pass
        return [entry.offset for entry in checkpoints.entries(partition)]

    embedded.now_ms = wall_clock_ms() - 2 * 3_600_000  # these records' log time: two hours ago
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs")))
    assert apply(restart(), "m1") == []
    assert apply(restart(), "m2", "m3") == [3]  # 4 records since the log's start, none published before
    later = restart()
    assert apply(later, "m4") == [3, 4]  # its newest checkpoint's last record is 2 hours old
    embedded.now_ms = wall_clock_ms()
    assert apply(later, "m5", "m6", "m7", "m8") == [3, 4, 8]
    assert apply(later, "m9", "m10") == [3, 4, 8]
    assert apply(restart(), "m11", "m12") == [3, 4, 8, 12]
    checkpoints.close()
