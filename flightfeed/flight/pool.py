"""A client's HTTP/2 connections to one server: a pool that opens another connection when every
open one is at the peer's SETTINGS_MAX_CONCURRENT_STREAMS, as Go's HTTP/2 transport does.

One connection caps the calls open at once (h2's default is 100). Past the cap grpclib makes a
new call wait until another closes, and calls that wait on each other (a query holding its
task channel open while it starts the read of the task's output) would wait forever. Calls go
on the first connection with a free stream, so a quiet client keeps one connection; extra
connections are closed once they carry no call again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import h2.settings
from grpclib.protocol import H2Protocol

from .internals import close_connection, connection_lost, protocol_h2_connection

ASSUMED_MAX_STREAMS: Final = 100
"""A new connection's stream limit until the peer's SETTINGS names one (Go assumes 100 too:
the RFC's default is unlimited, but a server that has not spoken yet may allow fewer)."""
DEFAULT_MAX_CONNECTIONS: Final = 64
"""Beyond this many connections, new calls queue on the least busy one (grpclib's wait)."""

_MAX_STREAMS = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS


def stream_limit(protocol: H2Protocol) -> int:
    """How many streams the peer lets this connection open at once."""
    settings = protocol_h2_connection(protocol).remote_settings
    return int(settings[_MAX_STREAMS]) if _MAX_STREAMS in settings else ASSUMED_MAX_STREAMS


def open_streams(protocol: H2Protocol) -> int:
    """Streams this side has open on the connection (what the peer's limit counts)."""
    return int(protocol_h2_connection(protocol).open_outbound_streams)


class ConnectionPool:
    """The connections a channel spreads its calls over; `acquire()` picks one for a new call.

    A connection handed out counts as one more open stream until the event loop's next turn:
    grpclib opens the call's stream without yielding in between, so a burst of calls that
    arrive together never overshoots a connection's limit.
    """

    def __init__(
        self,
        open_connection: Callable[[], Awaitable[H2Protocol]],
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"a connection pool needs at least one connection: {max_connections}")
        self._open = open_connection
        self.max_connections = max_connections
        self._connections: list[H2Protocol] = []
        self._reserved: dict[H2Protocol, int] = {}
        self._lock = anyio.Lock()
        self._epoch = 0  # bumped by close(): a connect begun before it must not survive it
        self.opened = 0
        """Connections opened over the pool's life (tests and metrics)."""

    @property
    def connections(self) -> list[H2Protocol]:
        """The live connections, oldest first."""
        return [p for p in self._connections if not connection_lost(p)]

    async def acquire(self) -> H2Protocol:
        """The connection a new call goes on: the first with a free stream, else a new one."""
        found = self._with_room()
        if found is not None:
            return found
        async with self._lock:  # one connect at a time; the others then find its room
            found = self._with_room()
            if found is not None:
                return found
            if len(self._connections) >= self.max_connections:
                return self._reserve(min(self._connections, key=self._load))
            epoch = self._epoch
            protocol = await self._open()
            self.opened += 1
            if epoch != self._epoch:  # the channel was closed while this one connected
                close_connection(protocol)
                raise ConnectionError("the channel was closed while connecting")
            self._connections.append(protocol)
            return self._reserve(protocol)

    def _load(self, protocol: H2Protocol) -> int:
        return open_streams(protocol) + self._reserved.get(protocol, 0)

    def _with_room(self) -> H2Protocol | None:
        """Reserve a stream on the first live connection that has one; drop dead connections
        and close idle extra ones."""
        chosen: H2Protocol | None = None
        keep: list[H2Protocol] = []
        for protocol in self._connections:
            if connection_lost(protocol):
                continue  # its calls failed with it; grpclib closed it
            if chosen is None and self._load(protocol) < stream_limit(protocol):
                chosen = protocol
            elif keep and self._idle(protocol):
                close_connection(protocol)  # an extra no call uses: the burst is over
                continue
            keep.append(protocol)
        self._connections = keep
        return self._reserve(chosen) if chosen is not None else None

    def _idle(self, protocol: H2Protocol) -> bool:
        return not protocol.processor.streams and not self._reserved.get(protocol)

    def _reserve(self, protocol: H2Protocol) -> H2Protocol:
        self._reserved[protocol] = self._reserved.get(protocol, 0) + 1
        asyncio.get_running_loop().call_soon(self._release, protocol)
        return protocol

    def _release(self, protocol: H2Protocol) -> None:
        left = self._reserved.get(protocol, 0) - 1
        if left > 0:
            self._reserved[protocol] = left
        else:
            self._reserved.pop(protocol, None)

    def close(self) -> None:
        """Close every connection (their calls fail); a later call connects anew, as with
        grpclib's own Channel."""
        self._epoch += 1
        connections, self._connections = self._connections, []
        for protocol in connections:
            if not connection_lost(protocol):
                close_connection(protocol)
