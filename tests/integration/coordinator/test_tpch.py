"""TPC-H Q3, Q5 and Q18 at scale factor 0.1, built with the plan builder over Parquet files that
DuckDB's TPC-H extension generated, run on two real workers and in one process, against
DuckDB's answers to the queries' SQL over the same files.

Prices are written as doubles (the generator's decimals would make the two engines' sums
differ in type, not in value), so sums compare with a relative tolerance.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Callable
from pathlib import Path

import anyio
import duckdb
import pyarrow as pa
import pytest

from flightfeed.plan import (
    ExecutionPlan,
    Expr,
    ParquetScan,
    PlanBuilder,
    agg,
    call,
    col,
    collect,
    desc,
    lit,
    open_task_context,
    plan_from,
)
from flightfeed.plan.nodes import parquet_scan
from flightfeed.session import Session
from flightfeed.testing import start_cluster
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio

SCALE_FACTOR = 0.1
COLUMNS = {
    "region": "r_regionkey, r_name",
    "nation": "n_nationkey, n_name, n_regionkey",
    "supplier": "s_suppkey, s_nationkey",
    "customer": "c_custkey, c_name, c_mktsegment, c_nationkey",
    "orders": "o_orderkey, o_custkey, o_orderdate, o_shippriority,"
    " CAST(o_totalprice AS DOUBLE) AS o_totalprice",
    "lineitem": "l_orderkey, l_suppkey, l_shipdate, CAST(l_quantity AS DOUBLE) AS l_quantity,"
    " CAST(l_extendedprice AS DOUBLE) AS l_extendedprice,"
    " CAST(l_discount AS DOUBLE) AS l_discount",
}


def load_tpch(connection: duckdb.DuckDBPyConnection) -> None:
    """The extension from its PyPI package (offline), else DuckDB's own install."""
    try:
        import duckdb_extension_tpch
    except ImportError:
        connection.sql("INSTALL tpch")
        connection.sql("LOAD tpch")
        return
    root = Path(duckdb_extension_tpch.__path__[0]) / "extensions" / f"v{duckdb.__version__}"
    connection.sql(f"LOAD '{root / 'tpch.duckdb_extension'}'")


@pytest.fixture(scope="module")
def tpch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tpch")
    connection = duckdb.connect()
    load_tpch(connection)
    connection.sql(f"CALL dbgen(sf={SCALE_FACTOR})")
    for table, columns in COLUMNS.items():
        (root / table).mkdir()
        connection.sql(
            f"COPY (SELECT {columns} FROM {table}) TO '{root / table / 'part.parquet'}'"
            " (FORMAT parquet, ROW_GROUP_SIZE 100000)"
        )
    return root


def duck(tpch_dir: Path, sql: str) -> pa.Table:
    connection = duckdb.connect()
    for table in COLUMNS:
        connection.sql(
            f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{tpch_dir / table}/*.parquet')"
        )
    return connection.sql(sql).to_arrow_table()


def scan(tpch_dir: Path, table: str, columns: list[str], where: Expr | None = None) -> PlanBuilder:
    node = ParquetScan.from_paths(
        str(tpch_dir / table), partitions=2, columns=columns, filter=where
    )
    return plan_from(node)


def q3(tpch_dir: Path) -> ExecutionPlan:
    """Shipping priority: unshipped orders of BUILDING customers by revenue."""
    day = lit(datetime.date(1995, 3, 15))
    customer = scan(
        tpch_dir, "customer", ["c_custkey"], call("equal", col("c_mktsegment"), lit("BUILDING"))
    )
    orders = scan(
        tpch_dir,
        "orders",
        ["o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"],
        call("less", col("o_orderdate"), day),
    )
    lineitem = scan(
        tpch_dir,
        "lineitem",
        ["l_orderkey", "l_extendedprice", "l_discount"],
        call("greater", col("l_shipdate"), day),
    )
    volume = call("multiply", col("l_extendedprice"), call("subtract", lit(1.0), col("l_discount")))
    return (
        customer.join(orders, [("c_custkey", "o_custkey")])
        .join(lineitem, [("o_orderkey", "l_orderkey")])
        .select("l_orderkey", "o_orderdate", "o_shippriority", (volume, "volume"))
        .aggregate(
            ["l_orderkey", "o_orderdate", "o_shippriority"],
            [agg("sum", col("volume"), name="revenue")],
        )
        .sort(desc("revenue"), "o_orderdate", fetch=10)
        .select("l_orderkey", "revenue", "o_orderdate", "o_shippriority")
        .plan
    )


Q3_SQL = """
SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate,
       o_shippriority
FROM customer, orders, lineitem
WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey
  AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
GROUP BY l_orderkey, o_orderdate, o_shippriority
ORDER BY revenue DESC, o_orderdate
LIMIT 10
"""


def q5(tpch_dir: Path) -> ExecutionPlan:
    """Local supplier volume: revenue in 1994 of Asian suppliers selling to customers of their
    own nation (a join on two keys)."""
    asian_nations = scan(
        tpch_dir, "region", ["r_regionkey"], call("equal", col("r_name"), lit("ASIA"))
    ).join(
        scan(tpch_dir, "nation", ["n_nationkey", "n_name", "n_regionkey"]),
        [("r_regionkey", "n_regionkey")],
    )
    suppliers = asian_nations.join(
        scan(tpch_dir, "supplier", ["s_suppkey", "s_nationkey"]), [("n_nationkey", "s_nationkey")]
    )
    in_1994 = call(
        "and",
        call("greater_equal", col("o_orderdate"), lit(datetime.date(1994, 1, 1))),
        call("less", col("o_orderdate"), lit(datetime.date(1995, 1, 1))),
    )
    sales = (
        scan(tpch_dir, "customer", ["c_custkey", "c_nationkey"])
        .join(
            scan(tpch_dir, "orders", ["o_orderkey", "o_custkey"], in_1994),
            [("c_custkey", "o_custkey")],
        )
        .join(
            scan(
                tpch_dir, "lineitem", ["l_orderkey", "l_suppkey", "l_extendedprice", "l_discount"]
            ),
            [("o_orderkey", "l_orderkey")],
        )
    )
    volume = call("multiply", col("l_extendedprice"), call("subtract", lit(1.0), col("l_discount")))
    return (
        suppliers.join(sales, [("s_suppkey", "l_suppkey"), ("s_nationkey", "c_nationkey")])
        .select("n_name", (volume, "volume"))
        .aggregate(["n_name"], [agg("sum", col("volume"), name="revenue")])
        .sort(desc("revenue"))
        .plan
    )


Q5_SQL = """
SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM customer, orders, lineitem, supplier, nation, region
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey
  AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey
  AND r_name = 'ASIA' AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'
GROUP BY n_name
ORDER BY revenue DESC
"""


def q18(tpch_dir: Path, strategy: str = "broadcast") -> ExecutionPlan:
    """Large volume customers: orders of more than 300 units. lineitem is read twice, by
    the subquery's aggregate and by the last join: with `strategy="shuffle"` both joins shuffle
    their sides by order key, so that join's two sides both come out of shuffles of lineitem."""
    big = (
        scan(tpch_dir, "lineitem", ["l_orderkey", "l_quantity"])
        .aggregate(["l_orderkey"], [agg("sum", col("l_quantity"), name="order_quantity")])
        .filter(call("greater", col("order_quantity"), lit(300.0)))
    )
    orders = scan(tpch_dir, "orders", ["o_orderkey", "o_custkey", "o_orderdate", "o_totalprice"])
    big_orders = big.join(orders, [("l_orderkey", "o_orderkey")], "right semi", strategy=strategy)
    customer = scan(tpch_dir, "customer", ["c_custkey", "c_name"])
    lineitem = scan(tpch_dir, "lineitem", ["l_orderkey", "l_quantity"])
    keys = ["c_name", "c_custkey", "o_orderkey", "o_orderdate", "o_totalprice"]
    return (
        customer.join(big_orders, [("c_custkey", "o_custkey")])
        .join(lineitem, [("o_orderkey", "l_orderkey")], strategy=strategy)
        .aggregate(keys, [agg("sum", col("l_quantity"), name="quantity")])
        .sort(desc("o_totalprice"), "o_orderdate", fetch=100)
        .plan
    )


Q18_SQL = """
SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) AS quantity
FROM customer, orders, lineitem
WHERE o_orderkey IN (
        SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)
  AND c_custkey = o_custkey AND o_orderkey = l_orderkey
GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
ORDER BY o_totalprice DESC, o_orderdate
LIMIT 100
"""

QUERIES: dict[str, tuple[Callable[[Path], ExecutionPlan], str]] = {
    "q3": (q3, Q3_SQL),
    "q5": (q5, Q5_SQL),
    "q18": (q18, Q18_SQL),
}


def assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    """Equal row for row, doubles within a relative 1e-9 (sums in another order)."""
    assert got.column_names == expected.column_names
    assert got.num_rows == expected.num_rows > 0
    for mine, theirs in zip(got.to_pylist(), expected.to_pylist(), strict=True):
        for name, value in mine.items():
            other = theirs[name]
            if isinstance(value, float):
                assert math.isclose(value, other, rel_tol=1e-9), (name, mine, theirs)
            else:
                assert value == other, (name, mine, theirs)


async def one_process(plan: ExecutionPlan) -> pa.Table:
    async with open_task_context(Session()) as ctx:
        return await collect(plan, ctx)


@pytest.mark.parametrize("name", sorted(QUERIES))
async def test_tpch_query_matches_duckdb_on_workers_and_in_one_process(
    tpch_dir: Path, name: str
) -> None:
    build, sql = QUERIES[name]
    expected = await anyio.to_thread.run_sync(duck, tpch_dir, sql)
    plan = await anyio.to_thread.run_sync(build, tpch_dir)
    assert_same_rows(await one_process(plan), expected)
    config = WorkerConfig(parquet_roots=(os.fspath(tpch_dir),))
    # Every shuffle is read by a task per worker, however small the data at this scale.
    async with start_cluster(2, config=config, shuffle_bytes_per_task=1) as (coordinator, _):
        distributed = await anyio.to_thread.run_sync(build, tpch_dir)
        assert_same_rows(await coordinator.collect(distributed), expected)
        assert coordinator.plan(distributed, 2).stages  # the scans ran on the workers


async def test_q18_with_shuffled_joins_finishes_under_one_batch_buffers(
    tpch_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape that deadlocked the reference system under bounded per-partition queues: a
    join whose two sides both come out of shuffles (of the same table), every stage pipelined
    and running at once. Here every fan-out buffer holds one batch and Parquet is read in small
    batches, so producers block on their readers all the time; the query still finishes, with
    DuckDB's answer, and the explain shows shuffles on both sides of the join on both workers."""
    monkeypatch.setattr(parquet_scan, "BATCH_ROWS", 4096)  # lineitem: ~150 batches per task
    expected = await anyio.to_thread.run_sync(duck, tpch_dir, Q18_SQL)
    plan = await anyio.to_thread.run_sync(q18, tpch_dir, "shuffle")
    assert_same_rows(await one_process(plan), expected)
    config = WorkerConfig(parquet_roots=(os.fspath(tpch_dir),), consumer_buffer_batches=1)
    async with start_cluster(2, config=config, shuffle_bytes_per_task=1) as (coordinator, _):
        text = await coordinator.explain(plan)
        with anyio.fail_after(120):
            assert_same_rows(await coordinator.collect(plan), expected)
    join = next(line for line in text.splitlines() if "HashJoin(inner, [o_orderkey" in line)
    assert "partitioned" in join
    sides = text.split(join)[1].splitlines()[1:3]
    assert all("NetworkShuffle" in side for side in sides), sides
    assert "2 tasks (NetworkShuffle: 2 buckets of" in text
