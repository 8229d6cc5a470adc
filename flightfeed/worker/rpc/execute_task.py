"""ExecuteTask: run a partition range of a task and stream FlightData (same path as DoGet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpclib.server

from ...flight.server import CallContext, receive_request
from ...flight.streams import FlightDataWriter
from ..execution import serve_partitions

if TYPE_CHECKING:
    from ..server import Worker


async def execute_task(
    worker: Worker, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
) -> None:
    request = await receive_request(stream)
    writer = FlightDataWriter(stream._stream, before_first_write=stream.send_initial_metadata)
    await serve_partitions(worker.registry, request, writer, worker.config.consumer_buffer_batches)
