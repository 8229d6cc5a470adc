"""Floating-point keys compared as SQL compares them: -0.0 equals 0.0, and a NaN equals a NaN.

Acero's hash group-by and hash join compare float keys by their bits: -0.0 and 0.0 were two
groups and never joined, and the NaN of 0.0 / 0.0 (its sign bit set) was a group apart from a
stored NaN, where DuckDB and Spark (its NormalizeFloatingNumbers rule) take each pair as one
value. Keys are normalized before Acero sees them; hash partitioning folds them the same way
(hash_partition.py), so equal keys also meet in one partition. Filters are Arrow's own
(`equal` already has -0.0 = 0.0, and NaN equal to nothing), and sorts are unchanged.
"""

from __future__ import annotations

from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

Values = TypeVar("Values", pa.Array, pa.ChunkedArray)


def needs_normalizing(type_: pa.DataType) -> bool:
    """Keys of this type have values that are equal in SQL with different bits."""
    return bool(pa.types.is_float32(type_) or pa.types.is_float64(type_))


def normalized(values: Values) -> Values:
    """`values` with -0.0 as 0.0 and every NaN as one NaN (others, and other types, as they
    are)."""
    if not needs_normalizing(values.type):
        return values
    positive = pc.add(values, pa.scalar(0.0, values.type))  # -0.0 + 0.0 is 0.0
    nan = pa.scalar(float("nan"), values.type)
    result: Values = pc.if_else(pc.is_nan(positive), nan, positive)
    return result


__all__ = ["needs_normalizing", "normalized"]
