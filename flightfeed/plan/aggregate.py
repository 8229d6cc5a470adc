"""Aggregate expressions and the built-in aggregates, as mergeable states.

Every aggregate is a list of state columns: `partial` turns rows into states, `merge` combines
states of the same group, `finish` turns states into the result. Built-ins map each step to a
pyarrow hash aggregate (mean = sum + count); session aggregate UDFs bring their own callables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument, UnknownUdfError
from .expr import Call, Column, Expr, Literal, lit
from .functions import AggregateUdf, FunctionRegistry


@dataclass(frozen=True)
class AggregateExpr:
    """`function(args)` computed per group into the column `name`."""

    function: str
    args: tuple[Expr, ...]
    name: str

    def __str__(self) -> str:
        return f"{self.function}({', '.join(str(a) for a in self.args)}) AS {self.name}"


def agg(function: str, *args: Expr | object, name: str) -> AggregateExpr:
    """An aggregate expression; non-expression arguments become literals. `count()` = count(*)."""
    exprs = tuple(a if isinstance(a, Column | Literal | Call) else lit(a) for a in args)
    return AggregateExpr(function, exprs, name)


@dataclass(frozen=True)
class StateSpec:
    """One state column of a built-in: a pyarrow hash aggregate for each step."""

    label: str
    partial: str
    merge: str
    partial_options: pc.FunctionOptions | None = None


@dataclass(frozen=True)
class BuiltinAggregate:
    function: str
    arity: int
    states: tuple[StateSpec, ...]
    finish: Callable[[Sequence[pa.Array]], pa.Array]
    prepare: Callable[[pa.ChunkedArray], pa.ChunkedArray] | None = None
    """Applied to each argument before its partial states are computed."""


def _first(states: Sequence[pa.Array]) -> pa.Array:
    return states[0]


def _count(states: Sequence[pa.Array]) -> pa.Array:
    # A global aggregate over no rows merges zero partial states: sum() gives null, count is 0.
    # (fill_null costs ~6 us of Python even with nothing to fill: checked first.)
    counts = states[0]
    return pc.fill_null(counts, 0) if counts.null_count else counts


def _mean(states: Sequence[pa.Array]) -> pa.Array:
    total, count = states
    # The total is a double already, but for decimals. Unsafe: the mean is a double anyway.
    return pc.divide(pc.cast(total, pa.float64(), safe=False), pc.cast(count, pa.float64()))


def _integers_as_doubles(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """A mean of integers sums doubles, as DataFusion's does: six epoch-nanosecond values sum
    past int64, and a sum that overflows fails (checked_sum.py) though their mean is fine."""
    if not pa.types.is_integer(values.type):
        return values
    # Unsafe: an integer past 2^53 has no exact double (a safe cast refuses it), nor its mean.
    return pc.cast(values, pa.float64(), safe=False)


_VALID = pc.CountOptions(mode="only_valid")

BUILTIN_AGGREGATES: dict[tuple[str, int], BuiltinAggregate] = {
    (b.function, b.arity): b
    for b in (
        BuiltinAggregate("sum", 1, (StateSpec("sum", "sum", "sum"),), _first),
        BuiltinAggregate("min", 1, (StateSpec("min", "min", "min"),), _first),
        BuiltinAggregate("max", 1, (StateSpec("max", "max", "max"),), _first),
        BuiltinAggregate("count", 1, (StateSpec("count", "count", "sum", _VALID),), _count),
        BuiltinAggregate("count", 0, (StateSpec("count", "count_all", "sum"),), _count),
        BuiltinAggregate(
            "mean",
            1,
            (StateSpec("sum", "sum", "sum"), StateSpec("count", "count", "sum", _VALID)),
            _mean,
            _integers_as_doubles,
        ),
    )
}
"""(name, number of arguments) -> built-in. count with no argument is count(*)."""

ResolvedAggregate = BuiltinAggregate | AggregateUdf


def resolve_aggregate(expr: AggregateExpr, functions: FunctionRegistry) -> ResolvedAggregate:
    """The session UDF (first) or built-in an aggregate names; UnknownUdfError if neither."""
    udf = functions.aggregate_udf(expr.function)
    if udf is not None:
        return udf
    builtin = BUILTIN_AGGREGATES.get((expr.function, len(expr.args)))
    if builtin is not None:
        return builtin
    arities = sorted(a for (f, a) in BUILTIN_AGGREGATES if f == expr.function)
    if arities:
        raise InvalidArgument(
            f"aggregate {expr.function!r} takes {' or '.join(map(str, arities))} argument(s),"
            f" got {len(expr.args)}"
        )
    raise UnknownUdfError(
        f"unknown aggregate function {expr.function!r}: neither a session aggregate UDF nor"
        f" one of {sorted({f for f, _ in BUILTIN_AGGREGATES})}"
    )


def state_labels(resolved: ResolvedAggregate) -> list[str]:
    if isinstance(resolved, BuiltinAggregate):
        return [s.label for s in resolved.states]
    return [f"state{i}" for i in range(len(resolved.state_types))]


def state_names(expr: AggregateExpr, resolved: ResolvedAggregate) -> list[str]:
    """Column names of an aggregate's states in PARTIAL output: `name[label]`."""
    return [f"{expr.name}[{label}]" for label in state_labels(resolved)]
