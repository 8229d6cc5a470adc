"""A worker gives freed memory back once it has neither tasks nor calls: malformed calls that
never make a task count as work too (100,000 fuzzed calls left a worker 56% larger, for good,
because only tasks were watched)."""

from __future__ import annotations

import anyio
import anyio.from_thread
import pytest
from helpers.raw_h2 import RawH2Client

from flightfeed.flight.client import parse_location
from flightfeed.plan import Coalesce
from flightfeed.protocol import WorkerClient
from flightfeed.testing import start_cluster
from flightfeed.testing.feeds import (
    COUNT_AT_END,
    LiveProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)
from flightfeed.worker import Worker, WorkerConfig
from flightfeed.worker import server as worker_server

pytestmark = pytest.mark.anyio

QUIET = 0.2
CHANNEL = "/flightfeed.v1.WorkerService/CoordinatorChannel"


async def test_an_open_call_holds_the_release_back_and_its_end_lets_it_happen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    releases: list[int] = []
    released = anyio.Event()

    def release() -> None:  # on a worker thread, as the real one runs
        releases.append(1)
        anyio.from_thread.run_sync(released.set)

    monkeypatch.setattr(worker_server, "release_free_memory", release)
    async with Worker(port=0, config=WorkerConfig(release_memory_after=QUIET)) as worker:
        with anyio.fail_after(10):
            await released.wait()  # started quiet: released once
        released = anyio.Event()
        client = await RawH2Client.connect(*parse_location(worker.location))
        try:
            # A channel opened and never written to: no task is ever made.
            with anyio.move_on_after(6 * QUIET):
                await client.call(CHANNEL, [], end=False)
            assert worker.state.calls.running == 1
            assert len(worker.registry) == 0
            assert releases == [1]  # a running call is work: nothing released meanwhile
        finally:
            await client.aclose()
        with anyio.fail_after(10):
            await released.wait()  # the call ended: quiet again
        async with WorkerClient(worker.location) as info_client:
            info = await info_client.worker_info()
        assert info.calls == 1  # this call itself
        assert info.memory_releases == 2


async def test_a_running_task_holds_the_release_back_where_no_call_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process no call is counted: the worker's tasks alone say it is busy (its first task
    and its last are the edges it wakes on)."""
    releases: list[int] = []
    released = anyio.Event()

    def release() -> None:
        releases.append(1)
        anyio.from_thread.run_sync(released.set)

    monkeypatch.setattr(worker_server, "release_free_memory", release)
    live = LiveProvider(1)
    config = WorkerConfig(release_memory_after=QUIET)
    async with start_cluster(
        1,
        config=config,
        in_process=True,
        session_builder=unit_session_builder,
        **unit_coordinator_options(),
    ) as (coordinator, (worker,)):
        with anyio.fail_after(10):
            await released.wait()  # started quiet: released once
        released = anyio.Event()
        units: list[int] = []

        async def read() -> None:
            stream = coordinator.execute(Coalesce(unit_scan(live, every=COUNT_AT_END)))
            async with stream as batches:
                units.extend([batch.column("units")[0].as_py() async for batch in batches])

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            with anyio.fail_after(10):
                while not len(worker.registry):
                    await worker.registry.changed()
            with anyio.move_on_after(6 * QUIET):
                await released.wait()  # (must not happen: the task is work)
            assert worker.state.calls.running == 0
            assert releases == [1]
            live.push(0, b"a")
            live.end(0)
        assert units == [1]
        with anyio.fail_after(10):
            await released.wait()  # the task ended: quiet again
        assert releases == [1, 1]
