"""Repartition: hash-partitions its input into N output partitions, executing the input once.

The first consumer starts one pump per input partition in the task's background task group
(TaskContext.background); each pump hash-partitions its batches (see hash_partition.py) into
per-output queues. Pumps wait only while every open output queue is non-empty (DataFusion's
gate): reading partitions one after the other never deadlocks, and when all consumers lag,
the input stops. An output executes once per TaskContext; closing every output stops the pumps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import TypeAlias

import anyio
import pyarrow as pa

from ..._generated.flightfeed.v1 import RepartitionNode
from ...errors import Cancelled, InvalidArgument
from ..base import ExecutionPlan, TaskContext, UnaryNode, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..expr import output_type
from ..functions import BUILTINS, FunctionRegistry
from ..hash_partition import column_hash, hash_partition
from ..offload import run_compute
from ..partitioning import Partitioning


class _End:
    """Marks the end of an output queue."""


_END = _End()
_Item: TypeAlias = "pa.RecordBatch | Exception | _End"


class Repartition(UnaryNode):
    name = "Repartition"

    def __init__(
        self,
        child: ExecutionPlan,
        partitioning: Partitioning,
        *,
        functions: FunctionRegistry = BUILTINS,
    ) -> None:
        for key in partitioning.hash_keys:
            column_hash(pa.array([], type=output_type(key, child.schema, functions)))
        self.child = child
        self.partitioning = partitioning
        self._functions = functions

    @property
    def output_partitions(self) -> int:
        return self.partitioning.partition_count

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Repartition(children[0], self.partitioning, functions=self._functions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        if ctx.background is None:
            raise InvalidArgument(
                "Repartition needs TaskContext.background (a task group living as long as the"
                " task); use open_task_context()"
            )
        fanout = ctx.node_state(self, lambda: _Fanout(self.output_partitions))
        fanout.open(partition)
        if not fanout.started:
            fanout.started = True
            ctx.background.start_soon(fanout.drive, self, ctx)
        try:
            while True:
                item = await fanout.receive(partition)
                if isinstance(item, _End):
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            fanout.close(partition)

    async def pump(self, fanout: _Fanout, index: int, ctx: TaskContext) -> None:
        """Feed one input partition into the output queues."""
        keys, n = self.partitioning.hash_keys, self.output_partitions
        async with closing(self.child.execute(index, ctx)) as stream:
            async for batch in stream:
                split = partial(hash_partition, batch, keys, n, ctx.session)
                pieces = await run_compute(ctx, batch.nbytes, split)
                await fanout.wait_for_room()
                for output, piece in enumerate(pieces):
                    if piece.num_rows:
                        fanout.push(output, piece)

    def __repr__(self) -> str:
        return f"Repartition({self.partitioning})"


class _Fanout:
    """Output queues of one Repartition execution, and the pumps feeding them."""

    def __init__(self, outputs: int) -> None:
        self.queues: list[deque[_Item]] = [deque() for _ in range(outputs)]
        self.ready = [anyio.Event() for _ in range(outputs)]
        self.room = anyio.Event()
        self.opened: set[int] = set()
        self.closed: set[int] = set()
        self.started = False
        self.finished = False
        self.scope = anyio.CancelScope()

    def open(self, output: int) -> None:
        if output in self.opened:
            raise InvalidArgument(f"Repartition partition {output} already executed in this task")
        self.opened.add(output)

    def close(self, output: int) -> None:
        self.closed.add(output)
        self.queues[output].clear()
        self.room.set()
        if len(self.closed) == len(self.queues):
            self.scope.cancel()  # nobody is left to read

    def push(self, output: int, item: _Item) -> None:
        if output not in self.closed:
            self.queues[output].append(item)
            self.ready[output].set()

    def finish(self, outcome: Exception | _End) -> None:
        """End every output: with `_END` after its data, or with an error right away."""
        if self.finished:
            return
        self.finished = True
        for output, queue in enumerate(self.queues):
            if isinstance(outcome, Exception):
                queue.clear()
            self.push(output, outcome)

    async def receive(self, output: int) -> _Item:
        queue = self.queues[output]
        while not queue:
            await self.ready[output].wait()
            self.ready[output] = anyio.Event()
        item = queue.popleft()
        if not queue:
            self.room.set()
        return item

    async def wait_for_room(self) -> None:
        while not any(not q for i, q in enumerate(self.queues) if i not in self.closed) and len(
            self.closed
        ) < len(self.queues):
            room = self.room
            await room.wait()
            if self.room is room:
                self.room = anyio.Event()

    async def drive(self, node: Repartition, ctx: TaskContext) -> None:
        """Run one pump per input partition; never raises (errors go to the consumers)."""
        outcome: Exception | _End = Cancelled("Repartition input was cancelled")
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    for index in range(node.child.output_partitions):
                        tg.start_soon(self._guarded_pump, node, index, ctx)
                if not self.finished:
                    outcome = _END
        finally:
            self.finish(outcome)

    async def _guarded_pump(self, node: Repartition, index: int, ctx: TaskContext) -> None:
        try:
            await node.pump(self, index, ctx)
        except Exception as exc:
            self.finish(exc)
            self.scope.cancel()


class RepartitionCodec:
    kinds = (Repartition.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Repartition):
            raise InvalidArgument(f"RepartitionCodec cannot encode {node.name}")
        return bytes(RepartitionNode(partitioning=node.partitioning.to_proto()))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(RepartitionNode, payload, kind)
        expect_children(kind, children, 1)
        partitioning = Partitioning.from_proto(msg.partitioning)
        return Repartition(children[0], partitioning, functions=ctx.session)
