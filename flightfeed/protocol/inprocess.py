"""The in-process WorkerChannel: a worker of this process called directly, no serialization.

A worker started with `in_process=True` registers its endpoint under an `inproc://<name>`
location instead of listening on a port. A channel to that location runs the worker's own
handlers in the caller's task group and passes messages, record batches and errors to them as
objects, through bounded memory streams (the in-process counterpart of HTTP/2 flow control).
The plan still travels encoded, as on the network: the worker decodes it into its own nodes
and remote feed handles, so the same code paths run. For tests about logic, not transport.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Final

import anyio
import pyarrow as pa
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from anyio.streams.memory import MemoryObjectSendStream
from grpclib.const import Status

from .._generated.flightfeed.v1 import (
    CancelTask,
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
    ReleaseTask,
    SetPlanRequest,
    WorkerToCoordinatorMsg,
    WorkUnitBatch,
)
from ..errors import Cancelled, FlightfeedError, InvalidArgument, RemoteError, as_flightfeed_error
from .channel import ChannelClosed, Headers, MetricsWaiter, WorkerEndpoint
from .channel_wire import WorkerMessage

SCHEME: Final = "inproc://"
CONTROL_BUFFER: Final = 16
"""Control messages in flight each way on one in-process task channel."""
BATCH_BUFFER: Final = 2
"""Record batches in flight on one in-process ExecuteTask."""

_ENDPOINTS: dict[str, WorkerEndpoint] = {}


def register(endpoint: WorkerEndpoint) -> str:
    """Make a worker's endpoint reachable from this process; returns its new location."""
    location = f"{SCHEME}{uuid.uuid4().hex[:16]}"
    _ENDPOINTS[location] = endpoint
    return location


def unregister(location: str) -> None:
    _ENDPOINTS.pop(location, None)


def _endpoint(location: str) -> WorkerEndpoint:
    found = _ENDPOINTS.get(location)
    if found is None:
        raise RemoteError(
            f"no in-process worker at {location} (it stopped, or runs in another process)",
            grpc_status=Status.UNAVAILABLE,
        )
    return found


class _Failure:
    """An error of the worker's handler, travelling to the caller in order."""

    __slots__ = ("error",)

    def __init__(self, error: FlightfeedError) -> None:
        self.error = error


class InProcessTaskChannel(MetricsWaiter):
    """The caller's end of a task channel to an in-process worker."""

    def __init__(
        self,
        inbound: MemoryObjectSendStream[CoordinatorToWorkerMsg],
        outbound: ObjectReceiveStream[WorkerToCoordinatorMsg | _Failure],
        url: str,
    ) -> None:
        self._inbound = inbound
        self._outbound = outbound
        self._url = url

    async def send_work_units(self, batch: WorkUnitBatch) -> None:
        try:
            await self._inbound.send(CoordinatorToWorkerMsg(work_unit_batch=batch))
        except anyio.ClosedResourceError:  # (closed by done_sending)
            raise ChannelClosed(f"the task channel to {self._url} is closed") from None
        except anyio.BrokenResourceError:
            raise Cancelled(f"the task channel to {self._url} is closed") from None

    async def release(self) -> None:
        with suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._inbound.send_nowait(CoordinatorToWorkerMsg(release_task=ReleaseTask()))

    async def cancel(self, reason: str) -> None:
        message = CoordinatorToWorkerMsg(cancel_task=CancelTask(reason=reason))
        # Full or gone: leaving the channel cancels the worker's handler anyway.
        with suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._inbound.send_nowait(message)

    async def done_sending(self) -> None:
        await self._inbound.aclose()

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        async for item in self._outbound:
            if isinstance(item, _Failure):
                raise item.error
            yield item


class _Batches:
    """An ExecuteTask's batches as the caller reads them; the handler's error is raised."""

    def __init__(self, receive: ObjectReceiveStream[pa.RecordBatch | _Failure]) -> None:
        self._receive = receive

    def __aiter__(self) -> _Batches:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        """Not a generator: a read left early leaves nothing for the garbage collector."""
        try:
            item = await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
        if isinstance(item, _Failure):
            raise item.error
        return item


class _MemorySink:
    """PartitionSink into a memory stream: the batches themselves, no copy."""

    def __init__(self, send: ObjectSendStream[pa.RecordBatch | _Failure]) -> None:
        self._send = send

    async def begin(self, schema: pa.Schema) -> None:
        return None

    async def write(self, partition: int, batch: pa.RecordBatch) -> None:
        await self._send.send(batch)


async def _deliver_failure(
    send: ObjectSendStream[WorkerToCoordinatorMsg | _Failure]
    | ObjectSendStream[pa.RecordBatch | _Failure],
    exc: Exception,
) -> None:
    failure = _Failure(as_flightfeed_error(exc))
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # the caller left
        await send.send(failure)


class InProcessWorkerChannel:
    """A WorkerChannel to a worker registered in this process under an inproc:// location."""

    def __init__(
        self,
        url: str,
        *,
        metadata: Mapping[str, str | bytes] | None = None,
        endpoint: WorkerEndpoint | None = None,
    ) -> None:
        """`endpoint`: call these handlers directly, whatever `url` is (a worker reading a
        task it hosts itself); without it, `url` must be a registered inproc:// location."""
        if endpoint is None and not url.startswith(SCHEME):
            raise InvalidArgument(f"not an in-process worker location: {url!r}")
        self._url = url
        self._endpoint = endpoint
        # Headers reach a session builder as text (binary `-bin` values are not passed on).
        self._metadata = {k: v for k, v in (metadata or {}).items() if isinstance(v, str)}

    @property
    def url(self) -> str:
        return self._url

    def _target(self) -> WorkerEndpoint:
        return self._endpoint if self._endpoint is not None else _endpoint(self._url)

    def _headers(self, headers: Headers | None) -> Headers:
        return {**self._metadata, **(headers or {})}

    async def worker_info(self) -> GetWorkerInfoResponse:
        return self._target().worker_info()

    @asynccontextmanager
    async def open_task(
        self, set_plan: SetPlanRequest, *, headers: Headers | None = None
    ) -> AsyncIterator[InProcessTaskChannel]:
        endpoint = self._target()
        to_worker, inbound = anyio.create_memory_object_stream[CoordinatorToWorkerMsg](
            CONTROL_BUFFER
        )
        outbound, from_worker = anyio.create_memory_object_stream[
            WorkerToCoordinatorMsg | _Failure
        ](CONTROL_BUFFER)

        async def serve() -> None:
            async with inbound, outbound:
                try:
                    await endpoint.coordinator_channel(
                        self._headers(headers), inbound.__aiter__(), outbound.send, _accepted
                    )
                except Exception as exc:
                    await _deliver_failure(outbound, exc)

        failure: BaseException | None = None
        async with to_worker, from_worker, anyio.create_task_group() as tg:
            await to_worker.send(CoordinatorToWorkerMsg(set_plan_request=set_plan))
            tg.start_soon(serve, name=f"in-process task channel to {self._url}")
            try:
                yield InProcessTaskChannel(to_worker, from_worker, self._url)
            except (Exception, GeneratorExit) as exc:  # the caller's, raised as is: not grouped
                failure = exc
            finally:
                tg.cancel_scope.cancel()  # as a reset stream: the worker drops the task
        if failure is not None:
            raise failure

    @asynccontextmanager
    async def execute_task(
        self, request: ExecuteTaskRequest, *, headers: Headers | None = None
    ) -> AsyncIterator[_Batches]:
        endpoint = self._target()
        send, receive = anyio.create_memory_object_stream[pa.RecordBatch | _Failure](BATCH_BUFFER)

        async def serve() -> None:
            async with send:
                try:
                    await endpoint.execute_task(self._headers(headers), request, _MemorySink(send))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the reader left
                except Exception as exc:
                    await _deliver_failure(send, exc)

        failure: BaseException | None = None
        async with receive, anyio.create_task_group() as tg:
            tg.start_soon(serve, name=f"in-process ExecuteTask on {self._url}")
            try:
                yield _Batches(receive)
            except (Exception, GeneratorExit) as exc:
                # the caller's own error, or its generator closed early (a limit that has its
                # rows): raised as is, not grouped (a group would escape the caller's handlers)
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def close(self) -> None:
        return None


async def _accepted() -> None:
    """Nothing to flush in memory (over gRPC: the response headers)."""
