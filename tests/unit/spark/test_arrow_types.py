"""The Spark schema of a source's Arrow schema (flightfeed.spark.arrow_types): columns Spark
cannot hold as they are widen to types that keep every value, the batches read are cast to
them (`source.conform`) without a loss, and what nothing holds is refused by name."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.spark.arrow_types import spark_schema
from flightfeed.spark.source import arrow_schema, conform


def read_as_spark(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch as a read hands it to Spark: cast to the Arrow form of its Spark schema."""
    return conform(batch, arrow_schema(spark_schema(batch.schema)))


@pytest.mark.parametrize(
    ("values", "spark_type", "read"),
    [
        (pa.array([0, 255, None], pa.uint8()), "smallint", [0, 255, None]),
        (pa.array([0, 65535], pa.uint16()), "int", [0, 65535]),
        (pa.array([0, 2**32 - 1], pa.uint32()), "bigint", [0, 2**32 - 1]),
        (pa.array([0, 2**64 - 1], pa.uint64()), "decimal(20,0)", [Decimal(0), Decimal(2**64 - 1)]),
        (pa.array([1.5, -0.25], pa.float32()).cast(pa.float16()), "float", [1.5, -0.25]),
        (pa.array(["a", None, "ü"], pa.string_view()), "string", ["a", None, "ü"]),
        (pa.array([b"\x00", b""], pa.binary_view()), "binary", [b"\x00", b""]),
        (pa.array([1500], pa.time32("ms")), "time(6)", [datetime.time(0, 0, 1, 500000)]),
        (pa.array([86_400_000], pa.date64()), "date", [datetime.date(1970, 1, 2)]),
        (
            pc.run_end_encode(pa.array([3, 3, None, 4], pa.uint8())),
            "smallint",
            [3, 3, None, 4],
        ),
        (
            pa.array([[1, 2], None, [3]], pa.list_(pa.uint32())),
            "array<bigint>",
            [[1, 2], None, [3]],
        ),
        (
            pa.array(
                [{"a": 7, "b": [1]}], pa.struct([("a", pa.uint8()), ("b", pa.list_(pa.uint16()))])
            ),
            "struct<a:smallint,b:array<int>>",
            [{"a": 7, "b": [1]}],
        ),
        (
            pa.array([[("k", 3)]], pa.map_(pa.string_view(), pa.uint64())),
            "map<string,decimal(20,0)>",
            [[("k", Decimal(3))]],
        ),
    ],
    ids=lambda v: str(v.type) if isinstance(v, pa.Array) else None,
)
def test_a_column_spark_cannot_hold_widens_and_keeps_its_values(
    values: pa.Array, spark_type: str, read: list[Any]
) -> None:
    batch = pa.record_batch({"c": values})
    assert spark_schema(batch.schema).simpleString() == f"struct<c:{spark_type}>"
    assert read_as_spark(batch).column("c").to_pylist() == read


def test_columns_spark_holds_are_left_as_they_are() -> None:
    schema = pa.schema(
        [
            ("i", pa.int64()),
            ("s", pa.large_string()),
            ("d", pa.dictionary(pa.int32(), pa.string())),
            ("t", pa.timestamp("us", tz="UTC")),
            ("n", pa.timestamp("ms")),
            ("m", pa.decimal128(38, 2)),
        ]
    )
    found = spark_schema(schema).simpleString()
    assert found == "struct<i:bigint,s:string,d:string,t:timestamp,n:timestamp_ntz,m:decimal(38,2)>"
    # a durable table's zoneless timestamps are instants:
    assert spark_schema(schema, timestamps_as_instants=True)["n"].dataType.simpleString() == (
        "timestamp"
    )


def test_nanoseconds_are_truncated_to_spark_microseconds() -> None:
    """They met a 'schema mismatch' error: Arrow's cast refused to lose the digits."""
    nanos = pa.array([1_000_000_001_999, -1], pa.timestamp("ns"))
    zoned = pa.array([-1], pa.timestamp("ns", tz="America/New_York"))
    read = read_as_spark(
        pa.record_batch({"at": nanos, "span": pa.array([1999, -1], pa.duration("ns"))})
    )
    assert read.column("at").to_pylist() == [
        datetime.datetime(1970, 1, 1, 0, 16, 40, 1),
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999999),  # floored, as Spark's own
    ]
    assert read.column("span").to_pylist() == [
        datetime.timedelta(microseconds=1),
        datetime.timedelta(0),  # towards zero: a duration is an amount, not a point in time
    ]
    read = read_as_spark(pa.record_batch({"at": zoned}))
    assert read.column("at").cast(pa.int64()).to_pylist() == [-1]  # µs since the epoch


@pytest.mark.parametrize(
    ("type_", "why"),
    [
        (pa.month_day_nano_interval(), "month_day_nano_interval is not supported"),
        (pa.dense_union([pa.field("a", pa.int64())]), "is not supported"),
        (pa.list_view(pa.int64()), "is not supported"),  # pyarrow casts some to wrong lists
        (pa.decimal256(40, 2), "at most 38 digits"),
        (pa.struct([("inner", pa.month_day_nano_interval())]), "is not supported"),
    ],
    ids=str,
)
def test_a_column_nothing_holds_is_refused_by_name(type_: pa.DataType, why: str) -> None:
    schema = pa.schema([("fine", pa.int64()), ("odd", type_)])
    with pytest.raises(InvalidArgument, match="column 'odd' has type") as refused:
        spark_schema(schema)
    assert why in str(refused.value)
    assert "leave it out with option 'columns'" in str(refused.value)


UNSIGNED = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_unsigned_value_reads_exactly(data: st.DataObject) -> None:
    type_ = data.draw(st.sampled_from(UNSIGNED))
    top = 2 ** (type_.bit_width) - 1
    values = data.draw(st.lists(st.one_of(st.none(), st.integers(0, top)), max_size=20))
    read = read_as_spark(pa.record_batch({"u": pa.array(values, type_)})).column("u")
    assert pa.types.is_signed_integer(read.type) or pa.types.is_decimal(read.type)
    assert [None if v is None else int(v) for v in read.to_pylist()] == values
