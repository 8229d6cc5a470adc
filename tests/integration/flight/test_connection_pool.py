"""More calls at once than a server lets one connection hold: the client's pool opens another
connection instead of making the extra calls wait for earlier ones (which may be waiting on
them), and closes it again once nothing uses it."""

from __future__ import annotations

import anyio
import pyarrow as pa
import pytest
from helpers.flight import running_server

from flightfeed.flight import CallContext, FlightClient, FlightDataWriter, FlightHandler
from flightfeed.flight.tuning import MAX_CONCURRENT_STREAMS

pytestmark = pytest.mark.anyio
TABLE = pa.table({"x": [1, 2, 3]})


class Gate(FlightHandler):
    """DoGet answers once `count` calls have arrived: every call waits for all the others."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.arrived = 0
        self.all_arrived = anyio.Event()

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        self.arrived += 1
        if self.arrived >= self.count:
            self.all_arrived.set()
        await self.all_arrived.wait()
        await writer.write_table(TABLE)


# The Gate wakes 1,074 handlers in one loop turn (~0.3 s here, 0.52 s once under CI's load):
# the burst is the test's own, not a stall of flightfeed's.
@pytest.mark.loop_stall_limit(3.0)
async def test_calls_beyond_the_stream_limit_open_another_connection() -> None:
    count = MAX_CONCURRENT_STREAMS + 50
    gate = Gate(count)
    results: list[pa.Table] = []
    async with running_server(gate) as location, FlightClient(location) as client:
        connections_at_peak: list[int] = []

        async def fetch() -> None:
            results.append(await client.do_get(b"t").read_all())

        async def watch() -> None:
            await gate.all_arrived.wait()
            connections_at_peak.append(client.connections)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            for _ in range(count):
                tg.start_soon(fetch)
        assert connections_at_peak == [2]
        await client.do_get(b"t").read_all()  # a quiet client again: the extra one closes
        assert client.connections == 1
    assert len(results) == count
    assert all(table.equals(TABLE) for table in results)
