"""HoraeDB's `remote_engine.RemoteEngineService` (seed 003) on the worker's port: each RPC
adapts its grpclib stream to the module under `rpc/` that implements it.

Requests are received raw and parsed strictly (flight.server.receive_request); a malformed
or oversized message is a gRPC status, everything about a request's content an error in its
response's header.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Final

import grpclib.const
import grpclib.server
from grpclib.const import Cardinality

from .._generated.remote_engine import (
    AlterTableOptionsRequest,
    AlterTableOptionsResponse,
    AlterTableSchemaRequest,
    AlterTableSchemaResponse,
    ExecutePlanRequest,
    GetTableInfoRequest,
    GetTableInfoResponse,
    ReadRequest,
    WriteBatchRequest,
    WriteRequest,
    WriteResponse,
)
from ..errors import Unimplemented
from ..flight.codec import EncodedMessage
from ..flight.errors import ErrorMapping
from ..flight.grpc import RawBytes
from ..flight.internals import raw_stream
from ..flight.server import CallContext, receive_request, rpc_boundary
from ..flight.wire import send_encoded
from ..plan.memory import MemoryPool
from ..session import Headers, Session
from .engine import TableEngine
from .payload import CompressionMode, Compressor
from .priority import PriorityGate
from .rpc.alter_table import alter_table_options, alter_table_schema
from .rpc.execute_plan import serve_execute_plan
from .rpc.read import serve_read
from .rpc.table_info import get_table_info
from .rpc.write import write

SERVICE: Final = "/remote_engine.RemoteEngineService/"


@dataclass(frozen=True)
class PlanRuntime:
    """What ExecutePhysicalPlan needs from its worker: the caller's session (built from the
    request's headers by the worker's session builder), the memory pool plans reserve from,
    and the gate that orders them by priority."""

    session: Callable[[Headers], Awaitable[Session]]
    memory: MemoryPool
    gate: PriorityGate


class RemoteEngineService:
    """Routes RemoteEngineService RPCs to a worker's tables."""

    def __init__(
        self,
        engine: Callable[[], TableEngine],
        errors: ErrorMapping,
        max_message_size: int,
        *,
        compression: CompressionMode = "auto",
        max_decoded_bytes: int | None = None,
        plans: PlanRuntime | None = None,
        calls: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.engine = engine
        """The worker's tables, looked up per call: it opens them after building its services,
        and one without a data directory refuses every call (UNIMPLEMENTED)."""
        self.calls = calls
        """Held around each call (the worker counts them: a graceful stop lets them end)."""
        self.errors = errors
        self.max_message_size = max_message_size
        self.compression: CompressionMode = compression
        self.max_decoded_bytes = max_decoded_bytes or 4 * max_message_size
        """What one Write or WriteBatch may decode to, all its payload elements together."""
        self.plans = plans

    async def _read(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        request = await receive_request(stream, ReadRequest, self.max_message_size)
        engine = self.engine()
        await stream.send_initial_metadata()
        h2 = raw_stream(stream)

        async def send(message: EncodedMessage) -> None:
            await send_encoded(h2, message)

        await serve_read(engine, request, send, Compressor(self.compression))

    async def _write(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        request = await receive_request(stream, WriteRequest, self.max_message_size)
        await stream.send_message(await write(self.engine(), [request], self.max_decoded_bytes))

    async def _write_batch(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        request = await receive_request(stream, WriteBatchRequest, self.max_message_size)
        await stream.send_message(await write(self.engine(), request.batch, self.max_decoded_bytes))

    async def _get_table_info(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        request = await receive_request(stream, GetTableInfoRequest, self.max_message_size)
        await stream.send_message(get_table_info(self.engine(), request))

    async def _alter_table_schema(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        request = await receive_request(stream, AlterTableSchemaRequest, self.max_message_size)
        await stream.send_message(await alter_table_schema(self.engine(), request))

    async def _alter_table_options(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        request = await receive_request(stream, AlterTableOptionsRequest, self.max_message_size)
        await stream.send_message(await alter_table_options(self.engine(), request))

    async def _execute_physical_plan(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        request = await receive_request(stream, ExecutePlanRequest, self.max_message_size)
        engine = self.engine()
        plans = self.plans
        if plans is None:
            raise Unimplemented("ExecutePhysicalPlan is not served here: no plan runtime")
        await stream.send_initial_metadata()
        h2 = raw_stream(stream)

        async def send(message: EncodedMessage) -> None:
            await send_encoded(h2, message)

        headers = Headers(ctx.text_headers())
        outcome = await serve_execute_plan(
            engine,
            request,
            lambda: plans.session(headers),
            send,
            gate=plans.gate,
            memory=plans.memory,
            compressor=Compressor(self.compression),
        )
        if outcome.trailers:
            await stream.send_trailing_metadata(metadata=dict(outcome.trailers))

    def _handler(
        self, body: Any, cardinality: Cardinality, request: type, reply: type
    ) -> grpclib.const.Handler:
        async def counted(stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
            with self.calls():
                await body(stream, ctx)

        return grpclib.const.Handler(
            rpc_boundary(counted, self.errors), cardinality, request, reply
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        unary, stream = Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM
        return {
            SERVICE + "Read": self._handler(self._read, stream, ReadRequest, RawBytes),
            SERVICE + "Write": self._handler(self._write, unary, WriteRequest, WriteResponse),
            SERVICE + "WriteBatch": self._handler(
                self._write_batch, unary, WriteBatchRequest, WriteResponse
            ),
            SERVICE + "ExecutePhysicalPlan": self._handler(
                self._execute_physical_plan, stream, ExecutePlanRequest, RawBytes
            ),
            SERVICE + "GetTableInfo": self._handler(
                self._get_table_info, unary, GetTableInfoRequest, GetTableInfoResponse
            ),
            SERVICE + "AlterTableSchema": self._handler(
                self._alter_table_schema, unary, AlterTableSchemaRequest, AlterTableSchemaResponse
            ),
            SERVICE + "AlterTableOptions": self._handler(
                self._alter_table_options,
                unary,
                AlterTableOptionsRequest,
                AlterTableOptionsResponse,
            ),
        }


__all__ = ["SERVICE", "RemoteEngineService"]
