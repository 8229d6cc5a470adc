"""Per-partition back-pressure over real gRPC: a stalled partition stops only its provider,
huge feeds stay bounded by the credits, and every unit arrives once, in order."""

from __future__ import annotations

import random
from collections import Counter

import anyio
import pyarrow as pa
import pytest
from helpers.feed_scan import feed_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed.errors import FeedError
from flightfeed.plan import Coalesce
from flightfeed.testing import wait_for_no_tasks
from flightfeed.testing.feeds import UnitProvider, UnitScanEstimator, probe, unit_scan
from flightfeed.worker import WorkerConfig

pytestmark = pytest.mark.anyio


def units(partition: int, count: int) -> list[bytes]:
    return [f"{partition}:{i}".encode() for i in range(count)]


async def test_an_unread_partition_stops_its_provider_while_the_others_finish() -> None:
    credits, per_partition, stalled = 8, 300, 2
    with probe() as found:
        gate = found.gates[stalled] = anyio.Event()
        provider = UnitProvider([per_partition] * 4, probe=found)
        scan = unit_scan(provider, probe=found)
        async with (
            feed_cluster(1, config=WorkerConfig(feed_credits=credits)) as (coordinator, _),
            coordinator.execute(Coalesce(scan)) as stream,
        ):
            rows: Counter[int] = Counter()
            others = [p for p in range(4) if p != stalled]
            while any(rows[p] < per_partition for p in others):
                batch = await anext(stream)
                rows.update(batch.column("partition").to_pylist())
            # Every other partition of the same task is done; the stalled one never read a
            # unit, so the worker granted no credit beyond the first window.
            await provider.wait_pulls(stalled, credits)
            assert provider.pulls[stalled] == credits
            assert found.consumed.get(stalled, 0) == 0
            assert all(provider.pulls[p] == per_partition for p in others)
            sent = stream.delivery_log(scan.feed.id, stalled)
            assert [u.body for u in sent] == units(stalled, credits)[: len(sent)]
            assert all(u.created_timestamp_unix_nanos <= u.sent_timestamp_unix_nanos for u in sent)
            gate.set()
            async for batch in stream:
                rows.update(batch.column("partition").to_pylist())
        assert rows == dict.fromkeys(range(4), per_partition)
        assert provider.pulls == [per_partition] * 4
        with pytest.raises(FeedError, match="no delivery log"):
            stream.delivery_log(scan.feed.id, stalled)  # released when the partition finished


async def test_a_huge_feed_with_a_slow_consumer_stays_bounded_by_the_credits() -> None:
    credits, partitions, enough, log_limit = 64, 2, 200_000, 10_000
    with probe(delays={p: [1] for p in range(partitions)}) as found:
        provider = UnitProvider([10_000_000] * partitions, probe=found)
        scan = unit_scan(provider, probe=found, every=5_000)
        async with feed_cluster(  # delivery log on, capped: coordinator memory stays bounded
            1, config=WorkerConfig(feed_credits=credits), delivery_log_limit=log_limit
        ) as (coordinator, workers):
            taken = 0
            async with coordinator.execute(Coalesce(scan)) as stream:
                async for batch in stream:
                    taken += pa.compute.sum(batch.column("units")).as_py()
                    if taken >= enough:
                        break
                for p in range(partitions):
                    with pytest.raises(FeedError, match="delivery log dropped past"):
                        stream.delivery_log(scan.feed.id, p)
                metrics = stream.metrics
                assert metrics is not None
                sending = metrics.feed_partitions()
            with anyio.fail_after(1):
                await wait_for_no_tasks(workers)
        # End to end, no partition was ever pulled more than `credits` units ahead of its
        # consumer: provider backlog + in flight + worker buffer together.
        assert sum(provider.pulls) >= enough
        assert max(provider.max_ahead) <= credits
        assert found.inbox_credits == credits
        assert 0 < found.max_inbox_buffered <= credits * partitions
        for p in range(partitions):
            part = sending[(scan.feed.id, p)]
            assert part.units_pulled - part.units_sent <= credits
            assert part.units_sent - found.consumed[p] <= credits
        assert sorted(provider.closed) == list(range(partitions))  # providers were stopped


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    counts=st.lists(st.integers(0, 120), min_size=1, max_size=4),
    tasks=st.sampled_from([1, 2]),
    credits=st.integers(1, 6),
    seed=st.integers(0, 2**32),
)
async def test_every_unit_arrives_once_in_order_per_partition(
    counts: list[int], tasks: int, credits: int, seed: int
) -> None:
    if len(counts) % tasks:
        counts = counts + [0] * (tasks - len(counts) % tasks)
    rng = random.Random(seed)
    producer = {p: [rng.randrange(3) for _ in range(7)] for p in range(len(counts))}
    consumer = {p: [rng.randrange(3) for _ in range(5)] for p in range(len(counts))}
    with probe(delays=consumer) as found:
        provider = UnitProvider(counts, probe=found, delays=producer)
        scan = unit_scan(provider, probe=found)
        async with feed_cluster(
            2,
            config=WorkerConfig(feed_credits=credits),
            task_estimators={"UnitScan": UnitScanEstimator(tasks)},
            feed_batch_units=rng.choice([1, 3, 256]),
        ) as (coordinator, _):
            result = await coordinator.collect(Coalesce(scan))
            metrics = coordinator.metrics.latest
    got: dict[int, list[bytes]] = {p: [] for p in range(len(counts))}
    for partition, body in zip(
        result.column("partition").to_pylist(), result.column("body").to_pylist(), strict=True
    ):
        got[partition].append(body)
    assert got == {p: units(p, n) for p, n in enumerate(counts)}
    assert metrics is not None
    assert len(metrics.tasks) == tasks
    for (_, partition), part in metrics.feed_partitions().items():
        assert part.units_sent == part.units_received == part.units_consumed == counts[partition]
