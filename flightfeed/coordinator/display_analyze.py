"""EXPLAIN ANALYZE: the distributed plan after it ran, each node with what it did.

Every node line gets its rows, batches, bytes and compute time: on the coordinator as measured
there, in a stage summed over the stage's tasks (or one line set per task with `per_task`),
from the TaskMetrics each worker reported (pre-order, as the stage's plan). Then the feeds:
units pulled, sent, received and processed, and the created → received / processed latency
percentiles over their partitions, and each provider's own `metrics()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..feeds import Percentiles
from ..plan.base import ExecutionPlan
from ..plan.metrics import NodeMetrics, unwrap
from ..plan.nodes import Coalesce
from ..protocol import MetricsSet
from .metrics import FeedPartitionMetrics, QueryMetrics
from .stage import DistributedPlan, Stage


@dataclass(frozen=True, slots=True)
class _Counts:
    rows: int = 0
    batches: int = 0
    bytes: int = 0
    compute_ns: int = 0

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(
            self.rows + other.rows,
            self.batches + other.batches,
            self.bytes + other.bytes,
            self.compute_ns + other.compute_ns,
        )

    def __str__(self) -> str:
        return (
            f"rows={self.rows} batches={self.batches} bytes={self.bytes}"
            f" compute={self.compute_ns / 1e6:.3f}ms"
        )


def format_analyzed(
    plan: DistributedPlan,
    metrics: QueryMetrics,
    provider_metrics: Mapping[bytes, Mapping[str, int]],
    *,
    per_task: bool = False,
) -> str:
    """The plan that ran, with `metrics` (the query's) on every node; `provider_metrics`: per
    feed id, its provider's own counters."""
    elapsed = ((metrics.finished_ns or metrics.started_ns) - metrics.started_ns) / 1e6
    lines = [f"Query {metrics.query_id.hex()[:8]}: {metrics.status} in {elapsed:.1f} ms"]
    lines.append("Coordinator")
    coordinator = [_counts_of_node(m) for m in metrics.coordinator_nodes]
    root = plan.root if plan.root.output_partitions == 1 else Coalesce(plan.root)  # as it ran
    lines.extend(_tree(root, [coordinator], depth=1))
    for stage in plan.stages:
        lines.append(f"Stage {stage.stage_id}: {stage.note}")
        lines.extend(_stage_lines(stage, metrics, per_task))
    lines.extend(_feed_lines(metrics.feed_partitions(), provider_metrics))
    return "\n".join(lines)


def _stage_lines(stage: Stage, metrics: QueryMetrics, per_task: bool) -> list[str]:
    records = [
        metrics.tasks[key]
        for task in stage.tasks
        if (key := (stage.stage_id, task.task_number)) in metrics.tasks
    ]
    per_record = [[_counts_of_set(s) for s in record.plan_metrics] for record in records]
    lines: list[str] = []
    if per_task:
        for record, counts in zip(records, per_record, strict=True):
            lines.append(f"  task {record.task_number} on {record.worker_url}: {record.status}")
            lines.extend(_tree(stage.plan, [counts], depth=2))
        return lines
    places = ", ".join(f"{r.task_number} on {r.worker_url} ({r.status})" for r in records)
    lines.append(f"  tasks {places}")
    lines.extend(_tree(stage.plan, per_record, depth=2))
    return lines


def _tree(plan: ExecutionPlan, per_task: Sequence[Sequence[_Counts]], depth: int) -> list[str]:
    """Pre-order lines of `plan`, node i's counts summed over `per_task` (index i of each)."""
    lines: list[str] = []
    index = 0

    def visit(node: ExecutionPlan, level: int) -> None:
        nonlocal index
        total = sum((counts[index] for counts in per_task if index < len(counts)), _Counts())
        inner = unwrap(node)
        lines.append(f"{'  ' * level}{inner!r} partitions={inner.output_partitions} {total}")
        index += 1
        for child in inner.children:
            visit(child, level + 1)

    visit(plan, depth)
    return lines


def _counts_of_node(node: NodeMetrics) -> _Counts:
    return _Counts(
        node.output_rows, node.output_batches, node.output_bytes, node.elapsed_compute_ns
    )


def _counts_of_set(metrics: MetricsSet) -> _Counts:
    rows = batches = nbytes = compute = 0
    for metric in metrics.metrics:
        if metric.output_rows is not None:
            rows += metric.output_rows.value
        elif metric.output_batches is not None:
            batches += metric.output_batches.value
        elif metric.output_bytes is not None:
            nbytes += metric.output_bytes.value
        elif metric.elapsed_compute is not None:
            compute += metric.elapsed_compute.value
    return _Counts(rows, batches, nbytes, compute)


def _feed_lines(
    partitions: Mapping[tuple[bytes, int], FeedPartitionMetrics],
    provider_metrics: Mapping[bytes, Mapping[str, int]],
) -> list[str]:
    by_feed: dict[bytes, list[FeedPartitionMetrics]] = {}
    for (feed_id, _), found in sorted(partitions.items()):
        by_feed.setdefault(feed_id, []).append(found)
    lines: list[str] = []
    for feed_id in sorted(set(by_feed) | set(provider_metrics)):
        parts = by_feed.get(feed_id, [])
        lines.append(
            f"Feed {feed_id.hex()[:8]}: {len(parts)} partitions,"
            f" units pulled={sum(p.units_pulled for p in parts)}"
            f" sent={sum(p.units_sent for p in parts)}"
            f" received={sum(p.units_received for p in parts)}"
            f" processed={sum(p.units_consumed for p in parts)}"
        )
        for name, sketches in (
            ("created→received", [p.created_to_received for p in parts]),
            ("created→processed", [p.created_to_processed for p in parts]),
        ):
            worst = _worst(sketches)
            if worst.count:
                lines.append(
                    f"  {name} (worst partition) p50={worst.p50_ns / 1e6:.3f}ms"
                    f" p95={worst.p95_ns / 1e6:.3f}ms p99={worst.p99_ns / 1e6:.3f}ms"
                    f" over {sum(p.count for p in sketches)} units"
                )
        own = provider_metrics.get(feed_id)
        if own:
            lines.append("  provider " + " ".join(f"{k}={v}" for k, v in sorted(own.items())))
    return lines


def _worst(found: Sequence[Percentiles]) -> Percentiles:
    """The partition with the highest p99: per-partition sketches do not merge exactly."""
    return max(found, key=lambda p: (p.p99_ns, p.count), default=Percentiles())


__all__ = ["format_analyzed"]
