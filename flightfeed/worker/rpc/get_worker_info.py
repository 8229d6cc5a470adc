"""GetWorkerInfo: the worker's version, so coordinators refuse mismatched workers; its feed
window, so coordinators send a new task's first units without waiting for a grant; whether it
is shutting down, so coordinators leave it out of new queries meanwhile; and what it
holds now (tasks, waiting ExecuteTasks, event-loop tasks, calls) and how often it gave memory
back, so operators and load tests can see that state is dropped once queries end."""

from __future__ import annotations

import asyncio

from ..._generated.flightfeed.v1 import GetWorkerInfoResponse
from ..._version import __version__
from ..state import WorkerState


def get_worker_info(state: WorkerState | None = None) -> GetWorkerInfoResponse:
    info = GetWorkerInfoResponse(version=__version__)
    if state is not None:
        info.tasks = len(state.registry)
        info.plan_waiters = state.registry.waiting
        info.event_loop_tasks = len(asyncio.all_tasks())
        info.calls = state.calls.running
        info.memory_releases = state.memory_releases
        info.feed_window = state.config.feed_credits
        info.draining = state.registry.draining
    return info
