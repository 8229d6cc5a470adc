"""The memory pool: reservations grow before data is held, refusals name who asked and which
limit they hit, and a task's end returns everything it held."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import Cancelled, InvalidArgument, ResourceExhausted
from flightfeed.plan import MemoryScan, Sort, SortKey, col
from flightfeed.plan.execution import collect, open_task_context
from flightfeed.plan.memory import (
    MACHINE_MEMORY_BYTES,
    SMALL_BATCH_BYTES,
    MemoryPool,
    batch_nbytes,
    parse_memory_size,
)
from flightfeed.session import SessionStateBuilder


def test_reservations_count_against_the_task_and_the_pool() -> None:
    pool = MemoryPool(1000)
    task = pool.task("t1", limit=600)
    held = task.reservation("Sort")
    held.grow(400)
    held.resize(500)
    assert (held.size, task.reserved, pool.reserved) == (500, 500, 500)
    with pytest.raises(ResourceExhausted) as raised:
        held.grow(200)
    assert raised.value.message == (
        "Sort of task t1 asked for 200 bytes more; the task holds 500 bytes of its memory"
        " budget of 600 bytes"
    )
    assert (held.size, pool.reserved) == (500, 500)  # a refusal reserves nothing
    held.shrink(100)
    held.free()
    held.free()
    assert (held.size, task.reserved, pool.reserved, pool.peak) == (0, 0, 0, 500)


def test_the_pool_refuses_what_other_tasks_leave_no_room_for() -> None:
    pool = MemoryPool(2 << 20)
    first = pool.task("first").reservation("HashJoin")
    first.grow(1536 << 10)
    second = pool.task("second").reservation("HashAggregate")
    with pytest.raises(ResourceExhausted) as raised:
        second.grow(1 << 20)
    assert raised.value.message == (
        "HashAggregate of task second asked for 1.0 MiB (1048576 bytes); the worker's memory"
        " limit is 2.0 MiB (2097152 bytes), of which 1.5 MiB (1572864 bytes) is held by"
        " running tasks"
    )
    first.free()
    second.grow(1 << 20)  # the first task's memory came back


def test_closing_a_task_returns_everything_and_refuses_more() -> None:
    pool = MemoryPool(None)
    task = pool.task("t")
    a, b = task.reservation("a"), task.reservation("b")
    a.grow(10)
    b.grow(20)
    task.close()
    assert pool.reserved == 0
    a.free()  # after close: nothing is returned twice
    assert pool.reserved == 0
    with pytest.raises(Cancelled, match="the task has ended"):
        b.grow(1)


def test_reservations_from_threads_add_up() -> None:
    pool = MemoryPool(None)
    task = pool.task("t")

    def churn() -> None:
        held = task.reservation("worker thread")
        for _ in range(2000):
            held.grow(3)
            held.shrink(1)
        held.free()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (task.reserved, pool.reserved) == (0, 0)
    assert pool.peak >= 2 * 2000


@pytest.mark.parametrize("limit", [0, -1])
def test_limits_must_be_positive(limit: int) -> None:
    with pytest.raises(InvalidArgument):
        MemoryPool(limit)
    with pytest.raises(InvalidArgument):
        MemoryPool(None).task("t", limit)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("512MiB", 512 << 20),
        ("4 GiB", 4 << 30),
        ("1.5gib", 3 << 29),
        ("2KB", 2000),
        ("50%", MACHINE_MEMORY_BYTES // 2),
    ],
)
def test_memory_sizes(text: str, expected: int) -> None:
    assert abs(parse_memory_size(text) - expected) <= 1


@pytest.mark.parametrize("text", ["", "lots", "12XB", "0", "-5MiB", "150%", "0%", "nan", "GiB"])
def test_bad_memory_sizes_are_invalid(text: str) -> None:
    with pytest.raises(InvalidArgument, match=r"memory size|at most 100%"):
        parse_memory_size(text)


@given(st.text(max_size=12))
def test_any_text_is_a_size_or_invalid(text: str) -> None:
    with contextlib.suppress(InvalidArgument):
        assert parse_memory_size(text) >= 1


@pytest.mark.anyio
async def test_one_task_over_the_pool_fails_while_another_keeps_its_memory() -> None:
    """Two tasks share a pool: the one that asks for too much fails naming its operator; the
    other finishes, and when both are done the pool holds nothing."""
    pool = MemoryPool(3 << 20)
    session = SessionStateBuilder().build()
    small = pa.table({"k": list(range(10_000, 0, -1))})  # 80 KB
    large = pa.table({"k": list(range(500_000, 0, -1))})  # 4 MB
    results: dict[str, object] = {}

    async def run(name: str, table: pa.Table) -> None:
        plan = Sort(MemoryScan.from_table(table, batch_rows=4096), [SortKey(col("k"))])
        async with open_task_context(session, memory_pool=pool) as ctx:
            try:
                results[name] = (await collect(plan, ctx)).column("k")[0].as_py()
            except ResourceExhausted as exc:
                results[name] = exc.message

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "large", large)
        tg.start_soon(run, "small", small)
    assert results["small"] == 1
    assert isinstance(results["large"], str)
    assert results["large"].startswith("Sort of task 0 asked for")
    assert "the worker's memory limit is 3.0 MiB" in results["large"]
    assert pool.reserved == 0


@pytest.mark.anyio
async def test_fanout_buffers_are_reserved_until_read_and_a_broadcast_counts_once() -> None:
    from flightfeed.plan.fanout import Fanout, FanoutSender

    pool = MemoryPool(None)
    held = pool.task("t").reservation("broadcast head buffers")
    batch = pa.record_batch({"k": list(range(1000))})
    sent = anyio.Event()

    async def produce(sender: FanoutSender[pa.RecordBatch]) -> None:
        for output in range(4):
            await sender.send(output, batch, -(-batch.nbytes // 4))
        sent.set()

    async with anyio.create_task_group() as tg:
        fanout = Fanout(4, 2, produce, tg, memory=held)
        outputs = [fanout.open(i) for i in range(4)]
        await sent.wait()
        assert batch.nbytes <= held.size < batch.nbytes + 4  # one batch, shared by four
        for output in outputs[:3]:
            assert await anext(output) is batch
        assert 0 < held.size <= -(-batch.nbytes // 4)
        await outputs[3].aclose()  # leaving drops (and frees) what was buffered for it
    assert held.size == 0


@given(
    st.lists(
        st.tuples(st.integers(0, 12_000), st.integers(0, 12_000), st.booleans(), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_batch_nbytes_is_exact_for_large_batches_and_bounded_for_small_ones(
    shapes: list[tuple[int, int, bool, bool]],
) -> None:
    """Sliced, with or without nulls, tables or batches, one after the other (freed batches'
    ids are reused at once): the size of the object asked about, exactly when its buffers are
    large, never below it and at most SMALL_BATCH_BYTES above it when they are small."""
    for rows, start, nulls, as_table in shapes:
        ints = pa.array(np.arange(rows), pa.int64())
        if nulls:
            ints = pc.if_else(pc.equal(pc.bit_wise_and(ints, 3), 0), None, ints)
        batch = pa.record_batch({"i": ints, "s": pc.cast(ints, pa.string())})
        piece: pa.RecordBatch | pa.Table = batch.slice(start % (rows + 1), rows // 2)
        if as_table:
            piece = pa.Table.from_batches([piece])
        for sized in (piece, piece, batch):  # (the second: remembered)
            exact = sized.nbytes
            if sized.get_total_buffer_size() > SMALL_BATCH_BYTES:
                assert batch_nbytes(sized) == exact
            else:
                assert exact <= batch_nbytes(sized) <= exact + SMALL_BATCH_BYTES
        del batch, piece


def test_batch_nbytes_keeps_no_batch_alive() -> None:
    batch = pa.record_batch({"k": np.arange(100_000)})  # large: measured and remembered
    batch_nbytes(batch)
    gone = weakref.ref(batch)
    del batch
    gc.collect()
    assert gone() is None
