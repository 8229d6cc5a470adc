"""The distributed plan as text: the coordinator's part, then each stage with its tasks,
the worker each task runs on and the feed partitions it owns (an EXPLAIN for operators)."""

from __future__ import annotations

from collections.abc import Mapping

from ..plan.display import format_plan
from .stage import DistributedPlan


def format_distributed_plan(
    plan: DistributedPlan,
    workers: Mapping[tuple[int, int], str] | None = None,
    *,
    read_by_caller: bool = False,
) -> str:
    """Coordinator plan, then per stage: task count and why, tasks → workers, stage plan.
    `read_by_caller`: a held query, whose endpoints the caller reads (no coordinator part)."""
    if read_by_caller:
        endpoints = sum(s.task_count * s.partitions_per_task for s in plan.stages)
        lines = [f"Read by the caller: {endpoints} endpoints, one per output partition"]
    else:
        lines = ["Coordinator", *_indent(format_plan(plan.root), 1)]
    for stage in plan.stages:
        per_task = stage.partitions_per_task
        lines.append(
            f"Stage {stage.stage_id}: {stage.note},"
            f" {per_task} output partition{'s' if per_task != 1 else ''} per task"
        )
        for task in stage.tasks:
            where = (workers or {}).get((stage.stage_id, task.task_number))
            line = f"  task {task.task_number}"
            if where is not None:
                line += f" on {where}"
            for feed_id, assignment in task.feeds.items():
                parts = list(assignment.partitions)
                span = f"{parts[0]}..{parts[-1]}" if parts else "none"
                line += f", feed {feed_id.hex()[:8]} partitions {span}"
            lines.append(line)
        lines.extend(_indent(format_plan(stage.plan), 2))
    return "\n".join(lines)


def _indent(text: str, depth: int) -> list[str]:
    return [f"{'  ' * depth}{line}" for line in text.splitlines()]
