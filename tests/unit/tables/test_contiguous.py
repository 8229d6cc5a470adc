"""HoraeDB's contiguous rows: the vectorized decoder against a row-by-row reference encoder
(tests/helpers/contiguous_rows.py) over every column type, nulls in any place, and every way a
row can lie about its own offsets and lengths."""

from __future__ import annotations

import datetime as dt
import re
import struct
from typing import Any

import pyarrow as pa
import pytest
from helpers.contiguous_rows import contiguous_rows, encode_row, varint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed._generated.remote_engine import ColumnDesc, ContiguousRows
from flightfeed._generated.schema import DataType
from flightfeed.errors import InvalidArgument, ResourceExhausted
from flightfeed.tables import contiguous
from flightfeed.tables.contiguous import decode_contiguous_rows
from flightfeed.tables.decode_budget import DecodeBudget
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import conform_rows
from flightfeed.tables.types import TYPES

LIMIT = 1 << 30


def values(arrow: pa.DataType) -> st.SearchStrategy[Any]:
    """Python values of a column of `arrow` type, as pyarrow's to_pylist gives them back."""
    ints = {
        pa.int8(): 8,
        pa.int16(): 16,
        pa.int32(): 32,
        pa.int64(): 64,
    }
    if arrow in ints:
        bits = ints[arrow]
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    unsigned = {pa.uint8(): 8, pa.uint16(): 16, pa.uint32(): 32, pa.uint64(): 64}
    if arrow in unsigned:
        return st.integers(0, (1 << unsigned[arrow]) - 1)
    if arrow == pa.float64():
        return st.floats(allow_nan=False)
    if arrow == pa.float32():
        return st.floats(allow_nan=False, width=32)
    if arrow == pa.string():
        return st.text(max_size=300)  # past 127 bytes, a length takes two varint bytes
    if arrow == pa.binary():
        return st.binary(max_size=300)
    if arrow == pa.bool_():
        return st.booleans()
    if arrow == pa.date32():
        return st.dates()
    if arrow == pa.time64("us"):
        return st.times()
    assert pa.types.is_timestamp(arrow)
    return st.integers(-(10**13), 10**13).map(
        lambda ms: dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)
    )


@st.composite
def tables(draw: st.DrawFn) -> tuple[TableSchema, pa.Table]:
    """A table schema (a timestamp column, then columns of any types, nullable or not) and
    rows of it."""
    types = draw(st.lists(st.sampled_from(TYPES), max_size=12))
    fields = [pa.field("ts", pa.timestamp("ms"), nullable=False)]
    fields += [
        pa.field(f"c{i}", t.arrow, nullable=draw(st.booleans())) for i, t in enumerate(types)
    ]
    schema = TableSchema.from_arrow(pa.schema(fields), timestamp="ts")
    count = draw(st.integers(0, 40))
    columns = {}
    for field in schema.arrow:
        strategy = values(field.type)
        if field.nullable:
            strategy = st.none() | strategy
        columns[field.name] = pa.array(
            draw(st.lists(strategy, min_size=count, max_size=count)), field.type
        )
    return schema, pa.table(columns, schema=schema.arrow)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_rows_decode_to_what_was_encoded(case: tuple[TableSchema, pa.Table]) -> None:
    schema, expected = case
    decoded = decode_contiguous_rows(
        contiguous_rows(schema, expected), schema, budget=DecodeBudget(LIMIT)
    )
    assert decoded.num_rows == expected.num_rows
    got = conform_rows(schema, decoded)
    assert got.equals(expected), f"{got.to_pylist()}\n!=\n{expected.to_pylist()}"


@settings(max_examples=100, deadline=None)
@given(tables(), st.integers(1, 3))
def test_rows_decode_alike_in_chunks(case: tuple[TableSchema, pa.Table], chunk_rows: int) -> None:
    """Chunks of rows decode to the same table as one chunk."""
    schema, expected = case
    encoded = contiguous_rows(schema, expected)
    decoded = decode_contiguous_rows(
        encoded, schema, budget=DecodeBudget(LIMIT), chunk_rows=chunk_rows
    )
    assert conform_rows(schema, decoded).equals(expected)


# --- malformed rows --------------------------------------------------------------------------

SCHEMA = TableSchema.from_arrow(
    pa.schema([pa.field("ts", pa.timestamp("ms")), ("host", pa.string()), ("v", pa.float64())]),
    timestamp="ts",
)
KINDS = [c.type.data_type for c in SCHEMA.columns]
GOOD = encode_row(KINDS, [1000, b"web-1", 0.5])
WITH_NULL = encode_row(KINDS, [1000, None, 0.5])


def rows_of(*encoded: bytes, schema: TableSchema = SCHEMA) -> ContiguousRows:
    descs = [ColumnDesc(id=c.id, typ=c.type.data_type) for c in schema.columns]
    return ContiguousRows(schema_version=1, encoded_rows=list(encoded), column_descs=descs)


def decode(*encoded: bytes) -> pa.Table:
    return decode_contiguous_rows(rows_of(*encoded), SCHEMA, budget=DecodeBudget(LIMIT))


def test_the_two_layouts_decode() -> None:
    """The reference rows are HoraeDB's two layouts, byte for byte."""
    assert (
        struct.pack("<I", 0)
        + struct.pack("<q", 1000)
        + struct.pack("<I", 4 + 8 + 4 + 8)  # the string's bytes start after the fixed part
        + struct.pack("<d", 0.5)
        + varint(5)
        + b"web-1"
    ) == GOOD
    assert struct.pack("<I", 3) + bytes([0b101]) + struct.pack("<qd", 1000, 0.5) == WITH_NULL
    table = decode(GOOD, WITH_NULL)
    assert table.column("host").to_pylist() == ["web-1", None]
    assert table.column("v").to_pylist() == [0.5, 0.5]


BAD_ROWS: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "row 1: shorter than its 4-byte header"),
    "a header only": (struct.pack("<I", 0), "row 1: shorter than its fixed part"),
    "a bit set of other than 3 columns": (
        struct.pack("<I", 4) + bytes(1),
        "row 1: a null bit set of other than the table's 3 columns",
    ),
    "no room for the bit set": (
        struct.pack("<I", 3),
        "row 1: shorter than its header and 1-byte bit set",
    ),
    "a string offset into the fixed part": (
        GOOD[:12] + struct.pack("<I", 8) + GOOD[16:],
        "row 1, column 'host': a string offset outside the row's variable part",
    ),
    "a string offset past the end": (
        GOOD[:12] + struct.pack("<I", len(GOOD)) + GOOD[16:],
        "row 1, column 'host': a string offset outside the row's variable part",
    ),
    "a length running past the end": (
        GOOD[:-6] + varint(6) + b"web-1",
        "row 1, column 'host': a string running past the row's end",
    ),
    "a length that never ends": (
        GOOD[:-6] + b"\xff" * 6,
        "row 1, column 'host': a malformed string length",
    ),
    "a length cut by the row's end": (
        GOOD[:-6] + b"\x80",
        "row 1, column 'host': a malformed string length",
    ),
    "bytes that are not UTF-8": (
        GOOD[:-6] + varint(5) + b"web\xff1",
        "column 'host': a string that is not UTF-8",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_ROWS))
def test_a_malformed_row_is_named(name: str) -> None:
    row, message = BAD_ROWS[name]
    with pytest.raises(InvalidArgument, match="^contiguous rows: " + re.escape(message)):
        decode(GOOD, row, GOOD)


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from([GOOD, WITH_NULL]), st.data())
def test_any_mutation_of_a_row_decodes_or_is_refused_clearly(
    row: bytes, data: st.DataObject
) -> None:
    """Flipped, cut or extended bytes: a table of 2 rows, or InvalidArgument; never an index
    error from a bad offset."""
    mutated = bytearray(row)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["set", "cut", "extend"]))
        if action == "set" and mutated:
            mutated[data.draw(st.integers(0, len(mutated) - 1))] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del mutated[data.draw(st.integers(0, len(mutated))) :]
        else:
            mutated += data.draw(st.binary(min_size=1, max_size=8))
    try:
        table = decode(GOOD, bytes(mutated))
    except InvalidArgument:
        return
    assert table.num_rows == 2


def test_rows_encoded_for_another_schema_are_refused() -> None:
    other = TableSchema.from_arrow(
        pa.schema([pa.field("ts", pa.timestamp("ms")), ("host", pa.string()), ("v", pa.int64())]),
        timestamp="ts",
    )
    with pytest.raises(
        InvalidArgument,
        match=r"column 2 is id 3 of type INT64 in the request, id 3 of type DOUBLE \('v'\) in"
        r" the table \(schema version 1\): read the table info again",
    ):
        decode_contiguous_rows(rows_of(GOOD, schema=other), SCHEMA, budget=DecodeBudget(LIMIT))
    fewer = ContiguousRows(schema_version=1, encoded_rows=[GOOD], column_descs=[])
    with pytest.raises(InvalidArgument, match="the request describes 0 columns, the table has 3"):
        decode_contiguous_rows(fewer, SCHEMA, budget=DecodeBudget(LIMIT))
    unknown = rows_of(GOOD)
    unknown.column_descs[1].typ = 99
    with pytest.raises(InvalidArgument, match="column 1 is id 2 of type 99 in the request"):
        decode_contiguous_rows(unknown, SCHEMA, budget=DecodeBudget(LIMIT))


def test_what_rows_may_decode_to_is_checked_before_decoding() -> None:
    """Short rows of many null columns would decode to far more than they take: the bound is
    the rows times the columns' widths, checked before any array is made."""
    wide = TableSchema.from_arrow(
        pa.schema(
            [pa.field("ts", pa.timestamp("ms"))] + [(f"c{i}", pa.int64()) for i in range(999)]
        ),
        timestamp="ts",
    )
    row = encode_row([c.type.data_type for c in wide.columns], [0] + [None] * 999)
    rows = rows_of(*[row] * 1000, schema=wide)
    with pytest.raises(ResourceExhausted, match="1000 rows of 1000 columns decodes to"):
        decode_contiguous_rows(rows, wide, budget=DecodeBudget(10_000_000))
    assert decode_contiguous_rows(rows, wide, budget=DecodeBudget(LIMIT)).num_rows == 1000


def test_the_decoded_types_are_horaedbs() -> None:
    assert DataType.TIME in contiguous.LAYOUTS
    assert contiguous.LAYOUTS[DataType.TIME].arrow == pa.time64("ns")
