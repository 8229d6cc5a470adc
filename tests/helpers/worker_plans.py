"""Worker test support: plans, a user node and its codec, a header-driven session builder."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from flightfeed._generated.flightfeed.v1 import (
    BroadcastExecHead,
    ExecuteTaskRequest,
    NoneHead,
    RepartitionExecHead,
    SetPlanRequest,
    TaskKey,
)
from flightfeed.errors import InvalidArgument
from flightfeed.plan import (
    CodecRegistry,
    DecodeContext,
    ExecutionPlan,
    MemoryScan,
    Partitioning,
    ScalarUdf,
    TaskContext,
    UnaryNode,
    col,
    encode_partitioning,
    encode_plan,
)
from flightfeed.session import Session, WorkerQueryContext

TABLE = pa.table(
    {
        "k": pa.array(range(2_000), pa.int64()),
        "v": pa.array([float(i) / 2 for i in range(2_000)]),
        "s": pa.array([f"row-{i}" for i in range(2_000)]),
    }
)


def scan(partitions: int = 4) -> MemoryScan:
    return MemoryScan.from_table(TABLE, partitions, batch_rows=100)


class ExplodingNode(UnaryNode):
    """A user node that yields one batch of its input, then raises."""

    name = "Exploding"

    def __init__(self, child: ExecutionPlan, message: str) -> None:
        self.child = child
        self.message = message

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        return ExplodingNode(children[0], self.message)

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        async for batch in self.child.execute(partition, ctx):
            yield batch
            raise ValueError(self.message)


class ExplodingCodec:
    kinds = (ExplodingNode.name,)

    def encode(self, node: ExecutionPlan, /) -> bytes:
        if not isinstance(node, ExplodingNode):
            raise InvalidArgument("not an ExplodingNode")
        return node.message.encode()

    def decode(
        self, kind: str, payload: bytes, children: Sequence[ExecutionPlan], ctx: DecodeContext, /
    ) -> ExecutionPlan:
        return ExplodingNode(children[0], payload.decode())


USER_CODECS = CodecRegistry.builtin().with_codec(ExplodingCodec())


def tag_udf(tag: str) -> ScalarUdf:
    """A UDF whose output depends on the session it was built for."""
    return ScalarUdf(
        "tag",
        lambda values: pc.binary_join_element_wise(
            pa.array([tag] * len(values)), pc.cast(values, pa.string()), ":"
        ),
        pa.string(),
    )


async def header_session_builder(ctx: WorkerQueryContext) -> Session:
    """Injects the `tag` UDF from the `x-tag` header, and the user node's codec."""
    builder = ctx.builder.with_codec(ExplodingCodec())
    tag = ctx.headers.get("x-tag")
    if tag is not None:
        builder = builder.with_scalar_udf(tag_udf(tag))
    return builder.build()


def new_key(stage: int = 1, task: int = 0) -> TaskKey:
    return TaskKey(query_id=uuid.uuid4().bytes, stage_id=stage, task_number=task)


def set_plan(
    plan: ExecutionPlan, key: TaskKey, registry: CodecRegistry = USER_CODECS
) -> SetPlanRequest:
    return SetPlanRequest(task_key=key, task_count=1, plan_proto=encode_plan(plan, registry))


def none_request(key: TaskKey, start: int, end: int) -> ExecuteTaskRequest:
    return ExecuteTaskRequest(
        task_key=key, target_partition_start=start, target_partition_end=end, none=NoneHead()
    )


def repartition_request(key: TaskKey, index: int, outputs: int) -> ExecuteTaskRequest:
    partitioning = encode_partitioning(Partitioning((col("k"),), outputs))
    return ExecuteTaskRequest(
        task_key=key,
        target_partition_start=index,
        target_partition_end=index + 1,
        repartition=RepartitionExecHead(partitioning=partitioning),
    )


def broadcast_request(key: TaskKey, index: int, outputs: int) -> ExecuteTaskRequest:
    return ExecuteTaskRequest(
        task_key=key,
        target_partition_start=index,
        target_partition_end=index + 1,
        broadcast=BroadcastExecHead(output_partitions=outputs),
    )


def sorted_by_k(table: pa.Table) -> pa.Table:
    return table.sort_by("k")
