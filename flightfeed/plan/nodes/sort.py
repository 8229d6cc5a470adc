"""Sort: orders each partition by key expressions (Arrow's stable sort_indices), optionally
keeping only the first `fetch` rows (top-k, with bounded memory). A total order over all
partitions is Sort over Coalesce."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

import pyarrow as pa

from ..._generated.flightfeed.v1 import SortKey as SortKeyProto
from ..._generated.flightfeed.v1 import SortNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import (
    ExecutionPlan,
    TaskContext,
    UnaryNode,
    closing,
    expect_children,
)
from ..codec import DecodeContext, parse_payload
from ..distribution import output_hash_keys
from ..expr import Expr, evaluate, output_type
from ..expr_proto import expr_from_proto, expr_to_proto
from ..functions import BUILTINS, FunctionRegistry
from ..layouts import check_sortable, concat_batches, sort_indices, take_rows
from ..memory import MemoryReservation, batch_nbytes
from ..offload import run_compute

OUTPUT_BATCH_ROWS = 65536
TOP_K_COMPACT_ROWS = 65536
"""With `fetch`, buffered rows are cut back to the top k once they reach max(2k, this)."""
MAX_FETCH: Final = (1 << 63) - 1
"""Arrow counts rows in int64: a larger top-k (the wire allows uint64) is refused."""


@dataclass(frozen=True)
class SortKey:
    expr: Expr
    descending: bool = False
    nulls_first: bool = False

    def __str__(self) -> str:
        order = "DESC" if self.descending else "ASC"
        return f"{self.expr} {order} NULLS {'FIRST' if self.nulls_first else 'LAST'}"


class Sort(UnaryNode):
    name = "Sort"

    def __init__(
        self,
        child: ExecutionPlan,
        keys: Sequence[SortKey],
        *,
        fetch: int | None = None,
        functions: FunctionRegistry = BUILTINS,
    ) -> None:
        if not keys:
            raise InvalidArgument("Sort needs at least one key")
        if fetch is not None and not 0 <= fetch <= MAX_FETCH:
            raise InvalidArgument(f"Sort fetch must be in 0..{MAX_FETCH} (int64), got {fetch}")
        types = [(str(key.expr), output_type(key.expr, child.schema, functions)) for key in keys]
        check_sortable(types, "Sort")
        self.child = child
        self.keys = tuple(keys)
        self.fetch = fetch
        self._functions = functions

    def output_hash_keys(self) -> tuple[Expr, ...] | None:
        """Partitions are kept as they are: the input's hash partitioning holds."""
        return output_hash_keys(self.child)

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Sort(children[0], self.keys, fetch=self.fetch, functions=self._functions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        if self.fetch == 0:
            return
        with ctx.memory.reservation(self.name) as held:
            pending: list[pa.RecordBatch] = []
            rows = nbytes = 0
            async with closing(self.child.execute(partition, ctx)) as stream:
                async for batch in stream:
                    if not batch.num_rows:
                        continue
                    size = batch_nbytes(batch)
                    held.grow(size)
                    pending.append(batch)
                    rows += batch.num_rows
                    nbytes += size
                    if self.fetch is not None and rows >= max(2 * self.fetch, TOP_K_COMPACT_ROWS):
                        top = await self._sorted(pending, nbytes, held, ctx)
                        pending, rows, nbytes = [top], top.num_rows, top.nbytes
            if not pending:
                return
            out = await self._sorted(pending, nbytes, held, ctx)
            del pending
            for offset in range(0, out.num_rows, OUTPUT_BATCH_ROWS):
                yield out.slice(offset, OUTPUT_BATCH_ROWS)

    async def _sorted(
        self,
        batches: list[pa.RecordBatch],
        nbytes: int,
        held: MemoryReservation,
        ctx: TaskContext,
    ) -> pa.RecordBatch:
        """The batches sorted as one; the sorted copy is reserved before it is made."""
        held.grow(nbytes)
        out = await run_compute(ctx, nbytes, partial(self._sort, batches, ctx))
        held.resize(out.nbytes)
        return out

    def _sort(self, batches: list[pa.RecordBatch], ctx: TaskContext) -> pa.RecordBatch:
        batch = batches[0] if len(batches) == 1 else concat_batches(batches, "Sort")
        keys = pa.RecordBatch.from_arrays(
            [evaluate(k.expr, batch, ctx.session) for k in self.keys],
            names=[f"k{i}" for i in range(len(self.keys))],
        )
        order = [
            (
                f"k{i}",
                "descending" if k.descending else "ascending",
                "at_start" if k.nulls_first else "at_end",
            )
            for i, k in enumerate(self.keys)
        ]
        indices = sort_indices(keys, order)
        if self.fetch is not None:
            indices = indices.slice(0, self.fetch)
        return take_rows(batch, indices)

    def __repr__(self) -> str:
        return f"Sort([{', '.join(map(str, self.keys))}], fetch={self.fetch})"


class SortCodec:
    kinds = (Sort.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Sort):
            raise InvalidArgument(f"SortCodec cannot encode {node.name}")
        keys = [
            SortKeyProto(
                expr=expr_to_proto(k.expr), descending=k.descending, nulls_first=k.nulls_first
            )
            for k in node.keys
        ]
        return encode_message(SortNode(keys=keys, fetch=node.fetch))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(SortNode, payload, kind)
        expect_children(kind, children, 1)
        keys = [SortKey(expr_from_proto(k.expr), k.descending, k.nulls_first) for k in msg.keys]
        return Sort(children[0], keys, fetch=msg.fetch, functions=ctx.session)
