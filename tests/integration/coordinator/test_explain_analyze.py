"""explain(analyze=True): the query runs, and every node of every stage shows what it did,
summed over the stage's tasks or task by task, with the feeds' latencies and provider metrics."""

from __future__ import annotations

import re
from contextlib import AbstractAsyncContextManager

import pytest
from helpers.feed_scan import ESTIMATORS, feed_cluster

from flightfeed.coordinator import Coordinator
from flightfeed.errors import InvalidArgument
from flightfeed.plan import ExecutionPlan, agg, plan_from
from flightfeed.testing.feeds import UnitProvider, UnitScanEstimator, unit_scan
from flightfeed.worker import Worker

pytestmark = pytest.mark.anyio

UNITS = [30, 10, 25, 35]


def counted(provider: UnitProvider) -> ExecutionPlan:
    """One row per unit (its partition), counted per partition: partial, shuffle, final."""
    source = plan_from(unit_scan(provider))
    return source.aggregate(["partition"], [agg("count", name="n")]).plan


def rows_of(text: str, node: str) -> list[int]:
    """The rows= figure of every line whose node starts with `node`."""
    return [
        int(re.search(r" rows=(\d+) ", line)[1])  # type: ignore[index]
        for line in text.splitlines()
        if line.strip().startswith(node)
    ]


def cluster() -> AbstractAsyncContextManager[tuple[Coordinator, list[Worker]]]:
    return feed_cluster(task_estimators={**ESTIMATORS, "UnitScan": UnitScanEstimator(2)})


async def test_analyze_sums_each_node_over_its_stage_tasks() -> None:
    provider = UnitProvider(UNITS)
    async with cluster() as (coordinator, workers):
        text = await coordinator.explain(counted(provider), analyze=True)
    assert re.match(r"Query [0-9a-f]{8}: finished in [\d.]+ ms\n", text)
    assert rows_of(text, "UnitScan") == [sum(UNITS)]  # both tasks' rows, one line
    assert rows_of(text, "HashAggregate(partial") == [4]  # a group per partition
    assert rows_of(text, "NetworkShuffle") == [4]
    assert rows_of(text, "HashAggregate(final") == [4]
    assert rows_of(text, "NetworkCoalesce") == [4]  # on the coordinator
    for worker in workers:
        assert f"on {worker.location} (finished)" in text
    assert f"units pulled={sum(UNITS)} sent={sum(UNITS)}" in text
    assert re.search(r"created→processed \(worst partition\) p50=[\d.]+ms", text)
    assert f"provider pulls={sum(UNITS)}" in text  # the provider's own metrics()


async def test_analyze_per_task_shows_each_task_its_own_rows() -> None:
    async with cluster() as (coordinator, _):
        text = await coordinator.explain(counted(UnitProvider(UNITS)), analyze=True, per_task=True)
    # Task 0 owns feed partitions 0 and 1, task 1 partitions 2 and 3.
    assert rows_of(text, "UnitScan") == [UNITS[0] + UNITS[1], UNITS[2] + UNITS[3]]
    assert sum(rows_of(text, "HashAggregate(final")) == 4
    finished = re.findall(r"  task \d on grpc://\S+: finished", text)
    assert len(finished) == 4  # 2 stages, 2 tasks each


async def test_analyze_is_text_of_a_query_execute_runs() -> None:
    async with cluster() as (coordinator, _):
        with pytest.raises(InvalidArgument, match="analyze"):
            await coordinator.explain(counted(UnitProvider(UNITS)), analyze=True, dot=True)
