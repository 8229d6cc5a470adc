"""Every stream a query opens is closed by the task that read it, not left to the garbage
collector: on the coordinator, the task channels' message streams it stops reading once the
metrics are in; on the workers, a scan's feed stream under a limit, and the channel's inbound
messages after a CancelTask. Before, the coordinator alone left two a query, each closed later
by a task the event loop started for it, after a cross-thread wake-up (strace: an eventfd
write each)."""

from __future__ import annotations

import anyio
import pytest
from helpers.abandoned_generators import abandoned_generators
from helpers.feed_scan import ESTIMATORS, feed_cluster

from flightfeed.examples.chunk_scan import scan
from flightfeed.plan import AggregateMode, Coalesce, HashAggregate, agg, col, plan_from
from flightfeed.testing import wait_for_no_tasks
from flightfeed.testing.feeds import UnitProvider, UnitScanEstimator, unit_scan

pytestmark = pytest.mark.anyio


def aggregate_over_a_feed() -> HashAggregate:
    """The load benchmark's query: a partial aggregate per task, the final one here."""
    source = scan(2, *["10,10,10"] * 4)
    keys = [(col("task"), "task")]
    aggregates = [agg("count", name="cnt")]
    partial = HashAggregate(source, keys, aggregates, mode=AggregateMode.PARTIAL)
    return HashAggregate(Coalesce(partial), keys, aggregates, mode=AggregateMode.FINAL)


@pytest.mark.parametrize("in_process", [False, True], ids=["gRPC", "in-process"])
async def test_a_query_read_to_its_end_leaves_no_stream_open(in_process: bool) -> None:
    async with feed_cluster(2, in_process=in_process) as (coordinator, workers):
        with abandoned_generators() as abandoned:
            for _ in range(3):
                result = await coordinator.collect(aggregate_over_a_feed())
                assert sorted(result.column("cnt").to_pylist()) == [60, 60]
            with anyio.fail_after(10):
                await wait_for_no_tasks(workers)
    assert abandoned == []


@pytest.mark.parametrize("in_process", [False, True], ids=["gRPC", "in-process"])
async def test_a_limit_that_stops_the_feeds_leaves_no_stream_open(in_process: bool) -> None:
    provider = UnitProvider([1_000_000] * 4)
    plan = plan_from(unit_scan(provider)).limit(5).plan
    estimators = {**ESTIMATORS, "UnitScan": UnitScanEstimator(2)}
    async with feed_cluster(2, task_estimators=estimators, in_process=in_process) as (
        coordinator,
        workers,
    ):
        with abandoned_generators() as abandoned:
            with anyio.fail_after(20):
                assert (await coordinator.collect(plan)).num_rows == 5
                await wait_for_no_tasks(workers)
    assert sum(provider.pulls) < 1_000_000  # it did stop them early
    assert abandoned == []
