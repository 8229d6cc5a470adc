"""Sums that fail on overflow instead of wrapping: Arrow's sum kernels wrap silently.

Arrow sums integers into int64 (uint64) and decimal128 columns into decimal128(38, s) with no
overflow check: four values of 2^62 sum to 0, three 38-digit decimals to a negative number. A
query must fail there, not answer wrong (DuckDB sums into a wider type, DataFusion errors).

Checking every sum would cost a wider kernel on every batch, so a bound decides first: when
the largest magnitude in the column times its row count fits the sum's type, no group's sum
can overflow (one `min_max`, or for decimals often the declared precision alone). Only a column
that fails the bound is summed in a wider type (decimal128(38, 0) for integers, decimal256 for
decimal128) and cast back to the sum's type with a check, which is what fails on an overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from ..errors import DataError

_DECIMAL128_DIGITS: Final = 38
_WIDE_INTEGER: Final = pa.decimal128(_DECIMAL128_DIGITS, 0)
"""Holds any sum of fewer than 10^19 int64 or uint64 values exactly."""
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1
_INTEGERS: Final = {
    kind.id: (1 << kind.bit_width, _INT64_MAX if signed else _UINT64_MAX, sum_type)
    for kinds, signed, sum_type in (
        ((pa.int8(), pa.int16(), pa.int32(), pa.int64()), True, pa.int64()),
        ((pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()), False, pa.uint64()),
    )
    for kind in kinds
}
"""Integer type id -> (a bound on its values' magnitude, the largest sum, the sum's type): a
dictionary lookup, as the check runs on every partial aggregate's batch."""


@dataclass(frozen=True)
class Widened:
    """A column to sum in `column`'s wider type, whose sums are cast back to `sum_type`."""

    column: pa.ChunkedArray | pa.Array
    sum_type: pa.DataType


def widen_for_sum(column: pa.ChunkedArray | pa.Array) -> Widened | None:
    """`column` in a type its sums cannot overflow, when Arrow's own sum type could; None when
    no sum of its values can overflow (the common case: nothing is converted)."""
    type_ = column.type
    rows = len(column) - column.null_count
    if rows < 2:
        return None
    integer = _INTEGERS.get(type_.id)
    if integer is not None:
        bound, limit, sum_type = integer
        if bound * rows <= limit:  # the type's range bounds it (int32 ...)
            return None
        if _largest_magnitude(column) * rows <= limit:
            return None
        return Widened(column.cast(_WIDE_INTEGER), sum_type)
    if pt.is_decimal128(type_):
        scale = type_.scale
        row_digits = len(str(rows))  # rows < 10^row_digits
        if type_.precision + row_digits <= _DECIMAL128_DIGITS:
            return None  # |value| < 10^precision (unscaled): the declared type is bound enough
        if _unscaled_digits(column, scale) + row_digits <= _DECIMAL128_DIGITS:
            return None
        wide = pa.decimal256(type_.precision + row_digits, scale)
        return Widened(column.cast(wide), pa.decimal128(_DECIMAL128_DIGITS, scale))
    return None


def narrow_sum(sums: pa.ChunkedArray | pa.Array, widened: Widened, what: str) -> pa.ChunkedArray:
    """The wide `sums` in the sum type Arrow would have given; DataError naming `what` when a
    sum does not fit (the overflow Arrow's own kernel would have wrapped)."""
    try:
        narrowed = sums.cast(widened.sum_type)
    except pa.ArrowInvalid as exc:
        raise DataError(
            f"sum {what} overflows {widened.sum_type}: the values sum past what it holds ({exc})"
        ) from exc
    if isinstance(narrowed, pa.Array):
        return pa.chunked_array([narrowed])
    return narrowed


def _largest_magnitude(column: pa.ChunkedArray | pa.Array) -> int:
    bounds = pc.call_function("min_max", [column])
    low: int | None = bounds["min"].as_py()
    high: int | None = bounds["max"].as_py()
    return max(abs(low or 0), abs(high or 0))


def _unscaled_digits(column: pa.ChunkedArray | pa.Array, scale: int) -> int:
    """An upper bound on the digits of the largest unscaled value in a decimal `column`."""
    bounds = pc.call_function("min_max", [column])
    digits = 0
    for value in (bounds["min"].as_py(), bounds["max"].as_py()):
        if isinstance(value, Decimal) and value:
            digits = max(digits, value.adjusted() + 1 + scale)  # adjusted(): the top digit's power
    return digits


__all__ = ["Widened", "narrow_sum", "widen_for_sum"]
