"""read_ahead: a blocking source produced on a thread of its own, ahead of its consumer, with
the consumer setting the pace; errors raised at the consumer; an early close stops the thread."""

from __future__ import annotations

import threading

import anyio
import pytest

from flightfeed.concurrency import read_ahead
from flightfeed.plan.base import closing

pytestmark = pytest.mark.anyio


class Counting:
    """A source of 0..n-1 that records what it produced and on which thread."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n = n
        self.fail_at = fail_at
        self.produced = 0
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self) -> int | None:
        self.threads.add(threading.get_ident())
        with self.lock:
            i = self.produced
            if i == self.fail_at:
                raise ValueError(f"item {i} is bad")
            if i >= self.n:
                return None
            self.produced += 1
            return i


async def test_every_item_in_order_from_one_thread_not_the_loops() -> None:
    source = Counting(500)
    got = [item async for item in read_ahead(source, 3)]
    assert got == list(range(500))
    assert len(source.threads) == 1
    assert threading.get_ident() not in source.threads


async def test_the_consumer_sets_the_pace() -> None:
    source = Counting(100)
    async with closing(read_ahead(source, 4)) as items:
        async for item in items:
            if item == 10:
                # Produced ahead: at most the 4 waiting plus one in the thread's hands.
                await anyio.sleep(0.2)
                assert source.produced <= 10 + 1 + 4 + 1
                break
    stopped_at = source.produced
    await anyio.sleep(0.1)
    assert source.produced == stopped_at  # the thread was stopped, and waited for


async def test_an_error_is_raised_at_the_consumer_after_the_items_before_it() -> None:
    source = Counting(100, fail_at=7)
    got: list[int] = []

    async def consume() -> None:
        async for item in read_ahead(source, 2):
            got.append(item)  # noqa: PERF401  (what arrived before the error is the point)

    with pytest.raises(ValueError, match="item 7 is bad"):
        await consume()
    assert got == list(range(7))


async def test_cancelling_the_consumer_stops_the_thread() -> None:
    source = Counting(10**9)
    with anyio.move_on_after(0.2):
        async with closing(read_ahead(source, 2)) as items:
            async for _ in items:
                await anyio.sleep(0.01)
    stopped_at = source.produced
    await anyio.sleep(0.1)
    assert source.produced == stopped_at


async def test_an_empty_source() -> None:
    assert [item async for item in read_ahead(Counting(0), 2)] == []
