"""Snapshots (snapshots/) of the distributed plan's displays, text for logs and Graphviz DOT
for drawing, for the seed's feed scan under a built aggregate and sort: the partial on the
workers' tasks, its states shuffled by key to the final's tasks, the sort's merge on the
coordinator. Feed ids are random: the text masks them."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.feed_scan import ESTIMATORS, feed_registry

from flightfeed.coordinator import DistributedPlanner, TaskEstimators, format_distributed_plan
from flightfeed.coordinator.display_dot import format_distributed_plan_dot
from flightfeed.coordinator.stage import DistributedPlan
from flightfeed.examples.chunk_scan import scan
from flightfeed.plan import MemoryScan, agg, call, col, desc, lit, plan_from

WORKERS = {
    (1, 0): "grpc://w1:8000",
    (1, 1): "grpc://w2:8000",
    (2, 0): "grpc://w1:8000",
    (2, 1): "grpc://w2:8000",
}

SNAPSHOTS = Path(__file__).parent / "snapshots"


def distributed() -> DistributedPlan:
    planner = DistributedPlanner(
        feed_registry=feed_registry(), estimators=TaskEstimators(ESTIMATORS)
    )
    counted = plan_from(scan(2, "3,1", "2", "4", "1,1")).aggregate(
        ["task"], [agg("count", name="cnt")]
    )
    return planner.plan(counted.sort(desc("cnt")).plan, 2)


def test_text_snapshot() -> None:
    text = format_distributed_plan(distributed(), WORKERS)
    expected = (SNAPSHOTS / "distributed_plan.txt").read_text()
    assert re.sub(r"feed [0-9a-f]{8}", "feed <id>", text) + "\n" == expected


def test_dot_snapshot() -> None:
    expected = (SNAPSHOTS / "distributed_plan.dot").read_text()
    assert format_distributed_plan_dot(distributed(), WORKERS) == expected


def test_dot_labels_escape_quotes_and_backslashes() -> None:
    import pyarrow as pa

    table = pa.table({"s": ['a"b\\c']})
    quoted = call("equal", col("s"), lit('a"b\\c'))
    plan = plan_from(MemoryScan.from_table(table)).filter(quoted).plan
    dot = format_distributed_plan_dot(DistributedPlanner().plan(plan, 1))
    label = next(line for line in dot.splitlines() if "Filter" in line)
    assert 'a\\"b' in label  # the literal's quote, escaped
    assert label.count('"') - label.count('\\"') == 2  # only the label's own quotes are bare
