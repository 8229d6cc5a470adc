"""grpclib plumbing shared by server and client: codec, tuned protocol, server, channel.

Private grpclib/h2 names are reached only through internals.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, TypeVar

import betterproto2
import grpclib.client
import grpclib.server
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.protocol import H2Protocol

from ..errors import ResourceExhausted
from ..messages import parse_strict
from .connection_limits import ConnectionCount, ConnectionLimits
from .h2buffer import install as install_streaming_buffer
from .internals import (
    ChannelBase,
    ServerBase,
    preface_pending,
    protocol_h2_connection,
    protocol_transport,
)
from .keepalive import KeepalivePolicy, KeepaliveTimer
from .request_headers import refusal
from .tuning import advertise_max_frame_size, apply_process_tuning, grpc_config
from .wire import DEFAULT_MAX_MESSAGE_SIZE

log = logging.getLogger(__name__)
M = TypeVar("M", bound=betterproto2.Message)


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
            return data  # as is: RawBytes(data) would copy it
        return parse_message(data, message_type, self.max_message_size)


def parse_message(data: bytes, message_type: type[M], max_message_size: int) -> M:
    """A betterproto2 message from untrusted bytes: size limit, then flightfeed.messages'
    strict parse (wire format, nesting, field types)."""
    if len(data) > max_message_size:
        raise ResourceExhausted(
            f"message of {len(data)} bytes exceeds the limit of {max_message_size} bytes"
        )
    return parse_strict(message_type, data)


WRITE_BUFFER_HIGH = 16 * 1024 * 1024
WRITE_BUFFER_LOW = 4 * 1024 * 1024


class TunedH2Protocol(H2Protocol):
    """grpclib's protocol, advertising a 4 MiB max frame once the connection is up, with
    optional keepalive (see keepalive.py)."""

    def __init__(
        self,
        *args: Any,
        keepalive: KeepalivePolicy | None = None,
        handshake_timeout: float | None = None,
        connections: ConnectionCount | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._keepalive_policy = keepalive
        self.keepalive: KeepaliveTimer | None = None
        self._lost_reason: str | None = None
        self._handshake_timeout = handshake_timeout
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._connections = connections
        self._admitted = False

    def connection_made(self, transport: Any) -> None:
        if self._connections is not None:
            if not self._connections.admit():
                peer = transport.get_extra_info("peername")
                log.debug(
                    "refused a connection from %s: %d are open", peer, self._connections.limit
                )
                transport.abort()
                return
            self._admitted = True
        super().connection_made(transport)
        if self._handshake_timeout is not None:
            self._handshake_timer = asyncio.get_running_loop().call_later(
                self._handshake_timeout, self._handshake_expired
            )
        # Keep several frames queued in user space so the kernel never runs dry while the
        # event loop comes back to refill; grpclib pauses writers above the high mark.
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        h2_connection = protocol_h2_connection(self)
        install_streaming_buffer(h2_connection)
        advertise_max_frame_size(h2_connection)
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
        if self._handshake_timer is not None and not preface_pending(protocol_h2_connection(self)):
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._connections is not None:
            if not self._admitted:
                return  # refused in connection_made: grpclib never saw it
            self._connections.release()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self.keepalive is not None:
            self.keepalive.stop()
        if self._lost_reason is not None:
            self.processor.close(reason=self._lost_reason)  # calls fail with the real cause
        else:
            super().connection_lost(exc)

    def _send_ping(self, payload: bytes) -> None:
        protocol_h2_connection(self).ping(payload)
        self.connection.flush()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        self._presume_dead(
            f"no HTTP/2 preface within {self._handshake_timeout:g} s of connecting",
            level=logging.DEBUG,
        )

    def _presume_dead(self, reason: str, level: int = logging.WARNING) -> None:
        transport = protocol_transport(self)
        if transport is None:  # already closing
            return
        peer = transport.get_extra_info("peername")
        log.log(level, "dropping the connection to %s: %s", peer, reason)
        self._lost_reason = f"{reason} (peer {peer})" if peer else reason
        transport.abort()  # close() would wait to flush towards a peer that reads nothing


def _refused(headers: Iterable[tuple[str, str]]) -> tuple[Status, str] | None:
    found = refusal(headers)
    if found is None:
        return None
    log.debug("refused a call: %s", found.message)
    return found.status, found.message


class GrpcServer(ServerBase):
    """grpclib Server with flightfeed's codec, windows, frame size and keepalive."""

    def __init__(
        self,
        handlers: list[Any],
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        keepalive: KeepalivePolicy | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        apply_process_tuning()
        super().__init__(
            handlers,
            raw_message_type=RawBytes,
            check=_refused,
            codec=MessageCodec(max_message_size),
            config=grpc_config(),
        )
        self.keepalive = keepalive
        self.limits = limits or ConnectionLimits()
        self.connections = ConnectionCount(self.limits.max_connections)

    def make_protocol(self, handler: grpclib.server.Handler, config: Any, h2_config: Any) -> Any:
        return TunedH2Protocol(
            handler,
            config,
            h2_config,
            keepalive=self.keepalive,
            handshake_timeout=self.limits.handshake_timeout,
            connections=self.connections,
        )


class GrpcChannel(ChannelBase):
    """grpclib Channel with flightfeed's codec, windows, frame size and keepalive."""

    def __init__(
        self, host: str, port: int, *, ssl: Any = None, keepalive: KeepalivePolicy | None = None
    ) -> None:
        apply_process_tuning()
        super().__init__(host, port, codec=MessageCodec(), config=grpc_config(), ssl=ssl)
        self.keepalive = keepalive

    def make_protocol(self, handler: grpclib.client.Handler, config: Any, h2_config: Any) -> Any:
        return TunedH2Protocol(handler, config, h2_config, keepalive=self.keepalive)
