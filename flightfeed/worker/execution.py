"""Serving a task partition range to one consumer: the code path of ExecuteTask and DoGet."""

from __future__ import annotations

import time

import anyio

from .._generated.flightfeed.v1 import ExecuteTaskRequest, FlightAppMetadata
from ..errors import Cancelled, ExecutionError, FlightfeedError
from ..flight.streams import FlightDataWriter
from ..plan.base import closing
from ..plan.merge import merge
from .keys import task_id
from .registry import TaskRegistry


async def serve_partitions(
    registry: TaskRegistry, request: ExecuteTaskRequest, writer: FlightDataWriter, buffer: int
) -> None:
    """Stream the requested partitions, each batch tagged with its partition in app_metadata."""
    key = task_id(request.task_key)
    task = await registry.wait_for(key)
    outputs, partitions = task.claim(request)
    try:
        with task.consumer() as scope:
            try:
                sources = {p: outputs.open(p) for p in partitions}
                async with closing(merge(sources, buffer)) as stream:
                    if outputs.partitions and partitions:
                        await writer.begin(task.plan.schema)
                    async for partition, batch in stream:
                        metadata = FlightAppMetadata(
                            partition=partition, created_timestamp_unix_nanos=time.time_ns()
                        )
                        await writer.write(batch, app_metadata=bytes(metadata))
            except FlightfeedError as error:
                raise task.with_origin(error) from None
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                raise ExecutionError(
                    str(exc) or type(exc).__name__,
                    error_type=type(exc).__name__,
                    origin=task.origin,
                ) from exc
        if scope.cancelled_caught:
            raise Cancelled(f"task {key} was cancelled: {task.cancel_reason}", origin=task.origin)
    finally:
        task.release(partitions)
