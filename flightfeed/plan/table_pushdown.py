"""Moves work into TableScans, where the table store does it, and prunes partitions.

- A Filter over a TableScan (or over a Union of them) becomes the scan's predicates: DuckDB
  evaluates what it can exactly, Arrow the rest, on the worker that holds the table. A
  predicate calling a session UDF stays a Filter (the store resolves only built-ins).
- A Projection of plain columns over a TableScan becomes the scan's column list (the
  Projection stays over it when it declares different nullability, so the output schema is
  exactly the plan's).
- A scan of one partition of a partitioned table whose predicates pin every partition key
  (`key = literal`, `key IN (...)`) to values that hash to other partitions reads nothing: it
  leaves its Union. Pruning hashes the literals exactly as rows were routed
  (plan/hash_partition.py), so it never drops a partition holding a matching row.

Every rewrite keeps the result: rows, columns and order of columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import numpy as np
import pyarrow as pa

from .base import ExecutionPlan
from .expr import Call, Column, Expr, Literal, calls_udf
from .hash_partition import hash_rows
from .metrics import unwrap
from .nodes.filter import Filter
from .nodes.memory_scan import MemoryScan
from .nodes.projection import Projection
from .nodes.table_scan import TableScan
from .nodes.union import Union
from .options_codec import set_lookup_values

MAX_PRUNING_COMBINATIONS: Final = 4096
"""Key value combinations hashed to prune (beyond, every partition is read)."""


def push_into_table_scans(plan: ExecutionPlan) -> ExecutionPlan:
    """The plan with filters and projections moved into its TableScans, and the partitions no
    row can come from pruned."""
    node = unwrap(plan)
    children = [push_into_table_scans(child) for child in node.children]
    if children and any(new is not old for new, old in zip(children, node.children, strict=True)):
        node = node.with_children(children)
    if isinstance(node, Filter):
        return _push_filter(node)
    if isinstance(node, Projection):
        scan = unwrap(node.child)
        if isinstance(scan, TableScan) and _plain_columns(node) and not scan.spec.columns:
            columns = tuple(node.names)
            schema = pa.schema([scan.schema.field(name) for name in columns])
            narrowed = scan.with_spec(replace(scan.spec, columns=columns), schema)
            if schema.equals(node.schema):
                return narrowed
            # The projection declares its columns nullable: it stays, over the narrower read,
            # so the plan's output schema is exactly what it was.
            return node.with_children([narrowed])
    return node


def _push_filter(node: Filter) -> ExecutionPlan:
    child = unwrap(node.child)
    if calls_udf([node.predicate], node.functions):
        return node
    if isinstance(child, TableScan):
        return _filtered_scan(child, node.predicate)
    if isinstance(child, Union) and any(isinstance(unwrap(i), TableScan) for i in child.inputs):
        each = [Filter(i, node.predicate, functions=node.functions) for i in child.inputs]
        inputs = [_push_filter(f) for f in each]
        kept = [i for i in inputs if not _pruned(i)]
        if not kept:  # every partition pruned: no row can match
            return MemoryScan(child.schema, [[]])
        return kept[0] if len(kept) == 1 else Union(kept)
    return node


def _filtered_scan(scan: TableScan, predicate: Expr) -> ExecutionPlan:
    spec = replace(scan.spec, predicates=(*scan.spec.predicates, predicate))
    pushed = scan.with_spec(spec, scan.schema)
    return _PRUNED if _prunable(pushed) else pushed


class _Pruned(MemoryScan):
    """Marks a pruned input while a Union is rebuilt (never left in a plan)."""


_PRUNED: Final = _Pruned(pa.schema([]), [[]])


def _pruned(node: ExecutionPlan) -> bool:
    return node is _PRUNED


def _plain_columns(node: Projection) -> bool:
    return all(
        isinstance(expr, Column) and expr.name == name
        for expr, name in zip(node.exprs, node.names, strict=True)
    )


def _prunable(scan: TableScan) -> bool:
    """Whether no row of this partition can satisfy the scan's predicates."""
    partition = scan.partition
    if partition is None:
        return False
    pinned = _pinned_values(scan.spec.predicates)
    if any(key not in pinned or key not in scan.schema.names for key in partition.keys):
        return False
    # As the rows were hashed: values of the key column's type (one that cannot be cast
    # exactly equals no value of the column, so it cannot match a row anywhere).
    choices = [_as_type(pinned[key], scan.schema.field(key).type) for key in partition.keys]
    combinations = 1
    for values in choices:
        combinations *= len(values)
    if combinations == 0:
        return True  # e.g. `key IN ()`: nothing matches anywhere
    if combinations > MAX_PRUNING_COMBINATIONS:
        return False
    rows = list(itertools.product(*choices))
    columns = [pa.array([row[i] for row in rows], type=c[0].type) for i, c in enumerate(choices)]
    partitions = hash_rows(columns, len(rows)) % np.uint64(partition.count)
    return partition.index not in {int(p) for p in partitions}


def _as_type(values: list[pa.Scalar], kind: pa.DataType) -> list[pa.Scalar]:
    out = []
    for value in values:
        try:
            out.append(value.cast(kind, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            continue
    return out


def _pinned_values(predicates: Sequence[Expr]) -> dict[str, list[pa.Scalar]]:
    """Per column, the values conjuncts `col = literal` or `col IN (...)` allow (intersected)."""
    found: dict[str, list[pa.Scalar]] = {}
    for conjunct in _conjuncts(predicates):
        pinned = _pin(conjunct)
        if pinned is None:
            continue
        name, values = pinned
        if name in found:
            allowed = {v.as_py() for v in values}
            found[name] = [v for v in found[name] if v.as_py() in allowed]
        else:
            found[name] = values
    return found


def _conjuncts(exprs: Sequence[Expr]) -> list[Expr]:
    out: list[Expr] = []
    for expr in exprs:
        if isinstance(expr, Call) and expr.function in ("and", "and_kleene") and not expr.options:
            out.extend(_conjuncts(expr.args))
        else:
            out.append(expr)
    return out


def _pin(expr: Expr) -> tuple[str, list[pa.Scalar]] | None:
    if not isinstance(expr, Call):
        return None
    if expr.function == "equal" and len(expr.args) == 2:
        left, right = expr.args
        if isinstance(right, Column) and isinstance(left, Literal):
            left, right = right, left
        if isinstance(left, Column) and isinstance(right, Literal) and right.value.is_valid:
            return left.name, [right.value]
    if expr.function == "is_in" and len(expr.args) == 1 and isinstance(expr.args[0], Column):
        values = set_lookup_values(expr.options)
        if values is not None:
            return expr.args[0].name, [v for v in values if v.is_valid]
    return None


__all__ = ["MAX_PRUNING_COMBINATIONS", "push_into_table_scans"]
