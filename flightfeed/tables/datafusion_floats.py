"""Float comparisons with DataFusion's meaning: NaN outside every number, by its sign.

arrow-rs compares floats by their total order where a NaN is involved: a NaN is above every
number and equal to itself, and a NaN with its sign bit set (0/0 and inf-inf give one on x86,
as does negating a NaN) is below every number, -inf included, and equal only to such a NaN. So
in a HoraeDB query `v > 0.5` keeps the rows where v is NaN and `v = 'NaN'` finds them; Arrow C++
(IEEE) keeps neither. NaN is common in time series (Prometheus marks a stale series with one),
and HoraeDB does not filter a pushed-down predicate again, so each comparison with a float side
(typed from the table's schema) is rewritten here to that order. Zeros compare equal whatever
their sign, as DataFusion's `=` does; `same` (nullif, a simple CASE) also tells -0.0 from 0.0,
as DataFusion does there. NULL stays NULL.

A NaN's sign has no Arrow kernel: `signbit` (SIGNBIT) reads the float's bits (a zero-copy view
as integers), and a read's DuckDB scan runs it as its own `signbit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FlightfeedError, InvalidArgument
from ..plan.expr import Call, Column, Expr, Literal, output_type
from ..plan.functions import BuiltinFunctions, ScalarUdf
from .datafusion_case import LOWER, UPPER
from .datafusion_casts import FLOAT_TO_INTEGER
from .datafusion_scalar import FALSE, TRUE

_FLIPPED: Final = {
    "equal": "equal",
    "not_equal": "not_equal",
    "less": "greater",
    "less_equal": "greater_equal",
    "greater": "less",
    "greater_equal": "less_equal",
}
_BITS: Final = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}


def _signbit(values: pa.Array) -> pa.Array:
    """Whether each float's sign bit is set (-0.0, -1.5, a negative NaN); NULL stays NULL."""
    if not pa.types.is_floating(values.type):
        raise InvalidArgument(f"signbit takes a float, got {values.type}")
    return pc.less(values.view(_BITS[values.type.bit_width]), 0)


SIGNBIT: Final = ScalarUdf("signbit", _signbit, pa.bool_())
"""The function a translated predicate calls for a float's sign (the table engine's reads
resolve it; DuckDB has it by the same name)."""


class PredicateFunctions(BuiltinFunctions):
    """Arrow's functions, SIGNBIT and DataFusion's case mappings (datafusion_case.py): what a
    translated predicate calls."""

    def scalar_udf(self, name: str, /) -> ScalarUdf | None:
        return _PREDICATE_UDFS.get(name)


_PREDICATE_UDFS: Final = {
    udf.name: udf for udf in (SIGNBIT, UPPER, LOWER, *FLOAT_TO_INTEGER.values())
}
PREDICATE_FUNCTIONS: Final = PredicateFunctions()


@dataclass(frozen=True)
class _Nan:
    """How a float side can be NaN: whether it is a positive NaN, a negative one, and its rank
    (0: a negative NaN, 1: a number, 2: a positive NaN) as expressions or constants."""

    positive: Expr
    negative: Expr
    rank: Expr

    @property
    def any(self) -> Expr:
        return Call("or_kleene", (self.positive, self.negative))


def _rank(value: int | None) -> Literal:
    return Literal(pa.scalar(value, pa.int8()))


def _number_rank(expr: Expr) -> Expr:
    """The rank of a side that holds no NaN: a number's, NULL where it is NULL."""
    return Call("if_else", (Call("is_null", (expr,)), _rank(None), _rank(1)))


class FloatOrder:
    """Builds comparisons over `schema` (the table's): as Arrow's where neither side is a
    float, in DataFusion's order where one is. Without a schema every comparison is Arrow's."""

    def __init__(self, schema: pa.Schema | None) -> None:
        self.schema = schema

    def compare(self, function: str, left: Expr, right: Expr) -> Expr:
        """`function` (equal, less, ...) of left and right."""
        if isinstance(left, Literal) and not isinstance(right, Literal):
            function, left, right = _FLIPPED[function], right, left
        nan_left, nan_right = self._nan(left), self._nan(right)
        if nan_left is None and nan_right is None:
            return Call(function, (left, right))
        if nan_left is None and not isinstance(right, Literal):  # only the right may be NaN
            function, left, right = _FLIPPED[function], right, left
            nan_left, nan_right = nan_right, nan_left
        if nan_right is None and nan_left is not None:
            # The common case, a column against a number: a NaN is above it or below it.
            if function in ("greater", "greater_equal"):
                return Call("or_kleene", (nan_left.positive, Call(function, (left, right))))
            if function in ("less", "less_equal"):
                return Call("or_kleene", (nan_left.negative, Call(function, (left, right))))
            return Call(function, (left, right))  # no NaN equals a number
        rank_left = nan_left.rank if nan_left is not None else _number_rank(left)
        assert nan_right is not None
        if isinstance(right, Literal):  # a NaN literal: only the ranks decide
            return Call(function, (rank_left, nan_right.rank))
        assert nan_left is not None
        either = Call("or", (nan_left.any, nan_right.any))  # (NULL where a side is)
        by_rank = Call(function, (rank_left, nan_right.rank))
        return Call("if_else", (either, by_rank, Call(function, (left, right))))

    def same(self, left: Expr, right: Expr) -> Expr:
        """left = right, with -0.0 and 0.0 told apart too (DataFusion's nullif and simple
        CASE compare so)."""
        equal = self.compare("equal", left, right)
        if self.float_type(left) is None and self.float_type(right) is None:
            return equal
        signs = Call("equal", (self._sign(left), self._sign(right)))
        return Call("and_kleene", (equal, signs))

    def _sign(self, expr: Expr) -> Expr:
        """Whether a numeric side is negative, -0.0 included (equal values differ in sign
        only as zeros)."""
        if self.float_type(expr) is not None:
            return Call(SIGNBIT.name, (expr,))
        return Call("less", (expr, Literal(pa.scalar(0, pa.int8()))))

    def _nan(self, expr: Expr) -> _Nan | None:
        """None where a side holds no NaN (not a float, or a number literal)."""
        if isinstance(expr, Literal):
            value = expr.value
            if not (pa.types.is_floating(value.type) and value.is_valid):
                return None
            number = value.as_py()
            if number == number:
                return None
            below = bool(_signbit(pa.array([number], value.type))[0].as_py())
            return _Nan(
                FALSE if below else TRUE, TRUE if below else FALSE, _rank(0 if below else 2)
            )
        kind = self._type(expr)
        if kind is None or not pa.types.is_floating(kind):
            return None
        nan = Call("is_nan", (expr,))
        sign = Call(SIGNBIT.name, (expr,))
        negative = Call("and_kleene", (nan, sign))
        positive = Call("and_kleene", (nan, Call("invert", (sign,))))
        rank = Call("if_else", (negative, _rank(0), Call("if_else", (nan, _rank(2), _rank(1)))))
        return _Nan(positive, negative, rank)

    def float_type(self, expr: Expr) -> pa.DataType | None:
        """The float type of `expr`, if it has one (None: not a float, or not known)."""
        kind = self.type_of(expr)
        return kind if kind is not None and pa.types.is_floating(kind) else None

    def type_of(self, expr: Expr) -> pa.DataType | None:
        """The type of `expr` over the table (None: not known)."""
        if isinstance(expr, Literal):
            return expr.value.type
        return self._type(expr)

    def _type(self, expr: Expr) -> pa.DataType | None:
        if self.schema is None:
            return None
        if isinstance(expr, Column):
            index = self.schema.get_field_index(expr.name)
            return self.schema.field(index).type if index >= 0 else None
        try:
            return output_type(expr, self.schema, PREDICATE_FUNCTIONS)
        except FlightfeedError:
            return None  # evaluating it reports what is wrong, with its own message


__all__ = ["PREDICATE_FUNCTIONS", "SIGNBIT", "FloatOrder", "PredicateFunctions"]
