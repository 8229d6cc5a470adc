"""Give freed memory back to the operating system once a process has gone quiet.

flightfeed raises glibc's trim threshold so that a transfer does not pay for fresh pages on
every batch (tuning.py); the price is that a burst's peak stays resident afterwards: 1,000
concurrent queries left a coordinator 82% and its workers 20% larger for good. So a worker
with no tasks, or a coordinator with no queries, trims its heap after `delay` seconds of quiet:
rarely enough to cost nothing while busy, soon enough that memory comes back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.to_thread

from .tuning import release_free_memory

DEFAULT_QUIET_SECONDS: Final = 1.0


async def release_when_idle(
    busy: Callable[[], bool],
    changed: Callable[[], Awaitable[None]],
    *,
    delay: float = DEFAULT_QUIET_SECONDS,
    release: Callable[[], None] = release_free_memory,
) -> None:
    """Run for the owner's lifetime: each time `busy()` is false and stays false through
    `delay` seconds of `changed()` notifications, call `release` once on a worker thread, then
    wait for the next change (work that came and went between two notifications counts).
    Event-driven: it waits on `changed()`, never polls."""
    while True:
        while busy():
            await changed()
        with anyio.move_on_after(delay):
            while not busy():
                await changed()
            continue  # busy again within the delay: wait for the next quiet spell
        await anyio.to_thread.run_sync(release)
        await changed()  # released once per quiet spell
