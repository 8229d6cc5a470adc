"""A ParquetScan distributed over real workers: each task reads its share of the row groups,
partial aggregates run on the workers, and the answer is DuckDB's over the same files. A
worker reads only under its --parquet-root (WorkerConfig.parquet_roots)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightfeed.errors import FlightfeedError
from flightfeed.plan import ExecutionPlan, ParquetScan, agg, call, col, lit, plan_from
from flightfeed.testing import start_cluster
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    rng = np.random.default_rng(3)
    for index in range(4):
        rows = 1000 + 250 * index
        table = pa.table(
            {
                "k": pa.array(rng.integers(0, 20, rows), pa.int64()),
                "v": pa.array(rng.integers(-50, 50, rows), pa.int64()),
            }
        )
        pq.write_table(table, root / f"part-{index}.parquet", row_group_size=400)
    return root


def query(data_dir: Path) -> ExecutionPlan:
    scan = ParquetScan.from_paths(
        str(data_dir), partitions=4, filter=call("greater", col("v"), lit(0))
    )
    return (
        plan_from(scan)
        .aggregate(["k"], [agg("sum", col("v"), name="total"), agg("count", name="n")])
        .sort("k")
        .plan
    )


async def test_a_parquet_scan_runs_on_every_worker(data_dir: Path) -> None:
    config = WorkerConfig(parquet_roots=(str(data_dir),))
    async with start_cluster(2, config=config) as (coordinator, workers):
        distributed = coordinator.plan(query(data_dir), len(workers))
        result = await coordinator.collect(query(data_dir))
        metrics = coordinator.metrics.latest
    partial, final = distributed.stages  # partial states shuffled by key to the final's task
    assert partial.task_count == 2
    assert final.task_count == 1  # a few KiB of states: one task reads the whole shuffle
    assert "KiB" in final.note
    assert partial.plan.name == "HashAggregate"  # partial, over the tasks' row groups
    assert metrics is not None
    assert {record.worker_url for record in metrics.tasks.values()} == {
        worker.location for worker in workers
    }
    expected = (
        duckdb.connect()
        .sql(
            f"SELECT k, sum(v) AS total, count(*) AS n FROM read_parquet('{data_dir}/*.parquet')"
            " WHERE v > 0 GROUP BY k ORDER BY k"
        )
        .to_arrow_table()
    )
    assert result.to_pylist() == expected.cast(result.schema).to_pylist()


async def test_a_worker_without_parquet_roots_refuses_the_scan(data_dir: Path) -> None:
    async with start_cluster(1) as (coordinator, _):
        with pytest.raises(
            FlightfeedError, match="reads no Parquet files: start it with --parquet"
        ):
            await coordinator.collect(query(data_dir))


async def test_files_of_other_layouts_answer_as_duckdb_on_every_worker(tmp_path: Path) -> None:
    """Columns in another order, a narrower type and a missing column, split over two workers:
    each task used to read its files as its first file's schema and failed INTERNAL."""
    pq.write_table(pa.table({"k": [1, 2], "v": [10, 20]}), tmp_path / "a.parquet")
    pq.write_table(
        pa.table({"v": pa.array([30, 40], pa.int32()), "k": [1, 3]}), tmp_path / "b.parquet"
    )
    pq.write_table(pa.table({"k": [3]}), tmp_path / "c.parquet")
    pq.write_table(pa.table({"v": [2**40], "k": [2]}), tmp_path / "d.parquet")
    plan = (
        plan_from(ParquetScan.from_paths(str(tmp_path), partitions=4))
        .aggregate(["k"], [agg("sum", col("v"), name="total"), agg("count", name="n")])
        .sort("k")
        .plan
    )
    config = WorkerConfig(parquet_roots=(str(tmp_path),))
    async with start_cluster(2, config=config) as (coordinator, _):
        result = await coordinator.collect(plan)
    expected = duckdb.sql(
        f"SELECT k, sum(v) AS total, count(*) AS n FROM read_parquet('{tmp_path}/*.parquet',"
        " union_by_name=true) GROUP BY k ORDER BY k"
    ).to_arrow_table()
    assert result.to_pylist() == expected.cast(result.schema).to_pylist()
