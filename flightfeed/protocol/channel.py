"""The transport-neutral worker channel: what a coordinator (or another worker) needs of a
worker, and what a worker offers any transport.

`WorkerChannel` is the caller's side, with two implementations: `WorkerClient` speaks gRPC to a
worker on the network; `InProcessWorkerChannel` calls a worker of this process directly,
passing messages, errors and record batches as objects. `WorkerEndpoint` is the worker's side:
the handlers both transports call, over plain async streams and sinks.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import betterproto2
import pyarrow as pa
from grpclib.const import Status

from .._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
    SetPlanRequest,
    TaskMetrics,
    WorkUnitBatch,
)
from ..concurrency import closing
from ..errors import Cancelled, RemoteError
from .channel_wire import EncodedTaskMetrics, WorkerMessage
from .errors import from_detail

Headers = Mapping[str, str]


class ChannelClosed(Cancelled):
    """A send on a task channel its caller closed itself (`done_sending`): the sender should
    stop, nothing failed."""


class TaskChannel(Protocol):
    """The caller's end of one task's control channel (the seed's CoordinatorChannel)."""

    async def send_work_units(self, batch: WorkUnitBatch, /) -> None:
        """Send a batch of work units; the worker granted the credits for it. ChannelClosed
        once `done_sending` was called."""
        ...

    async def cancel(self, reason: str, /) -> None:
        """Ask the worker to stop the task and drop its state. Best effort and bounded: never
        raises, and does nothing when the channel can no longer carry a message."""
        ...

    async def release(self) -> None:
        """Tell the worker the query needs nothing more from the task: partitions nobody has
        asked for will not be. Best effort and bounded, like `cancel`."""
        ...

    async def done_sending(self) -> None:
        """No more control messages (the task keeps running); bounded, never raises."""
        ...

    def messages(self) -> AsyncIterator[WorkerMessage]:
        """What the worker sends: feed credits, task errors, and TaskMetrics last (encoded, when
        they came over the network: `EncodedTaskMetrics.decode()`). Raises the worker's error
        (a FlightfeedError) when the channel fails."""
        ...

    async def wait_metrics(self) -> TaskMetrics:
        """Read until the task's metrics arrive (it finished); raises the task's error."""
        ...


class WorkerChannel(Protocol):
    """A worker as its callers see it, whatever the transport."""

    @property
    def url(self) -> str:
        """The worker's location (`grpc://host:port`, or `inproc://name`)."""
        ...

    async def worker_info(self) -> GetWorkerInfoResponse: ...

    def open_task(
        self, set_plan: SetPlanRequest, *, headers: Headers | None = None
    ) -> AbstractAsyncContextManager[TaskChannel]:
        """Send a task's plan and hold its control channel while the block runs; leaving the
        block closes the channel (a worker drops a task whose channel closed)."""
        ...

    def execute_task(
        self, request: ExecuteTaskRequest, *, headers: Headers | None = None
    ) -> AbstractAsyncContextManager[AsyncIterable[pa.RecordBatch]]:
        """Stream a partition range of a task; leaving the block early stops it."""
        ...

    async def close(self) -> None: ...


Send = Callable[[WorkerMessage], Awaitable[None]]
"""How a worker's channel handler sends a message back to the task's caller."""


class PartitionSink(Protocol):
    """Where a worker writes the batches of an ExecuteTask (a Flight stream, or memory)."""

    async def begin(self, schema: pa.Schema, /) -> None:
        """Announce the schema (before any batch; omitted when nothing was claimed)."""
        ...

    async def write(self, partition: int, batch: pa.RecordBatch, /) -> None: ...


class WorkerEndpoint(Protocol):
    """The worker's handlers, as every transport calls them. Errors are raised as they are;
    the transport maps them (a gRPC status with the typed trailer, or the object itself)."""

    @property
    def location(self) -> str: ...

    def worker_info(self) -> GetWorkerInfoResponse: ...

    async def coordinator_channel(
        self,
        headers: Headers,
        inbound: AsyncIterator[CoordinatorToWorkerMsg],
        send: Send,
        accepted: Callable[[], Awaitable[None]],
    ) -> None:
        """Run one task's channel: `inbound` yields CoordinatorToWorkerMsg objects (the first a
        SetPlanRequest); `accepted` is awaited once the task is registered."""
        ...

    async def execute_task(
        self, headers: Headers, request: ExecuteTaskRequest, sink: PartitionSink
    ) -> None: ...


class MetricsWaiter:
    """`wait_metrics` for task channels, on top of their `messages()`."""

    def messages(self) -> AsyncIterator[WorkerMessage]:
        raise NotImplementedError

    async def wait_metrics(self) -> TaskMetrics:
        async with closing(self.messages()) as messages:
            async for message in messages:
                if isinstance(message, EncodedTaskMetrics):
                    return message.decode()
                kind, value = betterproto2.which_one_of(message, "inner")
                if kind == "task_metrics":
                    metrics: TaskMetrics = value
                    return metrics
                if kind == "task_error":
                    raise from_detail(value)
        raise RemoteError("task channel ended without metrics", grpc_status=Status.UNKNOWN)
