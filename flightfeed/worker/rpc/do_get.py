"""Flight DoGet whose ticket is a serialized ExecuteTaskRequest: any Flight client runs a task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._generated.flightfeed.v1 import ExecuteTaskRequest
from ...errors import InvalidArgument
from ...flight.protowire import check_wire_format
from ...flight.server import CallContext, FlightHandler
from ...flight.streams import FlightDataWriter
from ..execution import serve_partitions

if TYPE_CHECKING:
    from ..server import Worker


def parse_ticket(ticket: bytes) -> ExecuteTaskRequest:
    """A DoGet ticket as an ExecuteTaskRequest, with a clear error for anything else."""
    try:
        check_wire_format(ticket)
        request = ExecuteTaskRequest.parse(ticket)
    except Exception as exc:
        raise InvalidArgument(f"ticket is not a serialized ExecuteTaskRequest: {exc}") from None
    if request.task_key is None:
        raise InvalidArgument("ticket is not a serialized ExecuteTaskRequest: no task_key")
    return request


class WorkerFlightHandler(FlightHandler):
    """The worker's Flight face."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        request = parse_ticket(ticket)
        await serve_partitions(
            self.worker.registry, request, writer, self.worker.config.consumer_buffer_batches
        )
