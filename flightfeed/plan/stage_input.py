"""What a network boundary reads: another stage's tasks, and who opens their outputs.

A network node (NetworkCoalesce, NetworkShuffle, NetworkBroadcast) names its input stage with
a `StageInput`: the stage's id, task count, per-task partitions and schema, and, once the
coordinator has placed the tasks, the query id and the worker of each task. It reads through
the `StageReader` its task context carries under STAGE_READER_KEY, so the node is transport
neutral: the coordinator's query runtime reads its tasks' outputs, a worker reads its peers
over gRPC and a task it hosts itself straight from its own registry (no network).

A `ReadHead` says how the producer task shapes its output for the reader (the producer heads of
ExecuteTask): its own partitions, a hash split into N buckets, or a copy to N readers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Final, Protocol, TypeAlias, runtime_checkable

import pyarrow as pa

from .._generated.flightfeed.v1 import StageInput as StageInputProto
from ..errors import ExecutionError, InvalidArgument, PlanDecodeError
from .arrow_ipc import read_ipc_schema
from .base import TaskContext, closing
from .merge import merge
from .partitioning import MAX_PARTITIONS, Partitioning

STAGE_READER_KEY: Final = "flightfeed.plan.stage_reader"
MAX_STAGE_TASKS: Final = 4096
"""Tasks a decoded StageInput may name (a reader opens one stream per task)."""
BUFFERED_BATCHES_PER_TASK: Final = 2
"""Batches buffered per producer task while a network node merges them."""


@dataclass(frozen=True)
class OwnPartitions:
    """The producer task's own partitions, as they are (NoneHead)."""


@dataclass(frozen=True)
class HashBuckets:
    """The producer task's output hash-split into `partitioning.partition_count` buckets."""

    partitioning: Partitioning


@dataclass(frozen=True)
class Copies:
    """Every batch of the producer task to each of `outputs` readers."""

    outputs: int


ReadHead: TypeAlias = OwnPartitions | HashBuckets | Copies


@dataclass(frozen=True)
class StageInput:
    """The producer stage of a network node. `worker_urls` (task number → worker),
    `query_id` and `attempt` are set by the coordinator when it places the tasks (`placed`)."""

    stage_id: int
    task_count: int
    partitions_per_task: int
    schema: pa.Schema
    query_id: bytes = b""
    worker_urls: tuple[str, ...] = ()
    attempt: int = 0
    """The query attempt of the producer tasks (a retried query reads its own attempt's)."""

    def __post_init__(self) -> None:
        if not 1 <= self.task_count <= MAX_STAGE_TASKS:
            raise InvalidArgument(
                f"stage {self.stage_id}: task count must be in [1, {MAX_STAGE_TASKS}],"
                f" got {self.task_count}"
            )
        if not 1 <= self.partitions_per_task <= MAX_PARTITIONS:
            raise InvalidArgument(
                f"stage {self.stage_id}: partitions per task must be in [1, {MAX_PARTITIONS}],"
                f" got {self.partitions_per_task}"
            )
        if self.worker_urls and len(self.worker_urls) != self.task_count:
            raise InvalidArgument(
                f"stage {self.stage_id} has {self.task_count} tasks but"
                f" {len(self.worker_urls)} worker locations"
            )

    @property
    def is_placed(self) -> bool:
        return bool(self.worker_urls)

    def placed(self, query_id: bytes, worker_urls: tuple[str, ...], attempt: int = 0) -> StageInput:
        """The same input with its tasks' workers known (what a worker needs to read it)."""
        return replace(self, query_id=query_id, worker_urls=worker_urls, attempt=attempt)

    def to_proto(self) -> StageInputProto:
        if not self.is_placed:
            raise InvalidArgument(
                f"stage {self.stage_id} is not placed on workers yet: a network boundary is"
                " encoded only once the coordinator knows where its input tasks run"
            )
        return StageInputProto(
            query_id=self.query_id,
            stage_id=self.stage_id,
            partitions_per_task=self.partitions_per_task,
            schema=self.schema.serialize().to_pybytes(),
            worker_urls=list(self.worker_urls),
            attempt=self.attempt,
        )

    @classmethod
    def from_proto(cls, msg: StageInputProto | None) -> StageInput:
        if msg is None:
            raise PlanDecodeError("missing stage input")
        if not msg.worker_urls:
            raise PlanDecodeError(f"stage input {msg.stage_id} names no tasks")
        try:
            return cls(
                stage_id=msg.stage_id,
                task_count=len(msg.worker_urls),
                partitions_per_task=msg.partitions_per_task,
                schema=read_ipc_schema(msg.schema, "stage input schema"),
                query_id=msg.query_id,
                worker_urls=tuple(msg.worker_urls),
                attempt=msg.attempt,
            )
        except InvalidArgument as exc:
            raise PlanDecodeError(exc.message) from exc

    def __str__(self) -> str:
        return f"stage={self.stage_id}, tasks={self.task_count}"


@runtime_checkable
class StageReader(Protocol):
    """Opens partitions of one producer task's output, shaped by `head`."""

    def read(
        self, source: StageInput, task_number: int, head: ReadHead, partitions: range
    ) -> AbstractAsyncContextManager[AsyncIterator[pa.RecordBatch]]: ...


def stage_reader(ctx: TaskContext, node: str) -> StageReader:
    """The reader of this task's network nodes; ExecutionError outside a distributed query."""
    reader = ctx.extensions.get(STAGE_READER_KEY)
    if not isinstance(reader, StageReader):
        raise ExecutionError(
            f"{node} reads another stage's tasks: it runs only in a distributed query (a"
            " Coordinator's, or a worker task it planned)"
        )
    return reader


def check_reader_task(ctx: TaskContext, consumer_tasks: int, node: str) -> None:
    """ExecutionError unless this task is one of the `consumer_tasks` a network node was planned
    for: a task of another count could not tell which buckets or copy are its own."""
    if ctx.task_count != consumer_tasks or ctx.task_number >= consumer_tasks:
        raise ExecutionError(
            f"{node} is read by {consumer_tasks} tasks; task {ctx.task_number} of"
            f" {ctx.task_count} cannot tell which of its outputs are its own"
        )


async def read_every_task(
    reader: StageReader, source: StageInput, head: ReadHead, partitions: range
) -> AsyncIterator[pa.RecordBatch]:
    """`partitions` of every task of `source`, read concurrently, batches as they come."""
    streams: Mapping[int, AsyncIterator[pa.RecordBatch]] = {
        task: _one_task(reader, source, task, head, partitions) for task in range(source.task_count)
    }
    async with closing(merge(streams, BUFFERED_BATCHES_PER_TASK)) as merged:
        async for _, batch in merged:
            yield batch


async def _one_task(
    reader: StageReader, source: StageInput, task: int, head: ReadHead, partitions: range
) -> AsyncIterator[pa.RecordBatch]:
    async with reader.read(source, task, head, partitions) as stream, closing(stream) as batches:
        async for batch in batches:
            yield batch


__all__ = [
    "STAGE_READER_KEY",
    "Copies",
    "HashBuckets",
    "OwnPartitions",
    "ReadHead",
    "StageInput",
    "StageReader",
    "check_reader_task",
    "read_every_task",
    "stage_reader",
]
