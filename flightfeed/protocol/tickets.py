"""ExecuteTask requests and the Flight tickets that carry them.

A DoGet whose ticket is a serialized ExecuteTaskRequest runs a partition range of a task, so
any Flight client (C++, Java, Go, Rust, pyarrow, ADBC) can read a task's output.
"""

from __future__ import annotations

import time
from typing import Literal, TypeAlias

from .._generated.flightfeed.v1 import (
    BroadcastExecHead,
    ExecuteTaskRequest,
    FlightAppMetadata,
    NoneHead,
    RepartitionExecHead,
    TaskKey,
)
from ..errors import InvalidArgument
from ..messages import parse_strict
from ..protoencode import encode_message

Head: TypeAlias = Literal["none", "broadcast"] | RepartitionExecHead


def execute_task_request(
    task_key: TaskKey,
    start: int,
    end: int,
    *,
    head: Head = "none",
    outputs: int = 1,
) -> ExecuteTaskRequest:
    """A request for partitions [start, end) of a task. `head` shapes the task's output:
    "none" (its own partitions), "broadcast" to `outputs` consumers, or a RepartitionExecHead."""
    if not 0 <= start < end:
        raise InvalidArgument(f"partition range [{start}, {end}) is empty or negative")
    request = ExecuteTaskRequest(
        task_key=task_key, target_partition_start=start, target_partition_end=end
    )
    if isinstance(head, RepartitionExecHead):
        request.repartition = head
    elif head == "broadcast":
        request.broadcast = BroadcastExecHead(output_partitions=outputs)
    elif head == "none":
        request.none = NoneHead()
    else:
        raise InvalidArgument(f"unknown producer head {head!r}")
    return request


def execute_task_ticket(
    task_key: TaskKey, start: int, end: int, *, head: Head = "none", outputs: int = 1
) -> bytes:
    """The DoGet ticket that runs partitions [start, end) of a task (see execute_task_request)."""
    return encode_message(execute_task_request(task_key, start, end, head=head, outputs=outputs))


def parse_ticket(ticket: bytes) -> ExecuteTaskRequest:
    """A DoGet ticket as an ExecuteTaskRequest, with a clear error for anything else."""
    try:
        request = parse_strict(ExecuteTaskRequest, ticket)
    except InvalidArgument as exc:
        raise InvalidArgument(f"ticket is not a serialized ExecuteTaskRequest: {exc}") from None
    if request.task_key is None:
        raise InvalidArgument("ticket is not a serialized ExecuteTaskRequest: no task_key")
    return request


def batch_app_metadata(partition: int) -> bytes:
    """The app_metadata of a batch an ExecuteTask returns: its partition, and when it was
    sent (protoencode: betterproto2's `bytes()` costs ~10 us a batch, this ~3)."""
    return encode_message(
        FlightAppMetadata(partition=partition, created_timestamp_unix_nanos=time.time_ns())
    )
