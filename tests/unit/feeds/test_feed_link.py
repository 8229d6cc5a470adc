"""Dispatcher and inbox joined by an in-memory channel: delivery, back-pressure, errors, replay."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import FeedCredits, Label, PartitionCredit, WorkUnitBatch
from flightfeed.errors import FeedError
from flightfeed.feeds import (
    FEED_INBOX_KEY,
    FeedAssignment,
    FeedDispatcher,
    FeedInbox,
    WorkUnitFeed,
)
from flightfeed.feeds.codec import decode_batch
from flightfeed.testing.feeds import UnitProvider

from .harness import feed_link, task_context

pytestmark = pytest.mark.anyio

A = b"A" * 16
B = b"B" * 16


def credit(feed: bytes, partition: int, credits: int) -> FeedCredits:
    return FeedCredits(credits=[PartitionCredit(id=feed, partition=partition, credits=credits)])


def bodies(feed: str, partition: int, count: int) -> list[bytes]:
    return [f"{feed}{partition}:{i}".encode() for i in range(count)]


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    counts_a=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    counts_b=st.lists(st.integers(0, 60), max_size=3),
    credits=st.integers(1, 8),
    presumed_share=st.sampled_from([0.0, 0.5, 1.0]),
    max_units=st.integers(1, 20),
    channel_buffer=st.integers(1, 3),
    linger=st.sampled_from([0.0, 0.0005]),
    packed=st.booleans(),
    seed=st.integers(0, 2**32),
)
async def test_every_unit_arrives_once_in_order_per_partition(
    counts_a: list[int],
    counts_b: list[int],
    credits: int,
    presumed_share: float,
    max_units: int,
    channel_buffer: int,
    linger: float,
    packed: bool,
    seed: int,
) -> None:
    provider_a = UnitProvider(units=[bodies("a", p, n) for p, n in enumerate(counts_a)])
    provider_b = UnitProvider(units=[bodies("b", p, n) for p, n in enumerate(counts_b)])
    # Task-local partition i of feed A is the provider's global partition order_a[i].
    order_a = list(range(len(counts_a)))
    random.Random(seed).shuffle(order_a)
    feeds = {
        A: FeedAssignment(provider_a, order_a),
        B: FeedAssignment(provider_b, list(range(len(counts_b)))),
    }
    got: dict[tuple[bytes, int], list[bytes]] = {}

    async def consume(link: Any, feed: bytes, partition: int, rng: random.Random) -> None:
        out = got.setdefault((feed, partition), [])
        async for body in link.inbox.bodies(feed, partition):
            out.append(body)
            for _ in range(rng.randrange(3)):  # consumer delays, as scheduling points
                await anyio.lowlevel.checkpoint()

    async with (
        feed_link(
            feeds,
            credits=credits,
            presumed=int(credits * presumed_share),
            channel_buffer=channel_buffer,
            max_batch_units=max_units,
            linger=linger,
            packed=packed,
        ) as link,
        anyio.create_task_group() as tg,
    ):
        for feed, (_, partitions) in feeds.items():
            for partition in range(len(partitions)):
                tg.start_soon(consume, link, feed, partition, random.Random(seed + partition))
    for local, global_partition in enumerate(order_a):
        assert got[(A, local)] == bodies("a", global_partition, counts_a[global_partition])
    for partition, count in enumerate(counts_b):
        assert got[(B, partition)] == bodies("b", partition, count)
    assert all(0 < n <= max_units for n in link.batches if n)
    sent = link.dispatcher.metrics()
    for (feed, partition), metrics in link.inbox.metrics().items():
        count = len(got[(feed, partition)])
        assert metrics.received == metrics.consumed == count
        assert sent[(feed, partition)].units_sent == count
    assert sorted(provider_a.closed) == list(range(len(counts_a)))


@pytest.mark.parametrize("presumed", [0, 8, 16])
async def test_an_unread_partition_stops_its_provider_at_exactly_its_credits(
    presumed: int,
) -> None:
    credits = 16
    provider = UnitProvider(units=[bodies("a", p, 500) for p in range(3)])
    assignment = {A: FeedAssignment(provider, [0, 1, 2])}
    async with feed_link(assignment, credits=credits, presumed=presumed) as link:
        async with anyio.create_task_group() as tg:
            for partition in (0, 2):

                async def read_all(partition: int = partition) -> None:
                    assert len([b async for b in link.inbox.bodies(A, partition)]) == 500

                tg.start_soon(read_all)
        await link.waiters.until(lambda: link.inbox.partition_metrics(A, 1).buffered == credits)
        # Partitions 0 and 2 finished at full speed; partition 1 holds its window and no more.
        assert provider.pulls == [500, credits, 500]
        assert sorted(provider.closed) == [0, 2]
        assert link.dispatcher.metrics()[(A, 1)].credit == 0


async def test_memory_stays_bounded_with_a_huge_provider_and_a_slow_consumer() -> None:
    credits, partitions, reads = 32, 2, 3000
    provider = UnitProvider([1_000_000] * partitions)
    peak = 0

    def observe(inbox: FeedInbox) -> None:
        nonlocal peak
        peak = max(peak, inbox.buffered_units)
        assert inbox.buffered_units <= credits * partitions

    async with feed_link(
        {A: FeedAssignment(provider, list(range(partitions)))}, credits=credits, observe=observe
    ) as link:

        async def slow(partition: int) -> None:
            taken = 0
            async for body in link.inbox.bodies(A, partition):
                assert body == f"{partition}:{taken}".encode()
                taken += 1
                # Everything pulled but not yet consumed is in flight under credit.
                assert provider.pulls[partition] <= taken + credits
                await anyio.lowlevel.checkpoint()
                if taken == reads:
                    return

        async with anyio.create_task_group() as tg:
            for partition in range(partitions):
                tg.start_soon(slow, partition)
    assert 0 < peak <= credits * partitions
    assert max(provider.pulls) <= reads + credits
    assert sorted(provider.closed) == list(range(partitions))  # providers closed on exit


async def test_a_provider_error_reaches_only_its_partition_with_its_message() -> None:
    provider = UnitProvider(
        units=[bodies("a", p, 20) for p in range(3)], fail_at={1: (5, "upstream page 6 missing")}
    )
    results: dict[int, list[bytes] | str] = {}
    async with feed_link({A: FeedAssignment(provider, [0, 1, 2])}, credits=4) as link:

        async def read(partition: int) -> None:
            got: list[bytes] = []
            try:
                async for body in link.inbox.bodies(A, partition):
                    got.append(body)  # noqa: PERF401 - keeps what arrived before the error
            except FeedError as error:
                results[partition] = f"{len(got)} then {error.error_type}: {error.message}"
            else:
                results[partition] = got

        async with anyio.create_task_group() as tg:
            for partition in range(3):
                tg.start_soon(read, partition)
    assert results == {
        0: bodies("a", 0, 20),
        1: "5 then RuntimeError: feed provider failed: upstream page 6 missing",
        2: bodies("a", 2, 20),
    }


async def test_replay_returns_exactly_the_units_delivered() -> None:
    credits = 8
    provider = UnitProvider(units=[bodies("a", 0, 20)])
    async with feed_link({A: FeedAssignment(provider, [0])}, credits=credits) as link:
        await link.waiters.until(lambda: link.inbox.buffered_units == credits)
        replayed = link.dispatcher.replay(A, 0)
        stream = link.inbox.units(A, 0)
        delivered = [await anext(stream) for _ in range(credits)]
        assert [(u.body, u.created_ns, u.sent_ns) for u in delivered] == [
            (u.body, u.created_timestamp_unix_nanos, u.sent_timestamp_unix_nanos) for u in replayed
        ]
        assert all(u.id == A and u.partition == 0 for u in replayed)
        rest = [u.body async for u in stream]
        assert [u.body for u in delivered] + rest == bodies("a", 0, 20)
        assert [u.body for u in link.dispatcher.replay(A, 0)] == bodies("a", 0, 20)
        # The worker's finish acknowledges the end: the log is released.
        await link.waiters.until(lambda: link.dispatcher.metrics()[(A, 0)].finished)
        with pytest.raises(FeedError, match="no delivery log"):
            link.dispatcher.replay(A, 0)


async def test_the_delivery_log_is_dropped_past_its_bytes() -> None:
    """Capped only by its unit count, the log of units that carry data (200 KB each) grew a
    coordinator by 4 GB in 12 s (found by a probe)."""
    provider = UnitProvider(units=[bodies("a", 0, 20), bodies("a", 1, 20)])
    size = len(bodies("a", 0, 1)[0])
    feeds = {A: FeedAssignment(provider, [0, 1])}
    async with feed_link(feeds, credits=30, log_bytes=10 * size) as link:
        await link.waiters.until(lambda: link.inbox.buffered_units == 40)
        for partition in (0, 1):
            with pytest.raises(FeedError, match=f"dropped past 100000 units or {10 * size} bytes"):
                link.dispatcher.replay(A, partition)
        for partition in (0, 1):  # (delivered all the same)
            assert [u async for u in link.inbox.bodies(A, partition)] == bodies("a", partition, 20)


async def test_a_consumer_that_stops_early_stops_its_provider() -> None:
    provider = UnitProvider([1_000_000])
    async with feed_link({A: FeedAssignment(provider, [0])}, credits=4) as link:
        stream = link.inbox.bodies(A, 0)
        assert await anext(stream) == b"0:0"
        await stream.aclose()  # type: ignore[attr-defined]
        await link.waiters.until(lambda: link.dispatcher.metrics()[(A, 0)].finished)
        await provider.waiters.until(lambda: provider.closed == [0])
    assert provider.pulls[0] <= 1 + 4


async def test_remote_feed_decodes_messages_and_raw_bytes_from_providers() -> None:
    labels = [[Label(name=f"p{p}", value=str(i)) for i in range(5)] for p in range(5)]
    # Pre-encoded units travel as they are: every other unit is already bytes.
    units = [[bytes(u) if i % 2 else u for i, u in enumerate(p)] for p in labels]
    provider = UnitProvider(units=units, unit_type=Label)
    local = WorkUnitFeed.new(provider)
    remote = WorkUnitFeed.from_proto(local.to_proto(), Label)
    expected = [(f"p{p}", str(i)) for p in (3, 4) for i in range(5)]
    async with feed_link({local.id: FeedAssignment(provider, [3, 4])}, credits=2) as link:
        ctx = task_context()
        ctx.extensions[FEED_INBOX_KEY] = link.inbox
        got = [(u.name, u.value) for p in (0, 1) async for u in remote.feed(p, ctx)]
    assert got == expected
    # On the coordinator the same handle calls the provider directly (global partitions).
    got_local = [(u.name, u.value) for p in (3, 4) async for u in local.feed(p, task_context())]
    assert got_local == expected


async def test_batches_respect_the_byte_bound_and_oversized_units_go_alone() -> None:
    units = [b"x" * 100] * 6 + [b"y" * 1000] + [b"z" * 10] * 3
    provider = UnitProvider(units=[units])
    sizes: list[list[int]] = []

    async def send(batch: WorkUnitBatch) -> None:
        assert batch.packed is not None
        ends = memoryview(batch.packed.body_ends).cast("I").tolist()
        sizes.append([b - a for a, b in zip([0, *ends], ends, strict=False)])

    dispatcher = FeedDispatcher(
        {A: FeedAssignment(provider, [0])},
        send,
        task_context(),
        max_batch_bytes=250,
        linger=0,
    )
    dispatcher.grant(credit(A, 0, 100))
    await dispatcher.run()
    assert [size for batch in sizes for size in batch] == [len(u) for u in units]
    assert all(sum(batch) <= 250 or len(batch) == 1 for batch in sizes)
    assert [1000] in sizes
    assert dispatcher.units_sent(A, 0) == len(units)
    assert dispatcher.provider_metrics() == {A: {"pulls": len(units)}}


async def test_cancel_stops_pull_loops_and_closes_providers() -> None:
    provider = UnitProvider([10, 10])
    sending = anyio.Event()

    async def send(batch: WorkUnitBatch) -> None:
        sending.set()
        await anyio.sleep_forever()  # a channel that never drains

    dispatcher = FeedDispatcher(
        {A: FeedAssignment(provider, [0, 1])}, send, task_context(), max_batch_units=4
    )
    dispatcher.grant(credit(A, 0, 4))
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.run)
        await sending.wait()
        dispatcher.cancel()
    assert provider.closed == [0]
    assert provider.pulls == [4, 0]  # partition 1 was never granted: its provider never ran


async def test_partition_done_releases_the_log_and_unknown_credit_is_an_error() -> None:
    provider = UnitProvider([3])
    batches: list[WorkUnitBatch] = []

    async def send(batch: WorkUnitBatch) -> None:
        batches.append(batch)

    dispatcher = FeedDispatcher({A: FeedAssignment(provider, [0])}, send, task_context())
    dispatcher.grant(credit(A, 0, 10))
    await dispatcher.run()
    assert [u.body for u in dispatcher.replay(A, 0)] == [b"0:0", b"0:1", b"0:2"]
    assert [(e.id, e.partition) for b in batches for e in b.ends] == [(A, 0)]
    dispatcher.partition_done(A, 0)
    with pytest.raises(FeedError):
        dispatcher.replay(A, 0)
    with pytest.raises(FeedError, match="protocol violation"):
        dispatcher.grant(credit(B, 0, 1))
    assert [(d.id, d.partitions) for d in dispatcher.declarations()] == [(A, 1)]


async def test_presumed_credits_send_units_before_any_grant_and_no_more() -> None:
    provider = UnitProvider([10, 2])
    sent: list[tuple[int, bytes]] = []

    async def send(batch: WorkUnitBatch) -> None:
        for run in decode_batch(batch).runs:
            sent.extend((run.partition, run.body(i)) for i in range(len(run)))

    dispatcher = FeedDispatcher(
        {A: FeedAssignment(provider, [0, 1])}, send, task_context(), presumed_credits=3, linger=0
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            await provider.waiters.until(lambda: provider.pulls == [3, 2])
            await anyio.wait_all_tasks_blocked()
            # No grant came: the presumed window went out, partition 0 waits for credit.
            assert sent == [(0, b"0:0"), (0, b"0:1"), (0, b"0:2"), (1, b"1:0"), (1, b"1:1")]
            assert dispatcher.metrics()[(A, 0)].credit == 0
            dispatcher.grant(credit(A, 0, 8))  # the last credit finds the partition's end
    assert [body for partition, body in sent if partition == 0] == [b"0:%d" % i for i in range(10)]
    assert sorted(provider.closed) == [0, 1]
