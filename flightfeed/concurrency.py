"""Keeping the event loop free: the one helper every layer uses to move CPU work off it.

A callback that runs long on the event loop stops every other stream the process serves, so
decoding a large plan or control message, say, runs on a worker thread; small inputs stay
inline, where a thread hop would cost more than the work (plan nodes use
flightfeed.plan.offload.run_compute, which also accounts the time to the node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import anyio.to_thread

T = TypeVar("T")
A = TypeVar("A")

OFF_LOOP_THRESHOLD_BYTES: Final = 64 * 1024
"""Inputs at least this large are decoded or encoded on a worker thread."""


async def off_loop(
    fn: Callable[[A], T], arg: A, *, nbytes: int, threshold: int = OFF_LOOP_THRESHOLD_BYTES
) -> T:
    """`fn(arg)` on a worker thread when `nbytes` reaches `threshold`, else inline."""
    if nbytes >= threshold:
        return await anyio.to_thread.run_sync(fn, arg)
    return fn(arg)
