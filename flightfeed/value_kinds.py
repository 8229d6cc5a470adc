"""Which values a column of a durable table takes from a write: those of its own kind, converted
exactly. One rule for the worker's store and for Spark's writer, which casts before it sends.

A write whose Arrow type differs from its column's is converted only within a kind: a number
into a number, a string into a string, a timestamp of any unit or zone into a timestamp (the
instant it names), and so on. Between kinds it is refused: a string is never parsed into a
number, a number never becomes a string, a boolean is not a number and a date not a timestamp.
Such a write is almost always columns in the wrong order, and Arrow's cast would take it without
a word ('12' into an integer, 2 into `true`).

The conversion is Arrow's safe cast, so a number out of a column's range, a float with a
fraction into an integer, an integer a double cannot hold exactly and a timestamp finer than
the column's unit are refused. Two more checks, where Arrow's safe cast says nothing: a double
too large for FLOAT (it becomes infinity), and a decimal that a float would round into another
number.

The callers word the refusal, each for its own reader (a gRPC client, a Spark job), so this
module raises only Arrow's own `ArrowInvalid` and imports nothing of ours.
"""

from __future__ import annotations

from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

Values = TypeVar("Values", pa.Array, pa.ChunkedArray)

_KINDS = (
    ("number", (pt.is_integer, pt.is_floating, pt.is_decimal)),
    ("string", (pt.is_string, pt.is_large_string, pt.is_string_view)),
    ("binary", (pt.is_binary, pt.is_large_binary, pt.is_binary_view, pt.is_fixed_size_binary)),
    ("timestamp", (pt.is_timestamp,)),
    ("date", (pt.is_date,)),
    ("time", (pt.is_time,)),
    ("boolean", (pt.is_boolean,)),
)


def value_kind(data_type: pa.DataType) -> str:
    """The kind of value `data_type` holds ("number", "string", "timestamp", ...); a type of no
    kind here is a kind of its own, named by the type."""
    for kind, tests in _KINDS:
        if any(test(data_type) for test in tests):
            return kind
    return str(data_type)


def converts(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a write converts `source` values into a `target` column at all (whether each
    value fits is `convert`'s to say). A column of nulls goes anywhere."""
    return pt.is_null(source) or value_kind(source) == value_kind(target)


def convert(values: Values, target: pa.DataType) -> Values:
    """`values` as `target`, exactly: Arrow's safe cast, and `ArrowInvalid` naming the first
    double that FLOAT cannot hold, or decimal that a float cannot (Arrow rounds those without
    a word, where it refuses an integer past 2**53). Call only where `converts` holds."""
    if pt.is_floating(target) and pt.is_decimal(values.type):
        return _decimals_as_floats(values, target)
    converted = values.cast(target, safe=True)
    if pt.is_floating(target) and pt.is_floating(values.type):
        _check_in_range(values, converted)
    return converted


def _check_in_range(values: Values, converted: Values) -> None:
    overflowed = pc.and_(pc.is_finite(values), pc.is_inf(converted))
    if pc.any(overflowed).as_py():
        index = pc.index(overflowed, True).as_py()
        raise pa.ArrowInvalid(f"value {values[index].as_py()} is out of the column's range")


def _decimals_as_floats(values: Values, target: pa.DataType) -> Values:
    """The float nearest each decimal, which must denote it: read back at the float's own
    precision (its shortest decimal form) and the decimal's scale, it is the same decimal.
    So 1.10, and 0.1 as Spark's decimal(38, 18), are taken as the double nearest them, as a
    literal is; 0.100000000000000001 (scale 18) or 2**53 + 1 would be another number.

    Through text both ways, each step exact or correctly rounded: Arrow's own cast of a
    decimal to a float divides in floating point, and is off by one unit in the last place
    for many values (0.000001234 became 1.2340000000000002e-06, 0.1 of a decimal256
    0.09999999999999999), and a check at the decimal's scale then refused Spark's 0.1."""
    converted = values.cast(pa.string()).cast(target)
    _check_in_range(values, converted)
    try:
        back = converted.cast(pa.string()).cast(values.type, safe=False)
    except pa.ArrowInvalid:  # (a float past the decimal type's range: it was rounded up)
        raise pa.ArrowInvalid("a value is not exactly a float: it would be rounded") from None
    inexact = pc.invert(pc.fill_null(pc.equal(back, values), True))
    if pc.any(inexact).as_py():
        index = pc.index(inexact, True).as_py()
        raise pa.ArrowInvalid(
            f"value {values[index].as_py()} is not exactly a float: it would be stored as"
            f" {converted[index].as_py()!r}"
        )
    return converted


__all__ = ["convert", "converts", "value_kind"]
