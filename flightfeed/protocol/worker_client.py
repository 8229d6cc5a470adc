"""Client side of the WorkerService: set a task's plan, run its partitions, read its metrics.

One `WorkerClient` holds one HTTP/2 connection to a worker; every task channel and
ExecuteTask of a query shares it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from functools import partial
from typing import Any

import anyio
import betterproto2
import grpclib.client
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.exceptions import StreamClosedError

from .._generated.flightfeed.v1 import (
    CancelTask,
    CoordinatorToWorkerMsg,
    ErrorDetail,
    ExecuteTaskRequest,
    GetWorkerInfoRequest,
    GetWorkerInfoResponse,
    SetPlanRequest,
    TaskMetrics,
    WorkerToCoordinatorMsg,
    WorkUnitBatch,
)
from ..errors import RemoteError
from ..flight.client import (
    FlightClient,
    call_error,
    cancel_if_unfinished,
    forget_wakeup_cancel,
    status_checker,
)
from ..flight.grpc import RawBytes
from ..flight.status import from_detail
from ..flight.streams import FlightDataReader

SERVICE = "/flightfeed.v1.WorkerService/"
HALF_CLOSE_TIMEOUT = 5.0


class TaskChannel:
    """The coordinator's end of one task's CoordinatorChannel."""

    def __init__(self, stream: grpclib.client.Stream[Any, Any]) -> None:
        self._stream = stream
        self.metrics: TaskMetrics | None = None
        self.errors: list[ErrorDetail] = []
        self.credits: list[Any] = []
        self._closed = False

    async def send(self, message: CoordinatorToWorkerMsg) -> None:
        await self._stream.send_message(message)

    async def send_work_units(self, batch: WorkUnitBatch) -> None:
        await self.send(CoordinatorToWorkerMsg(work_unit_batch=batch))

    async def cancel(self, reason: str) -> None:
        """Ask the worker to stop the task and drop its state."""
        await self.send(CoordinatorToWorkerMsg(cancel_task=CancelTask(reason=reason)))

    async def done_sending(self) -> None:
        """Half-close: no more control messages (the task keeps running)."""
        if self._closed:
            return
        self._closed = True
        if self._stream._stream.closable:
            # Bounded: a worker that stopped reading must not hold the caller forever.
            with (
                anyio.move_on_after(HALF_CLOSE_TIMEOUT),
                suppress(StreamClosedError, StreamTerminatedError),
            ):
                await self._stream.end()
        else:
            # The worker closed the call already: nothing can be sent, so the outgoing side
            # is over (grpclib would otherwise refuse to read the status at exit).
            self._stream._end_done = True

    async def messages(self) -> AsyncIterator[WorkerToCoordinatorMsg]:
        """What the worker sends: credits, errors, and TaskMetrics last."""
        task = asyncio.current_task()
        baseline = task.cancelling() if task is not None else 0
        try:
            async for message in self._stream:
                yield self._note(message)
        except (GRPCError, StreamTerminatedError) as exc:
            forget_wakeup_cancel(self._stream, task, baseline)
            raise call_error(self._stream, exc) from None

    def _note(self, message: WorkerToCoordinatorMsg) -> WorkerToCoordinatorMsg:
        kind = betterproto2.which_one_of(message, "inner")[0]
        if kind == "task_metrics":
            self.metrics = message.task_metrics
        elif kind == "task_error":
            self.errors.append(message.task_error)
        return message

    async def wait_metrics(self) -> TaskMetrics:
        """Read until the task's metrics arrive (the task finished)."""
        async for _ in self.messages():
            if self.metrics is not None:
                return self.metrics
        if self.errors:
            raise from_detail(self.errors[-1])
        await status_checker(self._stream)()  # the worker ended the channel: why?
        raise RemoteError("task channel ended without metrics", grpc_status=Status.UNKNOWN)


class WorkerClient(FlightClient):
    """A Flight client that also speaks the WorkerService."""

    async def get_worker_info(self) -> GetWorkerInfoResponse:
        reply: GetWorkerInfoResponse = await self._worker_unary(
            "GetWorkerInfo", GetWorkerInfoRequest(), GetWorkerInfoResponse
        )
        return reply

    async def _worker_unary(self, method: str, request: Any, reply_type: type) -> Any:
        async with self._call(
            method, Cardinality.UNARY_UNARY, type(request), reply_type, None, path=SERVICE
        ) as stream:
            await stream.send_message(request, end=True)
            return await stream.recv_message()

    @asynccontextmanager
    async def open_task(
        self, set_plan: SetPlanRequest, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[TaskChannel]:
        """Open the task's CoordinatorChannel and send its plan."""
        async with self._call(
            "CoordinatorChannel",
            Cardinality.STREAM_STREAM,
            CoordinatorToWorkerMsg,
            WorkerToCoordinatorMsg,
            headers,
            path=SERVICE,
        ) as stream:
            await stream.send_message(CoordinatorToWorkerMsg(set_plan_request=set_plan))
            channel = TaskChannel(stream)
            try:
                yield channel
            finally:
                with anyio.CancelScope(shield=True):
                    await channel.done_sending()

    @asynccontextmanager
    async def execute_task(
        self, request: ExecuteTaskRequest, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[FlightDataReader]:
        """Run a partition range of a task; read (batch, app_metadata) from the reader."""
        async with self._call(
            "ExecuteTask",
            Cardinality.UNARY_STREAM,
            ExecuteTaskRequest,
            RawBytes,
            headers,
            path=SERVICE,
        ) as stream:
            await stream.send_message(request, end=True)
            reader = FlightDataReader(
                stream._stream,
                self.max_message_size,
                before_first_read=stream.recv_initial_metadata,
                guard=stream._wrapper,
                at_end=status_checker(stream),
                translate=partial(call_error, stream),
            )
            yield reader
            await cancel_if_unfinished(stream, reader)
