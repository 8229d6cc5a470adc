"""Filter: keeps the rows where a boolean expression is true (null counts as false)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial

import pyarrow as pa

from ..._generated.flightfeed.v1 import FilterNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, TaskContext, UnaryNode, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..distribution import output_hash_keys
from ..expr import Expr, calls_udf, evaluate, output_type
from ..expr_proto import expr_from_proto, expr_to_proto
from ..functions import BUILTINS, FunctionRegistry
from ..layouts import filter_rows
from ..memory import batch_nbytes
from ..offload import run_compute


class Filter(UnaryNode):
    name = "Filter"

    def __init__(
        self, child: ExecutionPlan, predicate: Expr, *, functions: FunctionRegistry = BUILTINS
    ) -> None:
        kind = output_type(predicate, child.schema, functions)
        if not (pa.types.is_boolean(kind) or pa.types.is_null(kind)):
            raise InvalidArgument(f"filter predicate {predicate} is {kind}, not boolean")
        self.child = child
        self.predicate = predicate
        self._functions = functions

    def output_hash_keys(self) -> tuple[Expr, ...] | None:
        """Partitions are kept as they are: the input's hash partitioning holds."""
        return output_hash_keys(self.child)

    @property
    def functions(self) -> FunctionRegistry:
        """The functions its expressions resolve against."""
        return self._functions

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Filter(children[0], self.predicate, functions=self._functions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        user_code = calls_udf([self.predicate], ctx.session)
        async with closing(self.child.execute(partition, ctx)) as stream:
            async for batch in stream:
                apply = partial(self._apply, batch, ctx)
                out = await run_compute(ctx, batch_nbytes(batch), apply, user_code=user_code)
                if out.num_rows:
                    yield out

    def _apply(self, batch: pa.RecordBatch, ctx: TaskContext) -> pa.RecordBatch:
        mask = evaluate(self.predicate, batch, ctx.session)
        if pa.types.is_null(mask.type):  # NULL (unknown) everywhere: no row passes
            return batch.slice(0, 0)
        return filter_rows(batch, mask)

    def __repr__(self) -> str:
        return f"Filter({self.predicate})"


class FilterCodec:
    kinds = (Filter.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Filter):
            raise InvalidArgument(f"FilterCodec cannot encode {node.name}")
        return encode_message(FilterNode(predicate=expr_to_proto(node.predicate)))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(FilterNode, payload, kind)
        expect_children(kind, children, 1)
        return Filter(children[0], expr_from_proto(msg.predicate), functions=ctx.session)
