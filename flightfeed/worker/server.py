"""The worker: one port serving Arrow Flight and the WorkerService."""

from __future__ import annotations

from typing import Any

from ..flight.server import FlightHandler, FlightServer
from .service import WorkerService


class WorkerFlightHandler(FlightHandler):
    """The worker's Flight face; DoGet with an ExecuteTask ticket arrives with the runtime."""


class Worker:
    """`async with Worker(port=0) as worker:` serves until the block exits."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        session_builder: Any = None,
        advertised_url: str | None = None,
    ) -> None:
        self.session_builder = session_builder
        self._advertised_url = advertised_url
        self._server = FlightServer(
            WorkerFlightHandler(), services=[WorkerService()], host=host, port=port
        )

    @property
    def location(self) -> str:
        return self._advertised_url or self._server.location

    async def __aenter__(self) -> Worker:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.close()
