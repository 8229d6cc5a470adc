"""Float group and join keys compared as SQL compares them (flightfeed.plan.float_keys):
-0.0 equals 0.0 and a NaN equals a NaN, whatever their bits. Acero compared the bits: grouping
[NaN, -NaN, -0.0, 0.0, 1.0] gave 5 groups where DuckDB gives 3, and -0.0 never joined 0.0.
DuckDB, on the same rows, is the reference."""

from __future__ import annotations

import math
import struct

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.plan import (
    AggregateMode,
    Coalesce,
    HashAggregate,
    HashJoin,
    MemoryScan,
    Partitioning,
    Repartition,
    agg,
    col,
    plan_from,
)
from flightfeed.plan.float_keys import normalized

from .helpers import run

NEGATIVE_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
"""The NaN of 0.0 / 0.0 on x86: the sign bit set."""
TRICKY = [math.nan, NEGATIVE_NAN, -0.0, 0.0, 1.0, None]
floats = st.lists(
    st.one_of(st.sampled_from(TRICKY), st.floats(allow_nan=False, width=64)), max_size=40
)


def duckdb_groups(table: pa.Table, sql: str) -> list[tuple[object, ...]]:
    connection = duckdb.connect()
    connection.register("t", table)
    return sorted(connection.execute(sql).fetchall(), key=repr)


def counts_by_group(table: pa.Table) -> list[int]:
    return sorted(table.column("n").to_pylist())


@pytest.mark.anyio
@settings(max_examples=60, deadline=None)
@given(floats)
async def test_groups_of_float_keys_are_sqls_groups(values: list[float | None]) -> None:
    table = pa.table({"k": pa.array(values, pa.float64())})
    aggregates = [agg("count", name="n")]
    single = HashAggregate(MemoryScan.from_table(table, 1), [(col("k"), "k")], aggregates)
    partial = HashAggregate(
        MemoryScan.from_table(table, 3), [(col("k"), "k")], aggregates, mode=AggregateMode.PARTIAL
    )
    shuffled = Repartition(partial, Partitioning((col("k"),), 2))  # (equal keys meet)
    final = HashAggregate(shuffled, [(col("k"), "k")], aggregates, mode=AggregateMode.FINAL)
    grouped = duckdb_groups(table, "SELECT k, count(*) FROM t GROUP BY k")
    expected = sorted(int(str(n)) for _, n in grouped)
    assert counts_by_group(await run(single)) == expected
    assert counts_by_group(await run(Coalesce(final))) == expected


@pytest.mark.anyio
async def test_count_distinct_of_floats_counts_sql_s_distinct_values() -> None:
    table = pa.table({"k": pa.array(TRICKY, pa.float64())})
    plan = plan_from(MemoryScan.from_table(table)).aggregate(
        [], [agg("count_distinct", col("k"), name="d")]
    )
    got = (await run(plan.plan)).column("d").to_pylist()
    assert got == [r[0] for r in duckdb_groups(table, "SELECT count(DISTINCT k) FROM t")] == [3]


@pytest.mark.anyio
@pytest.mark.parametrize("join_type", ["inner", "left semi", "left anti", "full outer"])
async def test_float_keys_join_as_sql_joins_them_and_rows_keep_their_values(
    join_type: str,
) -> None:
    left = pa.table(
        {"a": pa.array([-0.0, NEGATIVE_NAN, 2.0, None], pa.float64()), "l": [1, 2, 3, 4]}
    )
    right = pa.table({"b": pa.array([0.0, math.nan, 3.0], pa.float64()), "r": [10, 20, 30]})
    plan = HashJoin(
        MemoryScan.from_table(left), MemoryScan.from_table(right), [("a", "b")], join_type
    )
    got = await run(plan)
    sql_join = {
        "inner": "SELECT l, r FROM t JOIN u ON a = b",
        "left semi": "SELECT l FROM t SEMI JOIN u ON a = b",
        "left anti": "SELECT l FROM t ANTI JOIN u ON a = b",
        "full outer": "SELECT l, r FROM t FULL JOIN u ON a = b",
    }[join_type]
    connection = duckdb.connect()  # (tables: its join over registered Arrow data found none)
    for name, data in (("t", left), ("u", right)):
        connection.register("incoming", data)
        connection.execute(f"CREATE TABLE {name} AS SELECT * FROM incoming")
        connection.unregister("incoming")
    expected = sorted(connection.execute(sql_join).fetchall(), key=repr)
    columns = ["l", "r"] if "r" in got.column_names else ["l"]
    assert (
        sorted(zip(*(got.column(c).to_pylist() for c in columns), strict=True), key=repr)
        == expected
    )
    assert "__ff_join_l0" not in got.column_names
    if join_type == "inner":  # -0.0 joined 0.0 and is still -0.0
        signs = {
            l_: math.copysign(1, a)
            for l_, a in zip(got["l"].to_pylist(), got["a"].to_pylist(), strict=True)
        }
        assert signs[1] == -1.0


def test_normalized_leaves_other_values_and_types_alone() -> None:
    values = pa.array([1.5, -2.0, None, math.inf, -math.inf], pa.float32())
    assert normalized(values).equals(values)
    ints = pa.array([0, -1])
    assert normalized(ints) is ints
