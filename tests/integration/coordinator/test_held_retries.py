"""A held query (read by Spark or any Flight client straight from the workers) loses a worker:
the coordinator runs that worker's tasks again elsewhere, their feed partitions replayed, and a
reader that cannot reach an endpoint asks the coordinator where it went ("relocate") and reads
the same rows there. Readers here are the Spark data source's client (pyarrow's C++ Flight
client), in threads, against `flightfeed worker` processes."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from helpers.worker_process import worker_process

from flightfeed.cluster import CoordinatorCluster, serve
from flightfeed.coordinator import Catalog
from flightfeed.coordinator.table_query import table_command
from flightfeed.errors import NotFound, RemoteError
from flightfeed.plan import ExecutionPlan
from flightfeed.spark import client
from flightfeed.testing.feeds import (
    UnitProvider,
    unit_scan,
    with_unit_scans,
)

pytestmark = pytest.mark.anyio
T = TypeVar("T")

SESSION_BUILDER = ("--session-builder", "flightfeed.testing.feeds:unit_session_builder")
PARTITIONS = 4
UNITS = 300


def catalog() -> Catalog:
    found = with_unit_scans(Catalog(), tasks=2)

    @found.table("units")
    def units() -> ExecutionPlan:
        return unit_scan(UnitProvider([UNITS] * PARTITIONS))

    return found


@asynccontextmanager
async def cluster_of_three(
    grace: float = 0.01,
) -> AsyncIterator[tuple[CoordinatorCluster, dict[str, subprocess.Popen[str]]]]:
    """A served catalog over three worker processes (started off the event loop); a query read
    to its end is released after `grace` seconds."""
    with ExitStack() as stack:
        processes = {}
        for _ in range(3):
            proc, url = await anyio.to_thread.run_sync(
                stack.enter_context, worker_process(*SESSION_BUILDER)
            )
            processes[url] = proc
        async with serve(catalog(), workers=list(processes), grace=grace) as cluster:
            yield cluster, processes


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def read(endpoint: client.Endpoint, coordinator: str) -> pa.Table:
    return pa.Table.from_batches(list(client.read_endpoint(endpoint, {}, coordinator=coordinator)))


def read_plainly(endpoint: client.Endpoint) -> pa.Table:
    """pyarrow's own Flight client, which knows nothing of `relocate`."""
    with flight.connect(endpoint.locations[0]) as plain:
        return plain.do_get(flight.Ticket(endpoint.ticket)).read_all()


def expected() -> list[bytes]:
    return sorted(f"{p}:{i}".encode() for p in range(PARTITIONS) for i in range(UNITS))


async def test_a_killed_workers_endpoints_are_read_where_its_tasks_moved() -> None:
    async with cluster_of_three() as (cluster, processes):
        query_id, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        victim = endpoints[0].locations[0]
        processes[victim].kill()
        parts = [await in_thread(read, e, cluster.location) for e in endpoints]
        rows = pa.concat_tables(parts)
        assert sorted(rows.column("body").to_pylist()) == expected()
        held = cluster.service.held[query_id]
        moved = [f for f in held.runtime.metrics.failed_attempts if "moved to" in f]
        assert moved
        assert all(victim in f for f in moved)
        assert all(run.worker_url != victim for run in held.runtime.tasks.values())


async def test_a_query_started_after_a_worker_died_is_handed_out_where_its_tasks_run() -> None:
    """Workers killed while idle (their channels still pooled, so the coordinator took them for
    reachable): the next query's tasks placed there could not open, and moved to the live
    worker before GetFlightInfo answered, but the answer named the dead workers (where the
    tasks were first placed), so a client that knows no `relocate` could not read them."""
    async with cluster_of_three() as (cluster, processes):
        query_id, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        first = cluster.service.held[query_id]
        for endpoint in endpoints:
            await in_thread(read_plainly, endpoint)
        with anyio.fail_after(30):
            await first.runtime.finished.wait()  # released: its workers are idle
        dead = {e.locations[0] for e in endpoints}
        assert all(cluster.coordinator.channels.is_open(url) for url in dead)
        (alive,) = set(processes) - dead
        for url in dead:
            processes[url].kill()
            await in_thread(processes[url].wait)
        query_id, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        assert {e.locations for e in endpoints} == {(alive,)}
        parts = [await in_thread(read_plainly, e) for e in endpoints]
        moved = cluster.service.held[query_id].runtime.metrics.failed_attempts
        assert [f for f in moved if "moved to" in f]  # (the case this is about)
    rows = pa.concat_tables(parts)
    assert sorted(rows.column("body").to_pylist()) == expected()


async def test_a_worker_paused_until_its_task_moved_sends_its_reader_to_the_new_place() -> None:
    """SIGSTOP long enough for the coordinator to move the worker's task, then SIGCONT: the
    worker answers again, NOT_FOUND for the task it no longer has. The reader (and every
    retry of a Spark task) failed there, since it asked `relocate` only when no worker
    answered at all."""
    async with cluster_of_three() as (cluster, processes):
        query_id, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        held = cluster.service.held[query_id]
        paused = endpoints[0].locations[0]
        task = held.endpoints[0].task_number
        processes[paused].send_signal(signal.SIGSTOP)
        try:
            with anyio.fail_after(60):  # found lost (no answer to keepalives), and moved
                await held.relocate(task, 0, paused, attempt=0)
        finally:
            processes[paused].send_signal(signal.SIGCONT)
        assert held.run(task).worker_url != paused
        parts = [await in_thread(read, e, cluster.location) for e in endpoints]
    rows = pa.concat_tables(parts)
    assert sorted(rows.column("body").to_pylist()) == expected()


async def test_relocate_names_the_failure_of_a_query_that_could_not_move() -> None:
    """Its only worker killed, the query failed; relocate said it "was released (read to its
    end ...)", none of which happened, and not why it ended."""
    with ExitStack() as stack:
        proc, url = await anyio.to_thread.run_sync(
            stack.enter_context, worker_process(*SESSION_BUILDER)
        )
        async with serve(catalog(), workers=[url]) as cluster:
            query_id, endpoints = await in_thread(
                client.get_endpoints, cluster.location, table_command("units", []), {}
            )
            held = cluster.service.held[query_id]
            proc.kill()
            with anyio.fail_after(30):
                await held.runtime.finished.wait()
            with pytest.raises(NotFound) as info:
                await in_thread(client.relocate, cluster.location, endpoints[0], url, {})
            with pytest.raises(NotFound) as read_info:  # what a Spark task gets
                await in_thread(read, endpoints[0], cluster.location)
    message = str(info.value)
    assert "the query ended in a failure" in message
    assert "no other worker could take task" in message
    assert "released" not in message
    assert "the query ended in a failure" in str(read_info.value)


async def test_a_read_cut_off_midway_is_read_again_whole_where_the_task_moved() -> None:
    """What Spark does when a task fails: the partition is read again from its start."""
    async with cluster_of_three() as (cluster, processes):
        _, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        first = endpoints[0]
        batches = client.read_endpoint(first, {}, coordinator=cluster.location)
        taken = await in_thread(next, batches)
        assert taken.num_rows
        processes[first.locations[0]].kill()
        with pytest.raises(RemoteError):
            await in_thread(lambda: list(batches))  # rows were read: it cannot switch midway
        again = await in_thread(read, first, cluster.location)
        rest = [await in_thread(read, e, cluster.location) for e in endpoints[1:]]
        rows = pa.concat_tables([again, *rest])
        assert sorted(rows.column("body").to_pylist()) == expected()


async def test_a_draining_workers_endpoints_are_read_where_its_tasks_moved() -> None:
    """A worker shutting down refuses a new held query's tasks (UNAVAILABLE); a reader sent to
    it learns that at once and asks the coordinator where the task went."""
    async with serve(catalog(), local_workers=2, grace=0.01) as cluster:
        draining = cluster.workers[0]
        draining.registry.draining = True  # as after SIGTERM, with tasks still running
        _, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        assert {e.locations[0] for e in endpoints} == {w.location for w in cluster.workers}
        with anyio.fail_after(60):
            parts = [await in_thread(read, e, cluster.location) for e in endpoints]
    rows = pa.concat_tables(parts)
    assert sorted(rows.column("body").to_pylist()) == expected()


async def test_a_stopped_worker_does_not_wait_for_tasks_kept_only_for_a_re_read() -> None:
    """SIGTERM once every endpoint was read (the query is held a minute more, for re-reads):
    the worker stops without waiting out its 30 s grace, and a re-read of one of its endpoints
    goes where the coordinator moved the task."""
    async with cluster_of_three(grace=60) as (cluster, processes):
        _, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        first = [await in_thread(read, e, cluster.location) for e in endpoints]
        stopping = processes[endpoints[0].locations[0]]
        stopping.send_signal(signal.SIGTERM)
        assert await in_thread(stopping.wait, 20) == 0  # (the grace is 30 s)
        again = await in_thread(read, endpoints[0], cluster.location)
    assert sorted(again.column("body").to_pylist()) == sorted(first[0].column("body").to_pylist())
    rows = pa.concat_tables(first)
    assert sorted(rows.column("body").to_pylist()) == expected()


async def test_a_task_read_whole_moves_only_when_a_reader_asks_for_it() -> None:
    """Its worker lost after every endpoint was read, the task ran again at once elsewhere,
    though nobody might read it again: the worker given it held it until the query was released
    (and, stopped meanwhile, waited out its 30 s grace for it)."""
    async with cluster_of_three(grace=60) as (cluster, processes):
        query_id, endpoints = await in_thread(
            client.get_endpoints, cluster.location, table_command("units", []), {}
        )
        first = [await in_thread(read, e, cluster.location) for e in endpoints]
        held = cluster.service.held[query_id]
        victim = endpoints[0].locations[0]
        (task,) = {e.task_number for e in held.endpoints if e.location == victim}
        processes[victim].kill()
        with anyio.fail_after(30):
            await held.parked_task(task)
        assert held.run(task).worker_url == victim  # not run again: nobody asked
        assert not [f for f in held.runtime.metrics.failed_attempts if "moved to" in f]
        with anyio.fail_after(60):
            again = await in_thread(read, endpoints[0], cluster.location)
        assert held.run(task).worker_url != victim
        assert held.parked == set()
    assert sorted(again.column("body").to_pylist()) == sorted(first[0].column("body").to_pylist())
