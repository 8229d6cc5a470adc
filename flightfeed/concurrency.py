"""The event loop's two shared helpers: `off_loop`, which every layer uses to move CPU work
off it, and `Signal`, the wake-up every layer uses to wait for a change.

A callback that runs long on the event loop stops every other stream the process serves, so
decoding a large plan or control message, say, runs on a worker thread; small inputs stay
inline, where a thread hop would cost more than the work (plan nodes use
flightfeed.plan.offload.run_compute, which also accounts the time to the node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import anyio
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


class Signal:
    """A wake-up that any number of notifiers send and waiters await: `wait` returns at the
    next `notify`. One Event per round, made only while someone waits, so notifying with
    nobody waiting (the hot path) costs an attribute check."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # (made on first wait: an Event needs a loop)

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()
