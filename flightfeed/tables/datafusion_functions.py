"""DataFusion's scalar functions in a predicate, as Arrow calls with DataFusion's meaning.

DataFusion 33 (what HoraeDB runs) names a built-in by its number in the ScalarFunction enum;
later releases by name. Only functions whose Arrow counterpart gives the same result are here,
made to by their options where Arrow's default differs: `round` rounds half away from zero,
the trims remove spaces (not all whitespace), and `concat` skips NULLs. Every other function is
refused by name.

`sqrt` of a negative number (-inf too) fails the read, as in DataFusion 55 ("cannot take square
root of a negative number"). Arrow's `sqrt` gives a NaN with its sign bit clear, which sorts
above every number (datafusion_floats.py), so `sqrt(x) > 0.5` kept x = -1; DataFusion 33 on x86
gives one with the bit set, which sorts below. Refusing is right for both: never a row either
would not return. A NaN or -0.0 keeps its sign through it, as in both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from ..plan.expr import Call, Expr, Literal
from .datafusion_case import LOWER, UPPER
from .datafusion_floats import FloatOrder
from .datafusion_scalar import FALSE, NULL_BOOL, string_option

DATAFUSION_33_FUNCTIONS: Final = {
    0: "abs",
    5: "ceil",
    9: "floor",
    14: "round",
    17: "sqrt",
    19: "trunc",
    23: "btrim",
    24: "character_length",
    26: "concat",
    33: "lower",
    34: "ltrim",
    36: "nullif",
    45: "rtrim",
    51: "starts_with",
    61: "btrim",  # Trim: SQL's TRIM(x), both ends
    62: "upper",
    63: "coalesce",
}
"""DataFusion 33's ScalarFunction numbers (datafusion.proto) of the functions translated."""


Make = Callable[[str, Sequence[Expr], FloatOrder], Expr]
"""A function's translation, given its name, its translated arguments and how the predicate
compares (floats in DataFusion's order)."""


def _unary(function: str) -> Make:
    def make(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
        _arity(name, args, 1, 1)
        return Call(function, (args[0],))

    return make


def _trunc(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    """DataFusion's trunc of a float zero is 0.0, of -0.0 too (Arrow's keeps -0.0); of -0.5
    it is -0.0, as Arrow's (IN and nullif tell the zeros apart)."""
    _arity(name, args, 1, 1)
    value = args[0]
    truncated = Call("trunc", (value,))
    kind = order.float_type(value)
    if kind is None:
        return truncated
    zero = Literal(pa.scalar(0.0, kind))
    return Call("if_else", (Call("equal", (value, zero)), zero, truncated))


def _round(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    """DataFusion rounds a float to `digits` as `(x * 10.powi(digits)).round() /
    10.powi(digits)`, halves away from zero: past the float's range that is infinity where
    Arrow's round with digits fails ('overflow occurred during rounding'), and a scale below
    one multiplies by its inverse, where Arrow divides. So it is written out the same way."""
    _arity(name, args, 1, 2)
    digits = 0
    if len(args) == 2:
        digits = _integer_literal(name, args[1])
    value = args[0]
    kind = order.float_type(value)
    if digits == 0 or kind is None:
        options = pc.RoundOptions(ndigits=digits, round_mode="half_towards_infinity")
        return Call("round", (value,), options)
    scale = Literal(pa.scalar(_powi(10.0, digits, kind), kind))
    scaled = Call("round", (Call("multiply", (value, scale)),), _HALF_AWAY)
    return Call("divide", (scaled, scale))


_HALF_AWAY: Final = pc.RoundOptions(ndigits=0, round_mode="half_towards_infinity")


def _powi(base: float, exponent: int, kind: pa.DataType) -> float:
    """Rust's `powi` (LLVM's, compiler-rt's __powidf2): squarings and products in the float's
    own precision, the reciprocal of the result for a negative exponent; not a correctly
    rounded power, which may differ in the last bit."""
    width = np.float32 if kind == pa.float32() else np.float64
    factor, result, n = width(base), width(1.0), abs(exponent)
    while True:
        if n & 1:
            result = width(result * factor)
        n //= 2
        if n == 0:
            break
        factor = width(factor * factor)
    return float(width(1.0) / result if exponent < 0 else result)


def _trim(side: str) -> Make:
    def make(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
        _arity(name, args, 1, 2)
        characters = " " if len(args) == 1 else string_option(args[1], f"{name}'s second argument")
        if characters is None:
            return Literal(pa.scalar(None, pa.string()))
        return Call(f"utf8_{side}", (args[0],), pc.TrimOptions(characters))

    return make


def _starts_with(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    _arity(name, args, 2, 2)
    prefix = string_option(args[1], f"{name}'s second argument")
    if prefix is None:
        return NULL_BOOL
    return Call("starts_with", (args[0],), pc.MatchSubstringOptions(prefix))


def _coalesce(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    _arity(name, args, 1, None)
    return Call("coalesce", tuple(args))


def _nullif(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    """NULL where a = b (a NaN equal to a NaN of its sign, -0.0 not to 0.0), else a (a NULL
    comparison keeps a)."""
    _arity(name, args, 2, 2)
    value, other = args
    equal = Call("coalesce", (order.same(value, other), FALSE))
    return Call("if_else", (equal, Literal(pa.scalar(None)), value))


def _concat(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    """DataFusion's concat skips NULL arguments (all NULL: an empty string)."""
    _arity(name, args, 1, None)
    options = pc.JoinOptions(null_handling="replace", null_replacement="")
    return Call("binary_join_element_wise", (*args, Literal(pa.scalar(""))), options)


_FUNCTIONS: Final[dict[str, Make]] = {
    "abs": _unary("abs"),
    "ceil": _unary("ceil"),
    "floor": _unary("floor"),
    "trunc": _trunc,
    "sqrt": _unary("sqrt_checked"),  # (see the module's docstring)
    "round": _round,
    "lower": _unary(LOWER.name),  # Unicode's full case mapping, as Rust's (datafusion_case.py)
    "upper": _unary(UPPER.name),
    "character_length": _unary("utf8_length"),
    "btrim": _trim("trim"),
    "ltrim": _trim("ltrim"),
    "rtrim": _trim("rtrim"),
    "starts_with": _starts_with,
    "coalesce": _coalesce,
    "nullif": _nullif,
    "concat": _concat,
}


def function_call(name: str, args: Sequence[Expr], order: FloatOrder) -> Expr:
    """DataFusion's function `name` over translated `args`; InvalidArgument if it is not one
    translated or its arguments are not what it takes."""
    make = _FUNCTIONS.get(name)
    if make is None:
        raise InvalidArgument(f"DataFusion function {name!r} is not supported in a predicate here")
    return make(name, args, order)


def _arity(name: str, args: Sequence[Expr], least: int, most: int | None) -> None:
    if len(args) < least or (most is not None and len(args) > most):
        wanted = (
            f"{least}"
            if least == most
            else f"{least} or more"
            if most is None
            else f"{least}-{most}"
        )
        raise InvalidArgument(f"DataFusion's {name} takes {wanted} arguments, got {len(args)}")


def _integer_literal(name: str, arg: Expr) -> int:
    if not isinstance(arg, Literal) or not pa.types.is_integer(arg.value.type):
        raise InvalidArgument(f"{name}'s digits must be an integer literal, got {arg}")
    digits = arg.value.as_py()
    if digits is None or not -38 <= digits <= 38:
        raise InvalidArgument(f"{name}'s digits must be -38 to 38, got {digits}")
    return int(digits)


__all__ = ["DATAFUSION_33_FUNCTIONS", "function_call"]
