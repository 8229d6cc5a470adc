"""Run Arrow C++ work off the event loop when it is big enough to pay for the thread hop.

pyarrow releases the GIL inside kernels, so a worker thread keeps the loop serving other
streams. A hop costs tens of microseconds, about what a kernel needs for ~1 MiB, so smaller
inputs run inline (threshold: TaskContext.offload_threshold_bytes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

from .metrics import record_compute

if TYPE_CHECKING:
    from .base import TaskContext

T = TypeVar("T")


async def run_compute(
    ctx: TaskContext, nbytes: int, fn: Callable[[], T], *, user_code: bool = False
) -> T:
    """Call `fn` on a worker thread if `nbytes` reaches the threshold (or `fn` runs user code,
    such as a UDF, whose cost nothing bounds), else inline.

    A cancelled caller waits for Arrow work to finish (it is short), not for user code: a UDF
    that takes minutes must not hold up a query's cancellation or its deadline. Its thread is
    left to finish on its own and its result dropped.

    The time `fn` itself takes is the calling node's elapsed compute (see metrics.py).
    """
    spent = [0]

    def timed() -> T:
        started = time.perf_counter_ns()
        try:
            return fn()
        finally:
            spent[0] = time.perf_counter_ns() - started

    try:
        if user_code or nbytes >= ctx.offload_threshold_bytes:
            return await anyio.to_thread.run_sync(timed, abandon_on_cancel=user_code)
        return timed()
    finally:
        record_compute(spent[0])
