"""grpclib plumbing shared by server and client: codec, tuned protocol, server, channel.

Private grpclib/h2 names are reached only through internals.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from contextlib import suppress
from functools import partial
from typing import Any, Final, TypeVar

import betterproto2
import grpclib.client
import grpclib.server
import h2.events
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.protocol import EventsProcessor, H2Protocol
from grpclib.protocol import Stream as H2Stream
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError
from hyperframe.frame import GoAwayFrame

from ..errors import ResourceExhausted
from ..messages import parse_strict
from ..protoencode import encode_message
from .auth import REFUSED, Authenticator
from .buffered import scratch
from .call_count import CallCount
from .churn_collect import ChurnCollector
from .connection_guard import ConnectionGuard
from .connection_limits import ConnectionCount, ConnectionLimits
from .h2buffer import StreamingFrameBuffer
from .h2buffer import install as install_streaming_buffer
from .internals import (
    ChannelBase,
    RequestCheck,
    ServerBase,
    end_call,
    preface_pending,
    protocol_h2_connection,
    protocol_transport,
    replace_stream_buffer,
)
from .keepalive import KeepalivePolicy, KeepaliveTimer
from .log_limit import RateLimitedLogger, limit_logger
from .message_buffer import MessageBuffer, PlacementBudget
from .pool import DEFAULT_MAX_CONNECTIONS, ConnectionPool
from .request_headers import refusal
from .tuning import advertise_settings, apply_process_tuning, grpc_config
from .wire import DEFAULT_MAX_MESSAGE_SIZE

log = logging.getLogger(__name__)
limited_log = RateLimitedLogger(log)
"""Lines any client can cause: one per event, rate-limited by kind (log_limit.py)."""
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
        return encode_message(message)

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


IGNORED_EVENTS: Final = (
    h2.events.UnknownFrameReceived,
    h2.events.AlternativeServiceAvailable,
    h2.events.InformationalResponseReceived,
)
"""h2 events grpclib has no handler for, and raised NotImplementedError on: the connection
died with a traceback in the log. An unknown frame type must be ignored (RFC 9113 §4.1), as
must an ALTSVC offer and a 1xx response a gRPC call has no use for."""
WRITE_BUFFER_HIGH = 16 * 1024 * 1024
WRITE_BUFFER_LOW = 4 * 1024 * 1024
LINGER = 2.0
"""Seconds a connection closed with GOAWAY keeps reading (to drop) so the peer gets the GOAWAY."""
FRAME_HEADER_SIZE: Final = 9
MAX_GOAWAY_DEBUG = 1024


def _peer(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "an unknown peer")


class _PlacingProcessor(EventsProcessor):
    """grpclib's events processor, giving each call a MessageBuffer (message_buffer.py) in
    place of grpclib's buffer, before any of its data arrives."""

    def __init__(self, handler: Any, connection: Any, budget: PlacementBudget) -> None:
        super().__init__(handler, connection)
        self.budget = budget

    def register(self, stream: H2Stream) -> Callable[[], None]:
        stream_id = stream.id
        assert stream_id is not None
        buffer = MessageBuffer(partial(self.connection.ack, stream_id), self.budget)
        replace_stream_buffer(stream, buffer)
        release = super().register(stream)

        def release_stream() -> None:
            release()
            buffer.close()

        return release_stream


class _CallsProcessor(_PlacingProcessor):
    """Also tells a connection's guard when a call opens and when its handler is done with it
    (what the idle timeout and the receive rate go by)."""

    def __init__(
        self, handler: Any, connection: Any, budget: PlacementBudget, guard: ConnectionGuard
    ) -> None:
        super().__init__(handler, connection, budget)
        self._guard = guard

    def register(self, stream: H2Stream) -> Callable[[], None]:
        release = super().register(stream)
        stream_id = stream.id
        assert stream_id is not None
        self._guard.call_opened(stream_id)

        def release_stream() -> None:
            release()
            self._guard.call_closed(stream_id)

        return release_stream


class TunedH2Protocol(H2Protocol):
    """grpclib's protocol, advertising a 4 MiB max frame once the connection is up, with
    optional keepalive (see keepalive.py). A server's connections also get `limits`: header
    blocks bounded while they arrive (h2buffer.py), a minimum receive rate and an idle timeout
    (connection_guard.py). A connection closed for cause gets a GOAWAY saying why."""

    def __init__(
        self,
        *args: Any,
        keepalive: KeepalivePolicy | None = None,
        handshake_timeout: float | None = None,
        connections: ConnectionCount | None = None,
        limits: ConnectionLimits | None = None,
        churn: ChurnCollector | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._churn = churn
        self._keepalive_policy = keepalive
        self.keepalive: KeepaliveTimer | None = None
        self._limits = limits
        self.guard: ConnectionGuard | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._lost_reason: str | None = None
        self._handshake_timeout = handshake_timeout
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._connections = connections
        self._admitted = False
        self._frames: StreamingFrameBuffer | None = None
        self._claimed: memoryview | None = None
        self._placing: MessageBuffer | None = None

    def connection_made(self, transport: Any) -> None:
        if self._connections is not None:
            if not self._connections.admit():
                peer = _peer(transport)
                transport.abort()  # first: the client is told at once
                limited_log.log(
                    "max connections",
                    logging.WARNING,
                    "refused a connection from %s: %d are open, the most this server holds",
                    peer,
                    self._connections.limit,
                )
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
        limits = self._limits
        max_header_list_size = limits.max_header_list_size if limits is not None else None
        frames = self._frames = install_streaming_buffer(h2_connection, max_header_list_size)
        advertise_settings(h2_connection, max_header_list_size)
        self.connection.flush()
        if self._keepalive_policy is not None:
            self.keepalive = KeepaliveTimer(
                self._keepalive_policy,
                send_ping=self._send_ping,
                has_open_calls=lambda: bool(self.processor.streams),
                expire=self._presume_dead,
            )
        if limits is not None:
            loop = asyncio.get_running_loop()
            self.guard = ConnectionGuard(
                limits,
                windows=h2_connection,
                unfinished=frames.unfinished,
                write_pending=transport.get_write_buffer_size,
                fail_call=self._fail_call,
                close=self._guard_close,
                now=loop.time,
                call_at=loop.call_at,
            )
            self.processor = _CallsProcessor(
                self.handler, self.connection, PlacementBudget(), self.guard
            )
        else:
            self.processor = _PlacingProcessor(self.handler, self.connection, PlacementBudget())

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: the rest of a large message, into its own buffer when its
        call has one (message_buffer.py); else this thread's scratch buffer. Reads stop short
        where that lets the next one be placed: at a gRPC prefix inside a large DATA frame, and
        at a frame header while a placed message is incomplete."""
        self._claimed = None
        frames = self._frames
        space = scratch()
        if frames is None or self._linger is not None:
            return space
        payload = frames.payload_in_progress()
        if payload is None:
            placing = self._placing
            if placing is not None:
                if not placing.placing:
                    self._placing = None  # its call gave the message up
                elif frames.at_frame_start:
                    return space[:FRAME_HEADER_SIZE]
            return space
        stream_id, left = payload
        stream = self.processor.streams.get(stream_id)
        buffer = stream.buffer if stream is not None else None
        if not isinstance(buffer, MessageBuffer):
            return space
        region = buffer.claim(left)
        if region is not None:
            self._claimed = region
            self._placing = buffer
            return region
        prefix = buffer.prefix_read(left)
        return space[:prefix] if prefix else space

    def buffer_updated(self, nbytes: int) -> None:
        claimed, self._claimed = self._claimed, None
        if claimed is None:
            self._received(bytes(scratch()[:nbytes]), nbytes)
            return
        frames = self._frames
        assert frames is not None
        frames.add_placed(claimed[:nbytes])
        self._received(b"", nbytes)
        if self._placing is not None and not self._placing.placing:
            self._placing = None  # its message is in: not kept alive by the connection

    def data_received(self, data: bytes) -> None:
        self._received(data, len(data))

    def _received(self, data: bytes, size: int) -> None:
        # grpclib's data_received, except that a protocol error is answered with a GOAWAY
        # saying why (grpclib closes without one and logs a traceback) and that the guard sees
        # the data. `size`: bytes received, `data` and any received in place.
        if self._linger is not None:
            return  # closing: read only to be dropped (see _close)
        if self.keepalive is not None:
            self.keepalive.heard()
        try:
            events = self.connection.feed(data)
        except ProtocolError as exc:
            self._close(
                f"HTTP/2 protocol error: {exc}",
                ErrorCodes(exc.error_code),
                category="protocol error",
                after_error=True,
            )
            return
        self.connection.flush()
        for event in events:
            if not isinstance(event, IGNORED_EVENTS):
                self.processor.process(event)
        self.connection.flush()
        if self.guard is not None and not self.connection.is_closing():
            self.guard.received(size, events)
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
        if self.guard is not None:
            self.guard.stop()
        if self._linger is not None:
            self._linger.cancel()
        if self._lost_reason is not None:
            self.processor.close(reason=self._lost_reason)  # calls fail with the real cause
        else:
            super().connection_lost(exc)
        if self._churn is not None:
            self._churn.connection_closed()

    def _send_ping(self, payload: bytes) -> None:
        protocol_h2_connection(self).ping(payload)
        self.connection.flush()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        self._presume_dead(
            f"no HTTP/2 preface within {self._handshake_timeout:g} s of connecting",
            level=logging.INFO,
        )

    def _presume_dead(self, reason: str, level: int = logging.WARNING) -> None:
        transport = protocol_transport(self)
        if transport is None:  # already closing
            return
        peer = _peer(transport)
        limited_log.log(
            ("dropped", level), level, "dropping the connection to %s: %s", peer, reason
        )
        self._lost_reason = f"{reason} (peer {peer})"
        if self.guard is not None:
            self.guard.stop()
        transport.abort()  # close() would wait to flush towards a peer that reads nothing

    def _fail_call(self, stream_id: int, reason: str) -> None:
        """The guard's verdict on one call: RESOURCE_EXHAUSTED, reset, handler cancelled."""
        transport = protocol_transport(self)
        if transport is None:
            return
        limited_log.log(
            "call ended", logging.INFO, "ended a call from %s: %s", _peer(transport), reason
        )
        end_call(protocol_h2_connection(self), stream_id, Status.RESOURCE_EXHAUSTED, reason)
        self.connection.flush()
        stream = self.processor.streams.get(stream_id)
        if stream is not None:
            self.handler.cancel(stream)

    def _guard_close(self, reason: str, error_code: ErrorCodes) -> None:
        if error_code == ErrorCodes.NO_ERROR:  # idle: routine, not the peer's fault
            self._close(reason, error_code, category="idle", level=logging.DEBUG)
        else:
            self._close(reason, error_code, category="too slow")

    def _close(
        self,
        reason: str,
        error_code: ErrorCodes,
        *,
        category: str,
        level: int = logging.INFO,
        after_error: bool = False,
    ) -> None:
        """Send GOAWAY with `reason` as its debug data (clients such as grpc-core show it) and
        close the connection; its calls fail with `reason`. `after_error`: h2 raised a protocol
        error and queued a GOAWAY of its own, without the reason, which this one replaces."""
        transport = protocol_transport(self)
        if transport is None or self._linger is not None:  # already closing
            return
        h2_connection = protocol_h2_connection(self)
        debug = reason.encode()[:MAX_GOAWAY_DEBUG]
        if after_error:
            h2_connection.data_to_send()  # h2's GOAWAY; its state machine allows no other
            goaway = GoAwayFrame(
                0,
                last_stream_id=h2_connection.highest_inbound_stream_id,
                error_code=error_code,
                additional_data=debug,
            )
            transport.write(goaway.serialize())
        else:
            with suppress(ProtocolError):  # h2 is past sending one
                h2_connection.close_connection(error_code, additional_data=debug)
            self.connection.flush()
        peer = _peer(transport)
        limited_log.log(category, level, "closing the connection from %s: %s", peer, reason)
        self._lost_reason = f"{reason} (peer {peer})"
        if self.guard is not None:
            self.guard.stop()
        if transport.get_write_buffer_size():
            transport.abort()  # a peer that reads nothing must not keep it open
        elif self._limits is None:
            transport.close()  # a client's connection: nobody waits for the GOAWAY
        else:
            self._linger_after_goaway(transport)

    def _linger_after_goaway(self, transport: Any) -> None:
        """Read on rather than close: closing with bytes unread makes the kernel answer with
        RST, which can cost the peer our GOAWAY. The peer closes once it has read it; one that
        does not is cut off after LINGER seconds. The calls end now, by cancellation (grpclib's
        StreamTerminatedError would have them send trailers on a connection h2 has closed)."""
        self._linger = asyncio.get_running_loop().call_later(LINGER, transport.abort)
        if self.keepalive is not None:
            self.keepalive.stop()
        self.handler.close()


HANDSHAKE_PATH: Final = "/arrow.flight.protocol.FlightService/Handshake"


def _checker(auth: Authenticator | None) -> RequestCheck:
    """The server's check of each call's headers: the header rules, then `auth` (but for
    Flight's Handshake, which checks the credentials it is given itself)."""

    def check(headers: Iterable[tuple[str, str]], peer: str) -> tuple[Status, str] | None:
        headers = list(headers)
        refused = _refused(headers, peer)
        if refused is not None or auth is None:
            return refused
        path = next((value for name, value in headers if name == ":path"), "")
        if path == HANDSHAKE_PATH or auth(headers):
            return None
        limited_log.log(
            ("refused", Status.UNAUTHENTICATED),
            logging.INFO,
            "refused a call to %r from %s: %s",
            path[:128],
            peer,
            REFUSED,
        )
        return Status.UNAUTHENTICATED, REFUSED

    return check


def _refused(headers: list[tuple[str, str]], peer: str) -> tuple[Status, str] | None:
    found = refusal(headers)
    if found is None:
        return None
    path = next((value for name, value in headers if name == ":path"), "")
    limited_log.log(  # by status: paths are the client's to choose, categories must be few
        ("refused", found.status),
        logging.INFO,
        "refused a call to %r from %s: %s",
        path[:128],
        peer,
        found.message,
    )
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
        calls: CallCount | None = None,
        auth: Authenticator | None = None,
    ) -> None:
        apply_process_tuning()
        super().__init__(
            handlers,
            raw_message_type=RawBytes,
            check=_checker(auth),
            calls=calls,
            codec=MessageCodec(max_message_size),
            config=grpc_config(),
        )
        self.keepalive = keepalive
        self.limits = limits or ConnectionLimits()
        self.connections = ConnectionCount(self.limits.max_connections)
        self.churn = ChurnCollector()
        limit_logger("grpclib.server")  # its line per cancelled call, say

    def make_protocol(self, handler: grpclib.server.Handler, config: Any, h2_config: Any) -> Any:
        return TunedH2Protocol(
            handler,
            config,
            h2_config,
            keepalive=self.keepalive,
            handshake_timeout=self.limits.handshake_timeout,
            connections=self.connections,
            limits=self.limits,
            churn=self.churn,
        )


class GrpcChannel(ChannelBase):
    """grpclib Channel with flightfeed's codec, windows, frame size and keepalive, over a pool
    of connections (pool.py): as many calls at once as the caller makes."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: Any = None,
        keepalive: KeepalivePolicy | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        apply_process_tuning()
        super().__init__(host, port, codec=MessageCodec(), config=grpc_config(), ssl=ssl)
        self.keepalive = keepalive
        self.pool = ConnectionPool(self.new_connection, max_connections=max_connections)

    @property
    def connections(self) -> list[H2Protocol]:
        """The open connections, oldest first."""
        return self.pool.connections

    async def connection_for_call(self) -> H2Protocol:
        return await self.pool.acquire()

    def received_in_place(self) -> tuple[int, int]:
        """Messages, and their bytes, that the open connections received straight into
        buffers of their own (message_buffer.py)."""
        budgets = [
            p.processor.budget
            for p in self.pool.connections
            if isinstance(p.processor, _PlacingProcessor)
        ]
        return sum(b.placed_messages for b in budgets), sum(b.placed_bytes for b in budgets)

    def close(self) -> None:
        self.pool.close()
        super().close()

    def make_protocol(self, handler: grpclib.client.Handler, config: Any, h2_config: Any) -> Any:
        return TunedH2Protocol(handler, config, h2_config, keepalive=self.keepalive)
