"""Size estimates the planner's broadcast decision and upper-stage task counts use: leaves say,
other nodes pass, bound or sum. Estimates that claim to bound a run's output are checked against
the output of the same plan run in one process."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings

from flightfeed.plan import (
    AggregateMode,
    Coalesce,
    ExecutionPlan,
    Filter,
    HashAggregate,
    HashJoin,
    Limit,
    MemoryScan,
    ParquetScan,
    Projection,
    Sort,
    SortKey,
    Union,
    agg,
    call,
    col,
    lit,
)
from flightfeed.plan.statistics import Estimate, estimate, estimated_bytes

from .helpers import run, sample_table


def test_memory_scans_pass_through_filters_and_sum_in_unions() -> None:
    scan = MemoryScan.from_table(sample_table(500), 2)
    size = estimated_bytes(scan)
    assert size == scan.embedded_bytes  # its batches' bytes
    assert size is not None
    assert size >= sample_table(500).nbytes
    assert estimate(scan) == Estimate(size, 500)
    assert estimate(Filter(scan, call("greater", col("n"), lit(3)))) == Estimate(size, 500)
    assert estimate(Union([scan, scan])) == Estimate(2 * size, 1000)


def test_a_projection_is_as_wide_as_its_own_columns() -> None:
    wide = pa.table({f"c{i}": pa.array(range(1000), pa.int64()) for i in range(8)})
    scan = MemoryScan.from_table(wide, 2)
    narrow = Projection(scan, [col("c0"), call("add", col("c1"), lit(1))], ["c0", "next"])
    assert estimate(narrow) == Estimate(1000 * 2 * 9, 1000)
    mixed = MemoryScan.from_table(sample_table(300), 3)
    with_text = Projection(mixed, [col("g"), col("n")], ["g", "n"])
    assert estimate(with_text) == Estimate(mixed.embedded_bytes, 300)


def test_a_join_is_unknown() -> None:
    left = MemoryScan.from_table(pa.table({"a": [1, 2]}))
    right = MemoryScan.from_table(pa.table({"b": [1, 2]}))
    assert estimated_bytes(HashJoin(left, right, [("a", "b")])) is None


def test_a_parquet_scan_estimates_from_its_footers_and_projection(tmp_path: Path) -> None:
    table = pa.table({f"c{i}": pa.array(range(10_000), pa.int64()) for i in range(4)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2_500, compression="none")
    whole = estimated_bytes(ParquetScan.from_paths(str(tmp_path)))
    assert whole is not None
    assert 4 * 10_000 * 8 * 0.5 < whole < 4 * 10_000 * 8 * 2
    one_column = ParquetScan.from_paths(str(tmp_path), columns=["c1"])
    assert estimate(one_column) == Estimate(whole // 4, 10_000)
    assert estimate(one_column.for_tasks(2)) == estimate(one_column)  # the layout's, not a task's


def test_a_limit_and_a_top_k_keep_fetch_rows_a_partition_with_their_share_of_bytes() -> None:
    scan = MemoryScan.from_table(sample_table(1000), 4)
    size = scan.embedded_bytes
    assert estimate(Limit(scan, fetch=10)) == Estimate(size * 40 // 1000, 40)
    assert estimate(Limit(Coalesce(scan), fetch=10)) == Estimate(size * 10 // 1000, 10)
    assert estimate(Limit(scan, fetch=None, skip=3)) == Estimate(size, 1000)
    assert estimate(Limit(scan, fetch=5000)) == Estimate(size, 1000)  # no more than it has
    top = Sort(Coalesce(scan), [SortKey(col("n"))], fetch=7)
    assert estimate(top) == Estimate(size * 7 // 1000, 7)
    assert estimate(Sort(scan, [SortKey(col("n"))])) == Estimate(size, 1000)


def test_an_aggregate_is_as_big_as_its_own_columns_not_its_inputs() -> None:
    wide = pa.table({f"c{i}": pa.array(range(2000), pa.int64()) for i in range(10)})
    scan = MemoryScan.from_table(wide, 2)
    keyed = HashAggregate(scan, [(col("c0"), "c0")], [agg("count", name="n")])
    # at most a group per row, each an int64 key and count and their validity bytes
    assert estimate(keyed) == Estimate(2000 * (9 + 9), 2000)
    assert scan.embedded_bytes / 4 > 2000 * (9 + 9)
    total = HashAggregate(Coalesce(scan), [], [agg("sum", col("c1"), name="s")])
    assert estimate(total) == Estimate(9, 1)  # one row
    partial = HashAggregate(scan, [], [agg("sum", col("c1"), name="s")], mode=AggregateMode.PARTIAL)
    assert estimate(partial) == Estimate(2 * len(partial.schema) * 9, 2)  # one a partition


def test_a_keyed_aggregate_is_estimated_no_bigger_than_its_input() -> None:
    """A count per key adds a column, but aggregates shrink data far more often: the estimate
    is the input's bytes, while its rows stay a bound."""
    scan = MemoryScan.from_table(pa.table({"k": pa.array(range(100), pa.int32())}))
    keyed = HashAggregate(scan, [(col("k"), "k")], [agg("count", name="n")])
    assert scan.embedded_bytes < 100 * (5 + 9)
    assert estimate(keyed) == Estimate(scan.embedded_bytes, 100)


def test_a_variable_width_aggregate_is_bounded_by_its_input_bytes_only() -> None:
    scan = MemoryScan.from_table(sample_table(600), 3)
    by_string = HashAggregate(scan, [(col("g"), "g")], [agg("count", name="n")])
    assert estimate(by_string) == Estimate(scan.embedded_bytes, 600)


@pytest.mark.anyio
async def test_a_global_aggregate_of_no_rows_is_still_a_row() -> None:
    empty = MemoryScan.from_table(sample_table(0))
    lowest = HashAggregate(Coalesce(empty), [], [agg("min", col("g"), name="g")])
    found = estimate(lowest)
    assert found == Estimate(empty.embedded_bytes, 1)
    assert (await run(lowest)).num_rows == 1


def test_unknown_leaves_stay_unknown_and_rows_unknown_pass_bytes_on() -> None:
    scan = MemoryScan.from_table(sample_table(100))
    other = MemoryScan.from_table(pa.table({"key": pa.array([1, 2], pa.int32())}))
    assert estimate(Limit(HashJoin(other, scan, [("key", "k")]), fetch=3)) is None
    # A leaf that knows only its bytes:
    scan.embedded_rows = None
    assert estimate(Limit(scan, fetch=3)) == Estimate(scan.embedded_bytes, 3)
    keyed = HashAggregate(scan, [(col("k"), "k")], [agg("count", name="n")])
    assert estimate(keyed) == Estimate(scan.embedded_bytes, None)


# Plans of row-bounding nodes over a random table; each node is added with its input.
STEPS = st.lists(
    st.sampled_from(["filter", "limit", "top", "coalesce", "project", "keyed", "global", "union"]),
    max_size=4,
)


def build(plan: ExecutionPlan, step: str, fetch: int) -> ExecutionPlan:
    columns = plan.schema.names
    if step == "filter":
        return Filter(plan, call("greater", col(columns[0]), lit(fetch)))
    if step == "limit":
        return Limit(plan, fetch=fetch)
    if step == "top":
        return Sort(plan, [SortKey(col(columns[0]), descending=True)], fetch=fetch)
    if step == "coalesce":
        return Coalesce(plan)
    if step == "project":
        return Projection(plan, [col(columns[0])], [columns[0]])
    if step == "keyed":
        return HashAggregate(plan, [(col(columns[0]), "key")], [agg("count", name="n")])
    if step == "global":
        return HashAggregate(Coalesce(plan), [], [agg("max", col(columns[0]), name="top")])
    return Union([plan, plan])


@given(
    rows=st.integers(0, 300),
    partitions=st.integers(1, 4),
    modulus=st.integers(1, 50),
    steps=STEPS,
    fetch=st.integers(0, 40),
)
@settings(max_examples=60, deadline=None)
@pytest.mark.anyio
async def test_estimated_rows_bound_what_the_plan_returns(
    rows: int, partitions: int, modulus: int, steps: list[str], fetch: int
) -> None:
    table = pa.table(
        {
            "a": pa.array([i % modulus for i in range(rows)], pa.int64()),
            "b": pa.array(range(rows), pa.float64()),
        }
    )
    plan: ExecutionPlan = MemoryScan.from_table(table, partitions)
    for step in steps:
        plan = build(plan, step, fetch)
    found = estimate(plan)
    assert found is not None
    assert found.rows is not None
    got = await run(plan)
    assert got.num_rows <= found.rows
    if plan.name in ("HashAggregate", "Projection"):  # fixed-width rows, validity included
        width = sum(field.type.bit_width // 8 + 1 for field in plan.schema)
        assert got.nbytes <= found.rows * width
        if not getattr(plan, "group_by", ()):
            assert found.bytes == found.rows * width
