"""Whether splitting a stage into several tasks keeps its rows: each once, none lost.

A stage's tasks each read an input cut off below them whole (a NetworkCoalesce, or a broadcast
once the stage has tasks), and each its own share of every other leaf. What reads an input
whole is right as a collect-left join's build side: each task joins all of it with its share
of the probe side. Anywhere else (an input of a union, the stage's own output) every task
passes the same rows on, and whoever reads the stage gets them once per task: `a UNION ALL
(SELECT sum(v) FROM b)` on two tasks gave the sum twice. The other way round, a collect-left
join whose build side is split joins each probe row with one task's share of the build rows
only, and loses the rest (a held query's broadcast join, planned as one stage, did). Such a
stage runs as one task, or its union's inputs on tasks of their own (the planner's
IsolatedUnion).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from ..plan.base import ExecutionPlan
from ..plan.metrics import unwrap
from ..plan.nodes import HashJoin

REPEATED: str = "an input read whole is not a join's build side (every task would repeat its rows)"
SPLIT_BUILD: str = (
    "a collect-left HashJoin's build side is split across tasks (each would join only its share)"
)


class TaskRows(Enum):
    """What a node's output holds in each task of a stage."""

    SHARE = "each task its own share"
    WHOLE = "every task the same rows"
    MIXED = "rows repeated or missing across the tasks"


def split_conflicts(stage: ExecutionPlan, read_whole: Collection[int]) -> list[str]:
    """Why the stage cannot be split into tasks (none: it can), given the ids of the leaves
    every task reads whole; every other leaf is split across the tasks."""
    conflicts: list[str] = []
    if _rows(stage, read_whole, conflicts) is not TaskRows.SHARE and not conflicts:
        conflicts.append(REPEATED)  # (every leaf read whole: the stage's output is repeated)
    return list(dict.fromkeys(conflicts))


def _rows(node: ExecutionPlan, read_whole: Collection[int], conflicts: list[str]) -> TaskRows:
    node = unwrap(node)
    if not node.children:
        return TaskRows.WHOLE if id(node) in read_whole else TaskRows.SHARE
    inputs = [_rows(child, read_whole, conflicts) for child in node.children]
    if isinstance(node, HashJoin) and node.collect_left:
        build, probe = inputs
        if build is TaskRows.WHOLE:
            return probe  # each task joins the whole build side with its share of the probe
        if build is TaskRows.SHARE:
            conflicts.append(SPLIT_BUILD)
        return TaskRows.MIXED
    if all(rows is inputs[0] for rows in inputs):
        return inputs[0]
    if TaskRows.WHOLE in inputs:
        conflicts.append(REPEATED)
    return TaskRows.MIXED


__all__ = ["REPEATED", "SPLIT_BUILD", "TaskRows", "split_conflicts"]
