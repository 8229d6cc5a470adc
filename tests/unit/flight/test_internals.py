"""The grpclib/h2 adapter: every private name flightfeed relies on exists on live objects.

A grpclib or h2 release that renames one fails here, by name, instead of somewhere in the
middle of a transfer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import grpclib.client
import grpclib.const
import grpclib.protocol
import grpclib.server
import grpclib.utils
import h2.config
import h2.connection
import h2.events
import h2.frame_buffer
import pytest
from grpclib.const import Cardinality, Status

from flightfeed.flight import internals
from flightfeed.flight.grpc import GrpcChannel, GrpcServer, RawBytes
from flightfeed.flight.h2buffer import StreamingFrameBuffer
from flightfeed.flight.listen import listening_socket

pytestmark = pytest.mark.anyio

METHOD = "/test.Internals/Echo"


class _Echo:
    """A grpclib service that keeps its server-side stream for inspection."""

    def __init__(self) -> None:
        self.stream: grpclib.server.Stream[Any, Any] | None = None
        self.seen = anyio.Event()
        self.release = anyio.Event()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            METHOD: grpclib.const.Handler(self._echo, Cardinality.UNARY_UNARY, RawBytes, RawBytes)
        }

    async def _echo(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        request: bytes | None = await stream.recv_message()
        assert request is not None
        self.stream = stream
        self.seen.set()
        await self.release.wait()
        await stream.send_message(RawBytes(request))


@asynccontextmanager
async def live_call() -> AsyncIterator[dict[str, Any]]:
    """A call in progress over a real connection, and the objects under it by class name."""
    service = _Echo()
    server = GrpcServer([service])
    sock = await listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    await server.start(sock=sock)
    channel = GrpcChannel("127.0.0.1", port)
    try:
        async with channel.request(METHOD, Cardinality.UNARY_UNARY, RawBytes, RawBytes) as call:
            await call.send_message(RawBytes(b"hello"), end=True)
            with anyio.fail_after(10):
                await service.seen.wait()
            assert service.stream is not None
            raw = internals.raw_stream(service.stream)
            client_raw = internals.raw_stream(call)
            h2_connection = internals.stream_h2_connection(client_raw)
            (handler,) = internals.server_handlers(server)
            yield {
                "grpclib.server.Server": server,
                "grpclib.server.Handler": handler,
                "grpclib.client.Channel": channel,
                "grpclib.client.Stream": call,
                "grpclib.server.Stream": service.stream,
                "grpclib.protocol.Stream": raw,
                "grpclib.protocol.Connection": raw.connection,
                "grpclib.utils.Wrapper": internals.call_wrapper(call),
                "h2.frame_buffer.FrameBuffer": h2_connection.incoming_buffer,
            }
            service.release.set()
            assert await call.recv_message() == b"hello"
    finally:
        channel.close()
        server.close()
        await server.wait_closed()


async def test_every_private_attribute_exists_on_live_objects() -> None:
    async with live_call() as objects:
        assert set(objects) == set(internals.INSTANCE_ATTRIBUTES)
        missing = [
            f"{kind}.{name}"
            for kind, names in internals.INSTANCE_ATTRIBUTES.items()
            for name in names
            if not hasattr(objects[kind], name)
        ]
        assert not missing, f"grpclib/h2 internals flightfeed relies on are gone: {missing}"


async def test_live_objects_are_of_the_listed_classes() -> None:
    classes = {
        "grpclib.server.Server": grpclib.server.Server,
        "grpclib.server.Handler": grpclib.server.Handler,
        "grpclib.client.Channel": grpclib.client.Channel,
        "grpclib.client.Stream": grpclib.client.Stream,
        "grpclib.server.Stream": grpclib.server.Stream,
        "grpclib.protocol.Stream": grpclib.protocol.Stream,
        "grpclib.protocol.Connection": grpclib.protocol.Connection,
        "grpclib.utils.Wrapper": grpclib.utils.Wrapper,
        "h2.frame_buffer.FrameBuffer": h2.frame_buffer.FrameBuffer,
    }
    async with live_call() as objects:
        for kind, cls in classes.items():
            assert isinstance(objects[kind], cls), kind
        # The zero-copy frame buffer is in place on real connections.
        assert isinstance(objects["h2.frame_buffer.FrameBuffer"], StreamingFrameBuffer)


async def test_accessors_read_the_live_state() -> None:
    async with live_call() as objects:
        call = objects["grpclib.client.Stream"]
        server_call = objects["grpclib.server.Stream"]
        assert internals.method_name(server_call) == METHOD
        assert internals.can_send_status(server_call)
        assert internals.request_ended(call)  # the request was sent with end=True
        assert internals.raw_status(call) is None  # no error status arrived
        assert internals.wrapper_cancelled(internals.call_wrapper(call)) is False


def test_every_private_method_exists_on_its_class() -> None:
    internals.check_classes()  # what importing the module already did


def test_a_missing_private_name_fails_loudly_by_name() -> None:
    class Lacking:
        pass

    with pytest.raises(ImportError, match=r"Lacking\._protocol_factory"):
        internals.check_classes({Lacking: ("_protocol_factory",)})


def _h2_pair() -> tuple[Any, Any]:
    """A client and a server h2 connection that talk in memory."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding="utf-8"))
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
    )
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return client, server


@pytest.mark.parametrize("responded", [False, True], ids=["trailers-only", "trailers"])
def test_end_call_sends_the_status_then_resets(responded: bool) -> None:
    """A call the server ends from under grpclib (a request that trickles in) gets its status,
    as a trailers-only response or as trailers, and a reset that stops the client sending."""
    client, server = _h2_pair()
    request = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "x")]
    client.send_headers(1, [*request, ("content-type", "application/grpc"), ("te", "trailers")])
    server.receive_data(client.data_to_send())
    if responded:
        server.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    internals.end_call(server, 1, Status.RESOURCE_EXHAUSTED, "too slow: 5 bytes/s")
    events = client.receive_data(server.data_to_send())
    answers = h2.events.ResponseReceived | h2.events.TrailersReceived
    headers = [event for event in events if isinstance(event, answers)]
    status = {str(name): str(value) for name, value in headers[-1].headers}
    assert isinstance(headers[-1], h2.events.TrailersReceived) is responded
    assert status["grpc-status"] == str(Status.RESOURCE_EXHAUSTED.value)
    assert status["grpc-message"] == "too slow: 5 bytes/s"
    (reset,) = [e for e in events if isinstance(e, h2.events.StreamReset)]
    assert reset.error_code == 0  # NO_ERROR: stop sending, the answer is above


async def test_a_finished_call_leaves_its_connection_handler() -> None:
    """grpclib swept finished calls only every tenth new call: after a burst the last ones, with
    their streams and results, stayed for as long as the connection (2,000 after a burst of
    1,000 queries)."""
    service = _Echo()
    service.release.set()
    server = GrpcServer([service])
    sock = await listening_socket("127.0.0.1", 0)
    await server.start(sock=sock)
    channel = GrpcChannel("127.0.0.1", sock.getsockname()[1])
    try:

        async def call() -> None:
            async with channel.request(
                METHOD, Cardinality.UNARY_UNARY, RawBytes, RawBytes
            ) as stream:
                await stream.send_message(RawBytes(b"x"), end=True)
                assert await stream.recv_message() == b"x"

        async with anyio.create_task_group() as tg:
            for _ in range(25):  # not a multiple of grpclib's sweep interval
                tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()  # the calls' server tasks have run to their end
        (handler,) = internals.server_handlers(server)
        assert not handler._tasks
        assert not handler._cancelled
    finally:
        channel.close()
        server.close()
        await server.wait_closed()
