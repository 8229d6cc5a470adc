"""A gate of N slots where high-priority callers go first: ExecutePhysicalPlan's
`ExecContext.priority`. Under load, a low-priority plan waits behind every high-priority one
that is waiting; without load, both run at once."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class PriorityGate:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a PriorityGate needs at least one slot")
        self.slots = slots
        self.running = 0
        self._waiting: tuple[deque[anyio.Event], deque[anyio.Event]] = (deque(), deque())

    @property
    def waiting(self) -> tuple[int, int]:
        """(high, low) callers waiting for a slot."""
        return len(self._waiting[0]), len(self._waiting[1])

    @asynccontextmanager
    async def slot(self, *, low: bool = False) -> AsyncIterator[None]:
        """Holds a slot for the block; waits for one, in priority then arrival order."""
        if self.running < self.slots and not any(self._waiting):
            self.running += 1
        else:
            await self._wait(self._waiting[1 if low else 0])
        try:
            yield
        finally:
            self._release()

    async def _wait(self, queue: deque[anyio.Event]) -> None:
        granted = anyio.Event()
        queue.append(granted)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # the slot came with the cancellation: pass it on
                self._release()
            else:
                queue.remove(granted)
            raise

    def _release(self) -> None:
        for queue in self._waiting:
            if queue:
                queue.popleft().set()  # the slot goes straight to the next in line
                return
        self.running -= 1


__all__ = ["PriorityGate"]
