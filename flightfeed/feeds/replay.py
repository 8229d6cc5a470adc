"""A query's feed partitions kept across its attempts, so a retried attempt replays them.

A retried query runs every task again as a new attempt (coordinator/retries.py). Its feed
partitions must give the new attempt exactly the units the failed one was given, in the same
order, and then carry on where the provider is: a runtime feed cannot be asked again.

So a query that may be retried does not let its task dispatchers pull providers themselves.
Each (feed, global partition) gets one pump task in the query's own task group, which outlives
every attempt: an attempt that fails or is cancelled in the middle of a pull never cancels the
provider's stream (cancelling an async generator mid-`anext` would end it). The pump logs every
unit the provider gives. An attempt reads the partition from the log's start, then asks the pump
for more, never more than its worker's credit allows, so a stalled partition still stops its
provider after the granted window.

Memory: the log holds every unit of a partition until the query ends, up to `log_limit` units
and `log_bytes` bytes; past either, units the current attempt has read are dropped and the
partition cannot be replayed (`unreplayable` says which, so the query fails instead of retrying
with units missing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from ..concurrency import Signal, cancelled_for_real
from ..errors import FeedError
from .dispatcher import DEFAULT_DELIVERY_LOG_BYTES
from .provider import WorkUnitFeedProvider, cancelled_by_itself, close_feed, encode_unit

if TYPE_CHECKING:
    from ..plan.base import TaskContext


class _PartitionLog:
    """One global feed partition of a query: what its provider gave so far, and its end."""

    __slots__ = (
        "base",
        "changed",
        "demand",
        "ended",
        "error",
        "feed_id",
        "nbytes",
        "partition",
        "trimmed",
        "units",
        "wanted",
    )

    def __init__(self, feed_id: bytes, partition: int) -> None:
        self.feed_id = feed_id
        self.partition = partition
        self.units: list[bytes] = []
        self.nbytes = 0  # of `units`
        self.base = 0  # the index of units[0]: units before it were dropped (log limit)
        self.trimmed = False
        self.wanted = 0  # the pump pulls while base + len(units) < wanted
        self.ended = False
        self.error: Exception | None = None
        self.changed = Signal()  # readers wait: a unit, the end or an error
        self.demand = Signal()  # the pump waits: a reader raised `wanted`

    @property
    def pulled(self) -> int:
        return self.base + len(self.units)

    def notify(self) -> None:
        """Wake the readers waiting."""
        self.changed.notify()

    def ask(self, wanted: int) -> None:
        if wanted > self.wanted:
            self.wanted = wanted
            self.demand.notify()

    async def wait_changed(self) -> None:
        await self.changed.wait()

    async def wait_demand(self) -> None:
        await self.demand.wait()

    def __repr__(self) -> str:
        return f"feed {self.feed_id.hex()} partition {self.partition}"


class FeedReplay:
    """The feed partitions of one query, pumped in `tg` (the query's, not an attempt's)."""

    def __init__(
        self, tg: TaskGroup, *, log_limit: int, log_bytes: int = DEFAULT_DELIVERY_LOG_BYTES
    ) -> None:
        if log_limit < 1 or log_bytes < 1:
            raise ValueError("a replay log keeps at least one unit and one byte")
        self._tg = tg
        self._log_limit = log_limit
        self._log_bytes = log_bytes
        self._logs: dict[tuple[bytes, int], _PartitionLog] = {}

    def open(
        self,
        feed_id: bytes,
        partition: int,
        provider: WorkUnitFeedProvider[Any],
        ctx: TaskContext,
        credit: Callable[[], int],
    ) -> AsyncIterator[bytes]:
        """The partition's units for one attempt: every unit logged so far, then new ones.

        The provider is started (with `ctx`) by the first attempt that opens the partition.
        `credit` says how many units the reader may take now (its worker's credit): the pump
        pulls that far ahead, no further. Closing the iterator leaves the provider running.
        """
        key = (feed_id, partition)
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = _PartitionLog(feed_id, partition)
            self._tg.start_soon(
                self._pump, log, provider, ctx, name=f"feed pump {feed_id.hex()}/{partition}"
            )
        return self._read(log, credit)

    def unreplayable(self) -> list[str]:
        """The partitions a new attempt could not replay (their logs went past the limit)."""
        return [
            f"{log} (its log went past {self._log_limit} units or {self._log_bytes} bytes)"
            for log in self._logs.values()
            if log.trimmed
        ]

    def units_logged(self, feed_id: bytes, partition: int) -> int:
        """Units the provider gave this partition so far (every attempt replays them)."""
        log = self._logs.get((feed_id, partition))
        return log.pulled if log is not None else 0

    async def _read(self, log: _PartitionLog, credit: Callable[[], int]) -> AsyncIterator[bytes]:
        index = 0
        while True:
            if index < log.base:
                raise FeedError(
                    f"{log}: {log.base} units were dropped from its replay log (limits"
                    f" {self._log_limit} units, {self._log_bytes} bytes); this attempt cannot be"
                    " given them again"
                )
            if index < log.pulled:
                yield log.units[index - log.base]
                index += 1
                if len(log.units) > self._log_limit or log.nbytes > self._log_bytes:
                    read = log.units[: index - log.base]  # by this attempt: bounded memory
                    del log.units[: index - log.base]
                    log.nbytes -= sum(map(len, read))
                    log.base = index
                    log.trimmed = True
                continue
            if log.error is not None:
                raise log.error
            if log.ended:
                return
            log.ask(index + max(1, credit()))
            await log.wait_changed()

    async def _pump(
        self, log: _PartitionLog, provider: WorkUnitFeedProvider[Any], ctx: TaskContext
    ) -> None:
        """Pull the provider while a reader wants more, into the log; at the query's end (this
        task cancelled), close its stream."""
        try:
            stream = provider.feed(log.partition, ctx)
        except Exception as exc:
            log.error = exc
            log.notify()
            return
        try:
            while True:
                while log.pulled >= log.wanted:
                    await log.wait_demand()
                try:
                    unit = await anext(stream)
                    body = unit if type(unit) is bytes else encode_unit(unit)
                except StopAsyncIteration:
                    log.ended = True
                    return
                except Exception as exc:  # the provider's, or a unit it cannot send
                    log.error = exc
                    return
                except anyio.get_cancelled_exc_class():
                    if cancelled_for_real():
                        raise
                    log.error = cancelled_by_itself(log)
                    return
                log.units.append(body)
                log.nbytes += len(body)
                log.notify()
        finally:
            close_error = await close_feed(stream)
            if log.error is None and not log.ended:  # (cancelled: the query is over)
                log.error = close_error or FeedError(f"{log}: the query ended")
            log.notify()


__all__ = ["FeedReplay"]
