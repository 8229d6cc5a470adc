"""The `flightfeed` data source's pure parts (flightfeed.spark.source): its options, the table
query they become, the filters a reader pushes (and keeps through pickling), and `conform`,
which hands Spark batches exactly as it declared the columns."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    GreaterThan,
    In,
    IsNotNull,
    Not,
    StringStartsWith,
)
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from flightfeed.coordinator.table_query import ParsedTableQuery, parse_table_query
from flightfeed.errors import InvalidArgument
from flightfeed.flight import FlightDescriptor
from flightfeed.plan import decode_expr
from flightfeed.spark.client import DEFAULT_TIMEOUT
from flightfeed.spark.filters import to_expr
from flightfeed.spark.source import (
    OPTION_NAMES,
    SOURCE_NAME,
    FlightfeedDataSource,
    FlightfeedPushdownReader,
    FlightfeedPushdownSource,
    FlightfeedReader,
    TableOptions,
    arrow_schema,
    check_option_names,
    conform,
    table_ref,
)

from .strategies import table_arguments

URI = "grpc://127.0.0.1:1"  # nothing listens: a test that reached the network would fail


def parsed(command: bytes) -> ParsedTableQuery:
    """The query as the coordinator reads the command."""
    return parse_table_query(FlightDescriptor(cmd=command))


def test_minimal_options_take_the_defaults() -> None:
    table = TableOptions.of({"uri": URI, "table": "scan"})
    assert table == TableOptions(URI, "scan", (), (), {}, DEFAULT_TIMEOUT)


def test_options_are_case_insensitive_and_parsed() -> None:
    table = TableOptions.of(
        {
            "URI": URI,
            "Table": "scan",
            "ARGS": '[2, "3,1", true, -1.5]',
            "columns": " task, ,value ,",
            "header.X-Tenant": "a",
            "Header.role": "r",
            "timeout": "2.5",
        }
    )
    assert table == TableOptions(
        URI, "scan", (2, "3,1", True, -1.5), ("task", "value"), {"x-tenant": "a", "role": "r"}, 2.5
    )


@pytest.mark.parametrize(("value", "shared"), [("true", True), ("FALSE", False), (" True ", True)])
def test_shared_memory_is_on_unless_switched_off(value: str, shared: bool) -> None:
    assert TableOptions.of({"uri": URI, "table": "scan"}).shared_memory
    table = TableOptions.of({"uri": URI, "table": "scan", "sharedMemory": value})
    assert table.shared_memory is shared


def test_location_names_the_coordinator_too() -> None:
    assert TableOptions.of({"location": URI, "table": "scan"}).uri == URI


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"table": "scan"}, "needs option 'uri'"),
        ({"uri": "", "table": "scan"}, "needs option 'uri'"),
        ({"uri": URI}, "needs option 'table'"),
        ({"uri": URI, "table": "scan", "args": "[1,"}, "'args' must be a JSON list"),
        ({"uri": URI, "table": "scan", "args": '{"a": 1}'}, "'args' must be a JSON list"),
        ({"uri": URI, "table": "scan", "args": "3"}, "'args' must be a JSON list"),
        ({"uri": URI, "table": "scan", "timeout": "soon"}, "'timeout' must be seconds"),
        ({"uri": URI, "table": "scan", "timeout": "0"}, "'timeout' must be seconds, more than 0"),
        ({"uri": URI, "table": "scan", "timeout": "-5"}, "'timeout' must be seconds, more than 0"),
        ({"uri": URI, "table": "scan", "timeout": "nan"}, "'timeout' must be seconds"),
        ({"uri": URI, "table": "scan", "timeout": "inf"}, "'timeout' must be seconds"),
        ({"uri": URI, "table": "scan", "sharedmemory": "yes"}, "'sharedMemory' is true or false"),
        ({"uri": "http://127.0.0.1:1", "table": "scan"}, "option 'uri': unsupported Flight"),
        ({"uri": "grpc://127.0.0.1", "table": "scan"}, "option 'uri': .* want grpc://host:port"),
        ({"uri": "grpc://127.0.0.1:99999", "table": "scan"}, "option 'uri': unsupported"),
        ({"uri": URI, "tabel": "scan"}, "no option 'tabel': did you mean 'table'"),
        ({"uri": URI, "table": "scan", "arg": "[1]"}, "no option 'arg': did you mean 'args'"),
        (
            {"uri": URI, "table": "scan", "maxUnitPerTrigger": "5"},
            "no option 'maxunitpertrigger': did you mean 'maxUnitsPerTrigger'",
        ),
        (
            {"uri": URI, "table": "scan", "tlsrootcert": "ca.pem"},
            "did you mean 'tlsRootCerts'",
        ),
        # (before: "Invalid metadata" from the first call, naming neither)
        ({"uri": URI, "table": "scan", "header.x-site": "café"}, "option 'header.x-site': .*ASCII"),
        ({"uri": URI, "table": "scan", "header.x site": "a"}, "option 'header.x site': .*a name"),
        ({"uri": URI, "table": "scan", "header.x-a": "1\n2"}, "option 'header.x-a': .*printable"),
        ({"uri": URI, "table": "scan", "header.grpc-timeout": "1S"}, "gRPC's own"),
        (  # (before: ignored, and the calls failed with "Socket closed")
            {"uri": URI, "table": "scan", "tlsRootCerts": "ca.pem"},
            "option 'tlsRootCerts' is for a grpc\\+tls:// server, and option 'uri' is",
        ),
    ],
)
def test_bad_options_say_which(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        TableOptions.of(options)


def test_a_bare_host_and_port_is_a_grpc_uri() -> None:
    assert TableOptions.of({"uri": "127.0.0.1:1", "table": "scan"}).uri == URI
    assert TableOptions.of({"uri": f" {URI} ", "table": "scan"}).uri == URI


@pytest.mark.parametrize("name", ["path", "paths", "checkpointLocation", "queryName", "header.x"])
def test_options_far_from_ours_are_left_alone(name: str) -> None:
    """Spark adds some (a load's `path`, a stream's `checkpointLocation`): only near misses of
    our own names are refused."""
    assert TableOptions.of({"uri": URI, "table": "scan", name: "x"}).table == "scan"


@pytest.mark.parametrize("name", OPTION_NAMES)
def test_every_option_of_ours_passes_the_name_check(name: str) -> None:
    check_option_names([name.lower()])  # (Spark hands them over in lower case)


@settings(max_examples=60, deadline=None)
@given(table_arguments, st.lists(st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]*", fullmatch=True)))
def test_options_reach_the_coordinator_unchanged(arguments: list[Any], columns: list[str]) -> None:
    """`args` as JSON and `columns` as text (names trimmed), through the command, to the
    coordinator's parse."""
    options = {"uri": URI, "table": "scan", "args": json.dumps(arguments)}
    if columns:
        options["columns"] = ",".join(columns)
    query = parsed(TableOptions.of(options).command())
    assert query == ParsedTableQuery("scan", tuple(arguments), tuple(columns))
    assert [type(a) for a in query.arguments] == [type(a) for a in arguments]


def test_an_argument_json_cannot_carry_fails_when_the_command_is_built() -> None:
    table = TableOptions.of({"uri": URI, "table": "scan", "args": "[null]"})
    with pytest.raises(
        InvalidArgument, match=r"argument 0 of scan\(\.\.\.\) must be an int, float"
    ):
        table.command()


SPARK_SCHEMA = StructType(
    [
        StructField("task", StringType(), nullable=False),
        StructField("value", LongType()),
        StructField("score", DoubleType()),
    ]
)


def test_arrow_schema_keeps_types_and_nullability() -> None:
    assert arrow_schema(SPARK_SCHEMA) == pa.schema(
        [
            pa.field("task", pa.string(), nullable=False),
            pa.field("value", pa.int64()),
            pa.field("score", pa.float64()),
        ]
    )


@pytest.mark.parametrize(
    ("source_class", "reader_class", "pushes"),
    [
        (FlightfeedDataSource, FlightfeedReader, False),
        (FlightfeedPushdownSource, FlightfeedPushdownReader, True),
    ],
)
def test_the_data_source_builds_its_reader_from_the_options(
    source_class: type[FlightfeedDataSource], reader_class: type[FlightfeedReader], pushes: bool
) -> None:
    source = source_class({"uri": URI, "table": "scan", "args": "[2]"})
    assert source_class.name() == SOURCE_NAME == "flightfeed"
    reader = source.reader(SPARK_SCHEMA)
    assert type(reader) is reader_class
    assert reader.table == TableOptions(URI, "scan", (2,))
    assert reader.filters == []
    # what pyspark checks, refusing a reader that pushes while pushdown is off:
    assert (getattr(reader.pushFilters, "__func__", None) is not DataSourceReader.pushFilters) == (
        pushes
    )
    with pytest.raises(InvalidArgument, match="needs option 'table'"):
        source_class({"uri": URI}).reader(SPARK_SCHEMA)


def test_the_reader_pushes_what_the_workers_can_run_and_keeps_it_through_pickling() -> None:
    """Spark calls pushFilters and partitions in different processes, pickling the reader."""
    reader = FlightfeedPushdownReader(TableOptions(URI, "scan", (2,), ("task",)), SPARK_SCHEMA)
    pushable = [
        GreaterThan(("value",), 3),
        StringStartsWith(("task",), "t"),
        IsNotNull(("score",)),
    ]
    unpushable = [
        Not(In(("value",), (1,))),
        EqualTo(("value",), 1.5),
        IsNotNull(("a", "b")),
        In(("score",), (1.5, None)),  # a double column: NaN and -0.0 differ (filters.py)
    ]
    kept = list(reader.pushFilters([unpushable[0], *pushable, *unpushable[1:]]))
    assert kept == unpushable
    schema = arrow_schema(SPARK_SCHEMA)
    query_exprs = (to_expr(f, schema, exact_types=False) for f in pushable)  # Spark's view
    expected = [e for e in query_exprs if e is not None]
    assert len(expected) == len(pushable)
    assert [decode_expr(f) for f in reader.filters] == expected

    again = pickle.loads(pickle.dumps(reader))
    assert again.filters == reader.filters
    query = parsed(again.table.command(again.filters))
    assert query == ParsedTableQuery("scan", (2,), ("task",), tuple(expected))


def test_pushing_again_replaces_the_filters() -> None:
    reader = FlightfeedPushdownReader(TableOptions(URI, "scan"), SPARK_SCHEMA)
    assert list(reader.pushFilters([GreaterThan(("value",), 3)])) == []
    assert list(reader.pushFilters([])) == []
    assert reader.filters == []


TARGET = pa.schema([pa.field("task", pa.string(), nullable=False), pa.field("value", pa.int64())])


def test_conform_returns_a_matching_batch_as_is() -> None:
    batch = pa.record_batch([pa.array(["a"]), pa.array([1])], schema=TARGET)
    assert conform(batch, TARGET) is batch


def test_conform_casts_types_and_declares_nullability() -> None:
    batch = pa.record_batch(
        {"task": pa.array(["a", "b"], pa.large_string()), "value": pa.array([1, None], pa.int32())}
    )
    out = conform(batch, TARGET)
    assert out.schema == TARGET
    assert out.schema.field("task").nullable is False
    assert out.to_pydict() == {"task": ["a", "b"], "value": [1, None]}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))))
def test_conform_keeps_every_value_it_widens(values: list[int | None]) -> None:
    batch = pa.record_batch({"task": ["t"] * len(values), "value": pa.array(values, pa.int32())})
    assert conform(batch, TARGET).column("value").to_pylist() == values


@pytest.mark.parametrize(
    "names", [["task"], ["value", "task"], ["task", "value", "extra"], ["task", "VALUE"]]
)
def test_conform_refuses_other_columns(names: list[str]) -> None:
    batch = pa.record_batch([pa.array(["1"]) for _ in names], names=names)
    with pytest.raises(InvalidArgument, match=r"the table's columns are now .* Spark expects"):
        conform(batch, TARGET)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(pa.array(["x"]), id="text-for-int"),
        pytest.param(pa.array([1.5]), id="lossy-float"),
        pytest.param(pa.array([2**63], pa.uint64()), id="out-of-range"),
    ],
)
def test_conform_refuses_values_spark_was_not_told_about(value: pa.Array) -> None:
    batch = pa.record_batch({"task": ["t"], "value": value})
    with pytest.raises(InvalidArgument, match="schema mismatch: the table's schema is now"):
        conform(batch, TARGET)


def test_conform_refuses_nulls_where_spark_declared_none() -> None:
    # pyarrow casts such a column into the non-nullable field without a word.
    batch = pa.record_batch({"task": pa.array(["a", None]), "value": pa.array([1, 2])})
    with pytest.raises(InvalidArgument, match="column 'task' holds 1 null"):
        conform(batch, TARGET)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("cpu", ("", "", "cpu")),
        ("a.b.cpu", ("a", "b", "cpu")),
        ('"a.b.cpu"', ("", "", "a.b.cpu")),  # (before: catalog a, schema b, table cpu)
        ('flightfeed.public."a.b"', ("flightfeed", "public", "a.b")),
    ],
)
def test_a_durable_tables_name_is_read_as_the_command_line_reads_it(
    text: str, parts: tuple[str, str, str]
) -> None:
    ref = table_ref(text)
    assert (ref.catalog, ref.schema, ref.table) == parts


@pytest.mark.parametrize(
    ("text", "message"),
    [("a.b", r"option 'table': a table is TABLE or CATALOG\.SCHEMA\.TABLE"), ('"a', "not closed")],
)
def test_a_durable_tables_bad_name_is_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        table_ref(text)
