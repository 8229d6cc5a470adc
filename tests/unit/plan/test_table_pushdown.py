"""Moving filters and projections into TableScans, and pruning partitions: the rewrite never
changes which rows can come out, and a pruned partition never holds a matching row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.plan.expr import call, col, lit
from flightfeed.plan.functions import BUILTINS, ScalarUdf
from flightfeed.plan.metrics import unwrap
from flightfeed.plan.nodes import Filter, MemoryScan, Projection, TableScan, Union
from flightfeed.plan.table_pushdown import push_into_table_scans
from flightfeed.session import SessionStateBuilder
from flightfeed.tables.partitioned import PartitionedTable
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName

SCHEMA = pa.schema([("ts", pa.timestamp("ms")), ("host", pa.string()), ("n", pa.int32())])
TABLE_SCHEMA = TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["host", "n"])


def table(partitions: int, keys: tuple[str, ...] = ("host",)) -> PartitionedTable:
    workers = tuple(f"grpc://w{i}:1" for i in range(partitions))
    return PartitionedTable(TableName.of("cpu"), TABLE_SCHEMA, keys, workers)


def scans(plan: object) -> list[TableScan]:
    node = unwrap(plan)  # type: ignore[arg-type]
    if isinstance(node, TableScan):
        return [node]
    return [s for child in node.children for s in scans(child)]


def rows(hosts: list[str], ns: list[int]) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(len(hosts)), pa.timestamp("ms")),
            "host": pa.array(hosts),
            "n": pa.array(ns, pa.int32()),
        }
    )


def test_a_filter_over_the_union_moves_into_every_scan() -> None:
    predicate = call("greater", col("n"), lit(3))
    plan = push_into_table_scans(Filter(table(3).scan(), predicate))
    assert isinstance(plan, Union)
    assert [s.spec.predicates for s in scans(plan)] == [(predicate,)] * 3


def test_a_projection_of_columns_becomes_the_scan_columns() -> None:
    single = table(1).scan()
    plan = push_into_table_scans(Projection(single, [col("n"), col("host")], ["n", "host"]))
    # The projection declares nullable columns; the key column is not null: it stays on top,
    # over the narrower read, so the output schema is exactly the projection's.
    assert isinstance(plan, Projection)
    scan = unwrap(plan.child)
    assert isinstance(scan, TableScan)
    assert scan.spec.columns == ("n", "host")
    assert plan.schema.equals(pa.schema([("n", pa.int32()), ("host", pa.string())]))
    renamed = Projection(single, [col("n")], ["m"])
    assert isinstance(unwrap(push_into_table_scans(renamed).children[0]), TableScan)
    assert push_into_table_scans(renamed).children[0] is single  # a rename is not pushed


def test_a_projection_as_the_table_declares_it_is_the_scan_itself() -> None:
    nullable = pa.schema([("ts", pa.timestamp("ms")), ("host", pa.string()), ("n", pa.int32())])
    plain = TableScan(table(1).scan().spec, nullable)  # type: ignore[attr-defined]
    plan = push_into_table_scans(Projection(plain, [col("n")], ["n"]))
    assert isinstance(plan, TableScan)
    assert plan.spec.columns == ("n",)


def test_a_predicate_calling_a_session_udf_stays_a_filter() -> None:
    udf = ScalarUdf("odd", lambda a: pc.equal(pc.bit_wise_and(a, 1), 1), pa.bool_())
    session = SessionStateBuilder().with_scalar_udf(udf).build()
    plan = Filter(table(2).scan(), call("odd", col("n")), functions=session)
    assert isinstance(push_into_table_scans(plan), Filter)


def test_a_plan_without_table_scans_is_left_as_it_is() -> None:
    scan = MemoryScan.from_table(rows(["a"], [1]))
    plan = Filter(Union([scan, scan]), call("greater", col("n"), lit(0)))
    assert push_into_table_scans(plan) is plan


def test_pruning_keeps_only_the_partitions_of_the_pinned_values() -> None:
    pt = table(4)
    data = rows([f"h{i}" for i in range(40)], list(range(40)))
    routed = pt.route(data)
    holder = next(i for i, part in enumerate(routed) if "h7" in part["host"].to_pylist())
    plan = push_into_table_scans(Filter(pt.scan(), call("equal", col("host"), lit("h7"))))
    assert [s.partition.index for s in scans(plan) if s.partition] == [holder]
    assert "partition=" in repr(plan)


def test_every_partition_pruned_reads_nothing() -> None:
    pt = table(3)
    both = call(
        "and_kleene", call("equal", col("host"), lit("a")), call("equal", col("host"), lit("b"))
    )
    plan = push_into_table_scans(Filter(pt.scan(), both))
    assert isinstance(plan, MemoryScan)
    assert plan.schema.equals(pt.scan().schema)


@settings(max_examples=80, deadline=None)
@given(
    partitions=st.integers(1, 6),
    hosts=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]), min_size=1, max_size=30),
    ns=st.lists(st.integers(-3, 3), min_size=30, max_size=30),
    wanted_hosts=st.lists(st.sampled_from(["a", "b", "c", "x"]), min_size=0, max_size=3),
    wanted_n=st.one_of(st.none(), st.integers(-3, 3)),
    two_keys=st.booleans(),
)
def test_pruning_never_drops_a_partition_with_a_matching_row(
    partitions: int,
    hosts: list[str],
    ns: list[int],
    wanted_hosts: list[str],
    wanted_n: int | None,
    two_keys: bool,
) -> None:
    keys = ("host", "n") if two_keys else ("host",)
    pt = table(partitions, keys)
    data = rows(hosts, ns[: len(hosts)])
    predicate = call(
        "is_in", col("host"), options=pc.SetLookupOptions(pa.array(wanted_hosts, pa.string()))
    )
    if wanted_n is not None:
        # an int64 literal against the int32 column: pruning must hash it as the column's type
        predicate = call("and_kleene", predicate, call("equal", col("n"), lit(wanted_n)))
    pushed = push_into_table_scans(Filter(pt.scan(), predicate))
    kept = {s.partition.index for s in scans(pushed) if s.partition is not None}
    for index, part in enumerate(pt.route(data)):
        matching = part.filter(pc.fill_null(_evaluate(predicate, part), False))
        if matching.num_rows:
            assert index in kept, f"partition {index} holds {matching.to_pylist()}"


def _evaluate(predicate: object, part: pa.Table) -> pa.Array:
    from flightfeed.plan.expr import evaluate

    batch = part.combine_chunks().to_batches()
    if not batch:
        return pa.array([], pa.bool_())
    return evaluate(predicate, batch[0], BUILTINS)  # type: ignore[arg-type]
