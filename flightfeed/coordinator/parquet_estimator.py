"""ParquetScanEstimator: a ParquetScan's stage gets a task per worker, at most one per
partition (the planner lowers the count to one that divides the partitions); each task reads
its share of the row groups (ParquetScan.for_tasks)."""

from __future__ import annotations

from ..plan.base import ExecutionPlan
from ..plan.metrics import unwrap
from ..plan.nodes import ParquetScan
from .estimator import TaskEstimation


class ParquetScanEstimator:
    """`max_tasks`: a cap below the worker count (None: one task per worker)."""

    def __init__(self, max_tasks: int | None = None) -> None:
        self.max_tasks = max_tasks

    def task_estimation(self, plan: ExecutionPlan, /) -> TaskEstimation | None:
        node = unwrap(plan)
        if not isinstance(node, ParquetScan):
            return None
        tasks = node.output_partitions
        if self.max_tasks is not None:
            tasks = min(tasks, self.max_tasks)
        return TaskEstimation.maximum(max(tasks, 1))

    def scale_up_leaf_node(self, plan: ExecutionPlan, task_count: int, /) -> ExecutionPlan | None:
        node = unwrap(plan)
        if not isinstance(node, ParquetScan) or node.output_partitions % task_count:
            return None
        return node.for_tasks(task_count)


__all__ = ["ParquetScanEstimator"]
