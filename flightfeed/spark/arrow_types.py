"""The Spark schema of an Arrow schema: the columns Spark cannot hold as they are widened to
types that hold every value exactly, and a clear error naming the column where none does.

pyspark converts a fixed set of Arrow types. Others (unsigned integers, half floats, string and
binary views, 32-bit times, 64-bit dates, run-end encoded arrays) made the DataFrame's
definition fail with UNSUPPORTED_DATA_TYPE_FOR_ARROW_CONVERSION, naming a type but not the
column. Each batch read is then cast to the widened types (`source.conform`), with Arrow C++.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from ..errors import InvalidArgument

SPARK_UNSIGNED: Final[dict[pa.DataType, pa.DataType]] = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
}
"""Spark has no unsigned integers: each is read as the narrowest signed type holding it."""
SPARK_MAX_DECIMAL_PRECISION: Final = 38


def spark_schema(arrow: pa.Schema, *, timestamps_as_instants: bool = False) -> StructType:
    """What Spark is told a source with `arrow`'s columns holds. `timestamps_as_instants`: a
    timestamp without a zone is Spark's TimestampType (an instant), not TIMESTAMP_NTZ."""
    spark_fields = []
    for field in arrow:
        one = pa.schema([field.with_type(_widened(field.type, field.name))])
        try:  # a field at a time, to name the column pyspark refuses
            spark_fields.extend(from_arrow_schema(one, not timestamps_as_instants).fields)
        except (PySparkException, TypeError) as exc:
            raise _unreadable(field.name, field.type, str(exc)) from None
    return StructType(spark_fields)


def _widened(type_: pa.DataType, column: str) -> pa.DataType:
    """`type_` as one Spark can hold with every value exact, or `type_` itself where Spark
    holds it already or nothing can (then pyspark says so, and `spark_schema` names the
    column)."""
    if type_ in SPARK_UNSIGNED:
        return SPARK_UNSIGNED[type_]
    if pa.types.is_float16(type_):
        return pa.float32()
    if pa.types.is_string_view(type_):
        return pa.string()
    if pa.types.is_binary_view(type_):
        return pa.binary()
    if pa.types.is_time32(type_):
        return pa.time64("us")
    if pa.types.is_date64(type_):
        return pa.date32()
    if pa.types.is_decimal(type_) and type_.precision > SPARK_MAX_DECIMAL_PRECISION:
        raise _unreadable(
            column, type_, f"Spark's decimals have at most {SPARK_MAX_DECIMAL_PRECISION} digits"
        )
    # (not list views: pyarrow 26 casts [[3]] after a null list view to [[]])
    if pa.types.is_list(type_):
        return pa.list_(_widened_field(type_.value_field, column))
    if pa.types.is_large_list(type_):
        return pa.large_list(_widened_field(type_.value_field, column))
    if pa.types.is_fixed_size_list(type_):
        return pa.list_(_widened_field(type_.value_field, column), type_.list_size)
    if pa.types.is_map(type_):
        return pa.map_(
            _widened_field(type_.key_field, column),
            _widened_field(type_.item_field, column),
            type_.keys_sorted,
        )
    if pa.types.is_struct(type_):
        return pa.struct([_widened_field(type_.field(i), column) for i in range(type_.num_fields)])
    if pa.types.is_run_end_encoded(type_):  # (its values, decoded by `source.conform`)
        return _widened(type_.value_type, column)
    if pa.types.is_dictionary(type_):
        return pa.dictionary(type_.index_type, _widened(type_.value_type, column), type_.ordered)
    return type_


def _widened_field(field: pa.Field, column: str) -> pa.Field:
    return field.with_type(_widened(field.type, column))


def _unreadable(column: str, type_: pa.DataType, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"column {column!r} has type {type_}, which Spark cannot read ({why}): cast it in the"
        " table's plan, or leave it out with option 'columns'"
    )
