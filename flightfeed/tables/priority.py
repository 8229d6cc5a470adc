"""A gate of N slots where high-priority callers go first: ExecutePhysicalPlan's
`ExecContext.priority`. Under load, a low-priority plan waits behind every high-priority one
that is waiting; without load, both run at once."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from ..concurrency import Signal


class PriorityGate:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a PriorityGate needs at least one slot")
        self.slots = slots
        self.running = 0
        self._waiting: tuple[deque[anyio.Event], deque[anyio.Event]] = (deque(), deque())
        self._changed = Signal()

    @property
    def waiting(self) -> tuple[int, int]:
        """(high, low) callers waiting for a slot."""
        return len(self._waiting[0]), len(self._waiting[1])

    async def wait_until(self, condition: Callable[[PriorityGate], bool]) -> None:
        """Until `condition(gate)` holds (re-checked at every change of the gate)."""
        while not condition(self):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.notify()

    @asynccontextmanager
    async def slot(self, *, low: bool = False) -> AsyncIterator[None]:
        """Holds a slot for the block; waits for one, in priority then arrival order."""
        if self.running < self.slots and not any(self._waiting):
            self.running += 1
            self._notify()
        else:
            await self._wait(self._waiting[1 if low else 0])
        try:
            yield
        finally:
            self._release()

    async def _wait(self, queue: deque[anyio.Event]) -> None:
        granted = anyio.Event()
        queue.append(granted)
        self._notify()
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # the slot came with the cancellation: pass it on
                self._release()
            else:
                queue.remove(granted)
                self._notify()
            raise

    def _release(self) -> None:
        self._notify()
        for queue in self._waiting:
            if queue:
                queue.popleft().set()  # the slot goes straight to the next in line
                return
        self.running -= 1


__all__ = ["PriorityGate"]
