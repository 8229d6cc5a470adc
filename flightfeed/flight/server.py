"""An asyncio Flight server on grpclib: override the RPCs you serve in a FlightHandler.

Every FlightService RPC maps to one handler method; what a handler does not override answers
UNIMPLEMENTED. Data RPCs get a `FlightDataWriter`/`FlightDataReader` on the raw stream, so
record batches go out zero-copy. Other grpclib services (such as the WorkerService) can share
the port. Exceptions become a precise gRPC status through the server's ErrorMapping (errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar

import anyio
import grpclib.const
import grpclib.server
import pyarrow as pa
from grpclib.const import Cardinality, Status
from grpclib.metadata import Deadline

from .._generated.arrow.flight.protocol import (
    Action,
    ActionType,
    Criteria,
    Empty,
    FlightDescriptor,
    FlightInfo,
    HandshakeRequest,
    HandshakeResponse,
    PollInfo,
    PutResult,
    Result,
    SchemaResult,
    Ticket,
)
from ..concurrency import closing, off_loop, require_asyncio
from ..errors import FlightfeedError, InvalidArgument, Unauthenticated, Unimplemented
from .auth import AUTHORIZATION, REFUSED, Authenticator, bearer, handshake_token
from .call_count import CallCount
from .codec import DEFAULT_MAX_DECODED_SIZE
from .connection_limits import ConnectionLimits
from .errors import PLAIN_ERRORS, ErrorMapping, StatusReply, header_safe
from .grpc import GrpcServer, RawBytes, parse_message
from .internals import can_send_status, method_name, raw_stream
from .keepalive import KeepalivePolicy
from .listen import listening_socket, local_address
from .log_limit import RateLimitedLogger
from .schema import schema_to_ipc
from .streams import FlightDataReader, FlightDataWriter
from .tls import TLS_SCHEME, ServerTls
from .wire import DEFAULT_MAX_MESSAGE_SIZE, recv_raw

log = logging.getLogger(__name__)
limited_log = RateLimitedLogger(log)
M = TypeVar("M")
SERVICE = "/arrow.flight.protocol.FlightService/"


@dataclass(frozen=True)
class CallContext:
    """What a handler knows about the call: method, request headers, peer, deadline."""

    method: str
    headers: Mapping[str, Any]
    peer: tuple[str, int] | None
    deadline: Deadline | None

    def header(self, name: str, default: str | None = None) -> str | None:
        value = self.headers.get(name.lower())
        if value is None:
            return default
        return value if isinstance(value, str) else bytes(value).decode("latin-1")

    def text_headers(self) -> list[tuple[str, str]]:
        """The call's text headers, repeats kept (binary `-bin` values are skipped)."""
        items = self.headers.items() if hasattr(self.headers, "items") else ()
        return [(k, v) for k, v in items if isinstance(v, str)]

    @classmethod
    def of(cls, stream: grpclib.server.Stream[Any, Any]) -> CallContext:
        return cls(
            method=method_name(stream),
            headers=stream.metadata or {},
            peer=stream.peer.addr(),
            deadline=stream.deadline,
        )


class PutResultWriter:
    """Sends PutResult messages back to a DoPut client."""

    def __init__(self, stream: grpclib.server.Stream[Any, Any]) -> None:
        self._stream = stream

    async def write(self, app_metadata: bytes) -> None:
        await self._stream.send_message(PutResult(app_metadata=app_metadata))


class FlightHandler:
    """Base class of a Flight service's behaviour. Override what you serve."""

    async def handshake(
        self, ctx: CallContext, requests: AsyncIterator[HandshakeRequest]
    ) -> AsyncIterator[HandshakeResponse]:
        raise Unimplemented("Handshake is not implemented by this server")
        yield  # pragma: no cover - marks this as an async generator

    async def list_flights(self, ctx: CallContext, criteria: bytes) -> AsyncIterator[FlightInfo]:
        raise Unimplemented("ListFlights is not implemented by this server")
        yield  # pragma: no cover

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        raise Unimplemented("GetFlightInfo is not implemented by this server")

    async def poll_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> PollInfo:
        """Default: the query is complete as soon as GetFlightInfo answers."""
        return PollInfo(info=await self.get_flight_info(ctx, descriptor), progress=1.0)

    async def get_schema(self, ctx: CallContext, descriptor: FlightDescriptor) -> pa.Schema:
        raise Unimplemented("GetSchema is not implemented by this server")

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        raise Unimplemented("DoGet is not implemented by this server")

    async def do_put(
        self, ctx: CallContext, reader: FlightDataReader, results: PutResultWriter
    ) -> None:
        raise Unimplemented("DoPut is not implemented by this server")

    async def do_exchange(
        self, ctx: CallContext, reader: FlightDataReader, writer: FlightDataWriter
    ) -> None:
        """Return only once the client has finished sending (`reader` at its end): a pyarrow
        client still sending when the call ended was seen to lose the messages it had not read
        yet (branch spike/shared-memory-read, test_a_slow_reader_gets_every_batch). A protocol
        whose client sends until the end needs an end marker of its own, then a bounded wait
        for the client's half-close."""
        raise Unimplemented("DoExchange is not implemented by this server")

    async def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        raise Unimplemented(f"unknown action type {action.type!r}")
        yield  # pragma: no cover

    async def list_actions(self, ctx: CallContext) -> Sequence[ActionType]:
        return ()


Body = Callable[[grpclib.server.Stream[Any, Any], CallContext], Awaitable[None]]


async def receive_message(
    stream: grpclib.server.Stream[Any, Any], message_type: type, max_message_size: int
) -> Any:
    """The next request message of a call, or None at the end of the requests. Its size is
    checked on its 5-byte gRPC prefix, before any of its body is buffered (grpclib's own
    receive believes the prefix and buffers up to 4 GiB first); RawBytes messages come as they
    are, others are parsed strictly, a large one on a worker thread (a write of 256k HoraeDB
    rows, 16 MB, took 250 ms to parse: the loop's other calls would have waited for it)."""
    try:
        data = await recv_raw(raw_stream(stream), max_message_size)
        if data is None or message_type is RawBytes:
            return data
        parse = partial(parse_message, message_type=message_type, max_message_size=max_message_size)
        return await off_loop(parse, data, nbytes=len(data))
    except InvalidArgument as exc:
        raise InvalidArgument(f"malformed request message: {exc.message}") from None
    except FlightfeedError:
        raise
    except Exception as exc:  # betterproto2's own complaints about a value
        raise InvalidArgument(f"malformed request message: {exc}") from None


async def receive_messages(
    stream: grpclib.server.Stream[Any, Any], message_type: type, max_message_size: int
) -> AsyncIterator[Any]:
    """Every request message of a streaming call (see receive_message)."""
    while (message := await receive_message(stream, message_type, max_message_size)) is not None:
        yield message


async def receive_request(
    stream: grpclib.server.Stream[Any, Any], message_type: type, max_message_size: int
) -> Any:
    """The single request message of a unary-request RPC, with a clear error if malformed."""
    request = await receive_message(stream, message_type, max_message_size)
    if request is None:
        raise InvalidArgument("request message missing")
    return request


def call_writer(stream: grpclib.server.Stream[Any, Any]) -> FlightDataWriter:
    """A writer of FlightData onto a server call (its response headers go with the first)."""
    return FlightDataWriter(raw_stream(stream), before_first_write=stream.send_initial_metadata)


_SERVER_FAULTS: Final = frozenset({Status.INTERNAL, Status.UNKNOWN, Status.DATA_LOSS})


def _log_failure(ctx: CallContext, reply: StatusReply, exc: BaseException) -> None:
    """One line per failed call, rate-limited by method and status: a caller's mistake in a
    line, a failure on our side (INTERNAL: a bug, a UDF that raised) with its traceback, a
    cancelled call at DEBUG only (callers cancel all the time)."""
    level, trace = logging.INFO, None
    if reply.status is Status.CANCELLED:
        level = logging.DEBUG
    elif reply.status in _SERVER_FAULTS:
        level, trace = logging.WARNING, exc
    peer = f"{ctx.peer[0]}:{ctx.peer[1]}" if ctx.peer else "an unknown peer"
    limited_log.log(
        (ctx.method, reply.status),
        level,
        "%s from %s failed: %s: %s",
        ctx.method,
        peer,
        reply.status.name,
        reply.message,
        exc_info=trace,
    )


async def _reply_error(
    stream: grpclib.server.Stream[Any, Any],
    ctx: CallContext,
    exc: BaseException,
    errors: ErrorMapping,
) -> None:
    reply = errors.reply(exc)
    _log_failure(ctx, reply, exc)
    if not can_send_status(stream):
        return
    await stream.send_trailing_metadata(
        status=reply.status,
        status_message=header_safe(reply.message),
        metadata=dict(reply.trailers),
    )


def rpc_boundary(
    body: Body, errors: ErrorMapping = PLAIN_ERRORS
) -> Callable[[grpclib.server.Stream[Any, Any]], Awaitable[None]]:
    """Wrap an RPC body so every exception leaves as a gRPC status (see errors.py)."""

    async def rpc(stream: grpclib.server.Stream[Any, Any]) -> None:
        ctx = CallContext.of(stream)
        try:
            await body(stream, ctx)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            await _reply_error(stream, ctx, exc, errors)

    return rpc


class FlightService:
    """grpclib service object exposing a FlightHandler as arrow.flight.protocol.FlightService."""

    def __init__(
        self,
        handler: FlightHandler,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        errors: ErrorMapping = PLAIN_ERRORS,
        max_decoded_size: int | None = DEFAULT_MAX_DECODED_SIZE,
        auth: Authenticator | None = None,
    ) -> None:
        """With `auth`, Handshake checks the credentials a client sends (auth.py); without,
        it is the handler's."""
        self.handler = handler
        self.max_message_size = max_message_size
        self.max_decoded_size = max_decoded_size
        self.errors = errors
        self.auth = auth

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        rpcs: list[tuple[str, Body, Cardinality, type, type]] = [
            (
                "Handshake",
                self._handshake,
                Cardinality.STREAM_STREAM,
                HandshakeRequest,
                HandshakeResponse,
            ),
            ("ListFlights", self._list_flights, Cardinality.UNARY_STREAM, Criteria, FlightInfo),
            (
                "GetFlightInfo",
                self._get_flight_info,
                Cardinality.UNARY_UNARY,
                FlightDescriptor,
                FlightInfo,
            ),
            (
                "PollFlightInfo",
                self._poll_flight_info,
                Cardinality.UNARY_UNARY,
                FlightDescriptor,
                PollInfo,
            ),
            (
                "GetSchema",
                self._get_schema,
                Cardinality.UNARY_UNARY,
                FlightDescriptor,
                SchemaResult,
            ),
            ("DoGet", self._do_get, Cardinality.UNARY_STREAM, Ticket, RawBytes),
            ("DoPut", self._do_put, Cardinality.STREAM_STREAM, RawBytes, PutResult),
            ("DoExchange", self._do_exchange, Cardinality.STREAM_STREAM, RawBytes, RawBytes),
            ("DoAction", self._do_action, Cardinality.UNARY_STREAM, Action, Result),
            ("ListActions", self._list_actions, Cardinality.UNARY_STREAM, Empty, ActionType),
        ]
        return {
            SERVICE + name: grpclib.const.Handler(
                rpc_boundary(body, self.errors), cardinality, req, rep
            )
            for name, body, cardinality, req, rep in rpcs
        }

    async def _handshake(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        if self.auth is not None:
            await self._authenticate(stream, ctx, self.auth)
            return

        async def requests() -> AsyncIterator[HandshakeRequest]:
            async for request in receive_messages(stream, HandshakeRequest, self.max_message_size):
                yield request

        async with (
            closing(requests()) as received,
            closing(self.handler.handshake(ctx, received)) as responses,
        ):
            async for response in responses:
                await stream.send_message(response)

    async def _authenticate(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext, auth: Authenticator
    ) -> None:
        """A bearer token, or Basic credentials whose password is one: the answer's headers
        carry `authorization: Bearer <token>`, what the client then sends with every call."""
        token = handshake_token(ctx.text_headers())
        if token is None or not auth([(AUTHORIZATION, f"Bearer {token}")]):
            raise Unauthenticated(REFUSED)
        async for _ in receive_messages(stream, HandshakeRequest, self.max_message_size):
            pass
        await stream.send_initial_metadata(metadata=bearer(token))
        await stream.send_message(HandshakeResponse(payload=b""))

    async def _list_flights(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        criteria = await receive_request(stream, Criteria, self.max_message_size)
        async with closing(self.handler.list_flights(ctx, criteria.expression)) as infos:
            async for info in infos:
                await stream.send_message(info)

    async def _get_flight_info(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        descriptor = await receive_request(stream, FlightDescriptor, self.max_message_size)
        await stream.send_message(await self.handler.get_flight_info(ctx, descriptor))

    async def _poll_flight_info(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        descriptor = await receive_request(stream, FlightDescriptor, self.max_message_size)
        await stream.send_message(await self.handler.poll_flight_info(ctx, descriptor))

    async def _get_schema(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        descriptor = await receive_request(stream, FlightDescriptor, self.max_message_size)
        schema = await self.handler.get_schema(ctx, descriptor)
        await stream.send_message(SchemaResult(schema=schema_to_ipc(schema)))

    async def _do_get(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        ticket = await receive_request(stream, Ticket, self.max_message_size)
        writer = FlightDataWriter(
            raw_stream(stream), before_first_write=stream.send_initial_metadata
        )
        await self.handler.do_get(ctx, ticket.ticket, writer)

    def _data_reader(self, stream: grpclib.server.Stream[Any, Any]) -> FlightDataReader:
        return FlightDataReader(
            raw_stream(stream), self.max_message_size, max_decoded_size=self.max_decoded_size
        )

    async def _do_put(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        reader = self._data_reader(stream)
        await self.handler.do_put(ctx, reader, PutResultWriter(stream))

    async def _do_exchange(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        reader = self._data_reader(stream)
        writer = FlightDataWriter(
            raw_stream(stream), before_first_write=stream.send_initial_metadata
        )
        await self.handler.do_exchange(ctx, reader, writer)

    async def _do_action(self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext) -> None:
        action = await receive_request(stream, Action, self.max_message_size)
        async with closing(self.handler.do_action(ctx, action)) as bodies:
            async for body in bodies:
                await stream.send_message(Result(body=body))

    async def _list_actions(
        self, stream: grpclib.server.Stream[Any, Any], ctx: CallContext
    ) -> None:
        await receive_request(stream, Empty, self.max_message_size)
        for action_type in await self.handler.list_actions(ctx):
            await stream.send_message(action_type)


LISTEN_BACKLOG: Final = 1024
"""Connections the kernel queues before the server accepts them (capped by somaxconn)."""


class FlightServer:
    """Serves a FlightHandler, plus any other grpclib services, on one port.

    `async with FlightServer(handler) as server:` listens on 127.0.0.1 and a free port by
    default; `server.location` is the `grpc://host:port` clients connect to. With `keepalive`,
    connections of clients that vanish without closing are dropped (their calls cancelled);
    `limits` bounds the connections held at once and the time a new one has to start talking
    HTTP/2 (connection_limits.py). A message may be `max_message_size` bytes on the wire, and
    a DoPut or DoExchange batch `max_decoded_size` bytes once decoded (a compressed batch is
    sized from its IPC header, before it is decompressed).
    `errors` turns handler exceptions into statuses (flightfeed.protocol.TYPED_ERRORS adds the
    typed error for flightfeed clients).
    """

    def __init__(
        self,
        handler: FlightHandler,
        *,
        services: Sequence[Any] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        keepalive: KeepalivePolicy | None = None,
        errors: ErrorMapping = PLAIN_ERRORS,
        limits: ConnectionLimits | None = None,
        max_decoded_size: int | None = DEFAULT_MAX_DECODED_SIZE,
        calls: CallCount | None = None,
        tls: ServerTls | None = None,
        auth: Authenticator | None = None,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.tls = tls
        self._ssl = tls.context() if tls is not None else None  # (its files read now)
        flight = FlightService(handler, max_message_size, errors, max_decoded_size, auth=auth)
        self._grpc = GrpcServer(
            [flight, *services],
            max_message_size,
            keepalive=keepalive,
            limits=limits,
            calls=calls,
            auth=auth,
        )
        self._started = False
        self._local_address = "127.0.0.1"
        """How a local client reaches a server on every interface (set once it listens)."""

    @property
    def calls(self) -> CallCount:
        """The calls running on this server's connections."""
        return self._grpc.calls

    @property
    def location(self) -> str:
        host = self._local_address if self.host in ("0.0.0.0", "", "::") else self.host
        return self.location_at(host)

    def location_at(self, host: str) -> str:
        """This server's URL with another host: a name other machines reach it by."""
        if ":" in host:  # an IPv6 address, bracketed as URLs have it
            host = f"[{host}]"
        scheme = TLS_SCHEME if self.tls is not None else "grpc"
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        sock = await listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._local_address = local_address(sock)
        # grpclib's default backlog of 100 drops the SYNs of a burst of new connections while
        # the loop is busy, and their clients wait seconds to retry.
        await self._grpc.start(
            sock=sock,
            backlog=LISTEN_BACKLOG,
            ssl=self._ssl,
            ssl_handshake_timeout=self._grpc.limits.handshake_timeout,
        )
        self._started = True

    async def close(self) -> None:
        """Stop accepting calls, then wait for the open connections to finish."""
        if self._started:
            self._started = False
            self._grpc.close()
            await self._grpc.wait_closed()
            self._grpc.close_connections()

    async def serve_forever(self) -> None:
        """Run until cancelled; the server is closed on the way out."""
        if not self._started:
            await self.start()
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def __aenter__(self) -> FlightServer:
        require_asyncio("a FlightServer")
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
