"""Structured Streaming over a flightfeed table: offsets are the work units discovered so far,
so a query sees units that appear after it started; a restart from the checkpoint reads no unit
twice; Trigger.AvailableNow and maxUnitsPerTrigger bound what a run or a micro-batch reads."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from flightfeed.cluster import CoordinatorCluster
from flightfeed.coordinator import table_command
from flightfeed.coordinator.streams import stream_id
from flightfeed.spark.client import stream_action
from flightfeed.testing.feeds import LiveProvider, live_provider


def stream_of(
    spark: Any, service: CoordinatorCluster, name: str, table: str = "live", **options: str
) -> Any:
    reader = spark.readStream.format("flightfeed").option("uri", service.location)
    reader = reader.option("table", table).option("args", json.dumps([name, 2]))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


class Sink:
    """Rows each micro-batch delivered, in the driver."""

    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []

    def __call__(self, frame: Any, batch_id: int) -> None:
        self.batches.append(sorted(row.body for row in frame.select("body").collect()))

    @property
    def bodies(self) -> list[bytes]:
        return sorted(body for batch in self.batches for body in batch)


class Live:
    """A live table's provider, pushed to on the cluster's event loop (as a `queue`: the
    "queue" table, whose provider hands each unit out once)."""

    def __init__(self, service: CoordinatorCluster, *, queue: bool = False) -> None:
        assert service.portal is not None
        self.service = service
        self.portal = service.portal
        self.name = uuid.uuid4().hex
        self.table = "queue" if queue else "live"
        self.provider: LiveProvider = self.portal.call(
            partial(live_provider, self.name, 2, queue=queue)
        )

    def push(self, partition: int, *bodies: bytes) -> None:
        """Push units and wait until the stream's providers discovered them (so a query's
        next offsets include them; a stream opened before the first push)."""
        stream = self.service.coordinator.streams.get(stream_id(self.table, [self.name, 2]))
        key = f"0:{partition}"
        discovered = self.portal.call(stream.latest)[key] + len(bodies)
        self.portal.call(self.provider.push, partition, *bodies)
        self.portal.call(stream.wait_discovered, key, discovered)

    def open(self) -> None:
        """Open the stream, as a query's first offsets would."""
        command = table_command(self.table, [self.name, 2])
        stream_action(self.service.location, "stream_open", command, {})


@contextmanager
def running(query: Any) -> Iterator[Any]:
    try:
        yield query
    finally:
        query.stop()


def all_available(spark: Any, service: CoordinatorCluster, live: Live, checkpoint: str) -> Sink:
    """What a query from `checkpoint` reads of the live table until it has read all there is."""
    sink = Sink()
    writer = stream_of(spark, service, live.name, live.table).writeStream.foreachBatch(sink)
    with running(writer.option("checkpointLocation", checkpoint).start()) as query:
        query.processAllAvailable()
    return sink


def test_a_stream_sees_units_that_appear_later_and_a_restart_reads_none_twice(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    live = Live(service)
    live.open()
    live.push(0, b"a", b"b")
    checkpoint = str(tmp_path / "checkpoint")
    first = Sink()
    writer = stream_of(spark, service, live.name).writeStream.foreachBatch(first)
    with running(writer.option("checkpointLocation", checkpoint).start()) as query:
        query.processAllAvailable()
        assert first.bodies == [b"a", b"b"]
        live.push(1, b"c")
        live.push(0, b"d")
        query.processAllAvailable()
        assert first.bodies == [b"a", b"b", b"c", b"d"]
    live.push(1, b"e")  # while no query runs
    second = all_available(spark, service, live, checkpoint)
    assert second.bodies == [b"e"]  # resumed at the checkpoint: nothing read twice


def test_available_now_reads_what_was_discovered_and_stops(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    live = Live(service)
    live.open()
    live.push(0, b"p", b"q")
    live.push(1, b"r")
    sink = Sink()
    writer = stream_of(spark, service, live.name, live.table).writeStream.foreachBatch(sink)
    query = writer.option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
    started = query.start()
    started.awaitTermination(120)
    assert not started.isActive
    assert sink.bodies == [b"p", b"q", b"r"]


def test_max_units_per_trigger_bounds_each_micro_batch(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    live = Live(service)
    live.open()
    live.push(0, *[f"u{i}".encode() for i in range(5)])
    live.push(1, *[f"v{i}".encode() for i in range(3)])
    sink = Sink()
    frame = stream_of(spark, service, live.name, maxUnitsPerTrigger="3")
    writer = frame.writeStream.foreachBatch(sink)
    with running(writer.option("checkpointLocation", str(tmp_path / "cp")).start()) as query:
        query.processAllAvailable()
    assert all(len(batch) <= 3 for batch in sink.batches)
    assert len(sink.bodies) == 8
    assert sink.bodies == sorted(
        [f"u{i}".encode() for i in range(5)] + [f"v{i}".encode() for i in range(3)]
    )


def test_available_now_over_a_stream_nobody_opened_reads_what_its_providers_have(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    """A job's first run opens the stream itself: it read nothing, the providers' units not yet
    discovered when it took its offsets."""
    live = Live(service)
    live.portal.call(live.provider.push, 0, b"x", b"y")  # waiting in the provider, not discovered
    live.portal.call(live.provider.push, 1, b"z")
    sink = Sink()
    writer = stream_of(spark, service, live.name, live.table).writeStream.foreachBatch(sink)
    query = writer.option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
    started = query.start()
    started.awaitTermination(120)
    assert sink.bodies == [b"x", b"y", b"z"]


def test_a_stream_closed_while_idle_resumes_at_the_checkpoint(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    """Reopened, its providers discover their units again; the query waits for them up to its
    checkpoint instead of failing as 'behind'."""
    live = Live(service)
    live.open()
    live.push(0, b"a", b"b")
    checkpoint = str(tmp_path / "checkpoint")
    assert all_available(spark, service, live, checkpoint).bodies == [b"a", b"b"]
    live.portal.call(service.coordinator.streams.close_idle, -1.0)  # every stream, idle
    live.portal.call(live.provider.push, 1, b"c")
    assert all_available(spark, service, live, checkpoint).bodies == [b"c"]


def test_queries_with_checkpoints_of_their_own_read_one_stream_independently(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    """One commit position per stream: the first query's commit dropped c and d before the
    second had read them, and the second failed ('committed and dropped'). (Spark commits a
    micro-batch's end to the source when it starts the next one.)"""
    live = Live(service)
    live.open()
    live.push(0, b"a", b"b")
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    assert all_available(spark, service, live, first).bodies == [b"a", b"b"]
    assert all_available(spark, service, live, second).bodies == [b"a", b"b"]
    live.push(0, b"c", b"d")
    assert all_available(spark, service, live, first).bodies == [b"c", b"d"]
    live.push(1, b"e")
    assert all_available(spark, service, live, first).bodies == [b"e"]  # committed c and d
    assert all_available(spark, service, live, second).bodies == [b"c", b"d", b"e"]
    stream = service.coordinator.streams.get(stream_id(live.table, [live.name, 2]))
    assert stream.start() == {"0:0": 2, "0:1": 0}  # where the second query is


def test_a_query_resumed_over_a_reopened_queue_fails_rather_than_skip_units(
    spark: Any, service: CoordinatorCluster, tmp_path: Path
) -> None:
    """A queue hands its new units to the reopened stream numbered from 0: resumed at its
    checkpoint (2 units read), the query read only e of c, d and e, without a word."""
    live = Live(service, queue=True)
    live.open()
    live.push(0, b"a", b"b")
    checkpoint = str(tmp_path / "checkpoint")
    assert all_available(spark, service, live, checkpoint).bodies == [b"a", b"b"]
    live.portal.call(service.coordinator.streams.close_idle, -1.0)  # every stream, idle
    live.open()
    live.push(0, b"c", b"d", b"e")
    with pytest.raises(Exception, match="deterministic = True") as failed:
        all_available(spark, service, live, checkpoint)
    assert "Start the query from a new checkpoint" in str(failed.value)
    fresh = str(tmp_path / "fresh")
    assert all_available(spark, service, live, fresh).bodies == [b"c", b"d", b"e"]


def test_bad_stream_options_are_refused_when_the_dataframe_is_defined(
    spark: Any, service: CoordinatorCluster
) -> None:
    """At the query's start pyspark buried the message under an UnboundLocalError."""
    with pytest.raises(Exception, match="option 'maxUnitsPerTrigger' must be at least 1"):
        stream_of(spark, service, "any", maxUnitsPerTrigger="0")
    with pytest.raises(Exception, match="option 'awaitFeedEnd' must be a number of seconds"):
        stream_of(spark, service, "any", awaitFeedEnd="soon")
