"""Feed-backed test nodes: the seed's work_unit_feed example, and a probe scan for feed tests.

- `scan(task_count, '3,1', '2', ...)` builds the seed's RemoteScan: a ChunkFeedProvider
  "discovers" chunks of n rows per partition (an OutputRows message is the Chunk); the node
  turns each chunk into n rows (task, partition), partition being the global one and task the
  task that owns it, so a local run and a distributed run give the same rows.
- `ProbeScan` reads raw-bytes units (from a `BytesProvider`) and reports to a `Probe` that the
  test holds: gates that keep a partition from reading, consumer delays, consumed counts and
  the largest inbox backlog seen. Workers run in the test's process, so a decoded node finds
  its probe by name in `PROBES`.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pyarrow as pa

from flightfeed._generated.flightfeed.v1 import WorkUnitFeedProto
from flightfeed.coordinator import Coordinator, TaskEstimation, TaskEstimator
from flightfeed.errors import InvalidArgument, PlanDecodeError
from flightfeed.examples.chunk_scan import (  # the seed example lives in the package
    SCAN_SCHEMA,
    Chunk,
    ChunkFeedProvider,
    RemoteScan,
    RemoteScanCodec,
    RemoteScanEstimator,
    parse_chunks,
    scan,
    scan_rows,
    to_global_partition,
)
from flightfeed.feeds import FEED_INBOX_KEY, FeedInbox, FeedRegistry, WorkUnitFeed
from flightfeed.plan import DecodeContext, ExecutionPlan, PlanNodeBase, TaskContext
from flightfeed.session import Session, SessionStateBuilder, WorkerQueryContext
from flightfeed.testing import start_cluster
from flightfeed.worker import Worker, WorkerConfig

__all__ = [  # the seed example, re-exported for tests, and the probes defined here
    "ESTIMATORS",
    "SCAN_SCHEMA",
    "BytesProvider",
    "Chunk",
    "ChunkFeedProvider",
    "Probe",
    "ProbeScan",
    "ProbeScanCodec",
    "ProbeScanEstimator",
    "RemoteScan",
    "RemoteScanCodec",
    "RemoteScanEstimator",
    "coordinator_options",
    "feed_cluster",
    "feed_registry",
    "feed_session_builder",
    "parse_chunks",
    "probe",
    "probe_scan",
    "scan",
    "scan_rows",
]

PROBE_SCHEMA = pa.schema([("partition", pa.int64()), ("body", pa.binary()), ("units", pa.int64())])


# -- probes ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class Probe:
    """What a test sees of its ProbeScan consumers on the workers (keyed by global partition)."""

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
    """A probe registered for ProbeScan nodes for the duration of the block."""
    found = Probe(**options)
    PROBES[found.name] = found
    try:
        yield found
    finally:
        PROBES.pop(found.name, None)


@dataclass(eq=False)
class BytesProvider:
    """Partition p yields `counts[p]` units b"<p>:<i>", made lazily (cheap for huge feeds).

    `pulls` counts units handed out; `max_ahead[p]` is the most units partition p was ever
    pulled ahead of what the probe's consumer took (the end-to-end back-pressure bound).
    `delays[p]` are checkpoints the provider takes before each unit (cycled).
    """

    counts: list[int]
    probe: Probe | None = None
    delays: dict[int, list[int]] = field(default_factory=dict)
    fail_at: dict[int, tuple[int, str]] = field(default_factory=dict)
    hang: set[int] = field(default_factory=set)
    """Partitions whose provider never yields nor ends (a source that stopped answering)."""
    unit_type: type[bytes] = bytes
    pulls: list[int] = field(default_factory=list)
    max_ahead: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    _waiters: list[tuple[Callable[[], bool], anyio.Event]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pulls = [0] * len(self.counts)
        self.max_ahead = [0] * len(self.counts)

    async def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[bytes]:
        prefix = f"{partition}:".encode()
        delays = self.delays.get(partition) or [0]
        failure = self.fail_at.get(partition)
        consumed = self.probe.consumed if self.probe is not None else None
        try:
            if partition in self.hang:
                await anyio.sleep_forever()
            for i in range(self.counts[partition]):
                for _ in range(delays[i % len(delays)]):
                    await anyio.lowlevel.checkpoint()
                if failure is not None and failure[0] == i:
                    raise RuntimeError(failure[1])
                self.pulls[partition] += 1
                if consumed is not None:
                    ahead = self.pulls[partition] - consumed.get(partition, 0)
                    if ahead > self.max_ahead[partition]:
                        self.max_ahead[partition] = ahead
                if self._waiters:
                    self._check()
                yield prefix + str(i).encode()
            if failure is not None and failure[0] >= self.counts[partition]:
                raise RuntimeError(failure[1])
        finally:
            self.closed.append(partition)

    async def wait_pulls(self, partition: int, count: int) -> None:
        """Until partition `partition` has handed out `count` units."""
        await self._until(lambda: self.pulls[partition] >= count)

    async def _until(self, predicate: Callable[[], bool]) -> None:
        if predicate():
            return
        event = anyio.Event()
        self._waiters.append((predicate, event))
        await event.wait()

    def _check(self) -> None:
        for waiter in list(self._waiters):
            if waiter[0]():
                waiter[1].set()
                self._waiters.remove(waiter)


class ProbeScan(PlanNodeBase):
    """Reads raw-bytes units. `every` == 0: one row per unit (partition, body); else one row
    per `every` units (partition, units taken since the last row), for huge feeds."""

    name = "ProbeScan"

    def __init__(
        self,
        feed: WorkUnitFeed[bytes],
        partitions: int,
        total_partitions: int,
        probe_name: str,
        every: int = 0,
    ) -> None:
        self.feed = feed
        self.partitions = partitions
        self.total_partitions = total_partitions
        self.probe_name = probe_name
        self.every = every

    @property
    def schema(self) -> pa.Schema:
        return PROBE_SCHEMA

    @property
    def output_partitions(self) -> int:
        return self.partitions

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        found = PROBES[self.probe_name]
        global_partition = to_global_partition(
            partition, self.partitions, self.total_partitions, ctx
        )
        gate = found.gates.get(global_partition)
        if gate is not None:
            await gate.wait()
        inbox = ctx.extensions.get(FEED_INBOX_KEY)
        delays = found.delays.get(global_partition) or [0]
        found.consumed.setdefault(global_partition, 0)
        taken = 0
        async for body in self.feed.feed(partition, ctx):
            found.consumed[global_partition] += 1
            taken += 1
            if isinstance(inbox, FeedInbox) and found.consumed[global_partition] % 1000 == 1:
                found.inbox_credits = inbox.credits
                found.max_inbox_buffered = max(found.max_inbox_buffered, inbox.buffered_units)
            for _ in range(delays[found.consumed[global_partition] % len(delays)]):
                await anyio.lowlevel.checkpoint()
            if not self.every:
                yield _probe_batch(global_partition, body, 1)
            elif taken == self.every:
                yield _probe_batch(global_partition, b"", taken)
                taken = 0
        if self.every and taken:
            yield _probe_batch(global_partition, b"", taken)


def _probe_batch(partition: int, body: bytes, units: int) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([partition], pa.int64()), pa.array([body], pa.binary()), pa.array([units])],
        schema=PROBE_SCHEMA,
    )


class ProbeScanCodec:
    kinds = (ProbeScan.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, ProbeScan):
            raise InvalidArgument(f"ProbeScanCodec cannot encode {node.name}")
        name = node.probe_name.encode()
        head = struct.pack("<IIII", node.partitions, node.total_partitions, node.every, len(name))
        return head + name + bytes(node.feed.to_proto())

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        if len(payload) < 16 or children:
            raise PlanDecodeError("bad ProbeScan payload")
        partitions, total, every, size = struct.unpack_from("<IIII", payload)
        name = payload[16 : 16 + size].decode()
        feed = WorkUnitFeed.from_proto(WorkUnitFeedProto.parse(payload[16 + size :]), bytes)
        return ProbeScan(feed, partitions, total, name, every)


@dataclass
class ProbeScanEstimator:
    """`tasks` tasks for every ProbeScan (a desired count)."""

    tasks: int = 1

    def task_estimation(self, plan: ExecutionPlan, /) -> TaskEstimation | None:
        return TaskEstimation.desired(self.tasks) if isinstance(plan, ProbeScan) else None

    def scale_up_leaf_node(self, plan: ExecutionPlan, task_count: int, /) -> ExecutionPlan | None:
        if not isinstance(plan, ProbeScan):
            return None
        per_task = plan.total_partitions // task_count
        return ProbeScan(plan.feed, per_task, plan.total_partitions, plan.probe_name, plan.every)


def probe_scan(provider: BytesProvider, found: Probe, every: int = 0) -> ProbeScan:
    partitions = len(provider.counts)
    return ProbeScan(WorkUnitFeed.new(provider), partitions, partitions, found.name, every)


# -- wiring ---------------------------------------------------------------------------------------


def feed_registry() -> FeedRegistry:
    """Where planners find these nodes' feeds (the seed's with_distributed_work_unit_feed)."""
    registry = FeedRegistry()
    registry.register(RemoteScan, lambda node: node.feed)
    registry.register(ProbeScan, lambda node: node.feed)
    return registry


ESTIMATORS: dict[str | type, TaskEstimator] = {
    RemoteScan.name: RemoteScanEstimator(),
    ProbeScan: ProbeScanEstimator(),
}


async def feed_session_builder(ctx: WorkerQueryContext) -> Session:
    """Workers must decode these nodes (and so their remote feeds)."""
    return ctx.builder.with_codec(RemoteScanCodec()).with_codec(ProbeScanCodec()).build()


def coordinator_session() -> Session:
    return SessionStateBuilder().with_codec(RemoteScanCodec()).with_codec(ProbeScanCodec()).build()


def coordinator_options(**overrides: Any) -> dict[str, Any]:
    """Coordinator arguments that plan and encode these nodes; `overrides` win."""
    options: dict[str, Any] = {
        "session": coordinator_session(),
        "feed_registry": feed_registry(),
        "task_estimators": ESTIMATORS,
    }
    return options | overrides


@asynccontextmanager
async def feed_cluster(
    workers: int = 2, *, config: WorkerConfig | None = None, **options: Any
) -> AsyncIterator[tuple[Coordinator, list[Worker]]]:
    """Real workers that know these nodes, and a Coordinator that distributes them."""
    async with start_cluster(
        workers,
        session_builder=feed_session_builder,
        config=config,
        **coordinator_options(**options),
    ) as (coordinator, found):
        yield coordinator, found
