"""A read's predicates, split between DuckDB and Arrow.

Conjuncts DuckDB evaluates exactly as Arrow would go into the scan's WHERE (its zone maps skip
what they rule out): comparisons of a column with a literal, NOT of one, IS [NOT] NULL, is_nan
and signbit of a float column (and NOT of those), IN of a value set, and Kleene AND/OR of
those. NaN is where the engines differ (DuckDB orders it above every number and equal to
itself, Arrow compares it false): float comparisons are written so both agree, and one with a
NaN literal stays with Arrow.
Everything else (other functions, non-Kleene `or`, whose NULL handling differs from SQL's) is
evaluated on the scanned batches by pyarrow.compute, so every predicate is honoured wherever
it runs. Literals travel as bound parameters, never as SQL text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from ..plan.expr import Call, Column, Expr, Literal, output_type
from ..plan.options_codec import options_field, set_lookup_values
from .datafusion_floats import PREDICATE_FUNCTIONS
from .store import SqlPredicate

_COMPARISONS: Final = {
    "equal": "=",
    "not_equal": "<>",
    "less": "<",
    "less_equal": "<=",
    "greater": ">",
    "greater_equal": ">=",
}
_FLIPPED: Final = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "<>": "<>"}
_FLOAT_TESTS: Final = {"is_nan": "isnan", "signbit": "signbit"}
"""Tests of a float column both engines answer alike (signbit: datafusion_floats.SIGNBIT)."""
_CONJUNCTIONS: Final = ("and", "and_kleene")


@dataclass(frozen=True)
class SplitPredicates:
    pushed: tuple[SqlPredicate, ...]
    """What DuckDB filters in the scan."""
    remaining: tuple[Expr, ...]
    """What Arrow filters after it."""

    @property
    def columns(self) -> set[str]:
        """The columns the remaining predicates read (the scan must return them)."""
        found: set[str] = set()
        for expr in self.remaining:
            _columns_of(expr, found)
        return found


def split_predicates(exprs: Sequence[Expr], schema: pa.Schema) -> SplitPredicates:
    """Each predicate checked (its columns exist, it is boolean), then split in conjuncts."""
    for expr in exprs:
        kind = output_type(expr, schema, PREDICATE_FUNCTIONS)
        if not pa.types.is_boolean(kind):
            raise InvalidArgument(f"a predicate must be boolean: {expr} is {kind}")
    pushed: list[SqlPredicate] = []
    remaining: list[Expr] = []
    for conjunct in _conjuncts(exprs):
        sql = _to_sql(conjunct, schema)
        if sql is None:
            remaining.append(conjunct)
        else:
            pushed.append(sql)
    return SplitPredicates(tuple(pushed), tuple(remaining))


def _conjuncts(exprs: Sequence[Expr]) -> list[Expr]:
    out: list[Expr] = []
    for expr in exprs:
        if isinstance(expr, Call) and expr.function in _CONJUNCTIONS and expr.options is None:
            out.extend(_conjuncts(expr.args))
        else:
            out.append(expr)
    return out


def _to_sql(expr: Expr, schema: pa.Schema) -> SqlPredicate | None:
    if not isinstance(expr, Call):
        return None
    name, args = expr.function, expr.args
    if name in _COMPARISONS and len(args) == 2:
        return _comparison(_COMPARISONS[name], args[0], args[1], schema)
    if name in ("is_null", "is_valid") and len(args) == 1 and _null_test_of_sql(expr):
        column = _column(args[0], schema)
        if column is None:
            return None
        return SqlPredicate(f"{column} IS {'NOT ' if name == 'is_valid' else ''}NULL")
    if name in _FLOAT_TESTS and len(args) == 1 and isinstance(args[0], Column):
        column = _column(args[0], schema)
        if column is None or not pa.types.is_floating(schema.field(args[0].name).type):
            return None
        return SqlPredicate(f"{_FLOAT_TESTS[name]}({column})")  # NULL for NULL, as Arrow's
    if name == "invert" and len(args) == 1:
        inner = args[0]
        if isinstance(inner, Call) and (
            inner.function in _COMPARISONS or inner.function in _FLOAT_TESTS
        ):
            sql = _to_sql(inner, schema)
            return None if sql is None else SqlPredicate(f"NOT ({sql.sql})", sql.params)
        return None
    if name in ("and_kleene", "or_kleene") and len(args) == 2 and expr.options is None:
        parts = [_to_sql(arg, schema) for arg in args]
        if any(part is None for part in parts):
            return None
        word = " AND " if name == "and_kleene" else " OR "
        return SqlPredicate(
            word.join(f"({p.sql})" for p in parts if p is not None),
            tuple(v for p in parts if p is not None for v in p.params),
        )
    if name == "is_in" and len(args) == 1:
        return _is_in(expr, schema)
    return None


def _null_test_of_sql(expr: Call) -> bool:
    """is_null without nan_is_null (SQL's IS NULL is false for NaN)."""
    if expr.options is None:
        return True
    nan_is_null = options_field(expr.options, "nan_is_null")
    return isinstance(nan_is_null, pa.Scalar) and nan_is_null.as_py() is False


def _comparison(op: str, left: Expr, right: Expr, schema: pa.Schema) -> SqlPredicate | None:
    if isinstance(right, Column) and isinstance(left, Literal):
        left, right, op = right, left, _FLIPPED[op]
    column = _column(left, schema)
    if column is None or not isinstance(right, Literal):
        return None
    kind = schema.field(left.name).type  # type: ignore[union-attr]
    bound = _parameter(right.value, kind)
    if bound is None:
        return None
    if pa.types.is_floating(kind):
        # DuckDB orders NaN above every number and equal to itself; Arrow's comparisons with
        # NaN are false (not_equal: true). A NaN literal stays with Arrow; `>`/`>=` exclude
        # NaN rows, which DuckDB alone would keep.
        if bound[1] != bound[1]:
            return None
        if op in (">", ">="):
            return SqlPredicate(f"({column} {op} {bound[0]} AND NOT isnan({column}))", (bound[1],))
    return SqlPredicate(f"{column} {op} {bound[0]}", (bound[1],))


def _is_in(expr: Call, schema: pa.Schema) -> SqlPredicate | None:
    column = _column(expr.args[0], schema)
    options = expr.options
    if column is None or not isinstance(options, pc.SetLookupOptions):
        return None
    value_set = set_lookup_values(options)
    if value_set is None or not len(value_set) or value_set.null_count:
        return None  # NULL in a value set: Arrow may match null to it, SQL never does
    kind = schema.field(expr.args[0].name).type  # type: ignore[union-attr]
    if pa.types.is_floating(kind):
        return None  # DuckDB's IN matches -0.0 to 0.0 (and NaN to NaN); Arrow's is_in does not
    bound = [_parameter(v, kind) for v in value_set]
    if any(b is None for b in bound):
        return None
    marks = ", ".join(b[0] for b in bound if b is not None)
    return SqlPredicate(f"{column} IN ({marks})", tuple(b[1] for b in bound if b is not None))


def _column(expr: Expr, schema: pa.Schema) -> str | None:
    if not isinstance(expr, Column) or expr.name not in schema.names:
        return None
    return '"' + expr.name.replace('"', '""') + '"'


def _parameter(value: pa.Scalar, column_type: pa.DataType) -> tuple[str, Any] | None:
    """(placeholder, value) DuckDB binds with the same meaning as Arrow's comparison; None when
    there is none: a NULL literal, or types whose comparison could differ between the engines
    (an integer column against a fractional literal, a timestamp finer than milliseconds)."""
    if not value.is_valid:
        return None
    kind, t = value.type, pa.types
    if t.is_integer(column_type) and t.is_integer(kind):
        return "?", value.as_py()
    if t.is_floating(column_type) and (t.is_integer(kind) or t.is_floating(kind)):
        return "?::DOUBLE", float(value.as_py())
    if t.is_timestamp(column_type) and t.is_timestamp(kind):
        try:
            ms = value.cast(pa.timestamp("ms"), safe=True)
        except pa.ArrowInvalid:
            return None  # finer than a millisecond: Arrow compares it exactly, leave it there
        return "epoch_ms(?::BIGINT)", ms.cast(pa.int64()).as_py()
    strings = (t.is_string(kind) or t.is_large_string(kind)) and (
        t.is_string(column_type) or t.is_large_string(column_type)
    )
    if strings or (kind == column_type and (t.is_boolean(kind) or t.is_date32(kind))):
        return "?", value.as_py()
    if t.is_binary(kind) and t.is_binary(column_type):
        return "?::BLOB", value.as_py()
    return None


def _columns_of(expr: Expr, found: set[str]) -> None:
    if isinstance(expr, Column):
        found.add(expr.name)
    elif isinstance(expr, Call):
        for arg in expr.args:
            _columns_of(arg, found)


__all__ = ["SplitPredicates", "split_predicates"]
