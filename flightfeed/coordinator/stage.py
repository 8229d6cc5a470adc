"""What the planner produces: stages of tasks below network boundaries, and the local root."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from ..errors import InvalidArgument, NotFound
from ..feeds import FeedAssignment
from ..plan.base import ExecutionPlan
from ..plan.metrics import unwrap


@dataclass(frozen=True, eq=False)
class StageTask:
    """One task of a stage: its number, the global feed partitions it owns, and the worker it
    must run on when it reads data that lives there (a table's TableScan), else None."""

    task_number: int
    feeds: Mapping[bytes, FeedAssignment]
    worker: str | None = None


@dataclass(frozen=True, eq=False)
class Stage:
    """A subtree that runs as `task_count` tasks on workers; every task runs the same `plan`.

    `note` says why the stage got its task count (shown by the plan display).
    """

    stage_id: int
    plan: ExecutionPlan
    tasks: tuple[StageTask, ...]
    note: str = ""

    @property
    def task_count(self) -> int:
        return len(self.tasks)

    @property
    def schema(self) -> pa.Schema:
        return self.plan.schema

    @property
    def partitions_per_task(self) -> int:
        """Output partitions of each task (what a consumer reads with one ExecuteTask)."""
        return self.plan.output_partitions


@dataclass(frozen=True, eq=False)
class DistributedPlan:
    """`root` runs on the coordinator; its NetworkCoalesce nodes read the `stages`' tasks."""

    root: ExecutionPlan
    stages: tuple[Stage, ...]

    def task_refs(self) -> list[tuple[int, int]]:
        """(stage id, task number) of every task, in stage order."""
        return [(s.stage_id, t.task_number) for s in self.stages for t in s.tasks]

    def with_providers(self, providers: Mapping[bytes, Any]) -> DistributedPlan:
        """The same plan, its feeds (by id) served by other providers (a stream's slices)."""
        stages = tuple(
            replace(
                stage,
                tasks=tuple(
                    replace(
                        task,
                        feeds={
                            feed_id: FeedAssignment(
                                providers.get(feed_id, found.provider), found.partitions
                            )
                            for feed_id, found in task.feeds.items()
                        },
                    )
                    for task in stage.tasks
                ),
            )
            for stage in self.stages
        )
        return DistributedPlan(self.root, stages)

    def assign(self, workers: list[str], offset: int = 0) -> dict[tuple[int, int], str]:
        """A pinned task goes to its worker; the others round-robin: the i-th of them (in
        stage order) to worker (offset + i) % n."""
        if not workers:
            raise InvalidArgument("no workers to assign tasks to")
        assignment: dict[tuple[int, int], str] = {}
        free = 0
        for stage in self.stages:
            for task in stage.tasks:
                ref = (stage.stage_id, task.task_number)
                if task.worker is not None:
                    if task.worker not in workers:
                        raise NotFound(
                            f"stage {stage.stage_id} task {task.task_number} reads data held by"
                            f" {task.worker}, which is not one of this coordinator's workers"
                            f" ({', '.join(workers)})"
                        )
                    assignment[ref] = task.worker
                else:
                    assignment[ref] = workers[(offset + free) % len(workers)]
                    free += 1
        return assignment


def placed(
    plan: ExecutionPlan,
    query_id: bytes,
    assignment: Mapping[tuple[int, int], str],
    attempt: int = 0,
) -> ExecutionPlan:
    """`plan` with every network node's input stage placed: the query id, its attempt and, by
    task number, the worker each producer task runs on (`assignment`: (stage id, task) →
    worker URL). What a worker needs to read its inputs; the plan itself when it reads no other
    stage."""
    node = unwrap(plan)
    source = getattr(node, "source", None)
    if source is not None and hasattr(node, "with_source"):
        urls = tuple(assignment[(source.stage_id, t)] for t in range(source.task_count))
        return node.with_source(source.placed(query_id, urls, attempt))  # type: ignore[no-any-return]
    if not node.children:
        return node
    children = [placed(child, query_id, assignment, attempt) for child in node.children]
    if all(new is old for new, old in zip(children, node.children, strict=True)):
        return node
    return node.with_children(children)
