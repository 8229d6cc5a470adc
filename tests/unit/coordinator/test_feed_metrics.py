"""Feed metrics from a worker's TaskMetrics as the coordinator reads them: each latency
sketch is sent once and p50, p95 and p99 all come from it."""

from __future__ import annotations

import pytest

from flightfeed._generated.flightfeed.v1 import (
    FeedPartitionEnd,
    Label,
    Metric,
    MetricsSet,
    NamedCount,
    PercentileLatency,
    TaskMetrics,
    WorkUnitBatch,
)
from flightfeed.coordinator.metrics import TaskRecord
from flightfeed.errors import InvalidArgument
from flightfeed.feeds import FeedInbox, LatencyHistogram, UnitRun, encode_batch
from flightfeed.protocol.channel_wire import EncodedTaskMetrics

pytestmark = pytest.mark.anyio

FEED = b"F" * 16


def record(metrics: list[Metric], partitions: int = 1) -> TaskRecord:
    task = TaskRecord(0, 0, "grpc://w", feed_partitions={FEED: list(range(partitions))})
    task.finish("finished", TaskMetrics(task_metrics=MetricsSet(metrics=metrics)))
    return task


async def test_each_latency_is_sent_once_and_read_back_at_every_percentile() -> None:
    inbox = FeedInbox([(FEED, 2)], credits=64)
    created = list(range(1_000, 41_000, 1_000))  # 40 units of different ages
    for partition in (0, 1):
        run = UnitRun(FEED, partition, [b"u"] * len(created), created)
        inbox.deliver(encode_batch([run], sent_ns=50_000), received_ns=60_000)
        inbox.deliver(WorkUnitBatch(ends=[FeedPartitionEnd(id=FEED, partition=partition)]))
        assert len([body async for body in inbox.bodies(FEED, partition)]) == 40
    metrics = inbox.to_metrics()
    sketches = [m for m in metrics if m.custom_p50_latency is not None]
    assert len(sketches) == 4  # two latencies per partition, each once
    assert not any(m.custom_p95_latency or m.custom_p99_latency for m in metrics)

    feeds = record(metrics, partitions=2).feeds()
    for partition in (0, 1):
        seen = feeds[(FEED, partition)]
        assert (seen.units_received, seen.units_consumed) == (40, 40)
        exact = inbox.partition_metrics(FEED, partition).created_to_received
        assert seen.created_to_received == exact  # 40 samples: the sketch keeps every one


def test_a_sketch_repeated_per_percentile_field_is_read_the_same() -> None:
    """The reference's form: the same sketch under each percentile field shown."""
    histogram = LatencyHistogram()
    histogram.add_many(range(1, 1001))
    sketch = PercentileLatency(name="feed_created_to_received", sketch_bytes=histogram.sketch())
    where = {"labels": [Label(name="feed", value=FEED.hex())], "partition": 0}
    count = Metric(count=NamedCount(name="feed_units_received", value=1000), **where)
    once = record([count, Metric(custom_p50_latency=sketch, **where)])
    repeated = record(
        [
            count,
            Metric(custom_p95_latency=sketch, **where),
            Metric(custom_p99_latency=sketch, **where),
        ]
    )
    latency = once.feeds()[(FEED, 0)].created_to_received
    assert latency == repeated.feeds()[(FEED, 0)].created_to_received
    assert latency.count == 1000
    assert abs(latency.p50_ns - 500) <= 500 / 32 + 10  # one quantile step of 101 points
    assert abs(latency.p95_ns - 950) <= 950 / 32 + 10
    assert abs(latency.p99_ns - 990) <= 990 / 32 + 10


def test_a_task_record_parses_encoded_metrics_when_first_read() -> None:
    histogram = LatencyHistogram()
    histogram.add_many(range(1, 41))
    where = {"labels": [Label(name="feed", value=FEED.hex())], "partition": 0}
    sketch = PercentileLatency(name="feed_created_to_received", sketch_bytes=histogram.sketch())
    metrics = TaskMetrics(
        pre_order_plan_metrics=[MetricsSet(metrics=[Metric(count=NamedCount(name="n", value=1))])],
        task_metrics=MetricsSet(
            metrics=[
                Metric(count=NamedCount(name="feed_units_received", value=40), **where),
                Metric(custom_p50_latency=sketch, **where),
            ]
        ),
    )
    task = TaskRecord(0, 0, "grpc://w", feed_partitions={FEED: [0]})
    task.finish("finished", EncodedTaskMetrics(bytes(metrics)))
    assert task.plan_metrics == list(metrics.pre_order_plan_metrics)
    assert task.task_metrics == metrics.task_metrics
    assert task.feeds()[(FEED, 0)].created_to_received == histogram.percentiles()

    broken = TaskRecord(0, 0, "grpc://w")
    broken.finish("finished", EncodedTaskMetrics(b"\x12\x03\x08\x01\x02"))
    assert broken.status == "finished"  # the query is not failed by its metrics
    with pytest.raises(InvalidArgument, match="TaskMetrics"):
        _ = broken.plan_metrics
