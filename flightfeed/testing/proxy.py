"""A TCP proxy in front of a worker, for fault injection: cut or freeze its connections, or
make its clients another host."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import ByteStream, SocketAttribute, SocketStream, TaskGroup, TaskStatus

from ..flight.client import parse_location


class TcpProxy:
    """Forwards connections to a worker, for fault injection. `cut()` closes them all at once,
    as a crashed worker would; `freeze()` silences them without closing, as a paused machine or
    a network partition would (no FIN, no RST). The worker itself keeps running.
    `source_host` is the address it connects to the worker from: another loopback address
    (127.0.0.2) makes its clients another host as the worker sees them."""

    def __init__(self, target: str, *, source_host: str | None = None) -> None:
        self.target = target
        self._host, self._port = parse_location(target)
        self._source_host = source_host
        self.location = ""
        self.connections = 0
        """Connections accepted so far."""
        self._scope = anyio.CancelScope()
        self._stopped = anyio.Event()
        self._flowing = anyio.Event()
        self._flowing.set()

    async def cut(self) -> None:
        """Close the listener and every forwarded connection; new connections are refused."""
        self._scope.cancel()
        await self._stopped.wait()

    def freeze(self) -> None:
        """Stop forwarding in both directions, keeping every connection open: each side's
        bytes pile up unread, exactly as towards a peer that stopped reading."""
        if self._flowing.is_set():
            self._flowing = anyio.Event()

    def thaw(self) -> None:
        """Resume forwarding what piled up."""
        self._flowing.set()

    async def _serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
                port = listener.extra(SocketAttribute.local_port)
                self.location = f"grpc://127.0.0.1:{port}"
                task_status.started()
                async with listener:
                    await listener.serve(self._forward)
        finally:
            self._stopped.set()

    async def _forward(self, client: SocketStream) -> None:
        self.connections += 1
        async with client:
            try:
                upstream = await anyio.connect_tcp(
                    self._host, self._port, local_host=self._source_host
                )
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, client, upstream, tg)
                tg.start_soon(self._pump, upstream, client, tg)

    async def _pump(self, source: ByteStream, sink: ByteStream, tg: TaskGroup) -> None:
        """One direction of a forwarded connection; when it ends, the whole connection does."""
        try:
            while True:
                await self._flowing.wait()  # frozen: leave the bytes in the kernel, unread
                chunk = await source.receive()
                await self._flowing.wait()
                await sink.send(chunk)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def tcp_proxy(target: str, *, source_host: str | None = None) -> AsyncIterator[TcpProxy]:
    """A TcpProxy to `target` (a worker location) on a free local port, for fault injection
    (`source_host`: TcpProxy)."""
    proxy = TcpProxy(target, source_host=source_host)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy._serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
