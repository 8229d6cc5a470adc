"""NetworkBroadcast: another stage's whole output to every task of this stage.

The small side of a broadcast join: each producer task runs once and its output is copied to
`consumer_tasks` bounded buffers (the ExecuteTask broadcast head); consumer task t reads copy t
from every producer task, as one partition. So every task of the join sees every build row,
and the large side never moves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import NetworkBroadcastNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..stage_input import (
    MAX_STAGE_TASKS,
    Copies,
    StageInput,
    check_reader_task,
    read_every_task,
    stage_reader,
)


class NetworkBroadcast(PlanNodeBase):
    name = "NetworkBroadcast"

    def __init__(self, source: StageInput, consumer_tasks: int = 1) -> None:
        if not 1 <= consumer_tasks <= MAX_STAGE_TASKS:
            raise InvalidArgument(
                f"NetworkBroadcast: consumer tasks must be in [1, {MAX_STAGE_TASKS}],"
                f" got {consumer_tasks}"
            )
        self.source = source
        self.consumer_tasks = consumer_tasks

    @property
    def schema(self) -> pa.Schema:
        return self.source.schema

    @property
    def output_partitions(self) -> int:
        return 1

    def with_source(self, source: StageInput) -> NetworkBroadcast:
        return NetworkBroadcast(source, self.consumer_tasks)

    def for_tasks(self, tasks: int) -> NetworkBroadcast:
        return NetworkBroadcast(self.source, tasks)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        check_reader_task(
            ctx, self.consumer_tasks, f"NetworkBroadcast of stage {self.source.stage_id}"
        )
        reader = stage_reader(ctx, self.name)
        head = Copies(self.consumer_tasks)
        copy = range(ctx.task_number, ctx.task_number + 1)
        stream = read_every_task(reader, self.source, head, copy)
        async with closing(stream) as batches:  # closed here, in this task
            async for batch in batches:
                yield batch

    def __repr__(self) -> str:
        return f"NetworkBroadcast({self.source}, consumer_tasks={self.consumer_tasks})"


class NetworkBroadcastCodec:
    kinds = (NetworkBroadcast.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, NetworkBroadcast):
            raise InvalidArgument(f"NetworkBroadcastCodec cannot encode {node.name}")
        return encode_message(
            NetworkBroadcastNode(input=node.source.to_proto(), consumer_tasks=node.consumer_tasks)
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(NetworkBroadcastNode, payload, kind)
        expect_children(kind, children, 0)
        return NetworkBroadcast(StageInput.from_proto(msg.input), msg.consumer_tasks)
