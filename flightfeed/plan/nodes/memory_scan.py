"""MemoryScan: record batches held in memory, split into partitions (tests, demos, small
broadcast sides). On the wire each partition is an Arrow IPC stream."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence

import anyio.lowlevel
import pyarrow as pa

from ..._generated.flightfeed.v1 import MemoryScanNode
from ...errors import InvalidArgument, PlanDecodeError
from ...protoencode import encode_message
from ..arrow_ipc import read_ipc_schema, read_ipc_stream, write_ipc_stream
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, expect_children
from ..codec import DecodeBudget, DecodeContext, parse_payload


class MemoryScan(PlanNodeBase):
    name = "MemoryScan"

    def __init__(self, schema: pa.Schema, partitions: Sequence[Sequence[pa.RecordBatch]]):
        if not partitions:
            raise InvalidArgument("MemoryScan needs at least one partition")
        for part in partitions:
            for batch in part:
                if not batch.schema.equals(schema, check_metadata=False):
                    raise InvalidArgument(
                        f"MemoryScan batch schema {batch.schema} differs from {schema}"
                    )
        self._schema = schema
        self.partitions: tuple[tuple[pa.RecordBatch, ...], ...] = tuple(
            tuple(p) for p in partitions
        )
        self.embedded_bytes = sum(batch.nbytes for part in self.partitions for batch in part)
        """Held as long as the plan: a worker reserves it for the task (see plan/memory.py)."""
        self.embedded_rows = sum(batch.num_rows for part in self.partitions for batch in part)

    @classmethod
    def from_table(
        cls, table: pa.Table, partitions: int = 1, *, batch_rows: int | None = None
    ) -> MemoryScan:
        """Split `table` into `partitions` contiguous row ranges of near-equal size."""
        if partitions < 1:
            raise InvalidArgument(f"partitions must be at least 1, got {partitions}")
        n = table.num_rows
        bounds = [n * i // partitions for i in range(partitions + 1)]
        parts = [
            table.slice(lo, hi - lo).to_batches(max_chunksize=batch_rows)
            for lo, hi in itertools.pairwise(bounds)
        ]
        return cls(table.schema, parts)

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def output_partitions(self) -> int:
        return len(self.partitions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        for batch in self.partitions[partition]:
            await anyio.lowlevel.checkpoint()  # stay cancellable and fair to other streams
            yield batch


def _read_partition(data: bytes, schema: pa.Schema, budget: DecodeBudget) -> list[pa.RecordBatch]:
    """One partition's batches, decoded only if they fit in what is left of the plan's budget."""
    found, batches = read_ipc_stream(
        data, "MemoryScan partition", max_decoded_bytes=budget.remaining
    )
    budget.charge(sum(batch.nbytes for batch in batches))
    if not found.equals(schema, check_metadata=False):
        raise PlanDecodeError(f"MemoryScan partition schema {found} is not {schema}")
    return batches


class MemoryScanCodec:
    kinds = (MemoryScan.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, MemoryScan):
            raise InvalidArgument(f"MemoryScanCodec cannot encode {node.name}")
        return encode_message(
            MemoryScanNode(
                schema=node.schema.serialize().to_pybytes(),
                partitions=[write_ipc_stream(node.schema, p) for p in node.partitions],
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(MemoryScanNode, payload, kind)
        expect_children(kind, children, 0)
        schema = read_ipc_schema(msg.schema, "MemoryScan schema")
        return MemoryScan(schema, [_read_partition(p, schema, ctx.budget) for p in msg.partitions])
