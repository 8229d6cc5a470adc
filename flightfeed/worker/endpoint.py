"""The worker's handlers bound to its state: the WorkerEndpoint every transport calls.

The gRPC service (service.py) and the Flight DoGet adapt their streams to these calls; an
in-process caller (flightfeed.protocol.inprocess) calls them directly. For the latter the calls
run in the caller's task groups, so the endpoint keeps their cancel scopes: closing the worker
cancels them, as closing a server cancels its handlers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio

from .._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
)
from ..errors import Cancelled
from ..protocol.channel import Headers, PartitionSink, Send
from .rpc.coordinator_channel import coordinator_channel
from .rpc.execute_task import execute_task
from .rpc.get_worker_info import get_worker_info
from .state import WorkerState


class WorkerHandlers:
    """Implements flightfeed.protocol.WorkerEndpoint over a WorkerState."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self._calls: set[anyio.CancelScope] = set()
        self._closed = False

    @property
    def location(self) -> str:
        return self.state.location

    def worker_info(self) -> GetWorkerInfoResponse:
        return get_worker_info(self.state)

    async def coordinator_channel(
        self,
        headers: Headers,
        inbound: AsyncIterator[CoordinatorToWorkerMsg],
        send: Send,
        accepted: Callable[[], Awaitable[None]],
    ) -> None:
        with self._call():
            await coordinator_channel(self.state, headers, inbound, send, accepted)

    async def execute_task(
        self, headers: Headers, request: ExecuteTaskRequest, sink: PartitionSink
    ) -> None:
        with self._call():
            await execute_task(self.state, request, sink)

    @contextmanager
    def _call(self) -> Iterator[None]:
        if self._closed:
            raise Cancelled(f"worker {self.location} is shutting down")
        scope = anyio.CancelScope()
        self._calls.add(scope)
        try:
            with scope:
                yield
        finally:
            self._calls.discard(scope)
        if scope.cancelled_caught:
            raise Cancelled(f"worker {self.location} shut down")

    def close(self) -> None:
        """Refuse new calls and cancel the running ones."""
        self._closed = True
        for scope in list(self._calls):
            scope.cancel()
