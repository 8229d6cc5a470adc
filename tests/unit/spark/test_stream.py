"""The streaming source's pure parts (flightfeed.spark.stream): how `maxUnitsPerTrigger` shares a
micro-batch's units among feed partitions (`_capped`), its options, and the empty micro-batch
that needs no coordinator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import LongType, StructField, StructType

from flightfeed.coordinator.streams import stream_id
from flightfeed.errors import InvalidArgument, RemoteError
from flightfeed.spark.source import FlightfeedDataSource
from flightfeed.spark.stream import FlightfeedStreamReader, _capped

URI = "grpc://127.0.0.1:1"  # nothing listens: a test that reached the network would fail
SCHEMA = StructType([StructField("value", LongType())])


@st.composite
def offsets(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    """(start, latest) with start <= latest per partition; a partition new since `start` may
    be missing from it (it starts at 0)."""
    keys = draw(st.lists(st.sampled_from("0123456789"), unique=True, max_size=8))
    start: dict[str, int] = {}
    latest: dict[str, int] = {}
    for key in keys:
        begin = draw(st.integers(0, 40))
        if begin or draw(st.booleans()):
            start[key] = begin
        latest[key] = begin + draw(st.integers(0, 30))
    return start, latest


@settings(max_examples=150, deadline=None)
@given(offsets(), st.integers(1, 200))
def test_capped_spends_the_budget_fairly(
    found: tuple[dict[str, int], dict[str, int]], budget: int
) -> None:
    start, latest = found
    before = (dict(start), dict(latest))
    end = _capped(start, latest, budget)
    assert (start, latest) == before  # the offsets Spark holds are not changed
    assert set(end) == set(latest)
    took = {k: end[k] - start.get(k, 0) for k in latest}
    pending = {k: latest[k] - start.get(k, 0) for k in latest}
    assert all(0 <= took[k] <= pending[k] for k in latest)
    assert sum(took.values()) == min(budget, sum(pending.values()))
    # water-filling: a partition left with units got at most one fewer than any other
    for short in (k for k in latest if took[k] < pending[k]):
        assert all(took[other] <= took[short] + 1 for other in latest), (short, took)


@settings(max_examples=50, deadline=None)
@given(offsets())
def test_an_ample_budget_reads_everything(found: tuple[dict[str, int], dict[str, int]]) -> None:
    start, latest = found
    pending = sum(latest[k] - start.get(k, 0) for k in latest)
    assert _capped(start, latest, pending + 1) == latest
    assert _capped(start, latest, max(pending, 1)) == latest


def test_capped_examples() -> None:
    assert _capped({"0": 0, "1": 0, "2": 0}, {"0": 100, "1": 100, "2": 100}, 10) == {
        "0": 4,
        "1": 3,
        "2": 3,
    }
    # a partition with little left gives the rest to the others
    assert _capped({"0": 0, "1": 0, "2": 0}, {"0": 1, "1": 100, "2": 100}, 10) == {
        "0": 1,
        "1": 5,
        "2": 4,
    }
    assert _capped({"0": 7}, {"0": 7, "1": 2}, 5) == {"0": 7, "1": 2}  # a new partition


def test_no_partition_starves_across_micro_batches() -> None:
    # Before, a budget below the number of partitions went to the first ones every time.
    offsets = {"0": 0, "1": 0, "2": 0}
    for _ in range(6):
        latest = {k: v + 10 for k, v in offsets.items()}  # the feed stays ahead
        offsets = _capped(offsets, latest, 2)
    assert all(v > 0 for v in offsets.values()), offsets


def stream_reader(**options: str) -> FlightfeedStreamReader:
    source = FlightfeedDataSource({"uri": URI, "table": "scan", "args": '[2, "3,1"]', **options})
    reader = source.streamReader(SCHEMA)
    assert isinstance(reader, FlightfeedStreamReader)
    return reader


def test_stream_reader_defaults() -> None:
    reader = stream_reader()
    assert reader.stream == stream_id("scan", [2, "3,1"])  # what the coordinator names it
    assert reader.max_units is None
    assert reader.await_end == 0.0
    assert isinstance(reader.getDefaultReadLimit(), ReadAllAvailable)


def test_stream_reader_options() -> None:
    reader = stream_reader(maxUnitsPerTrigger="3", AWAITFEEDEND="2.5")
    assert reader.getDefaultReadLimit() == ReadMaxRows(3)
    assert reader.await_end == 2.5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxUnitsPerTrigger": "0"}, "'maxUnitsPerTrigger' must be at least 1"),
        ({"maxUnitsPerTrigger": "-2"}, "'maxUnitsPerTrigger' must be at least 1"),
        ({"maxUnitsPerTrigger": "1.5"}, "'maxUnitsPerTrigger' must be an integer"),
        ({"maxUnitsPerTrigger": "many"}, "'maxUnitsPerTrigger' must be an integer"),
        ({"awaitFeedEnd": "-1"}, "'awaitFeedEnd' must not be negative"),
        ({"awaitFeedEnd": "later"}, "'awaitFeedEnd' must be a number of seconds"),
        ({"awaitFeedEnd": "nan"}, "'awaitFeedEnd' must be a finite number of seconds"),
        ({"awaitFeedEnd": "inf"}, "'awaitFeedEnd' must be a finite number of seconds"),
        ({"table": ""}, "needs option 'table'"),
    ],
)
def test_bad_stream_options_say_which(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        stream_reader(**options)


@pytest.mark.parametrize(
    ("start", "end"),
    [({}, {}), ({"0": 3, "1": 5}, {"0": 3, "1": 5}), ({"0": 3, "1": 5}, {"0": 3})],
)
def test_an_empty_micro_batch_needs_no_coordinator(
    start: dict[str, int], end: dict[str, int]
) -> None:
    assert stream_reader().partitions(start, end) == []


def test_a_micro_batch_with_units_asks_the_coordinator() -> None:
    """The counterpart of the test above: there the coordinator was not asked (it is down)."""
    with pytest.raises(RemoteError, match="cannot reach the flightfeed coordinator"):
        stream_reader(timeout="5").partitions({"0": 3}, {"0": 4})
