"""The reference system's work-unit feed suite, one test per case, on two real workers: each
distributed result is the same plan's result in one process (chunk_scan's feed, whose rows say
which task and partition made them), and the plan shape is checked where the case is about it.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pyarrow as pa
import pytest
from helpers.feed_scan import ESTIMATORS, coordinator_session, feed_cluster

from flightfeed.errors import FeedError
from flightfeed.examples.chunk_scan import SCAN_SCHEMA, scan
from flightfeed.plan import (
    Coalesce,
    ExecutionPlan,
    HashJoin,
    MemoryScan,
    Union,
    agg,
    col,
    collect,
    open_task_context,
    plan_from,
)
from flightfeed.plan.distribution import enforce_distribution
from flightfeed.testing import wait_for_no_tasks
from flightfeed.testing.feeds import UnitProvider, UnitScanEstimator, unit_scan

pytestmark = pytest.mark.anyio


async def one_process(plan: ExecutionPlan) -> pa.Table:
    async with open_task_context(coordinator_session()) as ctx:
        return await collect(plan, ctx)


def rows(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


async def check(
    build: Callable[[], ExecutionPlan], *, expect_rows: int | None = None, estimate: int = 2
) -> str:
    """Run `build()` on two workers and in one process (fresh feeds each time): equal rows.
    Returns the distributed plan's explain text. `estimate`: the tasks UnitScans ask for."""
    expected = await one_process(build())
    estimators = {**ESTIMATORS, "UnitScan": UnitScanEstimator(estimate)}
    async with feed_cluster(task_estimators=estimators) as (coordinator, workers):
        text = await coordinator.explain(build())
        with anyio.fail_after(30):
            got = await coordinator.collect(build())
        with anyio.fail_after(5):
            await wait_for_no_tasks(workers)
    assert rows(got) == rows(expected)
    if expect_rows is not None:
        assert got.num_rows == expect_rows
    return text


def tasks_of(text: str, stage: int = 1) -> int:
    header = next(line for line in text.splitlines() if line.startswith(f"Stage {stage}: "))
    return int(header.split(": ")[1].split(" task")[0])


async def test_single_task() -> None:
    text = await check(lambda: Coalesce(scan(1, "3,1", "2")), expect_rows=6)
    assert tasks_of(text) == 1


async def test_two_tasks() -> None:
    text = await check(lambda: Coalesce(scan(2, "3,1", "2", "4", "1,1")), expect_rows=12)
    assert tasks_of(text) == 2


async def test_three_tasks() -> None:
    # Three tasks asked for, two workers: tasks are placed round-robin, one worker runs two.
    text = await check(lambda: Coalesce(scan(3, "1", "2", "3", "4", "5", "6")), expect_rows=21)
    assert tasks_of(text) == 3


async def test_empty_feeds() -> None:
    await check(lambda: Coalesce(scan(2, "", "0", "", "")), expect_rows=0)


async def test_union_of_two_feeds() -> None:
    await check(lambda: Coalesce(Union([scan(2, "3", "1"), scan(2, "2,2", "5")])), expect_rows=13)


async def test_triple_union() -> None:
    def build() -> ExecutionPlan:
        return Coalesce(Union([scan(1, "1"), scan(2, "2", "3"), scan(2, "4", "0")]))

    await check(build, expect_rows=10)


async def test_nested_unions() -> None:
    def build() -> ExecutionPlan:
        inner = Union([scan(2, "1", "2"), Union([scan(2, "3", "4"), scan(2, "5", "6")])])
        return Coalesce(Union([inner, scan(2, "7", "8")]))

    await check(build, expect_rows=36)


async def test_a_union_of_single_task_feeds_runs_them_side_by_side() -> None:
    def build() -> ExecutionPlan:
        return Coalesce(Union([scan(1, "3", "1"), scan(1, "2,2", "5")]))

    text = await check(build, expect_rows=13)
    assert tasks_of(text) == 2  # one task each, not both feeds in one
    assert "IsolatedUnion(tasks=[0, 1])" in text
    placed = [line for line in text.splitlines() if line.startswith("  task ")]
    assert len({line.split(" on ")[1].split(",")[0] for line in placed}) == 2  # both workers


async def test_union_of_a_feed_with_a_non_feed_input() -> None:
    table = pa.table(
        [pa.array([7, 8], pa.int64()), pa.array([9, 9], pa.int64())], schema=SCAN_SCHEMA
    )

    def build() -> ExecutionPlan:
        return Coalesce(Union([scan(2, "3", "1"), MemoryScan.from_table(table)]))

    text = await check(build, expect_rows=6)
    # The MemoryScan cannot be split (every task would read its rows again): it runs on a
    # task of its own, beside the feed's.
    assert tasks_of(text) == 2
    assert "IsolatedUnion(tasks=[0, 1])" in text


def union_with_a_global_aggregate() -> ExecutionPlan:
    """`SELECT task, sum(partition) ... GROUP BY task UNION ALL SELECT max(task), sum(partition)
    ...` (the second input is one row)."""
    per_task = plan_from(scan(2, "3", "1")).aggregate(
        ["task"], [agg("sum", col("partition"), name="partition")]
    )
    total = plan_from(scan(2, "2,2", "5")).aggregate(
        [], [agg("max", col("task"), name="task"), agg("sum", col("partition"), name="partition")]
    )
    return per_task.union(total).coalesce().plan


def union_with_a_coalesced_feed() -> ExecutionPlan:
    return Coalesce(Union([scan(2, "3", "1"), Coalesce(scan(2, "2,2", "5"))]))


def count_of_a_union_with_a_limit() -> ExecutionPlan:
    """Counted: which row the limit keeps is up to the plan."""
    limited = plan_from(scan(2, "2,2", "5")).coalesce().limit(1)
    union = plan_from(scan(2, "3", "1")).union(limited)
    return union.aggregate([], [agg("count", name="rows")]).plan


@pytest.mark.parametrize(
    "build",
    [union_with_a_global_aggregate, union_with_a_coalesced_feed, count_of_a_union_with_a_limit],
)
async def test_a_union_with_an_input_of_one_partition_reads_it_once(
    build: Callable[[], ExecutionPlan],
) -> None:
    """The union's stage took its task count from the feed, and every task read the
    one-partition input whole (a broadcast, as for a join's build side), so the result had its
    rows once per task: the global aggregate's row twice."""
    text = await check(build)
    assert "NetworkBroadcast" not in text
    assert "IsolatedUnion(tasks=[0, 1])" in text  # the feed on one task, the rest on another


@pytest.mark.parametrize("uses", [2, 3])
async def test_a_union_of_a_feed_with_itself_reads_it_once_per_use(uses: int) -> None:
    """A builder used twice reads its table twice, as in one process; both uses of the feed
    were planned into the same tasks, whose worker gives a feed partition one reader: "feed
    ... partition 0 already has a consumer" (found by a probe). Each use runs on tasks of its
    own now, in a chain of unions too (`t.union(t).union(t)`: a union inside a union)."""

    def build() -> ExecutionPlan:
        table = plan_from(scan(2, "3", "1", "2", "4"))
        union = table
        for _ in range(uses - 1):
            union = union.union(table)
        return union.coalesce().plan

    text = await check(build, expect_rows=10 * uses)
    assert "IsolatedUnion" in text


async def test_a_global_aggregate_over_a_union_with_an_input_of_no_partitions() -> None:
    """The union has one partition (0 + 1), so the aggregate needs no Coalesce under it; the
    planner then ran the union's inputs on tasks of their own, and the aggregate above them
    once per task: a count of 0 beside the count of 5 (found by a probe)."""

    def build() -> ExecutionPlan:
        empty = plan_from(unit_scan(UnitProvider([])))
        return (
            empty.union(unit_scan(UnitProvider([5]))).aggregate([], [agg("count", name="n")]).plan
        )

    await check(build, expect_rows=1, estimate=1)


async def test_aggregation_over_a_feed() -> None:
    def build() -> ExecutionPlan:
        source = plan_from(scan(2, "3,1", "2", "4", "1,1"))
        return source.aggregate(["task"], [agg("count", name="n")]).plan

    text = await check(build, expect_rows=2)
    assert "NetworkShuffle(" in text


async def test_aggregation_over_a_union_of_feeds() -> None:
    def build() -> ExecutionPlan:
        both = plan_from(scan(2, "3,1", "2")).union(scan(2, "4", "1,1"))
        return both.aggregate(["partition"], [agg("count", name="n")]).plan

    await check(build, expect_rows=1)


async def test_join_of_two_feeds() -> None:
    def build() -> ExecutionPlan:
        left = plan_from(scan(2, "3", "2")).select(
            (col("task"), "l_task"), (col("partition"), "l_part")
        )
        right = plan_from(scan(2, "1", "4")).select(
            (col("task"), "r_task"), (col("partition"), "r_part")
        )
        return left.join(right, [("l_task", "r_task")], strategy="shuffle").plan

    text = await check(build, expect_rows=3 * 1 + 2 * 4)
    assert text.count("NetworkShuffle(") == 2


async def test_join_of_a_feed_with_an_aggregated_feed() -> None:
    def build() -> ExecutionPlan:
        counts = plan_from(scan(2, "3", "2", "1", "4")).aggregate(
            [(col("task"), "c_task")], [agg("count", name="n")]
        )
        return counts.join(scan(2, "1", "1,1"), [("c_task", "task")]).plan

    await check(build, expect_rows=3)


async def test_broadcast_join_over_feeds() -> None:
    def build() -> ExecutionPlan:
        small = plan_from(scan(2, "1", "1")).select((col("task"), "s_task"))
        return small.join(scan(2, "3", "2", "4", "1"), [("s_task", "task")]).plan

    text = await check(build, expect_rows=10)
    assert "NetworkBroadcast(" in text  # the plan has the broadcast boundary


async def test_a_feed_that_waits_delays_the_query_without_corrupting_another_feed() -> None:
    def build() -> ExecutionPlan:
        slow = scan(2, "3,3", "2,2", delay=0.02)
        return Coalesce(Union([slow, scan(2, "5", "7")]))

    await check(build, expect_rows=22)


@pytest.mark.parametrize(
    ("tasks", "feeds"),
    [(1, 1), (2, 1), (2, 2)],
    ids=["single-task feed", "distributed feed", "one of two feeds"],
)
async def test_an_error_in_a_feed_reaches_the_caller(tasks: int, feeds: int) -> None:
    failing = UnitProvider([50] * 4, fail_at={3: (7, "cursor expired")})
    inputs = [unit_scan(failing)] + [unit_scan(UnitProvider([50] * 4))] * (feeds - 1)
    plan = Coalesce(inputs[0] if feeds == 1 else Union(inputs))
    async with feed_cluster(
        task_estimators={**ESTIMATORS, "UnitScan": UnitScanEstimator(tasks)}
    ) as (
        coordinator,
        workers,
    ):
        assert tasks_of(await coordinator.explain(plan)) == tasks
        with anyio.fail_after(10), pytest.raises(FeedError, match="cursor expired"):
            await coordinator.collect(plan)
        with anyio.fail_after(5):
            await wait_for_no_tasks(workers)


async def test_a_nested_union_whose_task_budget_exceeds_the_sum_of_its_children() -> None:
    """The estimator asks for 8 tasks of leaves of 2 partitions each (a budget of 24 tasks for
    6 partitions): the stage gets what the partitions allow, no task without work, no partition
    read twice."""

    def build() -> ExecutionPlan:
        leaves = [unit_scan(UnitProvider([n, n + 1])) for n in (1, 3, 5)]
        return Coalesce(Union([Union(leaves[:2]), leaves[2]]))

    text = await check(build, expect_rows=1 + 2 + 3 + 4 + 5 + 6, estimate=8)
    assert tasks_of(text) == 2


async def test_a_hand_built_partitioned_join_of_a_feed_and_a_non_feed_input() -> None:
    """Built without the exchanges its sides need (in one process, as built, it would join
    partition i with partition i of inputs not split by key): the planner adds them, a shuffle
    for the feed and a local repartition for the in-memory side, both with the same partition
    count. Task 0's 3 rows meet key 0 once, task 1's 7 rows meet key 1 twice."""
    keys = pa.table({"r_task": pa.array([0, 1, 1, 5], pa.int64())})

    def build() -> ExecutionPlan:
        memory = MemoryScan.from_table(keys, 4)
        feed = scan(2, "1", "2", "3", "4")
        return HashJoin(memory, feed, [("r_task", "task")], "inner", collect_left=False)

    expected = await one_process(enforce_distribution(build()))
    async with feed_cluster(broadcast_threshold_bytes=0) as (coordinator, _):  # never broadcast
        text = await coordinator.explain(build())
        got = await coordinator.collect(build())
    assert rows(got) == rows(expected)
    assert got.num_rows == 3 + 2 * 7
    assert "NetworkShuffle(" in text
