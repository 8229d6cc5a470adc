"""How many bytes a hash join will allocate, known before it runs.

Acero materializes a join's whole output, so a join must reserve that memory up front. The
output of an equi-join is the sum, over the keys both sides share, of (left rows with the key) x
(right rows with the key): two grouped counts and a join of the counts give it exactly, at the
cost of hashing each side once more. The counts are joined by the same Acero join, so null keys
match (or not) exactly as they do in the join itself.
Outer joins add at most every row of their outer sides; semi and anti joins return at most the
rows of the side they keep.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

CHEAP_BOUND_BYTES = 64 << 20
"""When even every-row-matches-every-row stays below this, skip counting the matches."""


def _row_width(table: pa.Table) -> float:
    """Bytes a row of `table` takes, at least what its schema takes for a row of nulls: an outer
    join fills the missing side's columns so (and an empty side's rows measure nothing)."""
    measured = table.nbytes / table.num_rows if table.num_rows else 0.0
    return max(measured, sum(_null_row_width(field.type) for field in table.schema))


def _null_row_width(data_type: pa.DataType) -> float:
    """Bytes of one null value of `data_type` in Arrow's layout, validity bits aside: a fixed
    width type keeps its value slot, a variable one its offset (or view)."""
    if pa.types.is_struct(data_type):
        return sum(_null_row_width(data_type.field(i).type) for i in range(data_type.num_fields))
    if pa.types.is_fixed_size_list(data_type):
        return float(data_type.list_size) * _null_row_width(data_type.value_type)
    if pa.types.is_dictionary(data_type):
        return float(data_type.index_type.bit_width) / 8
    if pa.types.is_null(data_type):
        return 0.0
    if pa.types.is_large_string(data_type) or pa.types.is_large_binary(data_type):
        return 8.0
    if pa.types.is_large_list(data_type):
        return 8.0
    if pa.types.is_list_view(data_type):  # an offset and a size
        return 8.0
    if pa.types.is_large_list_view(data_type):
        return 16.0
    if pa.types.is_string_view(data_type) or pa.types.is_binary_view(data_type):
        return 16.0
    try:
        return float(data_type.bit_width) / 8
    except ValueError:  # variable width: string, binary, list, map (32-bit offsets)
        return 4.0


def matched_rows(
    left: pa.Table, right: pa.Table, left_keys: Sequence[str], right_keys: Sequence[str]
) -> int:
    """Rows an inner equi-join of the two tables returns."""
    if not left.num_rows or not right.num_rows:
        return 0
    left_names = [f"k{i}" for i in range(len(left_keys))]
    right_names = [f"r{i}" for i in range(len(right_keys))]
    left_counts = (
        left.select(list(left_keys))
        .rename_columns(left_names)
        .group_by(left_names, use_threads=False)
        .aggregate([([], "count_all")])
        .rename_columns([*left_names, "left_count"])
    )
    right_counts = (
        right.select(list(right_keys))
        .rename_columns(right_names)
        .group_by(right_names, use_threads=False)
        .aggregate([([], "count_all")])
        .rename_columns([*right_names, "right_count"])
    )
    pairs = left_counts.join(
        right_counts,
        keys=left_names,
        right_keys=right_names,
        join_type="inner",
        use_threads=False,
    )
    if not pairs.num_rows:
        return 0
    products = pc.multiply(
        pc.cast(pairs["left_count"], pa.float64()), pc.cast(pairs["right_count"], pa.float64())
    )
    return int(pc.sum(products).as_py())


def estimate_join_bytes(
    left: pa.Table,
    right: pa.Table,
    left_keys: Sequence[str],
    right_keys: Sequence[str],
    join_type: str,
) -> int:
    """Bytes of the join's output plus its hash table (about the size of the build side)."""
    left_width, right_width = _row_width(left), _row_width(right)
    if "semi" in join_type or "anti" in join_type:
        kept = left if join_type.startswith("left") else right
        return int(kept.nbytes + right.nbytes)
    width = left_width + right_width
    worst = float(left.num_rows) * float(right.num_rows) * width
    rows = (
        float(left.num_rows) * float(right.num_rows)
        if worst <= CHEAP_BOUND_BYTES
        else float(matched_rows(left, right, left_keys, right_keys))
    )
    if join_type in ("left outer", "full outer"):
        rows += left.num_rows
    if join_type in ("right outer", "full outer"):
        rows += right.num_rows
    columns = left.num_columns + right.num_columns
    validity = columns * (rows / 8 + 64)  # outer rows add null bitmaps to the other side
    return int(rows * width + validity) + int(right.nbytes)
