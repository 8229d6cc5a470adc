"""TableSchema: from_arrow's defaults, every rule HoraeDB's schemas obey, the proto round trip
(a property over generated schemas), from_proto's checks of what the network sends, and
with_added."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.schema import ColumnSchema, DataType
from flightfeed._generated.schema import TableSchema as TableSchemaProto
from flightfeed.errors import InvalidArgument
from flightfeed.tables.schema import MAX_COLUMNS, MAX_NAME_BYTES, Column, TableSchema
from flightfeed.tables.types import TYPES, ColumnType, of_arrow, of_data_type

TS = of_data_type(DataType.TIMESTAMP)
INT = of_data_type(DataType.INT64)
STR = of_data_type(DataType.STRING)
FLOATS = (DataType.DOUBLE, DataType.FLOAT)

ARROW = pa.schema(
    [
        pa.field("host", pa.string()),
        pa.field("ts", pa.timestamp("ms")),
        pa.field("region", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("count", pa.int64(), nullable=False),
    ]
)


# --- from_arrow ------------------------------------------------------------------------


def test_from_arrow_defaults_the_key_to_the_tags_then_the_timestamp() -> None:
    schema = TableSchema.from_arrow(ARROW, timestamp="ts", tags=["region", "host"])
    assert schema.primary_key == ("region", "host", "ts")
    assert schema.timestamp == "ts"
    assert schema.version == 1
    assert schema.names == ["host", "ts", "region", "value", "count"]
    assert [c.id for c in schema.columns] == [1, 2, 3, 4, 5]
    assert schema.tags == ("host", "region")  # in column order
    by_name = {c.name: c for c in schema.columns}
    # key and timestamp columns become non-null; the others keep what the fields say
    assert not by_name["ts"].nullable
    assert not by_name["host"].nullable
    assert not by_name["region"].nullable
    assert by_name["value"].nullable
    assert not by_name["count"].nullable
    assert [c.is_tag for c in schema.columns] == [True, False, True, False, False]


def test_from_arrow_without_tags_keys_on_the_timestamp_alone() -> None:
    schema = TableSchema.from_arrow(ARROW, timestamp="ts")
    assert schema.primary_key == ("ts",)
    assert schema.tags == ()
    assert [c.nullable for c in schema.columns] == [True, False, True, True, False]


def test_from_arrow_with_an_explicit_key_makes_its_columns_non_null() -> None:
    schema = TableSchema.from_arrow(
        ARROW, timestamp="ts", tags=["host"], primary_key=["ts", "count"]
    )
    assert schema.primary_key == ("ts", "count")
    assert not schema.column("ts").nullable
    assert not schema.column("count").nullable
    assert schema.column("host").nullable  # a tag outside the key stays nullable
    assert schema.column("host").is_tag


def test_from_arrow_maps_arrow_types_to_table_types() -> None:
    arrow = pa.schema(
        [
            ("ts", pa.timestamp("ns", tz="UTC")),
            ("ls", pa.large_string()),
            ("lb", pa.large_binary()),
            ("d", pa.dictionary(pa.int32(), pa.string())),
        ]
    )
    schema = TableSchema.from_arrow(arrow, timestamp="ts")
    kinds = [c.type.data_type for c in schema.columns]
    assert kinds == [DataType.TIMESTAMP, DataType.STRING, DataType.VARBINARY, DataType.STRING]
    assert schema.arrow == pa.schema(
        [
            pa.field("ts", pa.timestamp("ms"), nullable=False),
            ("ls", pa.string()),
            ("lb", pa.binary()),
            ("d", pa.string()),
        ]
    )


@pytest.mark.parametrize("column_type", TYPES, ids=lambda t: t.data_type.name)
def test_every_table_type_round_trips_through_its_arrow_type(column_type: ColumnType) -> None:
    assert of_arrow(column_type.arrow) == column_type
    assert of_data_type(column_type.data_type) == column_type
    assert of_data_type(int(column_type.data_type)) == column_type


def test_an_unsupported_arrow_type_is_refused_with_the_supported_ones_named() -> None:
    with pytest.raises(InvalidArgument, match=r"decimal.*timestamp\[ms\]"):
        TableSchema.from_arrow(
            pa.schema([("ts", pa.timestamp("ms")), ("d", pa.decimal128(10, 2))]), timestamp="ts"
        )


def test_data_type_null_is_not_a_column_type() -> None:
    with pytest.raises(InvalidArgument, match="data type"):
        of_data_type(DataType.NULL)


# --- validation --------------------------------------------------------------------------


def test_a_missing_timestamp_column_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"no column\(s\) \['time'\]"):
        TableSchema.from_arrow(ARROW, timestamp="time")
    with pytest.raises(InvalidArgument, match="no column 'time'"):
        TableSchema((Column("ts", TS, nullable=False, id=1),), "time", ("time",))


def test_missing_tag_or_key_columns_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"no column\(s\) \['nope'\]"):
        TableSchema.from_arrow(ARROW, timestamp="ts", tags=["nope"])
    with pytest.raises(InvalidArgument, match=r"no column\(s\) \['other'\]"):
        TableSchema.from_arrow(ARROW, timestamp="ts", primary_key=["other", "ts"])


def test_a_nullable_timestamp_column_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"'ts' must be a non-null TIMESTAMP.*nullable"):
        TableSchema((Column("ts", TS, nullable=True, id=1),), "ts", ("ts",))


@pytest.mark.parametrize("name", ["value", "count", "host"])
def test_a_timestamp_column_of_another_type_is_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match=f"'{name}' must be a non-null TIMESTAMP"):
        TableSchema.from_arrow(ARROW, timestamp=name)


@pytest.mark.parametrize("kind", [pa.float64(), pa.float32()])
def test_a_floating_point_tag_is_refused(kind: pa.DataType) -> None:
    arrow = pa.schema([("ts", pa.timestamp("ms")), ("x", kind)])
    with pytest.raises(InvalidArgument, match="tag 'x' cannot be floating point"):
        TableSchema.from_arrow(arrow, timestamp="ts", tags=["x"])
    # the same column is fine as a field, or in the key without being a tag
    assert TableSchema.from_arrow(arrow, timestamp="ts").column("x").nullable
    keyed = TableSchema.from_arrow(arrow, timestamp="ts", primary_key=["x", "ts"])
    assert keyed.primary_key == ("x", "ts")


def test_duplicate_column_names_are_refused() -> None:
    arrow = pa.schema([("ts", pa.timestamp("ms")), ("a", pa.int64()), ("a", pa.string())])
    with pytest.raises(InvalidArgument, match="distinct"):
        TableSchema.from_arrow(arrow, timestamp="ts")
    with pytest.raises(InvalidArgument, match="distinct"):
        TableSchema(
            (Column("ts", TS, nullable=False, id=1), Column("ts", INT, id=2)), "ts", ("ts",)
        )


def test_a_primary_key_without_the_timestamp_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"primary key \['host'\] must hold 'ts'"):
        TableSchema.from_arrow(ARROW, timestamp="ts", primary_key=["host"])


def test_a_repeated_key_column_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="repeat"):
        TableSchema.from_arrow(ARROW, timestamp="ts", primary_key=["host", "ts", "host"])


def test_a_nullable_key_column_is_refused() -> None:
    columns = (Column("ts", TS, nullable=False, id=1), Column("k", INT, nullable=True, id=2))
    with pytest.raises(InvalidArgument, match="'k' must not be nullable"):
        TableSchema(columns, "ts", ("k", "ts"))


@pytest.mark.parametrize("name", ["", "a\x00b", "x" * (MAX_NAME_BYTES + 1), "é" * 128])
def test_bad_column_names_are_refused(name: str) -> None:
    columns = (Column("ts", TS, nullable=False, id=1), Column(name, INT, id=2))
    with pytest.raises(InvalidArgument, match="bad column name"):
        TableSchema(columns, "ts", ("ts",))


def test_a_name_of_exactly_the_limit_is_accepted() -> None:
    name = "x" * MAX_NAME_BYTES
    columns = (Column("ts", TS, nullable=False, id=1), Column(name, INT, id=2))
    assert TableSchema(columns, "ts", ("ts",)).names == ["ts", name]


def test_a_schema_needs_columns_and_a_positive_version() -> None:
    with pytest.raises(InvalidArgument, match="at least one column"):
        TableSchema((), "ts", ("ts",))
    with pytest.raises(InvalidArgument, match="versions start at 1"):
        TableSchema((Column("ts", TS, nullable=False, id=1),), "ts", ("ts",), version=0)


# --- proto -------------------------------------------------------------------------------

NAMES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12
)


@st.composite
def schemas(draw: st.DrawFn) -> TableSchema:
    names = draw(st.lists(NAMES, min_size=0, max_size=8, unique=True))
    ts_name = draw(NAMES.filter(lambda n: n not in names))
    ts_at = draw(st.integers(0, len(names)))
    names.insert(ts_at, ts_name)
    ids = draw(
        st.lists(st.integers(0, 2**32 - 1), min_size=len(names), max_size=len(names), unique=True)
    )
    others = [n for n in names if n != ts_name]
    key_others = draw(st.lists(st.sampled_from(others), unique=True) if others else st.just([]))
    key = list(key_others)
    key.insert(draw(st.integers(0, len(key))), ts_name)
    columns = []
    for name, column_id in zip(names, ids, strict=True):
        kind = TS if name == ts_name else draw(st.sampled_from(TYPES))
        non_float = kind.data_type not in FLOATS
        columns.append(
            Column(
                name=name,
                type=kind,
                nullable=name not in key and draw(st.booleans()),
                is_tag=non_float and name != ts_name and draw(st.booleans()),
                id=column_id,
                comment=draw(st.text(max_size=10)),
            )
        )
    version = draw(st.integers(1, 2**32 - 1))
    return TableSchema(tuple(columns), ts_name, tuple(key), version)


@settings(max_examples=200, deadline=None)
@given(schema=schemas())
def test_the_proto_round_trip_gives_the_same_schema(schema: TableSchema) -> None:
    assert TableSchema.from_proto(schema.to_proto()) == schema
    wire = bytes(schema.to_proto())
    assert TableSchema.from_proto(TableSchemaProto.parse(wire)) == schema


def test_to_proto_names_columns_by_id() -> None:
    schema = TableSchema.from_arrow(ARROW, timestamp="ts", tags=["region", "host"])
    msg = schema.to_proto()
    assert msg.timestamp_id == 2
    assert msg.primary_key_ids == [3, 1, 2]
    assert msg.version == 1
    assert [(c.name, c.id, c.data_type, c.is_nullable, c.is_tag) for c in msg.columns] == [
        ("host", 1, DataType.STRING, False, True),
        ("ts", 2, DataType.TIMESTAMP, False, False),
        ("region", 3, DataType.STRING, False, True),
        ("value", 4, DataType.DOUBLE, True, False),
        ("count", 5, DataType.INT64, False, False),
    ]


def proto(
    columns: list[ColumnSchema], timestamp_id: int = 1, key: list[int] | None = None
) -> TableSchemaProto:
    return TableSchemaProto(
        columns=columns,
        version=3,
        timestamp_id=timestamp_id,
        primary_key_ids=[timestamp_id] if key is None else key,
    )


def ts_column(column_id: int = 1) -> ColumnSchema:
    return ColumnSchema(name="ts", data_type=DataType.TIMESTAMP, is_nullable=False, id=column_id)


def test_from_proto_refuses_duplicate_ids() -> None:
    msg = proto([ts_column(1), ColumnSchema(name="v", data_type=DataType.INT64, id=1)])
    with pytest.raises(InvalidArgument, match=r"ids .* must be distinct"):
        TableSchema.from_proto(msg)


def test_from_proto_refuses_an_unknown_timestamp_id() -> None:
    msg = proto([ts_column(1)], timestamp_id=7, key=[1])
    with pytest.raises(InvalidArgument, match=r"column ids \[7\]"):
        TableSchema.from_proto(msg)


def test_from_proto_refuses_an_unknown_key_id() -> None:
    msg = proto([ts_column(1)], key=[1, 9])
    with pytest.raises(InvalidArgument, match=r"column ids \[9\]"):
        TableSchema.from_proto(msg)


def test_from_proto_refuses_an_unknown_data_type_value() -> None:
    known = proto([ts_column(1), ColumnSchema(name="v", data_type=DataType.INT64, id=2)])
    wire = bytes(known)
    # the second column's data_type (field 2, varint 7 = INT64) set to 99, which no DataType is
    marker = bytes([0x0A, 0x01]) + b"v" + bytes([0x10, 0x07])
    assert wire.count(marker) == 1
    unknown = TableSchemaProto.parse(wire.replace(marker, marker[:-1] + bytes([99])))
    with pytest.raises(InvalidArgument, match="data type"):
        TableSchema.from_proto(unknown)


def test_from_proto_refuses_data_type_null() -> None:
    msg = proto([ts_column(1), ColumnSchema(name="v", data_type=DataType.NULL, id=2)])
    with pytest.raises(InvalidArgument, match="data type"):
        TableSchema.from_proto(msg)


def test_from_proto_applies_the_schema_rules() -> None:
    nullable_ts = ColumnSchema(name="ts", data_type=DataType.TIMESTAMP, is_nullable=True, id=1)
    with pytest.raises(InvalidArgument, match="non-null TIMESTAMP"):
        TableSchema.from_proto(proto([nullable_ts]))
    float_tag = ColumnSchema(name="f", data_type=DataType.FLOAT, is_tag=True, id=2)
    with pytest.raises(InvalidArgument, match="floating point"):
        TableSchema.from_proto(proto([ts_column(1), float_tag]))


def test_from_proto_reads_an_absent_version_as_1() -> None:
    msg = TableSchemaProto(columns=[ts_column(1)], timestamp_id=1, primary_key_ids=[1])
    assert msg.version == 0
    assert TableSchema.from_proto(msg).version == 1


def test_from_proto_refuses_too_many_columns() -> None:
    columns = [ts_column(0)] + [
        ColumnSchema(name=f"c{i}", data_type=DataType.INT8, is_nullable=True, id=i)
        for i in range(1, MAX_COLUMNS + 1)
    ]
    with pytest.raises(InvalidArgument, match=f"at most {MAX_COLUMNS} columns"):
        TableSchema.from_proto(proto(columns, timestamp_id=0))
    assert len(TableSchema.from_proto(proto(columns[:MAX_COLUMNS], timestamp_id=0)).columns) == (
        MAX_COLUMNS
    )


# --- with_added --------------------------------------------------------------------------


def test_with_added_continues_the_ids_and_raises_the_version() -> None:
    base = TableSchema(
        (Column("ts", TS, nullable=False, id=3), Column("k", STR, nullable=False, id=7)),
        "ts",
        ("k", "ts"),
        version=4,
    )
    added = base.with_added([Column("a", INT), Column("b", STR, comment="c")])
    assert added.version == 5
    assert added.names == ["ts", "k", "a", "b"]
    assert [c.id for c in added.columns] == [3, 7, 8, 9]
    assert added.column("a") == Column("a", INT, nullable=True, is_tag=False, id=8)
    assert added.column("b").comment == "c"
    assert (added.timestamp, added.primary_key) == ("ts", ("k", "ts"))
    assert base.version == 4  # the original is unchanged
    assert base.names == ["ts", "k"]
    assert added.with_added([]).version == 6


def test_with_added_keeps_the_ids_and_tags_it_is_given() -> None:
    """A HoraeDB node sends the altered schema whole, ids assigned and tags flagged, and then
    writes rows by those ids: the columns were stored with new ids and not as tags, and the
    node's next write was refused. An id left 0 (unset) takes the next free one."""
    base = TableSchema.from_arrow(ARROW, timestamp="ts", tags=["host"])  # ids 1 to 5
    added = base.with_added(
        [Column("dc", STR, id=9, is_tag=True), Column("rack", STR), Column("n", INT, id=7)]
    )
    assert [(c.name, c.id, c.is_tag) for c in added.columns[5:]] == [
        ("dc", 9, True),
        ("rack", 10, False),
        ("n", 7, False),
    ]
    assert added.primary_key == base.primary_key  # a tag added is not a key column


def test_with_added_refuses_an_id_the_table_or_another_added_column_has() -> None:
    base = TableSchema.from_arrow(ARROW, timestamp="ts")  # ids 1 to 5; region is 3
    with pytest.raises(
        InvalidArgument, match=r"added column 'dc' asks for id 3, which column 'region' has"
    ):
        base.with_added([Column("dc", STR, id=3)])
    with pytest.raises(InvalidArgument, match=r"added column 'b' asks for id 8, which column 'a'"):
        base.with_added([Column("a", STR, id=8), Column("b", STR, id=8)])


def test_with_added_refuses_a_floating_point_tag() -> None:
    base = TableSchema.from_arrow(ARROW, timestamp="ts")
    with pytest.raises(InvalidArgument, match="tag 'load' cannot be floating point"):
        base.with_added([Column("load", of_arrow(pa.float64()), id=6, is_tag=True)])


def test_with_added_refuses_a_non_nullable_column() -> None:
    base = TableSchema.from_arrow(ARROW, timestamp="ts")
    with pytest.raises(InvalidArgument, match="must be nullable: 'n'"):
        base.with_added([Column("ok", INT), Column("n", INT, nullable=False)])


def test_with_added_refuses_a_name_the_table_has() -> None:
    base = TableSchema.from_arrow(ARROW, timestamp="ts")
    with pytest.raises(InvalidArgument, match="distinct"):
        base.with_added([Column("value", INT)])


def test_names_that_differ_only_in_case_are_refused_as_sql_would_clash() -> None:
    """DuckDB's names ignore case: `Value` and `value` would be one column (its Catalog Error
    reached clients before)."""
    msg = proto([ts_column(1), ColumnSchema(name="Value", data_type=DataType.INT64, id=2),
                 ColumnSchema(name="value", data_type=DataType.INT64, id=3)])  # fmt: skip
    with pytest.raises(InvalidArgument, match=r"distinct, ignoring case, got \['Value', 'value'\]"):
        TableSchema.from_proto(msg)
    schema = TableSchema.from_proto(proto([ts_column(1)]))
    with pytest.raises(InvalidArgument, match=r"ignoring case, got \['ts', 'TS'\]"):
        schema.with_added([Column("TS", schema.column("ts").type)])
