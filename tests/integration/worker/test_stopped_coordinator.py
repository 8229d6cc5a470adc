"""A worker whose coordinator froze (SIGSTOP: a paused VM, a network partition) drops the
frozen coordinator's tasks within 10 s with the default keepalive; it used to keep them 79 s.

The coordinator is a process of its own (tests/helpers/coordinator_process.py), so it can be
frozen; the worker runs here, so the test waits on its task registry instead of asking it."""

from __future__ import annotations

import os
import signal
import sys

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from helpers.worker_process import TESTS_DIR

from flightfeed.testing import start_workers
from flightfeed.testing.feeds import unit_session_builder

pytestmark = pytest.mark.anyio


async def test_a_frozen_coordinators_tasks_are_dropped_within_ten_seconds() -> None:
    async with start_workers(1, session_builder=unit_session_builder) as (worker,):
        coordinator = await anyio.open_process(
            [sys.executable, "-m", "helpers.coordinator_process", worker.location],
            env={**os.environ, "PYTHONPATH": TESTS_DIR},
        )
        try:
            assert coordinator.stdout is not None
            output = BufferedByteReceiveStream(coordinator.stdout)
            with anyio.fail_after(60):
                assert await output.receive_until(b"\n", 1024) == b"running"
                while not len(worker.registry):
                    await worker.registry.changed()
            coordinator.send_signal(signal.SIGSTOP)
            stopped = anyio.current_time()
            with anyio.fail_after(30):
                while len(worker.registry):
                    await worker.registry.changed()
            assert anyio.current_time() - stopped < 10.0
        finally:
            coordinator.kill()
            await coordinator.wait()
            await coordinator.aclose()
