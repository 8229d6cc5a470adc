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
from pyarrow.acero import AggregateNodeOptions, Declaration, TableSourceNodeOptions

from ..errors import ExecutionError, FlightfeedError
from .checked_sum import Widened, narrow_sum, widen_for_sum
from .float_keys import normalized
from .functions import GroupedStateFunction
from .layouts import plain_values, restored
from .single_group import single_group

_ANY_LAYOUT = frozenset({"count", "count_distinct"})
"""Arrow's hash aggregates that take views and dictionaries as they are; the others are given
plain values (its min and max take neither), and none takes runs."""
_OF_ITS_VALUES = frozenset({"min", "max"})
"""Aggregates whose result is one of the values: of a view column, a view (as DataFusion's)."""
_ROW = "__ff_row"
_ROW_LISTS = "__ff_row_lists"
_COUNT_ALL = "__ff_count_all"


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
    hash_prefix = "hash_" if keys else ""  # Acero's grouped kernels vs its scalar ones
    names = [f"__ff_k{i}" for i in range(len(keys))]
    key_types = [table.column(k).type for k in keys]
    # (Acero groups by views and dictionaries, not by runs: those are decoded, and encoded again)
    arrays: list[pa.ChunkedArray | pa.Array] = [
        normalized(plain_values(table.column(k), dictionaries=False, views=False)) for k in keys
    ]
    specs: list[tuple[list[str], str, pc.FunctionOptions | None, str]] = []
    result_names: list[str] = []
    widened: dict[str, Widened] = {}
    views: dict[str, pa.DataType] = {}  # results to give their input's view layout back
    for i, op in enumerate(ops):
        if not isinstance(op, BuiltinOp):
            continue
        if op.source is None:
            if _COUNT_ALL not in result_names:  # one count_all serves every count(*)
                specs.append(([], hash_prefix + "count_all", None, _COUNT_ALL))
            result_names.append(_COUNT_ALL)
            continue
        names.append(f"__ff_a{i}")
        column = table.column(op.source)
        any_layout = op.function in _ANY_LAYOUT
        plain = plain_values(column, dictionaries=not any_layout, views=not any_layout)
        if _is_view(column.type) and op.function in _OF_ITS_VALUES:
            views[f"__ff_r{i}"] = column.type
        column = plain
        wide = widen_for_sum(column) if op.function == "sum" else None
        if wide is not None:
            widened[f"__ff_r{i}"] = wide
            column = wide.column
        arrays.append(column)
        specs.append(([f"__ff_a{i}"], hash_prefix + op.function, op.options, f"__ff_r{i}"))
        result_names.append(f"__ff_r{i}")
    grouped_ops = [op for op in ops if isinstance(op, GroupedOp)]
    with_ids = bool(grouped_ops) and bool(keys) and not infer
    if with_ids:
        names.append(_ROW)
        arrays.append(pa.array(np.arange(n, dtype=np.int64)))
        specs.append(([_ROW], "hash_list", None, _ROW_LISTS))
    if not arrays:  # a table without columns would lose its row count
        names.append(_ROW)
        arrays.append(pa.nulls(n))
    source = pa.Table.from_arrays(arrays, names=names)
    result = _aggregate(source, specs, names[: len(keys)])
    num_groups = result.num_rows

    out: list[pa.Array | pa.ChunkedArray] = [
        restored(result.column(name), type_)
        for name, type_ in zip(names[: len(keys)], key_types, strict=True)
    ]
    out_names = list(keys)
    builtin_outputs = [op.output for op in ops if isinstance(op, BuiltinOp)]
    out += [
        narrow_sum(result.column(name), widened[name], repr(output))
        if name in widened
        else restored(result.column(name), views[name])
        if name in views
        else result.column(name)
        for name, output in zip(result_names, builtin_outputs, strict=True)
    ]
    out_names += builtin_outputs
    if grouped_ops:
        if with_ids:
            ids = _group_ids(result.column(_ROW_LISTS), n)
        else:
            ids = pa.array(np.zeros(n, dtype=np.int64))
        for op in grouped_ops:
            out += _run_grouped(op, table, ids, num_groups, infer=infer)
            out_names += op.outputs
    return pa.Table.from_arrays(out, names=out_names)


def _is_view(type_: pa.DataType) -> bool:
    return bool(pa.types.is_string_view(type_) or pa.types.is_binary_view(type_))


def _aggregate(
    source: pa.Table,
    specs: list[tuple[list[str], str, pc.FunctionOptions | None, str]],
    keys: list[str],
) -> pa.Table:
    """Acero's aggregate node over `source`, on the calling thread. Declared directly:
    `Table.group_by(...).aggregate(...)` renames and re-checks every spec in Python first,
    ~12 us of a 100-row partial aggregate's ~60. One group (constant keys) skips Acero."""
    one = single_group(source, specs, keys)
    if one is not None:
        return one
    return Declaration(
        "aggregate",
        AggregateNodeOptions(specs, keys=keys),
        inputs=[Declaration("table_source", TableSourceNodeOptions(source))],
    ).to_table(use_threads=False)


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
