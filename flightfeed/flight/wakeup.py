"""grpclib's wake-up cancellation, undone once it has been turned into an error.

grpclib wakes a call waiting on a stream that was reset with `task.cancel()`, and its wrapper
turns the CancelledError into StreamTerminatedError, but the cancel request stays counted on
the task; anyio would later take it for a real cancellation of the caller.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .internals import wrapper_cancelled


def cancel_baseline() -> tuple[asyncio.Task[Any] | None, int]:
    """The current task and its pending cancel requests, before waiting inside grpclib."""
    task = asyncio.current_task()
    return task, task.cancelling() if task is not None else 0


def forget_wakeup_cancel(wrapper: Any, task: asyncio.Task[Any] | None, baseline: int) -> None:
    """Drop the cancel requests grpclib's wrapper added since `baseline`."""
    if task is None or wrapper is None or not wrapper_cancelled(wrapper):
        return
    while task.cancelling() > baseline:
        task.uncancel()
