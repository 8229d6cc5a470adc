"""The Spark data source's `timeout` bounds each wait for a batch of a read, not the read:
over real gRPC, pyarrow's C++ client reads a flightfeed server whose partition streams a
batch now and then. Before, `timeout` was the DoGet's deadline, and a feed's partition that
streamed longer than it (60 s by default) failed with "Deadline Exceeded" while its rows
kept coming; now a read fails only when the worker sends nothing for `timeout` seconds, and
the error names the option."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import pyarrow as pa
import pytest
from anyio.from_thread import start_blocking_portal
from grpclib.const import Status

from flightfeed.errors import RemoteError
from flightfeed.flight import CallContext, FlightDataWriter, FlightHandler, FlightServer
from flightfeed.spark.client import Endpoint, read_endpoint

BATCH = pa.record_batch({"n": pa.array(range(100), pa.int64())})


class Trickle(FlightHandler):
    """A partition found slowly: ticket b"<batches>/<seconds between them>", then silence
    for ever if b"/stall" follows."""

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        count, pause, *stall = ticket.decode().split("/")
        await writer.begin(BATCH.schema)
        for _ in range(int(count)):
            await writer.write(BATCH)
            await anyio.sleep(float(pause))
        if stall:
            await anyio.sleep_forever()


@asynccontextmanager
async def trickle_server() -> AsyncIterator[FlightServer]:
    """Made in the portal's event loop (grpclib's server takes the loop it is made in)."""
    async with FlightServer(Trickle()) as server:
        yield server


@pytest.fixture(scope="module")
def location() -> Iterator[str]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(trickle_server()) as server,
    ):
        yield server.location


@pytest.mark.parametrize("shared_memory", [True, False], ids=["exchange", "DoGet"])
def test_a_read_longer_than_the_timeout_reads_whole(location: str, shared_memory: bool) -> None:
    read = read_endpoint(
        Endpoint(b"6/0.3", (location,)), {}, timeout=1.0, shared_memory=shared_memory
    )
    assert sum(batch.num_rows for batch in read) == 600  # (in 1.8 s)


def test_the_time_spark_takes_between_batches_is_not_a_wait(location: str) -> None:
    batches = 0
    for _ in read_endpoint(Endpoint(b"3/0", (location,)), {}, timeout=0.3):
        batches += 1
        time.sleep(0.6)  # (Spark's work on the batch, before it asks for the next)
    assert batches == 3


@pytest.mark.parametrize("shared_memory", [True, False], ids=["exchange", "DoGet"])
def test_a_worker_silent_for_the_timeout_fails_the_read_naming_the_option(
    location: str, shared_memory: bool
) -> None:
    read = read_endpoint(
        Endpoint(b"2/0/stall", (location,)), {}, timeout=0.5, shared_memory=shared_memory
    )
    assert next(read).num_rows == 100
    assert next(read).num_rows == 100
    with pytest.raises(RemoteError, match=r"sent no batch for 0\.5s \(option 'timeout'") as info:
        next(read)
    assert info.value.grpc_status is Status.DEADLINE_EXCEEDED
