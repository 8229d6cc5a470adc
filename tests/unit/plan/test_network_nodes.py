"""Network nodes (NetworkCoalesce, NetworkShuffle, NetworkBroadcast): their codecs round-trip and
refuse what a hostile plan could carry; their reads are the rows the producer tasks hold.

The reads here go through an in-memory StageReader (producer tasks as MemoryScans), since
the logic is the subject: which buckets and copies each consumer task asks for. Real workers
reading each other are tested in tests/integration/coordinator/test_shuffles.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import NetworkShuffleNode, PlanNode
from flightfeed._generated.flightfeed.v1 import StageInput as StageInputProto
from flightfeed.errors import ExecutionError, InvalidArgument, PlanDecodeError
from flightfeed.plan import (
    CodecRegistry,
    ExecutionPlan,
    MemoryScan,
    Partitioning,
    TaskContext,
    col,
    collect,
    decode_plan,
    encode_plan,
    open_task_context,
)
from flightfeed.plan.fanout import hash_split
from flightfeed.plan.functions import BUILTINS
from flightfeed.plan.nodes import NetworkBroadcast, NetworkCoalesce, NetworkShuffle
from flightfeed.plan.stage_input import (
    STAGE_READER_KEY,
    Copies,
    HashBuckets,
    OwnPartitions,
    ReadHead,
    StageInput,
)
from flightfeed.session import Session

from .helpers import sample_table, sorted_rows

REGISTRY = CodecRegistry.builtin()
SESSION = Session()
SCHEMA = sample_table(2).schema
SCHEMA_BYTES = SCHEMA.serialize().to_pybytes()


def placed(tasks: int = 2, partitions: int = 3) -> StageInput:
    urls = tuple(f"grpc://10.0.0.{t}:8000" for t in range(tasks))
    return StageInput(1, tasks, partitions, SCHEMA).placed(b"q" * 16, urls)


class MemoryStages:
    """Producer task t of the stage is `tables[t]` split in its partitions; reads apply the
    head the way a worker's producer heads do (hash split, copies), and each read is logged."""

    def __init__(self, source: StageInput, tables: list[pa.Table]) -> None:
        self.source = source
        self.scans = [
            MemoryScan.from_table(t, source.partitions_per_task, batch_rows=16) for t in tables
        ]
        self.reads: list[tuple[int, ReadHead, range]] = []

    @asynccontextmanager
    async def read(
        self, source: StageInput, task_number: int, head: ReadHead, partitions: range
    ) -> AsyncIterator[AsyncIterator[pa.RecordBatch]]:
        assert source.stage_id == self.source.stage_id
        self.reads.append((task_number, head, partitions))
        yield self._batches(task_number, head, partitions)

    async def _batches(
        self, task: int, head: ReadHead, partitions: range
    ) -> AsyncIterator[pa.RecordBatch]:
        scan = self.scans[task]
        for p in range(scan.output_partitions):
            if isinstance(head, OwnPartitions) and p not in partitions:
                continue
            async for batch in scan.execute(p, TaskContext(session=SESSION)):
                if isinstance(head, HashBuckets):
                    split = hash_split(head.partitioning.hash_keys, _count(head), BUILTINS)
                    for bucket in partitions:
                        piece = split(batch)[bucket]
                        if piece is not None:
                            yield piece
                else:
                    yield batch


def _count(head: HashBuckets) -> int:
    return head.partitioning.partition_count


async def run_task(node: ExecutionPlan, stages: MemoryStages, task: int, tasks: int) -> pa.Table:
    async with open_task_context(SESSION) as ctx:
        ctx.task_number, ctx.task_count = task, tasks
        ctx.extensions[STAGE_READER_KEY] = stages
        return await collect(node, ctx)


def tables(rows: int = 200) -> list[pa.Table]:
    whole = sample_table(rows).cast(SCHEMA)
    return [whole.slice(0, rows // 2), whole.slice(rows // 2)]


@pytest.mark.parametrize(
    "node",
    [
        NetworkCoalesce(placed()),
        NetworkShuffle(placed(), Partitioning((col("k"), col("g")), 4), consumer_tasks=2),
        NetworkBroadcast(placed(3), consumer_tasks=5),
    ],
    ids=lambda node: node.name,
)
def test_round_trip(node: NetworkCoalesce | NetworkShuffle | NetworkBroadcast) -> None:
    data = encode_plan(node, REGISTRY)
    back = decode_plan(data, REGISTRY, SESSION)
    assert type(back) is type(node)
    assert getattr(back, "source", None) == node.source
    assert back.output_partitions == node.output_partitions
    assert back.schema == SCHEMA
    assert encode_plan(back, REGISTRY) == data


def test_an_unplaced_input_is_not_encoded() -> None:
    with pytest.raises(InvalidArgument, match="not placed on workers yet"):
        encode_plan(NetworkCoalesce(StageInput(3, 2, 1, SCHEMA)), REGISTRY)


def shuffle_bytes(**changes: object) -> bytes:
    node = NetworkShuffle(placed(), Partitioning((col("k"),), 4), consumer_tasks=2)
    msg = NetworkShuffleNode.parse(PlanNode.parse(encode_plan(node, REGISTRY)).payload)
    for name, value in changes.items():
        setattr(msg, name, value)
    return bytes(PlanNode(kind="NetworkShuffle", payload=bytes(msg)))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"consumer_tasks": 3}, "cannot be shared by 3 tasks"),
        ({"consumer_tasks": 0}, "cannot be shared by 0 tasks"),
        ({"consumer_tasks": 5}, "5 consumer tasks for 4 buckets"),
        ({"input": None}, "missing stage input"),
        ({"input": StageInputProto(stage_id=1, partitions_per_task=1)}, "names no tasks"),
        (
            {
                "input": StageInputProto(
                    stage_id=1, partitions_per_task=0, worker_urls=["a"], schema=SCHEMA_BYTES
                )
            },
            "partitions per task",
        ),
        (
            {"input": StageInputProto(stage_id=1, partitions_per_task=1, worker_urls=["a"])},
            "not a valid Arrow IPC schema",
        ),
        (
            {
                "input": StageInputProto(
                    stage_id=1, partitions_per_task=1, worker_urls=["a"] * 5000, schema=SCHEMA_BYTES
                )
            },
            "task count must be in",
        ),
    ],
)
def test_hostile_payloads_are_decode_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(PlanDecodeError, match=message):
        decode_plan(shuffle_bytes(**changes), REGISTRY, SESSION)


@pytest.mark.anyio
async def test_a_coalesce_reads_every_partition_of_every_task_once() -> None:
    source = placed(2, 3)
    stages = MemoryStages(source, tables())
    got = await run_task(NetworkCoalesce(source), stages, 0, 1)
    assert sorted_rows(got) == sorted_rows(sample_table(200))
    assert sorted(stages.reads, key=lambda r: r[0]) == [
        (0, OwnPartitions(), range(3)),
        (1, OwnPartitions(), range(3)),
    ]


@pytest.mark.anyio
@settings(max_examples=25, deadline=None)
@given(consumers=st.sampled_from([1, 2, 3, 6]), rows=st.integers(2, 300))
async def test_shuffle_buckets_split_rows_by_key_across_consumer_tasks(
    consumers: int, rows: int
) -> None:
    """Every row reaches exactly one consumer partition, and equal keys the same one."""
    source = placed(2, 2)
    shuffle = NetworkShuffle(source, Partitioning((col("k"),), 6), consumer_tasks=consumers)
    parts: list[pa.Table] = []
    for task in range(consumers):
        for partition in range(shuffle.output_partitions):
            stages = MemoryStages(source, tables(rows))
            parts.append(await run_partition(shuffle, partition, stages, task, consumers))
    assert sorted_rows(pa.concat_tables(parts)) == sorted_rows(sample_table(rows).cast(SCHEMA))
    owners: dict[object, int] = {}
    for index, part in enumerate(parts):
        for key in set(part.column("k").to_pylist()):
            assert owners.setdefault(key, index) == index  # a key lives in one partition


async def run_partition(
    shuffle: NetworkShuffle, partition: int, stages: MemoryStages, task: int, tasks: int
) -> pa.Table:
    async with open_task_context(SESSION) as ctx:
        ctx.task_number, ctx.task_count = task, tasks
        ctx.extensions[STAGE_READER_KEY] = stages
        batches = [batch async for batch in shuffle.execute(partition, ctx)]
    return pa.Table.from_batches(batches, schema=SCHEMA)


@pytest.mark.anyio
async def test_a_broadcast_gives_each_consumer_task_its_own_copy_of_everything() -> None:
    source = placed(2, 2)
    for task in range(3):
        stages = MemoryStages(source, tables())
        got = await run_task(NetworkBroadcast(source, consumer_tasks=3), stages, task, 3)
        assert sorted_rows(got) == sorted_rows(sample_table(200))
        assert {(t, h, p) for t, h, p in stages.reads} == {
            (0, Copies(3), range(task, task + 1)),
            (1, Copies(3), range(task, task + 1)),
        }


@pytest.mark.anyio
async def test_a_reader_in_the_wrong_task_count_fails_instead_of_reading_wrong_buckets() -> None:
    source = placed(2, 2)
    shuffle = NetworkShuffle(source, Partitioning((col("k"),), 4), consumer_tasks=2)
    with pytest.raises(ExecutionError, match="is read by 2 tasks; task 0 of 1"):
        await run_task(shuffle, MemoryStages(source, tables()), 0, 1)
    with pytest.raises(ExecutionError, match="runs only in a distributed query"):
        async with open_task_context(SESSION) as ctx:
            await collect(NetworkCoalesce(source), ctx)
