"""The one adapter over grpclib, h2 and hyperframe internals.

The data path needs what these libraries do not offer publicly: the raw HTTP/2 stream under a
gRPC call (wire.py writes FlightData frames around buffer views), h2's flow-control bookkeeping
without its copy, a frame buffer that passes large DATA payloads through as views, a protocol
factory of our own (keepalive, frame size, write buffer), and the status of a call that was
reset. Every private name flightfeed uses is used in this module and nowhere else.

`CLASS_ATTRIBUTES` are checked when this module is imported, so a grpclib or h2 release that
dropped one fails at start-up with a message naming it, not in the middle of a transfer;
`INSTANCE_ATTRIBUTES` are checked on live objects by tests/unit/flight/test_internals.py.
pyproject.toml bounds the versions from above, so a new minor release is a deliberate upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final

import grpclib.client
import grpclib.const
import grpclib.protocol
import grpclib.server
import h2.connection
import h2.errors
import h2.exceptions
import h2.frame_buffer
import hyperframe.frame
from grpclib.const import Status
from grpclib.metadata import encode_grpc_message
from grpclib.protocol import H2Protocol
from h2.connection import ConnectionInputs
from h2.stream import StreamInputs

from .buffered import connection_protocol, loop_protocol
from .call_count import CallCount
from .errors import header_safe

CLASS_ATTRIBUTES: Final[Mapping[type, tuple[str, ...]]] = {
    grpclib.server.Server: ("_protocol_factory", "__gc_step__"),
    grpclib.server.Handler: ("__gc_step__",),
    grpclib.client.Channel: ("_protocol_factory", "__connect__", "_create_connection"),
    grpclib.client.Stream: ("_process_grpc_status",),
    h2.connection.H2Connection: ("_get_stream_by_id",),
    h2.frame_buffer.FrameBuffer: ("_validate_frame_length",),
    hyperframe.frame.DataFrame: ("_body_repr",),
}
"""Private methods flightfeed calls or overrides, by class."""

INSTANCE_ATTRIBUTES: Final[Mapping[str, tuple[str, ...]]] = {
    "grpclib.server.Server": (
        "_mapping",
        "_codec",
        "_status_details_codec",
        "_config",
        "_h2_config",
        "_handlers",
        "__dispatch__",
        "_loop",
        "_server",
        "_server_closed_fut",
    ),
    "grpclib.server.Handler": ("_tasks", "_cancelled", "loop"),
    "grpclib.client.Channel": ("_config", "_h2_config"),
    "grpclib.client.Stream": ("_stream", "_wrapper", "_end_done", "_send_request_done"),
    "grpclib.server.Stream": ("_stream", "_method_name", "_send_trailing_metadata_done"),
    "grpclib.protocol.Stream": ("_h2_connection", "_transport"),
    "grpclib.protocol.Connection": ("_connection", "_transport"),
    "grpclib.utils.Wrapper": ("cancelled",),
    "h2.frame_buffer.FrameBuffer": ("_data", "_preamble_len", "_headers_buffer"),
}
"""Private attributes flightfeed reads or sets, by the class of the objects that carry them."""


def check_classes(attributes: Mapping[type, tuple[str, ...]] = CLASS_ATTRIBUTES) -> None:
    """ImportError naming every listed attribute a class lacks."""
    missing = [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls, names in attributes.items()
        for name in names
        if not hasattr(cls, name)
    ]
    if missing:
        raise ImportError(
            "flightfeed relies on internals that this grpclib/h2/hyperframe release lacks: "
            + ", ".join(missing)
            + " (install the versions pyproject.toml allows)"
        )


check_classes()


# -- gRPC calls -------------------------------------------------------------------------------


def raw_stream(call: grpclib.client.Stream[Any, Any] | grpclib.server.Stream[Any, Any]) -> Any:
    """The HTTP/2 stream (grpclib.protocol.Stream) under a client or server call."""
    return call._stream


def call_wrapper(call: grpclib.client.Stream[Any, Any]) -> Any:
    """The wrapper grpclib wakes a client call's waits through when its connection dies."""
    return call._wrapper


def wrapper_cancelled(wrapper: Any) -> bool:
    """Whether grpclib woke the calls inside `wrapper` by cancelling them."""
    return bool(getattr(wrapper, "cancelled", False))


def request_sent(call: grpclib.client.Stream[Any, Any]) -> bool:
    """Whether the client call's request headers went out."""
    return bool(call._send_request_done)


def request_ended(call: grpclib.client.Stream[Any, Any]) -> bool:
    """Whether the client already half-closed its side of the call."""
    return bool(call._end_done)


def mark_request_ended(call: grpclib.client.Stream[Any, Any]) -> None:
    """Record the request side as over when the server closed the call already (nothing more
    can be sent, and grpclib would otherwise refuse to read the status on exit)."""
    call._end_done = True


def raw_status(call: grpclib.client.Stream[Any, Any]) -> tuple[Status, str | None, Any] | None:
    """The error status a server sent before resetting the stream (grpclib servers reset after
    error trailers), from the raw trailers or trailers-only headers; None if there is none."""
    stream = call._stream
    raw = stream.trailers or stream.headers
    fields = dict(raw) if raw else {}
    if fields.get("grpc-status") in (None, "0"):
        return None
    status, message, details = call._process_grpc_status(fields)
    return status, message, details


def raw_trailing_headers(call: grpclib.client.Stream[Any, Any]) -> Any:
    """The undecoded trailers (or trailers-only headers) of a call, if any arrived."""
    stream = call._stream
    return stream.trailers or stream.headers


def method_name(call: grpclib.server.Stream[Any, Any]) -> str:
    """The full method path of a server call."""
    name: str = call._method_name
    return name


def can_send_status(call: grpclib.server.Stream[Any, Any]) -> bool:
    """Whether a server call can still send its trailers (not sent yet, stream not closed)."""
    return not call._send_trailing_metadata_done and bool(call._stream.closable)


# -- HTTP/2 streams and connections ---------------------------------------------------------


def stream_h2_connection(stream: grpclib.protocol.Stream) -> Any:
    """The h2 H2Connection a grpclib HTTP/2 stream belongs to."""
    return stream._h2_connection


def stream_transport(stream: grpclib.protocol.Stream) -> Any:
    """The asyncio transport a grpclib HTTP/2 stream writes to."""
    return stream._transport


def protocol_h2_connection(protocol: H2Protocol) -> Any:
    """The h2 H2Connection of a grpclib connection protocol."""
    return protocol.connection._connection


def protocol_transport(protocol: H2Protocol) -> Any:
    """The transport of a grpclib connection protocol; None once it is closing."""
    return getattr(protocol.connection, "_transport", None)


def replace_stream_buffer(stream: grpclib.protocol.Stream, buffer: Any) -> None:
    """Give a call its receive buffer (grpclib's interface: add, eof, read, unacked_size)
    before any of its data arrived."""
    stream.buffer = buffer


def account_sent(h2_connection: Any, stream_id: int, size: int) -> None:
    """Update h2's state machines and windows as H2Connection.send_data would, minus the copy
    (the caller writes the DATA frames itself)."""
    h2_connection.state_machine.process_input(ConnectionInputs.SEND_DATA)
    h2_stream = h2_connection._get_stream_by_id(stream_id)
    h2_stream.state_machine.process_input(StreamInputs.SEND_DATA)
    h2_stream.outbound_flow_control_window -= size
    h2_connection.outbound_flow_control_window -= size


class FrameBufferBase(h2.frame_buffer.FrameBuffer):
    """h2's FrameBuffer with its parsing state exposed, and a hook for the live frame limit."""

    def current_max_frame_size(self) -> int | None:
        """Override: the inbound frame limit in force now (None: the buffer's own)."""
        return None

    @property
    def buffered(self) -> bytearray:
        """Received bytes not yet parsed into frames."""
        data: bytearray = self._data
        return data

    @property
    def in_preamble(self) -> bool:
        return bool(self._preamble_len)

    @property
    def in_header_block(self) -> bool:
        return bool(self._headers_buffer)

    @property
    def header_block_size(self) -> int:
        """Bytes of the header block being received, in the frames that arrived whole."""
        return sum(len(frame.data) for frame in self._headers_buffer)

    def validate_frame_length(self, length: int) -> None:
        self._validate_frame_length(length)

    def _validate_frame_length(self, length: int) -> None:
        limit = self.current_max_frame_size()
        if limit is not None:
            self.max_frame_size = limit
        super()._validate_frame_length(length)


def preface_pending(h2_connection: Any) -> bool:
    """Whether a server connection still waits for (part of) the client's 24-byte preface."""
    frame_buffer = h2_connection.incoming_buffer
    if isinstance(frame_buffer, FrameBufferBase):
        return frame_buffer.in_preamble
    return bool(frame_buffer._preamble_len)


def set_data_frame_repr(body_repr: Any) -> None:
    """Replace hyperframe's DATA-frame body repr (h2 formats every received frame for a trace
    log, even with logging off, and the stock repr hexlifies the whole payload)."""
    setattr(hyperframe.frame.DataFrame, "_body_repr", body_repr)  # noqa: B010


# -- servers and channels -------------------------------------------------------------------


async def _unimplemented(call: grpclib.server.Stream[Any, Any]) -> None:
    await call.send_trailing_metadata(
        status=Status.UNIMPLEMENTED, status_message=f"method {call._method_name} not found"
    )


class _MethodsOrUnimplemented(dict[str, grpclib.const.Handler]):
    """grpclib's router answers unknown paths with a bare HTTP-level abort that grpclib
    clients misreport ("Missing content-type"); route them to a proper UNIMPLEMENTED reply."""

    def __init__(self, methods: Mapping[str, grpclib.const.Handler], message_type: type) -> None:
        super().__init__(methods)
        self._fallback = grpclib.const.Handler(
            _unimplemented, grpclib.const.Cardinality.STREAM_STREAM, message_type, message_type
        )

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, self._fallback)


RequestCheck = Callable[[Iterable[tuple[str, str]], str], "tuple[Status, str] | None"]
"""Decides, from a call's request headers, whether to refuse it (its status and message); the
second argument names the peer, for the log."""


class RefusingHandler(grpclib.server.Handler):
    """grpclib's connection handler, answering calls that `check` refuses before grpclib's
    request handling sees them. The answer runs as a task of the handler, as grpclib's own
    request handlers do, so closing the server cancels it too.

    A call's task leaves the handler when it is done. grpclib sweeps finished tasks only every
    tenth new call, so after a burst the last calls' tasks, with their streams, results and
    tracebacks, stayed until ten more calls came on that connection: 2,000 of them after 1,000
    concurrent queries. `calls` counts the calls running, across the server's connections.
    """

    def __init__(self, *args: Any, check: RequestCheck, calls: CallCount) -> None:
        super().__init__(*args)
        self.check = check
        self.calls = calls

    def accept(
        self, stream: grpclib.protocol.Stream, headers: Any, release_stream: Callable[[], Any]
    ) -> None:
        refused = self.check(headers, _peer(stream))
        if refused is None:
            super().accept(stream, headers, release_stream)
        else:
            self.__gc_step__()
            self._tasks[stream] = self.loop.create_task(_refuse(stream, *refused, release_stream))
        self.calls.started()
        self._tasks[stream].add_done_callback(partial(self._forget, stream))

    def _forget(self, stream: grpclib.protocol.Stream, task: asyncio.Task[None]) -> None:
        if self._tasks.get(stream) is task:
            del self._tasks[stream]
        self._cancelled.discard(task)
        self.calls.ended()

    def cancel(self, stream: grpclib.protocol.Stream) -> None:
        """Cancel the call on `stream`, if it still runs: a peer's reset may follow ours."""
        if stream in self._tasks:
            super().cancel(stream)


def _peer(stream: grpclib.protocol.Stream) -> str:
    """The call's peer as host:port (grpclib's Peer over the connection's transport)."""
    found = stream.connection.get_peer().addr()
    if isinstance(found, tuple) and len(found) >= 2:
        return f"{found[0]}:{found[1]}"
    return str(found or "an unknown peer")


async def _refuse(
    stream: grpclib.protocol.Stream,
    status: Status,
    message: str,
    release_stream: Callable[[], Any],
) -> None:
    try:
        await stream.send_headers(
            [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", str(status.value)),
                ("grpc-message", encode_grpc_message(header_safe(message))),
            ],
            end_stream=True,
        )
        if stream.closable:
            stream.reset_nowait()  # the request is not read: stop its sender
    finally:
        release_stream()


def end_call(h2_connection: Any, stream_id: int, status: Status, message: str) -> None:
    """End a server call from under grpclib: its status as a trailers-only response, or as
    trailers when response headers went out already, then RST_STREAM(NO_ERROR) so the client
    stops sending. The caller flushes, and cancels the call's handler."""
    h2_stream = h2_connection.streams.get(stream_id)
    fields = [
        ("grpc-status", str(status.value)),
        ("grpc-message", encode_grpc_message(header_safe(message))),
    ]
    if h2_stream is not None and not h2_stream.state_machine.headers_sent:
        fields = [(":status", "200"), ("content-type", "application/grpc"), *fields]
    with contextlib.suppress(h2.exceptions.ProtocolError):  # our side of it ended already
        h2_connection.send_headers(stream_id, fields, end_stream=True)
    with contextlib.suppress(h2.exceptions.ProtocolError):
        h2_connection.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)


def server_handlers(server: grpclib.server.Server) -> list[grpclib.server.Handler]:
    """The connection handlers of a server (one per open connection)."""
    return list(server._handlers)


def _serve_all(headers: Iterable[tuple[str, str]], peer: str) -> None:
    return None


class ServerBase(grpclib.server.Server):
    """grpclib's Server building its connections with `make_protocol`, answering unknown
    methods with UNIMPLEMENTED, counting the calls it runs, and able to close every open
    connection."""

    def __init__(
        self,
        handlers: list[Any],
        *,
        raw_message_type: type,
        check: RequestCheck = _serve_all,
        calls: CallCount | None = None,
        **options: Any,
    ) -> None:
        super().__init__(handlers, **options)
        self._check = check
        self.calls = calls or CallCount()
        self._mapping = _MethodsOrUnimplemented(self._mapping, raw_message_type)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def make_protocol(self, handler: grpclib.server.Handler, config: Any, h2_config: Any) -> Any:
        """Override: the protocol of one accepted connection."""
        return H2Protocol(handler, config, h2_config)

    async def start(
        self, *args: Any, ssl_handshake_timeout: float | None = None, **kwargs: Any
    ) -> None:
        """Serve on the loop that starts the server: grpclib takes the loop current where the
        server is constructed, which is not this one when a server is built in one thread and
        started in another (an anyio portal, say), and it would then never answer.
        `ssl_handshake_timeout` bounds a TLS handshake (grpclib passes none to the loop, whose
        default is 60 s): a connection that never completes it is no protocol's until then,
        so no timer of the protocol's can close it."""
        self._loop = asyncio.get_running_loop()
        if kwargs.get("ssl") is None or ssl_handshake_timeout is None or args:
            await super().start(*args, **kwargs)
            return
        if self._server is not None:
            raise RuntimeError("Server is already started")
        self._server = await self._loop.create_server(
            self._protocol_factory, ssl_handshake_timeout=ssl_handshake_timeout, **kwargs
        )
        self._server_closed_fut = self._loop.create_future()

    def _protocol_factory(self) -> Any:
        self.__gc_step__()
        handler = RefusingHandler(
            self._mapping,
            self._codec,
            self._status_details_codec,
            self.__dispatch__,
            check=self._check,
            calls=self.calls,
        )
        self._handlers.add(handler)
        protocol: H2Protocol = self.make_protocol(handler, self._config, self._h2_config)
        self._protocols.add(protocol)
        return loop_protocol(protocol)

    def close_connections(self) -> None:
        """Close every open connection. grpclib's close() stops the listener and cancels the
        handlers but leaves the connections open, so clients would keep waiting."""
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()


class ChannelBase(grpclib.client.Channel):
    """grpclib's Channel building its connections with `make_protocol`, letting a subclass
    choose the connection of each new call (`connection_for_call`: grpclib asks `__connect__`
    for it), and saying so when the server closed a new connection at once (a server at its
    connection limit does): grpclib would go on to fail with an AttributeError on it."""

    async def __connect__(self) -> H2Protocol:
        return await self.connection_for_call()

    async def connection_for_call(self) -> H2Protocol:
        """Override: the connection a new call goes on (by default grpclib's one connection)."""
        protocol: H2Protocol = connection_protocol(await super().__connect__())
        _check_open(protocol)
        return protocol

    async def new_connection(self) -> H2Protocol:
        """A new connection to the channel's server, which grpclib's Channel does not keep
        (its owner closes it with `close_connection`)."""
        protocol: H2Protocol = connection_protocol(await self._create_connection())
        _check_open(protocol)
        return protocol

    def make_protocol(self, handler: grpclib.client.Handler, config: Any, h2_config: Any) -> Any:
        """Override: the protocol of the channel's connection."""
        return H2Protocol(handler, config, h2_config)

    def _protocol_factory(self) -> Any:
        protocol = self.make_protocol(grpclib.client.Handler(), self._config, self._h2_config)
        return loop_protocol(protocol)


def _check_open(protocol: H2Protocol) -> None:
    if protocol.processor.connection.is_closing():
        raise ConnectionResetError("the server closed the connection as soon as it opened")


def connection_lost(protocol: H2Protocol) -> bool:
    """Whether a client connection is gone (its calls failed with it)."""
    handler: grpclib.client.Handler = protocol.handler  # type: ignore[assignment]
    return bool(handler.connection_lost)


def close_connection(protocol: H2Protocol) -> None:
    """Close a client connection as grpclib's Channel.close does (open calls fail)."""
    protocol.processor.close()


__all__ = [
    "CLASS_ATTRIBUTES",
    "INSTANCE_ATTRIBUTES",
    "ChannelBase",
    "FrameBufferBase",
    "ServerBase",
    "account_sent",
    "check_classes",
    "end_call",
    "call_wrapper",
    "can_send_status",
    "close_connection",
    "connection_lost",
    "mark_request_ended",
    "method_name",
    "protocol_h2_connection",
    "protocol_transport",
    "raw_status",
    "raw_stream",
    "raw_trailing_headers",
    "request_ended",
    "request_sent",
    "set_data_frame_repr",
    "stream_h2_connection",
    "stream_transport",
    "wrapper_cancelled",
]
