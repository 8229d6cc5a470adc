"""A table read its client leaves midway (a cancelled DoGet, a Spark `show()` that needs a few
rows) is closed by the handler that ran it, over real gRPC. Before, the worker's DoGet of a
table ticket left the read's generator to the garbage collector, which closed it from a task
of its own: the scan's cancel scopes were exited in another task, and the worker logged
"Task exception was never retrieved ... Attempted to exit cancel scope in a different task"."""

from __future__ import annotations

from pathlib import Path

import anyio
import pyarrow as pa
import pytest
from helpers.abandoned_generators import abandoned_generators

from flightfeed._generated.arrow.flight.protocol import (
    FlightDescriptor,
    FlightDescriptorDescriptorType,
)
from flightfeed._generated.flightfeed.v1 import TableCommand, TableRef
from flightfeed.flight import FlightClient
from flightfeed.tables.schema import TableSchema
from flightfeed.tables.store import TableName
from flightfeed.worker import Worker, WorkerConfig

pytestmark = pytest.mark.anyio

NAME = TableName.of("left")
ROWS = 600_000
"""Ten of the worker's 65,536-row batches: the client leaves after the first."""


def rows() -> pa.Table:
    return pa.table(
        {"ts": pa.array(range(ROWS), pa.timestamp("ms")), "v": pa.array(range(ROWS), pa.int64())}
    )


def descriptor(partitions: int) -> FlightDescriptor:
    command = TableCommand(version=1, table=TableRef(table=NAME.table), partitions=partitions)
    return FlightDescriptor(type=FlightDescriptorDescriptorType.CMD, cmd=bytes(command))


@pytest.mark.parametrize("partitions", [1, 2], ids=["one ticket", "a snapshot's"])
async def test_a_table_read_left_midway_is_closed_by_its_handler(
    tmp_path: Path, partitions: int
) -> None:
    async with Worker(config=WorkerConfig(data_dir=str(tmp_path))) as worker:
        engine = worker.state.tables
        assert engine is not None
        await engine.create(NAME, TableSchema.from_arrow(rows().schema, timestamp="ts"))
        await engine.write([(NAME, rows())])
        calls = worker.state.calls
        async with FlightClient(worker.location) as client:
            with abandoned_generators() as abandoned:
                for _ in range(4):
                    info = await client.get_flight_info(descriptor(partitions))
                    async with client.do_get(info.endpoint[0].ticket.ticket) as reader:
                        first = await reader.__anext__()
                        assert first.num_rows > 0  # (then the client leaves: RST_STREAM)
                    with anyio.fail_after(10):
                        while calls.running:
                            await calls.changed()
            whole = await client.get_flight_info(descriptor(1))
            read = [b async for b in client.do_get(whole.endpoint[0].ticket.ticket)]
        assert sum(batch.num_rows for batch in read) == ROWS
    assert abandoned == []
