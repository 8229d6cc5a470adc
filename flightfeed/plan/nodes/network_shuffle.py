"""NetworkShuffle: another stage's output hash-partitioned across this stage's tasks.

Each producer task runs once and splits its output by key hash into `partition_count` buckets
(the ExecuteTask repartition head: bounded buffers per bucket, so a slow reader slows its
producer and nothing piles up). Of the buckets, consumer task t owns [t*P, (t+1)*P) with
P = partition_count / consumer_tasks, and its partition p reads bucket t*P + p from every
producer task. Rows with equal keys meet in one partition of one task: what a final aggregate
or a partitioned join needs, without sending every row through one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import NetworkShuffleNode
from ...errors import InvalidArgument, PlanDecodeError
from ...protoencode import encode_message
from ..base import ExecutionPlan, PlanNodeBase, TaskContext, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..expr import Expr
from ..partitioning import Partitioning
from ..stage_input import HashBuckets, StageInput, check_reader_task, read_every_task, stage_reader


class NetworkShuffle(PlanNodeBase):
    name = "NetworkShuffle"

    def __init__(
        self, source: StageInput, partitioning: Partitioning, consumer_tasks: int = 1
    ) -> None:
        count = partitioning.partition_count
        if consumer_tasks < 1 or count % consumer_tasks:
            raise InvalidArgument(
                f"NetworkShuffle: {count} buckets cannot be shared by {consumer_tasks} tasks"
                " (the task count must divide the bucket count)"
            )
        self.source = source
        self.partitioning = partitioning
        self.consumer_tasks = consumer_tasks

    @property
    def schema(self) -> pa.Schema:
        return self.source.schema

    @property
    def output_partitions(self) -> int:
        return self.partitioning.partition_count // self.consumer_tasks

    def output_hash_keys(self) -> tuple[Expr, ...]:
        return self.partitioning.hash_keys

    def with_source(self, source: StageInput) -> NetworkShuffle:
        return NetworkShuffle(source, self.partitioning, self.consumer_tasks)

    def for_tasks(self, tasks: int) -> NetworkShuffle:
        """The same shuffle read by `tasks` consumer tasks (each owning its share of buckets)."""
        return NetworkShuffle(self.source, self.partitioning, tasks)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        check_reader_task(
            ctx, self.consumer_tasks, f"NetworkShuffle of stage {self.source.stage_id}"
        )
        bucket = ctx.task_number * self.output_partitions + partition
        reader = stage_reader(ctx, self.name)
        head = HashBuckets(self.partitioning)
        stream = read_every_task(reader, self.source, head, range(bucket, bucket + 1))
        async with closing(stream) as batches:  # closed here, in this task
            async for batch in batches:
                yield batch

    def __repr__(self) -> str:
        return (
            f"NetworkShuffle({self.source}, {self.partitioning},"
            f" consumer_tasks={self.consumer_tasks})"
        )


class NetworkShuffleCodec:
    kinds = (NetworkShuffle.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, NetworkShuffle):
            raise InvalidArgument(f"NetworkShuffleCodec cannot encode {node.name}")
        return encode_message(
            NetworkShuffleNode(
                input=node.source.to_proto(),
                partitioning=node.partitioning.to_proto(),
                consumer_tasks=node.consumer_tasks,
            )
        )

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(NetworkShuffleNode, payload, kind)
        expect_children(kind, children, 0)
        partitioning = Partitioning.from_proto(msg.partitioning)
        if msg.consumer_tasks > partitioning.partition_count:
            raise PlanDecodeError(
                f"{msg.consumer_tasks} consumer tasks for {partitioning.partition_count} buckets"
            )
        return NetworkShuffle(StageInput.from_proto(msg.input), partitioning, msg.consumer_tasks)
