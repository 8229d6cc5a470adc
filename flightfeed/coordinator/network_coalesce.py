"""NetworkCoalesce: one partition made of every task's output, read from the workers.

The coordinator-side half of a stage boundary. For each task of its stage it runs one
ExecuteTask (NoneHead, all of the task's partitions) on the task's worker, all concurrently,
and yields batches as they come (plan/merge.py: a failing reader never cancels the consumer's
task from under it).
Which worker runs which task is the query's business: the node finds its readers in
`ctx.extensions[STAGE_OUTPUTS_KEY]`, set by the Coordinator for each query.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol, runtime_checkable

import pyarrow as pa

from ..errors import ExecutionError
from ..plan.base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
from ..plan.merge import merge
from .stage import Stage

STAGE_OUTPUTS_KEY: Final = "flightfeed.coordinator.stage_outputs"
BUFFERED_BATCHES_PER_TASK: Final = 2


@runtime_checkable
class StageOutputs(Protocol):
    """Opens the output stream of one task of a stage (the Coordinator's query runtime)."""

    def task_output(
        self, stage: Stage, task_number: int
    ) -> AbstractAsyncContextManager[AsyncIterator[pa.RecordBatch]]: ...


class NetworkCoalesce(PlanNodeBase):
    name = "NetworkCoalesce"

    def __init__(self, stage: Stage) -> None:
        self.stage = stage

    @property
    def schema(self) -> pa.Schema:
        return self.stage.schema

    @property
    def output_partitions(self) -> int:
        return 1

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 0)
        return self

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        outputs = ctx.extensions.get(STAGE_OUTPUTS_KEY)
        if not isinstance(outputs, StageOutputs):
            raise ExecutionError(
                f"NetworkCoalesce of stage {self.stage.stage_id} runs only in a Coordinator query"
            )
        sources = {
            task.task_number: self._task_batches(outputs, task.task_number)
            for task in self.stage.tasks
        }
        async with closing(merge(sources, BUFFERED_BATCHES_PER_TASK)) as stream:
            async for _, batch in stream:
                yield batch

    async def _task_batches(
        self, outputs: StageOutputs, task_number: int
    ) -> AsyncIterator[pa.RecordBatch]:
        """One task's output, read from its worker with ExecuteTask."""
        async with (
            outputs.task_output(self.stage, task_number) as stream,
            closing(stream) as batches,
        ):
            async for batch in batches:
                yield batch

    def __repr__(self) -> str:
        stage = self.stage
        return (
            f"NetworkCoalesce(stage={stage.stage_id}, tasks={stage.task_count},"
            f" partitions_per_task={stage.partitions_per_task})"
        )
