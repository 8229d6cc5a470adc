"""Coalesce: merges all input partitions into one, reading them concurrently.

Each input partition is pumped by its own task into a bounded buffer. Pumps never raise: an
input error is forwarded as an item and re-raised by the consumer outside the task group, so
a failure or an early close never cancels the consumer's task from under it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
import pyarrow as pa
from anyio.abc import ObjectSendStream

from ..._generated.flightfeed.v1 import CoalesceNode
from ...errors import InvalidArgument
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
from ..codec import DecodeContext, parse_payload

BUFFERED_BATCHES_PER_INPUT = 2


class Coalesce(PlanNodeBase):
    name = "Coalesce"

    def __init__(self, child: ExecutionPlan) -> None:
        self.child = child

    @property
    def schema(self) -> pa.Schema:
        return self.child.schema

    @property
    def output_partitions(self) -> int:
        return 1

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return (self.child,)

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Coalesce(children[0])

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        inputs = self.child.output_partitions
        if inputs == 1:
            async with closing(self.child.execute(0, ctx)) as stream:
                async for batch in stream:
                    yield batch
            return
        send, receive = anyio.create_memory_object_stream[pa.RecordBatch | Exception](
            max_buffer_size=inputs * BUFFERED_BATCHES_PER_INPUT
        )
        failure: Exception | None = None
        closed = False
        async with anyio.create_task_group() as tg, receive:
            for index in range(inputs):
                tg.start_soon(self._pump, index, ctx, send.clone())
            send.close()
            try:
                async for item in receive:
                    if isinstance(item, Exception):
                        failure = item
                        break
                    try:
                        yield item
                    except GeneratorExit:
                        closed = True
                        break
            finally:
                tg.cancel_scope.cancel()
        if failure is not None and not closed:
            raise failure

    async def _pump(
        self, index: int, ctx: TaskContext, send: ObjectSendStream[pa.RecordBatch | Exception]
    ) -> None:
        async with send:
            try:
                async with closing(self.child.execute(index, ctx)) as stream:
                    async for batch in stream:
                        await send.send(batch)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the consumer is gone
            except Exception as exc:
                # Forwarded, not raised: see the module docstring.
                try:
                    await send.send(exc)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return


class CoalesceCodec:
    kinds = (Coalesce.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Coalesce):
            raise InvalidArgument(f"CoalesceCodec cannot encode {node.name}")
        return bytes(CoalesceNode())

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        parse_payload(CoalesceNode, payload, kind)
        expect_children(kind, children, 1)
        return Coalesce(children[0])
