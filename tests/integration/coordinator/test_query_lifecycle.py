"""Query lifecycle on real workers: early exit and cancellation clean up everywhere, one
connection per worker across queries, concurrent queries, and the metrics store."""

from __future__ import annotations

import logging
import random
from collections import Counter

import anyio
import pyarrow as pa
import pytest
from helpers.feed_scan import coordinator_options, feed_cluster, feed_session_builder

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.errors import Cancelled
from flightfeed.examples.chunk_scan import scan, scan_rows
from flightfeed.plan import Coalesce, HashAggregate, agg, col
from flightfeed.testing import start_cluster, start_workers, tcp_proxy, wait_for_no_tasks
from flightfeed.testing.feeds import (
    UnitProvider,
    UnitScanEstimator,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)

pytestmark = pytest.mark.anyio


def long_scan(provider: UnitProvider) -> Coalesce:
    return Coalesce(unit_scan(provider, every=100))


async def test_leaving_the_loop_early_drops_every_task_on_every_worker() -> None:
    provider = UnitProvider([1_000_000] * 4)
    async with feed_cluster(2, task_estimators={"UnitScan": UnitScanEstimator(2)}) as (
        coordinator,
        workers,
    ):
        async for batch in coordinator.execute(long_scan(provider)):
            assert batch.num_rows
            with anyio.fail_after(10):  # every provider runs (task 1's may start later)
                for partition in range(4):
                    await provider.wait_pulls(partition, 1)
            break  # no `async with`: dropping the stream must be enough
        with anyio.fail_after(1):
            await wait_for_no_tasks(workers)
        metrics = coordinator.metrics.latest
        assert metrics is not None
        with anyio.fail_after(1):
            await metrics.wait_finished()
    assert metrics.status == "cancelled"
    assert {t.status for t in metrics.tasks.values()} == {"cancelled"}
    assert sorted(provider.closed) == [0, 1, 2, 3]


async def test_cancelling_the_consumer_cancels_the_query_even_with_a_stuck_provider() -> None:
    provider = UnitProvider([1_000_000, 5], hang={0})
    async with feed_cluster(1) as (coordinator, workers):
        with anyio.CancelScope() as scope:
            async with coordinator.execute(long_scan(provider)) as stream:
                async for _ in stream:
                    scope.cancel()  # e.g. the caller's deadline
        assert scope.cancelled_caught
        with anyio.fail_after(1):
            await wait_for_no_tasks(workers)
    assert sorted(provider.closed) == [0, 1]


async def test_queries_cancelled_while_their_workers_send_credits_end_as_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A query whose caller is cancelled (here by a failing sibling task) resets its tasks'
    channels. A worker sending feed credits at that moment got h2's StreamClosedError in a
    sender of the task: the call was answered and logged INTERNAL, with a traceback, for about
    one query in ten, and grpclib logged that it "Failed to handle cancellation"."""
    caplog.set_level(logging.WARNING)
    delays = random.Random(0)

    async def fail_soon() -> None:
        await anyio.sleep(delays.random() * 0.05)
        raise LookupError("a sibling failed")

    async with start_cluster(
        2, session_builder=unit_session_builder, **unit_coordinator_options(2)
    ) as (coordinator, workers):
        for _ in range(100):
            provider = UnitProvider([100_000, 100_000, 5, 100_000])

            async def read_all(provider: UnitProvider = provider) -> None:
                async for _ in coordinator.execute(long_scan(provider)):
                    pass

            with pytest.RaisesGroup(LookupError):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_all)
                    tg.start_soon(fail_soon)
            with anyio.fail_after(5):
                await wait_for_no_tasks(workers)
    assert [r.getMessage() for r in caplog.records] == []


async def test_queries_share_one_connection_per_worker_and_run_concurrently() -> None:
    args = (2, "3,1", "2", "4", "1,1")
    async with start_workers(2, session_builder=feed_session_builder) as workers:
        async with (
            tcp_proxy(workers[0].location) as first,
            tcp_proxy(workers[1].location) as second,
            Coordinator(
                StaticWorkerResolver([first.location, second.location]), **coordinator_options()
            ) as coordinator,
        ):
            results: list[pa.Table] = []

            async def query() -> None:
                results.append(await coordinator.collect(Coalesce(scan(*args))))

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(query)
            await query()
            assert sorted(coordinator.channels.urls) == sorted([first.location, second.location])
        assert first.connections == second.connections == 1
    expected = scan_rows(*args).sort_by([("task", "ascending"), ("partition", "ascending")])
    assert len(results) == 5
    assert all(
        r.sort_by([("task", "ascending"), ("partition", "ascending")]).equals(expected)
        for r in results
    )


async def test_metrics_give_units_sent_and_received_and_latency_per_partition() -> None:
    counts = [40, 0, 25, 7]
    source = unit_scan(UnitProvider(counts))
    plan = HashAggregate(
        Coalesce(source), [(col("partition"), "partition")], [agg("count", name="n")]
    )
    async with feed_cluster(2, task_estimators={"UnitScan": UnitScanEstimator(2)}) as (
        coordinator,
        workers,
    ):
        async with coordinator.execute(plan) as stream:
            table = pa.Table.from_batches([b async for b in stream])
        metrics = coordinator.metrics[stream.query_id]
    rows = table.to_pydict()
    assert dict(zip(rows["partition"], rows["n"], strict=True)) == {
        p: n for p, n in enumerate(counts) if n
    }
    assert metrics.status == "finished"
    feeds = metrics.feed_partitions()
    assert sorted(p for _, p in feeds) == [0, 1, 2, 3]
    for (feed_id, partition), part in feeds.items():
        assert feed_id == source.feed.id
        n = counts[partition]
        assert part.units_pulled == part.units_sent == n
        assert part.units_received == part.units_consumed == n
        assert part.task_number == partition // 2
        assert part.worker_url == workers[partition // 2].location
        for latency in (part.created_to_received, part.created_to_processed):
            assert latency.count == n
            assert 0 <= latency.p50_ns <= latency.p95_ns <= latency.p99_ns
            assert (latency.p99_ns > 0) == (n > 0)
    rows = Counter[int]()
    for (stage, task), record in metrics.tasks.items():
        assert stage == 1
        assert record.status == "finished"
        assert record.plan_metrics  # the worker's per-node metrics, in pre-order
        rows[task] = record.output_rows(0)
    assert rows == {0: 40, 1: 32}
    assert [m.node_name for m in metrics.coordinator_nodes] == [
        "HashAggregate",
        "Coalesce",
        "NetworkCoalesce",
    ]
    assert metrics.coordinator_nodes[2].output_rows == 72


async def test_closing_the_coordinator_cancels_its_queries_loudly() -> None:
    provider = UnitProvider([1_000_000])
    async with start_workers(1, session_builder=feed_session_builder) as workers:
        resolver = StaticWorkerResolver([workers[0].location])
        async with Coordinator(resolver, **coordinator_options()) as coordinator:
            stream = coordinator.execute(long_scan(provider))
            await anext(stream)
        with anyio.fail_after(1):
            await wait_for_no_tasks(workers)
        with pytest.raises(Cancelled, match="the coordinator closed"):
            async for _ in stream:  # what was buffered, then the reason it stopped
                pass


async def test_a_query_cancelled_while_its_failed_attempt_is_looked_into_ends_cancelled() -> None:
    """The caller cancelled while the coordinator asked the failed attempt's workers whether
    they still answer (one is frozen: up to 3 s). The caller saw a cancellation, but the
    metrics said "failed" with the lost connection's error, and listed no failed attempt
    (found by a probe)."""
    async with (
        start_workers(2, session_builder=unit_session_builder) as workers,
        tcp_proxy(workers[0].location) as cut,
        tcp_proxy(workers[1].location) as frozen,
    ):
        resolver = StaticWorkerResolver([cut.location, frozen.location])
        async with Coordinator(resolver, **unit_coordinator_options(4)) as coordinator:
            provider = UnitProvider([1000] * 4, interval=0.01)
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(coordinator.collect, Coalesce(unit_scan(provider)))
                    with anyio.fail_after(10):
                        for partition in range(4):
                            await provider.wait_pulls(partition, 1)
                    frozen.freeze()
                    await cut.cut()
                    await anyio.sleep(1.0)  # (within the 3 s the frozen worker's check takes)
                    scope.cancel()
            metrics = coordinator.metrics.latest
            assert metrics is not None
            with anyio.fail_after(10):
                await metrics.wait_finished()
            frozen.thaw()
    assert metrics.status == "cancelled"
    assert metrics.error is None
    assert len(metrics.failed_attempts) <= 1
    assert all("attempt 0 on " in failed for failed in metrics.failed_attempts)
