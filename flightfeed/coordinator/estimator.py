"""TaskEstimator: how many tasks a distributable leaf gets, and its per-task variant.

The planner asks `task_estimation` for the task count of a leaf's stage; `scale_up_leaf_node`
then rebuilds the leaf as one task sees it (a leaf with P partitions becomes P/T partitions per
task; the node finds its global partitions from `ctx.task_number`). A feed-backed leaf without
an estimator runs as one task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from ..errors import InvalidArgument
from ..plan.base import ExecutionPlan
from ..plan.metrics import unwrap


@dataclass(frozen=True, slots=True)
class TaskEstimation:
    """A task count: `desired` is taken as is, a `maximum` is also capped by the workers."""

    task_count: int
    is_maximum: bool = False

    def __post_init__(self) -> None:
        if self.task_count < 1:
            raise InvalidArgument(f"a task estimation needs at least 1 task, got {self.task_count}")

    @classmethod
    def desired(cls, task_count: int) -> TaskEstimation:
        """Run this many tasks, several per worker if there are fewer workers."""
        return cls(task_count, is_maximum=False)

    @classmethod
    def maximum(cls, task_count: int) -> TaskEstimation:
        """At most this many tasks, and no more than there are workers."""
        return cls(task_count, is_maximum=True)

    def resolve(self, workers: int) -> int:
        """The task count for a cluster of `workers`."""
        return min(self.task_count, max(workers, 1)) if self.is_maximum else self.task_count


class TaskEstimator(Protocol):
    """Sizes the stage of a leaf node kind (the seed's TaskEstimator)."""

    def task_estimation(self, plan: ExecutionPlan, /) -> TaskEstimation | None:
        """The task count wanted for `plan`, or None when this estimator has no opinion."""
        ...

    def scale_up_leaf_node(self, plan: ExecutionPlan, task_count: int, /) -> ExecutionPlan | None:
        """The leaf as each of `task_count` tasks runs it, or None if it cannot be split."""
        ...


EstimatorKey: TypeAlias = "str | type"


class TaskEstimators:
    """Node kind (its `name`) or node type -> estimator; a kind match wins over a type match."""

    def __init__(self, estimators: Mapping[EstimatorKey, TaskEstimator] | None = None) -> None:
        self._by_kind: dict[str, TaskEstimator] = {}
        self._by_type: dict[type, TaskEstimator] = {}
        for key, estimator in (estimators or {}).items():
            if isinstance(key, str):
                self._by_kind[key] = estimator
            elif isinstance(key, type):
                self._by_type[key] = estimator
            else:
                raise InvalidArgument(
                    f"task estimators are keyed by node kind or type, not {key!r}"
                )

    def for_node(self, node: ExecutionPlan) -> TaskEstimator | None:
        inner = unwrap(node)
        found = self._by_kind.get(inner.name)
        if found is not None:
            return found
        for cls in type(inner).__mro__:
            found = self._by_type.get(cls)
            if found is not None:
                return found
        return None

    def __bool__(self) -> bool:
        return bool(self._by_kind or self._by_type)
