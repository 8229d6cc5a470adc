"""The feed inbox reserves its units' bytes from the task's memory: as they arrive, before they
are kept; given back as they are taken; a replay log's kept until it goes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import FeedPartitionEnd, WorkUnitBatch
from flightfeed.errors import ResourceExhausted
from flightfeed.feeds import FeedInbox, UnitRun, encode_batch
from flightfeed.plan.base import closing
from flightfeed.plan.memory import MemoryPool

pytestmark = pytest.mark.anyio

A = b"A" * 16


def units(partition: int, *bodies: bytes) -> WorkUnitBatch:
    return encode_batch([UnitRun(A, partition, list(bodies), [1] * len(bodies))], sent_ns=2)


def inbox_with(
    limit: int | None, *, partitions: int = 2, replay_limit: int | None = None
) -> tuple[FeedInbox, MemoryPool]:
    pool = MemoryPool(limit)
    inbox = FeedInbox([(A, partitions)], credits=64, replay_limit=replay_limit)
    inbox.reserve_from(pool.task("t").reservation("feed inbox"))
    return inbox, pool


async def test_units_are_reserved_as_they_arrive_and_freed_as_they_are_taken() -> None:
    inbox, pool = inbox_with(None)
    inbox.deliver(units(0, b"x" * 1000, b"y" * 500))
    inbox.deliver(units(1, b"z" * 300))
    assert pool.reserved == 1800
    inbox.deliver(WorkUnitBatch(ends=[FeedPartitionEnd(id=A, partition=0)]))
    assert [body async for body in inbox.bodies(A, 0)] == [b"x" * 1000, b"y" * 500]
    assert pool.reserved == 300  # partition 1's unit is still buffered


async def test_a_batch_over_the_budget_is_refused_whole_and_changes_nothing() -> None:
    inbox, pool = inbox_with(1000)
    inbox.deliver(units(0, b"a" * 600))
    with pytest.raises(ResourceExhausted, match="feed inbox of task t asked for"):
        inbox.deliver(units(1, b"b" * 300, b"c" * 300))
    assert pool.reserved == 600
    assert inbox.buffered_units == 1


async def test_a_consumer_that_leaves_frees_what_it_left_buffered() -> None:
    inbox, pool = inbox_with(None)
    inbox.deliver(units(0, b"a" * 100, b"b" * 100, b"c" * 100))
    async with closing(inbox.bodies(A, 0)) as stream:
        assert await anext(stream) == b"a" * 100
    # gone for good: the rest is dropped
    assert pool.reserved == 0


async def test_a_failed_inbox_frees_every_buffer() -> None:
    inbox, pool = inbox_with(None)
    inbox.deliver(units(0, b"a" * 100))
    inbox.deliver(units(1, b"b" * 100))
    inbox.fail(RuntimeError("channel lost"))
    assert pool.reserved == 0


async def test_a_replay_log_keeps_its_reservation_until_it_is_dropped() -> None:
    inbox, pool = inbox_with(None, partitions=1, replay_limit=3)
    inbox.deliver(units(0, b"a" * 100, b"b" * 100))
    assert await _take(inbox, 2) == [b"a" * 100, b"b" * 100]
    assert pool.reserved == 200  # the log holds both for a reread
    inbox.deliver(units(0, b"c" * 100, b"d" * 100))
    reread = await _take(inbox, 4)  # the logged two again, then the two new ones
    assert reread == [b"a" * 100, b"b" * 100, b"c" * 100, b"d" * 100]
    assert pool.reserved == 0  # four units passed the replay limit of three: the log went


async def _take(inbox: FeedInbox, count: int) -> list[bytes]:
    async with closing(inbox.bodies(A, 0)) as stream:
        return [await anext(stream) for _ in range(count)]


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.integers(0, 1), st.lists(st.binary(max_size=64), min_size=1, max_size=5)),
        max_size=12,
    ),
    takes=st.integers(0, 40),
)
async def test_reserved_bytes_are_the_buffered_bodies(
    batches: list[tuple[int, list[bytes]]], takes: int
) -> None:
    """Whatever arrives and whatever is taken, the reservation is what stays buffered."""
    inbox, pool = inbox_with(None)
    for partition, bodies in batches:
        inbox.deliver(units(partition, *bodies))
    inbox.deliver(WorkUnitBatch(ends=[FeedPartitionEnd(id=A, partition=0)]))
    taken = 0
    async with closing(inbox.bodies(A, 0)) as stream:
        async for _ in stream:
            taken += 1
            if taken >= takes:
                break
    buffered = [b for p, bodies in batches if p == 1 for b in bodies]
    assert pool.reserved == sum(map(len, buffered))  # partition 0 was read or left: freed
