"""Which worker locations a Spark reader offers to read through shared memory: loopback ones
(the worker shares the reader's host); anything else, or a malformed location, streams. And the
mappings a reader keeps between reads: one a worker, the most recently read workers'."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightfeed.flight.shared_memory import HEADER_BYTES, Mapping, Segment
from flightfeed.spark.shared_read import HeldMappings, on_this_host


@pytest.mark.parametrize(
    ("location", "local"),
    [
        ("grpc://127.0.0.1:8000", True),
        ("grpc://127.8.9.10:8000", True),
        ("grpc://localhost:8000", True),
        ("grpc://[::1]:8000", True),
        ("grpc+tls://127.0.0.1:8000", True),
        ("grpc://10.0.0.7:8000", False),
        ("grpc://worker-3.example:8000", False),
        ("grpc://[2001:db8::1]:8000", False),
        ("not a location", False),
        ("inproc://worker", False),
    ],
)
def test_loopback_locations_are_on_this_host(location: str, local: bool) -> None:
    assert on_this_host(location) is local


def test_a_process_keeps_one_mapping_a_worker_and_the_most_recent_workers(
    tmp_path: Path,
) -> None:
    segments = [Segment(str(tmp_path), 1, HEADER_BYTES) for _ in range(3)]
    try:
        held = HeldMappings(limit=2)
        for index, segment in enumerate(segments):
            with held.borrow(f"grpc://127.0.0.1:{index}") as kept:
                assert kept == [None]  # nothing kept yet for this worker
                kept[0] = Mapping.open(segment.offer())
        assert len(held) == 2  # the least recently read worker's mapping was closed
        with held.borrow("grpc://127.0.0.1:0") as kept:
            assert kept == [None]
        with held.borrow("grpc://127.0.0.1:2") as kept:
            mapping = kept[0]
            assert mapping is not None
            assert mapping.segment_id == segments[2].segment_id
            replacement = Mapping.open(segments[0].offer())
            kept[0] = replacement  # a new segment of this worker replaces its old one
        with held.borrow("grpc://127.0.0.1:2") as kept:
            assert kept == [replacement]
    finally:
        for segment in segments:
            segment.close()
