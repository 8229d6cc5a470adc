"""DataFusion's literals and types (datafusion-proto's ScalarValue and ArrowType) as pyarrow's.

Each value is checked against its type on the way in: the wire carries an int8 or a uint16 in a
32-bit varint and a decimal as 16 bytes of its own, so a peer can send what no Arrow value
holds (DataFusion itself would truncate it with `as`). A value out of range, an unknown time
zone or an unsupported type is an InvalidArgument naming it, never a wrong literal.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Sequence
from typing import Any, Final

import pyarrow as pa

from .._generated.datafusion import (
    ArrowType,
    Decimal,
    Decimal128,
    Dictionary,
    ScalarFixedSizeBinary,
    ScalarTime32Value,
    ScalarTime64Value,
    ScalarTimestampValue,
    ScalarValue,
    Timestamp,
)
from ..errors import InvalidArgument
from ..messages import oneof_member
from ..plan.expr import Expr, Literal

_UNITS: Final = ("s", "ms", "us", "ns")
"""DataFusion's TimeUnit enum, by number."""

_SIMPLE_TYPES: Final[dict[str, pa.DataType]] = {
    "none": pa.null(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "utf8": pa.string(),
    "large_utf8": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "date32": pa.date32(),
    "date64": pa.date64(),
}

_PLAIN_VALUES: Final[dict[str, pa.DataType]] = {
    "bool_value": pa.bool_(),
    "utf8_value": pa.string(),
    "large_utf8_value": pa.large_string(),
    "int8_value": pa.int8(),
    "int16_value": pa.int16(),
    "int32_value": pa.int32(),
    "int64_value": pa.int64(),
    "uint8_value": pa.uint8(),
    "uint16_value": pa.uint16(),
    "uint32_value": pa.uint32(),
    "uint64_value": pa.uint64(),
    "float32_value": pa.float32(),
    "float64_value": pa.float64(),
    "binary_value": pa.binary(),
    "large_binary_value": pa.large_binary(),
}
"""Members whose Python value is the literal itself, with the type it is."""

_INTEGER_VALUES: Final[dict[str, pa.DataType]] = {
    "date_32_value": pa.date32(),
    "date_64_value": pa.date64(),
    "duration_second_value": pa.duration("s"),
    "duration_millisecond_value": pa.duration("ms"),
    "duration_microsecond_value": pa.duration("us"),
    "duration_nanosecond_value": pa.duration("ns"),
}
"""Members holding the integer a temporal type is stored as."""

_TIMESTAMP_UNITS: Final = {
    "time_second_value": "s",
    "time_millisecond_value": "ms",
    "time_microsecond_value": "us",
    "time_nanosecond_value": "ns",
}
_TIME_TYPES: Final = {
    "time32_second_value": pa.time32("s"),
    "time32_millisecond_value": pa.time32("ms"),
    "time64_microsecond_value": pa.time64("us"),
    "time64_nanosecond_value": pa.time64("ns"),
}
DECIMAL128_BYTES: Final = 16
MAX_FIXED_WIDTH: Final = 4096
"""Widest fixed_size_binary a predicate may name: a cast of a null column to one, or a NULL of
it repeated over a batch, allocates its width for every row (HoraeDB has no such columns)."""


def arrow_type(message: ArrowType | None) -> pa.DataType:
    """The pyarrow type of a DataFusion ArrowType; InvalidArgument for one not supported."""
    if message is None:
        raise InvalidArgument("a DataFusion type is missing")
    member, value = oneof_member(message, "arrow_type_enum")
    simple = _SIMPLE_TYPES.get(member)
    if simple is not None:
        return simple
    if member == "fixed_size_binary" and isinstance(value, int):
        if not 0 < value <= MAX_FIXED_WIDTH:
            raise InvalidArgument(
                f"fixed_size_binary of width {value}: a width is 1 to {MAX_FIXED_WIDTH}"
            )
        return pa.binary(value)
    if member == "duration":
        return pa.duration(_unit(value))
    if member == "timestamp" and isinstance(value, Timestamp):
        return _timestamp_type(_unit(value.time_unit), value.timezone)
    if member == "time32" and _unit(value) in ("s", "ms"):
        return pa.time32(_unit(value))
    if member == "time64" and _unit(value) in ("us", "ns"):
        return pa.time64(_unit(value))
    if member == "decimal" and isinstance(value, Decimal):
        return _checked(lambda: pa.decimal128(value.precision, value.scale), "decimal type")
    if member == "dictionary" and isinstance(value, Dictionary):
        key, item = arrow_type(value.key), arrow_type(value.value)
        if not pa.types.is_integer(key):
            raise InvalidArgument(f"a dictionary's keys are integers, not {key}")
        return pa.dictionary(key, item)
    if not member:  # (a field number this protocol does not define, or none at all)
        raise InvalidArgument(
            "a DataFusion type this worker does not know: one DataFusion added after the"
            " version HoraeDB speaks (33), such as Utf8View, which a newer DataFusion casts"
            " VARCHAR to (cast to Utf8 instead)"
        )
    raise InvalidArgument(f"DataFusion type {member!r} is not supported here")


def scalar(message: ScalarValue | None) -> pa.Scalar:
    """The pyarrow scalar of a DataFusion ScalarValue; InvalidArgument for one out of its
    type's range or of a type not supported."""
    if message is None:
        raise InvalidArgument("a DataFusion literal is missing")
    member, value = oneof_member(message, "value")
    plain = _PLAIN_VALUES.get(member)
    if plain is not None:
        return _checked(lambda: pa.scalar(value, plain), f"{member} {value!r}")
    storage = _INTEGER_VALUES.get(member)
    if storage is not None:
        return _from_integer(value, storage, member)
    if member == "null_value":
        return pa.scalar(None, arrow_type(value))
    if member == "timestamp_value" and isinstance(value, ScalarTimestampValue):
        unit_member, count = oneof_member(value, "value")
        if unit_member not in _TIMESTAMP_UNITS:
            raise InvalidArgument("a DataFusion timestamp literal has no value")
        kind = _timestamp_type(_TIMESTAMP_UNITS[unit_member], value.timezone)
        return _from_integer(count, kind, member)
    if isinstance(value, ScalarTime32Value | ScalarTime64Value):
        time_member, count = oneof_member(value, "value")
        if time_member not in _TIME_TYPES:
            raise InvalidArgument("a DataFusion time literal has no value")
        return _from_integer(count, _TIME_TYPES[time_member], time_member)
    if member == "decimal128_value" and isinstance(value, Decimal128):
        return _decimal(value)
    if member == "fixed_size_binary_value" and isinstance(value, ScalarFixedSizeBinary):
        if value.length != len(value.values) or value.length > MAX_FIXED_WIDTH:
            raise InvalidArgument(
                f"a fixed_size_binary literal of width {value.length} holds"
                f" {len(value.values)} bytes (at most {MAX_FIXED_WIDTH})"
            )
        return _checked(lambda: pa.scalar(value.values, pa.binary(value.length)), member)
    if member == "dictionary_value" and value is not None:
        # A literal cast to a dictionary column's type: its value is what compares.
        return scalar(value.value)
    raise InvalidArgument(f"DataFusion literal {member or 'none set'!r} is not supported here")


def plain_values(messages: Sequence[ScalarValue]) -> pa.Array | None:
    """Literals of one plain type (an IN list's) as one array, made by Arrow in one call, each
    value checked against the type there; NULLs of that type are kept. None when they differ
    in type or are not plain: the caller converts them one by one."""
    kind: pa.DataType | None = None
    values: list[Any] = []
    for message in messages:
        member, value = oneof_member(message, "value")
        if member == "null_value":
            values.append(None)
            continue
        plain = _PLAIN_VALUES.get(member)
        if plain is None or (kind is not None and plain != kind):
            return None
        kind = plain
        values.append(value)
    if kind is None:
        return None
    array = _checked(lambda: pa.array(values, kind), f"IN list of {kind}")
    if array.null_count and any(
        arrow_type(m.null_value) != kind for m in messages if m.null_value is not None
    ):
        return None
    return array


NULL_BOOL: Final = Literal(pa.scalar(None, pa.bool_()))
FALSE: Final = Literal(pa.scalar(False))
TRUE: Final = Literal(pa.scalar(True))


def string_option(arg: Expr, what: str) -> str | None:
    """The value of a string literal (None for NULL), for the Arrow functions that take it as
    an option (a LIKE pattern, a prefix, trim's characters): anything else is refused."""
    if not isinstance(arg, Literal) or not (
        pa.types.is_string(arg.value.type) or pa.types.is_large_string(arg.value.type)
    ):
        raise InvalidArgument(f"{what} must be a string literal, got {arg}")
    value = arg.value.as_py()
    return None if value is None else str(value)


def _unit(value: Any) -> str:
    if not isinstance(value, int) or not 0 <= value < len(_UNITS):
        raise InvalidArgument(f"unknown DataFusion time unit {value!r}")
    return _UNITS[value]


def _timestamp_type(unit: str, timezone: str) -> pa.DataType:
    return _checked(lambda: pa.timestamp(unit, tz=timezone or None), f"time zone {timezone!r}")


def _from_integer(value: Any, kind: pa.DataType, member: str) -> pa.Scalar:
    """A temporal scalar from the integer it is stored as (int32 or int64)."""
    width = kind.bit_width
    storage = pa.int32() if width == 32 else pa.int64()
    return _checked(lambda: pa.array([value], storage).cast(kind)[0], f"{member} {value!r}")


def _decimal(value: Decimal128) -> pa.Scalar:
    if len(value.value) != DECIMAL128_BYTES:
        raise InvalidArgument(
            f"a decimal128 literal holds {len(value.value)} bytes, not {DECIMAL128_BYTES}"
        )
    unscaled = int.from_bytes(value.value, "big", signed=True)
    kind = _checked(lambda: pa.decimal128(value.p, value.s), f"decimal({value.p}, {value.s})")
    number = decimal.Decimal(unscaled).scaleb(-value.s)
    return _checked(lambda: pa.scalar(number, kind), f"decimal128 {number} as {kind}")


def _checked(make: Callable[[], Any], what: str) -> Any:
    try:
        return make()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"DataFusion {what} is not a valid Arrow value: {exc}") from None


__all__ = [
    "FALSE",
    "NULL_BOOL",
    "TRUE",
    "arrow_type",
    "plain_values",
    "scalar",
    "string_option",
]
