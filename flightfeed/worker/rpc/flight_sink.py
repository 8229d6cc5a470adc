"""The PartitionSink of the worker's Flight face: an ExecuteTask's batches as a Flight stream."""

from __future__ import annotations

import pyarrow as pa

from ...flight.streams import FlightDataWriter
from ...protocol.tickets import batch_app_metadata


class FlightSink:
    """A PartitionSink onto a Flight stream: each batch's partition goes in its app_metadata."""

    def __init__(self, writer: FlightDataWriter) -> None:
        self._writer = writer

    async def begin(self, schema: pa.Schema) -> None:
        await self._writer.begin(schema)

    async def write(self, partition: int, batch: pa.RecordBatch) -> None:
        await self._writer.write(batch, app_metadata=batch_app_metadata(partition))


__all__ = ["FlightSink"]
