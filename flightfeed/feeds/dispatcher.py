"""Coordinator side of work-unit feeds: pull providers under credit, pack units into batches.

One `FeedDispatcher` per task channel. `run()` starts one pull loop per (feed, partition) and a
packer, all in one task group. A pull loop takes a unit from its provider only while it holds
credit for its partition, so a partition whose consumer stalls stops its provider after the
window the worker granted; the others keep going. The packer gathers pulled units of every
partition into WorkUnitBatch messages bounded by count and bytes, waiting at most `linger` for
a batch to fill, and not at all once no pull loop can add to it.

Memory is bounded by the credits: a loop never holds more than its partition's credit in
pulled-but-unsent units. Sent units are logged per partition until the worker reports the
partition finished (or `partition_done`), so a retried task attempt can replay them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import anyio

from .._generated.flightfeed.v1 import (
    ErrorDetail,
    FeedCredits,
    FeedPartitionEnd,
    FeedPartitionError,
    SetPlanRequestWorkUnitFeedDeclaration,
    WorkUnit,
    WorkUnitBatch,
)
from ..concurrency import cancelled_for_real
from ..errors import ErrorOrigin, FeedError, InvalidArgument, as_flightfeed_error
from ..protocol.errors import to_detail
from .codec import UnitRun, encode_batch
from .provider import (
    WorkUnitFeedProvider,
    cancelled_by_itself,
    close_feed,
    encode_unit,
    provider_metrics,
)

if TYPE_CHECKING:
    from ..plan.base import TaskContext

DEFAULT_MAX_BATCH_UNITS: Final = 256
DEFAULT_MAX_BATCH_BYTES: Final = 1 << 20
DEFAULT_LINGER_SECONDS: Final = 0.001
PROVIDER_COMPONENT: Final = "feed provider"
"""The component a provider's errors name: they happened on the coordinator, not a worker."""

SendBatch = Callable[[WorkUnitBatch], Awaitable[None]]
OpenFeed = Callable[
    [bytes, int, "WorkUnitFeedProvider[Any]", "TaskContext", Callable[[], int]],
    AsyncIterator[Any],
]
"""Opens a (feed id, global partition) for a dispatcher given its provider, its task context and
the partition's credit now: a query that may be retried replays through one (feeds/replay.py)."""


class FeedAssignment(NamedTuple):
    """A feed's provider and the global partitions one task owns, by local index 0..n-1."""

    provider: WorkUnitFeedProvider[Any]
    partitions: Sequence[int]


@dataclass(frozen=True, slots=True)
class PartitionSendMetrics:
    units_pulled: int
    units_sent: int
    credit: int
    finished: bool


class _Out:
    """State of one (feed, local partition) on the coordinator."""

    __slots__ = (
        "bodies",
        "created",
        "credit",
        "end_pending",
        "error_pending",
        "feed_id",
        "finished",
        "global_partition",
        "log",
        "log_dropped",
        "logged",
        "logged_bytes",
        "mark_sent",
        "partition",
        "pending_bytes",
        "provider",
        "pulled",
        "scope",
        "sent",
        "waiter",
    )

    def __init__(
        self,
        feed_id: bytes,
        partition: int,
        global_partition: int,
        provider: Any,
        log: bool,
        credit: int,
    ) -> None:
        self.feed_id = feed_id
        self.partition = partition
        self.global_partition = global_partition
        self.provider = provider
        self.credit = credit
        self.waiter: anyio.Event | None = None
        self.bodies: list[bytes] = []  # pulled, not yet packed
        self.created: list[int] = []
        self.pending_bytes = 0
        self.end_pending = False
        self.error_pending: ErrorDetail | None = None
        self.mark_sent = False  # the end or error went out
        self.finished = False  # the worker is done with it (or partition_done)
        self.pulled = 0
        self.sent = 0
        self.log: list[tuple[list[bytes], list[int], int]] | None = [] if log else None
        self.logged = 0
        self.logged_bytes = 0
        self.log_dropped = False  # went past the log limit: this partition cannot be replayed
        self.scope: anyio.CancelScope | None = None

    @property
    def has_mark(self) -> bool:
        return not self.mark_sent and (self.end_pending or self.error_pending is not None)

    def __repr__(self) -> str:
        return f"feed {self.feed_id.hex()} partition {self.partition}"


DEFAULT_DELIVERY_LOG_LIMIT = 100_000
"""Units logged per partition for replay; past it the log is dropped so memory stays bounded."""
DEFAULT_DELIVERY_LOG_BYTES = 64 << 20
"""Bytes of units logged per partition for replay: units that carry data (200 KB each) grew a
coordinator by 4 GB in 12 s within the unit count, past anything the credits allow."""


class FeedDispatcher:
    """Streams one task's feed partitions to its worker under the worker's credits."""

    def __init__(
        self,
        feeds: Mapping[bytes, FeedAssignment],
        send: SendBatch,
        ctx: TaskContext,
        *,
        max_batch_units: int = DEFAULT_MAX_BATCH_UNITS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger: float = DEFAULT_LINGER_SECONDS,
        keep_log: bool = True,
        log_limit: int = DEFAULT_DELIVERY_LOG_LIMIT,
        log_bytes: int = DEFAULT_DELIVERY_LOG_BYTES,
        packed: bool = True,
        origin: ErrorOrigin | None = None,
        open_feed: OpenFeed | None = None,
        presumed_credits: int = 0,
    ) -> None:
        """`open_feed`: where a partition's units come from (default: `provider.feed`).
        `presumed_credits`: units per partition sent before the worker's first grant (the
        window it reported; the SetPlanRequest says so), saving the task a round trip."""
        if max_batch_units < 1 or max_batch_bytes < 1 or linger < 0 or presumed_credits < 0:
            raise InvalidArgument(
                "feed batches need max units ≥ 1, max bytes ≥ 1, linger ≥ 0, presumed credits ≥ 0"
            )
        self._send = send
        self._ctx = ctx
        self._origin = origin or ErrorOrigin()  # providers run here, on the coordinator
        self._max_units = max_batch_units
        self._max_bytes = max_batch_bytes
        self._linger = linger
        self._packed = packed
        self._open_feed = open_feed
        self._log_limit = log_limit
        self._log_bytes = log_bytes
        self._feeds = dict(feeds)
        self._slots: dict[tuple[bytes, int], _Out] = {}
        for feed_id, (provider, partitions) in self._feeds.items():
            for local, global_partition in enumerate(partitions):
                self._slots[(feed_id, local)] = _Out(
                    feed_id, local, global_partition, provider, keep_log, presumed_credits
                )
        self._dirty: dict[_Out, None] = {}  # slots with pulled units or a mark, in arrival order
        self._pending_units = 0
        self._pending_bytes = 0
        self._running = 0  # pull loops that may still add units without new credit
        self._live = 0  # pull loops not yet exited
        self._packer_waiter: anyio.Event | None = None
        self._wake_units = 1
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False

    def declarations(self) -> list[SetPlanRequestWorkUnitFeedDeclaration]:
        """The SetPlanRequest's work_unit_feed_declarations for this task."""
        return [
            SetPlanRequestWorkUnitFeedDeclaration(id=feed_id, partitions=len(a.partitions))
            for feed_id, a in self._feeds.items()
        ]

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Pull and send until every partition ended or finished; `cancel()` stops it early.

        Errors of `send` (the channel) propagate; provider errors go to their partition's
        consumer on the worker and end only that partition.
        """
        if self._cancelled:
            return
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            for slot in self._slots.values():
                self._live += 1
                self._running += 1
                tg.start_soon(self._pull, slot, name=f"feed pull {slot}")
            try:
                await self._pack()
            except Exception as exc:  # re-raised as is, not wrapped in an ExceptionGroup
                failure = exc
                tg.cancel_scope.cancel()
            # (A packer that returned saw every pull loop exit: nothing is left to cancel.)
        self._scope = None
        if failure is not None:
            raise failure

    def cancel(self) -> None:
        """Stop every pull loop (closing the providers) and the packer."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    async def _pull(self, slot: _Out) -> None:
        try:
            with anyio.CancelScope() as scope:
                slot.scope = scope
                # The provider starts with the partition's first credit: presumed (the worker
                # builds its buffers before it reads the units behind its plan) or granted.
                if slot.credit <= 0:
                    await self._await_credit(slot)
                if slot.finished:
                    return
                try:
                    stream = self._open(slot)
                except Exception as exc:
                    self._provider_failed(slot, exc)
                    return
                try:
                    await self._pull_units(slot, stream)
                except Exception as exc:
                    self._provider_failed(slot, exc)
                except anyio.get_cancelled_exc_class():
                    if cancelled_for_real():
                        raise
                    self._provider_failed(slot, cancelled_by_itself(slot))
                finally:
                    close_error = await close_feed(stream)
                    if close_error is not None:
                        self._provider_failed(slot, close_error)
        finally:
            slot.scope = None  # ended: `_finish` has nothing to cancel
            self._live -= 1
            self._running -= 1
            self._wake_packer()

    def _open(self, slot: _Out) -> AsyncIterator[Any]:
        if self._open_feed is None:
            stream: AsyncIterator[Any] = slot.provider.feed(slot.global_partition, self._ctx)
            return stream
        return self._open_feed(
            slot.feed_id, slot.global_partition, slot.provider, self._ctx, lambda: slot.credit
        )

    async def _pull_units(self, slot: _Out, stream: AsyncIterator[Any]) -> None:
        """The per-unit hot loop: credit, pull, encode, stamp, queue."""
        time_ns = time.time_ns
        while True:
            if slot.credit <= 0:
                await self._await_credit(slot)
            try:
                unit = await anext(stream)
            except StopAsyncIteration:
                break
            body = unit if type(unit) is bytes else encode_unit(unit)
            if slot.finished:
                return
            slot.credit -= 1
            slot.pulled += 1
            if not slot.bodies:
                self._dirty[slot] = None
            slot.bodies.append(body)
            slot.created.append(time_ns())
            slot.pending_bytes += len(body)
            self._pending_units += 1
            self._pending_bytes += len(body)
            if self._packer_waiter is not None and (
                self._pending_units >= self._wake_units or self._pending_bytes >= self._max_bytes
            ):
                self._wake_packer()
        if not slot.finished:
            slot.end_pending = True
            self._dirty[slot] = None

    async def _await_credit(self, slot: _Out) -> None:
        self._running -= 1
        if self._running == 0:
            self._wake_packer()  # nothing more can arrive without credit: stop lingering
        try:
            while slot.credit <= 0:
                slot.waiter = anyio.Event()
                await slot.waiter.wait()
        finally:
            self._running += 1

    def _provider_failed(self, slot: _Out, exc: Exception) -> None:
        """The partition ends with the provider's error (unless its end already went out)."""
        if not slot.finished and not slot.mark_sent:
            error = as_flightfeed_error(exc, PROVIDER_COMPONENT)
            error.locate(self._origin.with_component(PROVIDER_COMPONENT))
            slot.error_pending = to_detail(error)
            self._dirty[slot] = None

    def _wake_packer(self) -> None:
        if self._packer_waiter is not None:
            self._packer_waiter.set()
            self._packer_waiter = None

    async def _wait_packer(self, wake_units: int) -> None:
        self._wake_units = wake_units
        self._packer_waiter = anyio.Event()
        await self._packer_waiter.wait()

    def _full(self) -> bool:
        return self._pending_units >= self._max_units or self._pending_bytes >= self._max_bytes

    async def _pack(self) -> None:
        """Send batches until every pull loop has exited and everything went out."""
        while True:
            if not self._dirty:
                if self._live == 0:
                    return
                await self._wait_packer(1)
                continue
            if self._running > 0 and not self._full() and self._linger > 0:
                with anyio.move_on_after(self._linger):
                    while self._running > 0 and not self._full():
                        await self._wait_packer(self._max_units)
            batch = self._take_batch()
            if batch is not None:
                await self._send(batch)

    def _take_batch(self) -> WorkUnitBatch | None:
        """Up to max units/bytes of pulled units, oldest partitions first, with due marks."""
        runs: list[UnitRun] = []
        ends: list[FeedPartitionEnd] = []
        errors: list[FeedPartitionError] = []
        units = nbytes = 0
        taken: list[tuple[_Out, list[bytes], list[int]]] = []
        for slot in list(self._dirty):
            if slot.bodies:
                room = self._max_units - units
                if room <= 0 or nbytes >= self._max_bytes:
                    break
                count = self._fit(slot, room, self._max_bytes - nbytes, first=not units)
                if count == 0:
                    break
                bodies, created = slot.bodies[:count], slot.created[:count]
                del slot.bodies[:count], slot.created[:count]
                size = sum(map(len, bodies))
                slot.pending_bytes -= size
                units += count
                nbytes += size
                runs.append(UnitRun(slot.feed_id, slot.partition, bodies, created))
                taken.append((slot, bodies, created))
            if not slot.bodies:
                if slot.has_mark:
                    slot.mark_sent = True
                    if slot.error_pending is not None:
                        errors.append(
                            FeedPartitionError(
                                id=slot.feed_id, partition=slot.partition, error=slot.error_pending
                            )
                        )
                    else:
                        ends.append(FeedPartitionEnd(id=slot.feed_id, partition=slot.partition))
                del self._dirty[slot]
            else:  # partly taken: to the back of the line
                del self._dirty[slot]
                self._dirty[slot] = None
        self._pending_units -= units
        self._pending_bytes -= nbytes
        if not (runs or ends or errors):
            return None
        sent_ns = time.time_ns()
        for slot, bodies, created in taken:
            slot.sent += len(bodies)
            if slot.log is not None:
                slot.logged += len(bodies)
                slot.logged_bytes += sum(map(len, bodies))
                if slot.logged > self._log_limit or slot.logged_bytes > self._log_bytes:
                    # bounded memory beats replayability
                    slot.log = None
                    slot.log_dropped = True
                else:
                    slot.log.append((bodies, created, sent_ns))
        return encode_batch(runs, sent_ns, ends, errors, packed=self._packed)

    def _fit(self, slot: _Out, room: int, byte_room: int, *, first: bool) -> int:
        """How many of the slot's pulled units fit; a lone oversized unit still goes alone."""
        count = min(room, len(slot.bodies))
        if slot.pending_bytes <= byte_room and count == len(slot.bodies):
            return count
        size = 0
        for i, body in enumerate(slot.bodies[:count]):
            size += len(body)
            if size > byte_room:
                return i if i or not first else 1
        return count

    # -- from the worker ---------------------------------------------------------------------

    def grant(self, credits: FeedCredits) -> None:
        """Apply a FeedCredits message from the worker; FeedError for unknown partitions."""
        for grant in credits.credits:
            slot = self._slots.get((grant.id, grant.partition))
            if slot is None:
                raise FeedError(
                    f"protocol violation: credit for unknown feed {grant.id.hex()}"
                    f" partition {grant.partition}"
                )
            if grant.credits:
                slot.credit += grant.credits
                if slot.waiter is not None:
                    slot.waiter.set()
                    slot.waiter = None
            if grant.finished:
                self._finish(slot)

    def partition_done(self, feed_id: bytes, partition: int) -> None:
        """The partition is finished for good: stop its provider, drop its delivery log."""
        self._finish(self._slot(feed_id, partition))

    def _finish(self, slot: _Out) -> None:
        if slot.finished:
            return
        slot.finished = True
        slot.log = None
        if slot.scope is not None:
            slot.scope.cancel()
        self._pending_units -= len(slot.bodies)
        self._pending_bytes -= slot.pending_bytes
        slot.bodies, slot.created, slot.pending_bytes = [], [], 0
        self._dirty.pop(slot, None)
        self._wake_packer()

    def replay(self, feed_id: bytes, partition: int) -> list[WorkUnit]:
        """Every unit sent for a partition so far, as sent; FeedError once the log is gone."""
        slot = self._slot(feed_id, partition)
        if slot.log_dropped:
            raise FeedError(
                f"{slot}: delivery log dropped past {self._log_limit} units or"
                f" {self._log_bytes} bytes (the partition cannot be replayed; raise the log"
                " limits to keep it)"
            )
        if slot.log is None:
            raise FeedError(f"{slot}: no delivery log (partition finished or logging disabled)")
        return [
            WorkUnit(
                id=feed_id,
                partition=partition,
                body=body,
                created_timestamp_unix_nanos=created,
                sent_timestamp_unix_nanos=sent_ns,
            )
            for bodies, created_ns, sent_ns in slot.log
            for body, created in zip(bodies, created_ns, strict=True)
        ]

    def _slot(self, feed_id: bytes, partition: int) -> _Out:
        slot = self._slots.get((feed_id, partition))
        if slot is None:
            raise FeedError(f"feed {feed_id.hex()} partition {partition} is not in this task")
        return slot

    # -- metrics -----------------------------------------------------------------------------

    def units_sent(self, feed_id: bytes, partition: int) -> int:
        return self._slot(feed_id, partition).sent

    def metrics(self) -> dict[tuple[bytes, int], PartitionSendMetrics]:
        """Per (feed id, local partition): units pulled and sent, credit left, finished."""
        return {
            key: PartitionSendMetrics(s.pulled, s.sent, s.credit, s.finished)
            for key, s in self._slots.items()
        }

    def provider_metrics(self) -> dict[bytes, Mapping[str, int]]:
        """Each feed's provider metrics (providers may omit `metrics()`)."""
        return {feed_id: provider_metrics(a.provider) for feed_id, a in self._feeds.items()}
