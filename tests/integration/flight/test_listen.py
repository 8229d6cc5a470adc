"""A server that cannot have its address says which and why, and takes nothing with it."""

from __future__ import annotations

import socket

import anyio
import pyarrow.flight as flight
import pytest

from flightfeed.errors import InvalidArgument, Unavailable
from flightfeed.flight.client import FlightClient
from flightfeed.flight.listen import listening_socket, local_address
from flightfeed.worker import Worker

pytestmark = pytest.mark.anyio


async def test_a_free_port_is_bound_before_serving() -> None:
    sock = await listening_socket("localhost", 0)  # a name, resolved off the loop
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1"
        assert port > 0
    finally:
        sock.close()


async def test_a_port_taken_is_unavailable_naming_the_address(taken_port: int) -> None:
    with pytest.raises(Unavailable, match=f"cannot listen on 127.0.0.1:{taken_port}: Address"):
        await listening_socket("127.0.0.1", taken_port)


@pytest.mark.parametrize(
    ("host", "port", "error", "says"),
    [
        ("127.0.0.1", 65536, InvalidArgument, "a port is 0-65535"),
        ("127.0.0.1", -1, InvalidArgument, "a port is 0-65535"),
        ("no-such-host.invalid", 0, Unavailable, "no-such-host.invalid:0"),
        ("192.0.2.1", 0, Unavailable, "Cannot assign requested address"),  # not this machine's
    ],
)
async def test_an_address_it_cannot_have_is_a_clear_error(
    host: str, port: int, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        await listening_socket(host, port)


async def test_a_worker_on_a_taken_port_raises_the_error_itself(
    taken_port: int,
) -> None:
    """Not an ExceptionGroup from the task group inside: the caller catches what it expects."""
    worker = Worker(port=taken_port)
    with pytest.raises(Unavailable, match=f"127.0.0.1:{taken_port}"):
        async with worker:
            pass
    async with Worker(port=0) as other:
        assert other.location.startswith("grpc://127.0.0.1:")


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
async def test_a_worker_on_an_ipv6_address_serves_both_clients_at_its_bracketed_location() -> None:
    async with Worker(host="::1", port=0) as worker:
        assert worker.location.startswith("grpc://[::1]:")
        async with FlightClient(worker.location) as ours:
            assert "count_rows" in {action.type for action in await ours.list_actions()}

        def list_with_pyarrow() -> set[str]:
            client = flight.connect(worker.location)
            try:
                return {action.type for action in client.list_actions()}
            finally:
                client.close()

        assert "count_rows" in await anyio.to_thread.run_sync(list_with_pyarrow)


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
async def test_every_interface_in_ipv6_takes_ipv4_clients_too() -> None:
    """`--host ::` served IPv4 only where the system's default made IPv6 sockets dual-stack,
    while its location said 127.0.0.1 regardless."""
    sock = await listening_socket("::", 0)
    with sock:
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        assert local_address(sock) == "127.0.0.1"
        sock.listen()
        with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=10):
            pass


def test_an_ipv6_only_socket_is_reached_on_the_ipv6_loopback() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        assert local_address(sock) == "::1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert local_address(sock) == "127.0.0.1"
