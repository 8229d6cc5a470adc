"""IsolatedUnion: a union whose inputs run on different tasks of one stage.

A plain Union in a stage of T tasks runs every input in every task, each input's leaves split T
ways, so the stage can have no more tasks than its smallest input splits into: a union of two
single-task feeds ran as one task. Here input i owns tasks [first_i, first_i + count_i) and
runs in them as a stage of count_i tasks of its own (its task number and count are shifted in
the context it sees), so a union of n single-task feeds runs as n tasks side by side.

Every task offers the same partition count (a stage's tasks must: consumers read them alike):
the most any input has per task; a task whose input has fewer gives the rest empty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import IsolatedUnionNode
from ...errors import ExecutionError, InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing
from ..codec import DecodeContext, parse_payload
from ..stage_input import MAX_STAGE_TASKS


@dataclasses.dataclass(frozen=True)
class TaskSpan:
    """The tasks one input of an IsolatedUnion runs on: [first, first + count)."""

    first: int
    count: int

    def __contains__(self, task: object) -> bool:
        return isinstance(task, int) and self.first <= task < self.first + self.count


class IsolatedUnion(PlanNodeBase):
    name = "IsolatedUnion"

    def __init__(
        self, inputs: Sequence[ExecutionPlan], spans: Sequence[TaskSpan], total_tasks: int
    ) -> None:
        if not inputs or len(inputs) != len(spans):
            raise InvalidArgument(
                f"IsolatedUnion needs one task span per input: {len(inputs)} inputs,"
                f" {len(spans)} spans"
            )
        if not 1 <= total_tasks <= MAX_STAGE_TASKS:
            raise InvalidArgument(f"IsolatedUnion: total tasks {total_tasks} out of range")
        taken: set[int] = set()
        for span in spans:
            tasks = range(span.first, span.first + span.count)
            if span.count < 1 or span.first < 0 or tasks.stop > total_tasks:
                raise InvalidArgument(f"IsolatedUnion: {span} is not within {total_tasks} tasks")
            if taken.intersection(tasks):
                raise InvalidArgument("IsolatedUnion: two inputs share a task")
            taken.update(tasks)
        schema = inputs[0].schema
        for other in inputs[1:]:
            if not other.schema.equals(schema, check_metadata=False):
                raise InvalidArgument(f"Union inputs differ in schema: {schema} vs {other.schema}")
        self.inputs = tuple(inputs)
        self.spans = tuple(spans)
        self.total_tasks = total_tasks

    @property
    def schema(self) -> pa.Schema:
        return self.inputs[0].schema

    @property
    def output_partitions(self) -> int:
        return max(child.output_partitions for child in self.inputs)

    @property
    def children(self) -> Sequence[ExecutionPlan]:
        return self.inputs

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        return IsolatedUnion(children, self.spans, self.total_tasks)

    def owner(self, task: int) -> tuple[int, TaskSpan] | None:
        """The input that runs on `task`, and its span; None for a task that runs none."""
        for index, span in enumerate(self.spans):
            if task in span:
                return index, span
        return None

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        if ctx.task_count != self.total_tasks:
            raise ExecutionError(
                f"IsolatedUnion spans {self.total_tasks} tasks; it runs in a stage of"
                f" {ctx.task_count}"
            )
        found = self.owner(ctx.task_number)
        if found is None:
            return
        index, span = found
        child = self.inputs[index]
        if partition >= child.output_partitions:
            return
        own = dataclasses.replace(  # the same task, seen by the input as its own stage
            ctx, task_number=ctx.task_number - span.first, task_count=span.count
        )
        async with closing(child.execute(partition, own)) as stream:
            async for batch in stream:
                yield batch

    def __repr__(self) -> str:
        spans = ", ".join(
            f"{s.first}" if s.count == 1 else f"{s.first}..{s.first + s.count - 1}"
            for s in self.spans
        )
        return f"IsolatedUnion(tasks=[{spans}])"


class IsolatedUnionCodec:
    kinds = (IsolatedUnion.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, IsolatedUnion):
            raise InvalidArgument(f"IsolatedUnionCodec cannot encode {node.name}")
        return encode_message(
            IsolatedUnionNode(
                first_task=[s.first for s in node.spans],
                task_count=[s.count for s in node.spans],
                total_tasks=node.total_tasks,
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(IsolatedUnionNode, payload, kind)
        if len(msg.first_task) != len(msg.task_count):
            raise InvalidArgument("IsolatedUnion: first_task and task_count differ in length")
        spans = [TaskSpan(f, c) for f, c in zip(msg.first_task, msg.task_count, strict=True)]
        return IsolatedUnion(children, spans, msg.total_tasks)
