"""NetworkCoalesce: one partition made of every task's output, read from the workers.

The coordinator-side half of a stage boundary. For each task of its stage it runs one
ExecuteTask (NoneHead, all of the task's partitions) on the task's worker, all concurrently,
and yields batches as they come. Like Coalesce, each reader is a pump that forwards its error
as an item instead of raising, so a failure never cancels the consumer's task from under it.
Which worker runs which task is the query's business: the node finds its readers in
`ctx.extensions[STAGE_OUTPUTS_KEY]`, set by the Coordinator for each query.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol, runtime_checkable

import anyio
import pyarrow as pa
from anyio.abc import ObjectSendStream

from ..errors import ExecutionError
from ..plan.base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
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
        tasks = self.stage.task_count
        send, receive = anyio.create_memory_object_stream[pa.RecordBatch | Exception](
            max_buffer_size=tasks * BUFFERED_BATCHES_PER_TASK
        )
        failure: Exception | None = None
        closed = False
        async with anyio.create_task_group() as tg, receive:
            for task in self.stage.tasks:
                tg.start_soon(self._pump, outputs, task.task_number, send.clone())
            send.close()
            try:
                async for item in receive:
                    if isinstance(item, Exception):
                        failure = item
                        break
                    try:
                        yield item
                    except GeneratorExit:
                        closed = True
                        break
            finally:
                tg.cancel_scope.cancel()
        if failure is not None and not closed:
            raise failure

    async def _pump(
        self,
        outputs: StageOutputs,
        task_number: int,
        send: ObjectSendStream[pa.RecordBatch | Exception],
    ) -> None:
        async with send:
            try:
                async with (
                    outputs.task_output(self.stage, task_number) as stream,
                    closing(stream) as batches,
                ):
                    async for batch in batches:
                        await send.send(batch)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the consumer is gone
            except Exception as exc:
                try:
                    await send.send(exc)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return

    def __repr__(self) -> str:
        stage = self.stage
        return (
            f"NetworkCoalesce(stage={stage.stage_id}, tasks={stage.task_count},"
            f" partitions_per_task={stage.partitions_per_task})"
        )
