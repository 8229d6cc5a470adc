"""Repartition: one execution of the input fanned out by key hash to every output partition."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pyarrow as pa
import pytest

from flightfeed.errors import ExecutionError, InvalidArgument
from flightfeed.plan import (
    ExecutionPlan,
    Filter,
    MemoryScan,
    Partitioning,
    Repartition,
    TaskContext,
    UnaryNode,
    call,
    closing,
    col,
    collect_partition,
    hash_partition,
    lit,
    open_task_context,
    partition_ids,
)
from flightfeed.plan.functions import BUILTINS
from flightfeed.plan.nodes.repartition import OUTPUT_BUFFER_BATCHES
from flightfeed.session import Session

from .helpers import run, sample_table, sorted_rows

pytestmark = pytest.mark.anyio


async def read_outputs(plan: ExecutionPlan, ctx: TaskContext) -> list[pa.Table]:
    """Every output partition, each read in its own task (read one by one, they could hang)."""
    results: dict[int, pa.Table] = {}

    async def read(p: int) -> None:
        results[p] = pa.Table.from_batches(await collect_partition(plan, p, ctx), plan.schema)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for p in range(plan.output_partitions):
                tg.start_soon(read, p)
    return [results[p] for p in range(plan.output_partitions)]


async def test_outputs_hold_exactly_the_input_rows_by_key() -> None:
    table = sample_table(3000)
    plan = Repartition(MemoryScan.from_table(table, 3, batch_rows=64), Partitioning((col("k"),), 5))
    async with open_task_context(Session()) as ctx:
        parts = await read_outputs(plan, ctx)
    assert sorted_rows(pa.concat_tables(parts)) == sorted_rows(table)
    owners: dict[object, int] = {}
    for index, part in enumerate(parts):
        for key in set(part.column("k").to_pylist()):
            assert owners.setdefault(key, index) == index  # one key, one partition
    for index, part in enumerate(parts):  # and it is the partition hash_partition picks
        for batch in part.to_batches():
            pieces = hash_partition(batch, [col("k")], 5, BUILTINS)
            assert pieces[index].num_rows == batch.num_rows


async def test_outputs_read_concurrently() -> None:
    table = sample_table(2000)
    plan = Repartition(MemoryScan.from_table(table, 4, batch_rows=10), Partitioning((col("g"),), 3))
    async with open_task_context(Session()) as ctx:
        results = await read_outputs(plan, ctx)
    assert sum(t.num_rows for t in results) == 2000
    key_sets = [set(t.column("g").to_pylist()) for t in results]
    assert sum(len(keys) for keys in key_sets) == len(set().union(*key_sets)) == 3


async def test_input_error_reaches_every_consumer() -> None:
    table = pa.table({"a": pa.array([1, 0, 2], pa.int64())})
    failing = Filter(
        MemoryScan.from_table(table),
        call("greater", call("divide_checked", lit(1), col("a")), lit(0)),
    )
    plan = Repartition(failing, Partitioning((col("a"),), 2))
    async with open_task_context(Session()) as ctx:
        for p in range(2):
            with anyio.fail_after(5), pytest.raises(ExecutionError, match="divide"):
                await collect_partition(plan, p, ctx)


class Tap(UnaryNode):
    """Passes its input through, counting the batches pulled and noting closed partitions."""

    name = "Tap"

    def __init__(self, child: ExecutionPlan) -> None:
        self.child = child
        self.pulled = 0
        self.closed = [anyio.Event() for _ in range(child.output_partitions)]

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        try:
            async with closing(self.child.execute(partition, ctx)) as stream:
                async for batch in stream:
                    self.pulled += 1
                    yield batch
        finally:
            self.closed[partition].set()


async def test_closing_all_outputs_stops_the_input() -> None:
    table = sample_table(10_000)
    tap = Tap(MemoryScan.from_table(table, 2, batch_rows=10))
    plan = Repartition(tap, Partitioning((col("n"),), 2))
    async with open_task_context(Session()) as ctx:
        for p in range(2):
            async with closing(plan.execute(p, ctx)) as stream:
                async for _ in stream:
                    break
        with anyio.fail_after(10):  # the task context is still open: the pumps stopped
            for closed in tap.closed:
                await closed.wait()
        assert tap.pulled < 1000  # of 1000 input batches


async def test_an_unread_output_holds_at_most_its_buffer() -> None:
    # Every input batch has rows for both outputs, so each one adds a piece to output 1.
    table = pa.table({"k": pa.array([i % 8 for i in range(2000)], pa.int64())})
    batches = table.to_batches(max_chunksize=10)
    assert all(len(set(partition_ids(b, [col("k")], 2, BUILTINS).tolist())) == 2 for b in batches)
    tap = Tap(MemoryScan(table.schema, [batches]))
    plan = Repartition(tap, Partitioning((col("k"),), 2))
    read: list[pa.RecordBatch] = []

    async def read_output_0(ctx: TaskContext) -> None:
        async with closing(plan.execute(0, ctx)) as stream:
            read.extend([batch async for batch in stream])

    async with open_task_context(Session()) as ctx, anyio.create_task_group() as tg:
        tg.start_soon(read_output_0, ctx)
        await anyio.wait_all_tasks_blocked()
        # Output 1 holds its buffer; the input waits with one more batch in hand.
        assert tap.pulled == OUTPUT_BUFFER_BATCHES + 1
        unread = await collect_partition(plan, 1, ctx)
    assert tap.pulled == len(batches)
    rows = sum(b.num_rows for b in read) + sum(b.num_rows for b in unread)
    assert rows == table.num_rows


async def test_needs_background_and_executes_each_output_once() -> None:
    plan = Repartition(MemoryScan.from_table(sample_table(10)), Partitioning((col("k"),), 2))
    with pytest.raises(InvalidArgument, match="background"):
        await collect_partition(plan, 0, TaskContext(Session()))
    async with open_task_context(Session()) as ctx:
        await collect_partition(plan, 0, ctx)
        with pytest.raises(InvalidArgument, match="already opened"):
            await collect_partition(plan, 0, ctx)


def test_rejects_unhashable_keys() -> None:
    table = pa.table({"l": pa.array([[1], [2]])})
    with pytest.raises(InvalidArgument, match="type list"):
        Repartition(MemoryScan.from_table(table), Partitioning((col("l"),), 2))


async def test_collect_reads_partitions_concurrently_in_partition_order() -> None:
    # With 4 outputs of 4 batches each, reading them one after the other would hang.
    table = sample_table(500)
    plan = Repartition(MemoryScan.from_table(table, 2, batch_rows=5), Partitioning((col("n"),), 4))
    with anyio.fail_after(10):
        result = await run(plan)
    assert sorted_rows(result) == sorted_rows(table)
    ids = partition_ids(result.combine_chunks().to_batches()[0], [col("n")], 4, BUILTINS).tolist()
    assert ids == sorted(ids)  # partition 0's rows first, then 1's, ...
