"""Worker side of work-unit feeds: per-partition buffers filled by the channel, under credits.

One `FeedInbox` per task, built from the SetPlanRequest's feed declarations. The channel loop
calls `deliver` for every WorkUnitBatch (synchronous, never blocks) and forwards
`credit_grants` to the coordinator as FeedCredits; plan nodes read their partitions through
`units`/`bodies`/`decoded` (usually via `WorkUnitFeed.feed`).

Flow control: each (feed, partition) starts with a window of `credits` units granted to the
coordinator. A consumer taking units frees window space, granted back in batches once half the
window is free. So at any moment buffered + in flight + not yet granted == credits, and a
partition nobody reads holds at most `credits` units while the others run at full speed. A
coordinator that knows the window (GetWorkerInfo) presumes it granted (`presumed`, from
SetPlanRequest.presumed_credits) and sends that many units behind the plan; the first grant is
only the rest of the window, so the sum stays the same.

Replayable inboxes (`replay_limit`) keep every unit a consumer took, per partition, up to the
limit: a partition may then be read again (a retried Spark task) and yields the same units in
the same order, the logged ones first, then the live ones where the last reader left off. A
reader that leaves early does not end its partition: the next one continues it.

Memory: with `reserve_from`, the units' bytes are reserved from the task's memory (the
worker's pool) as they arrive, before they are kept, and given back as consumers take them;
a replay log keeps its reservation until the task ends, or until it passes the replay limit and
is dropped. Credits bound the units; this bounds their bytes: a batch the budget cannot hold
fails the task with RESOURCE_EXHAUSTED naming the feed inbox.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar, cast

import anyio

from .._generated.flightfeed.v1 import (
    FeedCredits,
    Label,
    Metric,
    NamedCount,
    PartitionCredit,
    PercentileLatency,
    SetPlanRequestWorkUnitFeedDeclaration,
    WorkUnitBatch,
)
from ..errors import FeedError, FlightfeedError, InvalidArgument
from ..plan.memory import MemoryReservation
from ..plan.metrics_wire import (
    COUNT_TAG,
    P50_LATENCY_TAG,
    SKETCH_BYTES_TAG,
    encode_metric,
    named_bytes,
    named_value,
)
from ..protocol.errors import from_detail
from .codec import DecodedRun, decode_batch
from .latency import LatencyHistogram, Percentiles

T = TypeVar("T")

DEFAULT_CREDITS: Final = 64
MAX_FEED_WINDOW: Final = 1 << 16
"""Upper bound on a partition's credit window (WorkerConfig.feed_credits, presumed credits)."""
MAX_DECLARED_PARTITIONS: Final = 1 << 16
"""Upper bound on the partitions one task may declare: each gets a buffer and a grant."""


class ReceivedUnit(NamedTuple):
    """One work unit as a consumer takes it: its encoded body and its four timestamps."""

    body: bytes
    created_ns: int
    sent_ns: int
    received_ns: int
    processed_ns: int


@dataclass(frozen=True, slots=True)
class PartitionFeedMetrics:
    """What one (feed, partition) received and consumed, and how long units took to get there."""

    received: int
    consumed: int
    buffered: int
    created_to_received: Percentiles
    created_to_processed: Percentiles


class _Slot:
    """State of one declared (feed, partition)."""

    __slots__ = (
        "available",
        "buffered",
        "claimed",
        "completed",
        "consumed",
        "ended",
        "error",
        "feed_id",
        "finished",
        "front_taken",
        "held",
        "log",
        "log_bytes",
        "log_dropped",
        "partition",
        "pending_grant",
        "processed_latency",
        "received",
        "received_latency",
        "runs",
        "waiter",
    )

    def __init__(self, feed_id: bytes, partition: int, credits: int) -> None:
        self.feed_id = feed_id
        self.partition = partition
        self.runs: deque[tuple[DecodedRun, int]] = deque()
        self.front_taken = 0  # units of runs[0] already taken
        self.buffered = 0
        self.available = credits  # credit the coordinator holds (granted, not yet used)
        self.pending_grant = 0  # taken by the consumer, not yet granted back
        self.received = 0
        self.consumed = 0
        self.ended = False
        self.error: FeedError | None = None
        self.claimed = False
        self.finished = False  # the consumer is gone: read the end, failed or stopped early
        self.completed = False  # a consumer read the partition to its end
        self.log: list[ReceivedUnit] | None = None  # replayable: every unit taken so far
        self.log_bytes = 0  # bytes of the runs taken into the log (reserved until it goes)
        self.log_dropped = False
        self.held = 0  # bytes of the runs buffered (reserved while they are)
        self.waiter: anyio.Event | None = None
        self.received_latency = LatencyHistogram()
        self.processed_latency = LatencyHistogram()

    def wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()
            self.waiter = None

    def __repr__(self) -> str:
        return f"feed {self.feed_id.hex()} partition {self.partition}"


class CreditGrants:
    """The inbox's outgoing credits, coalesced per partition: at most one entry each.

    `async for credits in inbox.credit_grants` yields FeedCredits messages ready to send; it
    ends once every partition has finished and its last grant was taken, or the inbox failed
    or closed. Coalescing (instead of a queue of single grants) bounds the memory by the
    partition count and never blocks a consumer on a slow channel.
    """

    def __init__(self) -> None:
        self._pending: dict[_Slot, PartitionCredit] = {}
        self._waiter: anyio.Event | None = None
        self._closed = False

    def _add(self, slot: _Slot, credits: int, *, finished: bool = False) -> None:
        if self._closed:
            return
        entry = self._pending.get(slot)
        if entry is None:
            self._pending[slot] = PartitionCredit(
                id=slot.feed_id, partition=slot.partition, credits=credits, finished=finished
            )
        else:
            entry.credits += credits
            entry.finished = entry.finished or finished
        self._notify()

    def _close(self, *, drop: bool) -> None:
        self._closed = True
        if drop:
            self._pending.clear()
        self._notify()

    def _notify(self) -> None:
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    def pending(self) -> int:
        """Partitions with a grant waiting to be sent."""
        return len(self._pending)

    def take_nowait(self) -> FeedCredits | None:
        """The grants waiting now, or None."""
        if not self._pending:
            return None
        credits, self._pending = list(self._pending.values()), {}
        return FeedCredits(credits=credits)

    async def receive(self) -> FeedCredits:
        """The next grants to send; anyio.EndOfStream when no more can come."""
        while True:
            taken = self.take_nowait()
            if taken is not None:
                await anyio.lowlevel.checkpoint()
                return taken
            if self._closed:
                raise anyio.EndOfStream
            self._waiter = anyio.Event()
            await self._waiter.wait()

    def __aiter__(self) -> CreditGrants:
        return self

    async def __anext__(self) -> FeedCredits:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


def check_presumed_credits(presumed: int) -> None:
    """Refuse a presumed window no worker would grant (it would bound nothing)."""
    if presumed > MAX_FEED_WINDOW:
        raise InvalidArgument(
            f"the SetPlanRequest presumes {presumed} feed credits per partition; at most"
            f" {MAX_FEED_WINDOW} may be presumed"
        )


class FeedInbox:
    """Units the coordinator streams to one task, buffered per (feed, partition)."""

    def __init__(
        self,
        declarations: Iterable[tuple[bytes, int]],
        *,
        credits: int = DEFAULT_CREDITS,
        presumed: int = 0,
        replay_limit: int | None = None,
    ) -> None:
        """`presumed`: credits per partition the coordinator counts as granted already (at
        most `credits`); the first grant is the rest of the window."""
        if not 1 <= credits <= MAX_FEED_WINDOW:
            raise InvalidArgument(f"feed credits must be in 1..{MAX_FEED_WINDOW}, got {credits}")
        if not 0 <= presumed <= credits:
            raise InvalidArgument(f"presumed credits must be in 0..{credits}, got {presumed}")
        if replay_limit is not None and replay_limit < 0:
            raise InvalidArgument(f"replay_limit must be 0 or more, got {replay_limit}")
        self.credits = credits
        self.replay_limit = replay_limit
        self._threshold = max(1, credits // 2)
        self._slots: dict[tuple[bytes, int], _Slot] = {}
        self._open = 0  # slots whose consumer has not finished
        self._failure: FeedError | None = None
        self._memory: MemoryReservation | None = None
        self.credit_grants = CreditGrants()
        total = 0
        self._feeds: set[bytes] = set()
        for feed_id, partitions in declarations:
            if not feed_id or partitions < 0:
                raise InvalidArgument(f"invalid feed declaration {feed_id.hex()}:{partitions}")
            if feed_id in self._feeds:
                raise InvalidArgument(f"feed {feed_id.hex()} declared twice")
            self._feeds.add(feed_id)
            total += partitions
            if total > MAX_DECLARED_PARTITIONS:
                raise InvalidArgument(
                    f"feeds declare more than {MAX_DECLARED_PARTITIONS} partitions in one task"
                )
            for partition in range(partitions):
                slot = self._slots[(feed_id, partition)] = _Slot(feed_id, partition, credits)
                if replay_limit is not None:
                    slot.log = []
                if credits > presumed:
                    self.credit_grants._add(slot, credits - presumed)
        self._open = len(self._slots)
        if not self._slots:
            self.credit_grants._close(drop=False)

    @classmethod
    def from_declarations(
        cls,
        declarations: Sequence[SetPlanRequestWorkUnitFeedDeclaration],
        *,
        credits: int = DEFAULT_CREDITS,
        presumed: int = 0,
        replay_limit: int | None = None,
    ) -> FeedInbox:
        """The inbox for a SetPlanRequest's `work_unit_feed_declarations`."""
        pairs = [(d.id, d.partitions) for d in declarations]
        return cls(pairs, credits=credits, presumed=presumed, replay_limit=replay_limit)

    def reserve_from(self, memory: MemoryReservation) -> None:
        """Reserve buffered units' bytes (and replay logs') from `memory` from now on."""
        self._memory = memory

    def _release(self, nbytes: int) -> None:
        if self._memory is not None:
            self._memory.shrink(nbytes)

    # -- channel side ------------------------------------------------------------------------

    def deliver(self, batch: WorkUnitBatch, received_ns: int | None = None) -> None:
        """Route a batch to its partitions. Never blocks.

        A malformed batch, units or ends for undeclared or ended partitions, and units beyond
        the granted credit are protocol violations: FeedError, and the inbox fails with it.
        """
        if self._failure is not None:
            raise self._failure
        try:
            self._deliver(batch, time.time_ns() if received_ns is None else received_ns)
        except FeedError as error:
            self.fail(error)
            raise

    def _deliver(self, batch: WorkUnitBatch, received_ns: int) -> None:
        decoded = decode_batch(batch)
        # Decide first (validate the whole batch), then change state.
        runs = [(self._slot_for(run.feed_id, run.partition), run) for run in decoded.runs]
        counts: dict[_Slot, int] = {}
        for slot, run in runs:
            counts[slot] = counts.get(slot, 0) + len(run)
        for slot, n in counts.items():
            if slot.ended or slot.error is not None:
                raise FeedError(f"protocol violation: units for {slot} after its end")
            if n > slot.available:
                raise FeedError(
                    f"protocol violation: {n} units for {slot} with only {slot.available} credits"
                )
        closing: dict[_Slot, FeedError | None] = {}
        marks: list[tuple[bytes, int, FeedError | None]]
        marks = [(end.id, end.partition, None) for end in decoded.ends]
        marks += [(e.id, e.partition, _feed_error(e.error)) for e in decoded.errors]
        for feed_id, partition, err in marks:
            slot = self._slot_for(feed_id, partition)
            if slot.ended or slot.error is not None or slot in closing:
                raise FeedError(f"protocol violation: {slot} ended twice")
            closing[slot] = err
        if self._memory is not None:  # the last check: reserve, or change nothing
            self._memory.grow(sum(len(run.bodies) for slot, run in runs if not slot.finished))
        for slot, run in runs:
            n = len(run)
            slot.available -= n
            slot.received += n
            slot.received_latency.add_since(run.created_ns, received_ns)
            if not slot.finished:
                slot.runs.append((run, received_ns))
                slot.buffered += n
                slot.held += len(run.bodies)
            slot.wake()
        for slot, err in closing.items():
            if err is None:
                slot.ended = True
            else:
                slot.error = err
            slot.wake()

    def _slot_for(self, feed_id: bytes, partition: int) -> _Slot:
        slot = self._slots.get((feed_id, partition))
        if slot is None:
            raise FeedError(
                f"protocol violation: feed {feed_id.hex()} partition {partition} was not declared"
            )
        return slot

    def fail(self, error: BaseException) -> None:
        """The channel died (or broke the protocol): every consumer fails with a FeedError."""
        if self._failure is not None:
            return
        if isinstance(error, FeedError):
            failure = error
        else:
            message = error.message if isinstance(error, FlightfeedError) else str(error)
            failure = FeedError(f"work-unit feed channel failed: {message or type(error).__name__}")
            failure.__cause__ = error
        self._failure = failure
        self.credit_grants._close(drop=True)
        for slot in self._slots.values():
            self._release(slot.held)
            slot.held = 0
            slot.runs.clear()
            slot.front_taken = 0
            slot.buffered = 0
            slot.wake()

    def sender_done(self) -> None:
        """The coordinator will send nothing more: partitions it did not end fail now (their
        consumers would otherwise wait for units that cannot come); buffered units still drain."""
        for slot in self._slots.values():
            if not slot.ended and slot.error is None:
                slot.error = FeedError(
                    f"{slot}: the coordinator closed the channel before the feed ended"
                )
                slot.wake()

    def close(self) -> None:
        """No more grants will be sent (the task is over); consumers still drain their buffers."""
        self.credit_grants._close(drop=True)

    # -- consumer side -----------------------------------------------------------------------

    def units(self, feed_id: bytes, partition: int) -> AsyncIterator[ReceivedUnit]:
        """The units of one partition with their timestamps; FeedError on a feed error."""
        slot = self._claim(feed_id, partition)
        return cast(AsyncIterator[ReceivedUnit], self._iterate(slot, full=True))

    def bodies(self, feed_id: bytes, partition: int) -> AsyncIterator[bytes]:
        """The encoded bodies of one partition's units: the fastest way to read."""
        return cast(AsyncIterator[bytes], self._iterate(self._claim(feed_id, partition)))

    def decoded(
        self, feed_id: bytes, partition: int, decode: Callable[[bytes], T]
    ) -> AsyncIterator[T]:
        """One partition's units, each body passed through `decode` as it is taken."""
        slot = self._claim(feed_id, partition)
        return cast(AsyncIterator[T], self._iterate(slot, decode=decode))

    def _claim(self, feed_id: bytes, partition: int) -> _Slot:
        """One consumer per partition: units are taken, so a second reader would miss some."""
        slot = self._slots.get((feed_id, partition))
        if slot is None and feed_id not in self._feeds:
            raise FeedError(
                f"feed {feed_id.hex()} was not declared to this task: the coordinator did not"
                " find it. Register the node type that holds it in the Coordinator's"
                " FeedRegistry (feed_registry=...)"
            )
        if slot is None:
            raise FeedError(f"feed {feed_id.hex()} partition {partition} is not declared here")
        if slot.log_dropped:
            raise FeedError(
                f"{slot} cannot be read again: it took more than {self.replay_limit} units,"
                " past the replay limit (raise it to replay longer partitions)"
            )
        if slot.claimed and slot.log is not None:
            raise FeedError(f"{slot} is being read: a concurrent second read cannot be replayed")
        if slot.claimed:
            raise FeedError(f"{slot} already has a consumer")
        if self._failure is not None:
            raise self._failure
        slot.claimed = True
        return slot

    async def _iterate(
        self, slot: _Slot, *, full: bool = False, decode: Callable[[bytes], Any] | None = None
    ) -> AsyncIterator[Any]:
        """The hot loop of a consumer: a few list lookups and counters per unit."""
        time_ns = time.time_ns
        threshold = self._threshold
        processed = slot.processed_latency
        add_latency = processed.appender
        log = slot.log
        complete = False
        try:
            if log:  # a replay: the units an earlier reader took, as it took them
                for unit in list(log):
                    if self._failure is not None:
                        raise self._failure
                    if full:
                        yield unit
                    elif decode is not None:
                        yield decode(unit.body)
                    else:
                        yield unit.body
            while True:
                if not slot.runs:
                    if not await self._wait(slot):
                        complete = True
                        return
                    continue
                processed.settle()
                run, received_ns = slot.runs[0]
                bodies, ends, created, sent_ns = run.bodies, run.ends, run.created_ns, run.sent_ns
                first = slot.front_taken  # a reader that left early may have taken some
                begin = ends[first - 1] if first else 0
                for i in range(first, len(ends)):
                    if self._failure is not None:
                        raise self._failure
                    end = ends[i]
                    body = bodies[begin:end]
                    begin = end
                    now = time_ns()
                    add_latency(now - created[i])
                    slot.buffered -= 1
                    slot.consumed += 1
                    slot.pending_grant += 1
                    if slot.pending_grant >= threshold:
                        self._grant(slot)
                    if log is not None:
                        log.append(ReceivedUnit(body, created[i], sent_ns, received_ns, now))
                        if len(log) > (self.replay_limit or 0):
                            log = slot.log = None  # bounded memory beats replayability
                            slot.log_dropped = True
                            self._release(slot.log_bytes)
                            slot.log_bytes = 0
                    slot.front_taken = i + 1
                    if full:
                        yield ReceivedUnit(body, created[i], sent_ns, received_ns, now)
                    elif decode is not None:
                        yield decode(body)
                    else:
                        yield body
                slot.runs.popleft()
                slot.front_taken = 0
                slot.held -= len(bodies)
                if log is not None:  # its units live on in the log, and so does the reservation
                    slot.log_bytes += len(bodies)
                else:
                    self._release(len(bodies))
        finally:
            if slot.log is not None:
                self._leave(slot, complete=complete)
            else:  # read once (or past the replay limit): nobody can read it again
                self._finish(slot)

    def _leave(self, slot: _Slot, *, complete: bool) -> None:
        """A reader of a replayable partition is gone: the partition stays for the next one,
        and its units keep coming unless it was read to its end."""
        slot.claimed = False
        if complete and not slot.completed:
            slot.completed = True
            self._finish(slot)

    async def _wait(self, slot: _Slot) -> bool:
        """Wait for units; False at the end of the partition, FeedError on a failure."""
        while not slot.runs:
            if self._failure is not None:
                raise self._failure
            if slot.error is not None:
                raise slot.error
            if slot.ended:
                return False
            slot.waiter = anyio.Event()
            await slot.waiter.wait()
        return True

    def _grant(self, slot: _Slot) -> None:
        slot.available += slot.pending_grant
        self.credit_grants._add(slot, slot.pending_grant)
        slot.pending_grant = 0

    def _finish(self, slot: _Slot) -> None:
        """The consumer is gone for good: free its buffer, and tell the coordinator to stop
        the provider."""
        if slot.finished:
            return
        slot.finished = True
        self._release(slot.held)
        slot.held = 0
        slot.runs.clear()
        slot.front_taken = 0
        slot.buffered = 0
        self._open -= 1
        if self._failure is None:
            self.credit_grants._add(slot, 0, finished=True)
            if self._open == 0:
                self.credit_grants._close(drop=False)

    # -- metrics -----------------------------------------------------------------------------

    @property
    def buffered_units(self) -> int:
        """Units received, not yet taken, over all partitions (never above credits * partitions)."""
        return sum(slot.buffered for slot in self._slots.values())

    def partition_metrics(self, feed_id: bytes, partition: int) -> PartitionFeedMetrics:
        slot = self._slots.get((feed_id, partition))
        if slot is None and feed_id not in self._feeds:
            raise FeedError(
                f"feed {feed_id.hex()} was not declared to this task: the coordinator did not"
                " find it. Register the node type that holds it in the Coordinator's"
                " FeedRegistry (feed_registry=...)"
            )
        if slot is None:
            raise FeedError(f"feed {feed_id.hex()} partition {partition} is not declared here")
        return PartitionFeedMetrics(
            received=slot.received,
            consumed=slot.consumed,
            buffered=slot.buffered,
            created_to_received=slot.received_latency.percentiles(),
            created_to_processed=slot.processed_latency.percentiles(),
        )

    def metrics(self) -> dict[tuple[bytes, int], PartitionFeedMetrics]:
        """Per (feed id, partition): counts and latency percentiles."""
        return {key: self.partition_metrics(*key) for key in self._slots}

    def to_metrics(self) -> list[Metric]:
        """The feed metrics as TaskMetrics entries, labelled with the feed id per partition.

        Counts are NamedCounts; each latency is one PercentileLatency sketch (the sorted
        samples, or 101 quantiles of them when there are more) under custom_p50_latency. The
        sketch holds the whole distribution, so readers take p95 and p99 from the same one:
        sending it again under custom_p95/p99_latency tripled the largest part of TaskMetrics
        for nothing. This typed form is the reference: what a task sends is
        `encoded_metrics()`, held byte-equal to it by tests/unit/feeds/test_feed_metrics_wire.py.
        """
        out: list[Metric] = []
        for (feed_id, partition), slot in self._slots.items():
            where: dict[str, Any] = {
                "labels": [Label(name="feed", value=feed_id.hex())],
                "partition": partition,
            }
            for name, value in (
                ("feed_units_received", slot.received),
                ("feed_units_consumed", slot.consumed),
            ):
                out.append(Metric(count=NamedCount(name=name, value=value), **where))
            for name, hist in (
                ("feed_created_to_received", slot.received_latency),
                ("feed_created_to_processed", slot.processed_latency),
            ):
                sketch = PercentileLatency(name=name, sketch_bytes=hist.sketch())
                out.append(Metric(custom_p50_latency=sketch, **where))
        return out

    def encoded_metrics(self) -> bytes:
        """`to_metrics()` as MetricsSet entries in wire form, written directly: building and
        encoding the 4 messages of each partition as objects cost a small query's worker 5%
        of its CPU. tests/unit/feeds/test_feed_metrics_wire.py holds the two forms equal."""
        out = bytearray()
        for (feed_id, partition), slot in self._slots.items():
            labels = (("feed", feed_id.hex()),)
            for name, value in (
                ("feed_units_received", slot.received),
                ("feed_units_consumed", slot.consumed),
            ):
                count = named_value(name, value)
                out += encode_metric(COUNT_TAG, count, labels=labels, partition=partition)
            for name, hist in (
                ("feed_created_to_received", slot.received_latency),
                ("feed_created_to_processed", slot.processed_latency),
            ):
                sketch = named_bytes(name, SKETCH_BYTES_TAG, hist.sketch())
                out += encode_metric(P50_LATENCY_TAG, sketch, labels=labels, partition=partition)
        return bytes(out)


def _feed_error(detail: Any) -> FeedError:
    """A provider's error as its consumer sees it: a FeedError, message and origin kept."""
    if detail is None:
        return FeedError("work-unit feed provider failed (no detail)")
    original = from_detail(detail)
    if isinstance(original, FeedError):
        return original
    return FeedError(original.message, origin=original.origin, error_type=original.error_type)
