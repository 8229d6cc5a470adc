"""Which workers a new query may use: those the coordinator can reach.

At query start every worker the resolver names is connected (and version-checked) at once; one
that cannot be reached, or that recently failed a query (lost connection, no reply to a
keepalive PING), is left out, and the query runs on the others. A worker that answers wrongly
(another version, say) is not skipped: the query fails saying so. A worker left out is tried
again `recheck_after` seconds later, and stays out while its GetWorkerInfo says it is shutting
down (draining: it finishes its tasks over its open connection, and refuses new ones). Only when
none is left does the query fail, naming each worker and why.

After a query attempt fails, `lost` asks each of its workers for its version over its live
channel, with a short deadline: a worker that does not answer (killed, stopped, cut off) is
left out like an unreachable one, and the retry runs on the others (coordinator/retries.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio
from grpclib.const import Status

from ..errors import FlightfeedError, RemoteError, Unavailable
from ..protocol.resolver import ChannelResolver
from ..protocol.version import check_worker_version

DEFAULT_RECHECK_AFTER: Final = 5.0
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_PROBE_TIMEOUT: Final = 3.0
"""How long a worker has to answer GetWorkerInfo after a query on it failed."""
SHUTTING_DOWN: Final = "the worker is shutting down (it says so in GetWorkerInfo)"


@dataclass
class WorkerHealth:
    channels: ChannelResolver
    recheck_after: float = DEFAULT_RECHECK_AFTER
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    down: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Workers left out of new queries: since when (anyio's clock) and why."""

    async def usable(self, urls: Sequence[str]) -> list[str]:
        """The workers of `urls` a query may use now, in their order."""
        now = anyio.current_time()
        reachable: dict[str, bool] = {}
        wrong: list[Exception] = []

        async def check(url: str) -> None:
            try:
                with anyio.fail_after(self.connect_timeout):
                    channel = await self.channels.channel(url)
                    if url in self.down and (await channel.worker_info()).draining:
                        self.down[url] = (anyio.current_time(), SHUTTING_DOWN)
                        reachable[url] = False
                        return
            except (RemoteError, OSError, TimeoutError) as exc:
                if isinstance(exc, RemoteError) and exc.grpc_status is not Status.UNAVAILABLE:
                    wrong.append(exc)  # reached, and something else is wrong
                    return
                self.down[url] = (anyio.current_time(), _reason(exc))
                reachable[url] = False
                return
            except FlightfeedError as exc:  # (another version, say): the query says what
                wrong.append(exc)
                return
            self.down.pop(url, None)
            reachable[url] = True

        due = [
            url
            for url in dict.fromkeys(urls)
            if url not in self.down or now - self.down[url][0] >= self.recheck_after
        ]
        for url in due:
            # connected and checked: nothing to wait for, unless it was left out (it may be
            # shutting down still, its connection open for the tasks it finishes)
            if self.channels.is_open(url) and url not in self.down:
                reachable[url] = True
        connecting = [url for url in due if url not in reachable]
        if connecting:
            async with anyio.create_task_group() as tg:
                for url in connecting:
                    tg.start_soon(check, url)
        if wrong:
            raise wrong[0]
        usable = [url for url in urls if reachable.get(url)]
        if not usable and urls:
            why = "; ".join(f"{url}: {self.down[url][1]}" for url in dict.fromkeys(urls))
            raise Unavailable(f"no worker can be reached: {why}")
        return usable

    def known_usable(self, urls: Sequence[str]) -> list[str]:
        """`urls` less the workers left out now, without connecting to any (for showing a
        plan); all of them if that leaves none."""
        now = anyio.current_time()
        left = [
            url
            for url in urls
            if url not in self.down or now - self.down[url][0] >= self.recheck_after
        ]
        return left or list(urls)

    async def lost(self, urls: Sequence[str]) -> dict[str, str]:
        """Of `urls`, the workers that no longer answer, and why; each is left out of new
        queries (and its channel dropped). Asked all at once, over the channels in use; a
        worker left out already (its connection just failed) is not asked again."""
        now = anyio.current_time()
        known = {
            url: self.down[url][1]
            for url in urls
            if url in self.down and now - self.down[url][0] < self.recheck_after
        }
        found: dict[str, str] = {}

        async def probe(url: str) -> None:
            try:
                with anyio.fail_after(self.probe_timeout):
                    await check_worker_version(await self.channels.channel(url), url)
            except (RemoteError, OSError, TimeoutError) as exc:
                if isinstance(exc, RemoteError) and exc.grpc_status is not Status.UNAVAILABLE:
                    return  # it answered, wrongly: not lost (the query's error says what)
                found[url] = _reason(exc)
            except FlightfeedError:
                return

        async with anyio.create_task_group() as tg:
            for url in dict.fromkeys(urls):
                if url not in known:
                    tg.start_soon(probe, url)
        for url, reason in found.items():
            self.down[url] = (anyio.current_time(), reason)
            await self.channels.forget(url)
        return known | found

    async def serving(self, url: str) -> bool:
        """Whether the worker answers GetWorkerInfo (within the probe timeout), and is not
        shutting down: a worker a reader could not reach, seen from here."""
        try:
            with anyio.fail_after(self.probe_timeout):
                info = await (await self.channels.channel(url)).worker_info()
        except (FlightfeedError, OSError, TimeoutError):
            return False
        return not info.draining

    async def failed(self, error: BaseException) -> None:
        """A query failed: if its worker is gone (the connection lost, or silent), leave the
        worker out of new queries for a while and drop its channel; if it is shutting down,
        leave it out too, but keep the channel its running tasks still use."""
        if not isinstance(error, FlightfeedError):
            return
        gone = isinstance(error, RemoteError) and error.grpc_status is Status.UNAVAILABLE
        if not (gone or isinstance(error, Unavailable)):
            return
        url = error.origin.worker_url if error.origin is not None else ""
        if url:
            self.down[url] = (anyio.current_time(), _reason(error))
            if gone:
                await self.channels.forget(url)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer within the timeout"
    if isinstance(exc, FlightfeedError):
        return exc.message
    return str(exc) or type(exc).__name__


__all__ = ["WorkerHealth"]
