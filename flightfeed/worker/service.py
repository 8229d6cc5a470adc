"""flightfeed.v1.WorkerService over gRPC, sharing the Flight server's port: each RPC adapts
its grpclib stream to the transport-neutral handlers (endpoint.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import grpclib.const
import grpclib.server
from grpclib.const import Cardinality
from grpclib.exceptions import StreamTerminatedError
from h2.exceptions import StreamClosedError

from .._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    GetWorkerInfoRequest,
    GetWorkerInfoResponse,
    WorkerToCoordinatorMsg,
)
from ..concurrency import closing, off_loop, one_at_a_time
from ..errors import Cancelled
from ..flight.errors import ErrorMapping
from ..flight.grpc import RawBytes, parse_message
from ..flight.server import (
    CallContext,
    call_writer,
    receive_messages,
    receive_request,
    rpc_boundary,
)
from ..protocol.channel_wire import encode_worker_message
from ..session import Headers
from .endpoint import WorkerHandlers
from .rpc.flight_sink import FlightSink

SERVICE: Final = "/flightfeed.v1.WorkerService/"


def request_headers(ctx: CallContext) -> Headers:
    """The call's text headers for the session builder (binary `-bin` values are skipped)."""
    return Headers(ctx.text_headers())


class WorkerService:
    """Routes WorkerService RPCs to the worker's handlers."""

    def __init__(
        self, handlers: WorkerHandlers, errors: ErrorMapping, max_message_size: int
    ) -> None:
        self.handlers = handlers
        self.errors = errors
        self.max_message_size = max_message_size

    def _parse_control(self, raw: bytes) -> CoordinatorToWorkerMsg:
        return parse_message(raw, CoordinatorToWorkerMsg, self.max_message_size)

    async def _coordinator_channel(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        async def inbound() -> AsyncIterator[CoordinatorToWorkerMsg]:
            # Received raw and parsed here: a large SetPlan or batch of units is parsed on a
            # worker thread, so the event loop keeps serving every other call meanwhile.
            async for raw in receive_messages(stream, RawBytes, self.max_message_size):
                yield await off_loop(self._parse_control, raw, nbytes=len(raw))

        async def send(message: WorkerToCoordinatorMsg) -> None:
            try:
                await stream.send_message(encode_worker_message(message))
            except (StreamClosedError, StreamTerminatedError):  # before grpclib cancels us
                raise Cancelled("the coordinator closed the task's channel") from None

        # Credits, partitions read and the metrics report are sent by separate tasks.
        async with closing(inbound()) as messages:  # (a CancelTask ends the reading early)
            await self.handlers.coordinator_channel(
                request_headers(ctx), messages, one_at_a_time(send), stream.send_initial_metadata
            )

    async def _execute_task(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        request = await receive_request(stream, ExecuteTaskRequest, self.max_message_size)
        sink = FlightSink(call_writer(stream))
        await self.handlers.execute_task(request_headers(ctx), request, sink)

    async def _get_worker_info(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        await receive_request(stream, GetWorkerInfoRequest, self.max_message_size)
        await stream.send_message(self.handlers.worker_info())

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            SERVICE + "CoordinatorChannel": grpclib.const.Handler(
                rpc_boundary(self._coordinator_channel, self.errors),
                Cardinality.STREAM_STREAM,
                RawBytes,
                RawBytes,  # encoded by `send` (credits by hand: channel_wire)
            ),
            SERVICE + "ExecuteTask": grpclib.const.Handler(
                rpc_boundary(self._execute_task, self.errors),
                Cardinality.UNARY_STREAM,
                ExecuteTaskRequest,
                RawBytes,
            ),
            SERVICE + "GetWorkerInfo": grpclib.const.Handler(
                rpc_boundary(self._get_worker_info, self.errors),
                Cardinality.UNARY_UNARY,
                GetWorkerInfoRequest,
                GetWorkerInfoResponse,
            ),
        }
