"""How many calls a server is running, and a wake-up when it starts or stops running any.

A worker frees memory once it has gone quiet (idle_release.py). Its tasks alone do not say
when that is: a stream of malformed calls, refused before any task exists, leaves a burst's
buffers, parsed messages and HTTP/2 state behind just the same (100,000 fuzzed calls left a
worker 56% larger). Only the edges wake a waiter, never each call: a busy server pays one
integer update per call.
"""

from __future__ import annotations

from collections.abc import Callable

from ..concurrency import Signal


class CallCount:
    """Calls in flight, counted by the connection handlers on the event loop's thread."""

    def __init__(self, on_edge: Callable[[], None] | None = None) -> None:
        """`on_edge`: also told of each edge (a Signal's notify that other sources share)."""
        self._on_edge = on_edge
        self._running = 0
        self.total = 0
        """Calls started since the server started (for operators and tests)."""
        self._edge = Signal()

    @property
    def running(self) -> int:
        return self._running

    def busy(self) -> bool:
        return self._running > 0

    def started(self) -> None:
        self.total += 1
        self._running += 1
        if self._running == 1:
            self._wake()

    def ended(self) -> None:
        if self._running <= 0:
            raise RuntimeError("CallCount.ended() without a call started")
        self._running -= 1
        if self._running == 0:
            self._wake()

    async def changed(self) -> None:
        """Return once the server next starts running calls, or stops running any."""
        await self._edge.wait()

    def _wake(self) -> None:
        if self._on_edge is not None:
            self._on_edge()
        self._edge.notify()
