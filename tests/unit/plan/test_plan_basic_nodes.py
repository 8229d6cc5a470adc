"""MemoryScan, Filter, Projection, Limit, Union: each against the same pyarrow computation."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightfeed.errors import ExecutionError, InvalidArgument, UnknownUdfError
from flightfeed.plan import (
    Expr,
    Filter,
    Limit,
    MemoryScan,
    Projection,
    TaskContext,
    Union,
    call,
    closing,
    col,
    collect_partition,
    lit,
)
from flightfeed.session import Session

from .helpers import run, sample_table, sorted_rows

pytestmark = pytest.mark.anyio


async def test_memory_scan_splits_rows_into_partitions() -> None:
    table = sample_table(100)
    scan = MemoryScan.from_table(table, 3, batch_rows=16)
    assert scan.output_partitions == 3
    ctx = TaskContext(Session())
    parts = [pa.Table.from_batches(await collect_partition(scan, p, ctx)) for p in range(3)]
    assert [p.num_rows for p in parts] == [33, 33, 34]
    assert pa.concat_tables(parts).equals(table)
    assert all(b.num_rows <= 16 for b in await collect_partition(scan, 2, ctx))


async def test_partition_out_of_range_raises_invalid_argument_at_call() -> None:
    scan = MemoryScan.from_table(sample_table(10), 2)
    ctx = TaskContext(Session())
    for bad in (-1, 2, 99):
        with pytest.raises(InvalidArgument, match="out of range"):
            scan.execute(bad, ctx)
        with pytest.raises(InvalidArgument, match="out of range"):
            Filter(scan, lit(True)).execute(bad, ctx)


def test_memory_scan_rejects_mismatched_batches() -> None:
    batch = pa.record_batch({"a": [1]})
    with pytest.raises(InvalidArgument):
        MemoryScan(pa.schema([("b", pa.int64())]), [[batch]])
    with pytest.raises(InvalidArgument):
        MemoryScan(batch.schema, [])


@pytest.mark.parametrize("offload", [0, 1 << 40], ids=["thread", "inline"])
async def test_filter_matches_pyarrow(offload: int) -> None:
    table = sample_table()
    predicate = call("and", call("greater", col("v"), lit(0.0)), call("is_valid", col("k")))
    plan = Filter(MemoryScan.from_table(table, 4, batch_rows=50), predicate)
    expected = table.filter(pc.and_(pc.greater(table["v"], 0.0), pc.is_valid(table["k"])))
    got = await run(plan, offload=offload)
    assert got.schema == table.schema
    assert sorted_rows(got) == sorted_rows(expected)


@pytest.mark.parametrize(
    "predicate",
    [lit(None), call("if_else", call("is_valid", col("k")), lit(None), lit(None))],
    ids=["NULL", "CASE of NULLs"],
)
async def test_a_predicate_that_is_null_everywhere_keeps_no_row(predicate: Expr) -> None:
    """As SQL's WHERE NULL. Accepted when the plan was built, it then failed on every batch
    with pyarrow's 'Filter argument must be boolean type'."""
    table = sample_table(40)
    got = await run(Filter(MemoryScan.from_table(table, 2, batch_rows=16), predicate))
    assert got.schema == table.schema
    assert got.num_rows == 0


def test_filter_rejects_non_boolean_predicate() -> None:
    with pytest.raises(InvalidArgument, match="not boolean"):
        Filter(MemoryScan.from_table(sample_table(5)), col("v"))


@pytest.mark.parametrize("offload", [0, 1 << 40], ids=["thread", "inline"])
async def test_projection_matches_pyarrow(offload: int) -> None:
    table = sample_table()
    exprs: list[Expr] = [
        call("multiply", col("v"), lit(2.0)),
        call("binary_join_element_wise", col("g"), lit("-"), lit("x")),
        col("k"),
        lit(7, pa.int8()),
    ]
    plan = Projection(MemoryScan.from_table(table, 3), exprs, ["v2", "g2", "k", "seven"])
    got = await run(plan, offload=offload)
    expected = pa.table(
        {
            "v2": pc.multiply(table["v"], 2.0),
            "g2": pc.binary_join_element_wise(table["g"], "-", "x"),
            "k": table["k"],
            "seven": pa.array([7] * table.num_rows, pa.int8()),
        }
    )
    assert got.schema == expected.schema
    assert got.equals(expected)


async def test_projection_without_columns_keeps_row_count() -> None:
    table = sample_table(40)
    got = await run(Projection(MemoryScan.from_table(table, 2), [], []))
    assert got.num_rows == 40
    assert got.num_columns == 0


def test_projection_validates_at_planning_time() -> None:
    scan = MemoryScan.from_table(sample_table(5))
    with pytest.raises(UnknownUdfError, match="no_such_fn"):
        Projection(scan, [call("no_such_fn", col("v"))], ["x"])
    with pytest.raises(InvalidArgument, match="missing"):
        Projection(scan, [col("missing")], ["x"])
    with pytest.raises(InvalidArgument, match="add"):
        Projection(scan, [call("add", col("g"), lit(1))], ["x"])
    with pytest.raises(InvalidArgument, match="unique"):
        Projection(scan, [col("v"), col("k")], ["x", "x"])


async def test_kernel_failure_at_runtime_is_execution_error() -> None:
    table = pa.table({"a": pa.array([1, 0], pa.int64())})
    plan = Projection(
        MemoryScan.from_table(table), [call("divide_checked", lit(1), col("a"))], ["x"]
    )
    with pytest.raises(ExecutionError, match="divide_checked"):
        await run(plan)


@pytest.mark.parametrize(
    ("skip", "fetch"), [(0, None), (0, 0), (0, 5), (3, 10), (15, 100), (200, 1), (7, 23)]
)
async def test_limit_matches_slice(skip: int, fetch: int | None) -> None:
    table = sample_table(120)
    plan = Limit(MemoryScan.from_table(table, 1, batch_rows=10), fetch, skip)
    got = await run(plan)
    length = table.num_rows if fetch is None else fetch
    assert got.equals(table.slice(skip, length))


async def test_limit_applies_per_partition() -> None:
    table = sample_table(100)
    got = await run(Limit(MemoryScan.from_table(table, 4, batch_rows=7), 10))
    assert got.num_rows == 40


async def test_limit_stops_pulling_its_input() -> None:
    pulled: list[int] = []

    class Counting(MemoryScan):
        async def _execute(self, partition, ctx):  # type: ignore[no-untyped-def]
            async for batch in super()._execute(partition, ctx):
                pulled.append(batch.num_rows)
                yield batch

    table = sample_table(100)
    scan = Counting(table.schema, [table.to_batches(max_chunksize=10)])
    got = await run(Limit(scan, 15))
    assert got.num_rows == 15
    assert len(pulled) == 2


async def test_union_concatenates_partitions() -> None:
    a, b = sample_table(30), sample_table(50)
    plan = Union([MemoryScan.from_table(a, 2), MemoryScan.from_table(b, 3)])
    assert plan.output_partitions == 5
    ctx = TaskContext(Session())
    assert pa.Table.from_batches(await collect_partition(plan, 2, ctx)).equals(b.slice(0, 16))
    assert (await run(plan)).equals(pa.concat_tables([a, b]))


def test_union_rejects_schema_mismatch() -> None:
    with pytest.raises(InvalidArgument, match="schema"):
        Union([MemoryScan.from_table(sample_table(3)), MemoryScan.from_table(pa.table({"x": [1]}))])


async def test_early_close_releases_the_stream() -> None:
    scan = MemoryScan.from_table(sample_table(100), 1, batch_rows=10)
    ctx = TaskContext(Session())
    async with closing(Filter(scan, lit(True)).execute(0, ctx)) as stream:
        async for batch in stream:
            assert batch.num_rows == 10
            break
