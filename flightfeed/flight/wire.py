"""Raw gRPC message I/O on grpclib streams for the FlightData path.

Sending: grpclib's `send_data` copies a message into h2 frames (h2 `tobytes()`s and joins
every chunk). `send_encoded` instead writes our own 9-byte DATA frame headers around the
message's buffer views with one `transport.writelines`, and uses h2 only for what it is good at:
stream state and flow-control windows. uvloop holds the views until the kernel took them.

Receiving: a message arrives as one `bytes` (`recv_raw`) or, from `recv_raw_view`, a large one
as a view of the buffer the socket read it into (message_buffer.py); FlightData fields are
then parsed as memoryviews of it.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any, Final

from grpclib.exceptions import StreamTerminatedError
from grpclib.protocol import Stream as H2Stream
from h2.exceptions import StreamClosedError

from ..errors import Cancelled, InvalidArgument, ResourceExhausted
from .codec import EncodedMessage
from .internals import account_sent, stream_h2_connection, stream_transport
from .message_buffer import MessageBuffer

DEFAULT_MAX_MESSAGE_SIZE: Final = 512 * 1024 * 1024
_FRAME_HEADER = struct.Struct(">IBI")  # 24-bit length << 8 | type, flags, stream id
_DATA_FRAME: Final = 0x0
_GRPC_PREFIX = struct.Struct(">BI")


async def send_encoded(stream: H2Stream, message: EncodedMessage) -> None:
    """Write one gRPC message as DATA frames, respecting HTTP/2 flow control."""
    h2_connection = stream_h2_connection(stream)
    transport = stream_transport(stream)
    connection = stream.connection
    stream_id = stream.id
    assert stream_id is not None
    views = [memoryview(part).cast("B") for part in message.parts]
    index = 0
    offset = 0
    remaining = message.nbytes
    while remaining:
        await connection.write_ready.wait()
        if transport.is_closing():
            raise Cancelled("connection closed while sending")
        try:
            window = h2_connection.local_flow_control_window(stream_id)
        except StreamClosedError:
            raise Cancelled("stream closed by peer while sending") from None
        if window <= 0:
            stream.window_updated.clear()
            await stream.window_updated.wait()
            continue
        max_frame = h2_connection.max_outbound_frame_size
        budget = min(window, remaining)
        out: list[Any] = []
        pending = h2_connection.data_to_send()
        if pending:
            out.append(pending)  # keep h2's own frames (acks, window updates) in order
        sent = budget
        while budget:
            frame_size = min(budget, max_frame)
            out.append(_FRAME_HEADER.pack((frame_size << 8) | _DATA_FRAME, 0, stream_id))
            need = frame_size
            while need:
                view = views[index]
                take = min(need, len(view) - offset)
                out.append(view[offset : offset + take] if take != len(view) else view)
                need -= take
                offset += take
                if offset == len(view):
                    index += 1
                    offset = 0
            budget -= frame_size
        try:
            account_sent(h2_connection, stream_id, sent)
        except StreamClosedError:
            raise Cancelled("stream closed by peer while sending") from None
        transport.writelines(out)
        remaining -= sent
        stream.data_sent += sent
        connection.data_sent += sent
        connection.data_send_process()


async def recv_raw(
    stream: H2Stream, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> bytes | None:
    """Receive one gRPC message's payload, or None at end of stream."""
    data = await _receive(stream, max_message_size, stream.recv_data)
    return data if data is None or isinstance(data, bytes) else data.tobytes()


async def recv_raw_view(
    stream: H2Stream, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> bytes | memoryview | None:
    """As recv_raw, but a large message comes as a view of the buffer the socket read it into
    (message_buffer.py): its readers must take memoryviews."""
    buffer = stream.buffer
    read = buffer.read_view if isinstance(buffer, MessageBuffer) else stream.recv_data
    return await _receive(stream, max_message_size, read)


async def _receive(
    stream: H2Stream,
    max_message_size: int,
    read: Callable[[int], Awaitable[bytes | memoryview]],
) -> bytes | memoryview | None:
    try:
        prefix = await read(5)
        if not prefix:
            return None
        if len(prefix) < 5:
            raise InvalidArgument("truncated gRPC message prefix")
        compressed, length = _GRPC_PREFIX.unpack(prefix)
        if compressed:
            raise InvalidArgument("compressed gRPC messages are not supported")
        if length > max_message_size:
            raise ResourceExhausted(
                f"gRPC message of {length} bytes exceeds the limit of {max_message_size} bytes"
            )
        data = await read(length)
    except AssertionError:  # the buffer's: the stream ended inside a message
        raise InvalidArgument("truncated gRPC message: stream ended mid-message") from None
    except StreamTerminatedError as exc:
        raise Cancelled(f"stream terminated: {exc}") from None
    if len(data) != length:
        raise InvalidArgument(f"truncated gRPC message: expected {length} bytes, got {len(data)}")
    return data
