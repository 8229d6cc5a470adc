"""A feed inbox writes its metrics byte for byte as betterproto2 writes the Metric objects
of `to_metrics()`: counts of zero (left out), sketches empty, whole and summarized (over 101
samples), partition 0 (an optional field: written), and feed ids of any bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import (
    FeedPartitionEnd,
    Metric,
    MetricsSet,
    NamedTime,
    TaskMetrics,
    WorkUnitBatch,
)
from flightfeed.feeds import FeedInbox, UnitRun, encode_batch
from flightfeed.messages import parse_strict
from flightfeed.plan.metrics_wire import encode_task_metrics

pytestmark = pytest.mark.anyio

partition_units = st.lists(st.integers(0, 10**12), max_size=130)  # created_ns of each unit


@st.composite
def inboxes(draw: st.DrawFn) -> tuple[FeedInbox, list[tuple[bytes, int, list[int], int]]]:
    """An inbox over 1-3 feeds of 1-3 partitions: per partition, units delivered (with their
    creation times) and how many of them were consumed."""
    feeds = draw(st.lists(st.binary(min_size=1, max_size=16), min_size=1, max_size=3, unique=True))
    declared = [(feed_id, draw(st.integers(1, 3))) for feed_id in feeds]
    plan = []
    for feed_id, partitions in declared:
        for partition in range(partitions):
            created = draw(partition_units)
            plan.append((feed_id, partition, created, draw(st.integers(0, len(created)))))
    return FeedInbox(declared, credits=256), plan


async def _fill(inbox: FeedInbox, plan: list[tuple[bytes, int, list[int], int]]) -> None:
    for feed_id, partition, created, consumed in plan:
        if created:
            run = UnitRun(feed_id, partition, [b"u"] * len(created), created)
            inbox.deliver(encode_batch([run], sent_ns=10**12), received_ns=2 * 10**12)
        inbox.deliver(WorkUnitBatch(ends=[FeedPartitionEnd(id=feed_id, partition=partition)]))
        if not consumed:
            continue
        taken = 0
        async for _ in inbox.bodies(feed_id, partition):
            taken += 1
            if taken == consumed:
                break


@settings(max_examples=40, deadline=None)
@given(inboxes())
async def test_feed_metrics_are_written_as_betterproto2_writes_them(
    case: tuple[FeedInbox, list[tuple[bytes, int, list[int], int]]],
) -> None:
    inbox, plan = case
    await _fill(inbox, plan)
    expected = MetricsSet(metrics=inbox.to_metrics())
    assert inbox.encoded_metrics() == bytes(expected)

    task_wide = MetricsSet(metrics=[Metric(time=NamedTime(name="t", value=7))])
    data = encode_task_metrics([], task_wide, inbox.encoded_metrics())
    merged = TaskMetrics(task_metrics=MetricsSet(metrics=task_wide.metrics + expected.metrics))
    assert data == bytes(merged)
    assert parse_strict(TaskMetrics, data) == merged
