"""A coordinator in a process of its own, for tests that freeze or kill it: it runs one query
on the worker it is given, whose feed partition 0 never yields, so the task stays on the
worker until the coordinator cancels it or is lost.

Run: python -m helpers.coordinator_process WORKER_URL (with the tests directory on PYTHONPATH);
it prints "running" once the query has started.
"""

from __future__ import annotations

import sys

import anyio

from flightfeed.coordinator import Coordinator, StaticWorkerResolver
from flightfeed.plan.nodes import Coalesce
from flightfeed.testing.feeds import UnitProvider, unit_coordinator_options, unit_scan


async def run(worker_url: str) -> None:
    plan = Coalesce(unit_scan(UnitProvider([1, 1], hang={0})))
    resolver = StaticWorkerResolver([worker_url])
    async with (
        Coordinator(resolver, **unit_coordinator_options()) as coordinator,
        coordinator.execute(plan) as stream,
    ):
        print("running", flush=True)
        async for _ in stream:
            pass


if __name__ == "__main__":
    anyio.run(run, sys.argv[1])
