"""Coalesce: all input partitions into one, read concurrently; errors and early close."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
import pyarrow as pa
import pytest

from flightfeed.errors import ExecutionError
from flightfeed.plan import (
    Coalesce,
    ExecutionPlan,
    Limit,
    MemoryScan,
    PlanNodeBase,
    TaskContext,
    closing,
)
from flightfeed.session import Session

from .helpers import run, sample_table, sorted_rows

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("p", pa.int64())])


class Gated(PlanNodeBase):
    """Partition i yields one batch once partition i+1 has started: only concurrent reads finish."""

    name = "Gated"

    def __init__(self, partitions: int, fail_partition: int | None = None) -> None:
        self.partitions = partitions
        self.fail_partition = fail_partition
        self.started = [anyio.Event() for _ in range(partitions)]
        self.closed: list[int] = []

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    @property
    def output_partitions(self) -> int:
        return self.partitions

    def with_children(self, children: Sequence[ExecutionPlan], /) -> ExecutionPlan:
        return self

    async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
        self.started[partition].set()
        try:
            if partition + 1 < self.partitions:
                await self.started[partition + 1].wait()
            if partition == self.fail_partition:
                raise ExecutionError(f"partition {partition} broke")
            yield pa.record_batch([pa.array([partition])], schema=SCHEMA)
            if partition == 0 and self.fail_partition is not None:
                await anyio.sleep_forever()  # must be cancelled by the failure elsewhere
        finally:
            self.closed.append(partition)


async def test_coalesce_matches_input_rows() -> None:
    table = sample_table(200)
    plan = Coalesce(MemoryScan.from_table(table, 5, batch_rows=9))
    assert plan.output_partitions == 1
    got = await run(plan)
    assert sorted_rows(got) == sorted_rows(table)


async def test_coalesce_single_input_passes_through_in_order() -> None:
    table = sample_table(50)
    assert (await run(Coalesce(MemoryScan.from_table(table, 1, batch_rows=7)))).equals(table)


async def test_coalesce_reads_partitions_concurrently() -> None:
    gated = Gated(4)
    with anyio.fail_after(5):
        got = await run(Coalesce(gated))
    assert sorted(got.column("p").to_pylist()) == [0, 1, 2, 3]


async def test_coalesce_forwards_input_error_unwrapped() -> None:
    gated = Gated(3, fail_partition=2)
    with anyio.fail_after(5), pytest.raises(ExecutionError, match="partition 2 broke"):
        await run(Coalesce(gated))
    assert sorted(gated.closed) == [0, 1, 2]


async def test_coalesce_early_close_cancels_inputs() -> None:
    gated = Gated(3)
    ctx = TaskContext(Session())
    with anyio.fail_after(5):
        async with closing(Coalesce(gated).execute(0, ctx)) as stream:
            async for _ in stream:
                break
    assert sorted(gated.closed) == [0, 1, 2]


async def test_limit_over_coalesce_stops_early() -> None:
    table = sample_table(1000)
    got = await run(Limit(Coalesce(MemoryScan.from_table(table, 8, batch_rows=10)), 25))
    assert got.num_rows == 25


async def test_outer_cancellation_while_waiting_on_inputs() -> None:
    class Silent(Gated):
        async def _execute(self, partition: int, ctx: TaskContext) -> AsyncIterator[pa.RecordBatch]:
            try:
                await anyio.sleep_forever()
                yield pa.record_batch([pa.array([partition])], schema=SCHEMA)
            finally:
                self.closed.append(partition)

    silent = Silent(3)
    ctx = TaskContext(Session())
    with anyio.move_on_after(0.05) as scope:
        async with closing(Coalesce(silent).execute(0, ctx)) as stream:
            async for _ in stream:
                pass
    assert scope.cancelled_caught
    assert sorted(silent.closed) == [0, 1, 2]
