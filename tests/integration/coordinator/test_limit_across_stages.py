"""A limit stops the whole query early: the tasks below it, across stages (a shuffle's producers
too), end as soon as the limit has its rows, their feeds stop pulling, and every task still
reports its metrics. A limit of 0 too: it read nothing at all, and the tasks below it waited for
a reader until their idle TTL (5 minutes)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from helpers.feed_scan import ESTIMATORS, feed_cluster

from flightfeed.plan import ExecutionPlan, plan_from
from flightfeed.testing import wait_for_no_tasks
from flightfeed.testing.feeds import UnitProvider, UnitScanEstimator, unit_scan

pytestmark = pytest.mark.anyio

ENDLESS = 10_000_000
"""Units per partition: far more than any of these queries may pull."""


def through_a_shuffle(provider: UnitProvider) -> ExecutionPlan:
    return plan_from(unit_scan(provider)).repartition("partition", partitions=4).limit(3).plan


def straight(provider: UnitProvider) -> ExecutionPlan:
    return plan_from(unit_scan(provider)).limit(5).plan


def none(provider: UnitProvider) -> ExecutionPlan:
    return plan_from(unit_scan(provider)).limit(0).plan


def none_through_a_shuffle(provider: UnitProvider) -> ExecutionPlan:
    return plan_from(unit_scan(provider)).repartition("partition", partitions=4).limit(0).plan


def top_none(provider: UnitProvider) -> ExecutionPlan:
    return plan_from(unit_scan(provider)).sort("partition", fetch=0).plan


@pytest.mark.parametrize(
    ("build", "rows", "stages"),
    [
        (straight, 5, 1),
        (through_a_shuffle, 3, 2),
        (none, 0, 1),
        (none_through_a_shuffle, 0, 2),
        (top_none, 0, 1),
    ],
    ids=["one stage", "across a shuffle", "limit 0", "limit 0 across a shuffle", "top 0"],
)
@pytest.mark.parametrize("in_process", [False, True], ids=["gRPC", "in-process"])
async def test_a_limit_ends_every_task_early_with_complete_metrics(
    build: Callable[[UnitProvider], ExecutionPlan], rows: int, stages: int, in_process: bool
) -> None:
    """In process, a limit that closed a task's stream early broke the coordinator: the query
    failed ('the coordinator closed') and every later one with CancelledError."""
    provider = UnitProvider([ENDLESS] * 4)
    plan = build(provider)
    estimators = {**ESTIMATORS, "UnitScan": UnitScanEstimator(2)}
    async with feed_cluster(task_estimators=estimators, in_process=in_process) as (
        coordinator,
        workers,
    ):
        assert len(coordinator.plan(plan, 2).stages) == stages
        with anyio.fail_after(20):
            result = await coordinator.collect(plan)
            await wait_for_no_tasks(workers)
        metrics = coordinator.metrics.latest
        with anyio.fail_after(20):  # the coordinator still serves
            assert (await coordinator.collect(plan)).num_rows == rows
    assert result.num_rows == rows
    assert sum(provider.pulls) < ENDLESS // 100  # the feeds stopped: credits, not the data
    assert metrics is not None
    assert metrics.status == "finished"
    assert len(metrics.tasks) == 2 * stages
    for record in metrics.tasks.values():
        assert record.status == "finished"
        assert record.plan_metrics  # every task reported its nodes' metrics
    scans = [r.output_rows(len(r.plan_metrics) - 1) for r in metrics.tasks.values() if r.feeds()]
    assert sum(scans) < ENDLESS // 100
    assert (sum(scans) > 0) == (rows > 0)  # a limit of 0 needs no unit at all
