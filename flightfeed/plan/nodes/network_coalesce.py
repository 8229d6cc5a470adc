"""NetworkCoalesce: every output partition of every task of another stage, as one partition.

The reading half of a stage boundary where all rows must meet (a final aggregate of no keys,
a Limit, the query's result on the coordinator). Each producer task is read with one
ExecuteTask for all its partitions, all tasks concurrently (see stage_input.py); the node is
the same on the coordinator and on a worker, only the StageReader differs. Read by several
tasks, a coalesce is a broadcast: the planner turns it into a NetworkBroadcast.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import NetworkCoalesceNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..stage_input import OwnPartitions, StageInput, read_every_task, stage_reader


class NetworkCoalesce(PlanNodeBase):
    name = "NetworkCoalesce"

    def __init__(self, source: StageInput) -> None:
        self.source = source

    @property
    def schema(self) -> pa.Schema:
        return self.source.schema

    @property
    def output_partitions(self) -> int:
        return 1

    def with_source(self, source: StageInput) -> NetworkCoalesce:
        return NetworkCoalesce(source)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        reader = stage_reader(ctx, self.name)
        every = range(self.source.partitions_per_task)
        stream = read_every_task(reader, self.source, OwnPartitions(), every)
        async with closing(stream) as batches:  # closed here, in this task
            async for batch in batches:
                yield batch

    def __repr__(self) -> str:
        source = self.source
        return (
            f"NetworkCoalesce(stage={source.stage_id}, tasks={source.task_count},"
            f" partitions_per_task={source.partitions_per_task})"
        )


class NetworkCoalesceCodec:
    kinds = (NetworkCoalesce.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, NetworkCoalesce):
            raise InvalidArgument(f"NetworkCoalesceCodec cannot encode {node.name}")
        return encode_message(NetworkCoalesceNode(input=node.source.to_proto()))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(NetworkCoalesceNode, payload, kind)
        expect_children(kind, children, 0)
        return NetworkCoalesce(StageInput.from_proto(msg.input))
