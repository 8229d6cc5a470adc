"""Float comparisons with DataFusion's meaning: NaN above every number and equal to itself.

arrow-rs compares floats by their total order, so in a HoraeDB query `v > 0.5` keeps the rows
where v is NaN and `v = 'NaN'` finds them; Arrow C++ (IEEE) keeps neither. NaN is common in
time series (Prometheus marks a stale series with one), and HoraeDB does not filter a pushed-down
predicate again, so each comparison with a float side is rewritten here to order NaN as
DataFusion does. Zeros compare equal whatever their sign, as DataFusion's do; a NaN with its
sign bit set (arrow-rs orders it below every number) is taken as NaN. NULL stays NULL.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from ..errors import FlightfeedError
from ..plan.expr import Call, Column, Expr, Literal, output_type
from ..plan.functions import BUILTINS
from .datafusion_scalar import FALSE, TRUE

_FLIPPED: Final = {
    "equal": "equal",
    "not_equal": "not_equal",
    "less": "greater",
    "less_equal": "greater_equal",
    "greater": "less",
    "greater_equal": "less_equal",
}

NaN = bool | Expr
"""Whether a side is NaN: known (a literal, or a type that holds none), or its is_nan call."""


class FloatOrder:
    """Builds comparisons over `schema` (the table's): as Arrow's where neither side is a
    float, in DataFusion's order where one is. Without a schema every comparison is Arrow's."""

    def __init__(self, schema: pa.Schema | None) -> None:
        self.schema = schema

    def compare(self, function: str, left: Expr, right: Expr) -> Expr:
        """`function` (equal, less, ...) of left and right."""
        nan_left, nan_right = self._nan(left), self._nan(right)
        if nan_left is False and nan_right is False:
            return Call(function, (left, right))
        if isinstance(left, Literal) and not isinstance(right, Literal):
            return self.compare(_FLIPPED[function], right, left)
        if nan_right is False:
            # The common case, a column against a number: NaN is above it.
            if function in ("greater", "greater_equal"):
                return Call("or_kleene", (_known(nan_left), Call(function, (left, right))))
            return Call(function, (left, right))
        if nan_right is True:
            return _against_nan(function, _known(nan_left))
        return _either_nan(function, left, right, _known(nan_left), _known(nan_right))

    def _nan(self, expr: Expr) -> NaN:
        """A literal is NaN or not; another float expression may be (its is_nan call)."""
        if isinstance(expr, Literal):
            value = expr.value
            floating = pa.types.is_floating(value.type) and value.is_valid
            return bool(floating and value.as_py() != value.as_py())
        kind = self._type(expr)
        floating = kind is not None and pa.types.is_floating(kind)
        return Call("is_nan", (expr,)) if floating else False

    def _type(self, expr: Expr) -> pa.DataType | None:
        if self.schema is None:
            return None
        if isinstance(expr, Column):
            index = self.schema.get_field_index(expr.name)
            return self.schema.field(index).type if index >= 0 else None
        try:
            return output_type(expr, self.schema, BUILTINS)
        except FlightfeedError:
            return None  # evaluating it reports what is wrong, with its own message


def _known(nan: NaN) -> Expr:
    if isinstance(nan, bool):
        return TRUE if nan else FALSE
    return nan


def _against_nan(function: str, nan: Expr) -> Expr:
    """x OP NaN: only a NaN equals it, and nothing is above it. `and`/`or` (not Kleene) keep a
    NULL x NULL."""
    if function in ("equal", "greater_equal"):
        return nan
    if function in ("not_equal", "less"):
        return Call("invert", (nan,))
    if function == "greater":
        return Call("and", (nan, FALSE))
    return Call("or", (nan, TRUE))  # less_equal


def _either_nan(function: str, left: Expr, right: Expr, nan_left: Expr, nan_right: Expr) -> Expr:
    """Where either side is NaN the answer comes from which is; elsewhere from Arrow."""
    if function == "not_equal":
        return Call("invert", (_either_nan("equal", left, right, nan_left, nan_right),))
    when_nan = {
        "equal": Call("and", (nan_left, nan_right)),
        "greater": Call("and", (nan_left, Call("invert", (nan_right,)))),
        "greater_equal": nan_left,
        "less": Call("and", (nan_right, Call("invert", (nan_left,)))),
        "less_equal": nan_right,
    }[function]
    either = Call("or", (nan_left, nan_right))
    return Call("if_else", (either, when_nan, Call(function, (left, right))))


__all__ = ["FloatOrder"]
