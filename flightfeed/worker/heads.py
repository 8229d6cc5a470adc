"""Producer heads: how a task's output is shaped for the consumers that ask for it.

- `none`: consumers read the task's own partitions; each partition runs once, for the consumer
  that claims it.
- `repartition`: the task runs once; each batch is hash-split into N outputs.
- `broadcast`: the task runs once; every one of N outputs receives every batch.

Fanned-out outputs have bounded buffers: a slow consumer slows the producer, nothing is lost
or duplicated, and a consumer that leaves only drops its own output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Protocol

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._generated.flightfeed.v1 import ExecuteTaskRequest
from ..errors import InvalidArgument
from ..plan.base import ExecutionPlan, TaskContext, closing
from ..plan.hash_partition import hash_partition
from ..plan.offload import run_compute
from ..plan.partitioning import Partitioning, decode_partitioning


class Outputs(Protocol):
    """The output partitions a task offers its consumers."""

    head: str
    partitions: int

    def open(self, partition: int) -> AsyncIterator[pa.RecordBatch]:
        """The stream of one claimed output partition."""
        ...


class DirectOutputs:
    """`none` head: output partition p is the plan's partition p, run by its consumer."""

    head = "none"

    def __init__(self, plan: ExecutionPlan, ctx: TaskContext) -> None:
        self._plan = plan
        self._ctx = ctx
        self.partitions = plan.output_partitions

    def open(self, partition: int) -> AsyncIterator[pa.RecordBatch]:
        return self._plan.execute(partition, self._ctx)


class FanOutOutputs:
    """One run of the plan, fanned out to N bounded output buffers.

    The producer starts with the first consumer. A consumer that leaves closes its buffer; the
    producer then stops feeding it. A producer error reaches every open output.
    """

    def __init__(
        self,
        head: str,
        plan: ExecutionPlan,
        ctx: TaskContext,
        background: TaskGroup,
        partitions: int,
        buffer: int,
        split: Callable[[pa.RecordBatch], list[pa.RecordBatch | None]],
    ) -> None:
        self.head = head
        self.partitions = partitions
        self._plan = plan
        self._ctx = ctx
        self._background = background
        self._split = split
        streams = [
            anyio.create_memory_object_stream[pa.RecordBatch](buffer) for _ in range(partitions)
        ]
        self._sends: list[MemoryObjectSendStream[pa.RecordBatch] | None] = [s for s, _ in streams]
        self._receives: list[MemoryObjectReceiveStream[pa.RecordBatch]] = [r for _, r in streams]
        self._started = False
        self.error: BaseException | None = None

    def open(self, partition: int) -> AsyncIterator[pa.RecordBatch]:
        if not self._started:
            self._started = True
            self._background.start_soon(self._produce, name=f"{self.head} producer")
        return self._read(partition)

    async def _read(self, partition: int) -> AsyncIterator[pa.RecordBatch]:
        async with self._receives[partition] as receive:
            async for batch in receive:
                yield batch
        if self.error is not None:
            raise self.error

    async def _produce(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                for partition in range(self._plan.output_partitions):
                    tg.start_soon(self._run_input, partition)
        except BaseExceptionGroup as group:
            self.error = group.exceptions[0]
        except Exception as exc:
            self.error = exc
        finally:
            for send in self._sends:
                if send is not None:
                    send.close()

    async def _run_input(self, partition: int) -> None:
        async with closing(self._plan.execute(partition, self._ctx)) as stream:
            async for batch in stream:
                pieces = await run_compute(self._ctx, batch.nbytes, partial(self._split, batch))
                for output, piece in enumerate(pieces):
                    send = self._sends[output]
                    if piece is None or send is None:
                        continue
                    try:
                        await send.send(piece)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        self._sends[output] = None  # its consumer left: drop only that output
                if all(send is None for send in self._sends):
                    return


def build_outputs(
    request: ExecuteTaskRequest,
    plan: ExecutionPlan,
    ctx: TaskContext,
    background: TaskGroup,
    buffer: int,
) -> Outputs:
    """The outputs a consumer's producer head asks for."""
    if request.repartition is not None:
        try:
            partitioning: Partitioning = decode_partitioning(request.repartition.partitioning)
        except Exception as exc:
            raise InvalidArgument(f"invalid repartition head: {exc}") from None
        keys, count = partitioning.hash_keys, partitioning.partition_count

        def split_by_hash(batch: pa.RecordBatch) -> list[pa.RecordBatch | None]:
            return [
                piece if piece.num_rows else None
                for piece in hash_partition(batch, keys, count, ctx.session)
            ]

        return FanOutOutputs("repartition", plan, ctx, background, count, buffer, split_by_hash)
    if request.broadcast is not None:
        count = request.broadcast.output_partitions
        if not 1 <= count <= 65_536:
            raise InvalidArgument(f"broadcast head needs 1..65536 outputs, got {count}")

        def copy_to_all(batch: pa.RecordBatch) -> list[pa.RecordBatch | None]:
            return [batch] * count

        return FanOutOutputs("broadcast", plan, ctx, background, count, buffer, copy_to_all)
    return DirectOutputs(plan, ctx)
