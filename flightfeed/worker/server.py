"""The worker: one port serving Arrow Flight and the WorkerService, plus the task registry.

With `in_process=True` there is no port: the worker registers its handlers under an
`inproc://` location that only this process can reach (flightfeed.protocol.inprocess).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from functools import partial
from typing import Any, Final

import anyio

from ..concurrency import Signal, require_asyncio
from ..errors import ErrorOrigin
from ..flight.call_count import CallCount
from ..flight.idle_release import release_when_idle
from ..flight.server import FlightServer
from ..flight.tuning import release_free_memory
from ..flight.wire import DEFAULT_MAX_MESSAGE_SIZE
from ..protocol import inprocess
from ..protocol.errors import TYPED_ERRORS
from ..session import (
    DEFAULT_SESSION_BUILDER,
    Headers,
    Session,
    SessionBuilder,
    as_session_builder,
    load_session_builder,
)
from ..tables.engine import TableEngine, purge_expired_rows
from ..tables.service import PlanRuntime, RemoteEngineService
from .config import WorkerConfig
from .endpoint import WorkerHandlers
from .registry import TaskRegistry
from .rpc.do_get import WorkerFlightHandler
from .service import WorkerService
from .sessions import build_session
from .state import WorkerState

TABLE_STORE_MEMORY_SHARE: Final = 2
"""The durable tables' DuckDB may hold this fraction of the worker's memory limit (1/2): its
writes grew the worker past --memory-limit, to DuckDB's own default of 80% of the machine."""


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
    Its location, which coordinators hand to readers, is `advertised_url`, or its URL with
    `advertised_host` (a worker on 0.0.0.0 otherwise says 127.0.0.1, reachable only here).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        session_builder: Any = None,
        advertised_url: str | None = None,
        advertised_host: str | None = None,
        config: WorkerConfig | None = None,
        in_process: bool = False,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.config = config or WorkerConfig()
        self._busy_edges = Signal()  # the first task or call comes, the last one goes
        self.state = WorkerState(
            config=self.config,
            registry=TaskRegistry(self.config, on_edge=self._busy_edges.notify),
            session_builder=resolve_session_builder(session_builder),
            calls=CallCount(on_edge=self._busy_edges.notify),
        )
        self.handlers = WorkerHandlers(self.state)
        self.state.endpoint = self.handlers
        self._advertised_url = advertised_url
        self._advertised_host = advertised_host
        self._in_process = in_process
        self._server = FlightServer(
            WorkerFlightHandler(self.state),
            services=[
                WorkerService(self.handlers, TYPED_ERRORS, max_message_size),
                RemoteEngineService(
                    self.state.table_engine,
                    TYPED_ERRORS,
                    max_message_size,
                    calls=self.state.call_under_way,
                    compression=self.config.table_compression,
                    plans=PlanRuntime(
                        session=self._plan_session,
                        memory=self.state.memory,
                        gate=self.state.plan_gate,
                    ),
                ),
            ],
            host=host,
            port=port,
            keepalive=self.config.keepalive,
            limits=self.config.connections,
            errors=TYPED_ERRORS,
            max_message_size=max_message_size,
            calls=self.state.calls,
            tls=self.config.tls,
            auth=self.config.auth,
        )
        self._stack: AsyncExitStack | None = None

    @property
    def registry(self) -> TaskRegistry:
        return self.state.registry

    @property
    def location(self) -> str:
        return self.state.location

    async def __aenter__(self) -> Worker:
        require_asyncio("a Worker")
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self.state.peers.aclose)
            if (segments := self.state.segments) is not None:
                stack.push_async_callback(segments.close)  # (last: after every call ended)
            if self.config.data_dir is not None:
                data_dir = self.config.data_dir
                limit = self.config.memory_limit
                tables = await TableEngine.open(
                    None if data_dir == ":memory:" else data_dir,
                    memory_limit=None if limit is None else limit // TABLE_STORE_MEMORY_SHARE,
                    snapshot_ttl=self.config.table_snapshot_ttl,
                    snapshot_grace=self.config.table_snapshot_grace,
                )
                stack.push_async_callback(tables.aclose)
                self.state.tables = tables
            if self._in_process:  # reachable by location from this process only
                self.state.location = inprocess.register(self.handlers)
                stack.callback(self.handlers.close)
                stack.callback(inprocess.unregister, self.state.location)
            else:
                await self._server.start()  # a port it cannot have fails here, as itself
                stack.push_async_callback(self._server.close)
                self.state.location = self._advertised_url or (
                    self._server.location_at(self._advertised_host)
                    if self._advertised_host
                    else self._server.location
                )
            # Entered after the server started: a failure before is raised as it is, not in an
            # ExceptionGroup. (Leaving, its tasks stop before the server closes.)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            registry = self.state.registry
            tg.start_soon(registry.reap_idle, name="idle task reaper")
            if (segments := self.state.segments) is not None:
                tg.start_soon(segments.expire_idle, name="idle shared-memory segments")
            if self.state.tables is not None:
                tg.start_soon(
                    purge_expired_rows,
                    self.state.tables,
                    self.config.table_purge_interval,
                    name="table TTL purge",
                )
                tg.start_soon(self.state.tables.snapshots.expire_idle, name="table snapshots")
            if self.config.release_memory_after is not None:
                # Quiet: no tasks, and no calls either (refused calls never make a task).
                calls = self.state.calls
                tg.start_soon(
                    partial(
                        release_when_idle,
                        lambda: len(registry) > 0 or calls.busy(),
                        self._busy_edges.wait,
                        delay=self.config.release_memory_after,
                        release=self._release_memory,
                    ),
                    name="idle memory release",
                )
            self._stack = stack.pop_all()
        return self

    async def _plan_session(self, headers: Headers) -> Session:
        """The session of a plan pushed down with ExecutePhysicalPlan."""
        return await build_session(self.state, headers, None, ErrorOrigin(self.state.location))

    async def drain(self, grace: float) -> int:
        """Graceful shutdown, first half: new tasks and calls to the tables are refused
        (UNAVAILABLE) while the running tasks finish and are read, and the table reads and
        writes and shared-memory reads under way end (`call_under_way`), for at most `grace`
        seconds; tasks kept only for a re-read are not waited for (TaskRegistry.drained).
        Returns how many tasks and calls were still running (they end, with the others, when
        the worker closes)."""
        registry = self.state.registry
        registry.draining = True
        with anyio.move_on_after(grace):
            await registry.drained()
            await self.state.calls_under_way_ended()
        return registry.unsettled + self.state.calls_under_way

    def _release_memory(self) -> None:
        self.state.memory_releases += 1  # (only this thread writes it; readers see it whole)
        release_free_memory()

    async def __aexit__(self, *exc: object) -> None:
        assert self._stack is not None
        stack, self._stack = self._stack, None
        await stack.aclose()
