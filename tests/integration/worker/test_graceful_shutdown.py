"""Graceful shutdown: a draining worker refuses new tasks (UNAVAILABLE, saying why) while the
tasks it runs finish and are read to their end; `flightfeed worker` does that on SIGTERM, and
stops at once on a second signal."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from helpers.worker_process import worker_process

from flightfeed.coordinator import Coordinator
from flightfeed.coordinator.held import HeldQuery
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import FlightfeedError, Unavailable
from flightfeed.flight.client import FlightClient
from flightfeed.plan.nodes import ParquetScan
from flightfeed.spark.client import Endpoint, read_endpoint
from flightfeed.worker import Worker, WorkerConfig

ROWS = 2000
STILL_UP = 1.0
"""Seconds a stopping worker must still be up while a read it serves is unfinished."""


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"v": pa.array(range(ROWS))}), path, row_group_size=500)
    return path


async def registered(worker: Worker) -> None:
    """Until the worker holds a task (a SetPlan sent is not yet one received)."""
    while not len(worker.registry):
        await worker.registry.changed()


@pytest.mark.anyio
async def test_a_draining_worker_finishes_its_tasks_and_refuses_new_ones(rows_file: Path) -> None:
    config = WorkerConfig(parquet_roots=(str(rows_file.parent),))
    plan = ParquetScan.from_paths(str(rows_file), partitions=4)
    async with (
        Worker(config=config) as worker,
        Coordinator(StaticWorkerResolver([worker.location])) as coordinator,
    ):
        held = await coordinator.hold(plan)
        await registered(worker)  # the held query's task waits for its readers
        left: list[int] = []
        async with anyio.create_task_group() as tg:

            async def drain() -> None:
                left.append(await worker.drain(grace=30))

            tg.start_soon(drain)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(Unavailable, match="shutting down"):
                await coordinator.collect(plan)  # a new query: refused, and said why
            values: list[int] = []
            for endpoint in held.endpoints:  # the running task is read to its end
                async with FlightClient(endpoint.location) as client:
                    values += (await client.do_get(endpoint.ticket).read_all())["v"].to_pylist()
            held.release()  # its reader is done: the task ends
        assert sorted(values) == list(range(ROWS))
        assert left == [0]  # drained: nothing was cut off


@pytest.mark.anyio
async def test_the_grace_period_bounds_the_wait(rows_file: Path) -> None:
    config = WorkerConfig(parquet_roots=(str(rows_file.parent),))
    plan = ParquetScan.from_paths(str(rows_file), partitions=4)
    async with (
        Worker(config=config) as worker,
        Coordinator(StaticWorkerResolver([worker.location])) as coordinator,
    ):
        await coordinator.hold(plan)  # never read
        await registered(worker)
        assert await worker.drain(grace=0.2) == 1  # still running when the grace ended


async def refused_once_draining(coordinator: Coordinator, plan: ParquetScan) -> None:
    """New queries, until the worker refuses one for shutting down: a query it still took ran
    to its end (the worker had not yet taken the signal, which comes in its own time)."""
    with anyio.fail_after(20):
        while True:
            try:
                await coordinator.collect(plan)
            except FlightfeedError as exc:
                if "shutting down" not in str(exc):
                    raise
                return


Read = Callable[[HeldQuery, Callable[[], Awaitable[None]]], Awaitable[list[int]]]
"""How a test reads a held query's values, calling `stop` (SIGTERM, until the worker refuses
new queries) where it wants the stop to come."""


def stopped_while_read(rows_file: Path, partitions: int, read: Read) -> None:
    """A worker process holds a query of `rows_file` in `partitions`; `read` reads it while
    the worker is stopped: every value arrives, and then the worker exits on its own."""
    roots = ("--parquet-root", str(rows_file.parent))
    with worker_process(*roots, "--shutdown-grace", "30") as (proc, location):

        async def scenario() -> list[int]:
            plan = ParquetScan.from_paths(str(rows_file), partitions=partitions)
            async with Coordinator(StaticWorkerResolver([location])) as coordinator:
                held = await coordinator.hold(plan)

                async def stop() -> None:
                    proc.send_signal(signal.SIGTERM)
                    await refused_once_draining(coordinator, plan)  # it is stopping
                    # ...but not before what is being read was read: a shared-memory read had
                    # the worker gone by now, every time (what the reader takes next races it)
                    with pytest.raises(subprocess.TimeoutExpired):
                        await anyio.to_thread.run_sync(proc.wait, STILL_UP)

                values = await read(held, stop)
                held.release()
                return values

        values = anyio.run(scenario)
        assert sorted(values) == list(range(ROWS))
        assert proc.wait(timeout=20) == 0  # and then it stopped on its own


def test_sigterm_lets_a_running_task_finish(rows_file: Path) -> None:
    async def read(held: HeldQuery, stop: Callable[[], Awaitable[None]]) -> list[int]:
        await stop()  # mid-query: its task must still be served
        values: list[int] = []
        for endpoint in held.endpoints:
            async with FlightClient(endpoint.location) as client:
                values += (await client.do_get(endpoint.ticket).read_all())["v"].to_pylist()
        return values

    stopped_while_read(rows_file, 4, read)


def test_a_second_signal_stops_at_once(rows_file: Path) -> None:
    roots = ("--parquet-root", str(rows_file.parent))
    with worker_process(*roots, "--shutdown-grace", "600") as (proc, location):

        async def hold_a_task() -> None:
            plan = ParquetScan.from_paths(str(rows_file), partitions=4)
            async with Coordinator(StaticWorkerResolver([location])) as coordinator:
                await coordinator.hold(plan)
                proc.send_signal(signal.SIGTERM)
                await refused_once_draining(coordinator, plan)  # it took the first
                proc.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(proc.wait, 20)

        anyio.run(hold_a_task)
        assert proc.returncode == 0
        with pytest.raises(fl.FlightUnavailableError):
            fl.connect(location).list_actions()


def test_sigterm_lets_a_read_through_shared_memory_take_its_last_batches(rows_file: Path) -> None:
    """A reader on the worker's host reads through shared memory: its task counted as read
    once its last batch was in a slot, and the stop closed the worker while the reader still
    had slots to take (a Spark query failed with "lost in the middle of a DoGet" where a
    SIGKILL costs nothing; found by a probe)."""

    async def read(held: HeldQuery, stop: Callable[[], Awaitable[None]]) -> list[int]:
        (endpoint,) = held.endpoints
        batches = read_endpoint(  # (a worker on this host: through shared memory)
            Endpoint(endpoint.ticket, (endpoint.location,)), {}, shared_memory=True
        )
        first = await anyio.to_thread.run_sync(next, batches)  # the others in slots
        await stop()
        rest = await anyio.to_thread.run_sync(list, batches)
        return [v for b in [first, *rest] for v in b.column("v").to_pylist()]

    stopped_while_read(rows_file, 1, read)
