"""Admission control on real workers: queries beyond `max_concurrent_queries` wait in order and
say so in their metrics; a full queue refuses at once."""

from __future__ import annotations

import anyio
import pytest

from flightfeed.coordinator import Coordinator, InProcessWorkerResolver
from flightfeed.errors import Cancelled, ResourceExhausted
from flightfeed.flight.client import FlightClient
from flightfeed.plan import Coalesce, ExecutionPlan
from flightfeed.testing import start_cluster, start_workers
from flightfeed.testing.feeds import (
    COUNT_AT_END,
    LiveProvider,
    UnitProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)

pytestmark = pytest.mark.anyio


async def test_a_query_over_the_limit_waits_for_a_slot_and_says_so() -> None:
    live = LiveProvider(1)
    options = unit_coordinator_options(max_concurrent_queries=1)
    async with start_cluster(1, session_builder=unit_session_builder, **options) as (c, _):
        first = c.execute(Coalesce(unit_scan(live, every=COUNT_AT_END)))
        second = c.execute(Coalesce(unit_scan(UnitProvider([3]), every=COUNT_AT_END)))
        results: dict[str, int] = {}

        async def read(name: str, stream: object) -> None:
            async with stream as batches:  # type: ignore[attr-defined]
                results[name] = sum([b.column("units")[0].as_py() async for b in batches])

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "first", first)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(read, "second", second)
            await anyio.wait_all_tasks_blocked()
            assert (c.admission.running, c.admission.queued) == (1, 1)
            assert second.metrics is not None
            assert second.metrics.status == "queued"
            assert second.metrics.admitted_ns is None
            live.push(0, b"a", b"b")
            live.end(0)  # the first query ends: its slot passes to the second
        assert results == {"first": 2, "second": 3}
        assert second.metrics is not None
        assert second.metrics.status == "finished"
        assert second.metrics.admitted_ns is not None
        assert second.metrics.admission_wait >= 0
        assert first.metrics is not None
        assert first.metrics.admitted_ns is not None
        assert (c.admission.running, c.admission.queued) == (0, 0)


async def test_a_full_queue_refuses_a_query_at_once() -> None:
    live = LiveProvider(1)
    options = unit_coordinator_options(max_concurrent_queries=1, max_queued_queries=0)
    async with start_cluster(1, session_builder=unit_session_builder, **options) as (c, _):
        async with anyio.create_task_group() as tg:
            first = c.execute(Coalesce(unit_scan(live, every=COUNT_AT_END)))
            tg.start_soon(c.collect, Coalesce(unit_scan(live, every=COUNT_AT_END)))
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(ResourceExhausted, match="queued"):
                await c.collect(Coalesce(unit_scan(UnitProvider([1]), every=COUNT_AT_END)))
            refused = c.metrics.latest
            assert refused is not None
            assert refused.status == "failed"
            live.end(0)
        await first.aclose()
        assert (c.admission.running, c.admission.queued) == (0, 0)


async def test_a_held_query_read_through_gives_its_slot_back() -> None:
    """A served query (Spark's read) lives on a minute after its last read, for re-reads; it
    stops counting against the limit once every endpoint was read to its end."""
    options = unit_coordinator_options(max_concurrent_queries=1)
    async with start_cluster(1, session_builder=unit_session_builder, **options) as (c, _):
        held = await c.hold(unit_scan(UnitProvider([3, 2])), grace=600)
        assert c.admission.running == 1
        read = 0
        for endpoint in held.endpoints[:-1]:
            async with FlightClient(endpoint.location) as client:
                read += (await client.do_get(endpoint.ticket).read_all()).num_rows
        await anyio.wait_all_tasks_blocked()
        assert c.admission.running == 1  # an endpoint is still unread
        last = held.endpoints[-1]
        async with FlightClient(last.location) as client:
            read += (await client.do_get(last.ticket).read_all()).num_rows
        with anyio.fail_after(10):
            table = await c.collect(unit_scan(UnitProvider([4])))  # not queued behind it
        assert (read, table.num_rows) == (5, 4)
        assert not held.released
        held.release()


async def test_a_query_cancelled_as_it_is_admitted_gives_its_slot_back() -> None:
    """Its slot was taken before the admission's checkpoint, where the cancellation landed,
    and nothing gave it back: at the limit's count of such queries, every later one waited
    forever (found by a probe)."""
    options = unit_coordinator_options(max_concurrent_queries=1)
    async with start_cluster(1, session_builder=unit_session_builder, **options) as (c, _):
        for start in (c.collect, c.hold):
            with anyio.CancelScope() as scope:
                scope.cancel()  # (the caller is cancelled before the query got anywhere)
                await start(unit_scan(UnitProvider([3])))
            assert (c.admission.running, c.admission.queued) == (0, 0)
        with anyio.fail_after(30):
            assert (await c.collect(unit_scan(UnitProvider([3])))).num_rows == 3


async def test_queries_queued_when_the_coordinator_closes_are_cancelled_saying_so() -> None:
    """A queued query was admitted once the running one was cancelled, then planned on the
    closed coordinator: ExceptionGroup([RuntimeError('ChannelResolver is closed')]), where the
    running one was told the coordinator closed (found by a probe)."""
    live = LiveProvider(1)
    options = unit_coordinator_options(max_concurrent_queries=1)
    errors: dict[str, Exception] = {}

    async def run(name: str, c: Coordinator, plan: ExecutionPlan) -> None:
        try:
            await c.collect(plan)
        except Exception as exc:
            errors[name] = exc

    async with (
        start_workers(1, session_builder=unit_session_builder) as workers,
        anyio.create_task_group() as callers,  # (outside the coordinator, as a user's are)
        Coordinator(InProcessWorkerResolver(workers), **options) as c,
    ):
        callers.start_soon(run, "running", c, Coalesce(unit_scan(live)))
        await anyio.wait_all_tasks_blocked()
        callers.start_soon(run, "queued", c, Coalesce(unit_scan(UnitProvider([1]))))
        await anyio.wait_all_tasks_blocked()
        assert (c.admission.running, c.admission.queued) == (1, 1)
    assert set(errors) == {"running", "queued"}
    for error in errors.values():
        assert isinstance(error, Cancelled)
        assert "was cancelled: the coordinator closed" in str(error)


async def test_a_query_queued_behind_a_caller_that_stopped_reading_ends_when_it_closes() -> None:
    """The running query gives its slot back only when its caller reads on, so the queued one
    waited for that caller after the coordinator closed, forever if it never read again (found
    by a probe). The close ends the queue itself now."""
    options = unit_coordinator_options(max_concurrent_queries=1)
    queued_error: list[Exception] = []

    async def queued(c: Coordinator) -> None:
        try:
            await c.collect(Coalesce(unit_scan(UnitProvider([1]))))
        except Exception as exc:
            queued_error.append(exc)

    async with (
        start_workers(1, session_builder=unit_session_builder) as workers,
        anyio.create_task_group() as callers,
    ):
        async with Coordinator(InProcessWorkerResolver(workers), **options) as c:
            paused = c.execute(Coalesce(unit_scan(UnitProvider([1_000_000]), every=100)))
            await anext(aiter(paused))  # running, and its caller reads no further
            callers.start_soon(queued, c)
            await anyio.wait_all_tasks_blocked()
            assert (c.admission.running, c.admission.queued) == (1, 1)
        latest = c.metrics.latest  # the queued query's
        assert latest is not None
        with anyio.fail_after(5):
            await latest.wait_finished()
        assert isinstance(queued_error[0], Cancelled)
        assert "was cancelled: the coordinator closed" in str(queued_error[0])
        assert latest.status == "cancelled"
        with pytest.raises(Cancelled, match="the coordinator closed"):
            await c.collect(Coalesce(unit_scan(UnitProvider([1]))))
        await paused.aclose()


async def test_a_coordinator_is_entered_once() -> None:
    """Entered again after it closed, it opened with its closed connection pool (every query
    failed: "ChannelResolver is closed"); entered twice at once, the inner exit broke the
    outer's cancel scopes (found by a probe)."""
    async with start_workers(1, session_builder=unit_session_builder) as workers:
        c = Coordinator(InProcessWorkerResolver(workers), **unit_coordinator_options())
        async with c:
            with pytest.raises(RuntimeError, match="entered once"):
                await c.__aenter__()
            assert (await c.collect(unit_scan(UnitProvider([2])))).num_rows == 2
        with pytest.raises(RuntimeError, match="entered once"):
            await c.__aenter__()
