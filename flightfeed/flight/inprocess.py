"""In-process connections: a grpclib client and server joined by memory, no sockets.

For tests about logic rather than transport: the same HTTP/2 and gRPC code runs on both ends,
but the bytes go through the event loop instead of the kernel. A server started with
`in_process=True` is registered under an `inproc://<name>` location; Flight and worker clients
given such a location connect to it through a pair of memory transports. Writes are delivered
in order with `call_soon`; HTTP/2 flow control still bounds what is in flight.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

from grpclib.const import Status
from grpclib.protocol import H2Protocol

from ..errors import RemoteError

SCHEME = "inproc://"
_SERVERS: dict[str, Any] = {}


class MemoryTransport(asyncio.Transport):
    """One end of an in-memory byte pipe to a peer protocol."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self._peer: MemoryTransport | None = None
        self._closing = False

    def write(self, data: Any) -> None:
        if self._closing or self._peer is None:
            return
        chunk = bytes(data)
        if chunk:
            self._loop.call_soon(self._peer._deliver, chunk)

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.write(b"".join(list_of_data))

    def _deliver(self, data: bytes) -> None:
        if not self._closing:
            self._protocol.data_received(data)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.call_soon(self._protocol.connection_lost, None)
        peer = self._peer
        if peer is not None and not peer._closing:
            peer._closing = True
            self._loop.call_soon(peer._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("inproc", 0) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None  # nothing is buffered: writes are handed to the loop at once

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return not self._closing

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


def register(server: Any) -> str:
    """Make a grpclib server reachable in this process; returns its inproc:// location."""
    name = uuid.uuid4().hex[:16]
    _SERVERS[name] = server
    return SCHEME + name


def unregister(location: str) -> None:
    _SERVERS.pop(location.removeprefix(SCHEME), None)


def connect(location: str, client_protocol: H2Protocol) -> H2Protocol:
    """Join a client protocol to the registered server's new protocol."""
    server = _SERVERS.get(location.removeprefix(SCHEME))
    if server is None:
        raise RemoteError(f"no in-process server at {location}", grpc_status=Status.UNAVAILABLE)
    loop = asyncio.get_running_loop()
    server_protocol = server._protocol_factory()
    client_end = MemoryTransport(loop, client_protocol)
    server_end = MemoryTransport(loop, server_protocol)
    client_end._peer, server_end._peer = server_end, client_end
    server_protocol.connection_made(server_end)
    client_protocol.connection_made(client_end)
    return client_protocol
