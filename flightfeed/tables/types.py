"""The column types a table can hold: HoraeDB's `schema.DataType`, its Arrow type and the DuckDB
type it is stored as, one row per type.

HoraeDB's TIMESTAMP is milliseconds since the epoch: Arrow `timestamp[ms]`, DuckDB
`TIMESTAMP_MS`. Its TIME is stored as DuckDB's TIME, microseconds (`time64[us]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from .._generated.schema import DataType
from ..errors import InvalidArgument


@dataclass(frozen=True)
class ColumnType:
    data_type: DataType
    arrow: pa.DataType
    duckdb: str


TYPES: Final = (
    ColumnType(DataType.TIMESTAMP, pa.timestamp("ms"), "TIMESTAMP_MS"),
    ColumnType(DataType.DOUBLE, pa.float64(), "DOUBLE"),
    ColumnType(DataType.FLOAT, pa.float32(), "FLOAT"),
    ColumnType(DataType.VARBINARY, pa.binary(), "BLOB"),
    ColumnType(DataType.STRING, pa.string(), "VARCHAR"),
    ColumnType(DataType.UINT64, pa.uint64(), "UBIGINT"),
    ColumnType(DataType.UINT32, pa.uint32(), "UINTEGER"),
    ColumnType(DataType.UINT16, pa.uint16(), "USMALLINT"),
    ColumnType(DataType.UINT8, pa.uint8(), "UTINYINT"),
    ColumnType(DataType.INT64, pa.int64(), "BIGINT"),
    ColumnType(DataType.INT32, pa.int32(), "INTEGER"),
    ColumnType(DataType.INT16, pa.int16(), "SMALLINT"),
    ColumnType(DataType.INT8, pa.int8(), "TINYINT"),
    ColumnType(DataType.BOOL, pa.bool_(), "BOOLEAN"),
    ColumnType(DataType.DATE, pa.date32(), "DATE"),
    ColumnType(DataType.TIME, pa.time64("us"), "TIME"),
)
_BY_DATA_TYPE: Final = {t.data_type: t for t in TYPES}
_BY_ARROW: Final = {t.arrow: t for t in TYPES}
_ALIASES: Final = {  # Arrow types stored as the nearest table type, losslessly
    pa.large_string(): pa.string(),
    pa.string_view(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.binary_view(): pa.binary(),
}


def of_data_type(data_type: DataType | int) -> ColumnType:
    try:
        return _BY_DATA_TYPE[DataType(data_type)]
    except (KeyError, ValueError):
        raise InvalidArgument(f"a table column cannot be of data type {data_type!r}") from None


def of_arrow(arrow: pa.DataType) -> ColumnType:
    """The table type an Arrow type is stored as: timestamps of any unit or zone are
    TIMESTAMP (milliseconds), large and view strings are STRING."""
    if pa.types.is_timestamp(arrow):
        return _BY_DATA_TYPE[DataType.TIMESTAMP]
    if pa.types.is_dictionary(arrow):
        arrow = arrow.value_type
    found = _BY_ARROW.get(_ALIASES.get(arrow, arrow))
    if found is None:
        supported = ", ".join(str(t.arrow) for t in TYPES)
        raise InvalidArgument(f"a table column cannot be of Arrow type {arrow} ({supported})")
    return found


__all__ = ["TYPES", "ColumnType", "of_arrow", "of_data_type"]
