"""A reference encoder of HoraeDB's contiguous rows, row by row in plain Python (as HoraeDB's
ContiguousRowWriter writes them), for tests of flightfeed's vectorized decoder."""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa

from flightfeed._generated.remote_engine import ColumnDesc, ContiguousRows
from flightfeed._generated.schema import DataType
from flightfeed.tables.schema import TableSchema

FIXED: Final[dict[DataType, str]] = {
    DataType.TIMESTAMP: "<q",
    DataType.DOUBLE: "<d",
    DataType.FLOAT: "<f",
    DataType.UINT64: "<Q",
    DataType.UINT32: "<I",
    DataType.UINT16: "<H",
    DataType.UINT8: "<B",
    DataType.INT64: "<q",
    DataType.INT32: "<i",
    DataType.INT16: "<h",
    DataType.INT8: "<b",
    DataType.BOOL: "<?",
    DataType.DATE: "<i",
    DataType.TIME: "<q",
}
VARIABLE: Final = (DataType.STRING, DataType.VARBINARY)


def width(kind: DataType) -> int:
    return 4 if kind in VARIABLE else struct.calcsize(FIXED[kind])


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def raw(kind: DataType, value: Any) -> Any:
    """A Python value (as pyarrow's to_pylist gives it, or already the stored number or
    bytes) as what HoraeDB stores."""
    if kind == DataType.TIMESTAMP and isinstance(value, dt.datetime):
        return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1)
    if kind == DataType.DATE and isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    if kind == DataType.TIME and isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**9 + (
            value.microsecond * 1000
        )
    if kind == DataType.STRING and isinstance(value, str):
        return value.encode()
    return value


def encode_row(kinds: Sequence[DataType], values: Sequence[Any]) -> bytes:
    """One row: the no-null layout when every value is there, else the bit-set one."""
    nulls = [v is None for v in values]
    fixed = bytearray()
    variable = bytearray()
    header = struct.pack("<I", 0)
    if any(nulls):
        bits = bytearray((len(kinds) + 7) // 8)
        for index, null in enumerate(nulls):
            if not null:
                bits[index // 8] |= 1 << (index % 8)
        header = struct.pack("<I", len(kinds)) + bytes(bits)
    kept = [(k, raw(k, v)) for k, v in zip(kinds, values, strict=True) if v is not None]
    fixed_size = len(header) + sum(width(k) for k, _ in kept)
    for kind, value in kept:
        if kind in VARIABLE:
            fixed += struct.pack("<I", fixed_size + len(variable))
            variable += varint(len(value)) + value
        else:
            fixed += struct.pack(FIXED[kind], value)
    return header + bytes(fixed) + bytes(variable)


def contiguous_rows(schema: TableSchema, rows: pa.Table) -> ContiguousRows:
    """`rows` (the table's columns, in its order) as HoraeDB would send them."""
    kinds = [c.type.data_type for c in schema.columns]
    names = [c.name for c in schema.columns]
    encoded = [encode_row(kinds, [row[n] for n in names]) for row in rows.to_pylist()]
    descs = [ColumnDesc(id=c.id, typ=c.type.data_type) for c in schema.columns]
    return ContiguousRows(schema_version=schema.version, encoded_rows=encoded, column_descs=descs)
