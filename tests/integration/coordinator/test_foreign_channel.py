"""A worker reached through a transport of the caller's own (the transport-neutral
WorkerChannel) fails as a gRPC one does: a connection lost while the coordinator reads a task's
output is an UNAVAILABLE error naming the worker, the attempt is retried, and the query's
metrics say which worker failed and why. (gRPC's client maps its own transport errors before
they reach the coordinator; another transport's raw errors are mapped by QueryRuntime.read.)"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pyarrow as pa
import pytest
from grpclib.const import Status

from flightfeed._generated.flightfeed.v1 import (
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
    SetPlanRequest,
)
from flightfeed.coordinator import Coordinator
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import RemoteError
from flightfeed.plan import HashAggregate, agg, col
from flightfeed.plan.nodes import Coalesce
from flightfeed.protocol import WorkerChannel
from flightfeed.protocol.channel import Headers, TaskChannel
from flightfeed.protocol.resolver import ChannelResolver
from flightfeed.testing.feeds import (
    UnitProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)
from flightfeed.testing.workers import start_workers

pytestmark = pytest.mark.anyio

RESET = "Connection reset by peer"


class ResetsMidRead:
    """Another transport's channel to a worker (delegating to an in-process one) whose first
    `owner.resets_left` ExecuteTask streams lose their connection after one batch, as a socket reset
    would surface from it: a raw ConnectionResetError."""

    def __init__(self, inner: WorkerChannel, owner: FlakyChannels) -> None:
        self._inner = inner
        self._owner = owner  # (its count is shared by every channel to the worker)

    @property
    def url(self) -> str:
        return self._inner.url

    async def worker_info(self) -> GetWorkerInfoResponse:
        return await self._inner.worker_info()

    def open_task(
        self, set_plan: SetPlanRequest, *, headers: Headers | None = None
    ) -> AbstractAsyncContextManager[TaskChannel]:
        return self._inner.open_task(set_plan, headers=headers)

    @asynccontextmanager
    async def execute_task(
        self, request: ExecuteTaskRequest, *, headers: Headers | None = None
    ) -> AsyncIterator[AsyncIterable[pa.RecordBatch]]:
        async with self._inner.execute_task(request, headers=headers) as batches:
            if self._owner.resets_left > 0:
                self._owner.resets_left -= 1
                yield self._reset_after_one(batches)
            else:
                yield batches

    @staticmethod
    async def _reset_after_one(
        batches: AsyncIterable[pa.RecordBatch],
    ) -> AsyncIterator[pa.RecordBatch]:
        async for batch in batches:
            yield batch
            break
        raise ConnectionResetError(RESET)

    async def close(self) -> None:
        await self._inner.close()


class FlakyChannels(ChannelResolver):
    """Channels as usual, but the one to `flaky` goes through ResetsMidRead."""

    def __init__(self, flaky: str, resets: int) -> None:
        super().__init__()
        self.flaky = flaky
        self.resets_left = resets

    async def channel(self, url: str) -> WorkerChannel:
        channel = await super().channel(url)
        return ResetsMidRead(channel, self) if url == self.flaky else channel


def counted(provider: UnitProvider) -> HashAggregate:
    """Rows per partition, finished on the coordinator: nothing reaches the caller before the
    tasks' outputs are read whole, so a failed read may be retried."""
    return HashAggregate(
        Coalesce(unit_scan(provider)), [(col("partition"), "partition")], [agg("count", name="n")]
    )


@asynccontextmanager
async def flaky_cluster(max_attempts: int) -> AsyncIterator[tuple[Coordinator, str, FlakyChannels]]:
    """Two in-process workers; the first one's channel resets its first ExecuteTask stream."""
    async with start_workers(2, session_builder=unit_session_builder, in_process=True) as workers:
        flaky = workers[0].location
        channels = FlakyChannels(flaky, resets=1)
        options = unit_coordinator_options(tasks=2, channels=channels, max_attempts=max_attempts)
        resolver = StaticWorkerResolver([w.location for w in workers])
        async with Coordinator(resolver, **options) as coordinator:
            yield coordinator, flaky, channels


async def test_a_connection_lost_mid_read_is_unavailable_and_names_the_worker() -> None:
    async with flaky_cluster(max_attempts=1) as (coordinator, flaky, _):
        with pytest.raises(RemoteError) as info:
            await coordinator.collect(counted(UnitProvider([3, 2])))
    error = info.value
    assert error.grpc_status is Status.UNAVAILABLE
    assert f"connection to worker {flaky} failed: {RESET}" in str(error)
    assert error.error_type == "ConnectionResetError"


async def test_the_attempt_is_retried_and_the_metrics_say_why() -> None:
    async with flaky_cluster(max_attempts=2) as (coordinator, flaky, channels):
        table = await coordinator.collect(counted(UnitProvider([3, 2])))
        metrics = coordinator.metrics.latest
    assert dict(zip(*table.sort_by("partition").to_pydict().values(), strict=True)) == {0: 3, 1: 2}
    assert channels.resets_left == 0  # the one reset happened, and the retry read whole
    assert metrics is not None
    assert len(metrics.failed_attempts) == 1
    failed = metrics.failed_attempts[0]
    assert f"ConnectionResetError: connection to worker {flaky} failed: {RESET}" in failed
    assert f"lost {flaky}" in failed  # taken for a lost worker: the retry ran without it
