"""A table partitioned over 3 real workers: writes routed by key, reads pruned to the partitions
a predicate allows (the plan shows it), filters, projections and partial aggregations run on
the owning workers, and every answer equal to the same table held whole by one worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from flightfeed.cluster import serve
from flightfeed.coordinator import Catalog, Coordinator, table_command
from flightfeed.coordinator.resolver import StaticWorkerResolver
from flightfeed.errors import NotFound
from flightfeed.plan.aggregate import agg
from flightfeed.plan.builder import PlanBuilder, plan_from
from flightfeed.plan.expr import call, col, lit
from flightfeed.plan.nodes import TableScan
from flightfeed.plan.table_source import TableReadSpec
from flightfeed.tables.partitioned import PartitionedTable, PartitionedTables
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName
from flightfeed.worker import Worker
from flightfeed.worker.config import WorkerConfig

ROWS = 6000
HOSTS = [f"host-{i}" for i in range(25)]
SCHEMA = pa.schema(
    [("ts", pa.timestamp("ms")), ("host", pa.string()), ("cpu", pa.float64()), ("n", pa.int64())]
)
TABLE_SCHEMA = TableSchema.from_arrow(SCHEMA, timestamp="ts", tags=["host"])


def data() -> pa.Table:
    rng = np.random.default_rng(7)
    cpu = rng.random(ROWS) * 100
    return pa.table(
        {
            "ts": pa.array(np.arange(ROWS) * 1000, pa.timestamp("ms")),
            "host": pa.array([HOSTS[i] for i in rng.integers(0, len(HOSTS), ROWS)]),
            "cpu": pa.array(np.where(rng.random(ROWS) < 0.05, np.nan, cpu)),
            "n": pa.array(rng.integers(-5, 5, ROWS)),
        },
        schema=SCHEMA,
    )


@dataclass
class Cluster:
    coordinator: Coordinator
    workers: list[Worker]
    table: PartitionedTable
    whole: TableScan
    """The same rows as one table on the first worker: the reference."""


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Cluster]:
    configs = [WorkerConfig(data_dir=str(tmp_path / f"worker{i}")) for i in range(3)]
    async with AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(Worker(config=c)) for c in configs]
        urls = tuple(w.location for w in workers)
        coordinator = await stack.enter_async_context(Coordinator(StaticWorkerResolver(list(urls))))
        table = PartitionedTable(TableName.of("cpu"), TABLE_SCHEMA, ("host",), urls)
        rows = data()
        tables = await stack.enter_async_context(PartitionedTables())
        await tables.create(table)
        assert await tables.write(table, rows.slice(0, 4000)) == 4000
        assert await tables.write(table, rows.slice(4000)) == ROWS - 4000
        engine = workers[0].state.tables
        assert engine is not None
        whole_name = TableName.of("cpu_whole")
        await engine.create(whole_name, TABLE_SCHEMA)
        await engine.write([(whole_name, rows)])
        spec = TableReadSpec(whole_name.catalog, whole_name.schema, whole_name.table)
        whole = TableScan(spec, TABLE_SCHEMA.arrow, worker=urls[0])
        yield Cluster(coordinator, workers, table, whole)


def _sorted(table: pa.Table) -> list[dict[str, object]]:
    """Rows in a canonical order, NaN as a string (NaN equals nothing, itself included)."""
    rows = [
        {k: "NaN" if isinstance(v, float) and v != v else v for k, v in row.items()}
        for row in table.to_pylist()
    ]
    return sorted(rows, key=lambda row: tuple(str(v) for v in row.values()))


Query = Callable[[PlanBuilder], PlanBuilder]


async def _both(cluster: Cluster, query: Query) -> tuple[pa.Table, pa.Table]:
    partitioned = await cluster.coordinator.collect(query(plan_from(cluster.table.scan())).plan)
    whole = await cluster.coordinator.collect(query(plan_from(cluster.whole)).plan)
    return partitioned, whole


@pytest.mark.anyio
async def test_writes_are_routed_by_key(three: Cluster) -> None:
    rows = data()
    expected = three.table.route(rows)
    for index, worker in enumerate(three.workers):
        engine = worker.state.tables
        assert engine is not None
        name = three.table.partition_name(index)
        spec = TableReadSpec(name.catalog, name.schema, name.table)
        scan = TableScan(spec, TABLE_SCHEMA.arrow, worker=worker.location)
        held = await three.coordinator.collect(scan)
        assert _sorted(held) == _sorted(expected[index])
        hosts = set(held["host"].to_pylist())
        for other, part in enumerate(expected):
            if other != index:
                assert hosts.isdisjoint(part["host"].to_pylist())  # a key lives in one place
    assert sum(p.num_rows for p in expected) == ROWS


QUERIES: dict[str, Query] = {
    "everything": lambda b: b,
    "filter and projection": lambda b: b.filter(call("greater", col("cpu"), lit(50.0))).select(
        "host", "cpu"
    ),
    "grouped aggregate": lambda b: b.filter(call("less", col("n"), lit(3))).aggregate(
        [(col("host"), "host")],
        [
            agg("sum", col("cpu"), name="total"),
            agg("count", name="rows"),
            agg("max", col("n"), name="top"),
        ],
    ),
    "one key": lambda b: b.filter(call("equal", col("host"), lit("host-3"))),
    "a set of keys": lambda b: b.filter(
        call("is_in", col("host"), options=pc.SetLookupOptions(pa.array(["host-1", "host-9"])))
    ).aggregate([(col("host"), "host")], [agg("count", name="rows")]),
    "no such key": lambda b: b.filter(call("equal", col("host"), lit("nobody"))),
}


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(QUERIES))
async def test_answers_equal_the_same_table_on_one_worker(three: Cluster, name: str) -> None:
    partitioned, whole = await _both(three, QUERIES[name])
    assert partitioned.schema.equals(whole.schema)
    assert _sorted(partitioned) == _sorted(whole)
    if name != "no such key":
        assert partitioned.num_rows > 0


def _partitions_in(explained: str) -> list[str]:
    return [
        line.split("partition=")[1].split(",")[0]
        for line in explained.splitlines()
        if "partition=" in line
    ]


@pytest.mark.anyio
async def test_reads_are_pruned_and_the_plan_shows_it(three: Cluster) -> None:
    rows = data()
    routed = three.table.route(rows)
    holder = next(i for i, part in enumerate(routed) if "host-3" in part["host"].to_pylist())
    one_key = QUERIES["one key"](plan_from(three.table.scan())).plan
    explained = await three.coordinator.explain(one_key)
    assert _partitions_in(explained) == [f"{holder}/3"]
    assert f"task 0 on {three.workers[holder].location}" in explained  # run where it lives
    everything = await three.coordinator.explain(three.table.scan())
    assert sorted(_partitions_in(everything)) == ["0/3", "1/3", "2/3"]


@pytest.mark.anyio
async def test_partial_aggregates_and_filters_run_on_the_owning_workers(three: Cluster) -> None:
    plan = QUERIES["grouped aggregate"](plan_from(three.table.scan())).plan
    explained = await three.coordinator.explain(plan)
    stage_one = explained.split("Stage 2")[0]
    assert "HashAggregate(partial" in stage_one
    assert stage_one.count("predicates=[less(n") == 3  # the filter, in every partition's scan
    for worker in three.workers:
        assert f"on {worker.location}" in stage_one


@pytest.mark.anyio
async def test_a_partition_on_an_unknown_worker_is_named(three: Cluster) -> None:
    stray = PartitionedTable(TableName.of("cpu"), TABLE_SCHEMA, ("host",), ("grpc://127.0.0.1:9",))
    with pytest.raises(NotFound, match=r"grpc://127\.0\.0\.1:9"):
        await three.coordinator.collect(stray.scan())


@pytest.mark.anyio
async def test_a_coordinator_serves_it_to_any_flight_client(three: Cluster) -> None:
    """In a catalog, the partitioned table is a query like any other: pyarrow's C++ client
    reads it through the coordinator's Flight service, its filter pruned and pushed down, one
    endpoint per task, each read from the worker that holds the partition."""
    catalog = Catalog()
    catalog.table("cpu", three.table.scan, description="cpu samples, by host over 3 workers")
    urls = [worker.location for worker in three.workers]
    one_key = call("equal", col("host"), lit("host-3"))
    command = table_command("cpu", filters=[one_key], columns=["host", "n"])
    async with serve(catalog, workers=urls) as cluster:

        def read() -> tuple[pa.Table, list[str]]:
            client = fl.connect(cluster.location)
            info = client.get_flight_info(fl.FlightDescriptor.for_command(command))
            locations = [e.locations[0].uri.decode() for e in info.endpoints]
            parts = [
                fl.connect(loc).do_get(e.ticket).read_all()
                for e, loc in zip(info.endpoints, locations, strict=True)
            ]
            return pa.concat_tables(parts), locations

        got, locations = await anyio.to_thread.run_sync(read)
    rows = data()
    expected = rows.filter(pc.equal(rows["host"], "host-3")).select(["host", "n"])
    assert _sorted(got) == _sorted(expected)
    routed = three.table.route(rows)
    holder = next(i for i, p in enumerate(routed) if "host-3" in p["host"].to_pylist())
    assert locations == [three.workers[holder].location]  # the one partition that can match
