"""grpclib plumbing shared by server and client: codec, tuned protocol, server, channel."""

from __future__ import annotations

from typing import Any

import grpclib.client
import grpclib.server
from grpclib.encoding.base import CodecBase
from grpclib.protocol import H2Protocol

from .h2buffer import install as install_streaming_buffer
from .tuning import advertise_max_frame_size, apply_process_tuning, grpc_config


class RawBytes(bytes):
    """Marker type: a handler or call whose messages bypass protobuf (the FlightData path)."""


class MessageCodec(CodecBase):
    """`application/grpc+proto` for betterproto2 messages, pass-through for RawBytes."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        if message_type is RawBytes:
            return bytes(message)
        if not isinstance(message, message_type):
            raise TypeError(f"message must be {message_type.__name__}, got {type(message)!r}")
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        if message_type is RawBytes:
            return RawBytes(data)
        return message_type.parse(data)


WRITE_BUFFER_HIGH = 16 * 1024 * 1024
WRITE_BUFFER_LOW = 4 * 1024 * 1024


class TunedH2Protocol(H2Protocol):
    """grpclib's protocol, advertising a 4 MiB max frame once the connection is up."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # Keep several frames queued in user space so the kernel never runs dry while the
        # event loop comes back to refill; grpclib pauses writers above the high mark.
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        install_streaming_buffer(self.connection._connection)
        advertise_max_frame_size(self.connection._connection)
        self.connection.flush()


class GrpcServer(grpclib.server.Server):
    """grpclib Server with flightfeed's codec, windows and frame size."""

    def __init__(self, handlers: list[Any]) -> None:
        apply_process_tuning()
        super().__init__(handlers, codec=MessageCodec(), config=grpc_config())

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = grpclib.server.Handler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
        self._handlers.add(handler)
        return TunedH2Protocol(handler, self._config, self._h2_config)


class GrpcChannel(grpclib.client.Channel):
    """grpclib Channel with flightfeed's codec, windows and frame size."""

    def __init__(self, host: str, port: int, *, ssl: Any = None) -> None:
        apply_process_tuning()
        super().__init__(host, port, codec=MessageCodec(), config=grpc_config(), ssl=ssl)

    def _protocol_factory(self) -> H2Protocol:
        return TunedH2Protocol(grpclib.client.Handler(), self._config, self._h2_config)
