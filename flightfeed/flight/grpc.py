"""grpclib plumbing shared by server and client: codec, tuned protocol, server, channel."""

from __future__ import annotations

import logging
import weakref
from typing import Any

import grpclib.client
import grpclib.const
import grpclib.server
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.protocol import H2Protocol

from ..errors import ResourceExhausted
from . import inprocess
from .h2buffer import install as install_streaming_buffer
from .keepalive import KeepalivePolicy, KeepaliveTimer
from .protowire import check_wire_format
from .tuning import advertise_max_frame_size, apply_process_tuning, grpc_config
from .wire import DEFAULT_MAX_MESSAGE_SIZE

log = logging.getLogger(__name__)


class RawBytes(bytes):
    """Marker type: a handler or call whose messages bypass protobuf (the FlightData path)."""


class MessageCodec(CodecBase):
    """`application/grpc+proto` for betterproto2 messages, pass-through for RawBytes."""

    __content_subtype__ = "proto"

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        self.max_message_size = max_message_size

    def encode(self, message: Any, message_type: Any) -> bytes:
        if message_type is RawBytes:
            return bytes(message)
        if not isinstance(message, message_type):
            raise TypeError(f"message must be {message_type.__name__}, got {type(message)!r}")
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        if message_type is RawBytes:
            return RawBytes(data)
        if len(data) > self.max_message_size:
            raise ResourceExhausted(
                f"message of {len(data)} bytes exceeds the limit of {self.max_message_size} bytes"
            )
        check_wire_format(data)
        return message_type.parse(data)


WRITE_BUFFER_HIGH = 16 * 1024 * 1024
WRITE_BUFFER_LOW = 4 * 1024 * 1024


class TunedH2Protocol(H2Protocol):
    """grpclib's protocol, advertising a 4 MiB max frame once the connection is up, with
    optional keepalive (see keepalive.py)."""

    def __init__(self, *args: Any, keepalive: KeepalivePolicy | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._keepalive_policy = keepalive
        self.keepalive: KeepaliveTimer | None = None
        self._lost_reason: str | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # Keep several frames queued in user space so the kernel never runs dry while the
        # event loop comes back to refill; grpclib pauses writers above the high mark.
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        install_streaming_buffer(self.connection._connection)
        advertise_max_frame_size(self.connection._connection)
        self.connection.flush()
        if self._keepalive_policy is not None:
            self.keepalive = KeepaliveTimer(
                self._keepalive_policy,
                send_ping=self._send_ping,
                has_open_calls=lambda: bool(self.processor.streams),
                expire=self._presume_dead,
            )

    def data_received(self, data: bytes) -> None:
        if self.keepalive is not None:
            self.keepalive.heard()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.keepalive is not None:
            self.keepalive.stop()
        if self._lost_reason is not None:
            self.processor.close(reason=self._lost_reason)  # calls fail with the real cause
        else:
            super().connection_lost(exc)

    def _send_ping(self, payload: bytes) -> None:
        self.connection._connection.ping(payload)
        self.connection.flush()

    def _presume_dead(self, reason: str) -> None:
        transport = getattr(self.connection, "_transport", None)
        if transport is None:  # already closing
            return
        peer = transport.get_extra_info("peername")
        log.warning("dropping the connection to %s: %s", peer, reason)
        self._lost_reason = f"{reason} (peer {peer})" if peer else reason
        transport.abort()  # close() would wait to flush towards a peer that reads nothing


async def _unimplemented(stream: grpclib.server.Stream[Any, Any]) -> None:
    await stream.send_trailing_metadata(
        status=Status.UNIMPLEMENTED, status_message=f"method {stream._method_name} not found"
    )


class _MethodsOrUnimplemented(dict[str, grpclib.const.Handler]):
    """grpclib's router answers unknown paths with a bare HTTP-level abort that grpclib
    clients misreport ("Missing content-type"); route them to a proper UNIMPLEMENTED reply."""

    _fallback = grpclib.const.Handler(
        _unimplemented, grpclib.const.Cardinality.STREAM_STREAM, RawBytes, RawBytes
    )

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, self._fallback)


class GrpcServer(grpclib.server.Server):
    """grpclib Server with flightfeed's codec, windows and frame size."""

    def __init__(
        self,
        handlers: list[Any],
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        keepalive: KeepalivePolicy | None = None,
    ) -> None:
        apply_process_tuning()
        super().__init__(handlers, codec=MessageCodec(max_message_size), config=grpc_config())
        self.keepalive = keepalive
        self._mapping = _MethodsOrUnimplemented(self._mapping)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def close_connections(self) -> None:
        """Close every open client connection. grpclib's close() stops the listener and
        cancels handlers but leaves the TCP connections open, so clients would keep waiting;
        closing them makes every client see the connection go."""
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = grpclib.server.Handler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
        self._handlers.add(handler)
        protocol = TunedH2Protocol(handler, self._config, self._h2_config, keepalive=self.keepalive)
        self._protocols.add(protocol)
        return protocol


class InProcessChannel(grpclib.client.Channel):
    """A channel to a server of this process (see inprocess.py): memory instead of sockets."""

    def __init__(self, location: str) -> None:
        apply_process_tuning()
        super().__init__("inproc", 0, codec=MessageCodec(), config=grpc_config())
        self._location = location

    def _protocol_factory(self) -> H2Protocol:
        return TunedH2Protocol(grpclib.client.Handler(), self._config, self._h2_config)

    async def _create_connection(self) -> H2Protocol:
        return inprocess.connect(self._location, self._protocol_factory())


class GrpcChannel(grpclib.client.Channel):
    """grpclib Channel with flightfeed's codec, windows and frame size."""

    def __init__(
        self, host: str, port: int, *, ssl: Any = None, keepalive: KeepalivePolicy | None = None
    ) -> None:
        apply_process_tuning()
        super().__init__(host, port, codec=MessageCodec(), config=grpc_config(), ssl=ssl)
        self.keepalive = keepalive

    def _protocol_factory(self) -> H2Protocol:
        return TunedH2Protocol(
            grpclib.client.Handler(), self._config, self._h2_config, keepalive=self.keepalive
        )
