"""A feed-backed leaf and a provider for tests and benchmarks: one of each, so every test of
the feed path (and every benchmark of it) drives the same code.

- `UnitProvider`: per partition, `counts[p]` units made lazily (bodies b"<p>:<i>", or one
  constant `body`), or the explicit `units[p]` (bytes or betterproto2 messages). Optional per
  partition: a failure at unit i, a hang, checkpoints before each unit; a pace (`interval`)
  for every partition. It counts what it hands out (`pulls`), notes closed partitions and,
  given a `Probe`, how far each partition ever ran ahead of its consumer.
- `UnitScan`: reads its feed's raw bodies per partition and emits (partition, body, units)
  rows: one per unit, one per `every` units, or (`every=0`) one per partition at its end.
  Stalled partitions never read their feed (encoded in the plan, for a worker in another
  process); a `Probe` (found by name, in this process) gates, slows down and observes them.
- Wiring: `unit_feed_registry`, `unit_session_builder` (for `flightfeed worker
  --session-builder flightfeed.testing.feeds:unit_session_builder`), `unit_coordinator_options`.
- `Waiters`: wait until a predicate holds, re-checked by whoever changes the state.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import anyio
import anyio.lowlevel
import pyarrow as pa

from ..coordinator import Catalog, TaskEstimation, TaskEstimator
from ..errors import InvalidArgument, PlanDecodeError
from ..feeds import FEED_INBOX_KEY, FeedInbox, FeedRegistry, WorkUnitFeed, WorkUnitFeedProvider
from ..plan import DecodeContext, ExecutionPlan, PlanNodeBase, TaskContext, closing
from ..protocol import WorkUnitFeedProto
from ..session import Session, SessionStateBuilder, WorkerQueryContext

UNIT_SCHEMA = pa.schema([("partition", pa.int64()), ("body", pa.binary()), ("units", pa.int64())])
COUNT_AT_END = 0
"""`UnitScan(every=COUNT_AT_END)`: one row per partition, at its end, with its unit count."""


class StartBarrier:
    """Opens once `count` feeds have started. Given to UnitProviders (one per query), it holds
    every query's feed open until all of them are running at once: a load test's burst."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.arrived = 0
        self._open = anyio.Event()

    def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= self.count:
            self._open.set()

    async def wait(self) -> None:
        await self._open.wait()


class Waiters:
    """Wait until a predicate holds; whoever changes the state calls `check()`."""

    def __init__(self) -> None:
        self._waiting: list[tuple[Callable[[], bool], anyio.Event]] = []

    async def until(self, predicate: Callable[[], bool]) -> None:
        if predicate():
            return
        event = anyio.Event()
        self._waiting.append((predicate, event))
        await event.wait()

    def check(self) -> None:
        if not self._waiting:
            return
        for waiter in list(self._waiting):
            if waiter[0]():
                waiter[1].set()
                self._waiting.remove(waiter)


@dataclass(eq=False)
class Probe:
    """What a test sees of its UnitScan consumers (keyed by global partition)."""

    name: str = field(default_factory=lambda: uuid.uuid4().hex)
    gates: dict[int, anyio.Event] = field(default_factory=dict)
    """A gated partition does not read its feed until its event is set."""
    delays: dict[int, list[int]] = field(default_factory=dict)
    """Per partition, checkpoints to take after each unit (cycled)."""
    consumed: dict[int, int] = field(default_factory=dict)
    max_inbox_buffered: int = 0
    inbox_credits: int = 0


PROBES: dict[str, Probe] = {}


@contextmanager
def probe(**options: Any) -> Iterator[Probe]:
    """A probe that UnitScan nodes of this process find by name, for the block's duration."""
    found = Probe(**options)
    PROBES[found.name] = found
    try:
        yield found
    finally:
        PROBES.pop(found.name, None)


@dataclass(eq=False)
class UnitProvider:
    """Work units per partition, with counters a test can wait on (see the module docstring)."""

    counts: Sequence[int] = ()
    units: Sequence[Sequence[Any]] | None = None
    unit_type: type[Any] = bytes
    body: bytes | None = None
    """One body for every unit: the cheapest provider, for benchmarks (its `pulls` are
    counted when a partition ends or is closed)."""
    probe: Probe | None = None
    delays: Mapping[int, Sequence[int]] = field(default_factory=dict)
    """Per partition, checkpoints to take before each unit (cycled)."""
    fail_at: Mapping[int, tuple[int, str]] = field(default_factory=dict)
    """Per partition, (unit index, message): raise RuntimeError(message) at that unit (an index
    at or past the end fails after the last unit)."""
    hang: set[int] = field(default_factory=set)
    """Partitions that never yield nor end (a source that stopped answering)."""
    interval: float = 0.0
    """Seconds before each unit of a partition: a running feed, whose work turns up while the
    query runs."""
    pulls: list[int] = field(default_factory=list)
    """Per partition, the units handed out."""
    max_ahead: list[int] = field(default_factory=list)
    """Per partition, the most units ever pulled ahead of what the probe's consumer took."""
    closed: list[int] = field(default_factory=list)
    """Partitions whose units ended, failed or were closed, in that order."""
    waiters: Waiters = field(default_factory=Waiters)
    """Re-checked after every pull and every close: `await provider.waiters.until(...)`."""
    barrier: StartBarrier | None = None
    """The provider arrives at it when its first partition starts, and each partition waits
    there after its units, before it ends (constant `body` units)."""
    _arrived: bool = field(default=False, repr=False)
    deterministic: ClassVar[bool] = True
    """Its units are fixed when it is made: the same whenever it runs."""

    def __post_init__(self) -> None:
        if self.units is not None:
            if self.counts:
                raise InvalidArgument("UnitProvider takes counts or units, not both")
            self.counts = [len(units) for units in self.units]
        self.pulls = [0] * len(self.counts)
        self.max_ahead = [0] * len(self.counts)

    @property
    def partitions(self) -> int:
        return len(self.counts)

    def metrics(self) -> dict[str, int]:
        return {"pulls": sum(self.pulls)}

    async def wait_pulls(self, partition: int, count: int) -> None:
        """Until partition `partition` has handed out `count` units."""
        await self.waiters.until(lambda: self.pulls[partition] >= count)

    def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[Any]:
        """The partition's units, from the leanest generator its options allow (one generator
        per unit, not a wrapper around another: the feed benchmarks count every frame)."""
        if partition in self.hang:
            return self._hang(partition)
        if self.probe is not None or self.units is not None:
            return self._observed(partition)
        if partition in self.delays or partition in self.fail_at or self.interval:
            return self._observed(partition)
        if self.body is not None and self.barrier is not None:
            return self._held(partition, self.body, self.barrier)
        if self.body is not None:
            return self._constant(partition, self.body)
        return self._lazy(partition)

    def _close(self, partition: int) -> None:
        self.closed.append(partition)
        self.waiters.check()

    async def _hang(self, partition: int) -> AsyncIterator[Any]:
        try:
            await anyio.sleep_forever()
            yield  # never reached: it makes this an async generator
        finally:
            self._close(partition)

    async def _constant(self, partition: int, body: bytes) -> AsyncIterator[bytes]:
        """The benchmarks' path: one body, counted when the partition ends or is closed (the
        provider's own cost must not weigh on the feed path being measured)."""
        handed = 0
        try:
            for handed in range(1, self.counts[partition] + 1):  # noqa: B007 - read in finally
                yield body
        finally:
            self.pulls[partition] += handed
            self._close(partition)

    async def _held(
        self, partition: int, body: bytes, barrier: StartBarrier
    ) -> AsyncIterator[bytes]:
        """Constant units, then the barrier: the feed stays open until every query started."""
        if not self._arrived:
            self._arrived = True
            barrier.arrive()
        try:
            for _ in range(self.counts[partition]):
                self.pulls[partition] += 1
                yield body
            await barrier.wait()
        finally:
            self._close(partition)

    async def _lazy(self, partition: int) -> AsyncIterator[bytes]:
        """Bodies b"<p>:<i>", counted as they go (tests wait on `pulls`)."""
        pulls = self.pulls
        prefix = f"{partition}:".encode()
        waiters = self.waiters
        try:
            for i in range(self.counts[partition]):
                pulls[partition] += 1
                waiters.check()
                yield prefix + str(i).encode()
        finally:
            self._close(partition)

    async def _observed(self, partition: int) -> AsyncIterator[Any]:
        """Every option: listed units, delays, a failure, back-pressure bookkeeping."""
        prefix = f"{partition}:".encode()
        delays = self.delays.get(partition) or [0]
        failure = self.fail_at.get(partition)
        consumed = self.probe.consumed if self.probe is not None else None
        listed = self.units[partition] if self.units is not None else None
        try:
            for i in range(self.counts[partition]):
                for _ in range(delays[i % len(delays)]):
                    await anyio.lowlevel.checkpoint()
                if self.interval:
                    await anyio.sleep(self.interval)
                if failure is not None and failure[0] == i:
                    raise RuntimeError(failure[1])
                self.pulls[partition] += 1
                if consumed is not None:
                    ahead = self.pulls[partition] - consumed.get(partition, 0)
                    self.max_ahead[partition] = max(self.max_ahead[partition], ahead)
                self.waiters.check()
                if listed is not None:
                    yield listed[i]
                else:
                    yield self.body if self.body is not None else prefix + str(i).encode()
            if failure is not None and failure[0] >= self.counts[partition]:
                raise RuntimeError(failure[1])
        finally:
            self._close(partition)


class LiveProvider:
    """Units that appear while it runs: a test `push`es them (on the provider's event loop,
    e.g. through a cluster's portal), as a queue or an API would hand out new work. A
    partition ends when `end`ed; until then its readers wait for more.

    Every run of `feed` hands out every unit pushed, from the first (`deterministic`); as a
    `queue`, each unit once, to whichever run takes it first (a new run gets only new ones)."""

    unit_type: type[bytes] = bytes

    def __init__(self, partitions: int, *, queue: bool = False) -> None:
        self.partitions = partitions
        self.queue = queue
        self.deterministic = not queue
        self._units: list[list[bytes]] = [[] for _ in range(partitions)]
        self._taken = [0] * partitions
        self._ended = [False] * partitions
        self._more = [anyio.Event() for _ in range(partitions)]

    def push(self, partition: int, *bodies: bytes) -> None:
        self._units[partition].extend(bodies)
        self._wake(partition)

    def end(self, partition: int) -> None:
        self._ended[partition] = True
        self._wake(partition)

    def pushed(self, partition: int) -> int:
        """Units pushed to `partition` so far."""
        return len(self._units[partition])

    def _wake(self, partition: int) -> None:
        self._more[partition].set()
        self._more[partition] = anyio.Event()

    async def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[bytes]:
        given = self._taken[partition] if self.queue else 0
        units = self._units[partition]
        while True:
            while given < len(units):
                given += 1
                if self.queue:
                    self._taken[partition] = given
                yield units[given - 1]
            if self._ended[partition]:
                return
            await self._more[partition].wait()


LIVE_PROVIDERS: dict[str, LiveProvider] = {}


def live_provider(name: str, partitions: int, *, queue: bool = False) -> LiveProvider:
    """The LiveProvider called `name` in this process (made on first use)."""
    found = LIVE_PROVIDERS.get(name)
    if found is None:
        found = LIVE_PROVIDERS[name] = LiveProvider(partitions, queue=queue)
    if found.partitions != partitions or found.queue != queue:
        raise InvalidArgument(
            f"live provider {name!r} has {found.partitions} partitions (queue={found.queue})"
        )
    return found


class UnitScan(PlanNodeBase):
    """Reads raw work-unit bodies and turns them into rows (see the module docstring)."""

    name = "UnitScan"

    def __init__(
        self,
        feed: WorkUnitFeed[bytes],
        partitions: int,
        total_partitions: int | None = None,
        *,
        every: int = 1,
        stalled: frozenset[int] = frozenset(),
        probe_name: str = "",
    ) -> None:
        if every < 0:
            raise InvalidArgument(f"UnitScan: every must be 0 or more, got {every}")
        self.feed = feed
        self.partitions = partitions
        self.total_partitions = total_partitions if total_partitions is not None else partitions
        self.every = every
        self.stalled = frozenset(stalled)
        self.probe_name = probe_name

    @property
    def schema(self) -> pa.Schema:
        return UNIT_SCHEMA

    @property
    def output_partitions(self) -> int:
        return self.partitions

    def global_partition(self, partition: int, ctx: TaskContext) -> int:
        """A task-local partition's index in the whole feed (a scaled node holds P/T of P)."""
        if self.partitions < self.total_partitions:
            return ctx.task_number * self.partitions + partition
        return partition

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        where = self.global_partition(partition, ctx)
        if where in self.stalled:
            await anyio.sleep_forever()  # never reads its feed (until the task is cancelled)
        found = PROBES[self.probe_name] if self.probe_name else None
        if found is None and self.every == COUNT_AT_END:  # the benchmarks' consumer: counting
            counted = 0
            async with closing(self.feed.feed(partition, ctx)) as units:
                async for _ in units:
                    counted += 1
            yield _rows(where, b"", counted)
            return
        delays = [0]
        if found is not None:
            found.consumed.setdefault(where, 0)
            delays = found.delays.get(where) or delays
            if where in found.gates:
                await found.gates[where].wait()
        inbox = ctx.extensions.get(FEED_INBOX_KEY)
        taken = 0
        async with closing(self.feed.feed(partition, ctx)) as bodies:
            async for body in bodies:
                taken += 1
                if found is not None:
                    consumed = found.consumed[where] = found.consumed.get(where, 0) + 1
                    if isinstance(inbox, FeedInbox) and consumed % 1000 == 1:
                        found.inbox_credits = inbox.credits
                        found.max_inbox_buffered = max(
                            found.max_inbox_buffered, inbox.buffered_units
                        )
                    for _ in range(delays[consumed % len(delays)]):
                        await anyio.lowlevel.checkpoint()
                if self.every == 1:
                    yield _rows(where, body, 1)
                elif self.every and taken == self.every:
                    yield _rows(where, b"", taken)
                    taken = 0
        if taken and self.every != 1:
            yield _rows(where, b"", taken)
        elif self.every == COUNT_AT_END:
            yield _rows(where, b"", 0)

    def __repr__(self) -> str:
        return f"UnitScan(partitions={self.partitions}/{self.total_partitions}, every={self.every})"


def _rows(partition: int, body: bytes, units: int) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([partition], pa.int64()), pa.array([body], pa.binary()), pa.array([units])],
        schema=UNIT_SCHEMA,
    )


_HEAD = struct.Struct("<IIIII")  # partitions, total, every, stalled count, probe name length


class UnitScanCodec:
    """Plain fields and the feed's id; the provider stays on the coordinator."""

    kinds = (UnitScan.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, UnitScan):
            raise InvalidArgument(f"UnitScanCodec cannot encode {node.name}")
        name = node.probe_name.encode()
        stalled = sorted(node.stalled)
        head = _HEAD.pack(
            node.partitions, node.total_partitions, node.every, len(stalled), len(name)
        )
        return (
            head + struct.pack(f"<{len(stalled)}I", *stalled) + name + bytes(node.feed.to_proto())
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        if len(payload) < _HEAD.size or children:
            raise PlanDecodeError("UnitScan payload too short, or the node has inputs")
        partitions, total, every, stalled_count, name_size = _HEAD.unpack_from(payload)
        start = _HEAD.size + 4 * stalled_count
        if len(payload) < start + name_size:
            raise PlanDecodeError("UnitScan payload truncated")
        stalled = struct.unpack_from(f"<{stalled_count}I", payload, _HEAD.size)
        name = payload[start : start + name_size].decode()
        proto = WorkUnitFeedProto.parse(payload[start + name_size :])
        feed = WorkUnitFeed.from_proto(proto, bytes)
        return UnitScan(
            feed, partitions, total, every=every, stalled=frozenset(stalled), probe_name=name
        )


@dataclass
class UnitScanEstimator:
    """`tasks` tasks for every UnitScan (a desired count); each gets P/T of its partitions."""

    tasks: int = 1

    def task_estimation(self, plan: ExecutionPlan, /) -> TaskEstimation | None:
        return TaskEstimation.desired(self.tasks) if isinstance(plan, UnitScan) else None

    def scale_up_leaf_node(self, plan: ExecutionPlan, task_count: int, /) -> ExecutionPlan | None:
        if not isinstance(plan, UnitScan):
            return None
        return UnitScan(
            plan.feed,
            plan.total_partitions // task_count,
            plan.total_partitions,
            every=plan.every,
            stalled=plan.stalled,
            probe_name=plan.probe_name,
        )


class PartitionedProvider(WorkUnitFeedProvider[bytes], Protocol):
    """A provider of raw bodies that says how many partitions it has (UnitScan's input)."""

    @property
    def partitions(self) -> int: ...


def unit_scan(
    provider: PartitionedProvider,
    *,
    every: int = 1,
    probe: Probe | None = None,
    stalled: frozenset[int] = frozenset(),
) -> UnitScan:
    """A UnitScan over a new feed of `provider` (reporting to `probe`, if given)."""
    feed: WorkUnitFeed[bytes] = WorkUnitFeed.new(provider)
    name = probe.name if probe is not None else ""
    partitions = provider.partitions
    return UnitScan(feed, partitions, partitions, every=every, stalled=stalled, probe_name=name)


def unit_feed_registry() -> FeedRegistry:
    """Where planners find UnitScan's feed."""
    registry = FeedRegistry()
    registry.register(UnitScan, lambda node: node.feed)
    return registry


def with_unit_scans(catalog: Catalog, tasks: int | None = None) -> Catalog:
    """`catalog` made to plan UnitScans (their codec and their feed) and, with `tasks`, to split
    each over that many tasks."""
    catalog.with_codec(UnitScanCodec()).with_feed(UnitScan, lambda node: node.feed)
    if tasks is not None:
        catalog.with_estimator(UnitScan.name, UnitScanEstimator(tasks))
    return catalog


async def unit_session_builder(ctx: WorkerQueryContext) -> Session:
    """Worker sessions that decode UnitScan (and so its remote feed)."""
    return ctx.builder.with_codec(UnitScanCodec()).build()


def unit_coordinator_session() -> Session:
    """The coordinator's session: it encodes UnitScan."""
    return SessionStateBuilder().with_codec(UnitScanCodec()).build()


def unit_coordinator_options(tasks: int = 1, **overrides: Any) -> dict[str, Any]:
    """Coordinator arguments that plan UnitScans into `tasks` tasks; `overrides` win."""
    estimators: dict[str | type, TaskEstimator] = {UnitScan.name: UnitScanEstimator(tasks)}
    options: dict[str, Any] = {
        "session": unit_coordinator_session(),
        "feed_registry": unit_feed_registry(),
        "task_estimators": estimators,
    }
    return options | overrides
