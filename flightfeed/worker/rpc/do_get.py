"""Flight DoGet whose ticket is a serialized ExecuteTaskRequest: any Flight client runs a task."""

from __future__ import annotations

import time

import pyarrow as pa

from ..._generated.flightfeed.v1 import FlightAppMetadata
from ...flight.server import CallContext, FlightHandler
from ...flight.streams import FlightDataWriter
from ...protocol.tickets import parse_ticket
from ..state import WorkerState
from .execute_task import execute_task


class FlightSink:
    """A PartitionSink onto a Flight stream: each batch's partition goes in its app_metadata."""

    def __init__(self, writer: FlightDataWriter) -> None:
        self._writer = writer

    async def begin(self, schema: pa.Schema) -> None:
        await self._writer.begin(schema)

    async def write(self, partition: int, batch: pa.RecordBatch) -> None:
        metadata = FlightAppMetadata(
            partition=partition, created_timestamp_unix_nanos=time.time_ns()
        )
        await self._writer.write(batch, app_metadata=bytes(metadata))


class WorkerFlightHandler(FlightHandler):
    """The worker's Flight face."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        await execute_task(self.state, parse_ticket(ticket), FlightSink(writer))
