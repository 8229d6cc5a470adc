"""Union: the partitions of all inputs, one after the other (no copy, no reordering)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import UnionNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing
from ..codec import DecodeContext, parse_payload


class Union(PlanNodeBase):
    name = "Union"

    def __init__(self, inputs: Sequence[ExecutionPlan]) -> None:
        if not inputs:
            raise InvalidArgument("Union needs at least one input")
        schema = inputs[0].schema
        for other in inputs[1:]:
            if not other.schema.equals(schema, check_metadata=False):
                raise InvalidArgument(f"Union inputs differ in schema: {schema} vs {other.schema}")
        self.inputs = tuple(inputs)

    @property
    def schema(self) -> pa.Schema:
        return self.inputs[0].schema

    @property
    def output_partitions(self) -> int:
        return sum(child.output_partitions for child in self.inputs)

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return self.inputs

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        return Union(children)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        for child in self.inputs:
            if partition < child.output_partitions:
                async with closing(child.execute(partition, ctx)) as stream:
                    async for batch in stream:
                        yield batch
                return
            partition -= child.output_partitions


class UnionCodec:
    kinds = (Union.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Union):
            raise InvalidArgument(f"UnionCodec cannot encode {node.name}")
        return encode_message(UnionNode())

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        parse_payload(UnionNode, payload, kind)
        return Union(children)
