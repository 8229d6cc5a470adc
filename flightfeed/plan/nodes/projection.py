"""Projection: one output column per expression, under the given names."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial

import pyarrow as pa

from ..._generated.flightfeed.v1 import ProjectionNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, TaskContext, UnaryNode, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..expr import Expr, calls_udf, evaluate, output_type
from ..expr_proto import named_from_proto, named_to_proto
from ..functions import BUILTINS, FunctionRegistry
from ..memory import batch_nbytes
from ..offload import run_compute


class Projection(UnaryNode):
    name = "Projection"

    def __init__(
        self,
        child: ExecutionPlan,
        exprs: Sequence[Expr],
        names: Sequence[str],
        *,
        functions: FunctionRegistry = BUILTINS,
    ) -> None:
        if len(exprs) != len(names):
            raise InvalidArgument(f"Projection has {len(exprs)} expressions, {len(names)} names")
        if len(set(names)) != len(names):
            raise InvalidArgument(f"Projection output names are not unique: {list(names)}")
        self.child = child
        self.exprs = tuple(exprs)
        self.names = tuple(names)
        self._functions = functions
        self._schema = pa.schema(
            [
                pa.field(name, output_type(expr, child.schema, functions))
                for expr, name in zip(self.exprs, self.names, strict=True)
            ]
        )

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def functions(self) -> FunctionRegistry:
        """The functions its expressions resolve against."""
        return self._functions

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Projection(children[0], self.exprs, self.names, functions=self._functions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        user_code = calls_udf(self.exprs, ctx.session)
        async with closing(self.child.execute(partition, ctx)) as stream:
            async for batch in stream:
                apply = partial(self._apply, batch, ctx)
                yield await run_compute(ctx, batch_nbytes(batch), apply, user_code=user_code)

    def _apply(self, batch: pa.RecordBatch, ctx: TaskContext) -> pa.RecordBatch:
        if not self.exprs:
            return batch.select([])  # keeps the row count, unlike an empty from_arrays
        arrays = [evaluate(expr, batch, ctx.session) for expr in self.exprs]
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def __repr__(self) -> str:
        cols = ", ".join(f"{e} AS {n}" for e, n in zip(self.exprs, self.names, strict=True))
        return f"Projection({cols})"


class ProjectionCodec:
    kinds = (Projection.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Projection):
            raise InvalidArgument(f"ProjectionCodec cannot encode {node.name}")
        exprs = [named_to_proto(e, n) for e, n in zip(node.exprs, node.names, strict=True)]
        return encode_message(ProjectionNode(exprs=exprs))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(ProjectionNode, payload, kind)
        expect_children(kind, children, 1)
        named = [named_from_proto(e) for e in msg.exprs]
        return Projection(
            children[0], [e for e, _ in named], [n for _, n in named], functions=ctx.session
        )
