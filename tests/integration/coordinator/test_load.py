"""Load on live worker processes: many small feed queries in a row, then a burst of queries
all in flight at once, through one coordinator; nothing is left behind. The long run is
`FLIGHTFEED_LOAD_SEQUENTIAL=10000 FLIGHTFEED_LOAD_CONCURRENT=1000 pytest -q -s
tests/integration/coordinator/test_load.py` (or benchmarks/load_test.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack

import anyio
import pytest
from helpers.worker_process import worker_log, worker_process

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.testing.feeds import unit_coordinator_options
from flightfeed.testing.load import Snapshot, burst, sequential, snapshot

SEQUENTIAL = int(os.environ.get("FLIGHTFEED_LOAD_SEQUENTIAL", "200"))
CONCURRENT = int(os.environ.get("FLIGHTFEED_LOAD_CONCURRENT", "100"))
SLACK = 8
"""Event-loop tasks and open files two snapshots may differ by (calls and connections still
closing); a leak grows with the number of queries."""


@pytest.fixture(scope="module")
def workers() -> Iterator[list[tuple[subprocess.Popen[str], str]]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                worker_process("--session-builder", "flightfeed.testing.feeds:unit_session_builder")
            )
            for _ in range(3)
        ]


async def _load(pids: dict[str, int]) -> tuple[Snapshot, Snapshot]:
    coordinator = Coordinator(
        StaticWorkerResolver(list(pids)),
        max_concurrent_queries=CONCURRENT,
        **unit_coordinator_options(),
    )
    async with coordinator as c:
        await sequential(c, 20)  # connections up, imports done
        before = await snapshot(c, pids)
        await sequential(c, SEQUENTIAL)
        await burst(c, CONCURRENT)
        await sequential(c, 1)
        after = await snapshot(c, pids)
    return before, after


@pytest.mark.timeout(max(300, SEQUENTIAL // 10 + CONCURRENT // 2))
def test_many_queries_complete_and_leave_nothing_behind(
    workers: list[tuple[subprocess.Popen[str], str]],
) -> None:
    pids = {location: proc.pid for proc, location in workers}
    before, after = anyio.run(_load, pids)
    print(f"\nbefore: {before}\nafter: {after}")
    assert (after.running_queries, after.queued_queries) == (0, 0)
    assert after.event_loop_tasks <= before.event_loop_tasks + SLACK
    assert after.open_files <= before.open_files + SLACK
    for b, a in zip(before.workers, after.workers, strict=True):
        assert (a.tasks, a.plan_waiters) == (0, 0), a
        assert a.event_loop_tasks <= b.event_loop_tasks + SLACK, (b, a)
        assert a.open_files <= b.open_files + SLACK, (b, a)
    for proc, _ in workers:
        assert proc.poll() is None
        assert "Traceback" not in worker_log(proc)
