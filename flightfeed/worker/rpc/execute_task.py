"""ExecuteTask: run a partition range of a task into a sink (the same path as Flight DoGet)."""

from __future__ import annotations

from ..._generated.flightfeed.v1 import ExecuteTaskRequest
from ...protocol.channel import PartitionSink
from ..execution import serve_partitions
from ..state import WorkerState


async def execute_task(
    state: WorkerState, request: ExecuteTaskRequest, sink: PartitionSink
) -> None:
    await serve_partitions(state.registry, request, sink, state.config.consumer_buffer_batches)
