"""The seeds' work_unit_feed example as a library module: a template for feed-backed leaves.

`scan(task_count, '3,1', '2', '4', '1,1')` is a leaf whose work is discovered at runtime: a
ChunkFeedProvider on the coordinator "discovers" chunks of n rows per partition and streams
them to the workers; the RemoteScan node turns each chunk into n rows (task, partition). As in
the reference program, `task` is the task that owns the partition and `partition` is the
partition's index within that task: with 4 partitions over 2 tasks, both tasks report
partitions 0 and 1. It wires the four pieces every feed-backed leaf needs: a
WorkUnitFeedProvider, a node holding a WorkUnitFeed, a PlanCodec (only the feed handle
travels) and a TaskEstimator, plus `chunk_feed_registry()` so planners find the feed, and
`catalog()`, which serves `scan` as a table of a coordinator (Spark reads it from there).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, Final, Protocol, TypeAlias

import anyio
import numpy as np
import pyarrow as pa

from .._generated.flightfeed.v1 import OutputRows, WorkUnitFeedProto
from ..coordinator import Catalog, TaskEstimation
from ..errors import InvalidArgument, PlanDecodeError
from ..feeds import FeedRegistry, WorkUnitFeed
from ..plan import DecodeContext, ExecutionPlan, PlanNodeBase, TaskContext, closing
from ..session import Session, SessionStateBuilder, WorkerQueryContext

Chunk: TypeAlias = OutputRows
"""The seed's `Chunk { n_rows }`: any betterproto2 message works as a work unit."""

SCAN_SCHEMA = pa.schema(
    [
        pa.field("task", pa.int64(), nullable=False),
        pa.field("partition", pa.int64(), nullable=False),
    ]
)


class ChunkObserver(Protocol):
    """Told of every chunk discovered (on the coordinator) and processed (on a worker), when
    they run in this process: for progress displays such as the demo's."""

    def discovered(self) -> None: ...

    def processed(self) -> None: ...


_observer: ChunkObserver | None = None


@contextmanager
def observe_chunks(observer: ChunkObserver) -> Iterator[None]:
    """Report this process's chunks to `observer` while the block runs."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = previous


@dataclass
class ChunkFeedProvider:
    """Per partition, one Chunk per listed size; `delay` pretends to poll a remote source."""

    per_partition_chunks: list[list[int]]
    task_count: int
    delay: float = 0.0
    unit_type: type[Chunk] = Chunk
    deterministic: ClassVar[bool] = True
    """The same chunks whenever it runs: a stream of it resumes on a new coordinator."""

    async def feed(self, partition: int, ctx: TaskContext) -> AsyncIterator[Chunk]:
        for n_rows in self.per_partition_chunks[partition]:
            if self.delay:
                await anyio.sleep(self.delay)
            if _observer is not None:
                _observer.discovered()
            yield Chunk(value=n_rows)


class RemoteScan(PlanNodeBase):
    """The seed's RemoteScanExec: each chunk of n rows becomes n rows (task, partition)."""

    name = "RemoteScan"

    def __init__(
        self, feed: WorkUnitFeed[Chunk], partitions: int, total_partitions: int, task_count: int
    ) -> None:
        self.feed = feed
        self.partitions = partitions
        self.total_partitions = total_partitions
        self.task_count = task_count

    @property
    def schema(self) -> pa.Schema:
        return SCAN_SCHEMA

    @property
    def output_partitions(self) -> int:
        return self.partitions

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        global_partition = to_global_partition(
            partition, self.partitions, self.total_partitions, ctx
        )
        task, local = divmod(global_partition, max(1, self.total_partitions // self.task_count))
        task_value = pa.scalar(task, pa.int64())
        partition_value = pa.scalar(local, pa.int64())
        batch: pa.RecordBatch | None = None
        # Closed here if this node is (a LIMIT above it, an error): an abandoned feed stream
        # would hand its partition back only once the garbage collector found it.
        async with closing(self.feed.feed(partition, ctx)) as chunks:
            async for chunk in chunks:
                if _observer is not None:
                    _observer.processed()
                n = chunk.value  # n rows of two constants: built by Arrow, not row by row
                if batch is None or batch.num_rows != n:  # chunks mostly share a size: batches
                    batch = pa.record_batch(  # are immutable, so one serves them all
                        [pa.repeat(task_value, n), pa.repeat(partition_value, n)],
                        schema=SCAN_SCHEMA,
                    )
                yield batch

    def __repr__(self) -> str:
        provider = self.feed.inner()
        chunks = ""
        if isinstance(provider, ChunkFeedProvider):
            lists = provider.per_partition_chunks
            if sum(map(len, lists)) <= 12:
                chunks = f", chunks={lists}"
            else:  # summarized: plans are printed, and feeds can be long
                rows = sum(map(sum, lists))
                chunks = f", chunks={sum(map(len, lists))} ({rows:,} rows)"
        return f"RemoteScan(tasks={self.task_count}, partitions={self.partitions}{chunks})"


class RemoteScanCodec:
    """Only the feed handle travels (`to_proto`); the worker gets a remote feed."""

    kinds = (RemoteScan.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, RemoteScan):
            raise InvalidArgument(f"RemoteScanCodec cannot encode {node.name}")
        head = struct.pack("<III", node.partitions, node.total_partitions, node.task_count)
        return head + bytes(node.feed.to_proto())

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        if len(payload) < 12 or children:
            raise PlanDecodeError("bad RemoteScan payload")
        partitions, total, tasks = struct.unpack_from("<III", payload)
        feed = WorkUnitFeed.from_proto(WorkUnitFeedProto.parse(payload[12:]), Chunk)
        return RemoteScan(feed, partitions, total, tasks)


class RemoteScanEstimator:
    """The seed's RemoteScanTaskEstimator: the scan's task count; P/T partitions per task."""

    def task_estimation(self, plan: ExecutionPlan, /) -> TaskEstimation | None:
        if not isinstance(plan, RemoteScan):
            return None
        return TaskEstimation.desired(plan.task_count)

    def scale_up_leaf_node(self, plan: ExecutionPlan, task_count: int, /) -> ExecutionPlan | None:
        if not isinstance(plan, RemoteScan):
            return None
        per_task = plan.total_partitions // task_count
        return RemoteScan(plan.feed, per_task, plan.total_partitions, plan.task_count)


MAX_CHUNK_ROWS: Final = 1_000_000
"""The most rows one chunk stands for: a chunk is built as one batch, and a chunk of 2**32
rows grew a coordinator running local workers to 19 GB (past 2**63, the size wrapped around
the wire's integer and read back as a few rows)."""


def parse_chunks(spec: str) -> list[int]:
    """'3,1' → [3, 1]: the chunk sizes of one partition (blank items are skipped)."""
    sizes = []
    for item in spec.split(","):
        text = item.strip()
        if not text:
            continue
        digits = text.removeprefix("-")
        if not digits.isascii() or not digits.isdigit():  # (int() takes '1_000' and '٣' too)
            raise InvalidArgument(f"invalid chunk size {item[:16]!r}: not an integer")
        if text.startswith("-"):
            raise InvalidArgument(f"invalid chunk size {item[:16]!r}: must not be negative")
        if len(digits.lstrip("0")) > len(str(MAX_CHUNK_ROWS)) or int(digits) > MAX_CHUNK_ROWS:
            raise InvalidArgument(
                f"invalid chunk size {item[:16]!r}: at most {MAX_CHUNK_ROWS:,} rows a chunk"
            )
        sizes.append(int(digits))
    return sizes


def scan(task_count: int, *partitions: str, delay: float = 0.0) -> RemoteScan:
    """`scan(task_count, 'chunks_p0', 'chunks_p1', ...)` as in the seed's SQL; errors as the
    reference program's."""
    if isinstance(task_count, bool) or not isinstance(task_count, int):
        raise InvalidArgument(f"task_count must be an integer literal, got {task_count!r}")
    if not partitions:
        raise InvalidArgument("scan(task_count, partitions...) needs at least 2 arguments")
    for spec in partitions:
        if not isinstance(spec, str):
            raise InvalidArgument(f"partition args must be string literals, got {spec!r}")
    chunks = [parse_chunks(spec) for spec in partitions]
    if task_count <= 0 or len(chunks) % task_count:
        raise InvalidArgument(
            f"partition count ({len(chunks)}) must be a non-zero multiple of task_count"
            f" ({task_count})"
        )
    feed = WorkUnitFeed.new(ChunkFeedProvider(chunks, task_count, delay))
    return RemoteScan(feed, len(chunks), len(chunks), task_count)


def scan_rows(task_count: int, *partitions: str) -> pa.Table:
    """What `scan(...)` yields, computed directly: (task, partition within the task) per row."""
    chunks = [parse_chunks(spec) for spec in partitions]
    per_task = len(chunks) // task_count
    rows_per_partition = np.array([sum(sizes) for sizes in chunks], dtype=np.int64)
    partition = np.repeat(np.arange(len(chunks), dtype=np.int64), rows_per_partition)
    task, local = np.divmod(partition, per_task)
    return pa.table([pa.array(task), pa.array(local)], schema=SCAN_SCHEMA)


def to_global_partition(partition: int, partitions: int, total: int, ctx: TaskContext) -> int:
    """The global partition of a task-local one (a scaled node holds P/T of P partitions)."""
    return ctx.task_number * partitions + partition if partitions < total else partition


def chunk_feed_registry() -> FeedRegistry:
    """Where planners find RemoteScan's feed (the seeds' with_distributed_work_unit_feed)."""
    registry = FeedRegistry()
    registry.register(RemoteScan, lambda node: node.feed)
    return registry


async def chunk_session_builder(ctx: WorkerQueryContext) -> Session:
    """Worker sessions that decode RemoteScan (and so its remote feed)."""
    return ctx.builder.with_codec(RemoteScanCodec()).build()


def chunk_coordinator_session() -> Session:
    """The coordinator's session: it encodes RemoteScan."""
    return SessionStateBuilder().with_codec(RemoteScanCodec()).build()


def catalog(delay: float = 0.001) -> Catalog:
    """A coordinator catalog with the seed's `scan(task_count, 'chunks_p0', ...)` table; each
    chunk is "discovered" after `delay` seconds, as the reference program pretends to poll."""
    found = Catalog()
    found.with_codec(RemoteScanCodec()).with_feed(RemoteScan, lambda node: node.feed)
    found.with_estimator(RemoteScan.name, RemoteScanEstimator())

    def scan_table(task_count: int, *partitions: str) -> ExecutionPlan:
        return scan(task_count, *partitions, delay=delay)

    found.table(
        "scan",
        scan_table,
        description="per partition, chunks of n rows discovered at runtime: (task, partition)",
    )
    return found
