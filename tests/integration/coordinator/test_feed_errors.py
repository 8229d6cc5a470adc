"""Feed failures end in a clear error at the caller, never a hang (each bounded by a timeout)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
from helpers.feed_scan import coordinator_options, feed_cluster, feed_session_builder
from helpers.worker_plans import none_request

from flightfeed._generated.flightfeed.v1 import (
    SetPlanRequest,
    SetPlanRequestWorkUnitFeedDeclaration,
    TaskKey,
)
from flightfeed._version import __version__
from flightfeed.coordinator import ChannelResolver, Coordinator, StaticWorkerResolver
from flightfeed.errors import Cancelled, FeedError, RemoteError, VersionMismatch
from flightfeed.feeds import FeedRegistry
from flightfeed.flight import KeepalivePolicy
from flightfeed.plan import Coalesce, CodecRegistry, agg, encode_plan, plan_from
from flightfeed.protocol import WorkerClient
from flightfeed.testing import start_workers, tcp_proxy, wait_for_no_tasks
from flightfeed.testing.feeds import (
    UnitProvider,
    UnitScanCodec,
    UnitScanEstimator,
    probe,
    unit_scan,
)
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("at_unit", [0, 37])
async def test_a_provider_error_reaches_the_caller_with_its_message(at_unit: int) -> None:
    provider = UnitProvider([100] * 4, fail_at={2: (at_unit, "page 7 expired")})
    plan = Coalesce(unit_scan(provider))
    async with feed_cluster(2, task_estimators={"UnitScan": UnitScanEstimator(2)}) as (
        coordinator,
        workers,
    ):
        with anyio.fail_after(10), pytest.raises(FeedError, match="page 7 expired") as info:
            await coordinator.collect(plan)
        with anyio.fail_after(1):
            await wait_for_no_tasks(workers)
        metrics = coordinator.metrics.latest
    # Providers run on the coordinator: the error names the provider and its task, no worker.
    assert info.value.message.startswith("feed provider failed: ")
    assert info.value.error_type == "RuntimeError"
    origin = info.value.origin
    assert origin is not None
    assert (origin.component, origin.worker_url, origin.task_number) == ("feed provider", "", 1)
    assert "the coordinator task" in str(info.value)
    assert metrics is not None
    assert metrics.status == "failed"
    assert "page 7 expired" in (metrics.error or "")
    assert 2 in provider.closed


class CancelledByItself:
    """Partition 1 raises CancelledError after one unit, while nothing cancels it (a client
    library's own timeout leaking one)."""

    unit_type = bytes
    partitions = 2

    async def _units(self, partition: int) -> AsyncIterator[bytes]:
        yield b"a"
        if partition == 1:
            raise asyncio.CancelledError
        yield b"b"

    def feed(self, partition: int, ctx: object) -> AsyncIterator[bytes]:
        return self._units(partition)


@pytest.mark.parametrize("attempts", [1, 3], ids=["pulled by its task", "replayable"])
async def test_a_provider_raising_cancelled_itself_fails_its_query_naming_it(
    attempts: int,
) -> None:
    """It was taken for a cancellation: the query failed with "the coordinator closed", the
    coordinator open and answering the next query (found by a probe)."""
    async with feed_cluster(1, max_attempts=attempts) as (coordinator, workers):
        with anyio.fail_after(10), pytest.raises(FeedError) as info:
            await coordinator.collect(Coalesce(unit_scan(CancelledByItself())))
        assert "partition 1: the feed provider raised CancelledError while not cancelled" in (
            str(info.value)
        )
        assert "coordinator closed" not in str(info.value)
        with anyio.fail_after(5):
            await wait_for_no_tasks(workers)
        rows = await coordinator.collect(Coalesce(unit_scan(UnitProvider([2, 3]))))
        assert rows.num_rows == 5


async def test_a_feed_the_planner_cannot_find_fails_on_the_worker_not_silently() -> None:
    # The node's kind has an estimator, so it is distributed, but nobody registered its feed:
    # no partition is declared, and the worker's remote feed says so.
    plan = Coalesce(unit_scan(UnitProvider([5, 5])))
    async with feed_cluster(
        1, feed_registry=FeedRegistry(), task_estimators={"UnitScan": UnitScanEstimator()}
    ) as (coordinator, workers):
        with anyio.fail_after(10), pytest.raises(FeedError, match="no feed inbox"):
            await coordinator.collect(plan)
        with anyio.fail_after(1):
            await wait_for_no_tasks(workers)


def declared_feed_plan(key: TaskKey) -> SetPlanRequest:
    """A task that declares a feed for its two partitions, which nobody will ever feed."""
    node = unit_scan(UnitProvider([1, 1]))
    codecs = CodecRegistry.builtin().with_codec(UnitScanCodec())
    return SetPlanRequest(
        task_key=key,
        task_count=1,
        plan_proto=encode_plan(node, codecs),
        work_unit_feed_declarations=[
            SetPlanRequestWorkUnitFeedDeclaration(id=node.feed.id, partitions=2)
        ],
    )


async def test_a_declared_feed_never_produced_and_never_read_ends_at_the_idle_ttl() -> None:
    config = WorkerConfig(idle_ttl=0.3)
    async with (
        start_workers(1, session_builder=feed_session_builder, config=config) as (worker,),
        WorkerClient(worker.location) as client,
    ):
        key = TaskKey(query_id=uuid.uuid4().bytes, stage_id=1)
        async with client.open_task(declared_feed_plan(key)) as channel:
            with anyio.fail_after(10), pytest.raises(Cancelled, match="idle TTL"):
                await channel.wait_metrics()
        assert len(worker.registry) == 0


async def test_a_declared_feed_whose_coordinator_goes_away_fails_its_consumer() -> None:
    async with (
        start_workers(1, session_builder=feed_session_builder) as (worker,),
        WorkerClient(worker.location) as client,
        anyio.create_task_group() as tg,
    ):
        key = TaskKey(query_id=uuid.uuid4().bytes, stage_id=1)
        coordinator = anyio.CancelScope()

        async def coordinator_that_never_dispatches() -> None:
            with coordinator:
                async with client.open_task(declared_feed_plan(key)):
                    await anyio.sleep_forever()

        tg.start_soon(coordinator_that_never_dispatches)
        async with client.execute_task(none_request(key, 0, 2)) as reader:
            while not len(worker.registry):
                await worker.registry.changed()
            coordinator.cancel()  # it dies: its channel is reset
            # The consumer hears it as its feed failing or its task being cancelled.
            with anyio.fail_after(10), pytest.raises((FeedError, Cancelled)) as info:
                await reader.read_all()
        assert "ended" in str(info.value) or "channel closed" in str(info.value)
        with anyio.fail_after(1):
            await wait_for_no_tasks([worker])


@pytest.mark.parametrize("vanish", ["cut", "freeze"])
async def test_a_worker_that_vanishes_mid_feed_fails_the_query_and_frees_its_tasks(
    vanish: str,
) -> None:
    # cut: the connection closes, as when a worker crashes. freeze: no FIN, no RST, as with a
    # paused machine or a partition; keepalive on both ends turns the silence into an error at
    # the caller and into cancelled tasks on the worker.
    fast = KeepalivePolicy(interval=0.05, timeout=0.3)
    with probe(delays={0: [1], 1: [1]}) as found:
        provider = UnitProvider([10_000_000] * 2, probe=found)
        plan = Coalesce(unit_scan(provider, probe=found, every=1_000))
        channels = ChannelResolver(keepalive=fast)
        async with (
            start_workers(
                1, session_builder=feed_session_builder, config=WorkerConfig(keepalive=fast)
            ) as (worker,),
            tcp_proxy(worker.location) as proxy,
            Coordinator(
                StaticWorkerResolver([proxy.location]),
                **coordinator_options(
                    task_estimators={"UnitScan": UnitScanEstimator()}, channels=channels
                ),
            ) as coordinator,
        ):

            async def read_and_vanish_after_two_batches() -> None:
                batches = 0
                async for _ in coordinator.execute(plan):
                    batches += 1
                    if batches == 2 and vanish == "cut":
                        await proxy.cut()
                    elif batches == 2:
                        proxy.freeze()

            with anyio.fail_after(10), pytest.raises(RemoteError) as info:
                await read_and_vanish_after_two_batches()
            with anyio.fail_after(10):
                await wait_for_no_tasks([worker])  # and it dropped the task on its side too
        await channels.aclose()
    if vanish == "freeze":
        assert "no reply to an HTTP/2 PING" in str(info.value)
    assert info.value.origin is not None
    assert info.value.origin.worker_url == proxy.location
    assert info.value.origin.query_id
    assert sorted(provider.closed) == [0, 1]


async def test_a_worker_of_another_version_is_refused() -> None:
    async with start_workers(1) as (worker,):
        channels = ChannelResolver(expected_version="0.0.0-elsewhere")
        plan = Coalesce(unit_scan(UnitProvider([1])))
        async with Coordinator(
            StaticWorkerResolver([worker.location]), **coordinator_options(channels=channels)
        ) as coordinator:
            with pytest.raises(VersionMismatch) as info:
                await coordinator.collect(plan)
        await channels.aclose()
    message = str(info.value)
    assert worker.location in message
    assert __version__ in message
    assert "0.0.0-elsewhere" in message
    assert channels.urls == []


async def test_a_provider_error_under_a_shuffle_reaches_the_caller_and_every_task_ends() -> None:
    """The failing feed is read two stages down: a partial aggregate whose states are shuffled
    to the final's tasks on both workers. The error still reaches the caller as the provider's,
    and no worker keeps any task of the query (producers, consumers, the shuffle's buffers)."""
    provider = UnitProvider([100] * 4, fail_at={1: (20, "page 3 expired")})
    plan = plan_from(unit_scan(provider)).aggregate(["partition"], [agg("count", name="n")]).plan
    async with feed_cluster(2, task_estimators={"UnitScan": UnitScanEstimator(2)}) as (
        coordinator,
        workers,
    ):
        assert "NetworkShuffle(" in await coordinator.explain(plan)
        with anyio.fail_after(10), pytest.raises(FeedError, match="page 3 expired"):
            await coordinator.collect(plan)
        with anyio.fail_after(2):
            await wait_for_no_tasks(workers)
        healthy = plan_from(unit_scan(UnitProvider([100] * 4)))
        counted = healthy.aggregate(["partition"], [agg("count", name="n")]).plan
        result = await coordinator.collect(counted)  # the workers keep serving
    assert sorted(result.to_pylist(), key=lambda row: row["partition"]) == [
        {"partition": p, "n": 100} for p in range(4)
    ]
