"""Whether a stage of several tasks would pass some rows on once per task.

A stage's tasks each read an input cut off below them whole (a NetworkCoalesce, or a broadcast
once the stage has tasks). That is right as a collect-left join's build side: each task joins
all of it with its own share of the probe side. Anywhere else (an input of a union, the stage's
own output) every task passes the same rows on, and whoever reads the stage gets them once per
task: `a UNION ALL (SELECT sum(v) FROM b)` on two tasks gave the sum twice. Such a stage runs as
one task, or its union's inputs on tasks of their own (the planner's IsolatedUnion).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from ..plan.base import ExecutionPlan
from ..plan.metrics import unwrap
from ..plan.nodes import HashJoin


class TaskRows(Enum):
    """What a node's output holds in each task of a stage."""

    SHARE = "each task its own share"
    WHOLE = "every task the same rows"
    MIXED = "some rows in every task, others in one"


def task_rows(node: ExecutionPlan, read_whole: Collection[int]) -> TaskRows:
    """What `node` outputs in each task, given the ids of the leaves every task reads whole
    (every other leaf is split across the tasks)."""
    node = unwrap(node)
    if not node.children:
        return TaskRows.WHOLE if id(node) in read_whole else TaskRows.SHARE
    inputs = [task_rows(child, read_whole) for child in node.children]
    if isinstance(node, HashJoin) and node.collect_left:
        build, probe = inputs
        if build is TaskRows.WHOLE:
            return probe  # each task joins the whole build side with its share of the probe
        if build is TaskRows.SHARE and probe is TaskRows.SHARE:
            return TaskRows.SHARE
        return TaskRows.MIXED
    if all(rows is inputs[0] for rows in inputs):
        return inputs[0]
    return TaskRows.MIXED


__all__ = ["TaskRows", "task_rows"]
