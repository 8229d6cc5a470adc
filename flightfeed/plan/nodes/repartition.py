"""Repartition: hash-partitions its input into N output partitions, executing the input once.

The first output opened starts the input in the task's background task group
(TaskContext.background): every input partition is pumped concurrently, each batch split by key
hash (see hash_partition.py) into a bounded Fanout (see fanout.py) of OUTPUT_BUFFER_BATCHES (4)
batches per output, also for outputs nobody reads yet. An output executes once per
TaskContext; closing every output stops the input. Read the outputs concurrently (Coalesce,
merge and the worker's partition ranges do): an output read later fills up and blocks the
input, so reading one after the other can hang.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.flightfeed.v1 import RepartitionNode
from ...errors import InvalidArgument
from ...protoencode import encode_message
from ..base import ExecutionPlan, TaskContext, UnaryNode, closing, expect_children
from ..codec import DecodeContext, parse_payload
from ..expr import Expr, output_type
from ..fanout import Fanout, hash_split, split_producer
from ..functions import BUILTINS, FunctionRegistry
from ..hash_partition import column_hash
from ..partitioning import Partitioning

OUTPUT_BUFFER_BATCHES = 4
"""Batches each output holds before the input waits for its reader: the node's memory bound."""


class Repartition(UnaryNode):
    """Hash-partitions its input into `partitioning.partition_count` outputs.

    Read the outputs concurrently: each holds at most OUTPUT_BUFFER_BATCHES batches, and a full
    one blocks the input for all of them.
    """

    name = "Repartition"

    def __init__(
        self,
        child: ExecutionPlan,
        partitioning: Partitioning,
        *,
        functions: FunctionRegistry = BUILTINS,
    ) -> None:
        for key in partitioning.hash_keys:
            column_hash(pa.nulls(0, output_type(key, child.schema, functions)))
        self.child = child
        self.partitioning = partitioning
        self._functions = functions

    @property
    def output_partitions(self) -> int:
        return self.partitioning.partition_count

    def output_hash_keys(self) -> tuple[Expr, ...]:
        return self.partitioning.hash_keys

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        expect_children(self.name, children, 1)
        return Repartition(children[0], self.partitioning, functions=self._functions)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        background = ctx.background
        if background is None:
            raise InvalidArgument(
                "Repartition needs TaskContext.background (a task group living as long as the"
                " task); use open_task_context()"
            )
        count = self.output_partitions

        def start() -> Fanout[pa.RecordBatch]:
            split = hash_split(self.partitioning.hash_keys, count, ctx.session)
            produce = split_producer(self.child, ctx, split)
            memory = ctx.memory.reservation(self.name)
            return Fanout(
                count, OUTPUT_BUFFER_BATCHES, produce, background, name=self.name, memory=memory
            )

        fanout = ctx.node_state(self, start)
        async with closing(fanout.open(partition)) as output:
            async for batch in output:
                yield batch

    def __repr__(self) -> str:
        return f"Repartition({self.partitioning})"


class RepartitionCodec:
    kinds = (Repartition.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, Repartition):
            raise InvalidArgument(f"RepartitionCodec cannot encode {node.name}")
        return encode_message(RepartitionNode(partitioning=node.partitioning.to_proto()))

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        msg = parse_payload(RepartitionNode, payload, kind)
        expect_children(kind, children, 1)
        partitioning = Partitioning.from_proto(msg.partitioning)
        return Repartition(children[0], partitioning, functions=ctx.session)
