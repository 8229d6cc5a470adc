"""The main job on an embedded default: what `flightfeed demo` runs.

Today: a flightfeed Flight server in this process publishes a generated table as a flight with
one endpoint per partition; pyarrow's C++ Flight client discovers it with GetFlightInfo, reads
every endpoint with DoGet and checks the result against the source. It grows with the
coordinator, the workers and Spark.
"""

from __future__ import annotations

import time

import anyio
import pyarrow as pa
import pyarrow.compute as pc

from ._generated.arrow.flight.protocol import FlightEndpoint, FlightInfo, Location, Ticket
from .errors import NotFound
from .flight import FlightDataWriter, FlightDescriptor, FlightHandler, FlightServer
from .flight.schema import schema_to_ipc
from .flight.server import CallContext

DEMO_ROWS = 2_000_000
BATCH_ROWS = 65_536


def demo_table(rows: int = DEMO_ROWS) -> pa.Table:
    """A deterministic table with ints, floats, strings and a dictionary column."""
    ids = pa.array(range(rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "value": pc.multiply(pc.cast(ids, pa.float64()), 0.5),
            "bucket": pc.cast(pc.bit_wise_and(ids, 15), pa.int32()),
            "name": pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), ""),
            "kind": pa.DictionaryArray.from_arrays(
                pc.cast(pc.bit_wise_and(ids, 3), pa.int8()), ["a", "b", "c", "d"]
            ),
        }
    )


class TableHandler(FlightHandler):
    """Publishes named tables, each split into `partitions` endpoints."""

    def __init__(self, tables: dict[str, pa.Table], partitions: int, location: str = "") -> None:
        self.tables = tables
        self.partitions = partitions
        self.location = location

    def _slices(self, name: str) -> list[pa.Table]:
        table = self.tables.get(name)
        if table is None:
            raise NotFound(f"no flight named {name!r}")
        step = -(-table.num_rows // self.partitions)
        return [table.slice(i * step, step) for i in range(self.partitions)]

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        name = "/".join(descriptor.path)
        table = self.tables.get(name)
        if table is None:
            raise NotFound(f"no flight named {name!r}")
        endpoints = [
            FlightEndpoint(
                ticket=Ticket(ticket=f"{name}:{i}".encode()),
                location=[Location(uri=self.location)] if self.location else [],
            )
            for i in range(self.partitions)
        ]
        return FlightInfo(
            schema=schema_to_ipc(table.schema),
            flight_descriptor=descriptor,
            endpoint=endpoints,
            total_records=table.num_rows,
            total_bytes=table.nbytes,
        )

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        name, _, index = ticket.decode(errors="replace").rpartition(":")
        if not index.isdigit() or not 0 <= int(index) < self.partitions:
            raise NotFound(f"unknown ticket {ticket!r}")
        part = self._slices(name)[int(index)]
        await writer.begin(part.schema)
        for batch in part.to_batches(BATCH_ROWS):
            await writer.write(batch)


def _fetch_with_pyarrow(location: str, name: str) -> tuple[pa.Table, int]:
    import pyarrow.flight as flight

    client = flight.connect(location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(name))
        parts = [client.do_get(endpoint.ticket).read_all() for endpoint in info.endpoints]
        return pa.concat_tables(parts), len(info.endpoints)
    finally:
        client.close()


async def run_demo(workers: int = 2) -> int:
    """Serve the demo table and read it back with pyarrow's C++ client; 0 when it matches."""
    table = demo_table()
    handler = TableHandler({"demo": table}, partitions=max(1, workers) * 2)
    async with FlightServer(handler) as server:
        handler.location = server.location
        print(f"flightfeed Flight server on {server.location}")
        start = time.perf_counter()
        fetched, endpoints = await anyio.to_thread.run_sync(
            _fetch_with_pyarrow, server.location, "demo"
        )
        elapsed = time.perf_counter() - start
    ok = fetched.equals(table)
    print(
        f"pyarrow C++ client read {fetched.num_rows:,} rows ({fetched.nbytes / 1e6:.0f} MB) "
        f"from {endpoints} endpoints in {elapsed:.2f}s: {'identical' if ok else 'MISMATCH'}"
    )
    print(
        fetched.group_by("bucket").aggregate([("value", "sum"), ("id", "count")]).sort_by("bucket")
    )
    return 0 if ok else 1
