"""Keepalive over real sockets: a peer that goes silent without closing its connection (a
frozen TcpProxy: no bytes, no FIN, no RST) is dropped with a clear error on either side, while
live calls that are merely quiet are left alone."""

from __future__ import annotations

import anyio
import pyarrow as pa
import pytest
from grpclib.const import Status
from helpers.flight import running_server

from flightfeed.errors import RemoteError
from flightfeed.flight import (
    CallContext,
    FlightClient,
    FlightDataWriter,
    FlightHandler,
    KeepalivePolicy,
)
from flightfeed.testing import tcp_proxy

pytestmark = pytest.mark.anyio

FAST = KeepalivePolicy(interval=0.05, timeout=0.3)
TABLE = pa.table({"x": [1, 2, 3]})


class GatedHandler(FlightHandler):
    """DoGet holds its call open, sending nothing, until `release`; it records cancellation."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.cancelled = anyio.Event()

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        self.started.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled.set()
            raise
        await writer.begin(TABLE.schema)
        for batch in TABLE.to_batches():
            await writer.write(batch)


def test_policy_rejects_non_positive_times() -> None:
    with pytest.raises(ValueError, match="positive"):
        KeepalivePolicy(interval=0)
    with pytest.raises(ValueError, match="positive"):
        KeepalivePolicy(interval=1, timeout=-1)


async def test_client_fails_calls_to_a_server_that_went_silent() -> None:
    handler = GatedHandler()
    async with running_server(handler) as location, tcp_proxy(location) as proxy:
        async with FlightClient(proxy.location, keepalive=FAST) as client:

            async def freeze_once_called() -> None:
                await handler.started.wait()
                proxy.freeze()

            async with anyio.create_task_group() as tg:
                tg.start_soon(freeze_once_called)
                with pytest.raises(RemoteError, match="no reply to an HTTP/2 PING") as info:
                    with anyio.fail_after(10):
                        await client.do_get(b"t").read_all()
        assert info.value.grpc_status == Status.UNAVAILABLE
        handler.release.set()
        async with FlightClient(location) as direct:  # the server itself keeps serving
            assert (await direct.do_get(b"t").read_all()).equals(TABLE)


async def test_quiet_calls_on_a_live_connection_are_left_alone() -> None:
    handler = GatedHandler()
    results: list[pa.Table] = []
    patient = KeepalivePolicy(interval=FAST.interval, timeout=10)  # a slow CI box is not dead
    async with (
        running_server(handler) as location,
        FlightClient(location, keepalive=patient) as client,
    ):

        async def fetch() -> None:
            results.append(await client.do_get(b"t").read_all())

        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch)
            await handler.started.wait()
            await anyio.sleep(FAST.interval * 10)  # the scenario: a call quiet for 10 intervals
            handler.release.set()
        (connection,) = client._channel.connections
        pings = connection.keepalive.pings_sent  # type: ignore[attr-defined]
    assert results[0].equals(TABLE)
    assert pings >= 1  # the quiet stretch was really probed, and the replies kept it open


class EndlessHandler(FlightHandler):
    """DoGet streams 1 MB batches until cancelled: towards a peer that reads nothing, its
    send buffers fill up, and a graceful close would wait forever for them to drain."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = anyio.Event()

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        batch = pa.record_batch({"x": pa.array(range(131_072), pa.int64())})
        await writer.begin(batch.schema)
        try:
            while True:
                await writer.write(batch)
                self.started.set()
        except anyio.get_cancelled_exc_class():
            self.cancelled.set()
            raise


@pytest.mark.parametrize(
    "handler_type", [GatedHandler, EndlessHandler], ids=["quiet-call", "full-send-buffers"]
)
async def test_server_cancels_the_calls_of_a_client_that_went_silent(
    handler_type: type[GatedHandler | EndlessHandler],
) -> None:
    handler = handler_type()
    async with (
        running_server(handler, keepalive=FAST) as location,
        tcp_proxy(location) as proxy,
        FlightClient(proxy.location) as client,
        anyio.create_task_group() as tg,
    ):

        async def fetch() -> None:
            async for _ in client.do_get(b"t"):
                pass

        tg.start_soon(fetch)
        await handler.started.wait()
        proxy.freeze()
        with anyio.fail_after(10):
            await handler.cancelled.wait()
        tg.cancel_scope.cancel()  # the client never learns: its proxy is frozen
