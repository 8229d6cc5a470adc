"""In-process workers: the same protocol stack over memory, for tests about logic."""

from __future__ import annotations

import pytest
from helpers.feed_scan import coordinator_options, feed_session_builder

from flightfeed import __version__
from flightfeed.errors import RemoteError
from flightfeed.examples.chunk_scan import scan, scan_rows
from flightfeed.plan import Coalesce, agg, plan_from
from flightfeed.protocol import InProcessWorkerChannel, connect_worker
from flightfeed.testing import start_cluster, start_workers, wait_for_no_tasks

pytestmark = pytest.mark.anyio


async def test_in_process_workers_run_a_feed_query_without_sockets() -> None:
    plan = Coalesce(scan(2, "3,1", "2", "4", "1,1"))
    async with start_cluster(
        2, session_builder=feed_session_builder, in_process=True, **coordinator_options()
    ) as (coordinator, workers):
        assert all(w.location.startswith("inproc://") for w in workers)
        result = await coordinator.collect(plan)
        await wait_for_no_tasks(workers)
    expected = scan_rows(2, "3,1", "2", "4", "1,1")
    assert result.sort_by([("task", "ascending"), ("partition", "ascending")]).equals(
        expected.sort_by([("task", "ascending"), ("partition", "ascending")])
    )


async def test_in_process_worker_answers_worker_info_and_is_gone_once_stopped() -> None:
    async with start_workers(1, in_process=True) as (worker,):
        location = worker.location
        channel = connect_worker(location)
        assert isinstance(channel, InProcessWorkerChannel)
        assert (await channel.worker_info()).version == __version__
    with pytest.raises(RemoteError, match="no in-process worker at inproc://"):
        await channel.worker_info()


async def test_in_process_workers_shuffle_between_each_other() -> None:
    """A shuffled aggregate: the final's tasks read the partial's over in-process channels, a
    worker's own task through its handlers."""
    plan = plan_from(scan(2, "3,1", "2", "4", "1,1")).aggregate(["task"], [agg("count", name="n")])
    async with start_cluster(
        2, session_builder=feed_session_builder, in_process=True, **coordinator_options()
    ) as (coordinator, workers):
        assert "NetworkShuffle(" in await coordinator.explain(plan.plan)
        result = await coordinator.collect(plan.plan)
        await wait_for_no_tasks(workers)
    assert sorted(result.to_pylist(), key=lambda row: row["task"]) == [
        {"task": 0, "n": 6},
        {"task": 1, "n": 6},
    ]
