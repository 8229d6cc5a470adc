"""Per-node execution metrics, counted by a wrapper so nodes never count by hand.

`instrument(plan, registry)` wraps every node of a tree in `Instrumented`; each wrapper counts
the rows, batches and bytes its node emits per partition and when each partition started and
ended. Elapsed compute is the time the node's Arrow C++ (or UDF) work took inside
`offload.run_compute`, attributed through a context variable the wrapper sets while its node
is polled: precise even when the work runs on a thread, and not inflated by other tasks that
run while the node waits. `MetricsRegistry.to_proto()` gives the MetricsSets of
TaskMetrics.pre_order_plan_metrics: index i is node i of the plan in pre-order.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from .._generated.flightfeed.v1 import (
    ElapsedCompute,
    EndTimestamp,
    Metric,
    MetricsSet,
    NamedCount,
    OutputBatches,
    OutputBytes,
    OutputRows,
    StartTimestamp,
)
from .memory import batch_nbytes

if TYPE_CHECKING:
    from .base import ExecutionPlan, TaskContext


@dataclass
class PartitionMetrics:
    """What one output partition of one node produced."""

    output_rows: int = 0
    output_batches: int = 0
    output_bytes: int = 0
    elapsed_compute_ns: int = 0
    start_timestamp_ns: int | None = None
    end_timestamp_ns: int | None = None


@dataclass
class NodeMetrics:
    """Metrics of one plan node: per partition, plus named counters the node may add."""

    node_name: str
    partitions: dict[int, PartitionMetrics] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def partition(self, partition: int) -> PartitionMetrics:
        found = self.partitions.get(partition)
        if found is None:
            found = self.partitions[partition] = PartitionMetrics()
        return found

    def add_count(self, name: str, value: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    @property
    def output_rows(self) -> int:
        return sum(p.output_rows for p in self.partitions.values())

    @property
    def output_batches(self) -> int:
        return sum(p.output_batches for p in self.partitions.values())

    @property
    def output_bytes(self) -> int:
        return sum(p.output_bytes for p in self.partitions.values())

    @property
    def elapsed_compute_ns(self) -> int:
        return sum(p.elapsed_compute_ns for p in self.partitions.values())

    def to_proto(self) -> MetricsSet:
        """One Metric per (partition, kind), then the named counters and times."""
        out: list[Metric] = []
        for index in sorted(self.partitions):
            p = self.partitions[index]
            out += [
                Metric(partition=index, output_rows=OutputRows(value=p.output_rows)),
                Metric(partition=index, output_batches=OutputBatches(value=p.output_batches)),
                Metric(partition=index, output_bytes=OutputBytes(value=p.output_bytes)),
                Metric(partition=index, elapsed_compute=ElapsedCompute(value=p.elapsed_compute_ns)),
            ]
            if p.start_timestamp_ns is not None:
                start = StartTimestamp(value=p.start_timestamp_ns)
                out.append(Metric(partition=index, start_timestamp=start))
            if p.end_timestamp_ns is not None:
                end = EndTimestamp(value=p.end_timestamp_ns)
                out.append(Metric(partition=index, end_timestamp=end))
        out += [Metric(count=NamedCount(name=k, value=v)) for k, v in sorted(self.counts.items())]
        return MetricsSet(metrics=out)


class MetricsRegistry:
    """The metrics of one task's plan, in pre-order; nodes find their own via `for_node`."""

    def __init__(self) -> None:
        self._nodes: list[NodeMetrics] = []
        self._by_node: dict[int, tuple[object, NodeMetrics]] = {}

    def _reserve(self, name: str) -> NodeMetrics:
        metrics = NodeMetrics(node_name=name)
        self._nodes.append(metrics)
        return metrics

    def _bind(self, node: object, metrics: NodeMetrics) -> None:
        self._by_node[id(node)] = (node, metrics)

    def for_node(self, node: object) -> NodeMetrics | None:
        """The metrics of an instrumented node (None if the plan was not instrumented)."""
        entry = self._by_node.get(id(node))
        return entry[1] if entry is not None and entry[0] is node else None

    def pre_order(self) -> list[NodeMetrics]:
        return list(self._nodes)

    def to_proto(self) -> list[MetricsSet]:
        return metrics_to_proto(self._nodes)


def metrics_to_proto(metrics: Sequence[NodeMetrics]) -> list[MetricsSet]:
    """The worker.proto form of pre-ordered node metrics."""
    return [m.to_proto() for m in metrics]


_CURRENT: ContextVar[PartitionMetrics | None] = ContextVar(
    "flightfeed_plan_current_partition_metrics", default=None
)


def record_compute(nanos: int) -> None:
    """Charge compute time to the node partition being polled in this context, if any."""
    current = _CURRENT.get()
    if current is not None:
        current.elapsed_compute_ns += nanos


class Instrumented:
    """Wraps a node and counts what its partitions emit. Encoding unwraps it (see `unwrap`)."""

    def __init__(self, inner: ExecutionPlan, metrics: NodeMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def schema(self) -> pa.Schema:
        return self.inner.schema

    @property
    def output_partitions(self) -> int:
        return self.inner.output_partitions

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return self.inner.children

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        return Instrumented(self.inner.with_children(children), self.metrics)

    def execute(self, partition: int, ctx: TaskContext, /) -> AsyncIterator[pa.RecordBatch]:
        stream = self.inner.execute(partition, ctx)  # validates the partition eagerly
        return self._count(stream, self.metrics.partition(partition))

    async def _count(
        self, stream: AsyncIterator[pa.RecordBatch], pm: PartitionMetrics
    ) -> AsyncIterator[pa.RecordBatch]:
        if pm.start_timestamp_ns is None:
            pm.start_timestamp_ns = time.time_ns()
        try:
            while True:
                token = _CURRENT.set(pm)
                try:
                    batch = await anext(stream)
                except StopAsyncIteration:
                    break
                finally:
                    _CURRENT.reset(token)
                pm.output_rows += batch.num_rows
                pm.output_batches += 1
                pm.output_bytes += batch_nbytes(batch)
                yield batch
        finally:
            pm.end_timestamp_ns = time.time_ns()
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def __repr__(self) -> str:
        return f"Instrumented({self.inner!r})"


def unwrap(plan: ExecutionPlan) -> ExecutionPlan:
    """The node under any instrumentation wrappers."""
    while isinstance(plan, Instrumented):
        plan = plan.inner
    return plan


def instrument(plan: ExecutionPlan, registry: MetricsRegistry) -> ExecutionPlan:
    """Wrap every node of `plan`; the registry gets one NodeMetrics per node, in pre-order."""
    metrics = registry._reserve(plan.name)
    children = [instrument(child, registry) for child in plan.children]
    node = plan.with_children(children) if children else plan
    registry._bind(node, metrics)
    return Instrumented(node, metrics)


def plan_metrics(plan: ExecutionPlan) -> list[NodeMetrics]:
    """Metrics of an instrumented plan in pre-order (empty ones for uninstrumented nodes)."""
    from .base import pre_order

    return [
        node.metrics if isinstance(node, Instrumented) else NodeMetrics(node_name=node.name)
        for node in pre_order(plan)
    ]
