"""A small keyed table for the tests of the table store and its snapshots: (ts, k) its primary
key in OVERWRITE mode, `v` telling one write's rows from another's."""

from __future__ import annotations

import pyarrow as pa

from flightfeed.tables.schema import TableSchema

KEYED = TableSchema.from_arrow(
    pa.schema([("ts", pa.timestamp("ms")), ("k", pa.int64()), ("v", pa.float64())]),
    timestamp="ts",
    tags=["k"],
)


def keyed_rows(v: float, count: int, *, first_key: int = 0, start_ms: int = 0) -> pa.Table:
    """`count` rows, keys from `first_key` on, timestamps from `start_ms` on, each of value v."""
    return pa.table(
        {
            "ts": pa.array(range(start_ms, start_ms + count), pa.timestamp("ms")),
            "k": pa.array(range(first_key, first_key + count), pa.int64()),
            "v": pa.array([v] * count, pa.float64()),
        }
    )
