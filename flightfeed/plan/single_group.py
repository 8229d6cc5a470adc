"""A grouped aggregation whose keys are constant over its input: one group, scalar kernels.

A partial aggregate on a worker often sees a single group (its partition's rows share the
key: a task, a source, a time bucket). Acero's hash aggregate costs a fixed ~80 us a call to
plan and run; the scalar kernels of the same functions, called directly, cost a few us each.
Only functions whose scalar kernel is exactly its hash kernel's result for one group are
taken (counts; sums of integers; minima and maxima of integers and temporal values), so the
result equals Acero's, types included; anything else goes to Acero as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

Spec = tuple[list[str], str, pc.FunctionOptions | None, str]
"""(argument columns, Acero function, options, result name), as the aggregate node takes."""

_HASH_COUNT_ALL: Final = "hash_count_all"
_SCALAR_TWINS: Final = {
    "hash_count": "count",
    "hash_sum": "sum",
    "hash_min": "min",
    "hash_max": "max",
}


def single_group(source: pa.Table, specs: Sequence[Spec], keys: Sequence[str]) -> pa.Table | None:
    """The aggregate of `source` grouped by `keys` as one row (key columns named `keys`,
    results by their spec names) when every key is constant and every spec is exact as a
    scalar kernel; None when Acero must do it."""
    n = source.num_rows
    if not n or not keys or not all(_exact(source, spec) for spec in specs):
        return None
    key_columns = [source.column(k) for k in keys]
    if not all(_constant(column, n) for column in key_columns):
        return None
    arrays: list[pa.Array | pa.ChunkedArray] = [column.slice(0, 1) for column in key_columns]
    for args, function, options, _ in specs:
        if function == _HASH_COUNT_ALL:
            arrays.append(pa.repeat(pa.scalar(n, pa.int64()), 1))
        else:
            value = pc.call_function(_SCALAR_TWINS[function], [source.column(args[0])], options)
            arrays.append(pa.repeat(value, 1))
    return pa.Table.from_arrays(arrays, names=[*keys, *(spec[3] for spec in specs)])


def _exact(source: pa.Table, spec: Spec) -> bool:
    args, function, _, _ = spec
    if function == _HASH_COUNT_ALL:
        return True
    if function not in _SCALAR_TWINS or len(args) != 1:
        return False
    if function == "hash_count":
        return True
    type_ = source.schema.field(args[0]).type
    if function == "hash_sum":
        return bool(pt.is_integer(type_))
    return _fixed_and_ordered(type_)


def _fixed_and_ordered(type_: pa.DataType) -> bool:
    """Integers, dates, times and timestamps: ordered, compared exactly (not durations: Arrow's
    scalar min_max has no kernel for them, its grouped one has)."""
    return bool(
        pt.is_integer(type_) or pt.is_timestamp(type_) or pt.is_date(type_) or pt.is_time(type_)
    )


def _constant(column: pa.ChunkedArray, n: int) -> bool:
    """Whether every value of `column` is the same (all null counts as one value)."""
    nulls: int = column.null_count
    if nulls:
        return nulls == n
    if not (_fixed_and_ordered(column.type) or pt.is_string(column.type)):
        return False
    if n == 1:
        return True
    if not column[0].equals(column[n - 1]):  # most mixed keys show at the ends
        return False
    bounds = pc.call_function("min_max", [column])  # (pc.min_max wraps it in ~5 us of Python)
    return bool(bounds["min"].equals(bounds["max"]))


__all__ = ["Spec", "single_group"]
