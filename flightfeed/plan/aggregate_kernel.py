"""One grouped aggregation step over a table, on Acero's hash group-by.

Built-in steps are pyarrow hash aggregates. Grouped UDF steps need each row's group: the
group-by also collects row numbers per group (`list`), and flattening those lists maps every
row to its group id, vectorized (no Python loop over rows or groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ExecutionError, FlightfeedError
from .functions import GroupedStateFunction

_ROW = "__ff_row"


@dataclass(frozen=True)
class BuiltinOp:
    """`output = function(source)` per group; source None means count_all (no column)."""

    source: str | None
    function: str
    output: str
    options: pc.FunctionOptions | None = None


@dataclass(frozen=True)
class GroupedOp:
    """`outputs = fn([sources], group_ids, num_groups)`: a UDF step producing state columns."""

    sources: tuple[str, ...]
    fn: GroupedStateFunction
    outputs: tuple[str, ...]
    types: tuple[pa.DataType, ...]
    udf_name: str


Op = BuiltinOp | GroupedOp


def group_aggregate(
    table: pa.Table, keys: Sequence[str], ops: Sequence[Op], *, infer: bool = False
) -> pa.Table:
    """Group `table` by `keys` and run `ops`; result columns: keys, then every op's outputs.

    With `infer`, UDFs are not called and give nulls of their declared types (schema only).
    """
    n = table.num_rows
    columns: dict[str, pa.ChunkedArray | pa.Array] = {
        f"__ff_k{i}": table.column(k) for i, k in enumerate(keys)
    }
    specs: list[tuple[object, ...]] = []
    result_names: list[str] = []
    for i, op in enumerate(ops):
        if not isinstance(op, BuiltinOp):
            continue
        if op.source is None:
            if ([], "count_all") not in specs:
                specs.append(([], "count_all"))
            result_names.append("count_all")
            continue
        columns[f"__ff_a{i}"] = table.column(op.source)
        specs.append((f"__ff_a{i}", op.function, op.options))
        result_names.append(f"__ff_a{i}_{op.function}")
    grouped_ops = [op for op in ops if isinstance(op, GroupedOp)]
    with_ids = bool(grouped_ops) and bool(keys) and not infer
    if with_ids:
        columns[_ROW] = pa.array(np.arange(n, dtype=np.int64))
        specs.append((_ROW, "list"))
    if not columns:  # a table without columns would lose its row count
        columns[_ROW] = pa.nulls(n)
    source = pa.table(columns)
    result = source.group_by([f"__ff_k{i}" for i in range(len(keys))], use_threads=False)
    result = result.aggregate(specs)
    num_groups = result.num_rows

    out: list[pa.Array | pa.ChunkedArray] = [result.column(f"__ff_k{i}") for i in range(len(keys))]
    names = list(keys)
    out += [result.column(name) for name in result_names]
    names += [op.output for op in ops if isinstance(op, BuiltinOp)]
    if grouped_ops:
        if with_ids:
            ids = _group_ids(result.column(f"{_ROW}_list"), n)
        else:
            ids = pa.array(np.zeros(n, dtype=np.int64))
        for op in grouped_ops:
            out += _run_grouped(op, table, ids, num_groups, infer=infer)
            names += op.outputs
    return pa.Table.from_arrays(out, names=names)


def _group_ids(row_lists: pa.ChunkedArray, n: int) -> pa.Array:
    """Row -> group id, from the per-group lists of row numbers."""
    lists = row_lists.combine_chunks()
    ids = np.empty(n, dtype=np.int64)
    rows = pc.list_flatten(lists).to_numpy()
    ids[rows] = pc.list_parent_indices(lists).to_numpy()
    return pa.array(ids)


def _run_grouped(
    op: GroupedOp, table: pa.Table, ids: pa.Array, num_groups: int, *, infer: bool
) -> list[pa.Array]:
    if infer:
        return [pa.nulls(num_groups, t) for t in op.types]
    args = [table.column(s).combine_chunks() for s in op.sources]
    try:
        states = list(op.fn(args, ids, num_groups))
    except FlightfeedError:
        raise
    except Exception as exc:
        raise ExecutionError(f"aggregate UDF {op.udf_name!r} failed: {exc}") from exc
    if len(states) != len(op.types):
        raise ExecutionError(
            f"aggregate UDF {op.udf_name!r} returned {len(states)} states, expected {len(op.types)}"
        )
    return [
        conform(state, t, num_groups, f"aggregate UDF {op.udf_name!r}")
        for state, t in zip(states, op.types, strict=True)
    ]


def conform(value: object, type_: pa.DataType, length: int, what: str) -> pa.Array:
    """A UDF result as an array of `type_` and `length`, or ExecutionError."""
    try:
        array = value if isinstance(value, pa.Array | pa.ChunkedArray) else pa.array(value)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if array.type != type_:
            array = array.cast(type_)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise ExecutionError(f"{what} returned a value not convertible to {type_}: {exc}") from exc
    if len(array) != length:
        raise ExecutionError(f"{what} returned {len(array)} values, expected {length}")
    return array
