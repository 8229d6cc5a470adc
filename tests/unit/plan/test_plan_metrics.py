"""Metrics: counted by the instrumentation wrapper, in pre-order, as worker.proto MetricsSets."""

from __future__ import annotations

import betterproto2
import pytest

from flightfeed.plan import (
    Coalesce,
    Filter,
    MemoryScan,
    MetricsRegistry,
    Projection,
    call,
    col,
    collect,
    format_plan,
    instrument,
    lit,
    open_task_context,
    plan_metrics,
    pre_order,
)
from flightfeed.session import Session

from .helpers import sample_table

pytestmark = pytest.mark.anyio


async def test_metrics_per_node_in_pre_order() -> None:
    table = sample_table(1000)
    plan = Projection(
        Filter(
            Coalesce(MemoryScan.from_table(table, 4, batch_rows=50)), call("is_valid", col("k"))
        ),
        [call("multiply", col("v"), lit(2.0))],
        ["v2"],
    )
    registry = MetricsRegistry()
    wrapped = instrument(plan, registry)
    assert [n.name for n in pre_order(wrapped)] == [
        "Projection",
        "Filter",
        "Coalesce",
        "MemoryScan",
    ]
    async with open_task_context(Session(), metrics=registry, offload_threshold_bytes=0) as ctx:
        result = await collect(wrapped, ctx)

    metrics = registry.pre_order()
    assert [m.node_name for m in metrics] == ["Projection", "Filter", "Coalesce", "MemoryScan"]
    assert plan_metrics(wrapped) == metrics
    projection, filter_, coalesce, scan = metrics
    assert scan.output_rows == coalesce.output_rows == 1000
    assert scan.output_batches == 20
    assert sorted(scan.partitions) == [0, 1, 2, 3]
    kept = 1000 - table.column("k").null_count
    assert filter_.output_rows == projection.output_rows == result.num_rows == kept
    assert projection.output_bytes == result.nbytes
    assert filter_.elapsed_compute_ns > 0  # the predicate ran in run_compute
    assert projection.elapsed_compute_ns > 0
    for m in metrics:
        for p in m.partitions.values():
            assert p.start_timestamp_ns is not None
            assert p.end_timestamp_ns is not None
            assert p.start_timestamp_ns <= p.end_timestamp_ns
    assert "rows=1000" in format_plan(wrapped, with_metrics=True)


async def test_metrics_to_proto() -> None:
    registry = MetricsRegistry()
    wrapped = instrument(MemoryScan.from_table(sample_table(100), 2, batch_rows=30), registry)
    async with open_task_context(Session(), metrics=registry) as ctx:
        await collect(wrapped, ctx)
        node = registry.for_node(wrapped.inner)  # type: ignore[attr-defined]
        assert node is not None
        node.add_count("files_opened", 3)
    (scan,) = registry.to_proto()
    kinds: dict[str, list[tuple[int | None, int]]] = {}
    for metric in scan.metrics:
        field, value = betterproto2.which_one_of(metric, "value")
        kinds.setdefault(field, []).append((metric.partition, getattr(value, "value", 0)))
    assert kinds["output_rows"] == [(0, 50), (1, 50)]
    assert kinds["output_batches"] == [(0, 2), (1, 2)]
    assert [p for p, _ in kinds["start_timestamp"]] == [0, 1]
    assert [p for p, _ in kinds["end_timestamp"]] == [0, 1]
    assert {"elapsed_compute", "output_bytes", "count"} <= set(kinds)
    assert kinds["count"] == [(None, 3)]
    assert bytes(scan)  # encodable


async def test_uninstrumented_plans_report_empty_metrics() -> None:
    plan = MemoryScan.from_table(sample_table(10))
    assert [m.output_rows for m in plan_metrics(plan)] == [0]
