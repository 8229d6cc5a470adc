"""ChannelResolver: one WorkerChannel per worker URL (over gRPC: a pool of HTTP/2 connections,
one until the calls open at once exceed the worker's stream limit).

Every task channel and ExecuteTask of every query to a worker shares its channel for the
resolver's lifetime; `inproc://` workers of this process get an in-process channel. A worker is
version-checked the first time it is used; a worker that fails the check is not kept, so a later
query checks it again (it may have been upgraded). The check also says the worker's feed window,
so a new task's first work units go out behind its plan instead of after a grant.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

import anyio

from .._version import __version__
from ..flight.keepalive import WORKER_CLIENT_KEEPALIVE, KeepalivePolicy
from ..flight.tls import ClientTls
from .channel import WorkerChannel
from .connect import connect_worker
from .version import checked_worker_info


class ChannelResolver:
    """Channels by worker URL, created and version-checked on first use, closed on `aclose`.

    Connections keep alive with `keepalive`: a worker that stops answering without closing
    its connection (power loss, partition) fails its queries instead of hanging them.
    """

    def __init__(
        self,
        *,
        metadata: Mapping[str, str | bytes] | None = None,
        check_version: bool = True,
        expected_version: str = __version__,
        keepalive: KeepalivePolicy | None = WORKER_CLIENT_KEEPALIVE,
        tls: ClientTls | None = None,
    ) -> None:
        """`tls`: how `grpc+tls://` workers are checked (root CA) and what certificate this
        side presents to them (for workers that require one)."""
        self._metadata = dict(metadata or {})
        self._tls = tls
        self._keepalive = keepalive
        self._check_version = check_version
        self._expected = expected_version
        self._clients: dict[str, WorkerChannel] = {}
        self._feed_windows: dict[str, int] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._closed = False

    async def channel(self, url: str) -> WorkerChannel:
        """The worker's channel; VersionMismatch if it is not a flightfeed worker of this
        version."""
        found = self._clients.get(url)
        if found is not None:
            return found
        lock = self._locks.setdefault(url, anyio.Lock())
        async with lock:  # concurrent first uses share one connection and one check
            found = self._clients.get(url)
            if found is not None:
                return found
            if self._closed:
                raise RuntimeError("ChannelResolver is closed")
            client = connect_worker(
                url, metadata=self._metadata, keepalive=self._keepalive, tls=self._tls
            )
            try:
                if self._check_version:
                    info = await checked_worker_info(client, url, self._expected)
                    self._feed_windows[url] = info.feed_window
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await client.close()
                raise
            self._clients[url] = client
            return client

    def feed_window(self, url: str) -> int:
        """Work units per feed partition a new task on `url` may be sent before its first
        grant: the window the worker reported, 0 for a worker not (yet) checked."""
        return self._feed_windows.get(url, 0)

    def is_open(self, url: str) -> bool:
        """Whether `url` has a channel already (version-checked): `channel` returns it at once."""
        return url in self._clients

    @property
    def urls(self) -> list[str]:
        """Workers with an open channel."""
        return list(self._clients)

    async def forget(self, url: str) -> None:
        """Close a worker's channel (after it failed); the next use reconnects."""
        client = self._clients.pop(url, None)
        self._feed_windows.pop(url, None)
        if client is not None:
            await client.close()

    async def aclose(self) -> None:
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    async def __aenter__(self) -> ChannelResolver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
