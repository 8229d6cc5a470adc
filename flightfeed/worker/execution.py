"""Serving a task partition range to one consumer: the code path of ExecuteTask and DoGet,
whatever carries the batches (a Flight stream, or memory for an in-process caller)."""

from __future__ import annotations

import anyio

from .._generated.flightfeed.v1 import ExecuteTaskRequest
from ..errors import Cancelled, as_flightfeed_error
from ..plan.base import closing
from ..plan.merge import merge
from ..protocol.channel import PartitionSink
from ..protocol.keys import task_id
from .registry import TaskRegistry


async def serve_partitions(
    registry: TaskRegistry, request: ExecuteTaskRequest, sink: PartitionSink, buffer: int
) -> None:
    """Stream the requested partitions of a task into `sink`, each batch with its partition."""
    key = task_id(request.task_key)
    task = await registry.wait_for(key)
    outputs, partitions = task.claim(request)
    read_to_end = False
    try:
        with task.consumer() as scope:
            try:
                sources = {p: outputs.open(p) for p in partitions}
                async with closing(merge(sources, buffer)) as stream:
                    if outputs.partitions and partitions:
                        await sink.begin(task.plan.schema)
                    async for partition, batch in stream:
                        await sink.write(partition, batch)
                read_to_end = True
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:
                raise as_flightfeed_error(exc).locate(task.origin) from exc
        if scope.cancelled_caught:
            raise Cancelled(f"task {key} was cancelled: {task.cancel_reason}", origin=task.origin)
    finally:
        task.release(partitions, read_to_end=read_to_end)
        registry.released()
