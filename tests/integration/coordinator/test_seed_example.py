"""The seed's work_unit_feed example on real workers: same rows as the one-process run."""

from __future__ import annotations

import pyarrow as pa
import pytest
from helpers.feed_scan import coordinator_session, feed_cluster

from flightfeed.errors import InvalidArgument
from flightfeed.examples.chunk_scan import scan, scan_rows
from flightfeed.plan import (
    AggregateMode,
    Coalesce,
    ExecutionPlan,
    HashAggregate,
    agg,
    col,
    collect,
    desc,
    open_task_context,
    plan_from,
    pre_order,
)

pytestmark = pytest.mark.anyio

SEED_ARGS = (2, "3,1", "2", "4", "1,1")


async def run_locally(plan: ExecutionPlan) -> pa.Table:
    async with open_task_context(coordinator_session()) as ctx:
        return await collect(plan, ctx)


def count_by_task(source: ExecutionPlan) -> ExecutionPlan:
    """SELECT count(*) AS cnt, task FROM scan(...) GROUP BY task."""
    return HashAggregate(Coalesce(source), [(col("task"), "task")], [agg("count", name="cnt")])


async def test_seed_query_matches_the_one_process_run() -> None:
    reference = (await run_locally(count_by_task(scan(*SEED_ARGS)))).sort_by("task")
    assert reference.to_pydict() == {"task": [0, 1], "cnt": [6, 6]}
    async with feed_cluster() as (coordinator, workers):
        result = await coordinator.collect(count_by_task(scan(*SEED_ARGS)))
        metrics = coordinator.metrics.latest
    assert result.sort_by("task").equals(reference)
    assert metrics is not None
    assert metrics.status == "finished"
    assert sorted(metrics.tasks) == [(1, 0), (1, 1)]
    assert {r.worker_url for r in metrics.tasks.values()} == {w.location for w in workers}


async def test_partial_aggregation_runs_on_the_workers() -> None:
    def two_phase(source: ExecutionPlan) -> ExecutionPlan:
        keys, aggregates = [(col("task"), "task")], [agg("count", name="cnt")]
        partial = HashAggregate(source, keys, aggregates, mode=AggregateMode.PARTIAL)
        return HashAggregate(Coalesce(partial), keys, aggregates, mode=AggregateMode.FINAL)

    reference = await run_locally(two_phase(scan(*SEED_ARGS)))
    async with feed_cluster() as (coordinator, _):
        distributed = coordinator.plan(two_phase(scan(*SEED_ARGS)), 2)
        result = await coordinator.collect(two_phase(scan(*SEED_ARGS)))
    assert result.sort_by("task").equals(reference.sort_by("task"))
    (stage,) = distributed.stages
    assert stage.plan.name == "HashAggregate"
    assert stage.task_count == 2


@pytest.mark.parametrize("two_phase", [False, True], ids=["single", "partial-final"])
async def test_an_aggregate_built_without_its_coalesce_still_answers_right(
    two_phase: bool,
) -> None:
    """The planner adds the Coalesce the aggregate needs (plan/distribution.py; a SINGLE one
    becomes PARTIAL below it, FINAL above), so the stage below still runs on the workers; the
    answer is the one-process run's, not a group per partition."""
    keys, aggregates = [(col("task"), "task")], [agg("count", name="cnt")]

    def forgetful(source: ExecutionPlan) -> ExecutionPlan:
        if not two_phase:
            return HashAggregate(source, keys, aggregates)
        partial = HashAggregate(source, keys, aggregates, mode=AggregateMode.PARTIAL)
        return HashAggregate(partial, keys, aggregates, mode=AggregateMode.FINAL)

    reference = await run_locally(count_by_task(scan(*SEED_ARGS)))
    async with feed_cluster() as (coordinator, _):
        distributed = coordinator.plan(forgetful(scan(*SEED_ARGS)), 2)
        result = await coordinator.collect(forgetful(scan(*SEED_ARGS)))
    assert result.sort_by("task").equals(reference.sort_by("task"))
    # Partial states are shuffled by key to the final aggregate's tasks, both on the workers.
    assert distributed.root.name == "NetworkCoalesce"
    partial, final = distributed.stages
    assert partial.task_count == 2
    assert final.task_count == 2
    assert partial.plan.name == "HashAggregate"
    assert [final.plan.name, final.plan.children[0].name] == ["HashAggregate", "NetworkShuffle"]


async def test_a_built_plan_runs_distributed_as_in_one_process() -> None:
    """The plan builder's chain, planned: partial aggregation on the workers' tasks, final,
    sort and limit above; the rows of the one-process run of the same chain."""

    def built() -> ExecutionPlan:
        return (
            plan_from(scan(*SEED_ARGS))
            .aggregate(["partition"], [agg("count", name="cnt"), agg("max", col("task"), name="t")])
            .sort(desc("cnt"), "partition")
            .limit(1)
            .plan
        )

    reference = await run_locally(built())
    async with feed_cluster() as (coordinator, _):
        distributed = coordinator.plan(built(), 2)
        result = await coordinator.collect(built())
    assert result.to_pylist() == reference.to_pylist()
    assert reference.to_pylist() == [{"partition": 0, "cnt": 8, "t": 1}]
    partial, final = distributed.stages  # partial states shuffled by key to the final's tasks
    assert (partial.plan.name, partial.task_count) == ("HashAggregate", 2)
    assert "NetworkShuffle" in [node.name for node in pre_order(final.plan)]
    assert final.task_count == 2


@pytest.mark.parametrize(("tasks", "workers"), [(1, 1), (2, 3), (4, 2), (8, 3)])
async def test_plain_scan_over_several_tasks_and_workers(tasks: int, workers: int) -> None:
    partitions = [f"{p % 3 + 1},{p % 5}" for p in range(8)]
    plan = Coalesce(scan(tasks, *partitions))
    expected = scan_rows(tasks, *partitions).sort_by(
        [("task", "ascending"), ("partition", "ascending")]
    )
    assert (
        (await run_locally(plan))
        .sort_by([("task", "ascending"), ("partition", "ascending")])
        .equals(expected)
    )
    async with feed_cluster(workers) as (coordinator, found):
        result = await coordinator.collect(plan)
        metrics = coordinator.metrics.latest
    assert result.sort_by([("task", "ascending"), ("partition", "ascending")]).equals(expected)
    assert metrics is not None
    assert len(metrics.tasks) == tasks
    assert {r.worker_url for r in metrics.tasks.values()} == {
        w.location for w in found[: min(tasks, workers)]
    }


async def test_a_plan_without_an_exchange_still_runs_its_leaves_on_the_workers() -> None:
    plan = scan(*SEED_ARGS)  # no Coalesce above the leaf: the tasks' outputs are the result
    async with feed_cluster() as (coordinator, workers):
        (stage,) = coordinator.plan(plan, 2).stages
        result = await coordinator.collect(plan)
        metrics = coordinator.metrics.latest
    assert result.sort_by([("task", "ascending"), ("partition", "ascending")]).equals(
        scan_rows(*SEED_ARGS)
    )
    assert stage.task_count == 2
    assert metrics is not None
    assert {record.worker_url for record in metrics.tasks.values()} == {
        worker.location for worker in workers
    }


async def test_the_distributed_plan_display_shows_stages_tasks_and_workers() -> None:
    async with feed_cluster() as (coordinator, workers):
        text = await coordinator.explain(count_by_task(scan(*SEED_ARGS)))
    assert "NetworkCoalesce(stage=1, tasks=2, partitions_per_task=2)" in text
    assert "Stage 1: 2 tasks (RemoteScan: desired 2), 2 output partitions per task" in text
    for task, worker in enumerate(workers):
        assert f"task {task} on {worker.location}, feed " in text
        assert f"partitions {2 * task}..{2 * task + 1}" in text
    assert "RemoteScan(tasks=2, partitions=2, chunks=[[3, 1], [2], [4], [1, 1]])" in text


async def test_the_distributed_plan_as_graphviz_dot() -> None:
    async with feed_cluster() as (coordinator, workers):
        dot = await coordinator.explain(count_by_task(scan(*SEED_ARGS)), dot=True)
    assert dot.startswith("digraph distributed_plan {")
    assert dot.endswith("}\n")
    assert "subgraph cluster_stage_1 {" in dot
    for task, worker in enumerate(workers):
        assert f"\\ntask {task} on {worker.location}" in dot
    assert '[label="2 tasks", style=bold];' in dot  # the stage feeds its NetworkCoalesce


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2, "3,1", "2", "4"), r"partition count \(3\) must be a non-zero multiple of task_count"),
        ((0, "1"), r"partition count \(1\) must be a non-zero multiple of task_count \(0\)"),
        ((2, "3,x"), "invalid chunk size 'x': not an integer"),
        ((1, "-1"), "invalid chunk size '-1': must not be negative"),
        ((1, "1_000"), "'1_000': not an integer"),  # (Python's int() takes these two)
        ((1, "\u0663"), "not an integer"),
        # (before: 2**32 grew a coordinator to 19 GB; 2**63 failed INTERNAL, OverflowError;
        # 2**64 + 5 read back as 5 rows)
        ((1, "1000001"), "'1000001': at most 1,000,000 rows a chunk"),
        ((1, str(2**32)), "at most 1,000,000 rows a chunk"),
        ((1, str(2**63)), "at most 1,000,000 rows a chunk"),
        ((1, str(2**64 + 5)), "at most 1,000,000 rows a chunk"),
        ((1, "9" * 4000), "at most 1,000,000 rows a chunk"),
        ((2,), r"scan\(task_count, partitions...\) needs at least 2 arguments"),
        (("2", "1", "1"), "task_count must be an integer literal"),
    ],
)
def test_invalid_arguments_fail_as_in_the_reference(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        scan(*args)  # type: ignore[arg-type]


def test_partitions_are_numbered_within_their_task_as_in_the_reference() -> None:
    rows = scan_rows(*SEED_ARGS).group_by(["task", "partition"]).aggregate([([], "count_all")])
    counts = {(t, p): n for t, p, n in zip(*rows.to_pydict().values(), strict=True)}
    assert counts == {(0, 0): 4, (0, 1): 2, (1, 0): 4, (1, 1): 2}
