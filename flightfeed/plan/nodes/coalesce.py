"""Coalesce: merges all input partitions into one, reading them concurrently (see merge.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import CoalesceNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, TaskContext, UnaryNode, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..merge import merge

BUFFERED_BATCHES_PER_INPUT = 2


class Coalesce(UnaryNode):
    name = "Coalesce"

    def __init__(self, child: ExecutionPlan) -> None:
        self.child = child

    @property
    def output_partitions(self) -> int:
        return 1

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Coalesce(children[0])

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        inputs = {
            index: self.child.execute(index, ctx) for index in range(self.child.output_partitions)
        }
        async with closing(merge(inputs, BUFFERED_BATCHES_PER_INPUT)) as stream:
            async for _, batch in stream:
                yield batch


class CoalesceCodec:
    kinds = (Coalesce.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Coalesce):
            raise InvalidArgument(f"CoalesceCodec cannot encode {node.name}")
        return encode_message(CoalesceNode())

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        parse_payload(CoalesceNode, payload, kind)
        expect_children(kind, children, 1)
        return Coalesce(children[0])
