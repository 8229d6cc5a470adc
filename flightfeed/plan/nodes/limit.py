"""Limit: skips `skip` rows then passes at most `fetch`, per partition; it stops (and closes)
its input as soon as it has enough. A global limit is Limit over Coalesce."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import LimitNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, TaskContext, UnaryNode, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..distribution import output_hash_keys
from ..expr import Expr


class Limit(UnaryNode):
    name = "Limit"

    def __init__(self, child: ExecutionPlan, fetch: int | None, skip: int = 0) -> None:
        if skip < 0 or (fetch is not None and fetch < 0):
            raise InvalidArgument(f"Limit skip and fetch must be >= 0, got {skip}, {fetch}")
        self.child = child
        self.fetch = fetch
        self.skip = skip

    def output_hash_keys(self) -> tuple[Expr, ...] | None:
        """Partitions are kept as they are: the input's hash partitioning holds."""
        return output_hash_keys(self.child)

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Limit(children[0], self.fetch, self.skip)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        skip, remaining = self.skip, self.fetch
        if remaining == 0:
            return
        async with closing(self.child.execute(partition, ctx)) as stream:
            async for batch in stream:
                if skip:
                    if batch.num_rows <= skip:
                        skip -= batch.num_rows
                        continue
                    batch, skip = batch.slice(skip), 0
                if remaining is not None and batch.num_rows >= remaining:
                    yield batch.slice(0, remaining)
                    return
                if remaining is not None:
                    remaining -= batch.num_rows
                yield batch

    def __repr__(self) -> str:
        return f"Limit(skip={self.skip}, fetch={self.fetch})"


class LimitCodec:
    kinds = (Limit.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Limit):
            raise InvalidArgument(f"LimitCodec cannot encode {node.name}")
        return encode_message(LimitNode(skip=node.skip, fetch=node.fetch))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(LimitNode, payload, kind)
        expect_children(kind, children, 1)
        return Limit(children[0], msg.fetch, msg.skip)
