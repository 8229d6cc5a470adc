"""The worker's shared-memory segments (flight/shared_memory.py), kept between reads.

A new segment costs a page fault per 4 KiB at each end the first time a page is written and
read: for a 247 MB Spark read that was as much CPU as the socket's copies it replaces. Spark
reuses its Python workers, so a segment is kept once its read ends, idle, and offered again to
the reader that still maps it (its request names it), its pages already in place on both
sides.

Bounded: the segments in use and idle hold at most `budget` bytes; an idle one goes, least
recently used first, to make room for a new one, and any goes after `idle_ttl` seconds unused
(`expire_idle`, one task for the worker's lifetime: it waits on the pool's changes and on the
oldest segment's deadline, never polls). A read that finds no room streams instead.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable

import anyio
import anyio.to_thread

from ..flight.shared_memory import HEADER_BYTES, Segment

log = logging.getLogger(__name__)


class SegmentPool:
    """The segments of one worker: in use by a read, or idle (kept for their reader)."""

    def __init__(
        self, directory: str, budget: int, slots: int, slot_bytes: int, idle_ttl: float
    ) -> None:
        self.directory = directory
        self.budget = budget
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.idle_ttl = idle_ttl
        self._in_use: dict[str, Segment] = {}
        self._idle: OrderedDict[str, tuple[Segment, float]] = OrderedDict()
        """Least recently used first, each with the time it went idle."""
        self._pending = 0
        """Bytes of segments being made (counted against the budget before they exist)."""
        self._changed: anyio.Event | None = None
        """Set on any change (made when first waited on: the pool may be built off the loop)."""
        self._warned = False

    @property
    def segment_bytes(self) -> int:
        return HEADER_BYTES + self.slots * self.slot_bytes

    @property
    def held_bytes(self) -> int:
        """What every segment in use, idle or being made holds."""
        count = len(self._in_use) + len(self._idle)
        return count * self.segment_bytes + self._pending

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take_idle(self, held: Iterable[str]) -> Segment | None:
        """An idle segment among those the reader says it holds; it is in use until given
        back."""
        for segment_id in held:
            found = self._idle.pop(segment_id, None)
            if found is not None:
                segment = found[0]
                self._in_use[segment_id] = segment
                self._notify()
                return segment
        return None

    async def make(self) -> Segment | None:
        """A new segment, in use; None when the budget has no room for one even without the
        idle segments, or the directory cannot hold it (the read streams)."""
        size = self.segment_bytes
        evicted: list[Segment] = []
        while self.held_bytes + size > self.budget and self._idle:
            evicted.append(self._idle.popitem(last=False)[1][0])
        if self.held_bytes + size > self.budget:
            await _close(evicted)
            self._notify()
            return None
        self._pending += size
        try:
            await _close(evicted)
            # Shielded: a segment made while its read was cancelled must still be returned, to
            # be closed by the read's end (its file is unlinked only once a reader maps it).
            with anyio.CancelScope(shield=True):
                segment = await anyio.to_thread.run_sync(
                    Segment, self.directory, self.slots, self.slot_bytes
                )
        except OSError as exc:  # no such directory, no space, no permission
            if not self._warned:  # (once: every read would say it again)
                log.warning(
                    "shared memory unavailable in %s, reads stream: %s", self.directory, exc
                )
                self._warned = True
            self._notify()
            return None
        finally:
            self._pending -= size
        self._in_use[segment.segment_id] = segment
        self._notify()
        return segment

    async def give_back(self, segment: Segment, keep: bool) -> None:
        """A read is done with `segment`: kept idle for its reader, or closed."""
        self._in_use.pop(segment.segment_id, None)
        if keep:
            self._idle[segment.segment_id] = (segment, anyio.current_time())
            self._notify()
            return
        await _close([segment])
        self._notify()

    async def expire_idle(self) -> None:
        """Run for the worker's lifetime: close each idle segment `idle_ttl` after it went
        idle (the reader's mapping keeps its pages until it lets go too)."""
        while True:
            changed = self._event()
            if not self._idle:
                await changed.wait()
                continue
            segment_id, (segment, since) = next(iter(self._idle.items()))
            wait = since + self.idle_ttl - anyio.current_time()
            if wait > 0:
                with anyio.move_on_after(wait):
                    await changed.wait()
                continue
            del self._idle[segment_id]
            await _close([segment])
            self._notify()

    async def changed(self) -> None:
        """Wait for the next change: a segment taken, made, kept, closed or expired."""
        await self._event().wait()

    async def close(self) -> None:
        """Close the idle segments (the worker is stopping; reads in use close their own)."""
        idle = [segment for segment, _ in self._idle.values()]
        self._idle.clear()
        await _close(idle)

    def _event(self) -> anyio.Event:
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


async def _close(segments: list[Segment]) -> None:
    if segments:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_close_now, segments)


def _close_now(segments: list[Segment]) -> None:
    for segment in segments:
        segment.close()


__all__ = ["SegmentPool"]
