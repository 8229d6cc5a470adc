"""Admission control: at most `limit` queries run at once; the others wait their turn in order.

Every running query holds tasks, channels and buffers on the workers, and past a point more
of them only add memory and latency (a worker refuses tasks beyond its own limit). A query
over the limit waits in a FIFO queue, and its metrics say so (status "queued", then how long
it waited). The queue is unbounded unless `max_queued` bounds it: a query arriving at a full
queue fails at once with ResourceExhausted instead of waiting.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

import anyio

from ..concurrency import Signal
from ..errors import InvalidArgument, ResourceExhausted

DEFAULT_MAX_CONCURRENT_QUERIES: Final = 256


class AdmissionClosed(Exception):
    """The coordinator closed while the query waited for a slot, or before it asked."""


@dataclass(eq=False)
class _Turn:
    """A queued query's place: woken when handed a slot (`granted`) or when admission closes."""

    woken: anyio.Event = field(default_factory=anyio.Event)
    granted: bool = False


class Admission:
    """Slots for running queries; `acquire` waits for one (FIFO), `release` hands it on."""

    def __init__(self, limit: int | None, max_queued: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise InvalidArgument(f"max_concurrent_queries must be at least 1, got {limit}")
        if max_queued is not None and max_queued < 0:
            raise InvalidArgument(f"max_queued_queries must be 0 or more, got {max_queued}")
        self.limit = limit
        self.max_queued = max_queued
        self.running = 0
        self.closed = False
        self._waiting: deque[_Turn] = deque()
        self._changed = Signal()

    @property
    def busy(self) -> bool:
        """Whether any query runs or waits."""
        return bool(self.running or self._waiting)

    async def changed(self) -> None:
        """Wait until a query takes or gives back a slot."""
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.notify()

    @property
    def queued(self) -> int:
        """Queries waiting for a slot."""
        return len(self._waiting)

    async def acquire(self) -> None:
        """Take a slot, waiting behind earlier arrivals; ResourceExhausted if the queue is full,
        AdmissionClosed once `close` was called (at once for the queries it finds queued)."""
        await anyio.lowlevel.checkpoint()  # (before taking a slot: a cancelled caller takes none)
        if self.closed:
            raise AdmissionClosed
        if self.limit is None or (self.running < self.limit and not self._waiting):
            self.running += 1
            self._notify()
            return
        if self.max_queued is not None and len(self._waiting) >= self.max_queued:
            raise ResourceExhausted(
                f"{self.running} queries are running and {len(self._waiting)} are queued, the"
                f" most the coordinator takes (max_concurrent_queries={self.limit},"
                f" max_queued_queries={self.max_queued})"
            )
        turn = _Turn()
        self._waiting.append(turn)
        self._notify()
        try:
            await turn.woken.wait()
        except BaseException:
            if turn.granted:
                self.release()  # handed a slot while being cancelled: pass it on
            elif not turn.woken.is_set():
                self._waiting.remove(turn)
                self._notify()
            raise
        if not turn.granted:
            raise AdmissionClosed

    def release(self) -> None:
        """Give a slot back: to the longest waiting query if there is one."""
        if self._waiting:
            turn = self._waiting.popleft()
            turn.granted = True  # the slot passes on: `running` is unchanged
            turn.woken.set()
        else:
            self.running -= 1
        self._notify()

    def close(self) -> None:
        """Admit nothing more: the queued queries and every later one get AdmissionClosed
        (the running ones keep their slots until they release them)."""
        self.closed = True
        while self._waiting:
            self._waiting.popleft().woken.set()
        self._notify()
