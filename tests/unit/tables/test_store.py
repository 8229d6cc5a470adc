"""TableStore on a real DuckDB, in memory and on disk: tables created once, rows written
atomically (OVERWRITE keeps the last row of a key, APPEND every row), schema and option
changes, TTL, staged Spark attempts published exactly once, scans (time range, order,
projection, rowid slices) and everything back after a reopen."""

from __future__ import annotations

import itertools
import math
import re
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed.errors import AlreadyExists, Conflict, InvalidArgument, NotFound
from flightfeed.tables.options import TableOptions, UpdateMode
from flightfeed.tables.schema import Column, TableSchema
from flightfeed.tables.store import (
    DEFAULT_CATALOG,
    DEFAULT_SCHEMA,
    ScanSpec,
    SqlPredicate,
    TableName,
    TableStore,
    TableWriteError,
    WriteFailure,
)
from flightfeed.tables.types import of_arrow

ARROW = pa.schema(
    [
        ("ts", pa.timestamp("ms")),
        ("host", pa.string()),
        ("v", pa.int64()),
        ("x", pa.float64()),
    ]
)
SCHEMA = TableSchema.from_arrow(ARROW, timestamp="ts", tags=["host"])
"""Key (host, ts); v and x nullable."""
T = TableName.of("metrics")
U = TableName.of("other")
APPEND = TableOptions(update_mode="APPEND")
DAY = 86_400_000
YEAR_2000 = 946_684_800_000


@pytest.fixture
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TableStore]:
    """An in-memory store; on disk too for the tests marked ON_DISK_TOO."""
    where = getattr(request, "param", "memory")
    store = TableStore.open(None if where == "memory" else tmp_path / "db")
    try:
        yield store
    finally:
        store.close()


def data(
    ts: Sequence[int],
    host: Sequence[str | None],
    v: Sequence[int | None] | None = None,
    **more: pa.Array,
) -> pa.Table:
    columns: dict[str, Any] = {
        "ts": pa.array(ts, pa.timestamp("ms")),
        "host": pa.array(host, pa.string()),
    }
    if v is not None:
        columns["v"] = pa.array(v, pa.int64())
    columns.update(more)
    return pa.table(columns)


def as_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts with timestamps as integer milliseconds."""
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.int64())
        columns[name] = column
    rows: list[dict[str, Any]] = pa.table(columns).to_pylist()
    return rows


def scan(store: TableStore, name: TableName = T, **spec: Any) -> list[dict[str, Any]]:
    return as_rows(store.scan(name, ScanSpec(**spec)).read_all())


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((value is None, str(value)) for value in row.values())


def scan_sorted(store: TableStore, name: TableName = T, **spec: Any) -> list[dict[str, Any]]:
    return sorted(scan(store, name, **spec), key=key)


def row(ts: int, host: str, v: int | None = None, x: float | None = None) -> dict[str, Any]:
    return {"ts": ts, "host": host, "v": v, "x": x}


ON_DISK_TOO = pytest.mark.parametrize("tables", ["memory", "disk"], indirect=True)


def physical_count(store: TableStore, table: str) -> int:
    found = store.connection.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert found is not None
    return int(found[0])


# --- names and creation --------------------------------------------------------------------


def test_table_names_default_their_catalog_and_schema() -> None:
    assert TableName.of("t") == TableName("t", DEFAULT_CATALOG, DEFAULT_SCHEMA)
    assert TableName.of("t", "c", "s") == TableName("t", "c", "s")
    assert str(TableName.of("t", "c", "s")) == "c.s.t"
    for bad in (
        ("",),
        ("a\x00",),
        ("t", "x" * 256),
        ("t", "c", "s\x00"),
        ("junk\nflightfeed.public.cpu",),  # printed as two names by `tables list`
        ("t\x1b[2J",),
    ):
        with pytest.raises(InvalidArgument, match="bad table name part"):
            TableName.of(*bad)


def test_create_publishes_a_table_at_version_1(tables: TableStore) -> None:
    later = TableSchema(SCHEMA.columns, SCHEMA.timestamp, SCHEMA.primary_key, version=5)
    entry = tables.create(T, later, partition_info=b"\x01\x02")
    assert entry.schema == SCHEMA  # version reset to 1
    assert entry.options == TableOptions()
    assert entry.partition_info == b"\x01\x02"
    assert tables.entry(T) == entry
    other = tables.create(U, SCHEMA, APPEND)
    assert other.id != entry.id
    assert [e.name for e in tables.tables()] == sorted([T, U])
    assert scan(tables) == []
    assert tables.row_count(T) == 0
    assert tables.max_rowid(T) == -1


def test_a_second_create_of_a_name_is_refused(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    tables.write([(T, data([1], ["a"], [1]))])
    with pytest.raises(AlreadyExists, match=r"table flightfeed\.public\.metrics exists already"):
        tables.create(T, SCHEMA)
    other = TableSchema.from_arrow(pa.schema([("ts", pa.timestamp("ms"))]), timestamp="ts")
    with pytest.raises(AlreadyExists):
        tables.create(T, other, if_not_exists=True)  # a different schema is no match
    assert tables.create(T, SCHEMA, if_not_exists=True) == tables.entry(T)
    assert scan(tables) == [row(1, "a", 1)]  # nothing replaced
    # the same table name in another schema is another table
    tables.create(TableName.of("metrics", schema="elsewhere"), SCHEMA)
    assert len(tables.tables()) == 2


def test_a_missing_table_is_not_found(tables: TableStore) -> None:
    for action in (
        lambda: tables.entry(T),
        lambda: tables.scan(T, ScanSpec()),
        lambda: tables.drop(T),
        lambda: tables.alter_options(T, {"ttl": "1d"}),
        lambda: tables.alter_schema(T, SCHEMA, 1),
        lambda: tables.stage(T, "job", 0, 0, data([1], ["a"])),
        lambda: tables.commit_staged(T, "job", [(0, 0)]),
        lambda: tables.abort_staged(T, "job"),
        lambda: tables.row_count(T),
    ):
        with pytest.raises(NotFound, match=r"no table 'flightfeed\.public\.metrics'"):
            action()


def test_drop_removes_the_table_and_its_name_can_be_reused(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    tables.create(U, SCHEMA)
    tables.write([(T, data([1], ["a"], [1])), (U, data([2], ["b"], [2]))])
    tables.drop(T)
    with pytest.raises(NotFound):
        tables.entry(T)
    assert [e.name for e in tables.tables()] == [U]
    tables.create(T, SCHEMA, APPEND)
    assert scan(tables) == []
    assert scan(tables, U) == [row(2, "b", 2)]


# --- writes ------------------------------------------------------------------------------


@ON_DISK_TOO
def test_written_rows_are_scanned_back(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    written = tables.write(
        [(T, data([3, 1, 2], ["a", "b", "c"], [None, 5, 6], x=pa.array([0.5, None, -1.0])))]
    )
    assert written == 3
    assert scan_sorted(tables) == [
        row(1, "b", 5),
        row(2, "c", 6, -1.0),
        row(3, "a", None, 0.5),
    ]
    assert tables.row_count(T) == 3


def test_a_write_conforms_the_rows_to_the_table(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    incoming = pa.table(
        {
            "x": pa.array([1.5], pa.float32()),  # widened
            "host": pa.array(["h"], pa.large_string()),
            "ts": pa.array([1_000_000], pa.timestamp("us")),  # exactly 1000 ms
            # v missing: null
        }
    )
    tables.write([(T, incoming)])
    assert scan(tables) == [row(1000, "h", None, 1.5)]


@pytest.mark.parametrize(
    ("incoming", "message"),
    [
        (data([1], ["a"], nope=pa.array([1])), r"no column\(s\) \['nope'\]"),
        (pa.table({"host": ["a"]}), "lack non-null column 'ts'"),
        (data([1], [None]), "'host' is not nullable"),
        (data([1], ["a"], v=None, x=pa.array(["abc"])), "column 'x' is DOUBLE"),
        (pa.table({"ts": pa.array([1_500], pa.timestamp("us")), "host": ["a"]}), "'ts'"),
        (data([1], ["a"], x=pa.array([2**62], pa.int64())), "'x'"),
        (data([1], ["a"], x=pa.array(["1.5"])), "column 'x' is DOUBLE: it does not take string"),
        (data([1], ["a"], x=pa.array([True])), "column 'x' is DOUBLE: it does not take bool"),
    ],
)
def test_bad_rows_are_refused(tables: TableStore, incoming: pa.Table, message: str) -> None:
    tables.create(T, SCHEMA)
    with pytest.raises(TableWriteError, match=message) as info:
        tables.write([(T, incoming)])
    assert "nothing was written: table flightfeed.public.metrics failed" in str(info.value)
    assert info.value.failure == WriteFailure(0, str(T))
    assert isinstance(info.value.cause, InvalidArgument)
    assert scan(tables) == []


def test_overwrite_keeps_the_last_row_of_a_key_within_a_request(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    tables.write([(T, data([1, 1, 2, 1, 2], ["a", "a", "a", "a", "b"], [1, 2, 3, 4, 5]))])
    assert scan_sorted(tables) == [row(1, "a", 4), row(2, "a", 3), row(2, "b", 5)]


@ON_DISK_TOO
def test_overwrite_keeps_the_last_row_of_a_key_across_requests(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    tables.write([(T, data([1, 2], ["a", "a"], [1, 2])), (T, data([1], ["a"], [10]))])
    assert scan_sorted(tables) == [row(1, "a", 10), row(2, "a", 2)]
    tables.write([(T, data([2, 3], ["a", "a"], [20, 30]))])
    tables.write([(T, data([2], ["a"], [None]))])  # a null replaces a value
    assert scan_sorted(tables) == [row(1, "a", 10), row(2, "a", None), row(3, "a", 30)]


def test_overwrite_keeps_the_last_row_over_many_batches(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    n = 20_000
    table = data([i % 7 for i in range(n)], ["h"] * n, list(range(n)))
    tables.write([(T, pa.Table.from_batches(table.to_batches(max_chunksize=1000)))])
    last = {i % 7: i for i in range(n)}
    assert scan_sorted(tables) == [row(t, "h", last[t]) for t in range(7)]


@pytest.mark.parametrize("mode", ["APPEND", "OVERWRITE"])
def test_a_written_double_keeps_its_sign_bits(tables: TableStore, mode: UpdateMode) -> None:
    """-0.0 and -NaN come back with their sign (DataFusion orders a NaN by it). OVERWRITE lost
    it: its last-row-of-a-key window over every column made DuckDB drop the sign when a string
    column rode along (here `host`), in a request's own rows and in staged commits alike."""
    tables.create(T, SCHEMA, TableOptions(update_mode=mode))
    negative_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]
    x = pa.array([-0.0, negative_nan, 0.0, 1.5], pa.float64())
    rows = data([1, 2, 3, 4], ["a", "b", "c", "d"], x=x)
    tables.write([(T, rows)])
    tables.stage(T, "job", 0, 0, data([5, 6], ["e", "f"], x=x.slice(0, 2)))
    tables.commit_staged(T, "job", [(0, 0)])
    stored = tables.scan(T, ScanSpec(order="asc")).read_all().column("x")
    signs = [math.copysign(1.0, value) for value in stored.to_pylist()]
    assert signs == [-1.0, -1.0, 1.0, 1.0, -1.0, -1.0]


def test_append_keeps_every_row(tables: TableStore) -> None:
    tables.create(T, SCHEMA, APPEND)
    tables.write([(T, data([1, 1], ["a", "a"], [1, 2])), (T, data([1], ["a"], [3]))])
    assert tables.write([(T, data([1], ["a"], [3]))]) == 1
    assert scan_sorted(tables) == [row(1, "a", v) for v in (1, 2, 3, 3)]


@st.composite
def write_batches(draw: st.DrawFn) -> list[list[tuple[int, str, int]]]:
    one = st.tuples(st.integers(0, 4), st.sampled_from(["a", "b"]), st.integers(-50, 50))
    return draw(st.lists(st.lists(one, max_size=8), min_size=1, max_size=4))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=write_batches(), append=st.booleans())
def test_writes_match_a_model_of_the_update_mode(
    batches: list[list[tuple[int, str, int]]], append: bool
) -> None:
    store = TableStore.open(None)
    try:
        store.create(T, SCHEMA, APPEND if append else None)
        model_rows: list[dict[str, Any]] = []
        model_keys: dict[tuple[str, int], int] = {}
        for batch in batches:
            store.write(
                [(T, data([r[0] for r in batch], [r[1] for r in batch], [r[2] for r in batch]))]
            )
            for ts, host, v in batch:
                model_rows.append(row(ts, host, v))
                model_keys[(host, ts)] = v
        if not append:
            model_rows = [row(ts, host, v) for (host, ts), v in model_keys.items()]
        assert scan_sorted(store) == sorted(model_rows, key=key)
    finally:
        store.close()


# --- WriteBatch atomicity -------------------------------------------------------------------


def missing_table() -> tuple[TableName, pa.Table, type[Exception], str]:
    return TableName.of("missing"), data([9], ["z"], [9]), NotFound, "no table"


def null_in_key() -> tuple[TableName, pa.Table, type[Exception], str]:
    return U, data([9, 10], ["z", None], [9, 10]), InvalidArgument, "'host' is not nullable"


def uncastable() -> tuple[TableName, pa.Table, type[Exception], str]:
    bad = pa.table({"ts": pa.array([9], pa.timestamp("ms")), "host": ["z"], "v": ["nine"]})
    return U, bad, InvalidArgument, "'v' is INT64"


def unknown_column() -> tuple[TableName, pa.Table, type[Exception], str]:
    return U, data([9], ["z"], [9], w=pa.array([1])), InvalidArgument, r"\['w'\]"


@ON_DISK_TOO
@pytest.mark.parametrize("failing", [missing_table, null_in_key, uncastable, unknown_column])
@pytest.mark.parametrize("append", [False, True])
def test_a_write_batch_whose_second_request_fails_writes_nothing(
    tables: TableStore, failing: Any, append: bool
) -> None:
    options = APPEND if append else None
    tables.create(T, SCHEMA, options)
    tables.create(U, SCHEMA, options)
    tables.write([(T, data([1], ["a"], [1])), (U, data([1], ["u"], [1]))])
    before = (scan_sorted(tables), scan_sorted(tables, U))
    name, bad, cause, message = failing()
    requests = [
        (T, data([1, 2], ["a", "a"], [100, 200])),  # fine on its own
        (name, bad),
        (T, data([3], ["a"], [300])),
    ]
    with pytest.raises(TableWriteError) as info:
        tables.write(requests)
    error = info.value
    assert error.failure == WriteFailure(1, str(name))
    assert isinstance(error.cause, cause)
    assert isinstance(error, InvalidArgument)
    assert error.status == error.cause.status
    text = str(error)
    assert text.startswith("the WriteBatch wrote nothing: request 1 (table ")
    assert str(name) in text
    assert re.search(message, text), text
    assert (scan_sorted(tables), scan_sorted(tables, U)) == before
    # the store still writes after the rollback
    tables.write([(T, data([5], ["a"], [5]))])
    assert row(5, "a", 5) in scan(tables)


# --- schema changes ------------------------------------------------------------------------


@ON_DISK_TOO
def test_alter_schema_adds_columns_old_rows_read_null(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    tables.write([(T, data([1, 2], ["a", "b"], [1, 2]))])
    wanted = SCHEMA.with_added(
        [Column("w", of_arrow(pa.string())), Column("n", of_arrow(pa.int32()))]
    )
    entry = tables.alter_schema(T, wanted, pre_schema_version=1)
    assert entry.schema.version == 2
    assert entry.schema.names == ["ts", "host", "v", "x", "w", "n"]
    assert [c.id for c in entry.schema.columns] == [1, 2, 3, 4, 5, 6]
    assert tables.entry(T) == entry
    tables.write([(T, data([3], ["c"], [3], w=pa.array(["new"]), n=pa.array([7], pa.int32())))])
    assert scan_sorted(tables) == [
        {**row(1, "a", 1), "w": None, "n": None},
        {**row(2, "b", 2), "w": None, "n": None},
        {**row(3, "c", 3), "w": "new", "n": 7},
    ]
    # an overwrite of an old row through the new columns
    tables.write([(T, data([1], ["a"], [10], w=pa.array(["x"])))])
    assert {**row(1, "a", 10), "w": "x", "n": None} in scan(tables)


def test_alter_schema_without_new_columns_changes_nothing(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA)
    assert tables.alter_schema(T, SCHEMA, 1) == entry
    assert tables.entry(T).schema.version == 1


def test_alter_schema_against_a_stale_version_is_a_conflict(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    first = SCHEMA.with_added([Column("w", of_arrow(pa.string()))])
    tables.alter_schema(T, first, 1)
    second = first.with_added([Column("z", of_arrow(pa.string()))])
    with pytest.raises(Conflict, match=r"schema version 2.*version 1"):
        tables.alter_schema(T, second, 1)
    with pytest.raises(Conflict):
        tables.alter_schema(T, second, 3)
    assert tables.entry(T).schema == first
    assert tables.alter_schema(T, second, 2).schema.names[-1] == "z"


def changed(**change: Any) -> TableSchema:
    """SCHEMA with its column v changed, plus a new column."""
    columns = tuple(
        Column(**{**c.__dict__, **change}) if c.name == "v" else c for c in SCHEMA.columns
    )
    return TableSchema((*columns, Column("w", of_arrow(pa.string()), id=9)), "ts", ("host", "ts"))


@pytest.mark.parametrize(
    "wanted",
    [
        changed(type=of_arrow(pa.int32())),
        changed(nullable=False),
        changed(is_tag=True),
        changed(name="v2"),
        changed(id=42),
        TableSchema(SCHEMA.columns[:3], "ts", ("host", "ts")),  # a column dropped
        TableSchema(SCHEMA.columns, "ts", ("ts",)),  # host leaves the key
        TableSchema(
            (*SCHEMA.columns, Column("w", of_arrow(pa.string()), id=9)), "ts", ("ts", "host")
        ),
        TableSchema(
            (SCHEMA.columns[1], SCHEMA.columns[0], *SCHEMA.columns[2:]), "ts", ("host", "ts")
        ),
    ],
    ids=["type", "nullable", "tag", "rename", "id", "drop", "key", "key-order", "reorder"],
)
def test_alter_schema_refuses_to_change_existing_columns(
    tables: TableStore, wanted: TableSchema
) -> None:
    entry = tables.create(T, SCHEMA)
    tables.write([(T, data([1], ["a"], [1]))])
    with pytest.raises(InvalidArgument, match=r"AlterTableSchema (can only add|cannot change)"):
        tables.alter_schema(T, wanted, 1)
    assert tables.entry(T) == entry
    assert scan(tables) == [row(1, "a", 1)]


def test_alter_schema_refuses_a_non_nullable_new_column(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    wanted = TableSchema(
        (*SCHEMA.columns, Column("w", of_arrow(pa.string()), nullable=False, id=5)),
        "ts",
        ("host", "ts"),
    )
    with pytest.raises(InvalidArgument, match="must be nullable"):
        tables.alter_schema(T, wanted, 1)
    assert tables.entry(T).schema == SCHEMA


# --- options and TTL ------------------------------------------------------------------------


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@ON_DISK_TOO
def test_a_ttl_hides_then_purges_expired_rows(tables: TableStore) -> None:
    tables.create(T, SCHEMA)
    recent = now_ms() - 3_600_000  # an hour ago: well within a day
    tables.write([(T, data([YEAR_2000, YEAR_2000 + 1, recent], ["a", "b", "c"], [1, 2, 3]))])
    entry = tables.alter_options(T, {"ttl": "1d"})
    assert entry.options == TableOptions(ttl_ms=DAY)
    assert tables.entry(T).options.ttl_ms == DAY
    assert scan(tables) == [row(recent, "c", 3)]
    assert tables.row_count(T) == 1
    assert physical_count(tables, entry.physical) == 1  # purged, not just hidden
    # turning the TTL off again does not bring them back
    assert tables.alter_options(T, {"enable_ttl": "false"}).options.ttl_ms is None
    assert scan(tables) == [row(recent, "c", 3)]


def test_purge_expired_deletes_what_a_ttl_hides(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA, TableOptions(ttl_ms=DAY))
    tables.create(U, SCHEMA)  # no TTL: keeps its old rows
    recent = now_ms() - 60_000
    old = [YEAR_2000 + i for i in range(5)]
    tables.write([(T, data([*old, recent], ["a"] * 6, [0] * 6)), (U, data(old, ["a"] * 5))])
    assert scan(tables) == [row(recent, "a", 0)]  # hidden before any purge
    assert physical_count(tables, entry.physical) == 6
    assert tables.purge_expired() == 5
    assert physical_count(tables, entry.physical) == 1
    assert tables.purge_expired() == 0
    assert len(scan(tables, U)) == 5


@pytest.mark.parametrize("ms", [9_223_372_036_854_776, -9_223_372_022_400_001, 2**62])
def test_a_timestamp_duckdb_cannot_compare_is_refused_on_write(tables: TableStore, ms: int) -> None:
    """Taken, it failed every later read of the table and every TTL purge (the worker's purge
    loop then ended the worker, at every restart)."""
    tables.create(T, SCHEMA, TableOptions(ttl_ms=DAY))
    with pytest.raises(InvalidArgument, match=f"column 'ts' holds {ms} ms since the epoch"):
        tables.write([(T, data([YEAR_2000, ms], ["a", "b"]))])
    last = 9_223_372_036_854_775  # the last millisecond DuckDB holds: taken, and read
    tables.write([(T, data([last], ["c"]))])
    assert [r["ts"] for r in scan(tables, time_range=(-(2**63), 2**63 - 1))] == [last]
    assert tables.purge_expired() == 0


def test_a_failing_purge_leaves_the_other_tables_purged(tables: TableStore) -> None:
    """One table's DuckDB error ended the whole purge (and, uncaught, the worker)."""
    broken = tables.create(T, SCHEMA, TableOptions(ttl_ms=DAY))
    tables.create(U, SCHEMA, TableOptions(ttl_ms=DAY))
    tables.write([(U, data([YEAR_2000], ["a"]))])
    tables.connection.execute(f"DROP TABLE {broken.physical}")  # as a store gone wrong would
    assert tables.purge_expired() == 1
    assert scan(tables, U) == []


def test_alter_options_refuses_a_new_update_mode_and_unknown_options(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA)
    with pytest.raises(InvalidArgument, match="cannot change"):
        tables.alter_options(T, {"update_mode": "APPEND"})
    with pytest.raises(InvalidArgument, match="unknown table option"):
        tables.alter_options(T, {"compression": "zstd"})
    assert tables.entry(T) == entry


# --- staging -------------------------------------------------------------------------------


def stage_attempts(tables: TableStore, job: str = "job-1") -> None:
    """Partition 0 tried twice (attempts 0 and 1, different rows), partition 1 once."""
    assert tables.stage(T, job, 0, 0, data([1, 2], ["p0", "p0"], [0, 0])) == 2
    assert tables.stage(T, job, 0, 1, data([1, 2], ["p0", "p0"], [1, 1])) == 2
    assert tables.stage(T, job, 1, 0, data([5], ["p1"], [10])) == 1


@ON_DISK_TOO
@pytest.mark.parametrize("append", [False, True])
def test_a_commit_publishes_exactly_the_committed_attempts_once(
    tables: TableStore, append: bool
) -> None:
    entry = tables.create(T, SCHEMA, APPEND if append else None)
    stage_attempts(tables)
    assert scan(tables) == []  # staged rows are not the table's
    assert tables.commit_staged(T, "job-1", [(0, 1), (1, 0)]) == 3
    assert scan_sorted(tables) == [row(1, "p0", 1), row(2, "p0", 1), row(5, "p1", 10)]
    assert physical_count(tables, entry.staging) == 0
    assert tables.abort_staged(T, "job-1") == 0


@pytest.mark.parametrize("append", [False, True])
def test_a_commit_retried_publishes_nothing_more(tables: TableStore, append: bool) -> None:
    entry = tables.create(T, SCHEMA, APPEND if append else None)
    stage_attempts(tables)
    assert tables.commit_staged(T, "job-1", [(0, 1), (1, 0)]) == 3
    # a retried commit (even of other attempts, even after more staging) answers the first
    # commit's count and publishes nothing
    tables.stage(T, "job-1", 2, 0, data([9], ["p2"], [9]))
    assert tables.commit_staged(T, "job-1", [(0, 1), (1, 0)]) == 3
    assert tables.commit_staged(T, "job-1", [(2, 0)], overwrite=True) == 3
    assert scan_sorted(tables) == [row(1, "p0", 1), row(2, "p0", 1), row(5, "p1", 10)]
    assert physical_count(tables, entry.staging) == 0  # what came after the commit is gone


def test_the_staging_of_an_abandoned_job_is_discarded(tables: TableStore) -> None:
    """A job whose driver died stages rows nobody commits or aborts: the purge drops them
    once the job is older than the staging TTL, and keeps it until then."""
    entry = tables.create(T, SCHEMA, APPEND)
    stage_attempts(tables, "old")
    assert tables.purge_expired() == 0  # a day has not passed
    assert physical_count(tables, entry.staging) == 5
    stage_attempts(tables, "another")
    assert tables.purge_expired(staging_ttl_ms=-1) == 10  # both older than "now + 1 ms"
    assert physical_count(tables, entry.staging) == 0
    assert tables.commit_staged(T, "old", [(0, 0)]) == 0


def test_a_commit_names_one_attempt_per_partition(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA, APPEND)
    stage_attempts(tables)
    with pytest.raises(InvalidArgument, match="one attempt per partition"):
        tables.commit_staged(T, "job-1", [(0, 0), (0, 1)])
    assert scan(tables) == []
    assert physical_count(tables, entry.staging) == 5  # still there to commit properly
    assert tables.commit_staged(T, "job-1", [(0, 0)]) == 2


def test_a_commit_of_one_partition_only(tables: TableStore) -> None:
    tables.create(T, SCHEMA, APPEND)
    stage_attempts(tables)
    tables.commit_staged(T, "job-1", [(0, 0)])
    assert scan_sorted(tables) == [row(1, "p0", 0), row(2, "p0", 0)]


def test_abort_publishes_nothing_and_empties_the_staging(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA)
    tables.write([(T, data([9], ["keep"], [9]))])
    stage_attempts(tables)
    assert tables.abort_staged(T, "job-1") == 5
    assert physical_count(tables, entry.staging) == 0
    assert scan(tables) == [row(9, "keep", 9)]
    assert tables.commit_staged(T, "job-1", [(0, 0), (1, 0)]) == 0
    assert scan(tables) == [row(9, "keep", 9)]


def test_jobs_stage_apart(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA, APPEND)
    stage_attempts(tables, "a")
    tables.stage(T, "b", 0, 0, data([7], ["b"], [7]))
    tables.commit_staged(T, "b", [(0, 0)])
    assert scan(tables) == [row(7, "b", 7)]
    assert physical_count(tables, entry.staging) == 5  # job a's attempts are still there
    tables.abort_staged(T, "a")
    assert physical_count(tables, entry.staging) == 0
    assert scan(tables) == [row(7, "b", 7)]


@ON_DISK_TOO
@pytest.mark.parametrize("append", [False, True])
def test_an_overwrite_commit_replaces_the_tables_rows(tables: TableStore, append: bool) -> None:
    tables.create(T, SCHEMA, APPEND if append else None)
    tables.write([(T, data([1, 2, 3], ["p0", "old", "old"], [100, 100, 100]))])
    stage_attempts(tables)
    assert tables.commit_staged(T, "job-1", [(0, 0), (1, 0)], overwrite=True) == 3
    assert scan_sorted(tables) == [row(1, "p0", 0), row(2, "p0", 0), row(5, "p1", 10)]


def test_staged_rows_are_checked_like_written_rows(tables: TableStore) -> None:
    entry = tables.create(T, SCHEMA)
    with pytest.raises(InvalidArgument, match="'host' is not nullable"):
        tables.stage(T, "j", 0, 0, data([1], [None]))
    assert physical_count(tables, entry.staging) == 0


def test_staging_follows_schema_changes(tables: TableStore) -> None:
    tables.create(T, SCHEMA, APPEND)
    tables.stage(T, "j", 0, 0, data([1], ["a"], [1]))
    tables.alter_schema(T, SCHEMA.with_added([Column("w", of_arrow(pa.string()))]), 1)
    tables.stage(T, "j", 1, 0, data([2], ["b"], [2], w=pa.array(["w"])))
    tables.commit_staged(T, "j", [(0, 0), (1, 0)])
    assert scan_sorted(tables) == [
        {**row(1, "a", 1), "w": None},
        {**row(2, "b", 2), "w": "w"},
    ]


# --- durability ----------------------------------------------------------------------------


def test_everything_committed_is_back_after_a_reopen(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path)
    try:
        store.create(T, SCHEMA, partition_info=b"\x08\x01")
        store.create(U, SCHEMA, TableOptions(ttl_ms=3650 * DAY, update_mode="APPEND"))
        store.create(TableName.of("gone"), SCHEMA)
        store.drop(TableName.of("gone"))
        wanted = SCHEMA.with_added([Column("w", of_arrow(pa.string()), comment="later")])
        store.alter_schema(T, wanted, 1)
        recent = now_ms()
        store.write([(T, data([1, 2], ["a", "b"], [1, 2])), (U, data([recent] * 2, ["u"] * 2))])
        store.write([(T, data([1], ["a"], [10], w=pa.array(["w"])))])
        store.stage(T, "job", 0, 0, data([3], ["c"], [3]))
        store.stage(T, "job", 0, 1, data([4], ["d"], [4]))
        store.commit_staged(T, "job", [(0, 1)])
        store.stage(T, "pending", 0, 0, data([5], ["e"], [5]))  # never committed
        entries = store.tables()
        rows_t, rows_u = scan_sorted(store), scan_sorted(store, U)
    finally:
        store.close()

    reopened = TableStore.open(tmp_path)
    try:
        assert reopened.tables() == entries
        entry = reopened.entry(T)
        assert entry.schema.version == 2
        assert entry.schema.column("w").comment == "later"
        assert entry.partition_info == b"\x08\x01"
        assert reopened.entry(U).options == TableOptions(ttl_ms=3650 * DAY, update_mode="APPEND")
        assert scan_sorted(reopened) == rows_t
        assert rows_t == [
            {**row(1, "a", 10), "w": "w"},
            {**row(2, "b", 2), "w": None},
            {**row(4, "d", 4), "w": None},
        ]
        assert scan_sorted(reopened, U) == rows_u
        assert len(rows_u) == 2
        # the table keeps its update mode and key after the reopen
        reopened.write([(T, data([2], ["b"], [20]))])
        assert {**row(2, "b", 20), "w": None} in scan(reopened)
        assert len(scan(reopened)) == 3
        # the staged attempt survived, and can still be committed
        assert reopened.commit_staged(T, "pending", [(0, 0)]) == 1
        # a new table does not take a live table's id
        created = reopened.create(TableName.of("new"), SCHEMA)
        assert created.id not in {e.id for e in entries}
    finally:
        reopened.close()


def test_a_reopen_discards_abandoned_put_staging_only(tmp_path: Path) -> None:
    store = TableStore.open(tmp_path)
    try:
        entry = store.create(T, SCHEMA, APPEND)
        store.stage(T, "put-1234", 0, 0, data([1], ["put"], [1]))  # a DoPut that never ended
        store.stage(T, "spark-job", 0, 0, data([2], ["spark"], [2]))
        store.stage(T, "output-put-", 0, 0, data([3], ["other"], [3]))
    finally:
        store.close()
    reopened = TableStore.open(tmp_path)
    try:
        assert physical_count(reopened, entry.staging) == 2
        assert reopened.commit_staged(T, "put-1234", [(0, 0)]) == 0
        assert reopened.commit_staged(T, "spark-job", [(0, 0)]) == 1
        assert reopened.commit_staged(T, "output-put-", [(0, 0)]) == 1
        assert scan_sorted(reopened) == [row(2, "spark", 2), row(3, "other", 3)]
    finally:
        reopened.close()


# --- scans ---------------------------------------------------------------------------------


@pytest.fixture
def filled(tables: TableStore) -> TableStore:
    """Timestamps 0, 10, ..., 190 for hosts a and b (40 rows); v = ts // 10."""
    tables.create(T, SCHEMA)
    ts = [t * 10 for t in range(20)]
    tables.write(
        [
            (T, data(ts, ["a"] * 20, [t // 10 for t in ts])),
            (T, data(ts[::-1], ["b"] * 20, [t // 10 for t in ts[::-1]])),
        ]
    )
    return tables


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (50, 100, [50, 60, 70, 80, 90]),
        (50, 51, [50]),
        (49, 50, []),
        (50, 50, []),
        (-1000, 0, []),
        (-1000, 1, [0]),
        (185, 10_000, [190]),
        (190, 191, [190]),
        (-(2**63), 2**63 - 1, list(range(0, 200, 10))),  # HoraeDB's min_to_max: any time
        (0, 2**63 - 1, list(range(0, 200, 10))),
        (-(2**63), 50, [0, 10, 20, 30, 40]),
        (-(2**62), 2**62, list(range(0, 200, 10))),  # a Flight read's open bounds
        (2**62, 2**63 - 1, []),
        (-(2**63), -(2**62), []),
    ],
)
def test_a_time_range_is_start_inclusive_end_exclusive(
    filled: TableStore, start: int, end: int, expected: list[int]
) -> None:
    got = scan(filled, time_range=(start, end), columns=("ts", "host"))
    assert sorted(r["ts"] for r in got if r["host"] == "a") == expected
    assert sorted(r["ts"] for r in got if r["host"] == "b") == expected


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_order_sorts_by_timestamp(filled: TableStore, order: str) -> None:
    got = [r["ts"] for r in scan(filled, order=order, columns=("ts",), batch_size=7)]
    assert got == sorted(got, reverse=order == "desc")
    assert len(got) == 40
    ranged = [r["ts"] for r in scan(filled, order=order, time_range=(30, 80))]
    assert ranged == sorted([30, 40, 50, 60, 70] * 2, reverse=order == "desc")


def test_columns_are_projected_in_the_order_asked(filled: TableStore) -> None:
    reader = filled.scan(T, ScanSpec(columns=("v", "ts")))
    assert reader.schema.names == ["v", "ts"]
    assert reader.schema.field("ts").type == pa.timestamp("ms")
    table = reader.read_all()
    assert table.num_rows == 40
    assert table.column_names == ["v", "ts"]
    all_columns = filled.scan(T, ScanSpec()).read_all()
    assert all_columns.column_names == ["ts", "host", "v", "x"]
    with pytest.raises(InvalidArgument, match="no column 'nope'"):
        filled.scan(T, ScanSpec(columns=("ts", "nope")))


def test_where_predicates_bind_their_parameters(filled: TableStore) -> None:
    where = (SqlPredicate('"v" >= ?', (15,)), SqlPredicate('"host" = ?', ("b",)))
    got = scan_sorted(filled, where=where, columns=("host", "v"))
    assert got == [{"host": "b", "v": v} for v in range(15, 20)]


def test_batch_size_bounds_the_scanned_batches(filled: TableStore) -> None:
    batches = list(filled.scan(T, ScanSpec(batch_size=3)))
    assert sum(b.num_rows for b in batches) == 40
    assert all(b.num_rows <= 3 for b in batches)


@ON_DISK_TOO
@pytest.mark.parametrize("slices", [1, 2, 3, 7, 64])
def test_rowid_slices_cover_every_row_exactly_once(filled: TableStore, slices: int) -> None:
    # upserts and deletes leave gaps in the rowids
    filled.write([(T, data([0, 10, 20], ["a", "a", "b"], [100, 101, 102]))])
    filled.alter_options(T, {})
    everything = scan_sorted(filled)
    top = filled.max_rowid(T)
    assert top >= len(everything) - 1
    bounds = [(top + 1) * i // slices for i in range(slices + 1)]
    parts: list[dict[str, Any]] = []
    for lo, hi in itertools.pairwise(bounds):
        parts.extend(scan(filled, rowid_range=(lo, hi)))
    assert sorted(parts, key=key) == everything
    assert len(everything) == 40
    assert scan(filled, rowid_range=(top + 1, top + 100)) == []


def test_an_empty_projection_counts_rows(filled: TableStore) -> None:
    table = filled.scan(T, ScanSpec(columns=())).read_all()
    assert table.num_rows == 40
    assert filled.row_count(T) == 40


def test_a_scan_in_progress_sees_its_snapshot_while_a_write_commits(filled: TableStore) -> None:
    reader = filled.scan(T, ScanSpec(batch_size=5))
    first = reader.read_next_batch()
    filled.write([(T, data([1000], ["c"], [1]))])  # does not wait for the reader
    rest = reader.read_all()
    assert first.num_rows + rest.num_rows == 40
    assert len(scan(filled)) == 41


@pytest.mark.parametrize("name", ["rowid", "ROWID", "__ff_job", "__FF_JOB", "__ff_order", "__ff_x"])
def test_the_store_s_own_column_names_are_refused(tables: TableStore, name: str) -> None:
    """A column named rowid hid DuckDB's row id: reads split by row id lost rows (all of them
    after an alter). __ff_job failed as INTERNAL with DuckDB's text; __ff_order was taken and
    every write to the table then failed."""
    arrow = ARROW.append(pa.field(name, pa.int64()))
    with pytest.raises(InvalidArgument, match=f"column name '{name}' is reserved"):
        tables.create(T, TableSchema.from_arrow(arrow, timestamp="ts", tags=["host"]))
    entry = tables.create(T, SCHEMA)
    wanted = TableSchema.from_arrow(arrow, timestamp="ts", tags=["host"])
    with pytest.raises(InvalidArgument, match=f"column name '{name}' is reserved"):
        tables.alter_schema(T, wanted, entry.schema.version)
    assert tables.entry(T).schema == entry.schema


def test_a_write_whose_table_was_dropped_and_created_again_publishes_nothing(
    tables: TableStore,
) -> None:
    """A DoPut staged into the old table, the table was dropped and created again, the put's
    last chunk went to the new one and its commit published that chunk alone, acknowledged."""
    first = tables.create(T, SCHEMA)
    job = "put-1"
    tables.stage(T, job, 0, 0, data([1, 2], ["a", "b"]), table_id=first.id)
    tables.drop(T)
    tables.create(T, SCHEMA)
    with pytest.raises(Conflict, match="dropped and created again while rows were written"):
        tables.stage(T, job, 0, 0, data([3], ["c"]), table_id=first.id)
    with pytest.raises(Conflict, match="nothing of this write was published"):
        tables.commit_staged(T, job, [(0, 0)], table_id=first.id)
    assert scan(tables) == []


def test_a_scan_of_a_table_dropped_since_it_was_found_is_not_found(tables: TableStore) -> None:
    """A drop can land between a scan finding its table and DuckDB running the scan: the scan
    said INTERNAL, "the table store failed: Catalog Error" (that instant is reproduced here by
    dropping the DuckDB table under the entry). A scan of a table id that is no longer the
    name's reads nothing of its successor."""
    first = tables.create(T, SCHEMA)
    tables.write([(T, data([1], ["a"]))])
    tables.drop(T)
    second = tables.create(T, SCHEMA)
    tables.write([(T, data([2], ["b"]))])
    with pytest.raises(NotFound, match=r"table .*metrics was dropped while it was read"):
        tables.scan(T, ScanSpec(), first.id)
    with pytest.raises(NotFound, match="dropped while it was read"):
        tables.max_rowid(T, first.id)
    assert scan(tables) == [row(2, "b")]
    tables.connection.execute(f"DROP TABLE {second.physical}")
    with pytest.raises(NotFound, match="dropped while it was read"):
        tables.scan(T, ScanSpec(), second.id)
    with pytest.raises(NotFound, match="dropped while it was read"):
        tables.max_rowid(T)
    with pytest.raises(NotFound, match="dropped while it was read"):
        tables.row_count(T)


def test_the_store_holds_duckdb_to_its_memory_limit(tmp_path: Path) -> None:
    """DuckDB kept its default of 80% of the machine: a 3 GiB DoPut grew a worker run with
    --memory-limit 512MiB to 7.5 GiB."""
    store = TableStore.open(tmp_path / "db", memory_limit=512 << 20)
    try:
        found = store.connection.execute("SELECT current_setting('memory_limit')").fetchone()
        assert found is not None
        assert found[0] == "512.0 MiB"
    finally:
        store.close()
