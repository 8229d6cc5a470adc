"""Stages reading stages on real workers: shuffled aggregations, shuffled and broadcast joins of
every join type with duplicate and null keys, each against the same plan run in one process.

The data is Parquet under the workers' root (a distributable leaf), written per test from
hypothesis-drawn keys; each query runs on two gRPC workers, and the explain output proves the
shape (a NetworkShuffle or NetworkBroadcast stage split over both workers).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightfeed.coordinator import Coordinator
from flightfeed.errors import FlightfeedError
from flightfeed.plan import (
    ExecutionPlan,
    ParquetScan,
    PlanBuilder,
    agg,
    call,
    col,
    collect,
    lit,
    open_task_context,
    plan_from,
    pre_order,
)
from flightfeed.plan.nodes.hash_join import JOIN_TYPES
from flightfeed.plan.statistics import estimated_bytes
from flightfeed.session import Session
from flightfeed.testing import start_cluster, wait_for_no_tasks
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio


def write_table(root: Path, name: str, keys: list[int | None], files: int = 2) -> Path:
    """`keys` (duplicates and nulls welcome) with a row number, over `files` Parquet files."""
    folder = root / name
    folder.mkdir()
    table = pa.table(
        {
            f"{name}_key": pa.array(keys, pa.int64()),
            f"{name}_row": pa.array(range(len(keys)), pa.int64()),
        }
    )
    per_file = -(-len(keys) // files)
    for index in range(files):
        pq.write_table(table.slice(index * per_file, per_file), folder / f"{index}.parquet")
    return folder


def scan(folder: Path) -> PlanBuilder:
    return plan_from(ParquetScan.from_paths(str(folder), partitions=2))


async def one_process(plan: ExecutionPlan) -> pa.Table:
    async with open_task_context(Session()) as ctx:
        return await collect(plan, ctx)


def rows(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(
        (tuple(row.values()) for row in table.to_pylist()),
        key=lambda row: tuple((value is None, value) for value in row),
    )


@asynccontextmanager
async def cluster(root: Path, broadcast_threshold_bytes: int = 0) -> AsyncIterator[Coordinator]:
    """Two workers reading `root`; small build sides are not broadcast unless asked, and
    every shuffle is read by a task per worker however small (the tables here are all small:
    the shuffles are the subject)."""
    config = WorkerConfig(parquet_roots=(os.fspath(root),))
    async with start_cluster(
        2,
        config=config,
        broadcast_threshold_bytes=broadcast_threshold_bytes,
        shuffle_bytes_per_task=1,
    ) as (coordinator, _):
        yield coordinator


def stage_lines(text: str, marker: str) -> list[str]:
    """The header and task lines of the stage whose plan holds `marker`."""
    stages = text.split("\nStage ")[1:]
    (stage,) = [s for s in stages if marker in s]
    return stage.splitlines()


LEFT_KEYS = [1, 1, 2, None, 3, 5, 5, 5, None, 8, 9, 10, 11, 1]
RIGHT_KEYS = [1, 2, 2, None, 4, 5, None, 8, 8, 12, 1, 3]


@pytest.mark.parametrize("how", list(JOIN_TYPES))
async def test_a_shuffled_join_of_every_type_matches_one_process(tmp_path: Path, how: str) -> None:
    left, right = write_table(tmp_path, "l", LEFT_KEYS), write_table(tmp_path, "r", RIGHT_KEYS)

    def built() -> ExecutionPlan:
        return scan(left).join(scan(right), [("l_key", "r_key")], how, strategy="shuffle").plan

    expected = rows(await one_process(built()))
    async with cluster(tmp_path) as coordinator:
        text = await coordinator.explain(built())
        got = rows(await coordinator.collect(built()))
    assert got == expected
    header, *tasks = stage_lines(text, "HashJoin")[:3]
    assert "2 tasks (NetworkShuffle: 2 buckets of ~0.5 KiB, NetworkShuffle: 2 buckets of" in header
    assert len({line.split(" on ")[1] for line in tasks}) == 2  # on both workers
    assert text.count("NetworkShuffle(") == 2  # each side shuffled by its key


@pytest.mark.parametrize("how", ["inner", "right outer", "right semi", "right anti"])
async def test_a_broadcast_join_sends_the_build_side_to_every_task(
    tmp_path: Path, how: str
) -> None:
    small, large = (
        write_table(tmp_path, "s", [1, 2, 2, None, 7]),
        write_table(tmp_path, "b", [k % 9 if k % 5 else None for k in range(300)], files=4),
    )

    def built() -> ExecutionPlan:
        return scan(small).join(scan(large), [("s_key", "b_key")], how).plan

    expected = rows(await one_process(built()))
    async with cluster(tmp_path) as coordinator:
        text = await coordinator.explain(built())
        got = rows(await coordinator.collect(built()))
    assert got == expected
    header = stage_lines(text, "HashJoin")[0]
    assert header.startswith("2: 2 tasks (ParquetScan")  # the large side stays split
    assert "NetworkBroadcast(stage=1, tasks=2, consumer_tasks=2)" in text


async def test_a_shuffled_aggregate_finishes_groups_on_both_workers(tmp_path: Path) -> None:
    keys = [k % 37 if k % 11 else None for k in range(5000)]
    data = write_table(tmp_path, "t", keys, files=4)

    def built() -> ExecutionPlan:
        aggregates = [agg("count", name="n"), agg("sum", col("t_row"), name="s")]
        return scan(data).aggregate(["t_key"], aggregates).plan

    expected = rows(await one_process(built()))
    async with cluster(tmp_path) as coordinator:
        text = await coordinator.explain(built())
        got = rows(await coordinator.collect(built()))
    assert got == expected
    assert len(got) == 38  # 37 keys and the null group, each once
    header, *tasks = stage_lines(text, "HashAggregate(final")[:3]
    assert "2 tasks (NetworkShuffle: 2 buckets of ~51.9 KiB)" in header
    assert len({line.split(" on ")[1] for line in tasks}) == 2


async def test_count_distinct_groups_twice_across_the_workers(tmp_path: Path) -> None:
    keys = [k % 7 if k % 13 else None for k in range(3000)]
    data = write_table(tmp_path, "t", keys, files=4)

    def built() -> ExecutionPlan:
        # per key, how many of the 50 values of t_row % 50 its rows have
        return (
            scan(data)
            .select("t_key", (call("modulo", col("t_row"), lit(50)), "bucket"))
            .aggregate(["t_key"], [agg("count_distinct", col("bucket"), name="buckets")])
            .plan
        )

    expected = rows(await one_process(built()))
    async with cluster(tmp_path) as coordinator:
        text = await coordinator.explain(built())
        got = rows(await coordinator.collect(built()))
    assert got == expected
    assert len(got) == 8  # 7 keys and the null group
    assert text.count("NetworkShuffle(") == 2  # distinct pairs, then the counts


@pytest.mark.parametrize("how", ["inner", "right outer", "right semi", "right anti", "left outer"])
async def test_a_small_build_side_of_a_shuffled_join_is_broadcast_instead(
    tmp_path: Path, how: str
) -> None:
    """The planner broadcasts a build side its footers say is small, rather than shuffle the
    large side; a join type that must see every right row in one place stays shuffled."""
    small, large = (
        write_table(tmp_path, "s", [1, 2, 2, None, 7]),
        write_table(tmp_path, "b", [k % 9 if k % 5 else None for k in range(300)], files=4),
    )

    def built() -> ExecutionPlan:
        joined = scan(small).join(scan(large), [("s_key", "b_key")], how, strategy="shuffle")
        return joined.plan

    expected = rows(await one_process(built()))
    async with cluster(tmp_path, broadcast_threshold_bytes=1 << 20) as coordinator:
        text = await coordinator.explain(built())
        got = rows(await coordinator.collect(built()))
    assert got == expected
    if how == "left outer":
        assert text.count("NetworkShuffle(") == 2
    else:
        assert "NetworkShuffle(" not in text
        assert "NetworkBroadcast(" in text
        assert "collect_left" in text


async def test_a_build_side_aggregated_to_one_row_is_broadcast(tmp_path: Path) -> None:
    """An aggregate's output is estimated from its own rows and columns, not its input's: the
    largest key of a table over the threshold is one row, so the join broadcasts it instead of
    shuffling both sides (it was shuffled while an aggregate counted at its input's size)."""
    large = write_table(tmp_path, "b", [k % 1000 for k in range(100_000)], files=4)
    small = write_table(tmp_path, "s", [1, 999, 999, None, 7])

    def built() -> ExecutionPlan:
        top = scan(large).aggregate([], [agg("max", col("b_key"), name="top")])
        return top.join(scan(small), [("top", "s_key")], strategy="shuffle").plan

    threshold = 1 << 20
    large_bytes = estimated_bytes(ParquetScan.from_paths(str(large)))
    assert large_bytes is not None
    assert large_bytes > threshold
    expected = rows(await one_process(built()))
    assert [row[1] for row in expected] == [999, 999]
    async with cluster(tmp_path, broadcast_threshold_bytes=threshold) as coordinator:
        text = await coordinator.explain(built())
        got = rows(await coordinator.collect(built()))
    assert got == expected
    assert "NetworkShuffle(" not in text
    assert "NetworkBroadcast(" in text


async def test_a_subtree_on_both_sides_of_a_shuffled_join_is_planned_once_per_side(
    tmp_path: Path,
) -> None:
    """One builder used twice (TPC-H Q18's lineitem: aggregated on one side, joined on the
    other) makes a plan that is a DAG. Each use gets stages of its own, so the table is read
    twice, and neither side's shuffle waits for the other's reader: one shuffle read by both
    sides would have to buffer the side the join reads last without bound (the deadlock the
    reference system met under bounded queues). Under one-batch buffers it finishes, with
    the answer of one process, in three stages: the aggregate's shuffle serves the join."""
    data = write_table(tmp_path, "t", [k % 50 for k in range(2000)], files=4)
    shared = scan(data)

    def built() -> ExecutionPlan:
        big = shared.aggregate(["t_key"], [agg("sum", col("t_row"), name="total")]).filter(
            call("greater", col("total"), lit(40_000))
        )
        joined = big.join(shared, [("t_key", "t_key")], "right semi", strategy="shuffle")
        return joined.aggregate([], [agg("count", name="n")]).plan

    expected = rows(await one_process(built()))
    (count,) = expected[0]
    assert isinstance(count, int)
    assert 0 < count < 2000  # (some keys pass the filter, not all)
    config = WorkerConfig(parquet_roots=(os.fspath(tmp_path),), consumer_buffer_batches=1)
    async with start_cluster(
        2, config=config, shuffle_bytes_per_task=1, broadcast_threshold_bytes=0
    ) as (coordinator, _):
        text = await coordinator.explain(built())
        with anyio.fail_after(60):
            got = rows(await coordinator.collect(built()))
    assert got == expected
    assert text.count("ParquetScan(") == 2  # the table, read by each use
    join = next(line for line in text.splitlines() if "HashJoin(right semi" in line)
    assert "partitioned" in join
    # The aggregate's groups are split on the join's key already: the join runs in the
    # aggregate's stage, over its shuffle and one of the other use's scan.
    below = text.split(join)[1].splitlines()[1:]
    assert below[0].strip().startswith("Filter(")
    assert "HashAggregate(final" in below[1]
    assert text.count("NetworkShuffle(") == 2
    assert "Stage 4" not in text


async def test_a_worker_reads_only_from_its_listed_peers(tmp_path: Path) -> None:
    """With `peers` set, a worker refuses to connect where a plan points it unless the URL is
    listed (or its own): the shuffle's read of the other worker fails, clearly, and the
    workers keep serving a query that needs no peer."""
    data = write_table(tmp_path, "t", list(range(40)), files=4)
    config = WorkerConfig(parquet_roots=(os.fspath(tmp_path),), peers=frozenset())

    def shuffled() -> ExecutionPlan:
        return scan(data).aggregate(["t_key"], [agg("count", name="n")]).plan

    async with start_cluster(2, config=config) as (coordinator, workers):
        with pytest.raises(FlightfeedError, match="not one of this worker's peers"):
            await coordinator.collect(shuffled())
        await wait_for_no_tasks(workers)
        alone = await coordinator.collect(scan(data).plan)  # no worker reads another
    assert alone.num_rows == 40


async def test_a_worker_reads_the_tasks_it_hosts_without_the_network(tmp_path: Path) -> None:
    """One worker runs both sides of a shuffle: its consumer task reads the producer through
    the worker's own handlers, so the only calls on its port are the coordinator's (a channel
    per task, and the result read)."""
    data = write_table(tmp_path, "t", list(range(100)), files=2)

    def shuffled() -> ExecutionPlan:
        return scan(data).repartition("t_key", partitions=2).plan

    config = WorkerConfig(parquet_roots=(os.fspath(tmp_path),))
    async with start_cluster(1, config=config) as (coordinator, (worker,)):
        await coordinator.collect(scan(data).plan)  # connected and version-checked
        stages = coordinator.plan(shuffled(), 1).stages
        before = worker.state.calls.total
        result = await coordinator.collect(shuffled())
        calls = worker.state.calls.total - before
    assert result.num_rows == 100
    assert [stage.task_count for stage in stages] == [1, 1]
    assert "NetworkShuffle" in [node.name for node in pre_order(stages[1].plan)]
    assert calls == 2 + 1  # two task channels and the coordinator's ExecuteTask, no other
