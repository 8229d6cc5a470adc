"""Running plans: a task context with a background task group, and collecting results."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pyarrow as pa

from .base import DEFAULT_OFFLOAD_THRESHOLD_BYTES, ExecutionPlan, TaskContext, closing
from .functions import PlanSession
from .memory import UNBOUNDED, MemoryPool
from .merge import merge
from .metrics import MetricsRegistry


@asynccontextmanager
async def open_task_context(
    session: PlanSession,
    *,
    task_number: int = 0,
    task_count: int = 1,
    metrics: MetricsRegistry | None = None,
    offload_threshold_bytes: int = DEFAULT_OFFLOAD_THRESHOLD_BYTES,
    memory_pool: MemoryPool = UNBOUNDED,
) -> AsyncIterator[TaskContext]:
    """A TaskContext whose background task group lives until the block exits (then cancelled).

    The task may hold the session's memory budget, drawn from `memory_pool`. An error of the
    block is re-raised as is, not wrapped in an ExceptionGroup.
    """
    failure: Exception | None = None
    memory = memory_pool.task(f"{task_number}", session.memory_budget_bytes)
    try:
        async with anyio.create_task_group() as tg:
            try:
                yield TaskContext(
                    session=session,
                    task_number=task_number,
                    task_count=task_count,
                    metrics=metrics if metrics is not None else MetricsRegistry(),
                    background=tg,
                    offload_threshold_bytes=offload_threshold_bytes,
                    memory=memory,
                )
            except Exception as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()
    finally:
        memory.close()  # the task's data is gone with it
    if failure is not None:
        raise failure


async def collect_partition(
    plan: ExecutionPlan, partition: int, ctx: TaskContext
) -> list[pa.RecordBatch]:
    """Every batch of one output partition."""
    async with closing(plan.execute(partition, ctx)) as stream:
        return [batch async for batch in stream]


async def collect(plan: ExecutionPlan, ctx: TaskContext) -> pa.Table:
    """All output partitions as one table, partition 0's batches first.

    The partitions are read concurrently (merge): a fanned-out node (Repartition) blocks on
    the full buffer of an unread output, so reading one partition after the other could hang.
    """
    plan = unshared(plan)
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(plan.output_partitions)]
    sources = {partition: plan.execute(partition, ctx) for partition in range(len(parts))}
    async with closing(merge(sources)) as stream:
        async for partition, batch in stream:
            parts[partition].append(batch)
    return pa.Table.from_batches([b for part in parts for b in part], schema=plan.schema)


def unshared(plan: ExecutionPlan) -> ExecutionPlan:
    """`plan` with a node of its own for each use of a node it holds more than once (a builder
    used twice: `g.union(g)`), as the distributed planner plans it once per use; the plan
    itself when it shares none. A node keeps its run's state per task (`node_state`), so a
    second use of a shared Repartition opened the first's outputs again ("output 0 was
    already opened")."""
    seen: set[int] = set()

    def visit(node: ExecutionPlan) -> ExecutionPlan:
        children = [visit(child) for child in node.children]
        again = id(node) in seen
        seen.add(id(node))
        if any(new is not old for new, old in zip(children, node.children, strict=True)):
            return node.with_children(children)
        return copy.copy(node) if again else node

    return visit(plan)
