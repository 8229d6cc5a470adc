"""Which written values a column takes, and how: values of its own kind, converted exactly.

A write whose Arrow type differs from its column's is converted only within a kind: a number
into a number, a string into a string, a timestamp of any unit or zone into a timestamp (the
instant it names), and so on. Between kinds it is refused: a string is never parsed into a
number, a number never becomes a string, a boolean is not a number and a date not a timestamp.
Such a write is almost always columns in the wrong order, and Arrow's cast would take it without
a word ('12' into an integer, 2 into `true`). The Spark writer casts by the same rule.

The conversion is Arrow's safe cast, so a number out of a column's range, a float with a
fraction into an integer, an integer a double cannot hold exactly and a timestamp finer than
milliseconds are refused. One more check: a double too large for FLOAT, which Arrow turns into
infinity.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from ..errors import InvalidArgument


def _kind(arrow: pa.DataType) -> str:
    if pt.is_integer(arrow) or pt.is_floating(arrow) or pt.is_decimal(arrow):
        return "number"
    if pt.is_string(arrow) or pt.is_large_string(arrow) or pt.is_string_view(arrow):
        return "string"
    if (
        pt.is_binary(arrow)
        or pt.is_large_binary(arrow)
        or pt.is_binary_view(arrow)
        or pt.is_fixed_size_binary(arrow)
    ):
        return "binary"
    for kind, is_kind in (
        ("timestamp", pt.is_timestamp),
        ("date", pt.is_date),
        ("time", pt.is_time),
        ("boolean", pt.is_boolean),
    ):
        if is_kind(arrow):
            return kind
    return str(arrow)


def assign(
    name: str, type_name: str, target: pa.DataType, values: pa.ChunkedArray
) -> pa.ChunkedArray:
    """`values` as column `name` (of table type `type_name`) stores them, or InvalidArgument
    naming the column and why."""
    if values.type == target:
        return values
    if pt.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    source = values.type
    if not pt.is_null(source) and _kind(source) != _kind(target):
        raise InvalidArgument(
            f"column {name!r} is {type_name}: it does not take {source} values (a write"
            f" converts values only within a kind, a number into a number, say: convert"
            f" them before writing)"
        )
    try:
        converted = values.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidArgument(
            f"column {name!r} is {type_name}: cannot store {values.type} values ({exc})"
        ) from exc
    if pt.is_floating(target) and pt.is_floating(source):
        _check_no_overflow(name, type_name, values, converted)
    return converted


def _check_no_overflow(
    name: str, type_name: str, values: pa.ChunkedArray, converted: pa.ChunkedArray
) -> None:
    """Arrow narrows a double past FLOAT's range to infinity; refuse that value instead."""
    overflowed = pc.and_(pc.is_finite(values), pc.is_inf(converted))
    if pc.any(overflowed).as_py():
        index = pc.index(overflowed, True).as_py()
        raise InvalidArgument(
            f"column {name!r} is {type_name}: value {values[index].as_py()!r} is out of its range"
        )


__all__ = ["assign"]
