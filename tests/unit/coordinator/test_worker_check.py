"""A coordinator gives plans only to flightfeed workers of its version, and says clearly what
a port is when it is something else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream
from helpers.flight import StoreHandler
from helpers.pyarrow_server import ReferenceServer

from flightfeed.coordinator import ChannelResolver
from flightfeed.errors import RemoteError, VersionMismatch
from flightfeed.flight import FlightServer
from flightfeed.testing import start_workers

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def http_server() -> AsyncIterator[str]:
    """A plain HTTP/1.1 server that answers anything with 400."""

    async def answer(client: SocketStream) -> None:
        async with client:
            await client.receive()
            await client.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        yield f"grpc://127.0.0.1:{listener.extra(SocketAttribute.local_port)}"
        tg.cancel_scope.cancel()


async def test_a_plain_flight_server_is_not_a_flightfeed_worker() -> None:
    async with FlightServer(StoreHandler()) as server, ChannelResolver() as resolver:
        with pytest.raises(VersionMismatch) as info:
            await resolver.channel(server.location)
    assert str(info.value).startswith(f"{server.location} is not a flightfeed worker")
    assert info.value.origin is not None
    assert info.value.origin.worker_url == server.location
    assert resolver.urls == []


async def test_pyarrows_flight_server_is_not_a_flightfeed_worker(
    pyarrow_server: ReferenceServer,
) -> None:
    async with ChannelResolver() as resolver:
        with pytest.raises(VersionMismatch, match="is not a flightfeed worker"):
            await resolver.channel(pyarrow_server.location)


async def test_an_http_server_or_a_closed_port_names_the_url_and_asks() -> None:
    async with http_server() as location, ChannelResolver() as resolver:
        with anyio.fail_after(10), pytest.raises(RemoteError) as info:
            await resolver.channel(location)
    assert info.value.message.startswith(f"{location} did not answer GetWorkerInfo")
    assert "is it a flightfeed worker, and is it up?" in info.value.message
    async with ChannelResolver() as resolver:  # nothing listens there any more
        with anyio.fail_after(10), pytest.raises(RemoteError, match=location):
            await resolver.channel(location)


async def test_a_worker_of_another_version_is_refused_and_not_kept() -> None:
    async with start_workers(1, in_process=True) as (worker,):
        async with ChannelResolver(expected_version="0.0.0-other") as resolver:
            with pytest.raises(VersionMismatch, match=r"runs flightfeed .*, this coordinator"):
                await resolver.channel(worker.location)
            assert resolver.urls == []
        async with ChannelResolver() as resolver:
            first = await resolver.channel(worker.location)
            assert await resolver.channel(worker.location) is first  # one channel per worker
            assert resolver.urls == [worker.location]
