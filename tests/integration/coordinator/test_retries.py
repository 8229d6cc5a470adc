"""A lost worker costs a retry, not the query: the query runs again on the other workers as a
new attempt, its running feed replayed, and the result is exact; or it fails with an error
naming every attempt. Never a wrong result.

The workers are `flightfeed worker` processes, killed (SIGKILL) or frozen (SIGSTOP) in the
middle of a query that reads a running feed through a shuffle; the expected result is known
exactly (each unit body once, with n = 1). Moments are chosen by how far the feed got (the
provider's pulls), never by sleeping.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager

import anyio
import anyio.to_thread
import pyarrow as pa
import pytest
from helpers.worker_process import worker_process

from flightfeed.coordinator import Coordinator, QueryStream
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import FeedError, FlightfeedError
from flightfeed.plan import ExecutionPlan, agg, col, plan_from
from flightfeed.plan.nodes import Coalesce
from flightfeed.testing import start_cluster
from flightfeed.testing.feeds import (
    UnitProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)

pytestmark = pytest.mark.anyio

SESSION_BUILDER = ("--session-builder", "flightfeed.testing.feeds:unit_session_builder")
PARTITIONS = 6
UNITS = 150


@asynccontextmanager
async def three_workers() -> AsyncIterator[list[tuple[subprocess.Popen[str], str]]]:
    """Three worker processes, started off the event loop (each takes a moment)."""
    with ExitStack() as stack:
        yield [
            await anyio.to_thread.run_sync(stack.enter_context, worker_process(*SESSION_BUILDER))
            for _ in range(3)
        ]


def running_feed(units: int = UNITS, interval: float = 0.004) -> UnitProvider:
    """Units that turn up while the query runs (each partition's over about 0.6 s)."""
    return UnitProvider([units] * PARTITIONS, interval=interval)


def shuffled_count(provider: UnitProvider) -> ExecutionPlan:
    """Each unit body with how often it was seen: leaf tasks, a shuffle by body, a final
    aggregate. Exact means every body once (a replayed unit counted twice shows as n = 2)."""
    return plan_from(unit_scan(provider)).aggregate(["body"], [agg("count", name="n")]).plan


def expected_bodies(provider: UnitProvider) -> list[bytes]:
    return sorted(
        f"{p}:{i}".encode() for p, count in enumerate(provider.counts) for i in range(count)
    )


def assert_exact(table: pa.Table, provider: UnitProvider) -> None:
    assert sorted(table.column("body").to_pylist()) == expected_bodies(provider)
    assert set(table.column("n").to_pylist()) == {1}


async def read_all(stream: QueryStream) -> list[pa.RecordBatch]:
    async with stream:
        return [batch async for batch in stream]


async def pulled(provider: UnitProvider, units: int) -> None:
    """Until the provider has handed out `units` units in all."""
    await provider.waiters.until(lambda: sum(provider.pulls) >= units)


async def test_a_killed_worker_costs_a_retry_and_the_result_is_exact() -> None:
    async with three_workers() as workers:
        urls = [url for _, url in workers]
        provider = running_feed()
        plan = shuffled_count(provider)
        options = unit_coordinator_options(tasks=3)
        async with Coordinator(StaticWorkerResolver(urls), **options) as coordinator:
            victim, victim_url = workers[1]
            async with anyio.create_task_group() as tg, coordinator.execute(plan) as stream:

                async def kill_midway() -> None:
                    await pulled(provider, UNITS * PARTITIONS // 3)
                    victim.kill()

                tg.start_soon(kill_midway)
                batches = [batch async for batch in stream]
            assert_exact(pa.Table.from_batches(batches), provider)
            metrics = stream.metrics
            assert metrics is not None
            assert metrics.status == "finished"
            (failed,) = metrics.failed_attempts
            assert failed.startswith("attempt 0 on ")
            assert f"lost {victim_url}" in failed
            # The retry ran on the two others, each task a new attempt.
            assert {record.worker_url for record in metrics.tasks.values()} == set(urls) - {
                victim_url
            }
            assert victim_url in coordinator.health.down
            # Every unit was pulled from the provider once: the retry replayed the log.
            assert provider.pulls == provider.counts


def joined_count(left: UnitProvider, right: UnitProvider, strategy: str) -> ExecutionPlan:
    """Two running feeds joined on the unit body (every stage kind: a broadcast or a shuffled
    join, then a shuffled aggregate), each body counted."""
    other = plan_from(unit_scan(right)).select((col("body"), "other"))
    return (
        plan_from(unit_scan(left))
        .select("body")
        .join(other, [("body", "other")], strategy=strategy)
        .aggregate(["body"], [agg("count", name="n")])
        .plan
    )


@pytest.mark.parametrize("strategy", ["broadcast", "shuffle"])
async def test_a_join_of_two_feeds_survives_a_kill(strategy: str) -> None:
    async with three_workers() as workers:
        urls = [url for _, url in workers]
        left, right = running_feed(units=100), running_feed(units=100)
        plan = joined_count(left, right, strategy)
        options = unit_coordinator_options(tasks=3, broadcast_threshold_bytes=0)
        async with Coordinator(StaticWorkerResolver(urls), **options) as coordinator:
            async with anyio.create_task_group() as tg, coordinator.execute(plan) as stream:

                async def kill_midway() -> None:
                    await pulled(right, 100 * PARTITIONS // 2)
                    workers[0][0].kill()

                tg.start_soon(kill_midway)
                batches = [batch async for batch in stream]
            assert_exact(pa.Table.from_batches(batches), left)
            assert stream.metrics is not None
            assert len(stream.metrics.failed_attempts) == 1
            assert left.pulls == left.counts
            assert right.pulls == right.counts


async def test_a_stopped_worker_is_noticed_within_ten_seconds_and_the_query_retried() -> None:
    async with three_workers() as workers:
        urls = [url for _, url in workers]
        provider = running_feed()
        plan = shuffled_count(provider)
        async with Coordinator(
            StaticWorkerResolver(urls), **unit_coordinator_options(tasks=3)
        ) as coordinator:
            victim, victim_url = workers[2]
            stopped_at: list[float] = []
            noticed_at: list[float] = []
            lost = coordinator.health.lost

            async def timed_lost(urls: list[str]) -> dict[str, str]:
                noticed_at.append(anyio.current_time())
                return await lost(urls)

            coordinator.health.lost = timed_lost  # type: ignore[assignment, method-assign]
            try:
                async with anyio.create_task_group() as tg, coordinator.execute(plan) as stream:

                    async def stop_midway() -> None:
                        await pulled(provider, UNITS * PARTITIONS // 3)
                        victim.send_signal(signal.SIGSTOP)
                        stopped_at.append(anyio.current_time())

                    tg.start_soon(stop_midway)
                    batches = [batch async for batch in stream]
            finally:
                victim.kill()  # (a stopped process still dies of SIGKILL)
            assert_exact(pa.Table.from_batches(batches), provider)
            assert noticed_at[0] - stopped_at[0] < 10.0
            metrics = stream.metrics
            assert metrics is not None
            (failed,) = metrics.failed_attempts
            assert f"lost {victim_url}" in failed


async def test_a_failure_after_rows_reached_the_caller_is_final() -> None:
    """Rows stream out as units arrive: once the caller has some, a retry could pass them
    again, so the query fails, saying so, instead."""
    async with three_workers() as workers:
        urls = [url for _, url in workers]
        provider = running_feed(units=2000, interval=0.002)
        plan = Coalesce(unit_scan(provider))
        async with Coordinator(
            StaticWorkerResolver(urls), **unit_coordinator_options(tasks=3)
        ) as coordinator:
            received = 0

            async def read_while_killing() -> None:
                nonlocal received
                async with coordinator.execute(plan) as stream:
                    async for batch in stream:
                        received += batch.num_rows
                        if workers[0][0].poll() is None:
                            workers[0][0].kill()

            with pytest.raises(FlightfeedError) as info:
                await read_while_killing()
            assert received < 2000 * PARTITIONS
            message = str(info.value)
            assert "failed after 1 attempt(s)" in message
            assert "had reached the caller already" in message
            assert f"lost {workers[0][1]}" in message


async def test_retries_are_bounded_and_the_final_error_names_every_attempt() -> None:
    async with three_workers() as workers:
        urls = [url for _, url in workers]
        provider = running_feed(units=400)
        plan = shuffled_count(provider)
        options = unit_coordinator_options(tasks=3, max_attempts=2)
        async with Coordinator(StaticWorkerResolver(urls), **options) as coordinator:

            async def kill_one_per_attempt() -> None:
                await pulled(provider, 200)
                workers[0][0].kill()
                # The retry replays what was pulled, then pulls new units: it is running.
                await pulled(provider, sum(provider.pulls) + 200)
                workers[1][0].kill()

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_one_per_attempt)
                stream = coordinator.execute(plan)
                with pytest.raises(FlightfeedError) as info:
                    await read_all(stream)
            message = str(info.value)
            assert "failed after 2 attempt(s) (no attempts left (at most 2))" in message
            assert "attempt 0 on " in message
            assert f"lost {urls[0]}" in message
            assert "attempt 1 on " in message
            assert f"lost {urls[1]}" in message
            assert stream.metrics is not None
            assert stream.metrics.status == "failed"


async def test_a_retry_that_cannot_be_planned_is_not_counted_as_an_attempt() -> None:
    """Its only worker killed, the query said it "failed after 2 attempt(s)", one of them the
    planning of a retry that never ran, while its metrics listed one (found by a probe)."""
    with ExitStack() as stack:
        proc, url = await anyio.to_thread.run_sync(
            stack.enter_context, worker_process(*SESSION_BUILDER)
        )
        provider = running_feed()
        options = unit_coordinator_options(tasks=1)
        async with Coordinator(StaticWorkerResolver([url]), **options) as coordinator:
            stream = coordinator.execute(shuffled_count(provider))

            async def kill_once_running() -> None:
                await pulled(provider, 100)
                proc.kill()

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_once_running)
                with pytest.raises(FlightfeedError) as info:
                    await read_all(stream)
    message = str(info.value)
    assert "failed after 1 attempt(s) (no retry could be planned: Unavailable: no worker" in (
        message
    )
    assert f"lost {url}" in message
    assert stream.metrics is not None
    assert len(stream.metrics.failed_attempts) == 1


async def test_an_error_of_the_query_itself_is_not_retried() -> None:
    provider = UnitProvider([5, 5], fail_at={1: (2, "the source is corrupt")})
    async with start_cluster(
        2, session_builder=unit_session_builder, **unit_coordinator_options(tasks=2)
    ) as (coordinator, _):
        with pytest.raises(FeedError, match="the source is corrupt") as info:
            await coordinator.collect(shuffled_count(provider))
    assert "attempt" not in str(info.value)
    assert provider.pulls == [5, 2]  # pulled once: no second attempt


async def test_a_shutting_down_worker_gets_no_new_work() -> None:
    """A draining worker refuses the query's tasks (UNAVAILABLE): the query runs again on the
    other worker, and new queries leave the draining one out."""
    provider = UnitProvider([20, 20])
    async with start_cluster(
        2, session_builder=unit_session_builder, **unit_coordinator_options(tasks=2)
    ) as (coordinator, workers):
        workers[0].registry.draining = True
        async with coordinator.execute(shuffled_count(provider)) as stream:
            table = pa.Table.from_batches([batch async for batch in stream])
        assert_exact(table, provider)
        assert stream.metrics is not None
        (failed,) = stream.metrics.failed_attempts
        assert "shutting down" in failed
        assert {r.worker_url for r in stream.metrics.tasks.values()} == {workers[1].location}
        assert workers[0].location in coordinator.health.down
        async with coordinator.execute(shuffled_count(UnitProvider([3, 3]))) as again:
            assert sum([batch.num_rows async for batch in again]) == 6
        assert again.metrics is not None
        assert not again.metrics.failed_attempts
        assert {r.worker_url for r in again.metrics.tasks.values()} == {workers[1].location}

        # Rechecked, it says it is still shutting down (GetWorkerInfo): it stays out, where
        # its open connection made it usable again, and each query had a task refused
        coordinator.health.recheck_after = 0
        for _ in range(2):
            async with coordinator.execute(shuffled_count(UnitProvider([3, 3]))) as later:
                assert sum([batch.num_rows async for batch in later]) == 6
            assert later.metrics is not None
            assert not later.metrics.failed_attempts
            assert {r.worker_url for r in later.metrics.tasks.values()} == {workers[1].location}
            assert "shutting down" in coordinator.health.down[workers[0].location][1]

        workers[0].registry.draining = False  # (a drain does not end so; here it stands in for
        # a restart) The next query's start checks it again, in the background: the queries
        # after that use it
        async with coordinator.execute(shuffled_count(UnitProvider([3, 3]))) as checking:
            assert sum([batch.num_rows async for batch in checking]) == 6
        await coordinator.health.settled()
        async with coordinator.execute(shuffled_count(UnitProvider([3, 3]))) as back:
            assert sum([batch.num_rows async for batch in back]) == 6
        assert back.metrics is not None
        assert {r.worker_url for r in back.metrics.tasks.values()} == {w.location for w in workers}
        assert workers[0].location not in coordinator.health.down
