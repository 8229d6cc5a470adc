"""Which workers a coordinator may use: a WorkerResolver lists their URLs for each query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..errors import InvalidArgument
from ..protocol import check_worker_url


class WorkerResolver(Protocol):
    """Lists the workers' URLs (`grpc://host:port`); asked once per query, so it may change."""

    async def workers(self) -> list[str]: ...


class StaticWorkerResolver:
    """A fixed list of worker URLs."""

    def __init__(self, urls: Sequence[str]) -> None:
        if isinstance(urls, str):
            raise InvalidArgument("StaticWorkerResolver takes a list of URLs, not one string")
        for url in urls:
            check_worker_url(url)  # InvalidArgument early, not at the first query
        self._urls = list(urls)

    async def workers(self) -> list[str]:
        return list(self._urls)

    def __repr__(self) -> str:
        return f"StaticWorkerResolver({self._urls!r})"


class _Located(Protocol):
    @property
    def location(self) -> str: ...


class InProcessWorkerResolver:
    """The workers running in this process (`flightfeed.testing.start_workers`), by location.

    Locations are read at each query, so workers may be added to the list while it is in use.
    """

    def __init__(self, workers: Sequence[_Located]) -> None:
        self._workers = workers

    async def workers(self) -> list[str]:
        return [worker.location for worker in self._workers]

    def __repr__(self) -> str:
        return f"InProcessWorkerResolver({len(self._workers)} workers)"
