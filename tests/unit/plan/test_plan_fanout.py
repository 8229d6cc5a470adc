"""Fanout: one producer run, N bounded outputs; memory bound, delivery, leaving, errors."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed.errors import Cancelled, InvalidArgument
from flightfeed.plan.base import closing
from flightfeed.plan.fanout import Fanout, FanoutSender

pytestmark = pytest.mark.anyio


class Broadcast:
    """A producer sending 0..count-1 to every output, recording its progress and its end."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.taken = 0  # items the producer has started to send
        self.delivered: dict[int, list[int]] = {}  # per output: the sends that went through
        self.finished = False
        self.cancelled = False
        self.cleaned_up = anyio.Event()

    async def __call__(self, sender: FanoutSender[int]) -> None:
        try:
            for item in range(self.count):
                self.taken += 1
                for output in range(sender.outputs):
                    if await sender.send(output, item):
                        self.delivered.setdefault(output, []).append(item)
            self.finished = True
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.cleaned_up.set()


async def read_all(output: AsyncIterator[int], into: list[int]) -> None:
    async with closing(output) as stream:
        async for item in stream:
            into.append(item)  # noqa: PERF401 (each item shows as it arrives)


async def test_an_unread_open_output_stops_the_producer_at_its_buffer() -> None:
    buffer, count = 3, 100
    producer = Broadcast(count)
    got: list[int] = []
    async with anyio.create_task_group() as tg:
        fanout = Fanout(2, buffer, producer, tg)
        tg.start_soon(read_all, fanout.open(0), got)
        unread = fanout.open(1)
        await anyio.wait_all_tasks_blocked()
        # Output 1 holds exactly its buffer; the producer waits with the next item in hand
        # while output 0, read as fast as it comes, has nothing more to read.
        assert producer.delivered[1] == list(range(buffer))
        assert producer.taken == buffer + 1
        assert got == list(range(buffer + 1))
        await unread.aclose()  # its reader leaves: the others flow to the end
        with anyio.fail_after(10):
            await producer.cleaned_up.wait()
    assert producer.finished
    assert got == list(range(count))
    assert producer.delivered[1] == list(range(buffer))


async def test_an_output_not_yet_opened_holds_its_buffer_and_loses_nothing() -> None:
    buffer, count = 2, 50
    producer = Broadcast(count)
    early: list[int] = []
    late: list[int] = []
    async with anyio.create_task_group() as tg:
        fanout = Fanout(2, buffer, producer, tg)
        tg.start_soon(read_all, fanout.open(0), early)
        await anyio.wait_all_tasks_blocked()
        assert producer.taken == buffer + 1  # output 1 has no reader yet: the producer waits
        assert early == list(range(buffer + 1))
        tg.start_soon(read_all, fanout.open(1), late)
    assert early == late == list(range(count))
    assert producer.finished


async def test_a_reader_that_leaves_drops_only_its_own_output() -> None:
    count = 40
    producer = Broadcast(count)
    got: dict[int, list[int]] = {0: [], 2: []}
    quitter: list[int] = []

    async def quit_after(output: AsyncIterator[int], items: int) -> None:
        async with closing(output) as stream:
            async for item in stream:
                quitter.append(item)
                if len(quitter) == items:
                    break

    async with anyio.create_task_group() as tg:
        fanout = Fanout(3, 1, producer, tg)
        tg.start_soon(quit_after, fanout.open(1), 5)
        for output, into in got.items():
            tg.start_soon(read_all, fanout.open(output), into)
    assert got == {0: list(range(count)), 2: list(range(count))}
    assert quitter == list(range(5))
    # Once it left, sends to output 1 were discarded: beyond what it read, only its buffer of
    # one went through.
    assert producer.delivered[1] == list(range(len(producer.delivered[1])))
    assert len(producer.delivered[1]) <= 5 + 1
    assert producer.finished


@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "exception-group"])
async def test_a_producer_error_reaches_every_reader_after_its_buffered_items(
    grouped: bool,
) -> None:
    async def failing(sender: FanoutSender[int]) -> None:
        for item in (1, 2):
            for output in range(sender.outputs):
                await sender.send(output, item)
        if grouped:
            async with anyio.create_task_group() as inner:
                inner.start_soon(explode)
        await explode()

    async def explode() -> None:
        raise ValueError("boom")

    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    errors: dict[int, Exception] = {}

    async def read(output: AsyncIterator[int], index: int) -> None:
        try:
            await read_all(output, got[index])
        except ValueError as exc:
            errors[index] = exc

    async with anyio.create_task_group() as tg:  # the producer never raises into it
        fanout = Fanout(3, 2, failing, tg)
        await read(fanout.open(0), 0)  # the producer has failed when this returns
        assert isinstance(fanout.error, ValueError)
        for index in (1, 2):  # opened after the failure: still the buffered items, then it
            tg.start_soon(read, fanout.open(index), index)
    assert got == {0: [1, 2], 1: [1, 2], 2: [1, 2]}
    assert sorted(errors) == [0, 1, 2]
    assert all(str(error) == "boom" for error in errors.values())


async def test_closing_every_output_cancels_the_producer() -> None:
    producer = Broadcast(10**9)
    async with anyio.create_task_group() as tg:
        fanout = Fanout(2, 4, producer, tg)
        outputs = [fanout.open(0), fanout.open(1)]
        for output in outputs:
            async with closing(output) as stream:
                assert await anext(stream) == 0
        with anyio.fail_after(10):
            await producer.cleaned_up.wait()
    assert producer.cancelled
    assert not producer.finished


async def test_a_producer_cancelled_from_outside_fails_its_readers() -> None:
    producer = Broadcast(10**9)
    async with anyio.create_task_group() as background:
        fanout = Fanout(1, 2, producer, background)
        output = fanout.open(0)
        assert await anext(output) == 0
        background.cancel_scope.cancel()
    assert producer.cancelled
    rest: list[int] = []
    with pytest.raises(Cancelled, match="producer was cancelled"):
        await read_all(output, rest)
    assert rest == list(range(1, len(rest) + 1))  # what was buffered, then the error


async def test_each_output_opens_once() -> None:
    async with anyio.create_task_group() as tg:
        fanout = Fanout(2, 3, Broadcast(3), tg)
        first = fanout.open(0)
        with pytest.raises(InvalidArgument, match="already opened"):
            fanout.open(0)
        with pytest.raises(InvalidArgument, match="no output 2"):
            fanout.open(2)
        for output in (first, fanout.open(1)):
            await read_all(output, [])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    outputs=st.integers(1, 4),
    buffer=st.integers(0, 3),
    routes=st.lists(st.sets(st.integers(0, 3)), max_size=40),
    stops=st.lists(st.none() | st.integers(0, 12), min_size=4, max_size=4),
    seed=st.integers(0, 2**32),
)
async def test_every_item_arrives_once_in_order_and_nobody_runs_ahead_of_its_buffer(
    outputs: int,
    buffer: int,
    routes: list[set[int]],
    stops: list[int | None],
    seed: int,
) -> None:
    """Item i goes to the outputs in routes[i]; reader j leaves after stops[j] items (None: it
    reads to the end). Readers run concurrently and pause at random scheduling points."""
    expected = {j: [i for i, route in enumerate(routes) if j in route] for j in range(outputs)}
    requested = dict.fromkeys(range(outputs), 0)  # anext calls each reader has begun
    sent = dict.fromkeys(range(outputs), 0)
    ahead = dict.fromkeys(range(outputs), 0)  # the most sends ever beyond those requests
    got: dict[int, list[int]] = {j: [] for j in range(outputs)}
    done = anyio.Event()

    async def produce(sender: FanoutSender[int]) -> None:
        rng = random.Random(seed)
        try:
            for item, route in enumerate(routes):
                for output in sorted(route):
                    if output < outputs and await sender.send(output, item):
                        sent[output] += 1
                        ahead[output] = max(ahead[output], sent[output] - requested[output])
                if rng.random() < 0.3:
                    await anyio.lowlevel.checkpoint()
        finally:
            done.set()

    async def read(output: AsyncIterator[int], j: int) -> None:
        rng = random.Random(seed + j + 1)
        stop = stops[j]
        async with closing(output) as stream:
            while stop is None or len(got[j]) < stop:
                requested[j] += 1
                try:
                    got[j].append(await anext(stream))
                except StopAsyncIteration:
                    break
                for _ in range(rng.randrange(3)):
                    await anyio.lowlevel.checkpoint()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            fanout = Fanout(outputs, buffer, produce, tg)
            for j in range(outputs):
                tg.start_soon(read, fanout.open(j), j)
        await done.wait()  # the producer ran to its end or was cancelled, never left hanging
    for j in range(outputs):
        stop = stops[j]
        assert got[j] == (expected[j] if stop is None else expected[j][:stop])
        assert ahead[j] <= buffer
