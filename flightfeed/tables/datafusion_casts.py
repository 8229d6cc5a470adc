"""DataFusion's cast of a float to an integer: truncated toward zero, an error when it does not fit.

arrow-rs casts with `num::cast`: 0.5 becomes 0 and -2.5 becomes -2, and NaN, an infinity or a
value past the integer's range fails the query ("Can't cast value NaN to type Int64"). Arrow
C++'s cast with `allow_float_truncate` maps those silently (to INT64_MIN on x86), so a pushed
predicate `CAST(v AS BIGINT) < -1000` kept the rows where v was NaN or 1e30: HoraeDB does not
filter them again. The cast of a float to an integer calls one of these functions instead: the
truncated value, or a DataError naming the value that does not fit.
"""

from __future__ import annotations

import math
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DataError
from ..plan.functions import ScalarUdf

_INTEGERS: Final = {
    pa.int8(): "Int8",
    pa.int16(): "Int16",
    pa.int32(): "Int32",
    pa.int64(): "Int64",
    pa.uint8(): "UInt8",
    pa.uint16(): "UInt16",
    pa.uint32(): "UInt32",
    pa.uint64(): "UInt64",
}
"""The integer types, by arrow-rs's names (its error names the type so)."""


def _rust_debug(value: float) -> str:
    """A float as Rust's `{:?}` writes it in arrow-rs's error: NaN, inf, -inf."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def _float_to_integer(target: pa.DataType) -> ScalarUdf:
    name = _INTEGERS[target]
    # The truncated value's bounds, exact as float64: [-2^(n-1), 2^(n-1)) or [0, 2^n).
    bits = target.bit_width
    signed = not pa.types.is_unsigned_integer(target)
    low, high = (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1)) if signed else (0.0, 2.0**bits)

    def cast(values: pa.Array) -> pa.Array:
        if not pa.types.is_floating(values.type):
            try:  # (a type not known when translated: Arrow's checked cast)
                return pc.cast(values, target)
            except pa.ArrowInvalid as exc:
                raise DataError(f"a predicate's CAST to {name} failed: {exc}") from None
        truncated = pc.trunc(values.cast(pa.float64()))  # (float16 and float32 widen exactly)
        fits = pc.and_(pc.greater_equal(truncated, low), pc.less(truncated, high))
        if not pc.all(fits).as_py():  # (false for NaN: it compares false)
            bad = values.filter(pc.invert(fits))[0].as_py()
            raise DataError(
                f"a predicate's CAST to {name} failed: can't cast value {_rust_debug(bad)} to"
                f" type {name} (DataFusion refuses a float that is NaN, infinite or out of the"
                " integer's range)"
            )
        return pc.cast(truncated, target)

    return ScalarUdf(f"datafusion_cast_{name.lower()}", cast, target)


FLOAT_TO_INTEGER: Final = {kind: _float_to_integer(kind) for kind in _INTEGERS}
"""The function a translated cast of a float to each integer type calls (the table engine's
reads resolve them, as datafusion_floats.SIGNBIT)."""


__all__ = ["FLOAT_TO_INTEGER"]
