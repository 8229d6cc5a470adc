"""The gRPC WorkerChannel: a Flight client that also speaks the WorkerService.

Every task channel and ExecuteTask of every query to a worker shares one `WorkerClient`: one
HTTP/2 connection, and more from its pool (flight/pool.py) while more calls are open at once
than the worker's stream limit allows on one. Failures arrive as the worker raised
them (TYPED_ERRORS), or as RemoteError naming the worker when the connection is the problem.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, Final

import anyio
import anyio.lowlevel
import grpclib.client
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.exceptions import StreamClosedError

from .._generated.flightfeed.v1 import (
    CancelTask,
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoRequest,
    GetWorkerInfoResponse,
    ReleaseTask,
    SetPlanRequest,
    WorkUnitBatch,
)
from ..concurrency import off_loop
from ..errors import FlightfeedError
from ..flight.client import (
    FlightClient,
    Metadata,
    call_error,
    call_reader,
    cancel_if_unfinished,
    forget_wakeup_cancel,
    status_checker,
)
from ..flight.codec import grpc_message
from ..flight.errors import ErrorMapping
from ..flight.grpc import RawBytes
from ..flight.internals import (
    call_wrapper,
    mark_request_ended,
    raw_stream,
    request_ended,
    request_sent,
)
from ..flight.keepalive import KeepalivePolicy
from ..flight.streams import FlightDataReader
from ..flight.tls import ClientTls
from ..flight.wakeup import cancel_baseline
from ..flight.wire import DEFAULT_MAX_MESSAGE_SIZE, send_encoded
from ..protoencode import encode_message
from .channel import ChannelClosed, MetricsWaiter
from .channel_wire import WorkerMessage, decode_worker_message
from .errors import TYPED_ERRORS

log = logging.getLogger(__name__)

SERVICE = "/flightfeed.v1.WorkerService/"
HALF_CLOSE_TIMEOUT: Final = 5.0
"""How long a half-close may wait on a worker that stopped reading."""
CANCEL_SEND_TIMEOUT: Final = 1.0
"""How long a CancelTask may take to send before the channel is just reset."""


REFERENCE_UNIT_OVERHEAD: Final = 64
"""Bytes a WorkUnit message of the reference form counts for beyond its body, in deciding to
encode a batch off the loop: its fields and betterproto's per-message work."""


class GrpcTaskChannel(MetricsWaiter):
    """The caller's end of one task's CoordinatorChannel over gRPC."""

    def __init__(
        self,
        stream: grpclib.client.Stream[Any, Any],
        errors: ErrorMapping,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        url: str = "the worker",
    ) -> None:
        self._stream = stream  # its messages arrive as RawBytes: decoded in messages()
        self._url = url
        self._errors = errors
        self._max_message_size = max_message_size
        self._closed = False
        self._interrupted = False
        self._sending = anyio.Lock(fast_acquire=True)

    async def send_work_units(self, batch: WorkUnitBatch) -> None:
        if batch.packed is not None:
            size = len(batch.packed.bodies)
        else:  # the reference form: a message per unit, each costing more than its bytes
            size = sum(len(unit.body) + REFERENCE_UNIT_OVERHEAD for unit in batch.batch)
        await self._send(CoordinatorToWorkerMsg(work_unit_batch=batch), size)

    async def _send(self, message: CoordinatorToWorkerMsg, size_hint: int = 0) -> None:
        async with self._sending:  # the dispatcher's batches and a release may overlap
            if self._closed:  # (a DATA frame after END_STREAM fails the whole connection)
                raise ChannelClosed(f"the task channel to {self._url} is closed")
            await self._write(message, size_hint)

    async def _write(self, message: CoordinatorToWorkerMsg, size_hint: int = 0) -> None:
        payload = await encoded_control(message, size_hint)
        # A write cut short (cancelled) may leave half a message on the stream, after which it
        # must not carry another one, not even a CancelTask or its END_STREAM.
        self._interrupted = True
        await send_encoded_control(self._stream, payload)
        self._interrupted = False

    async def release(self) -> None:
        if self._closed:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_SEND_TIMEOUT):
            async with self._sending:  # after a batch being sent, if any
                if self._interrupted:
                    return  # the channel can carry nothing more: the idle TTL ends the task
                try:
                    await self._write(CoordinatorToWorkerMsg(release_task=ReleaseTask()))
                except Exception as exc:  # a channel that is gone has nothing to release
                    log.debug("ReleaseTask not sent (%s)", exc)

    async def cancel(self, reason: str) -> None:
        if self._interrupted or self._closed:
            return  # leaving the call resets the stream: the worker drops the task anyway
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_SEND_TIMEOUT):
            try:
                await self._send(CoordinatorToWorkerMsg(cancel_task=CancelTask(reason=reason)))
            except Exception as exc:  # a channel that is gone has nothing left to cancel
                log.debug("CancelTask not sent (%s): the stream reset will do", exc)

    async def done_sending(self) -> None:
        if self._closed:
            return
        self._closed = True  # (a send that waits for the lock now finds the channel closed)
        # Bounded: a worker that stopped reading must not hold the caller forever, neither
        # behind a message being sent nor in the half-close.
        with anyio.move_on_after(HALF_CLOSE_TIMEOUT):
            async with self._sending:  # END_STREAM goes after the message being sent, if any
                if self._interrupted or request_ended(self._stream):
                    return  # half a message is out (leaving the call resets the stream), or
                    # the worker ended the call first and its status was read
                if not raw_stream(self._stream).closable:
                    mark_request_ended(self._stream)  # the worker closed the call already
                    return
                with suppress(StreamClosedError, StreamTerminatedError):
                    await self._stream.end()

    async def messages(self) -> AsyncIterator[WorkerMessage]:
        task, baseline = cancel_baseline()
        try:
            async for raw in self._stream:
                yield decode_worker_message(raw, self._max_message_size)
                # (a worker sending fast never parks this task on a pending future, and anyio
                # delivers a cancellation only to a parked one: flight.client.received)
                await anyio.lowlevel.checkpoint_if_cancelled()
            await status_checker(self._stream, self._errors)()
        except (GRPCError, StreamTerminatedError) as exc:
            forget_wakeup_cancel(self._stream, task, baseline)
            raise call_error(self._stream, exc, self._errors) from None


async def send_control(
    stream: grpclib.client.Stream[Any, Any], message: CoordinatorToWorkerMsg, size_hint: int
) -> None:
    """Send a control message without blocking the event loop on a large one: it is encoded
    on a worker thread (a SetPlan may carry a big in-memory table) and written zero-copy, as
    FlightData is, instead of being copied into frames by grpclib and h2."""
    await send_encoded_control(stream, await encoded_control(message, size_hint))


async def encoded_control(message: CoordinatorToWorkerMsg, size_hint: int) -> bytes:
    return await off_loop(encode_message, message, nbytes=size_hint)


async def send_encoded_control(stream: grpclib.client.Stream[Any, Any], payload: bytes) -> None:
    if not request_sent(stream):
        await stream.send_request()
    with call_wrapper(stream):
        await send_encoded(raw_stream(stream), grpc_message([payload], len(payload)))


class WorkerClient(FlightClient):
    """A worker over gRPC: Flight plus the WorkerService. Implements WorkerChannel."""

    def __init__(
        self,
        location: str,
        *,
        metadata: Metadata | None = None,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        timeout: float | None = None,
        keepalive: KeepalivePolicy | None = None,
        errors: ErrorMapping = TYPED_ERRORS,
        tls: ClientTls | None = None,
    ) -> None:
        super().__init__(
            location,
            metadata=metadata,
            max_message_size=max_message_size,
            timeout=timeout,
            keepalive=keepalive,
            errors=errors,
            tls=tls,
        )

    @property
    def url(self) -> str:
        return self.location

    async def worker_info(self) -> GetWorkerInfoResponse:
        async with self._call(
            "GetWorkerInfo",
            Cardinality.UNARY_UNARY,
            GetWorkerInfoRequest,
            GetWorkerInfoResponse,
            None,
            path=SERVICE,
        ) as stream:
            await stream.send_message(GetWorkerInfoRequest(), end=True)
            reply: GetWorkerInfoResponse | None = await stream.recv_message()
        if reply is None:
            raise FlightfeedError(f"{self.location}: GetWorkerInfo sent no reply")
        return reply

    @asynccontextmanager
    async def open_task(
        self, set_plan: SetPlanRequest, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[GrpcTaskChannel]:
        async with self._call(
            "CoordinatorChannel",
            Cardinality.STREAM_STREAM,
            RawBytes,  # control messages are encoded by send_control
            RawBytes,  # worker messages are decoded by the channel (channel_wire)
            headers,
            path=SERVICE,
        ) as stream:
            message = CoordinatorToWorkerMsg(set_plan_request=set_plan)
            await send_control(stream, message, len(set_plan.plan_proto))
            channel = GrpcTaskChannel(stream, self.errors, self.max_message_size, self.location)
            try:
                yield channel
            finally:
                with anyio.CancelScope(shield=True):
                    await channel.done_sending()

    @asynccontextmanager
    async def execute_task(
        self, request: ExecuteTaskRequest, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[FlightDataReader]:
        """Run a partition range of a task; the reader yields its batches (each batch's
        FlightAppMetadata names its partition, see `reader.with_metadata()`)."""
        async with self._call(
            "ExecuteTask",
            Cardinality.UNARY_STREAM,
            ExecuteTaskRequest,
            RawBytes,
            headers,
            path=SERVICE,
        ) as stream:
            await stream.send_message(request, end=True)
            reader = call_reader(stream, self.max_message_size, self.errors)
            yield reader
            await cancel_if_unfinished(stream, reader)
