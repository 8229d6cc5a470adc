"""The execution-plan contract: what every node offers and what a running task hands it.

A plan is a tree of nodes. `execute(partition, ctx)` returns an async stream of record batches
for one output partition; it validates the partition eagerly, so a bad request fails at the
call rather than at the first batch. Consume streams under `closing()` (or to the end): nodes
hold child streams and background work that must be released when a consumer stops early.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import pyarrow as pa

from ..concurrency import closing as closing  # (plan code's home for it: re-exported)
from ..errors import InvalidArgument
from .functions import PlanSession
from .memory import UNBOUNDED, TaskMemory
from .metrics import MetricsRegistry

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

T = TypeVar("T")

DEFAULT_OFFLOAD_THRESHOLD_BYTES = 1 << 20
"""Batches at least this large run their Arrow C++ work on a worker thread (see offload.py)."""


class ExecutionPlan(Protocol):
    """A node of a physical plan. Built-in nodes subclass `PlanNodeBase`; user nodes may not."""

    @property
    def name(self) -> str:
        """The node kind: also the key of the codec that encodes it."""
        ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def output_partitions(self) -> int: ...

    @property
    def children(self) -> Sequence[ExecutionPlan]: ...

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        """The same node over new inputs (used by planners and instrumentation)."""
        ...

    def execute(self, partition: int, ctx: TaskContext, /) -> AsyncIterator[pa.RecordBatch]:
        """Stream one output partition; InvalidArgument if `partition` is out of range."""
        ...


_SESSION_BUDGET = TaskMemory(UNBOUNDED, "(the session's budget)", None)


@dataclass(eq=False)
class TaskContext:
    """Everything a running task hands its nodes. Extend with fields; old callers keep working.

    `background` is a task group living as long as the task: nodes that fan one execution out
    to several output partitions (Repartition) run their input there. `extensions` is for
    layers above the plan (the feed resolver of work-unit feeds, for instance). `memory` is the
    task's share of its worker's memory pool: operators reserve from it before they hold data.
    """

    session: PlanSession
    task_number: int = 0
    task_count: int = 1
    metrics: MetricsRegistry = field(default_factory=MetricsRegistry)
    background: TaskGroup | None = None
    offload_threshold_bytes: int = DEFAULT_OFFLOAD_THRESHOLD_BYTES
    extensions: dict[str, object] = field(default_factory=dict)
    memory: TaskMemory = field(default_factory=lambda: _SESSION_BUDGET)
    _node_state: dict[int, tuple[object, object]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.memory is _SESSION_BUDGET:  # no pool given: the session's budget, unpooled
            limit = self.session.memory_budget_bytes
            self.memory = UNBOUNDED.task(f"{self.task_number}", limit)

    def node_state(self, node: object, factory: Callable[[], T]) -> T:
        """Per-(node, task) state, created on first use: shared by a node's partitions."""
        entry = self._node_state.get(id(node))
        if entry is None or entry[0] is not node:
            entry = (node, factory())
            self._node_state[id(node)] = entry
        return cast(T, entry[1])


def check_partition(plan: ExecutionPlan, partition: int) -> None:
    """Raise InvalidArgument unless `partition` is one of the plan's output partitions."""
    count = plan.output_partitions
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise InvalidArgument(f"{plan.name}: partition must be an int, got {partition!r}")
    if not 0 <= partition < count:
        raise InvalidArgument(
            f"{plan.name}: partition {partition} out of range (plan has {count} partitions)"
        )


def expect_children(name: str, children: Sequence[ExecutionPlan], count: int) -> None:
    """Raise InvalidArgument unless a node gets exactly `count` inputs."""
    if len(children) != count:
        raise InvalidArgument(f"{name} takes {count} input(s), got {len(children)}")


class PlanNodeBase(ABC):
    """Shared plumbing of built-in nodes: eager partition check, no children by default."""

    name: str = "PlanNodeBase"

    @property
    @abstractmethod
    def schema(self) -> pa.Schema: ...

    @property
    @abstractmethod
    def output_partitions(self) -> int: ...

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return ()

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 0)
        return self

    def execute(self, partition: int, ctx: TaskContext, /) -> AsyncIterator[pa.RecordBatch]:
        check_partition(self, partition)
        return self._execute(partition, ctx)

    @abstractmethod
    def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        """The stream of a validated partition (an async generator)."""

    def __repr__(self) -> str:
        return f"{self.name}(partitions={self.output_partitions})"


class UnaryNode(PlanNodeBase):
    """A node over one input `child`: by default it keeps the child's schema and partitioning;
    subclasses override what they change."""

    child: ExecutionPlan

    @property
    def schema(self) -> pa.Schema:
        return self.child.schema

    @property
    def output_partitions(self) -> int:
        return self.child.output_partitions

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return (self.child,)


def pre_order(plan: ExecutionPlan) -> list[ExecutionPlan]:
    """Nodes in pre-order: the order of TaskMetrics.pre_order_plan_metrics."""
    out: list[ExecutionPlan] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children))
    return out


def embedded_bytes(plan: ExecutionPlan) -> int:
    """Bytes of data the plan's nodes carry in themselves (a MemoryScan's batches), held as
    long as the plan: a node says so with an `embedded_bytes` attribute. Give the plan before
    instrumentation (wrappers do not forward attributes)."""
    return sum(int(getattr(node, "embedded_bytes", 0)) for node in pre_order(plan))
