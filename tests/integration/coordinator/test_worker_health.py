"""Queries use the workers the coordinator can reach: an unreachable one is left out (and tried
again later), a query on the others runs, and only with none left does a query fail, naming
every worker and why."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Sequence

import anyio
import pyarrow as pa
import pytest

from flightfeed.coordinator import Coordinator
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import ExecutionError, Unavailable
from flightfeed.plan import ExecutionPlan, TaskContext
from flightfeed.plan.base import UnaryNode, closing, expect_children
from flightfeed.plan.nodes import Coalesce
from flightfeed.testing.feeds import (
    UnitProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)
from flightfeed.testing.proxy import tcp_proxy
from flightfeed.testing.workers import start_workers

pytestmark = pytest.mark.anyio


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was just free)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"grpc://127.0.0.1:{port}"


async def test_an_unreachable_worker_is_left_out() -> None:
    dead = closed_port_url()
    async with start_workers(1, session_builder=unit_session_builder) as (worker,):
        resolver = StaticWorkerResolver([dead, worker.location])
        async with Coordinator(resolver, **unit_coordinator_options(tasks=2)) as coordinator:
            plan = Coalesce(unit_scan(UnitProvider([3, 2])))
            rows = await coordinator.collect(plan)
            assert rows.num_rows == 5
            assert dead in coordinator.health.down
            explained = await coordinator.explain(plan, on_workers=True)
            assert dead not in explained  # every task on the worker that answers
            assert worker.location in explained
            first = coordinator.health.down[dead][0]
            coordinator.health.recheck_after = 0  # tried again at the next query's start
            await coordinator.collect(plan)
            await coordinator.health.settled()  # (in the background: the query did not wait)
            assert coordinator.health.down[dead][0] > first


class ListedWorkers:
    """A user's resolver: whatever URLs it is given, as they are."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)

    async def workers(self) -> list[str]:
        return self.urls


@pytest.mark.parametrize("bad", ["grpc://[::1", f"grpc://{'a' * 70}.example:8000"])
async def test_a_worker_url_no_connection_can_take_is_left_out_saying_why(bad: str) -> None:
    """A resolver's malformed URL, or a host name too long to encode, raised ValueError and
    UnicodeError in the check's task, in the coordinator's own task group: the running query
    and the coordinator ended with an ExceptionGroup (found by a probe)."""
    async with start_workers(1, session_builder=unit_session_builder) as (worker,):
        resolver = ListedWorkers([worker.location, bad])
        async with Coordinator(resolver, **unit_coordinator_options(tasks=2)) as coordinator:
            plan = Coalesce(unit_scan(UnitProvider([3, 2])))
            for _ in range(2):
                assert (await coordinator.collect(plan)).num_rows == 5
                assert "unsupported Flight location" in coordinator.health.down[bad][1]
                coordinator.health.recheck_after = 0  # (checked again, in the background)
            resolver.urls = [bad]
            with pytest.raises(Unavailable, match=r"no worker can be reached: .*unsupported"):
                await coordinator.collect(plan)


async def test_a_stopped_worker_is_checked_again_without_holding_up_queries() -> None:
    """A stopped worker (SIGSTOP, a paused machine) still accepts connections, so a check of it
    lasts the whole connect timeout. Before, each query started while the worker was due a
    check waited for a check of its own: 5 s each, every 5 s. Now one check runs in the
    background, shared, while the queries run on the other worker, and the stopped one is back
    for the queries after it answers."""
    async with (
        start_workers(2, session_builder=unit_session_builder) as workers,
        tcp_proxy(workers[1].location) as stopped,
    ):
        urls = [workers[0].location, stopped.location]
        options = unit_coordinator_options(tasks=2)
        async with Coordinator(StaticWorkerResolver(urls), **options) as coordinator:
            health = coordinator.health
            health.connect_timeout = 3600  # (its check ends when it answers, not before)
            plan = Coalesce(unit_scan(UnitProvider([3, 2])))
            assert (await coordinator.collect(plan)).num_rows == 5
            # Lost by a query (as `lost` finds it: left out, its channel dropped), then due
            await coordinator.channels.forget(stopped.location)
            stopped.freeze()
            health.down[stopped.location] = (anyio.current_time() - health.recheck_after, "lost")
            connections = stopped.connections
            rows: list[int] = []

            async def query() -> None:
                async with coordinator.execute(plan) as stream:
                    rows.append(sum([batch.num_rows async for batch in stream]))
                assert stream.metrics is not None
                assert {r.worker_url for r in stream.metrics.tasks.values()} == {urls[0]}

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for _ in range(5):
                        tg.start_soon(query)
            assert rows == [5] * 5
            assert health.checking(stopped.location)  # (the one check waits still)
            assert stopped.connections == connections + 1
            stopped.thaw()
            with anyio.fail_after(60):
                await health.settled()
            assert stopped.location not in health.down
            async with coordinator.execute(plan) as back:
                assert sum([batch.num_rows async for batch in back]) == 5
            assert back.metrics is not None
            assert {r.worker_url for r in back.metrics.tasks.values()} == set(urls)


async def test_with_no_worker_reachable_the_query_names_each() -> None:
    dead = [closed_port_url(), closed_port_url()]
    async with Coordinator(StaticWorkerResolver(dead), **unit_coordinator_options()) as c:
        with pytest.raises(Unavailable) as info:
            await c.collect(Coalesce(unit_scan(UnitProvider([1]))))
    for url in dead:
        assert url in str(info.value)


class FailsOnFirstBatch(UnaryNode):
    """A node of the coordinator's part of a plan with a bug: it raises a plain exception."""

    name = "FailsOnFirstBatch"
    runs = 0

    def __init__(self, child: ExecutionPlan) -> None:
        self.child = child

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return FailsOnFirstBatch(children[0])

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        FailsOnFirstBatch.runs += 1
        async with closing(self.child.execute(partition, ctx)) as stream:
            async for batch in stream:
                raise RuntimeError("a bug in a node on the coordinator")
                yield batch


async def test_an_error_on_the_coordinator_is_not_a_lost_worker() -> None:
    """It fails the query once as the coordinator's error: no retry (it would fail again), and
    no worker is left out of the next query."""
    async with start_workers(2, session_builder=unit_session_builder) as workers:
        resolver = StaticWorkerResolver([w.location for w in workers])
        async with Coordinator(resolver, **unit_coordinator_options()) as coordinator:
            FailsOnFirstBatch.runs = 0
            scan = unit_scan(UnitProvider([3, 2]))
            with pytest.raises(ExecutionError) as info:
                await coordinator.collect(FailsOnFirstBatch(Coalesce(scan)))
            assert str(info.value) == (
                "the coordinator's part of the plan failed: RuntimeError: a bug in a node on the"
                " coordinator"
            )
            assert info.value.error_type == "RuntimeError"
            assert FailsOnFirstBatch.runs == 1
            assert coordinator.health.down == {}
            urls = [w.location for w in workers]
            assert await coordinator.health.usable(urls) == urls
            assert (await coordinator.collect(Coalesce(scan))).num_rows == 5
