"""Repartition: one execution of the input fanned out by key hash to every output partition."""

from __future__ import annotations

import anyio
import pyarrow as pa
import pytest

from flightfeed.errors import ExecutionError, InvalidArgument
from flightfeed.plan import (
    Filter,
    MemoryScan,
    Partitioning,
    Repartition,
    TaskContext,
    call,
    closing,
    col,
    collect_partition,
    hash_partition,
    lit,
    open_task_context,
)
from flightfeed.plan.functions import BUILTINS
from flightfeed.session import Session

from .helpers import run, sample_table, sorted_rows

pytestmark = pytest.mark.anyio


async def test_outputs_hold_exactly_the_input_rows_by_key() -> None:
    table = sample_table(3000)
    plan = Repartition(MemoryScan.from_table(table, 3, batch_rows=64), Partitioning((col("k"),), 5))
    async with open_task_context(Session()) as ctx:
        parts = [
            pa.Table.from_batches(await collect_partition(plan, p, ctx), schema=table.schema)
            for p in range(5)
        ]
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
    results: dict[int, pa.Table] = {}
    async with open_task_context(Session()) as ctx:

        async def read(p: int) -> None:
            results[p] = pa.Table.from_batches(await collect_partition(plan, p, ctx), plan.schema)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for p in range(3):
                    tg.start_soon(read, p)
    assert sum(t.num_rows for t in results.values()) == 2000
    key_sets = [set(t.column("g").to_pylist()) for t in results.values()]
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


async def test_closing_all_outputs_stops_the_input() -> None:
    table = sample_table(10_000)
    plan = Repartition(MemoryScan.from_table(table, 2, batch_rows=10), Partitioning((col("n"),), 2))
    async with open_task_context(Session()) as ctx:
        for p in range(2):
            async with closing(plan.execute(p, ctx)) as stream:
                async for _ in stream:
                    break
    # leaving the context would hang if the pumps were still blocked


async def test_needs_background_and_executes_each_output_once() -> None:
    plan = Repartition(MemoryScan.from_table(sample_table(10)), Partitioning((col("k"),), 2))
    with pytest.raises(InvalidArgument, match="background"):
        await collect_partition(plan, 0, TaskContext(Session()))
    async with open_task_context(Session()) as ctx:
        await collect_partition(plan, 0, ctx)
        with pytest.raises(InvalidArgument, match="already executed"):
            await collect_partition(plan, 0, ctx)


def test_rejects_unhashable_keys() -> None:
    table = pa.table({"l": pa.array([[1], [2]])})
    with pytest.raises(InvalidArgument, match="type list"):
        Repartition(MemoryScan.from_table(table), Partitioning((col("l"),), 2))


async def test_run_helper_reads_sequentially() -> None:
    table = sample_table(500)
    plan = Repartition(MemoryScan.from_table(table, 2, batch_rows=5), Partitioning((col("n"),), 4))
    assert sorted_rows(await run(plan)) == sorted_rows(table)
