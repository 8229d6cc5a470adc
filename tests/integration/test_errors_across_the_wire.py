"""Errors reach the caller of a query over real gRPC as they were raised, saying which part
failed and where, with the original exception's class."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Awaitable, Callable

import anyio
import pytest

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.errors import ExecutionError, PlanDecodeError
from flightfeed.examples.chunk_scan import (
    RemoteScan,
    RemoteScanCodec,
    RemoteScanEstimator,
    chunk_coordinator_session,
    chunk_feed_registry,
    chunk_session_builder,
    scan,
)
from flightfeed.flight.client import FlightClient
from flightfeed.plan import Coalesce
from flightfeed.session import Session, WorkerQueryContext
from flightfeed.testing import start_workers, wait_for_no_tasks

pytestmark = pytest.mark.anyio


def coordinator(url: str) -> Coordinator:
    return Coordinator(
        StaticWorkerResolver([url]),
        session=chunk_coordinator_session(),
        feed_registry=chunk_feed_registry(),
        task_estimators={RemoteScan.name: RemoteScanEstimator()},
    )


async def failing_builder(ctx: WorkerQueryContext) -> Session:
    settings: dict[str, Session] = {}
    return settings["XYZ"]  # a user's bug: KeyError('XYZ')


async def test_a_session_builder_error_names_the_builder_and_keeps_its_class() -> None:
    async with start_workers(1, session_builder=failing_builder) as (worker,):
        async with coordinator(worker.location) as c:
            with pytest.raises(ExecutionError) as info:
                await c.collect(Coalesce(scan(1, "3", "2")))
        await wait_for_no_tasks([worker])
    error = info.value
    assert error.message == "session builder failed: 'XYZ'"
    assert error.error_type == "KeyError"
    assert error.origin is not None
    assert error.origin.component == "session builder"
    assert error.origin.worker_url == worker.location
    assert error.origin.query_id


async def builder_that_exits(ctx: WorkerQueryContext) -> Session:
    raise SystemExit(3)  # a user's script's `sys.exit`, in a builder: it ended the worker


async def builder_raising_cancelled(ctx: WorkerQueryContext) -> Session:
    raise asyncio.CancelledError  # (what awaiting a future something else cancelled raises)


@pytest.mark.parametrize(
    ("builder", "says"),
    [
        (builder_that_exits, "session builder failed: it called exit(3)"),
        (builder_raising_cancelled, "session builder failed: it raised CancelledError itself"),
    ],
)
async def test_a_session_builder_that_exits_or_raises_cancelled_fails_its_query_only(
    builder: Callable[[WorkerQueryContext], Awaitable[Session]], says: str
) -> None:
    """A builder's SystemExit stopped the worker; its own CancelledError left the request
    waiting for a plan, then NOT_FOUND (found by a probe)."""
    async with start_workers(1, session_builder=builder) as (worker,):
        async with coordinator(worker.location) as c:
            with anyio.fail_after(5), pytest.raises(ExecutionError, match=re.escape(says)):
                await c.collect(Coalesce(scan(1, "3", "2")))
        await wait_for_no_tasks([worker])
        async with FlightClient(worker.location) as client:  # (still serving)
            assert await client.list_actions()


async def test_a_blocking_session_builder_runs_off_the_event_loop() -> None:
    """A plain function blocked the worker's event loop, and every other request with it (the
    loop guard fails a test for a stall)."""
    threads: list[bool] = []

    def slow(ctx: WorkerQueryContext) -> Session:
        threads.append(threading.current_thread() is not threading.main_thread())
        time.sleep(0.6)  # (a blocking call: a file, a service)
        return ctx.builder.with_codec(RemoteScanCodec()).build()

    async with (
        start_workers(1, session_builder=slow) as (worker,),
        coordinator(worker.location) as c,
    ):
        table = await c.collect(Coalesce(scan(1, "3", "2")))
    assert table.num_rows == 5
    assert threads
    assert all(threads)


async def test_a_plan_the_worker_cannot_decode_says_so_and_where() -> None:
    # The worker's sessions do not know RemoteScan.
    async with start_workers(1) as (worker,), coordinator(worker.location) as c:
        with pytest.raises(PlanDecodeError) as info:
            await c.collect(Coalesce(scan(1, "3", "2")))
    error = info.value
    assert error.message.startswith("plan decode failed: unknown plan node kind 'RemoteScan'")
    assert "register a codec in the session builder" in error.message
    assert error.origin is not None
    assert (error.origin.component, error.origin.worker_url) == ("plan decode", worker.location)


async def test_a_division_by_zero_is_the_querys_own_error_not_the_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It was INTERNAL, with a traceback in the worker's log, as a bug of the worker would be."""
    from flightfeed.errors import DataError
    from flightfeed.plan import Projection, call, col, lit

    async with start_workers(1, session_builder=chunk_session_builder) as (worker,):
        async with coordinator(worker.location) as c:
            rows = scan(1, "3", "2")
            quotient = call("divide", col("partition"), lit(0))
            with pytest.raises(DataError, match="function 'divide' failed: divide by zero") as info:
                await c.collect(Coalesce(Projection(rows, [quotient], ["q"])))
        await wait_for_no_tasks([worker])
    assert info.value.status.name == "INVALID_ARGUMENT"
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(
    ("value", "chunks", "where"),
    [
        # Two rows of 2^62 in each partition: the worker's partial sum overflows.
        (1 << 62, ["2", "2"], "partial on the worker"),
        # Each partition's partial sum fits (2^62); their total (2^64) fails in the final step.
        (1 << 61, ["2", "2", "2", "2"], "final on the coordinator"),
    ],
)
async def test_a_sum_past_int64_fails_the_query_instead_of_wrapping(
    value: int, chunks: list[str], where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Arrow's sums wrap silently: four 2^62 summed to 0 and the query answered 0."""
    import pyarrow as pa

    from flightfeed.errors import DataError
    from flightfeed.plan import AggregateMode, HashAggregate, Projection, agg, col, lit

    rows = Projection(
        scan(1, *chunks), [col("task"), lit(pa.scalar(value, pa.int64()))], ["k", "v"]
    )
    keys, sums = [(col("k"), "k")], [agg("sum", col("v"), name="total")]
    partial = HashAggregate(rows, keys, sums, mode=AggregateMode.PARTIAL)
    plan = HashAggregate(Coalesce(partial), keys, sums, mode=AggregateMode.FINAL)
    async with start_workers(1, session_builder=chunk_session_builder) as (worker,):
        async with coordinator(worker.location) as c:
            with pytest.raises(DataError, match=r"sum 'total.*' overflows int64") as info:
                await c.collect(plan)
        await wait_for_no_tasks([worker])
    assert info.value.status.name == "INVALID_ARGUMENT"
    on_worker = info.value.origin is not None and info.value.origin.worker_url == worker.location
    assert on_worker == (where == "partial on the worker")
    assert "Traceback" not in caplog.text
