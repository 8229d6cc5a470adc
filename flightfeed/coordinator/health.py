"""Which workers a new query may use: those the coordinator can reach.

At query start every worker the resolver names is connected (and version-checked) at once; one
that cannot be reached, or that recently failed a query (lost connection, no reply to a
keepalive PING), is left out, and the query runs on the others. A worker that answers wrongly
(another version, say) is not skipped: the query fails saying so. A worker left out is checked
again by the first query `recheck_after` seconds later, in the background (the coordinator's
task group) while that query runs on the others, and stays out while its GetWorkerInfo says it
is shutting down (draining: it finishes its tasks over its open connection, and refuses new
ones). Only when none is left does the query fail, naming each worker and why.

After a query attempt fails, `lost` asks each of its workers for its version over its live
channel, with a short deadline: a worker that does not answer (killed, stopped, cut off) is
left out like an unreachable one, and the retry runs on the others (coordinator/retries.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio
from anyio.abc import TaskGroup
from grpclib.const import Status

from ..errors import FlightfeedError, InvalidArgument, RemoteError, Unavailable
from ..protocol.resolver import ChannelResolver
from ..protocol.version import check_worker_version

DEFAULT_RECHECK_AFTER: Final = 5.0
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_PROBE_TIMEOUT: Final = 3.0
"""How long a worker has to answer GetWorkerInfo after a query on it failed."""
SHUTTING_DOWN: Final = "the worker is shutting down (it says so in GetWorkerInfo)"

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Check:
    """One check of a worker, shared by the queries that ask for it meanwhile."""

    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: bool | Exception = False
    """Whether a query may use the worker, or the error of a worker that answered wrongly
    (False also when the check was cancelled: then `down` may not say why)."""


@dataclass
class WorkerHealth:
    channels: ChannelResolver
    recheck_after: float = DEFAULT_RECHECK_AFTER
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    down: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Workers left out of new queries: since when (anyio's clock) and why."""

    _checking: dict[str, _Check] = field(default_factory=dict, repr=False)
    """The checks under way, by worker: one for every query that asks meanwhile."""

    async def usable(
        self, urls: Sequence[str], *, background: TaskGroup | None = None
    ) -> list[str]:
        """The workers of `urls` a query may use now, in their order. A worker left out and
        due for another check is checked in `background` while the query runs on the others
        (it is back for the queries after); the query waits for that check only when no other
        worker is usable, and for a worker never reached yet. Queries asking meanwhile share
        each check. Before, every query due a check waited for it: a stopped worker (which
        still accepts connections) cost each query started then the whole connect timeout."""
        now = anyio.current_time()
        ordered = list(dict.fromkeys(urls))
        due = [
            url
            for url in ordered
            if url not in self.down or now - self.down[url][0] >= self.recheck_after
        ]
        # connected and checked: nothing to wait for, unless it was left out (it may be
        # shutting down still, its connection open for the tasks it finishes)
        reachable = {
            url: True for url in due if self.channels.is_open(url) and url not in self.down
        }
        first = [url for url in due if url not in reachable and url not in self.down]
        again = [url for url in due if url in self.down]
        wrong: list[Exception] = []

        async def outcome(url: str, tg: TaskGroup) -> None:
            check = self._check_in(tg, url)
            await check.done.wait()
            if isinstance(check.outcome, Exception):
                wrong.append(check.outcome)
            else:
                reachable[url] = check.outcome

        async def wait_for(checked: list[str]) -> None:
            async with anyio.create_task_group() as local:
                for url in checked:
                    local.start_soon(outcome, url, local if background is None else background)

        if first:
            await wait_for(first)
        if again and background is not None and any(reachable.values()):
            for url in again:
                self._check_in(background, url)  # (not waited for: back for later queries)
        elif again:
            await wait_for(again)
        if wrong:
            raise wrong[0]
        usable = [url for url in ordered if reachable.get(url)]
        if not usable and urls:
            why = "; ".join(f"{url}: {self._why(url)}" for url in ordered)
            raise Unavailable(f"no worker can be reached: {why}")
        return usable

    def checking(self, url: str) -> bool:
        """Whether a check of `url` is under way."""
        return url in self._checking

    async def settled(self) -> None:
        """Return once no check is under way (for tests and tools that look at `down`)."""
        while self._checking:
            await next(iter(self._checking.values())).done.wait()

    def _why(self, url: str) -> str:
        found = self.down.get(url)
        return found[1] if found is not None else "its check was cancelled"

    def _check_in(self, tg: TaskGroup, url: str) -> _Check:
        """The check of `url` under way, or a new one run in `tg`."""
        check = self._checking.get(url)
        if check is None:
            check = self._checking[url] = _Check()
            tg.start_soon(self._run_check, url, check, name=f"check of worker {url}")
        return check

    async def _run_check(self, url: str, check: _Check) -> None:
        try:
            check.outcome = await self._check(url)
        finally:
            del self._checking[url]
            check.done.set()

    async def _check(self, url: str) -> bool | Exception:
        """Connect to `url` (and ask a worker left out whether it is shutting down): whether a
        query may use it (if not, `down` says why), or the error of a worker that answered
        wrongly (another version, say: the query fails saying so)."""
        try:
            with anyio.fail_after(self.connect_timeout):
                channel = await self.channels.channel(url)
                if url in self.down and (await channel.worker_info()).draining:
                    self.down[url] = (anyio.current_time(), SHUTTING_DOWN)
                    return False
        except (RemoteError, OSError, TimeoutError) as exc:
            if isinstance(exc, RemoteError) and exc.grpc_status is not Status.UNAVAILABLE:
                return exc  # reached, and something else is wrong
            self.down[url] = (anyio.current_time(), _reason(exc))
            return False
        except InvalidArgument as exc:  # not a worker's URL (a resolver's): left out, saying so
            self.down[url] = (anyio.current_time(), exc.message)
            return False
        except FlightfeedError as exc:
            return exc
        except Exception as exc:  # (it runs in the coordinator's task group: never its end)
            log.warning("checking worker %s failed: %s: %s", url, type(exc).__name__, exc)
            self.down[url] = (anyio.current_time(), f"{type(exc).__name__}: {exc}")
            return False
        self.down.pop(url, None)
        return True

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
            except Exception as exc:  # (whatever else connecting raised: it did not answer)
                found[url] = f"{type(exc).__name__}: {exc}"

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
