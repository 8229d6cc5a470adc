"""Distributed planning: cut a plan at Coalesce boundaries into stages of tasks.

First every node gets the input partitioning it needs (plan/distribution.py): a Coalesce is
added where a node would otherwise see a group's rows spread over partitions.

A leaf is distributable when its node kind has a TaskEstimator or it holds a registered
work-unit feed. The lowest Coalesce above distributable leaves is a stage boundary: its input
subtree becomes a stage of T tasks and, on the coordinator, the Coalesce reads a
NetworkCoalesce over that stage instead. The lowest one, because a node between two
Coalesces (a Limit, a final aggregate) must see every task's rows, so it stays local.

T is the estimators' task count (a maximum is capped by the workers), lowered so that it
divides every leaf's partition count P: each task runs `scale_up_leaf_node(leaf, T)` and owns
global partitions [t*P/T, (t+1)*P/T). A stage runs as one task, unsplit, when splitting could
change its result: a leaf that cannot be split (it would be read by every task), a node that
mixes partitions (Repartition, HashJoin), or a leaf the estimator declines to scale.
Distributable leaves with no Coalesce above them run on the coordinator, as does any plan
without a boundary.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from ..feeds import FeedAssignment, FeedRegistry, WorkUnitFeed
from ..plan.base import ExecutionPlan
from ..plan.distribution import enforce_distribution
from ..plan.metrics import unwrap
from ..plan.nodes import Coalesce
from .estimator import TaskEstimation, TaskEstimator, TaskEstimators
from .network_coalesce import NetworkCoalesce
from .stage import DistributedPlan, Stage, StageTask

PARTITION_MIXING_KINDS: frozenset[str] = frozenset({"Repartition", "HashJoin"})
"""Nodes whose output partition depends on more than the same input partition."""


@dataclass(eq=False, slots=True)
class _Leaf:
    node: ExecutionPlan
    estimator: TaskEstimator | None
    estimation: TaskEstimation | None
    feed: WorkUnitFeed[Any] | None

    def task_count(self, workers: int) -> int:
        wanted = self.estimation.resolve(workers) if self.estimation is not None else 1
        return max(1, min(wanted, self.node.output_partitions))


@dataclass(eq=False)
class _Planning:
    workers: int
    stages: list[Stage] = field(default_factory=list)
    leaves: dict[int, _Leaf | None] = field(default_factory=dict)


class DistributedPlanner:
    """Turns a plan into a DistributedPlan for a cluster of a given size."""

    def __init__(
        self,
        *,
        feed_registry: FeedRegistry | None = None,
        estimators: TaskEstimators | None = None,
        partition_mixing_kinds: Collection[str] = PARTITION_MIXING_KINDS,
    ) -> None:
        self._feeds = feed_registry
        self._estimators = estimators or TaskEstimators()
        self._mixing = frozenset(partition_mixing_kinds)

    def feeds_in(self, plan: ExecutionPlan) -> list[WorkUnitFeed[Any]]:
        """The plan's feeds the registry finds, in pre-order (none without a registry)."""
        return [feed for _, feed in self._feeds.feeds_in(plan)] if self._feeds is not None else []

    def plan(self, plan: ExecutionPlan, workers: int) -> DistributedPlan:
        """Stages cut at the Coalesces, after enforce_distribution added those the plan's
        nodes need (a grouped aggregate over partitions not split by its keys, say)."""
        state = _Planning(workers=max(workers, 1))
        root, _ = self._rewrite(enforce_distribution(plan), state)
        return DistributedPlan(root, tuple(state.stages))

    def plan_on_workers(self, plan: ExecutionPlan, workers: int) -> DistributedPlan:
        """The whole plan as one stage whose tasks' outputs are its result (nothing runs on the
        coordinator): for queries read straight from the workers. It is split across tasks
        as a leaf stage is; a plan with a Coalesce runs as one task, since a Coalesce must see
        every task's rows."""
        state = _Planning(workers=max(workers, 1))
        plan = enforce_distribution(plan)
        stage = self._stage(unwrap(plan), state, single_partition_kinds=frozenset({"Coalesce"}))
        if stage is None:
            raise InvalidArgument("a plan that reads other stages cannot run on the workers alone")
        return DistributedPlan(NetworkCoalesce(stage), (stage,))

    # -- finding boundaries --------------------------------------------------------------------

    def _leaf(self, node: ExecutionPlan, state: _Planning) -> _Leaf | None:
        key = id(node)
        if key not in state.leaves:
            estimator = self._estimators.for_node(node)
            estimation = estimator.task_estimation(node) if estimator is not None else None
            feed = self._feeds.feed_of(node) if self._feeds is not None else None
            found = None
            if (estimation is not None or feed is not None) and node.output_partitions >= 1:
                found = _Leaf(node, estimator, estimation, feed)
            state.leaves[key] = found
        return state.leaves[key]

    def _rewrite(self, node: ExecutionPlan, state: _Planning) -> tuple[ExecutionPlan, bool]:
        """The rewritten node, and whether distributable leaves below still await a stage."""
        node = unwrap(node)
        if not node.children:
            return node, self._leaf(node, state) is not None
        originals = [unwrap(child) for child in node.children]
        rewritten = [self._rewrite(child, state) for child in originals]
        children = [child for child, _ in rewritten]
        pending = any(flag for _, flag in rewritten)
        if isinstance(node, Coalesce) and pending:
            stage = self._stage(children[0], state)
            if stage is not None:
                return node.with_children([NetworkCoalesce(stage)]), False
            pending = False  # it holds another stage's boundary: run the rest here
        if any(new is not old for new, old in zip(children, originals, strict=True)):
            node = node.with_children(children)
        return node, pending

    # -- building a stage ------------------------------------------------------------------------

    def _stage(
        self,
        subtree: ExecutionPlan,
        state: _Planning,
        *,
        single_partition_kinds: frozenset[str] = frozenset(),
    ) -> Stage | None:
        leaves: list[_Leaf] = []
        blockers: list[str] = []
        for node in _walk(subtree):
            if isinstance(node, NetworkCoalesce):
                return None  # tasks cannot read other tasks yet: keep this subtree local
            if node.children:
                if node.name in self._mixing:
                    blockers.append(f"{node.name} mixes partitions across tasks")
                elif node.name in single_partition_kinds:
                    blockers.append(f"{node.name} must see every task's rows")
                elif self._feeds is not None and self._feeds.feed_of(node) is not None:
                    blockers.append(f"{node.name} has a feed but is not a leaf")
                continue
            leaf = self._leaf(node, state)
            if leaf is None:
                blockers.append(f"leaf {node.name} cannot be split (every task would read it)")
            else:
                leaves.append(leaf)
        counts = [leaf.task_count(state.workers) for leaf in leaves]
        tasks = min(counts, default=1)
        note = ", ".join(f"{leaf.node.name}: {_describe(leaf)}" for leaf in leaves)
        note = note or "no leaf that splits into tasks"
        if blockers and tasks > 1:
            tasks, note = 1, "; ".join(blockers)
        sizes = [leaf.node.output_partitions for leaf in leaves]
        tasks = max(t for t in range(tasks, 0, -1) if all(p % t == 0 for p in sizes))
        scaled: dict[int, ExecutionPlan] = {}
        if tasks > 1:
            for leaf in leaves:
                per_task = _scale(leaf, tasks)
                if per_task is None:
                    tasks, note, scaled = 1, f"{leaf.node.name} cannot be scaled up", {}
                    break
                scaled[id(leaf.node)] = per_task
        plan = _replace(subtree, scaled) if scaled else subtree
        stage_id = len(state.stages) + 1
        stage = Stage(
            stage_id,
            plan,
            tuple(StageTask(t, self._feed_assignments(plan, t, tasks)) for t in range(tasks)),
            note=f"{tasks} task{'s' if tasks != 1 else ''} ({note})",
        )
        state.stages.append(stage)
        return stage

    def _feed_assignments(
        self, plan: ExecutionPlan, task: int, tasks: int
    ) -> dict[bytes, FeedAssignment]:
        """Each feed of the task's plan with the global partitions task `task` owns."""
        if self._feeds is None:
            return {}
        out: dict[bytes, FeedAssignment] = {}
        for node, feed in self._feeds.feeds_in(plan):
            provider = feed.inner()
            if provider is None:
                raise InvalidArgument(
                    f"{node.name}: feed {feed.uuid} is a remote handle; only a feed with its"
                    " provider (WorkUnitFeed.new) can be distributed from the coordinator"
                )
            per_task = node.output_partitions
            first = task * per_task if tasks > 1 else 0
            partitions = range(first, first + per_task)
            known = out.get(feed.id)
            if known is not None and list(known.partitions) != list(partitions):
                raise InvalidArgument(f"feed {feed.uuid} appears twice with different partitions")
            out[feed.id] = FeedAssignment(provider, partitions)
        return out


def _scale(leaf: _Leaf, tasks: int) -> ExecutionPlan | None:
    if leaf.estimator is None:
        return None
    per_task = leaf.estimator.scale_up_leaf_node(leaf.node, tasks)
    if per_task is None:
        return None
    total = leaf.node.output_partitions
    if per_task.output_partitions * tasks != total:
        raise InvalidArgument(
            f"scale_up_leaf_node({leaf.node.name}, {tasks}) gave "
            f"{per_task.output_partitions} partitions per task; the leaf has {total}, so each"
            f" task must own {total // tasks}"
        )
    return per_task


def _describe(leaf: _Leaf) -> str:
    if leaf.estimation is None:
        return "feed without a task estimation, one task"
    kind = "at most" if leaf.estimation.is_maximum else "desired"
    return f"{kind} {leaf.estimation.task_count}"


def _walk(plan: ExecutionPlan) -> list[ExecutionPlan]:
    out: list[ExecutionPlan] = []
    stack = [unwrap(plan)]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(unwrap(child) for child in reversed(node.children))
    return out


def _replace(node: ExecutionPlan, scaled: dict[int, ExecutionPlan]) -> ExecutionPlan:
    node = unwrap(node)
    found = scaled.get(id(node))
    if found is not None:
        return found
    if not node.children:
        return node
    return node.with_children([_replace(child, scaled) for child in node.children])


def distribute(
    plan: ExecutionPlan,
    workers: int,
    *,
    feed_registry: FeedRegistry | None = None,
    estimators: TaskEstimators | None = None,
) -> DistributedPlan:
    """`DistributedPlanner(...).plan(plan, workers)` in one call."""
    return DistributedPlanner(feed_registry=feed_registry, estimators=estimators).plan(
        plan, workers
    )


__all__ = ["PARTITION_MIXING_KINDS", "DistributedPlanner", "distribute"]
