"""Presumed credits: a new task's first work units ride right behind its SetPlan.

A worker reports its feed window in GetWorkerInfo; the coordinator presumes that window granted
(SetPlanRequest.presumed_credits) instead of waiting a round trip for the first FeedCredits, and
the worker grants only the rest, so a partition's credit never exceeds its window.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest
from helpers.feed_scan import coordinator_options, feed_session_builder, feed_task
from helpers.worker_plans import none_request

from flightfeed._generated.flightfeed.v1 import (
    FeedCredits,
    FeedPartitionEnd,
    SetPlanRequest,
)
from flightfeed.coordinator import ChannelResolver, Coordinator, StaticWorkerResolver
from flightfeed.errors import InvalidArgument
from flightfeed.feeds.codec import UnitRun, encode_batch
from flightfeed.feeds.inbox import MAX_FEED_WINDOW
from flightfeed.plan import Coalesce
from flightfeed.protocol import TaskChannel, WorkerChannel, WorkerClient
from flightfeed.protocol.channel_wire import EncodedTaskMetrics
from flightfeed.testing import start_workers
from flightfeed.testing.feeds import UnitProvider, unit_scan
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio
WINDOW = 4


@asynccontextmanager
async def worker_client(feed_credits: int = WINDOW) -> AsyncIterator[WorkerClient]:
    config = WorkerConfig(feed_credits=feed_credits)
    async with (
        start_workers(1, session_builder=feed_session_builder, config=config) as (worker,),
        WorkerClient(worker.location) as client,
    ):
        yield client


async def test_a_worker_reports_its_feed_window() -> None:
    async with worker_client(feed_credits=7) as client:
        assert (await client.worker_info()).feed_window == 7


async def run_presuming(
    client: WorkerClient, presumed: int
) -> tuple[list[bytes], list[FeedCredits]]:
    """One task over a one-partition feed: `presumed` units sent right behind its SetPlan,
    before the worker said anything, then the end. The bodies read back and every grant."""
    feed_id, request = feed_task(1)
    request.presumed_credits = presumed
    bodies = [f"unit {i}".encode() for i in range(presumed)]
    batch = encode_batch(
        [UnitRun(feed_id, 0, bodies, [1] * presumed)] if presumed else [],
        1,
        ends=[FeedPartitionEnd(id=feed_id, partition=0)],
    )
    grants: list[FeedCredits] = []
    read: list[bytes] = []
    async with client.open_task(request) as channel:
        await channel.send_work_units(batch)
        async with client.execute_task(none_request(request.task_key, 0, 1)) as reader:
            async for rows in reader:
                read += rows.column("body").to_pylist()
        with anyio.fail_after(10):
            async for message in channel.messages():
                if isinstance(message, EncodedTaskMetrics):
                    break
                if message.feed_credits is not None:
                    grants.append(message.feed_credits)
    return read, grants


@pytest.mark.parametrize(
    "presumed",
    [
        pytest.param(WINDOW, id="the-whole-window"),
        pytest.param(WINDOW // 2, id="half-the-window"),
        pytest.param(4 * WINDOW, id="a-stale-larger-window"),
    ],
)
async def test_units_sent_behind_the_plan_are_taken_and_the_window_is_kept(presumed: int) -> None:
    async with worker_client() as client:
        read, grants = await run_presuming(client, presumed)
    assert read == [f"unit {i}".encode() for i in range(presumed)]
    # The coordinator held `presumed` credits from the start; with every grant on top its
    # credit never went past the partition's window (the larger of the worker's and the
    # presumed one: a coordinator that learned a window before the worker restarted smaller).
    window = max(WINDOW, presumed)
    granted = [c.credits for grant in grants for c in grant.credits]
    assert sum(granted) <= window  # (a worker that granted its whole window first: 2x)
    if presumed < WINDOW:
        assert granted[0] == WINDOW - presumed  # the first grant tops the window up, no more


async def test_a_presumed_window_past_any_limit_is_refused_before_anything_runs() -> None:
    async with worker_client() as client:
        _, request = feed_task(1)
        request.presumed_credits = MAX_FEED_WINDOW + 1
        with pytest.raises(InvalidArgument, match="presumes 65537 feed credits per partition"):
            async with client.open_task(request) as channel:
                await channel.wait_metrics()
        assert (await client.worker_info()).tasks == 0


class RecordingResolver(ChannelResolver):
    """A ChannelResolver whose channels note every SetPlanRequest they send."""

    def __init__(self) -> None:
        super().__init__()
        self.set_plans: list[SetPlanRequest] = []

    async def channel(self, url: str) -> WorkerChannel:
        return _Recording(await super().channel(url), self.set_plans)


class _Recording:
    def __init__(self, inner: WorkerChannel, set_plans: list[SetPlanRequest]) -> None:
        self._inner = inner
        self._set_plans = set_plans

    def open_task(
        self, set_plan: SetPlanRequest, **options: Any
    ) -> AbstractAsyncContextManager[TaskChannel]:
        self._set_plans.append(set_plan)
        return self._inner.open_task(set_plan, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("feed_credits", [1, 3, 256])
async def test_the_coordinator_presumes_each_workers_reported_window(feed_credits: int) -> None:
    provider = UnitProvider([2 * feed_credits + 1] * 2)
    channels = RecordingResolver()
    config = WorkerConfig(feed_credits=feed_credits)
    async with (
        start_workers(1, session_builder=feed_session_builder, config=config) as (worker,),
        Coordinator(
            StaticWorkerResolver([worker.location]), channels=channels, **coordinator_options()
        ) as coordinator,
    ):
        table = await coordinator.collect(Coalesce(unit_scan(provider)))
    units = 2 * feed_credits + 1  # more than the window: the rest go against grants
    assert sorted(table.column("partition").to_pylist()) == [0] * units + [1] * units
    assert [p.presumed_credits for p in channels.set_plans] == [feed_credits]
    assert channels.feed_window(worker.location) == feed_credits


async def test_an_unchecked_worker_is_presumed_nothing() -> None:
    channels = ChannelResolver(check_version=False)
    async with (
        start_workers(1, session_builder=feed_session_builder) as (worker,),
        Coordinator(
            StaticWorkerResolver([worker.location]), channels=channels, **coordinator_options()
        ) as coordinator,
    ):
        table = await coordinator.collect(Coalesce(unit_scan(UnitProvider([300]))))
        assert table.num_rows == 300
        assert channels.feed_window(worker.location) == 0


@pytest.mark.parametrize("feed_credits", [0, MAX_FEED_WINDOW + 1])
def test_a_feed_window_out_of_range_is_refused_when_the_worker_is_configured(
    feed_credits: int,
) -> None:
    with pytest.raises(ValueError, match=r"feed_credits must be in 1\.\.65536"):
        WorkerConfig(feed_credits=feed_credits)
