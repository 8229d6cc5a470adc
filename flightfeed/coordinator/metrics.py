"""The coordinator's metrics store: per query, per task node metrics and per partition feed
metrics (units sent by the dispatcher; units received and latency percentiles from the
worker's TaskMetrics).

Feed metrics are keyed by (feed id, global partition). While a task runs, its send counts are
read live from its dispatcher; when it ends they are snapshotted and the dispatcher (with its
delivery log) is let go. The store keeps the last `capacity` queries.
"""

from __future__ import annotations

import math
import struct
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import anyio

from ..feeds import FeedDispatcher, Percentiles
from ..plan.metrics import NodeMetrics
from ..protocol import Metric, MetricsSet, PercentileLatency, TaskMetrics
from ..protocol.channel_wire import EncodedTaskMetrics

DEFAULT_CAPACITY: Final = 256
_U64: Final = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class FeedPartitionMetrics:
    """One (feed, global partition): what the coordinator sent and what the worker saw."""

    feed_id: bytes
    partition: int
    stage_id: int
    task_number: int
    worker_url: str
    units_pulled: int = 0
    units_sent: int = 0
    units_received: int = 0
    units_consumed: int = 0
    created_to_received: Percentiles = field(default_factory=Percentiles)
    created_to_processed: Percentiles = field(default_factory=Percentiles)


@dataclass(frozen=True, slots=True)
class _Received:
    received: int = 0
    consumed: int = 0
    created_to_received: Percentiles = field(default_factory=Percentiles)
    created_to_processed: Percentiles = field(default_factory=Percentiles)


ReportedMetrics: TypeAlias = TaskMetrics | EncodedTaskMetrics
"""A task's metrics as its channel delivered them: parsed, or still encoded."""
_Parsed: TypeAlias = tuple[list[MetricsSet], MetricsSet | None, dict[tuple[bytes, int], _Received]]
"""A task's node metrics, its task-wide metrics and its feeds' received counts."""


@dataclass(eq=False)
class TaskRecord:
    """One task of a query: where it ran, how it ended and what it reported. The worker's
    metrics are parsed when first read: no query needs them to finish."""

    stage_id: int
    task_number: int
    worker_url: str
    feed_partitions: Mapping[bytes, Sequence[int]] = field(default_factory=dict)
    """Per feed id, the global partition of each task-local partition."""
    status: str = "running"
    _dispatcher: FeedDispatcher | None = None
    _sent: dict[tuple[bytes, int], tuple[int, int]] = field(default_factory=dict)
    _reported: ReportedMetrics | None = None
    _parsed: _Parsed | None = None

    def attach(self, dispatcher: FeedDispatcher) -> None:
        self._dispatcher = dispatcher

    def finish(self, status: str, metrics: ReportedMetrics | None = None) -> None:
        """Snapshot the dispatcher's counts and keep the worker's metrics; drop the rest."""
        self.status = status
        if self._dispatcher is not None:
            self._sent = _sent_counts(self._dispatcher)
            self._dispatcher = None
        if metrics is not None:
            self._reported, self._parsed = metrics, None

    @property
    def plan_metrics(self) -> list[MetricsSet]:
        """Pre-order node metrics of the task's plan, as the worker sent them."""
        return self._metrics()[0]

    @property
    def task_metrics(self) -> MetricsSet | None:
        """Task-wide metrics (the plan's arrival, the feeds'), as the worker sent them."""
        return self._metrics()[1]

    def _metrics(self) -> _Parsed:
        if self._parsed is None:
            reported = self._reported
            if isinstance(reported, EncodedTaskMetrics):
                reported = reported.decode()  # InvalidArgument if the worker sent garbage
            if reported is None:
                self._parsed = ([], None, {})
            else:
                task_metrics = reported.task_metrics
                plan = list(reported.pre_order_plan_metrics)
                self._parsed = (plan, task_metrics, _received_counts(task_metrics))
            self._reported = None
        return self._parsed

    def feeds(self) -> dict[tuple[bytes, int], FeedPartitionMetrics]:
        """Per (feed id, global partition) of this task."""
        sent = _sent_counts(self._dispatcher) if self._dispatcher is not None else self._sent
        received = self._metrics()[2]
        out: dict[tuple[bytes, int], FeedPartitionMetrics] = {}
        for feed_id, globals_ in self.feed_partitions.items():
            for local, global_partition in enumerate(globals_):
                pulled, units_sent = sent.get((feed_id, local), (0, 0))
                got = received.get((feed_id, local), _Received())
                out[(feed_id, global_partition)] = FeedPartitionMetrics(
                    feed_id=feed_id,
                    partition=global_partition,
                    stage_id=self.stage_id,
                    task_number=self.task_number,
                    worker_url=self.worker_url,
                    units_pulled=pulled,
                    units_sent=units_sent,
                    units_received=got.received,
                    units_consumed=got.consumed,
                    created_to_received=got.created_to_received,
                    created_to_processed=got.created_to_processed,
                )
        return out

    def output_rows(self, node: int = 0) -> int:
        """Rows the task's plan node `node` (pre-order index) produced."""
        if node >= len(self.plan_metrics):
            return 0
        return sum(
            m.output_rows.value
            for m in self.plan_metrics[node].metrics
            if m.output_rows is not None
        )


@dataclass(eq=False)
class QueryMetrics:
    """Everything measured for one query. `status` is queued, running, finished, failed or
    cancelled."""

    query_id: bytes
    started_ns: int = field(default_factory=time.time_ns)
    finished_ns: int | None = None
    status: str = "running"
    error: str | None = None
    tasks: dict[tuple[int, int], TaskRecord] = field(default_factory=dict)
    coordinator_nodes: list[NodeMetrics] = field(default_factory=list)
    """Pre-order metrics of the plan part that ran on the coordinator."""
    admitted_ns: int | None = None
    """When the coordinator admitted the query (see admission.py); None while it is queued."""
    failed_attempts: list[str] = field(default_factory=list)
    """Each attempt that failed and was retried or gave up: its workers and cause (the
    `tasks` are the last attempt's)."""
    _done: anyio.Event = field(default_factory=anyio.Event, repr=False)

    @property
    def admission_wait(self) -> float:
        """Seconds the query waited for admission (so far, while it is still queued)."""
        until = self.admitted_ns if self.admitted_ns is not None else time.time_ns()
        return (until - self.started_ns) / 1e9

    def admitted(self) -> None:
        """The query leaves the admission queue and starts running."""
        self.admitted_ns = time.time_ns()
        if self.status == "queued":
            self.status = "running"

    def task(self, stage_id: int, task_number: int) -> TaskRecord:
        return self.tasks[(stage_id, task_number)]

    def feed_partitions(self) -> dict[tuple[bytes, int], FeedPartitionMetrics]:
        """Per (feed id, global partition), over every task of the query (live while running)."""
        out: dict[tuple[bytes, int], FeedPartitionMetrics] = {}
        for record in self.tasks.values():
            out.update(record.feeds())
        return out

    def finish(self, status: str, error: BaseException | None = None) -> None:
        self.status = status
        self.error = str(error) if error is not None else None
        self.finished_ns = time.time_ns()
        self._done.set()

    async def wait_finished(self) -> None:
        """Until the query ended (finished, failed or cancelled) and its tasks were told."""
        await self._done.wait()


class MetricsStore:
    """The metrics of the last `capacity` queries, by query id (oldest dropped first)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a metrics store keeps at least one query")
        self.capacity = capacity
        self._queries: OrderedDict[bytes, QueryMetrics] = OrderedDict()

    def add(self, query: QueryMetrics) -> None:
        self._queries[query.query_id] = query
        while len(self._queries) > self.capacity:
            self._queries.popitem(last=False)

    def get(self, query_id: bytes) -> QueryMetrics | None:
        return self._queries.get(query_id)

    def __getitem__(self, query_id: bytes) -> QueryMetrics:
        return self._queries[query_id]

    @property
    def latest(self) -> QueryMetrics | None:
        return next(reversed(self._queries.values()), None)

    def __iter__(self) -> Iterator[QueryMetrics]:
        return iter(list(self._queries.values()))

    def __len__(self) -> int:
        return len(self._queries)


def _sent_counts(dispatcher: FeedDispatcher) -> dict[tuple[bytes, int], tuple[int, int]]:
    return {key: (m.units_pulled, m.units_sent) for key, m in dispatcher.metrics().items()}


def _received_counts(task_metrics: MetricsSet | None) -> dict[tuple[bytes, int], _Received]:
    """The inbox's per-partition feed metrics out of TaskMetrics.task_metrics (see
    FeedInbox.to_metrics): counts, and latency sketches of up to 101 sorted samples, one
    per latency, from which p50, p95 and p99 are all read."""
    if task_metrics is None:
        return {}
    counts: dict[tuple[bytes, int], dict[str, int]] = {}
    sketches: dict[tuple[bytes, int], dict[str, bytes]] = {}
    for metric in task_metrics.metrics:
        feed = next((label.value for label in metric.labels if label.name == "feed"), None)
        if feed is None:
            continue
        try:
            key = (bytes.fromhex(feed), metric.partition or 0)
        except ValueError:
            continue
        if metric.count is not None:
            counts.setdefault(key, {})[metric.count.name] = metric.count.value
        sketch = _sketch_of(metric)
        if sketch is not None:
            sketches.setdefault(key, {}).setdefault(sketch.name, sketch.sketch_bytes)
    out: dict[tuple[bytes, int], _Received] = {}
    for key in counts.keys() | sketches.keys():
        c, s = counts.get(key, {}), sketches.get(key, {})
        received, consumed = c.get("feed_units_received", 0), c.get("feed_units_consumed", 0)
        out[key] = _Received(
            received=received,
            consumed=consumed,
            created_to_received=_percentiles(s.get("feed_created_to_received", b""), received),
            created_to_processed=_percentiles(s.get("feed_created_to_processed", b""), consumed),
        )
    return out


def _sketch_of(metric: Metric) -> PercentileLatency | None:
    """The latency sketch a metric carries, whichever percentile field it came under: each
    holds the whole distribution. flightfeed workers send it once, as custom_p50_latency;
    a sender that repeats it per percentile (as the reference does) repeats the same one."""
    for sketch in (
        metric.custom_p50_latency,
        metric.custom_p95_latency,
        metric.custom_p99_latency,
        metric.custom_p75_latency,
    ):
        if sketch is not None:
            return sketch
    return None


def _percentiles(sketch: bytes, count: int) -> Percentiles:
    """p50/p95/p99 from a sketch: every sample, sorted (read by rank, as the worker's
    histogram reads them), or sorted samples at evenly spaced quantiles."""
    points = len(sketch) // 8
    if points == 0:
        return Percentiles(count=count)
    last = points - 1
    every_sample = points == count

    def at(q: float) -> int:
        index = min(last, max(0, math.ceil(q * points) - 1)) if every_sample else round(q * last)
        value: int = _U64.unpack_from(sketch, 8 * index)[0]
        return value

    return Percentiles(count=count, p50_ns=at(0.5), p95_ns=at(0.95), p99_ns=at(0.99))
