"""ExecuteTask requests and the Flight tickets that carry them."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import FlightAppMetadata
from flightfeed.errors import InvalidArgument
from flightfeed.messages import parse_strict
from flightfeed.protocol import (
    RepartitionExecHead,
    TaskKey,
    execute_task_request,
    execute_task_ticket,
    parse_ticket,
)
from flightfeed.protocol.tickets import batch_app_metadata

KEY = TaskKey(query_id=b"\x01" * 16, stage_id=2, task_number=3, attempt=1)


@given(start=st.integers(0, 1000), size=st.integers(1, 1000))
def test_a_ticket_parses_back_to_its_request(start: int, size: int) -> None:
    ticket = execute_task_ticket(KEY, start, start + size)
    request = parse_ticket(ticket)
    assert request == execute_task_request(KEY, start, start + size)
    assert (request.target_partition_start, request.target_partition_end) == (start, start + size)
    assert request.none is not None
    assert request.task_key == KEY


def test_heads() -> None:
    broadcast = execute_task_request(KEY, 1, 2, head="broadcast", outputs=4)
    assert broadcast.broadcast is not None
    assert broadcast.broadcast.output_partitions == 4
    head = RepartitionExecHead(partitioning=b"\x08\x02")
    assert execute_task_request(KEY, 0, 1, head=head).repartition == head
    with pytest.raises(InvalidArgument, match="unknown producer head"):
        execute_task_request(KEY, 0, 1, head="gather")


@pytest.mark.parametrize(("start", "end"), [(0, 0), (3, 2), (-1, 2)])
def test_an_empty_or_negative_range_is_refused(start: int, end: int) -> None:
    with pytest.raises(InvalidArgument, match="empty or negative"):
        execute_task_request(KEY, start, end)


@pytest.mark.parametrize(
    ("ticket", "message"),
    [
        (b"\xff\xff\xff\xff", "not a serialized ExecuteTaskRequest"),
        (b"no-such-ticket", "not a serialized ExecuteTaskRequest"),
        (b"", "no task_key"),
    ],
)
def test_anything_else_is_a_clear_invalid_argument(ticket: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_ticket(ticket)


@given(partition=st.integers(0, 2**32))
def test_batch_app_metadata_names_its_partition_and_when_it_was_sent(partition: int) -> None:
    before = time.time_ns()
    data = batch_app_metadata(partition)
    metadata = parse_strict(FlightAppMetadata, data)
    assert metadata.partition == partition
    assert before <= metadata.created_timestamp_unix_nanos <= time.time_ns()
    assert data == bytes(metadata)  # betterproto2's own bytes
