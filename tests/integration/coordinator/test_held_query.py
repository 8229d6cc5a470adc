"""Held queries: started by the coordinator, read partition by partition straight from the
workers by pyarrow's C++ Flight client, re-readable with the same rows, then released."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from typing import TypeVar

import anyio
import anyio.from_thread
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from helpers.worker_process import worker_process

from flightfeed.coordinator import (
    Coordinator,
    Endpoint,
    InProcessWorkerResolver,
    StaticWorkerResolver,
)
from flightfeed.plan import (
    Coalesce,
    ExecutionPlan,
    Filter,
    call,
    col,
    collect,
    lit,
    open_task_context,
    plan_from,
)
from flightfeed.protocol import MetricsSet
from flightfeed.session import Session
from flightfeed.testing import start_cluster, start_workers, wait_for_no_tasks
from flightfeed.testing.feeds import (
    COUNT_AT_END,
    LiveProvider,
    UnitProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)
from flightfeed.worker import Worker

pytestmark = pytest.mark.anyio
T = TypeVar("T")
SESSION_BUILDER = ("--session-builder", "flightfeed.testing.feeds:unit_session_builder")


@asynccontextmanager
async def cluster(tasks: int = 2) -> AsyncIterator[tuple[Coordinator, list[Worker]]]:
    async with start_cluster(
        2, session_builder=unit_session_builder, **unit_coordinator_options(tasks)
    ) as found:
        yield found


def cpp_read(endpoint: Endpoint, rows: int | None = None) -> pa.Table:
    """What a Spark executor does: a DoGet of the endpoint's ticket at its location, with
    pyarrow's C++ client; `rows` stops early, as a failing task would."""
    with fl.connect(endpoint.location) as client:
        reader = client.do_get(fl.Ticket(endpoint.ticket))
        if rows is None:
            return reader.read_all()
        batches: list[pa.RecordBatch] = []
        while sum(b.num_rows for b in batches) < rows:
            batches.append(reader.read_chunk().data)
        return pa.Table.from_batches(batches).slice(0, rows)


async def read(endpoint: Endpoint, rows: int | None = None) -> pa.Table:
    return await anyio.to_thread.run_sync(cpp_read, endpoint, rows)


def output_rows(node: MetricsSet) -> int:
    return sum(m.output_rows.value for m in node.metrics if m.output_rows is not None)


def bodies(table: pa.Table) -> list[bytes]:
    return sorted(table.column("body").to_pylist())


async def test_every_endpoint_is_read_from_its_worker_then_the_query_is_released() -> None:
    provider = UnitProvider([30, 20, 10, 40])
    async with cluster() as (coordinator, workers):
        held = await coordinator.hold(unit_scan(provider), grace=0.01)
        assert len(held.endpoints) == 4
        assert {e.location for e in held.endpoints} == {w.location for w in workers}
        tables = [await read(endpoint) for endpoint in held.endpoints]
        metrics = coordinator.metrics.latest
        assert metrics is not None
        with anyio.fail_after(10):
            await wait_for_no_tasks(workers)
            await metrics.wait_finished()
        assert held.released
    expected = sorted(f"{p}:{i}".encode() for p, n in enumerate([30, 20, 10, 40]) for i in range(n))
    assert bodies(pa.concat_tables(tables)) == expected
    assert metrics.status == "finished"


async def test_a_partition_read_again_yields_the_same_rows_and_pulls_nothing_new() -> None:
    provider = UnitProvider([500, 500])
    async with cluster(tasks=1) as (coordinator, workers):
        held = await coordinator.hold(unit_scan(provider))
        first, second = held.endpoints
        partial = await read(first, rows=3)  # a reader that fails after a few rows
        complete = await read(first)
        again = await read(first)
        assert partial.column("body").to_pylist() == complete.column("body").to_pylist()[:3]
        assert complete.equals(again)
        assert complete.num_rows == 500
        await read(second)
        held.release()
        with anyio.fail_after(10):
            await wait_for_no_tasks(workers)
    assert provider.pulls == [500, 500]  # every unit was pulled once, the re-reads replayed


async def test_filters_in_the_plan_run_on_the_workers() -> None:
    provider = UnitProvider([50, 50])
    keep = call("equal", col("partition"), lit(1))
    async with cluster(tasks=1) as (coordinator, _):
        held = await coordinator.hold(Filter(unit_scan(provider), keep))
        tables = [await read(endpoint) for endpoint in held.endpoints]
        held.release()
        metrics = coordinator.metrics.latest
        assert metrics is not None
        with anyio.fail_after(10):
            await metrics.wait_finished()
    assert pa.concat_tables(tables).num_rows == 50
    (task,) = metrics.tasks.values()
    assert task.status == "finished"
    filtered, scanned = (output_rows(node) for node in task.plan_metrics)  # pre-order
    assert (filtered, scanned) == (50, 100)  # the worker filtered 100 rows down to 50


async def test_an_unread_query_is_released_after_its_ttl() -> None:
    async with cluster() as (coordinator, workers):
        held = await coordinator.hold(unit_scan(UnitProvider([5, 5])), ttl=0.2)
        with anyio.fail_after(10):
            # (hold returns once the plans are sent: a worker may not hold its task yet)
            await held.runtime.metrics.wait_finished()
            await wait_for_no_tasks(workers)
        assert held.released
        assert held.runtime.metrics.status == "finished"


@asynccontextmanager
async def reading_past_its_first_batch(
    endpoint: Endpoint, rest: Callable[[pa.RecordBatch, fl.FlightStreamReader], T]
) -> AsyncIterator[list[T]]:
    """A reader of `endpoint` in a thread, past its first batch when the block starts; once
    the block ends, the reader ended too, and the list holds what `rest` made of the read."""
    first_batch = anyio.Event()
    made: list[T] = []

    def read() -> T:
        with fl.connect(endpoint.location) as client:
            reader = client.do_get(fl.Ticket(endpoint.ticket))
            first = reader.read_chunk().data
            anyio.from_thread.run_sync(first_batch.set)
            return rest(first, reader)

    async def reader() -> None:
        made.append(await anyio.to_thread.run_sync(read))

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        with anyio.fail_after(10):
            await first_batch.wait()
        yield made


def read_to_its_end(first: pa.RecordBatch, reader: fl.FlightStreamReader) -> pa.Table:
    return pa.Table.from_batches([first, *(chunk.data for chunk in reader)])


def how_it_ended(first: pa.RecordBatch, reader: fl.FlightStreamReader) -> str:
    try:
        reader.read_all()
    except fl.FlightError as exc:
        return str(exc)
    return "read to its end"


async def test_a_query_being_read_outlives_its_ttl_until_the_read_ends() -> None:
    """A reader of a slow feed (an API paging for minutes) was cut off once the query had gone
    `ttl` seconds without a partition read to its end: "work-unit feed channel failed: task
    ... ended". The worker now tells the coordinator how many partitions are being read."""
    provider = LiveProvider(1)
    provider.push(0, b"first")
    async with cluster(tasks=1) as (coordinator, workers):
        held = await coordinator.hold(unit_scan(provider), ttl=0.2, grace=0.01)
        (endpoint,) = held.endpoints
        async with reading_past_its_first_batch(endpoint, read_to_its_end) as read_back:
            await anyio.sleep(1.0)  # five TTLs with a read open and nothing read to its end
            assert not held.released
            provider.push(0, b"second")
            provider.end(0)
        assert bodies(read_back[0]) == [b"first", b"second"]
        with anyio.fail_after(10):
            await wait_for_no_tasks(workers)  # read to its end: released after its grace
        assert held.released


async def test_a_reader_cut_off_by_a_release_is_told_so() -> None:
    """Released mid-read, the reader got "work-unit feed channel failed: task ... ended", as for
    any other end (a lost coordinator, too); a DoGet a moment later named the cause."""
    provider = LiveProvider(1)
    provider.push(0, b"first")
    async with cluster(tasks=1) as (coordinator, workers):
        held = await coordinator.hold(unit_scan(provider))
        (endpoint,) = held.endpoints
        async with reading_past_its_first_batch(endpoint, how_it_ended) as said:
            held.release()
        with anyio.fail_after(10):
            await wait_for_no_tasks(workers)
    assert "ended (released by its coordinator)" in said[0]


async def test_a_release_while_units_go_out_ends_the_query_and_spares_the_connection() -> None:
    """Released while its feed still had units to send, a held query's half-close could go out
    before one of them: a DATA frame after END_STREAM, which h2 refuses, and the whole
    connection to the worker failed with it. The held query failed ("Invalid input
    StreamInputs.SEND_DATA"), and so did a query of another caller sharing that connection.
    The worker is paused (SIGSTOP) from before the release until the units were handed out,
    so no reply of its can end the task first."""
    held_provider, other_provider = LiveProvider(1), LiveProvider(1)
    held_provider.push(0, b"first")
    with ExitStack() as stack:
        process, url = await anyio.to_thread.run_sync(
            stack.enter_context, worker_process(*SESSION_BUILDER)
        )
        resolver = StaticWorkerResolver([url])
        async with (
            Coordinator(resolver, **unit_coordinator_options(1)) as coordinator,
            anyio.create_task_group() as tg,
        ):
            other = Coalesce(unit_scan(other_provider, every=COUNT_AT_END))
            other_rows: list[pa.Table] = []

            async def other_query() -> None:
                other_rows.append(await coordinator.collect(other))

            tg.start_soon(other_query)
            held = await coordinator.hold(unit_scan(held_provider))
            with anyio.fail_after(10):
                await held.ready(0)  # its plan went out: units go right behind it
            process.send_signal(signal.SIGSTOP)
            try:
                held.release()
                held_provider.push(0, *[b"late"] * 50)
                await anyio.sleep(0.2)  # the units' time to go out, after the half-close
            finally:
                process.send_signal(signal.SIGCONT)
            other_provider.push(0, b"a", b"b")
            other_provider.end(0)
            with anyio.fail_after(20):
                await held.runtime.metrics.wait_finished()
        assert held.runtime.metrics.status == "finished", held.runtime.metrics.error
        assert other_rows[0].column("units").to_pylist() == [2]


async def test_a_release_while_a_large_unit_is_being_written_ends_the_query() -> None:
    """Released while a 4 MiB unit was being written to a worker that read nothing (flow
    control held the write), the release cut the write short, after which the channel could
    not be half-closed: the worker kept the task until its 300 s idle TTL, and the query then
    failed (found by a review). The half-close now waits for the write (bounded), and the feed
    stops after it."""
    provider = LiveProvider(1)
    provider.push(0, b"first")
    with ExitStack() as stack:
        process, url = await anyio.to_thread.run_sync(
            stack.enter_context, worker_process(*SESSION_BUILDER)
        )
        resolver = StaticWorkerResolver([url])
        async with Coordinator(resolver, **unit_coordinator_options(1)) as coordinator:
            held = await coordinator.hold(unit_scan(provider))
            with anyio.fail_after(10):
                await held.ready(0)
            process.send_signal(signal.SIGSTOP)
            try:
                provider.push(0, *[b"x" * 4 * 1024 * 1024] * 20)
                await anyio.sleep(0.5)  # (the units' time to fill the connection's window)
                held.release()
                await anyio.sleep(0.5)
            finally:
                process.send_signal(signal.SIGCONT)
            with anyio.fail_after(30):
                await held.runtime.metrics.wait_finished()
        assert held.runtime.metrics.status == "finished", held.runtime.metrics.error


async def test_a_broadcast_join_read_from_the_workers_joins_every_build_row() -> None:
    """A held query runs its whole plan as one stage on the workers. A broadcast join's build
    side was split across its tasks like any leaf, so each task joined its probe rows with its
    own share of the build rows: half of this join's rows were missing (found by a probe)."""

    def join() -> ExecutionPlan:
        """Every build row matches every probe row (4 x 2), whatever partition it came from."""
        build = plan_from(unit_scan(UnitProvider([2, 2]))).select(
            (lit(1), "key"), (col("body"), "build")
        )
        probe = plan_from(unit_scan(UnitProvider([1, 1]))).select(
            (lit(1), "one"), (col("body"), "probe")
        )
        return build.join(probe, [("key", "one")]).plan

    async with open_task_context(Session()) as ctx:
        expected = await collect(join(), ctx)
    async with cluster(tasks=2) as (coordinator, _):
        held = await coordinator.hold(join())
        parts = [await read(endpoint) for endpoint in held.endpoints]
        held.release()
    got = pa.concat_tables(parts)
    assert sorted(got.to_pylist(), key=str) == sorted(expected.to_pylist(), key=str)
    assert got.num_rows == 8


@pytest.mark.parametrize("shape", ["repartition", "shuffled join"])
async def test_a_repartition_read_from_the_workers_reads_in_any_order_and_again(
    shape: str,
) -> None:
    """A held query ran a Repartition's outputs as its endpoints, but a fan-out's outputs must
    be read together (each buffers a few batches) and once: read one after another, as by a
    Spark with fewer cores than partitions, the first waited forever and the rows of its
    bucket were lost; read again, "output 0 was already opened" (found by a probe)."""

    def plan() -> ExecutionPlan:
        rows = plan_from(unit_scan(UnitProvider([20, 20])))
        if shape == "repartition":
            return rows.repartition("body", partitions=2).plan
        other = plan_from(unit_scan(UnitProvider([20, 20]))).select((col("body"), "b2"))
        return rows.join(other, [("body", "b2")], "inner", strategy="shuffle").plan

    async with cluster() as (coordinator, _):
        held = await coordinator.hold(plan())
        with anyio.fail_after(30):
            parts = [await read(endpoint) for endpoint in held.endpoints]  # one at a time
            again = await read(held.endpoints[0])
        held.release()
    assert sum(part.num_rows for part in parts) == 40
    assert sorted_bodies(again) == sorted_bodies(parts[0])


def sorted_bodies(table: pa.Table) -> list[bytes]:
    return sorted(table.column("body").to_pylist())


async def test_a_concurrent_second_read_of_a_partition_is_refused() -> None:
    provider = UnitProvider([100_000])  # long enough to still be read when the second comes

    def two_readers(endpoint: Endpoint) -> str:
        with fl.connect(endpoint.location) as client:
            first = client.do_get(fl.Ticket(endpoint.ticket))
            first.read_chunk()
            try:
                client.do_get(fl.Ticket(endpoint.ticket)).read_all()
            except pa.ArrowException as exc:  # FAILED_PRECONDITION: pyarrow's ArrowInvalid
                return str(exc)
        return "no error"

    async with cluster(tasks=1) as (coordinator, _):
        held = await coordinator.hold(unit_scan(provider))
        (endpoint,) = held.endpoints
        message = await anyio.to_thread.run_sync(two_readers, endpoint)
        held.release()
    assert "are being read: a concurrent second read is not supported" in message
    assert "precondition failed" in message  # a valid request the task's state refuses


async def test_closing_the_coordinator_ends_its_held_queries_as_their_grace_would(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An app that leaves its coordinator right after a reader is done (the demo does, after
    Spark's read) ends the held queries still in their grace as the grace would: each task's
    channel half-closed, so its worker reports the task's metrics and drops it. Resetting the
    channels instead lost the metrics, and each worker logged a cancelled request."""
    caplog.set_level(logging.INFO, logger="grpclib.server")
    provider = UnitProvider([30, 20])
    async with start_workers(2, session_builder=unit_session_builder) as workers:
        resolver = InProcessWorkerResolver(workers)
        async with Coordinator(resolver, **unit_coordinator_options(2)) as coordinator:
            held = await coordinator.hold(unit_scan(provider))  # a grace of a minute
            assert sum([(await read(e)).num_rows for e in held.endpoints]) == 50
            metrics = coordinator.metrics.latest
            assert metrics is not None
        assert held.released
        assert metrics.status == "finished"
        assert [t.status for t in metrics.tasks.values()] == ["finished", "finished"]
        assert [len(w.registry) for w in workers] == [0, 0]
    assert [r.getMessage() for r in caplog.records if "cancelled" in r.getMessage()] == []
