"""A worker gives freed memory back once it has neither tasks nor calls: malformed calls that
never make a task count as work too (100,000 fuzzed calls left a worker 56% larger, for good,
because only tasks were watched)."""

from __future__ import annotations

import anyio
import anyio.from_thread
import pytest
from helpers.raw_h2 import RawH2Client

from flightfeed.flight.client import parse_location
from flightfeed.protocol import WorkerClient
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
