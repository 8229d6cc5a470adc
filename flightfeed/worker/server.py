"""The worker: one port serving Arrow Flight and the WorkerService, plus the task registry."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio

from ..flight.server import FlightServer
from ..session import (
    DEFAULT_SESSION_BUILDER,
    SessionBuilder,
    as_session_builder,
    load_session_builder,
)
from .config import WorkerConfig
from .registry import TaskRegistry
from .rpc.do_get import WorkerFlightHandler
from .service import WorkerService


def resolve_session_builder(builder: Any) -> SessionBuilder:
    """None → default; "pkg.module:attr" → imported; a builder object or async function."""
    if builder is None:
        return DEFAULT_SESSION_BUILDER
    if isinstance(builder, str):
        return load_session_builder(builder)
    return as_session_builder(builder)


class Worker:
    """`async with Worker(port=0) as worker:` serves until the block exits.

    Tasks arrive over CoordinatorChannel (SetPlan); any Flight client runs a partition range
    with DoGet(ticket = serialized ExecuteTaskRequest), as does the WorkerService ExecuteTask.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        session_builder: Any = None,
        advertised_url: str | None = None,
        config: WorkerConfig | None = None,
        in_process: bool = False,
    ) -> None:
        self.config = config or WorkerConfig()
        self.session_builder = resolve_session_builder(session_builder)
        self.registry = TaskRegistry(self.config)
        self._advertised_url = advertised_url
        self._server = FlightServer(
            WorkerFlightHandler(self),
            services=[WorkerService(self)],
            host=host,
            port=port,
            in_process=in_process,
            keepalive=self.config.keepalive,
        )
        self._stack: AsyncExitStack | None = None

    @property
    def location(self) -> str:
        return self._advertised_url or self._server.location

    async def __aenter__(self) -> Worker:
        async with AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            await self._server.start()
            stack.push_async_callback(self._server.close)
            tg.start_soon(self.registry.reap_idle, name="idle task reaper")
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._stack is not None
        stack, self._stack = self._stack, None
        await stack.aclose()
