"""TableScan: its codec round trip, and reads of a real (in-memory DuckDB) table store through the
task's TableSource, with projection, predicates and time range pushed into the read."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import ExecutionError, InvalidArgument, PlanDecodeError
from flightfeed.plan import CodecRegistry, collect, decode_plan, encode_plan, open_task_context
from flightfeed.plan.expr import call, col, lit
from flightfeed.plan.nodes import Filter, TableScan
from flightfeed.plan.table_source import TABLE_SOURCE_KEY, TableReadSpec
from flightfeed.session import Session
from flightfeed.tables.engine import TableEngine
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.source import EngineTableSource
from flightfeed.tables.store import TableName

REGISTRY = CodecRegistry.builtin()
SESSION = Session()
ROWS = 1000


def rows() -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(ROWS), pa.timestamp("ms")),
            "host": pa.array([f"h{i % 7}" for i in range(ROWS)]),
            "v": pa.array([float(i) for i in range(ROWS)]),
        }
    )


@pytest.fixture
async def engine() -> AsyncIterator[TableEngine]:
    engine = await TableEngine.open(None)
    name = TableName.of("cpu")
    schema = TableSchema.from_arrow(rows().schema, timestamp="ts", tags=["host"])
    await engine.create(name, schema, {"update_mode": "APPEND"})
    await engine.write([(name, rows())])
    try:
        yield engine
    finally:
        await engine.aclose()


def scan_of(engine: TableEngine, spec: TableReadSpec) -> TableScan:
    return TableScan(spec, EngineTableSource(engine).table_schema(spec))


async def run_with(engine: TableEngine, plan: object) -> pa.Table:
    async with open_task_context(SESSION) as ctx:
        ctx.extensions[TABLE_SOURCE_KEY] = EngineTableSource(engine)
        return await collect(plan, ctx)  # type: ignore[arg-type]


specs = st.builds(
    TableReadSpec,
    catalog=st.sampled_from(["", "c"]),
    schema=st.sampled_from(["", "s"]),
    table=st.text(min_size=1, max_size=8),
    columns=st.sampled_from([(), ("v",), ("host", "ts")]),
    predicates=st.sampled_from([(), (call("greater", col("v"), lit(3.5)),)]),
    time_range=st.one_of(st.none(), st.tuples(st.integers(-5, 5), st.integers(5, 50))),
    parallelism=st.integers(1, 8),
)


@settings(max_examples=60, deadline=None)
@given(spec=specs)
def test_codec_round_trip(spec: TableReadSpec) -> None:
    fields = {"v": pa.float64(), "host": pa.string(), "ts": pa.timestamp("ms")}
    names = spec.columns or ("ts", "host", "v")
    schema = pa.schema([(n, fields[n]) for n in names])
    node = TableScan(spec, schema, worker="grpc://w:1")
    back = decode_plan(encode_plan(node, REGISTRY), REGISTRY, SESSION)
    assert isinstance(back, TableScan)
    assert back.spec == spec
    assert back.schema.equals(schema)
    assert back.worker == "grpc://w:1"


@pytest.mark.anyio
async def test_reads_with_projection_predicates_and_time_range(engine: TableEngine) -> None:
    spec = TableReadSpec(
        "",
        "",
        "cpu",
        columns=("v", "host"),
        predicates=(call("equal", col("host"), lit("h3")),),
        time_range=(100, 500),
        parallelism=3,
    )
    plan = Filter(scan_of(engine, spec), call("less", col("v"), lit(400.0)))
    got = await run_with(engine, plan)
    data = rows()
    keep = pc.and_(
        pc.and_(pc.equal(data["host"], "h3"), pc.less(data["v"], 400.0)),
        pc.and_(
            pc.greater_equal(data["ts"].cast(pa.int64()), 100),
            pc.less(data["ts"].cast(pa.int64()), 500),
        ),
    )
    expected = data.filter(keep).select(["v", "host"])
    assert got.column_names == ["v", "host"]
    assert sorted(got.to_pylist(), key=lambda r: r["v"]) == expected.to_pylist()


@pytest.mark.anyio
async def test_a_missing_table_or_column_is_named(engine: TableEngine) -> None:
    source = EngineTableSource(engine)
    with pytest.raises(Exception, match="no table"):
        source.table_schema(TableReadSpec("", "", "nope"))
    with pytest.raises(InvalidArgument, match="no column 'z'"):
        source.table_schema(TableReadSpec("", "", "cpu", columns=("z",)))


@pytest.mark.anyio
async def test_a_changed_table_is_refused_not_misread(engine: TableEngine) -> None:
    stale = TableScan(TableReadSpec("", "", "cpu", columns=("v",)), pa.schema([("v", pa.int64())]))
    with pytest.raises(InvalidArgument, match="has changed since the plan was made"):
        await run_with(engine, stale)


@pytest.mark.anyio
async def test_without_tables_where_it_runs_the_scan_says_so() -> None:
    plan = TableScan(TableReadSpec("", "", "cpu"), pa.schema([("ts", pa.timestamp("ms"))]))
    async with open_task_context(SESSION) as ctx:
        with pytest.raises(ExecutionError, match="--data-dir"):
            await collect(plan, ctx)


def test_bad_nodes_are_refused() -> None:
    schema = pa.schema([("v", pa.float64())])
    with pytest.raises(InvalidArgument, match="table name"):
        TableScan(TableReadSpec("", "", ""), schema)
    with pytest.raises(InvalidArgument, match="parallelism"):
        TableScan(TableReadSpec("", "", "t", parallelism=0), schema)
    with pytest.raises(InvalidArgument, match="differ from its schema"):
        TableScan(TableReadSpec("", "", "t", columns=("w",)), schema)
    bad = encode_plan(TableScan(TableReadSpec("", "", "t"), schema), REGISTRY)
    with pytest.raises(PlanDecodeError):
        decode_plan(bad.replace(b"\x1a\x01t", b"\x1a\x00"), REGISTRY, SESSION)
