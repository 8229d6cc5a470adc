"""A query's feed partitions kept across its attempts (FeedReplay): every attempt is given the
units the provider gave, in order, whatever earlier attempts did (left early, were cancelled
mid-wait); the provider is opened once, pulled once per unit, only as far as a reader's credit
allows, and closed only when the query's task group is cancelled."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import Label
from flightfeed.errors import FeedError
from flightfeed.feeds.provider import encode_unit
from flightfeed.feeds.replay import FeedReplay

from .harness import task_context

pytestmark = pytest.mark.anyio

A = b"A" * 16
B = b"B" * 16


def bodies(partition: int, count: int) -> list[bytes]:
    return [f"{partition}:{i}".encode() for i in range(count)]


class Recorder:
    """A provider of fixed units per partition that records what happened to each stream.

    `taken[p]` is bumped by the test for every unit a reader took, so `max_ahead[p]` is the most
    units ever pulled ahead of the readers. `gates[(p, i)]` holds unit i of partition p until
    the event is set (the pump then waits inside the provider). `fail[p]` is raised after the
    partition's units; `close_error` from the stream's `finally`.
    """

    unit_type = bytes

    def __init__(
        self,
        units: Sequence[Sequence[Any]],
        *,
        delays: Sequence[Sequence[int]] = (),
        gates: dict[tuple[int, int], anyio.Event] | None = None,
        fail: dict[int, Exception] | None = None,
        close_error: Exception | None = None,
    ) -> None:
        self.units = [list(u) for u in units]
        self.delays = [list(d) for d in delays]
        self.gates = gates or {}
        self.fail = fail or {}
        self.close_error = close_error
        n = len(self.units)
        self.feed_calls = [0] * n
        self.yielded: list[list[Any]] = [[] for _ in range(n)]
        self.taken = [0] * n
        self.max_ahead = [0] * n
        self.waiting: set[int] = set()
        self.finished: set[int] = set()
        self.closed: list[int] = []
        """Partitions whose stream's `finally` ran, in that order."""

    def feed(self, partition: int, ctx: object, /) -> AsyncIterator[Any]:
        self.feed_calls[partition] += 1
        return self._stream(partition)

    async def _stream(self, p: int) -> AsyncIterator[Any]:
        try:
            for i, unit in enumerate(self.units[p]):
                delays = self.delays[p] if p < len(self.delays) else []
                for _ in range(delays[i % len(delays)] if delays else 0):
                    await anyio.lowlevel.checkpoint()
                gate = self.gates.get((p, i))
                if gate is not None:
                    self.waiting.add(p)
                    await gate.wait()
                    self.waiting.discard(p)
                self.yielded[p].append(unit)
                self.max_ahead[p] = max(self.max_ahead[p], len(self.yielded[p]) - self.taken[p])
                yield unit
            if p in self.fail:
                raise self.fail[p]
            self.finished.add(p)
        finally:
            self.closed.append(p)
            if self.close_error is not None:
                raise self.close_error

    @property
    def closed_early(self) -> list[int]:
        """Partitions closed before their units ran out."""
        return [p for p in self.closed if p not in self.finished and p not in self.fail]


def open_partition(
    replay: FeedReplay,
    provider: Recorder,
    partition: int,
    credit: Callable[[], int] = lambda: 4,
    feed_id: bytes = A,
) -> AsyncIterator[bytes]:
    return replay.open(feed_id, partition, provider, task_context(), credit)


async def read(
    replay: FeedReplay,
    provider: Recorder,
    partition: int = 0,
    limit: int | None = None,
    credit: Callable[[], int] = lambda: 4,
    feed_id: bytes = A,
) -> list[bytes]:
    """Up to `limit` units (all without one), then the iterator closed."""
    out: list[bytes] = []
    stream = open_partition(replay, provider, partition, credit, feed_id)
    try:
        while limit is None or len(out) < limit:
            try:
                body = await anext(stream)
            except StopAsyncIteration:
                break
            out.append(body)
            provider.taken[partition] += 1
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return out


async def read_until_error(
    replay: FeedReplay, provider: Recorder, partition: int = 0
) -> tuple[list[bytes], BaseException]:
    out: list[bytes] = []
    try:
        async for body in open_partition(replay, provider, partition):
            out.append(body)  # noqa: PERF401 (units before the error are kept)
    except Exception as exc:
        return out, exc
    raise AssertionError(f"the partition ended without an error after {out}")


async def settle() -> None:
    """Until the pumps and readers have done all they can without the test."""
    await anyio.wait_all_tasks_blocked()


# -- every attempt, however it ends, sees the provider's units in order ------------------------


attempt = st.tuples(
    st.sampled_from(["aclose", "cancel"]),
    st.lists(
        st.integers(0, 14), min_size=3, max_size=3
    ),  # aclose: units per partition; cancel: [0] = checkpoints
)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=3),
    delays=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=3, max_size=3),
    credit=st.integers(0, 5),
    attempts=st.lists(attempt, max_size=5),
    seed=st.integers(0, 2**32),
)
async def test_every_attempt_sees_a_prefix_and_the_last_all_units_pulled_once(
    counts: list[int],
    delays: list[list[int]],
    credit: int,
    attempts: list[tuple[str, list[int]]],
    seed: int,
) -> None:
    expected = [bodies(p, n) for p, n in enumerate(counts)]
    provider = Recorder(expected, delays=delays)
    partitions = range(len(counts))
    rng = random.Random(seed)

    async def reader_delay() -> None:
        for _ in range(rng.randrange(3)):
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=1000)
        for how, stops in attempts:
            seen: dict[int, list[bytes]] = {p: [] for p in partitions}
            if how == "aclose":  # each reader takes `stop` units, then closes its iterator

                async def take(p: int, stop: int, seen: dict[int, list[bytes]] = seen) -> None:
                    stream = open_partition(replay, provider, p, lambda: credit)
                    try:
                        for _ in range(stop):
                            try:
                                seen[p].append(await anext(stream))
                            except StopAsyncIteration:
                                break
                            await reader_delay()
                    finally:
                        await stream.aclose()  # type: ignore[attr-defined]

                async with anyio.create_task_group() as attempt_tg:
                    for p in partitions:
                        attempt_tg.start_soon(take, p, stops[p])
                for p in partitions:
                    assert seen[p] == expected[p][: stops[p]]
            else:  # readers read on; the attempt is cancelled after `stop` checkpoints

                async def take_all(p: int, seen: dict[int, list[bytes]] = seen) -> None:
                    stream = open_partition(replay, provider, p, lambda: credit)
                    while True:
                        try:
                            body = await anext(stream)
                        except StopAsyncIteration:
                            return
                        except anyio.get_cancelled_exc_class():
                            event("a reader was cancelled waiting for a unit")
                            raise
                        seen[p].append(body)
                        await reader_delay()

                async with anyio.create_task_group() as attempt_tg:
                    for p in partitions:
                        attempt_tg.start_soon(take_all, p)
                    for _ in range(stops[0]):
                        await anyio.lowlevel.checkpoint()
                    attempt_tg.cancel_scope.cancel()
                for p in partitions:
                    assert seen[p] == expected[p][: len(seen[p])]
            assert provider.closed_early == []  # no attempt ended a provider's stream

        final = {p: await read(replay, provider, p, credit=lambda: credit) for p in partitions}
        assert final == dict(enumerate(expected))
        assert provider.feed_calls == [1] * len(counts)
        assert provider.yielded == expected  # each unit pulled once, in order
        assert sorted(provider.finished) == list(partitions)
        assert [replay.units_logged(A, p) for p in partitions] == counts
        assert replay.unreplayable() == []
        tg.cancel_scope.cancel()
    assert provider.closed_early == []


async def test_the_provider_is_started_once_and_not_pulled_before_a_reader_asks() -> None:
    provider = Recorder([bodies(0, 5)])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        first = open_partition(replay, provider, 0)
        second = open_partition(replay, provider, 0)
        await settle()
        assert provider.feed_calls == [1]
        assert provider.yielded == [[]]
        assert replay.units_logged(A, 0) == 0
        assert await anext(first) == b"0:0"
        assert await anext(second) == b"0:0"
        await first.aclose()  # type: ignore[attr-defined]
        await second.aclose()  # type: ignore[attr-defined]
        assert provider.feed_calls == [1]
        tg.cancel_scope.cancel()


async def test_partitions_and_feeds_are_kept_apart() -> None:
    provider_a = Recorder([bodies(0, 3), bodies(1, 2)])
    provider_b = Recorder([[b"b0"]])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        assert await read(replay, provider_a, 1) == bodies(1, 2)
        assert await read(replay, provider_b, 0, feed_id=B) == [b"b0"]
        assert await read(replay, provider_a, 0) == bodies(0, 3)
        assert await read(replay, provider_a, 1) == bodies(1, 2)
        assert provider_a.feed_calls == [1, 1]
        assert provider_b.feed_calls == [1]
        assert (replay.units_logged(A, 0), replay.units_logged(B, 0)) == (3, 1)
        assert replay.units_logged(B, 7) == 0
        tg.cancel_scope.cancel()


async def test_concurrent_readers_of_one_partition_each_get_every_unit() -> None:
    provider = Recorder([bodies(0, 20)], delays=[[0, 2, 1]])
    got: list[list[bytes]] = []
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=1000)

        async def reader() -> None:
            got.append(await read(replay, provider, 0, credit=lambda: 1))

        async with anyio.create_task_group() as readers:
            for _ in range(3):
                readers.start_soon(reader)
        tg.cancel_scope.cancel()
    assert got == [bodies(0, 20)] * 3
    assert provider.yielded == [bodies(0, 20)]


# -- credit ------------------------------------------------------------------------------------


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    count=st.integers(0, 30),
    credit=st.integers(0, 6),
    pauses=st.lists(st.booleans(), max_size=30),
    delays=st.lists(st.integers(0, 3), min_size=1, max_size=4),
)
async def test_the_provider_is_never_pulled_more_than_the_credit_ahead(
    count: int, credit: int, pauses: list[bool], delays: list[int]
) -> None:
    provider = Recorder([bodies(0, count)], delays=[delays])
    window = max(1, credit)  # a reader always asks for one more unit
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=1000)
        stream = open_partition(replay, provider, 0, lambda: credit)
        got: list[bytes] = []
        for i in range(count + 1):
            try:
                got.append(await anext(stream))
            except StopAsyncIteration:
                break
            provider.taken[0] += 1
            if i < len(pauses) and pauses[i]:  # the reader stalls: the pump does all it may
                await settle()
                assert len(provider.yielded[0]) <= len(got) - 1 + window
                if i == 0:  # ... which is the whole window
                    assert len(provider.yielded[0]) == min(count, window)
        await stream.aclose()  # type: ignore[attr-defined]
        assert got == bodies(0, count)
        assert provider.max_ahead[0] <= window
        tg.cancel_scope.cancel()


async def test_a_stalled_reader_stops_its_provider_at_its_credit() -> None:
    credits = [3]
    provider = Recorder([bodies(0, 100)])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=1000)
        stream = open_partition(replay, provider, 0, lambda: credits[0])
        assert await anext(stream) == b"0:0"
        await settle()
        assert len(provider.yielded[0]) == 3  # asked at index 0 for 3 units
        for _ in range(2):  # read from the log: no new ask
            await anext(stream)
        await settle()
        assert len(provider.yielded[0]) == 3
        credits[0] = 5  # the credit is read at each ask
        assert await anext(stream) == b"0:3"
        await settle()
        assert len(provider.yielded[0]) == 3 + 5
        await stream.aclose()  # type: ignore[attr-defined]
        await settle()
        assert len(provider.yielded[0]) == 8  # a closed reader asks no more
        assert provider.closed == []
        tg.cancel_scope.cancel()
    assert provider.closed == [0]


# -- cancelled readers and the query's end ---------------------------------------------------


async def test_a_reader_cancelled_while_the_pump_waits_in_the_provider_leaves_it_running() -> None:
    gate = anyio.Event()
    provider = Recorder([bodies(0, 3)], gates={(0, 1): gate})
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        first: list[bytes] = []

        async def attempt() -> None:
            async for body in open_partition(replay, provider, 0, lambda: 1):
                first.append(body)  # noqa: PERF401 (kept when cancelled)

        async with anyio.create_task_group() as attempt_tg:
            attempt_tg.start_soon(attempt)
            await settle()
            assert provider.waiting == {0}  # the pump is inside the provider's `anext`
            assert first == [b"0:0"]
            attempt_tg.cancel_scope.cancel()
        await settle()
        assert provider.closed == []  # the provider's stream was not cancelled
        assert provider.waiting == {0}

        second: list[bytes] = []

        async def retry() -> None:
            second.extend(await read(replay, provider, 0, credit=lambda: 1))

        async with anyio.create_task_group() as attempt_tg:
            attempt_tg.start_soon(retry)
            await settle()
            assert second == []  # still waiting for unit 1
            gate.set()
        assert second == bodies(0, 3)
        assert provider.feed_calls == [1]
        assert provider.yielded == [bodies(0, 3)]
        assert provider.finished == {0}
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("blocked", [False, True], ids=["idle", "inside-provider"])
async def test_cancelling_the_query_task_group_closes_the_provider(blocked: bool) -> None:
    """Partition 0's pump waits for demand (its stream suspended at a `yield`); with `blocked`,
    partition 1's pump waits inside the provider for a reader that waits on it."""
    gate = anyio.Event()
    provider = Recorder([bodies(0, 5), bodies(1, 5)], gates={(1, 1): gate})
    results: list[tuple[list[bytes], BaseException]] = []

    async def reader(replay: FeedReplay) -> None:
        results.append(await read_until_error(replay, provider, 1))

    async with anyio.create_task_group() as readers:
        async with anyio.create_task_group() as tg:
            replay = FeedReplay(tg, log_limit=100)
            assert await read(replay, provider, 0, limit=1, credit=lambda: 1) == [b"0:0"]
            if blocked:
                readers.start_soon(reader, replay)
            await settle()
            assert provider.closed == []
            assert provider.waiting == ({1} if blocked else set())
            tg.cancel_scope.cancel()
        assert sorted(provider.closed) == ([0, 1] if blocked else [0])
        assert provider.finished == set()
    if blocked:  # the waiting reader is told the query ended, after the unit it was given
        ((out, exc),) = results
        assert out == [b"1:0"]
        assert isinstance(exc, FeedError)
        assert "the query ended" in str(exc)
    # A reader of a partition cut short replays its units, then hears the query ended.
    out, exc = await read_until_error(replay, provider, 0)
    assert out == [b"0:0"]
    assert isinstance(exc, FeedError)
    assert "the query ended" in str(exc)


async def test_a_provider_whose_close_fails_fails_its_partition() -> None:
    provider = Recorder([bodies(0, 5)], close_error=RuntimeError("close failed"))
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        assert await read(replay, provider, 0, limit=2, credit=lambda: 1) == bodies(0, 2)
        tg.cancel_scope.cancel()
    assert provider.closed == [0]
    out, exc = await read_until_error(replay, provider, 0)
    assert out == bodies(0, 2)
    assert isinstance(exc, RuntimeError)
    assert str(exc) == "close failed"


# -- provider errors ---------------------------------------------------------------------------


async def test_a_provider_error_follows_the_logged_units_for_every_reader() -> None:
    boom = RuntimeError("boom")
    provider = Recorder([bodies(0, 3)], fail={0: boom})
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        assert await read(replay, provider, 0, limit=1, credit=lambda: 1) == [b"0:0"]
        for _ in range(2):  # the failed attempt, then a retry replaying the same units
            out, exc = await read_until_error(replay, provider, 0)
            assert out == bodies(0, 3)
            assert exc is boom
        assert provider.feed_calls == [1]
        assert provider.yielded == [bodies(0, 3)]
        tg.cancel_scope.cancel()


async def test_a_provider_error_reaches_every_waiting_reader() -> None:
    gate = anyio.Event()
    provider = Recorder([bodies(0, 2)], gates={(0, 1): gate}, fail={0: RuntimeError("boom")})
    results: list[tuple[list[bytes], BaseException]] = []
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)

        async def reader() -> None:
            results.append(await read_until_error(replay, provider, 0))

        async with anyio.create_task_group() as readers:
            for _ in range(2):
                readers.start_soon(reader)
            await settle()
            assert results == []
            gate.set()
        tg.cancel_scope.cancel()
    assert [out for out, _ in results] == [bodies(0, 2)] * 2
    assert all(isinstance(exc, RuntimeError) and str(exc) == "boom" for _, exc in results)


async def test_a_provider_that_cannot_open_a_partition_fails_it() -> None:
    class Refuses(Recorder):
        def feed(self, partition: int, ctx: object, /) -> AsyncIterator[Any]:
            self.feed_calls[partition] += 1
            raise LookupError(f"no partition {partition}")

    provider = Refuses([[]])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        for _ in range(2):
            out, exc = await read_until_error(replay, provider, 0)
            assert out == []
            assert isinstance(exc, LookupError)
        assert provider.feed_calls == [1]
        tg.cancel_scope.cancel()


# -- units that are not bytes --------------------------------------------------------------------


async def test_units_that_are_not_bytes_are_logged_encoded() -> None:
    label = Label(name="k", value="v")
    provider = Recorder([[bytearray(b"xy"), label, b"z"]])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=100)
        got = await read(replay, provider, 0)
        assert got == [b"xy", encode_unit(label), b"z"]
        assert all(type(body) is bytes for body in got)
        assert await read(replay, provider, 0) == got
        tg.cancel_scope.cancel()


async def test_a_unit_that_cannot_be_encoded_fails_its_partition_not_the_query() -> None:
    provider = Recorder([[b"ok", "not a unit"]])
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            replay = FeedReplay(tg, log_limit=100)
            out, exc = await read_until_error(replay, provider, 0)
            assert out == [b"ok"]
            assert isinstance(exc, TypeError)
            tg.cancel_scope.cancel()


# -- the log limit -------------------------------------------------------------------------------


async def test_past_the_log_limit_a_partition_cannot_be_replayed() -> None:
    provider = Recorder([bodies(0, 5), bodies(1, 3)])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=3)
        assert await read(replay, provider, 0, credit=lambda: 1) == bodies(0, 5)  # unaffected
        assert await read(replay, provider, 1, credit=lambda: 1) == bodies(1, 3)
        (why,) = replay.unreplayable()
        assert f"feed {A.hex()} partition 0 " in why
        assert "3 units" in why
        with pytest.raises(FeedError, match="dropped from its replay log"):
            await read(replay, provider, 0)
        assert await read(replay, provider, 1) == bodies(1, 3)  # within the limit: replayed
        assert provider.feed_calls == [1, 1]
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(("read_units", "trimmed"), [(3, False), (4, False), (5, True)])
async def test_the_log_is_trimmed_once_it_holds_more_than_its_limit(
    read_units: int, trimmed: bool
) -> None:
    provider = Recorder([bodies(0, 5)])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=3)
        got = await read(replay, provider, 0, limit=read_units, credit=lambda: 1)
        assert got == bodies(0, read_units)
        assert bool(replay.unreplayable()) is trimmed
        if trimmed:
            with pytest.raises(FeedError):
                await read(replay, provider, 0)
        else:
            assert await read(replay, provider, 0) == bodies(0, 5)
        tg.cancel_scope.cancel()


async def test_past_its_bytes_a_partition_cannot_be_replayed() -> None:
    """Its unit count alone bounded the log: units that carry data grew a coordinator by 4 GB
    in 12 s (found by a probe)."""
    provider = Recorder([bodies(0, 50), bodies(1, 3)])
    budget = 8 * len(bodies(0, 1)[0])
    async with anyio.create_task_group() as tg:
        replay = FeedReplay(tg, log_limit=1000, log_bytes=budget)
        assert await read(replay, provider, 0, credit=lambda: 1) == bodies(0, 50)  # unaffected
        assert await read(replay, provider, 1, credit=lambda: 1) == bodies(1, 3)
        (why,) = replay.unreplayable()
        assert f"feed {A.hex()} partition 0 " in why
        assert f"{budget} bytes" in why
        with pytest.raises(FeedError, match="dropped from its replay log"):
            await read(replay, provider, 0)
        assert await read(replay, provider, 1) == bodies(1, 3)  # within the limit: replayed
        tg.cancel_scope.cancel()


async def test_a_log_limit_below_one_is_refused() -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(ValueError, match="at least one unit"):
            FeedReplay(tg, log_limit=0)
