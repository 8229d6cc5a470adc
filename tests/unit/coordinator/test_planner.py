"""Distributed planning rules: where stages are cut, how many tasks, which partitions each
task owns, and when a stage must stay one task to keep its result right."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pytest
from helpers.feed_scan import ESTIMATORS, coordinator_options, feed_registry
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.coordinator import (
    Coordinator,
    DistributedPlanner,
    NetworkBroadcast,
    NetworkCoalesce,
    NetworkShuffle,
    StaticWorkerResolver,
    TaskEstimation,
    TaskEstimator,
    TaskEstimators,
    format_distributed_plan,
)
from flightfeed.coordinator.planner import DEFAULT_SHUFFLE_BYTES_PER_TASK
from flightfeed.errors import InvalidArgument, NotFound
from flightfeed.examples.chunk_scan import SCAN_SCHEMA, RemoteScan, scan
from flightfeed.feeds import WorkUnitFeed
from flightfeed.plan import (
    Coalesce,
    ExecutionPlan,
    Filter,
    HashJoin,
    Limit,
    MemoryScan,
    Partitioning,
    Repartition,
    Union,
    agg,
    call,
    col,
    lit,
    plan_from,
    pre_order,
    unwrap,
)
from flightfeed.plan.nodes import IsolatedUnion
from flightfeed.testing.feeds import UnitProvider, UnitScan, UnitScanEstimator, unit_scan


def planner(estimators: Mapping[str | type, TaskEstimator] | None = None) -> DistributedPlanner:
    chosen = estimators if estimators is not None else ESTIMATORS
    return DistributedPlanner(feed_registry=feed_registry(), estimators=TaskEstimators(chosen))


def kinds(plan: ExecutionPlan) -> list[str]:
    return [node.name for node in pre_order(plan)]


def eight() -> RemoteScan:
    return scan(4, *(["1"] * 8))


def test_the_lowest_coalesce_is_the_boundary_and_what_needs_all_rows_stays_local() -> None:
    plan = Limit(
        Coalesce(Limit(Coalesce(Filter(eight(), call("greater_equal", col("task"), lit(0)))), 5)), 3
    )
    distributed = planner().plan(plan, workers=2)
    assert kinds(distributed.root) == ["Limit", "Coalesce", "Limit", "Coalesce", "NetworkCoalesce"]
    (stage,) = distributed.stages
    assert kinds(stage.plan) == ["Filter", "RemoteScan"]
    assert stage.task_count == 4
    assert stage.partitions_per_task == 2
    feeds = [next(iter(t.feeds.values())).partitions for t in stage.tasks]
    assert [list(p) for p in feeds] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize(
    ("estimation", "workers", "partitions", "tasks"),
    [
        (TaskEstimation.desired(4), 2, 8, 4),  # desired: more tasks than workers is fine
        (TaskEstimation.maximum(8), 3, 12, 3),  # a maximum is capped by the workers
        (TaskEstimation.maximum(8), 3, 8, 2),  # ... and lowered to divide the partitions
        (TaskEstimation.desired(16), 2, 8, 8),  # never more tasks than partitions
        (TaskEstimation.desired(3), 2, 7, 1),
    ],
)
def test_task_count(estimation: TaskEstimation, workers: int, partitions: int, tasks: int) -> None:
    class Fixed(UnitScanEstimator):
        def task_estimation(self, plan: ExecutionPlan, /) -> TaskEstimation | None:
            return estimation

    plan = Coalesce(unit_scan(UnitProvider([1] * partitions)))
    (stage,) = planner({UnitScan: Fixed()}).plan(plan, workers).stages
    assert stage.task_count == tasks
    assert stage.partitions_per_task * tasks == partitions


def test_a_feed_leaf_without_an_estimator_runs_as_one_task_with_all_its_partitions() -> None:
    plan = Coalesce(unit_scan(UnitProvider([1] * 5)))
    (stage,) = planner({}).plan(plan, workers=3).stages
    assert stage.task_count == 1
    (assignment,) = stage.tasks[0].feeds.values()
    assert list(assignment.partitions) == [0, 1, 2, 3, 4]
    assert "feed without a task estimation" in stage.note


def one_row() -> MemoryScan:
    table = pa.table([pa.array([9], pa.int64()), pa.array([9], pa.int64())], schema=SCAN_SCHEMA)
    return MemoryScan.from_table(table)


def build_side(partitions: int = 1) -> MemoryScan:
    return MemoryScan.from_table(pa.table({"l_task": pa.array([0, 1], pa.int64())}), partitions)


def test_a_leaf_that_cannot_be_split_keeps_its_stage_in_one_task() -> None:
    plan = Coalesce(HashJoin(build_side(), eight(), [("l_task", "task")]))
    (stage,) = planner().plan(plan, workers=4).stages
    assert stage.task_count == 1  # else every task would read the MemoryScan again
    assert "MemoryScan cannot be split" in stage.note


def test_a_union_runs_its_inputs_on_tasks_of_their_own() -> None:
    """The MemoryScan cannot be split, so splitting every input alike gives one task; apart,
    the feed takes two tasks (of the four workers' budget, less the MemoryScan's one) and the
    MemoryScan its own, each task declaring only its own input's feed partitions."""
    plan = Coalesce(Filter(Union([eight(), one_row()]), call("greater", col("task"), lit(-1))))
    (stage,) = planner().plan(plan, workers=4).stages
    assert kinds(stage.plan) == ["Filter", "IsolatedUnion", "RemoteScan", "MemoryScan"]
    assert stage.task_count == 3
    assert stage.partitions_per_task == 4  # the feed's 8 partitions over its 2 tasks
    assert "tasks 0..1: RemoteScan" in stage.note
    assert "task 2: no leaf that splits" in stage.note
    owned = [[list(a.partitions) for a in task.feeds.values()] for task in stage.tasks]
    assert owned == [[[0, 1, 2, 3]], [[4, 5, 6, 7]], []]


def test_a_feed_read_twice_by_one_task_is_refused_naming_the_way_out() -> None:
    """Its worker would give the feed's partitions one reader, and fail the query when the
    second use asked ("already has a consumer"); as two inputs of a union, each use gets tasks
    of its own instead."""
    feed = eight()
    joined = HashJoin(feed, feed, [("task", "task")], "right semi")
    with pytest.raises(InvalidArgument, match=r"is read twice by one task .* create the node"):
        planner().plan_on_workers(joined, workers=2)
    (stage,) = planner().plan(Coalesce(Union([feed, feed])), workers=2).stages
    assert kinds(stage.plan)[0] == "IsolatedUnion"
    owned = [[list(a.partitions) for a in task.feeds.values()] for task in stage.tasks]
    assert owned == [[list(range(8))], [list(range(8))]]


def test_union_inputs_that_fill_the_workers_are_not_set_apart() -> None:
    (stage,) = planner().plan(Coalesce(Union([eight(), eight()])), workers=4).stages
    assert kinds(stage.plan)[:1] == ["Union"]  # each input on all 4 tasks already
    assert stage.task_count == 4


def test_a_repartition_over_distributable_leaves_is_a_shuffle_between_stages() -> None:
    plan = Coalesce(Repartition(eight(), Partitioning((col("task"),), 4)))
    distributed = planner().plan(plan, workers=4)
    scans, shuffled = distributed.stages
    assert kinds(distributed.root) == ["Coalesce", "NetworkCoalesce"]
    assert kinds(shuffled.plan) == ["NetworkShuffle"]
    assert shuffled.task_count == 4
    assert shuffled.partitions_per_task == 1
    reader = shuffled.plan
    assert isinstance(reader, NetworkShuffle)
    assert reader.source.stage_id == scans.stage_id
    assert reader.consumer_tasks == 4
    assert "NetworkShuffle: 4 buckets" in shuffled.note


def test_a_node_that_mixes_partitions_keeps_its_stage_in_one_task() -> None:
    local = Repartition(build_side(2), Partitioning((col("l_task"),), 2))
    plan = Coalesce(HashJoin(local, eight(), [("l_task", "task")]))
    (stage,) = planner().plan(plan, workers=4).stages
    assert stage.task_count == 1
    assert "Repartition mixes partitions" in stage.note


def test_plans_without_distributable_leaves_have_no_stage() -> None:
    table = pa.table({"x": [1, 2, 3]})
    plan = Coalesce(MemoryScan.from_table(table, 3))
    distributed = planner().plan(plan, workers=2)
    assert not distributed.stages
    assert distributed.root is plan
    assert format_distributed_plan(distributed).startswith("Coordinator\n  Coalesce")


def test_a_scale_up_with_the_wrong_partition_count_is_refused() -> None:
    class Wrong(UnitScanEstimator):
        def scale_up_leaf_node(self, plan: ExecutionPlan, task_count: int, /) -> ExecutionPlan:
            assert isinstance(plan, UnitScan)
            return UnitScan(plan.feed, 1, plan.total_partitions)

    plan = Coalesce(unit_scan(UnitProvider([1] * 4)))
    with pytest.raises(InvalidArgument, match="must own 2"):
        planner({UnitScan: Wrong(2)}).plan(plan, workers=2)


def test_a_remote_feed_handle_cannot_be_distributed() -> None:
    remote = WorkUnitFeed.from_proto(eight().feed.to_proto(), bytes)
    plan = Coalesce(UnitScan(remote, 2))
    with pytest.raises(InvalidArgument, match="remote handle"):
        planner({UnitScan: UnitScanEstimator()}).plan(plan, workers=1)


@pytest.mark.anyio
async def test_a_distributed_plan_without_workers_fails_clearly() -> None:
    async with Coordinator(StaticWorkerResolver([]), **coordinator_options()) as coordinator:
        with pytest.raises(NotFound, match="no workers"):
            await coordinator.collect(Coalesce(eight()))
    assert isinstance(planner().plan(Coalesce(eight()), 1).root.children[0], NetworkCoalesce)


def test_max_tasks_per_stage_caps_every_stage() -> None:
    capped = DistributedPlanner(
        feed_registry=feed_registry(), estimators=TaskEstimators(ESTIMATORS), max_tasks_per_stage=2
    )
    plan = Coalesce(Repartition(eight(), Partitioning((col("task"),), 8)))
    scans, shuffled = capped.plan(plan, workers=4).stages
    assert (scans.task_count, shuffled.task_count) == (2, 2)
    assert shuffled.partitions_per_task == 4  # 8 buckets over 2 tasks
    with pytest.raises(InvalidArgument, match="max_tasks_per_stage must be at least 1"):
        DistributedPlanner(max_tasks_per_stage=0)


@pytest.mark.parametrize(
    ("input_bytes", "bytes_per_task", "tasks"),
    [
        (None, DEFAULT_SHUFFLE_BYTES_PER_TASK, 4),  # size unknown: a task per worker
        (1024, DEFAULT_SHUFFLE_BYTES_PER_TASK, 1),  # small: one task reads every bucket
        (100 << 20, DEFAULT_SHUFFLE_BYTES_PER_TASK, 2),  # two tasks' worth
        (1 << 30, DEFAULT_SHUFFLE_BYTES_PER_TASK, 4),  # more than the workers: capped by them
        (1024, 256, 4),  # a smaller share per task
    ],
)
def test_a_shuffle_is_read_by_a_task_per_share_of_its_estimated_input(
    input_bytes: int | None, bytes_per_task: int, tasks: int
) -> None:
    leaf = eight()
    if input_bytes is not None:
        # A statistic this kind of leaf does not declare (plan/statistics.py reads it if set):
        leaf.estimated_bytes = input_bytes  # type: ignore[attr-defined]
    chosen = DistributedPlanner(
        feed_registry=feed_registry(),
        estimators=TaskEstimators(ESTIMATORS),
        shuffle_bytes_per_task=bytes_per_task,
    )
    plan = Coalesce(Repartition(leaf, Partitioning((col("task"),), 4)))
    scans, shuffled = chosen.plan(plan, workers=4).stages
    assert scans.task_count == 4  # the producers are the leaf's business
    assert shuffled.task_count == tasks
    assert shuffled.partitions_per_task * tasks == 4
    assert ("MiB" in shuffled.note or "KiB" in shuffled.note) == (input_bytes is not None)
    with pytest.raises(InvalidArgument, match="shuffle_bytes_per_task must be at least 1"):
        DistributedPlanner(shuffle_bytes_per_task=0)


def shapes() -> st.SearchStrategy[ExecutionPlan]:
    """Plans of the feed's schema: feeds split into tasks, a leaf that cannot be split, and
    what reads an input whole (Coalesce, a limit over one, a collect-left join's build side)."""
    leaves = st.sampled_from([eight, lambda: scan(2, "1", "1"), one_row]).map(lambda make: make())

    def above(inner: st.SearchStrategy[ExecutionPlan]) -> st.SearchStrategy[ExecutionPlan]:
        alike = st.lists(inner, min_size=2, max_size=3).filter(
            lambda inputs: all(i.schema.equals(inputs[0].schema) for i in inputs)
        )
        return st.one_of(
            inner.map(Coalesce),
            inner.map(lambda plan: Limit(Coalesce(plan), 2)),
            alike.map(Union),
            st.tuples(inner, inner).map(
                lambda sides: HashJoin(*sides, [("task", "task")], "right semi")
            ),
        )

    return st.recursive(leaves, above, max_leaves=6)


def rows_lost_or_repeated(node: ExecutionPlan, tasks: int) -> list[str]:
    """What makes `tasks` > 1 tasks of a stage lose or repeat rows: a network reader read whole
    outside a collect-left join's build side (every task passes it on), or a build side split
    across the tasks (each joins its share only). An IsolatedUnion runs each input on its own
    tasks."""
    node = unwrap(node)
    if tasks == 1:
        return []
    if isinstance(node, NetworkBroadcast | NetworkCoalesce):
        return [f"{node} read whole by {tasks} tasks"]
    if isinstance(node, HashJoin) and node.collect_left:
        build, probe = node.children
        split = [leaf for leaf in pre_order(build) if not leaf.children]
        split = [leaf for leaf in split if not isinstance(leaf, NetworkBroadcast | NetworkCoalesce)]
        return [f"build side {leaf} split across {tasks} tasks" for leaf in split] + (
            rows_lost_or_repeated(probe, tasks)
        )
    if isinstance(node, IsolatedUnion):
        return [
            found
            for child, span in zip(node.children, node.spans, strict=True)
            for found in rows_lost_or_repeated(child, span.count)
        ]
    return [found for child in node.children for found in rows_lost_or_repeated(child, tasks)]


@settings(max_examples=300, deadline=None)
@given(plan=shapes(), workers=st.integers(1, 4), on_workers=st.booleans())
def test_no_stage_of_several_tasks_loses_or_repeats_rows(
    plan: ExecutionPlan, workers: int, on_workers: bool
) -> None:
    """Every task of a stage passes on what it reads whole, so the stage's reader would get
    those rows once per task, except where a join matches them with the task's own share of
    its probe side; and a join's build side split across tasks would match each probe row with
    one task's share of it. Planned as the coordinator runs a query, and as `hold` does (the
    whole plan on the workers)."""
    if on_workers:
        distributed = planner().plan_on_workers(plan, workers=workers)
    else:
        distributed = planner().plan(Coalesce(plan), workers=workers)
    for stage in distributed.stages:
        found = rows_lost_or_repeated(stage.plan, stage.task_count)
        assert found == [], format_distributed_plan(distributed)


def test_an_aggregate_over_a_union_of_one_partition_does_not_run_once_per_input() -> None:
    """As the coordinator plans it and as `hold` does: the union's inputs on tasks of their own
    ran the aggregate above them once per task (a count of 0 beside the real one)."""
    estimators = {**ESTIMATORS, "UnitScan": UnitScanEstimator(1)}
    empty, five = unit_scan(UnitProvider([])), unit_scan(UnitProvider([5]))
    plan = plan_from(Union([empty, five])).aggregate([], [agg("count", name="n")]).plan
    for distributed in (
        planner(estimators).plan(plan, workers=2),
        planner(estimators).plan_on_workers(plan, workers=2),
    ):
        assert all("IsolatedUnion" not in kinds(stage.plan) for stage in distributed.stages)


def test_a_plan_of_no_partitions_is_held_as_one_endpoint_without_rows() -> None:
    """hold refused it: "partitions per task must be in [1, 4096], got 0" (found by a probe),
    where the coordinator's own run of it gives no rows."""
    estimators = {**ESTIMATORS, "UnitScan": UnitScanEstimator(1)}
    (stage,) = planner(estimators).plan_on_workers(unit_scan(UnitProvider([])), workers=2).stages
    assert (stage.task_count, stage.partitions_per_task) == (1, 1)
    assert kinds(stage.plan) == ["Coalesce", "UnitScan"]
