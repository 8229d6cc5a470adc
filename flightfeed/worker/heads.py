"""Producer heads: how a task's output is shaped for the consumers that ask for it.

- `none`: consumers read the task's own partitions; each partition runs once, for the consumer
  that claims it.
- `repartition`: the task runs once; each batch is hash-split into N outputs.
- `broadcast`: the task runs once; every one of N outputs receives every batch.

Fanned-out outputs have bounded buffers: a slow consumer slows the producer, nothing is lost
or duplicated, and a consumer that leaves only drops its own output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import pyarrow as pa
from anyio.abc import TaskGroup

from .._generated.flightfeed.v1 import ExecuteTaskRequest
from ..errors import InvalidArgument, ResourceExhausted
from ..plan.base import ExecutionPlan, TaskContext
from ..plan.fanout import Fanout, Split, hash_split, split_producer
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
    """One run of the plan, fanned out to N bounded output buffers (see plan/fanout.py).

    The producer starts with the first consumer. A consumer that leaves drops only its own
    output. A producer error reaches every open output.
    """

    def __init__(
        self,
        head: str,
        plan: ExecutionPlan,
        ctx: TaskContext,
        background: TaskGroup,
        partitions: int,
        buffer: int,
        split: Split,
        claim_timeout: float | None = None,
    ) -> None:
        self.head = head
        self.partitions = partitions
        produce = split_producer(plan, ctx, split)
        self._fanout = Fanout(
            partitions,
            buffer,
            produce,
            background,
            name=f"{head} head",
            claim_timeout=claim_timeout,
            memory=ctx.memory.reservation(f"{head} head buffers"),
        )

    def open(self, partition: int) -> AsyncIterator[pa.RecordBatch]:
        return self._fanout.open(partition)


def _check_outputs(head: str, count: int, limit: int) -> None:
    if count > limit:
        raise ResourceExhausted(
            f"a {head} head asks for {count} outputs; this worker fans out to at most {limit}"
            " (WorkerConfig.max_fanout_outputs)"
        )


def build_outputs(
    request: ExecuteTaskRequest,
    plan: ExecutionPlan,
    ctx: TaskContext,
    background: TaskGroup,
    buffer: int,
    max_outputs: int = 4096,
    claim_timeout: float | None = None,
) -> Outputs:
    """The outputs a consumer's producer head asks for (at most `max_outputs` fanned out; an
    output nobody opens within `claim_timeout` of the first is dropped)."""
    if request.repartition is not None:
        try:
            partitioning: Partitioning = decode_partitioning(request.repartition.partitioning)
        except Exception as exc:
            raise InvalidArgument(f"invalid repartition head: {exc}") from None
        count = partitioning.partition_count
        _check_outputs("repartition", count, max_outputs)
        split = hash_split(partitioning.hash_keys, count, ctx.session)
        return FanOutOutputs(
            "repartition", plan, ctx, background, count, buffer, split, claim_timeout
        )
    if request.broadcast is not None:
        count = request.broadcast.output_partitions
        if count < 1:
            raise InvalidArgument(f"a broadcast head needs at least 1 output, got {count}")
        _check_outputs("broadcast", count, max_outputs)

        def copy_to_all(batch: pa.RecordBatch) -> list[pa.RecordBatch | None]:
            return [batch] * count

        return FanOutOutputs(
            "broadcast", plan, ctx, background, count, buffer, copy_to_all, claim_timeout
        )
    return DirectOutputs(plan, ctx)
