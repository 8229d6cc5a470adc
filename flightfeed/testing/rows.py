"""Generated rows, the same for every reader: benchmarks compare ways of reading one dataset
(through flightfeed, from a Python data source, from Parquet) without any of them paying for
I/O. Each process generates a partition once (Arrow C++ kernels) and keeps it; a
`GeneratedRows` leaf serves it from a worker, and only its three numbers travel in a plan.
`catalog` serves it as the table `generated(rows, partitions)`; workers in other processes
decode it with `--session-builder flightfeed.testing.rows:worker_session`.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Final

import anyio
import anyio.lowlevel
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..coordinator import Catalog
from ..errors import InvalidArgument, PlanDecodeError
from ..plan import DecodeContext, ExecutionPlan, PlanNodeBase, TaskContext
from ..plan.base import expect_children

ROWS_SCHEMA: Final = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("x", pa.float64(), nullable=False),
        pa.field("bucket", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
    ]
)
MAX_ROWS: Final = 1 << 34
MAX_PARTITIONS: Final = 4096
MAX_BATCH_ROWS: Final = 1 << 22
_PAYLOAD = struct.Struct("<QII")


def _check(rows: int, partitions: int, batch_rows: int) -> None:
    if not 0 <= rows <= MAX_ROWS:
        raise InvalidArgument(f"rows must be in 0..{MAX_ROWS}, got {rows}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgument(f"partitions must be in 1..{MAX_PARTITIONS}, got {partitions}")
    if not 1 <= batch_rows <= MAX_BATCH_ROWS:
        raise InvalidArgument(f"batch_rows must be in 1..{MAX_BATCH_ROWS}, got {batch_rows}")


@functools.lru_cache(maxsize=64)
def generated_partition(
    rows: int, partitions: int, index: int, batch_rows: int = 65536
) -> tuple[pa.RecordBatch, ...]:
    """Partition `index` of `rows` rows split into `partitions` contiguous ranges: id, x = id/2,
    bucket = id % 97 and name = "n<bucket>", in batches of `batch_rows`."""
    _check(rows, partitions, batch_rows)
    if not 0 <= index < partitions:
        raise InvalidArgument(f"partition {index} is not in 0..{partitions - 1}")
    lo, hi = rows * index // partitions, rows * (index + 1) // partitions
    ids = pa.array(np.arange(lo, hi, dtype=np.int64))
    buckets = pc.remainder(ids, 97)
    table = pa.Table.from_arrays(
        [
            ids,
            pc.divide(pc.cast(ids, pa.float64()), 2.0),
            buckets,
            pc.binary_join_element_wise("n", pc.cast(buckets, pa.string()), ""),
        ],
        schema=ROWS_SCHEMA,
    )
    return tuple(table.combine_chunks().to_batches(max_chunksize=batch_rows))


def generated_table(rows: int, partitions: int = 1, batch_rows: int = 65536) -> pa.Table:
    """All partitions as one table (the reference a reader's result is checked against)."""
    batches = [
        batch
        for index in range(partitions)
        for batch in generated_partition(rows, partitions, index, batch_rows)
    ]
    return pa.Table.from_batches(batches, schema=ROWS_SCHEMA)


class GeneratedRows(PlanNodeBase):
    """A leaf serving `generated_partition`s; the first read in a process generates them (off
    the event loop), later reads serve them from memory."""

    name = "GeneratedRows"

    def __init__(self, rows: int, partitions: int, batch_rows: int = 65536) -> None:
        _check(rows, partitions, batch_rows)
        self.rows = rows
        self.partitions = partitions
        self.batch_rows = batch_rows

    @property
    def schema(self) -> pa.Schema:
        return ROWS_SCHEMA

    @property
    def output_partitions(self) -> int:
        return self.partitions

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        batches = await anyio.to_thread.run_sync(
            generated_partition, self.rows, self.partitions, partition, self.batch_rows
        )
        for batch in batches:
            await anyio.lowlevel.checkpoint()  # stay cancellable and fair to other streams
            yield batch

    def __repr__(self) -> str:
        return f"GeneratedRows(rows={self.rows}, partitions={self.partitions})"


class GeneratedRowsCodec:
    """Encodes a GeneratedRows leaf as its three numbers (16 bytes)."""

    kinds = (GeneratedRows.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, GeneratedRows):
            raise InvalidArgument(f"GeneratedRowsCodec cannot encode {node.name}")
        return _PAYLOAD.pack(node.rows, node.partitions, node.batch_rows)

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        expect_children(kind, children, 0)
        if len(payload) != _PAYLOAD.size:
            raise PlanDecodeError(
                f"{kind} payload is {len(payload)} bytes, expected {_PAYLOAD.size}"
            )
        try:
            return GeneratedRows(*_PAYLOAD.unpack(payload))
        except InvalidArgument as exc:
            raise PlanDecodeError(f"{kind}: {exc}") from None


catalog: Final = Catalog().with_codec(GeneratedRowsCodec())


@catalog.table("generated")
def generated(rows: int, partitions: int = 1) -> ExecutionPlan:
    """`rows` generated rows (id, x, bucket, name) in `partitions` partitions."""
    return GeneratedRows(rows, partitions)


worker_session: Final = catalog.worker_session
"""The session builder of a worker that serves `catalog`'s table."""

__all__ = [
    "ROWS_SCHEMA",
    "GeneratedRows",
    "GeneratedRowsCodec",
    "catalog",
    "generated_partition",
    "generated_table",
    "worker_session",
]
