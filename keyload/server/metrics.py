"""Prometheus metrics of a running service (`GET /metrics`, DESIGN.md §10).

Two kinds: what the server counts as requests pass (requests by method and status, the time from
a command's append to its outcome, by command kind), and what is read from the partitions when
scraped (applied offset, log end and lag, halts, poison records, and per queue and group their
depth, dead letters and backlog, and the age of each queue's oldest ready message). The second
kind is what the processors in this process hold, and what the live projections hold, opened
read-only (on Kafka none are: there the processors' own figures alone, poison records among them,
counted as groups commit), so a scrape costs a scan of the queue, group and poison
rows of every partition, and two point reads per queue: at most MAX_SCRAPED_RESOURCES queues and as
many groups per partition are reported.

The oldest ready message's age (SQS's ApproximateAgeOfOldestMessage, the usual alarm of a consumer
falling behind) is the head of the queue's ready index, the next message a receive would deliver
(found from the queue's ready floor, so no settled message's tombstone is walked), aged from its
enqueue by the server's clock: metrics are not projection state, so reading the clock here is fine.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from keyload.log.base import CommandLog, LogError
from keyload.projections import keys
from keyload.projections.records import GroupRecord, MessageMeta, QueueRecord, TopicRecord
from keyload.projections.store import Store, StoreError, poison_count
from keyload.server.held import HeldProjections
from keyload.server.processing import Processing

MAX_SCRAPED_RESOURCES = 1000  # queues, and groups, reported per partition and scrape
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
QUEUE_STATES = ("ready", "scheduled", "leased", "dead_lettered", "pending_dead_letter")


class ServerMetrics:
    """The service's registry: request counters, outcome latencies and the partitions' state."""

    def __init__(self, partitions: PartitionCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "keyload_http_requests", "HTTP requests answered", ["method", "status"], registry=self.registry
        )
        self.connections = ConnectionCounts.registered(self.registry)
        self.outcome_latency = Histogram(
            "keyload_outcome_latency_seconds",
            "from a command's append by the server to its outcome",
            ["kind"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.partitions = partitions
        self.registry.register(partitions)

    def close(self) -> None:
        self.partitions.close()


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """The HTTP connections open, and those refused and closed by each bound of
    keyload/server/connections.py (`reason`: connections, head_timeout, head_too_large)."""

    open: Gauge
    refused: Counter

    @classmethod
    def registered(cls, registry: CollectorRegistry) -> ConnectionCounts:
        return cls(
            Gauge("keyload_http_connections", "HTTP connections open", registry=registry),
            Counter(
                "keyload_http_connections_refused",
                "connections refused and closed (keyload/server/connections.py), by the bound they passed",
                ["reason"],
                registry=registry,
            ),
        )


class PartitionCollector(Collector):
    """The partitions' state, read when scraped (one scrape at a time: the log is read by one thread):
    the applied offset, halt and stall of every partition this process serves (`processing`), and
    what the projections hold (`projections`: every partition's on the embedded log, its workers'
    too; none on Kafka, where projections come and go with the partitions)."""

    def __init__(
        self,
        log: CommandLog,
        processing: Processing,
        projections: HeldProjections,
    ) -> None:
        self.log = log  # an instance of its own, for the log's end offsets
        self.processing = processing
        self.projections = projections
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:  # after a scrape still in progress
            self.log.close()
            self.projections.close()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Metric]:
        applied = GaugeMetricFamily("keyload_applied_offset", "last applied command offset", labels=["partition"])
        end = GaugeMetricFamily("keyload_log_end_offset", "next offset of the command log", labels=["partition"])
        lag = GaugeMetricFamily("keyload_lag_records", "records appended but not applied yet", labels=["partition"])
        halted = GaugeMetricFamily("keyload_partition_halted", "1 when the partition is halted", labels=["partition"])
        stalled = GaugeMetricFamily(
            "keyload_partition_stalled", "1 while the partition cannot make a group durable", labels=["partition"]
        )
        poison = GaugeMetricFamily(
            "keyload_poison_records", "records no command could be read from", labels=["partition"]
        )
        depth = GaugeMetricFamily(
            "keyload_queue_messages", "stored messages by state", labels=["domain", "queue", "state"]
        )
        # A counter (rate() it): it starts again from 0 when a purge makes a new incarnation of the queue.
        acked = CounterMetricFamily("keyload_queue_acked", "messages acked", labels=["domain", "queue"])
        oldest = GaugeMetricFamily(
            "keyload_queue_oldest_ready_age_seconds",
            "time since the enqueue of the next message a receive would deliver; 0 when none is ready",
            labels=["domain", "queue"],
        )
        backlog = GaugeMetricFamily(
            "keyload_group_backlog_events", "events past the group's checkpoint", labels=["domain", "topic", "group"]
        )
        outstanding = GaugeMetricFamily(
            "keyload_group_outstanding_deliveries", "deliveries leased or retrying", labels=["domain", "topic", "group"]
        )
        parked = GaugeMetricFamily(
            "keyload_group_parked_events", "parked positions", labels=["domain", "topic", "group"]
        )
        counted: dict[int, int] = {}  # poison records: as a processor here counts them, or its projection holds them
        for partition, offset in sorted(self.processing.applied_offsets().items()):
            label = str(partition)
            applied.add_metric([label], offset)
            halted.add_metric([label], 0 if self.processing.halt_of(partition) is None else 1)
            stalled.add_metric([label], 0 if self.processing.stall_of(partition) is None else 1)
            held = self.processing.poison_records(partition)
            if held is not None:
                counted[partition] = held
            try:
                log_end = self.log.end_offset(partition)
            except LogError:  # a damaged log (its partition halts), a broker away: no figure this time
                continue
            end.add_metric([label], log_end)
            lag.add_metric([label], max(log_end - 1 - offset, 0))
        now_ms = time.time() * 1000
        for partition, store in self._readable():
            try:
                counted[partition] = poison_count(store)
            except StoreError:  # a full disk keeps its projection from reopening: no figures this time
                continue
            for queue in _records(store, keys.QUEUE, QueueRecord):
                view = queue.view
                counters = view.counters
                for state in QUEUE_STATES:
                    depth.add_metric([view.domain, view.queue, state], getattr(counters, state))
                acked.add_metric([view.domain, view.queue], counters.acked_total)
                oldest.add_metric([view.domain, view.queue], _oldest_ready_age_s(store, queue, now_ms))
            for group in _records(store, keys.GROUP, GroupRecord):
                seen = group.view
                topic_row = store.get(keys.topic(seen.domain, seen.topic))
                tail = 0 if topic_row is None else TopicRecord.decode(topic_row).view.tail
                names = [seen.domain, seen.topic, seen.group]
                backlog.add_metric(names, max(tail - seen.checkpoint, 0))
                outstanding.add_metric(names, seen.outstanding)
                parked.add_metric(names, seen.parked_count)
        for partition, poisoned in sorted(counted.items()):
            poison.add_metric([str(partition)], poisoned)
        yield from (applied, end, lag, halted, stalled, poison, depth, acked, oldest, backlog, outstanding, parked)

    def _readable(self) -> Iterator[tuple[int, Store]]:
        """Each partition's projection that can be read now (a full disk keeps one from reopening,
        a worker's may be replacing it with a checkpoint: no figures from it this time)."""
        for partition in self.projections.partitions():
            with contextlib.suppress(StoreError), self.projections.read(partition) as store:
                if store is not None:
                    yield partition, store


def _oldest_ready_age_s(store: Store, queue: QueueRecord, now_ms: float) -> float:
    """Seconds since the enqueue of the head of the queue's ready index (0: nothing ready)."""
    queue_id = queue.view.incarnation
    head = store.first(keys.ready(queue_id, queue.ready_floor), keys.prefix_end(keys.ready_prefix(queue_id)))
    meta = None if head is None else store.get(keys.message(queue_id, head[1].decode()))
    if meta is None:  # nothing ready (or settled since the head was read: no figure older than it)
        return 0.0
    return max(now_ms - MessageMeta.decode(meta).enqueued_at_ms, 0.0) / 1000


R = TypeVar("R", QueueRecord, GroupRecord)


def _records(store: Store, family: bytes, kind: type[R]) -> Iterator[R]:
    for count, (_, value) in enumerate(store.scan(family, keys.prefix_end(family))):
        if count == MAX_SCRAPED_RESOURCES:
            return
        yield kind.decode(value)
