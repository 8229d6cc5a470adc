"""The `cpu` table the fuzzers of a worker's tables write and read: a time series of two rows."""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from flightfeed.tables.schema import TableSchema

CPU: Final = pa.schema(
    [
        pa.field("ts", pa.timestamp("ms"), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("v", pa.float64()),
    ]
)
CPU_SCHEMA: Final = TableSchema.from_arrow(CPU, timestamp="ts", tags=["host"])
"""As a table: `ts` its timestamp, `host` a tag."""
CPU_ROWS: Final = pa.record_batch(
    [pa.array([1000, 2000], pa.timestamp("ms")), pa.array(["a", "b"]), pa.array([1.0, None])],
    schema=CPU,
)
