"""A worker stopped mid-query (SIGSTOP: a paused VM, a partition) is noticed by the
coordinator's keepalive within the default 8 s of its last byte: with retries off, the query
fails, naming the silence, instead of hanging, and the next query runs on the workers left.
(With retries on, the query itself runs again on them: test_retries.py.)"""

from __future__ import annotations

import os
import signal
import time

import anyio
from helpers.worker_process import worker_process

from flightfeed.coordinator import Coordinator
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import FlightfeedError
from flightfeed.flight.keepalive import WORKER_CLIENT_KEEPALIVE
from flightfeed.plan.nodes import Coalesce
from flightfeed.testing.feeds import (
    LiveProvider,
    UnitProvider,
    unit_coordinator_options,
    unit_scan,
    unit_session_builder,
)
from flightfeed.testing.workers import start_workers

DETECTION_BOUND = 2 * WORKER_CLIENT_KEEPALIVE.interval + WORKER_CLIENT_KEEPALIVE.timeout
"""The longest silence the default keepalive lets pass: 8 s."""


def test_a_stopped_worker_fails_its_query_within_the_keepalive_bound() -> None:
    assert DETECTION_BOUND <= 10
    builder = ("--session-builder", "flightfeed.testing.feeds:unit_session_builder")
    with worker_process(*builder) as (proc, location):

        async def scenario() -> tuple[float, str]:
            provider = LiveProvider(2)  # units come when pushed: none will
            options = unit_coordinator_options(max_attempts=1)
            async with (
                start_workers(1, session_builder=unit_session_builder) as (other,),
                Coordinator(StaticWorkerResolver([location, other.location]), **options) as c,
            ):
                coordinator = c  # its first task goes to the first worker: the one stopped
                failure: list[tuple[float, str]] = []
                failed = anyio.Event()

                async def query() -> None:
                    try:
                        await coordinator.collect(unit_scan(provider))
                    except FlightfeedError as exc:
                        failure.append((time.monotonic(), str(exc)))
                        failed.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(query)
                    # Mid-query, most likely; were the worker stopped before it took the task,
                    # the coordinator's open call would be just as silent, and fail the same.
                    await anyio.sleep(1.0)
                    os.kill(proc.pid, signal.SIGSTOP)
                    stopped = time.monotonic()
                    with anyio.fail_after(DETECTION_BOUND + 10):  # generous for a loaded CI
                        await failed.wait()
                # The next query leaves the stopped worker out and runs on the other one.
                assert location in coordinator.health.down
                again = await coordinator.collect(Coalesce(unit_scan(UnitProvider([2, 3]))))
                assert again.num_rows == 5
            failed_at, message = failure[0]
            return failed_at - stopped, message

        try:
            elapsed, message = anyio.run(scenario)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        print(f"a stopped worker was noticed after {elapsed:.1f} s")
        assert "PING" in message or "connection" in message.lower(), message
        assert elapsed <= DETECTION_BOUND + 5  # the bound, plus scheduling slack under load
