"""The plan builder: each chain, over any number of partitions, answers as DuckDB does for the
same SQL over the same rows, run as built, in one process."""

from __future__ import annotations

import anyio
import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.plan import (
    ExecutionPlan,
    PlanBuilder,
    SortKey,
    agg,
    call,
    col,
    desc,
    from_table,
    lit,
    pre_order,
)
from flightfeed.plan.distribution import enforce_distribution

from .helpers import run, sorted_rows

ORDERS = pa.table(
    {
        "o_id": pa.array(range(200), pa.int64()),
        "cust": pa.array([i % 13 for i in range(200)], pa.int64()),
        "price": pa.array([float((i * 37) % 101) for i in range(200)]),
        "status": pa.array(["open" if i % 3 else "done" for i in range(200)]),
    }
)
CUSTOMERS = pa.table(
    {
        "c_id": pa.array(range(0, 20, 2), pa.int64()),  # half of the customers ordering
        "region": pa.array([f"r{i % 3}" for i in range(10)]),
    }
)


def answer(builder: PlanBuilder) -> pa.Table:
    """The built plan run in one process, as it is: it already meets every node's needs, so
    the coordinator's distribution pass leaves it alone."""
    plan: ExecutionPlan = builder.plan
    assert enforce_distribution(plan) is plan
    return anyio.run(run, plan)


def duck(sql: str) -> pa.Table:
    connection = duckdb.connect()
    connection.register("orders", ORDERS)
    connection.register("customers", CUSTOMERS)
    return connection.sql(sql).to_arrow_table()


PARTITIONS = pytest.mark.parametrize("partitions", [1, 3, 8])


@PARTITIONS
def test_filter_aggregate_sort(partitions: int) -> None:
    built = (
        from_table(ORDERS, partitions, batch_rows=16)
        .filter(call("equal", col("status"), lit("open")))
        .aggregate(["cust"], [agg("sum", col("price"), name="total"), agg("count", name="n")])
        .sort(desc("total"), "cust")
    )
    expected = duck(
        "SELECT cust, sum(price) AS total, count(*) AS n FROM orders WHERE status = 'open'"
        " GROUP BY cust ORDER BY total DESC, cust"
    )
    if partitions > 1:  # the aggregate was split around one exchange, and the sort needs none
        assert [type(n).__name__ for n in pre_order(built.plan)].count("Coalesce") == 1
    assert answer(built).to_pylist() == expected.to_pylist()


@PARTITIONS
def test_top_k_and_limit_are_global(partitions: int) -> None:
    orders = from_table(ORDERS, partitions, batch_rows=7)
    top = orders.sort(desc("price"), "o_id", fetch=5).select("o_id", "price")
    expected = duck("SELECT o_id, price FROM orders ORDER BY price DESC, o_id LIMIT 5")
    assert answer(top).to_pylist() == expected.to_pylist()
    page = orders.sort("o_id").limit(4, skip=10).select("o_id")
    assert answer(page).column("o_id").to_pylist() == list(range(10, 14))
    assert answer(orders.limit(7)).num_rows == 7


@PARTITIONS
@pytest.mark.parametrize("how", ["inner", "left outer", "left anti"])
def test_join_then_aggregate(partitions: int, how: str) -> None:
    customers = from_table(CUSTOMERS, 2)
    orders = from_table(ORDERS, partitions, batch_rows=16)
    joined = customers.join(orders, [("c_id", "cust")], how)
    sql_how = {"inner": "JOIN", "left outer": "LEFT JOIN", "left anti": "ANTI JOIN"}[how]
    if how == "left anti":
        built = joined.aggregate([], [agg("count", name="n")])
        sql = f"SELECT count(*) AS n FROM customers {sql_how} orders ON c_id = cust"
        assert answer(built).to_pylist() == duck(sql).to_pylist()
        return
    built = joined.aggregate(["region"], [agg("count", col("o_id"), name="orders")]).sort("region")
    sql = (
        f"SELECT region, count(o_id) AS orders FROM customers {sql_how} orders ON c_id = cust"
        " GROUP BY region ORDER BY region"
    )
    assert answer(built).to_pylist() == duck(sql).to_pylist()


def test_union_and_repartition_keep_every_row() -> None:
    orders = from_table(ORDERS, 3)
    both = orders.union(from_table(ORDERS, 2)).repartition("cust", partitions=4)
    assert both.plan.output_partitions == 4
    counted = both.aggregate(["cust"], [agg("count", name="n")]).sort("cust")
    expected = duck("SELECT cust, 2 * count(*) AS n FROM orders GROUP BY cust ORDER BY cust")
    assert answer(counted).to_pylist() == expected.to_pylist()


def test_select_computes_and_renames() -> None:
    built = from_table(ORDERS, 2).select(
        "o_id", (call("multiply", col("price"), lit(2.0)), "double_price")
    )
    got = answer(built)
    assert got.column_names == ["o_id", "double_price"]
    assert sorted_rows(got) == sorted_rows(
        duck("SELECT o_id, price * 2 AS double_price FROM orders")
    )


def test_steps_that_cannot_mean_anything_are_refused() -> None:
    orders = from_table(ORDERS, 2)
    with pytest.raises(InvalidArgument, match="at least one key"):
        orders.sort()
    with pytest.raises(InvalidArgument, match="at least one column"):
        orders.select()
    with pytest.raises(InvalidArgument, match="group keys or aggregates"):
        orders.aggregate()
    with pytest.raises(InvalidArgument, match="unknown join type"):
        orders.join(orders, "o_id", "sideways")


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.integers(-5, 5) | st.none(), max_size=60),
    partitions=st.integers(1, 5),
    fetch=st.integers(0, 10),
    descending=st.booleans(),
)
def test_a_sorted_fetch_is_the_first_rows_of_the_total_order(
    values: list[int | None], partitions: int, fetch: int, descending: bool
) -> None:
    table = pa.table({"v": pa.array(values, pa.int64()), "i": pa.array(range(len(values)))})
    keys = [SortKey(col("v"), descending), SortKey(col("i"))]
    got = answer(from_table(table, partitions, batch_rows=3).sort(*keys, fetch=fetch))
    order = "DESC" if descending else "ASC"
    connection = duckdb.connect()
    connection.register("t", table)
    expected = connection.sql(f"SELECT * FROM t ORDER BY v {order} NULLS LAST, i LIMIT {fetch}")
    assert got.to_pylist() == expected.to_arrow_table().to_pylist()


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(0, 6)), max_size=60),
    partitions=st.integers(1, 5),
)
def test_count_distinct_per_group_and_overall(values: list[int | None], partitions: int) -> None:
    table = pa.table(
        {"g": pa.array([i % 3 for i in range(len(values))], pa.int64()), "v": values},
        schema=pa.schema([("g", pa.int64()), ("v", pa.int64())]),
    )
    connection = duckdb.connect()
    connection.register("t", table)
    source = from_table(table, partitions)
    grouped = source.aggregate(["g"], [agg("count_distinct", col("v"), name="n")])
    expected = connection.sql("SELECT g, count(DISTINCT v) AS n FROM t GROUP BY g").arrow()
    assert sorted_rows(answer(grouped)) == sorted_rows(expected.read_all())
    overall = source.aggregate([], [agg("count_distinct", col("v"), name="n")])
    assert answer(overall).to_pylist() == [{"n": len({v for v in values if v is not None})}]


def test_count_distinct_mixed_with_other_aggregates_is_refused() -> None:
    source = from_table(ORDERS, 2)
    with pytest.raises(InvalidArgument, match="every aggregate of the step must be"):
        source.aggregate(
            ["cust"], [agg("count_distinct", col("price"), name="n"), agg("count", name="c")]
        )
    with pytest.raises(InvalidArgument, match="takes one argument, got 2"):
        source.aggregate(["cust"], [agg("count_distinct", col("price"), col("o_id"), name="n")])


@PARTITIONS
def test_a_builder_used_twice_runs_once_per_use_in_one_process(partitions: int) -> None:
    """`g.union(g)` and a self-join of an aggregate failed in one process ("Repartition:
    output 0 was already opened": both uses opened the one shared node's outputs), where a
    Coordinator plans it once per use (found by a probe)."""
    per_customer = from_table(ORDERS, partitions).aggregate(["cust"], [agg("count", name="n")])
    both = per_customer.union(per_customer)
    sql = "SELECT cust, count(*) AS n FROM orders GROUP BY cust"
    assert sorted_rows(answer(both)) == sorted_rows(duck(f"{sql} UNION ALL {sql}"))
    renamed = per_customer.select((col("cust"), "c2"), (col("n"), "n2"))
    joined = per_customer.join(renamed, [("cust", "c2")], "inner", strategy="shuffle")
    pairs = f"FROM ({sql}) a JOIN ({sql}) b ON a.cust = b.cust"
    want = duck(f"SELECT a.cust, a.n, b.cust AS c2, b.n AS n2 {pairs}")
    assert sorted_rows(answer(joined)) == sorted_rows(want)
