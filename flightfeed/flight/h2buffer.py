"""An h2 frame buffer that passes large DATA payloads through without copying.

h2's FrameBuffer appends every received chunk to a bytearray, slices each frame out (a copy)
and `tobytes()`s the payload (another copy). For a 4 MiB DATA frame that is most of the
receive cost. `StreamingFrameBuffer` hands a large DATA frame to h2 as a run of smaller DATA
frames whose payloads are views of the chunks the transport delivered. For h2 that is the same
thing: flow control counts payload bytes, END_STREAM rides on the last piece, and the call's
buffer reassembles messages across DATA frames anyway. A piece may also be received in place
(`add_placed`): the connection read it straight into the buffer of the message it belongs to
(message_buffer.py), having asked `payload_in_progress` which stream's payload comes next.

It also bounds a header block while it arrives. h2 buffers HEADERS and up to 64 CONTINUATION
frames whole before its HPACK decoder measures the list: with 4 MiB frames that is 256 MiB per
connection (a 240 MB block grew a worker to 1.5 GB). Here a frame that would take the block
past `max_header_block` is refused on its 9-byte frame header, before its payload is kept: a
connection error (GOAWAY ENHANCE_YOUR_CALM, saying why), as the block cannot be skipped without
decoding it (HPACK state is per connection).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from h2.exceptions import DenialOfServiceError, ProtocolError
from hyperframe.exceptions import InvalidDataError, InvalidFrameError
from hyperframe.frame import DataFrame, Frame

from .internals import FrameBufferBase

STREAMING_THRESHOLD: Final = 16 * 1024
_TYPE_DATA: Final = 0x0
_HEADER_BLOCK_TYPES: Final = frozenset({0x1, 0x5, 0x9})  # HEADERS, PUSH_PROMISE, CONTINUATION
_FLAG_END_STREAM: Final = 0x1
_FLAG_PADDED: Final = 0x8


class StreamingFrameBuffer(FrameBufferBase):
    """FrameBuffer whose large, unpadded DATA frames come out in zero-copy pieces, and whose
    header blocks may be `max_header_block` bytes (None: h2's own bounds only)."""

    def __init__(
        self, server: bool = False, connection: Any = None, max_header_block: int | None = None
    ) -> None:
        super().__init__(server=server)
        self._connection = connection
        self.max_header_block = max_header_block
        self._ready: deque[DataFrame] = deque()
        self._payload_left = 0
        self._payload_stream = 0
        self._payload_end_stream = False

    def current_max_frame_size(self) -> int | None:
        # h2 copies max_inbound_frame_size into the buffer once per receive_data() call, so a
        # SETTINGS ACK raising the limit and a large frame in the same read would be refused.
        # The connection's value is current frame by frame.
        if self._connection is None:
            return None
        limit: int = self._connection.max_inbound_frame_size
        return limit

    def _piece(self, payload: Any) -> None:
        self._payload_left -= len(payload)
        frame = DataFrame(self._payload_stream)
        frame.data = payload
        if self._payload_left == 0 and self._payload_end_stream:
            frame.flags.add("END_STREAM")
        self._ready.append(frame)

    def payload_in_progress(self) -> tuple[int, int] | None:
        """(stream id, bytes still due) of the large DATA payload being received, if any."""
        if self._payload_left:
            return self._payload_stream, self._payload_left
        return None

    @property
    def at_frame_start(self) -> bool:
        """Whether the next byte received starts a frame (nothing of one is held)."""
        return not (self._payload_left or self._ready or self.buffered or self.in_preamble)

    def add_placed(self, payload: memoryview) -> None:
        """The next bytes of the payload in progress, received where they belong (the
        connection's get_buffer claimed them from the call's message buffer)."""
        if not 0 < len(payload) <= self._payload_left:
            raise ProtocolError("received in place past the DATA payload in progress")
        self._piece(payload)

    def add_data(self, data: Any) -> None:
        if not len(data):
            return
        if self._payload_left and not self.in_preamble:
            view = memoryview(data)
            take = min(self._payload_left, len(view))
            self._piece(view[:take] if take < len(view) else view)
            data = view[take:]
            if not len(data):
                return
        super().add_data(data)

    def __next__(self) -> Frame:
        if self._ready:
            return self._ready.popleft()
        if self._payload_left:
            raise StopIteration  # waiting for more of the current payload
        buffered = self.buffered
        if len(buffered) >= 9 and buffered[3] in _HEADER_BLOCK_TYPES:
            self._check_header_block(int.from_bytes(buffered[:3], "big"))
        if len(buffered) >= 9 and buffered[3] == _TYPE_DATA and not buffered[4] & _FLAG_PADDED:
            length = int.from_bytes(buffered[:3], "big")
            if length >= STREAMING_THRESHOLD and len(buffered) < 9 + length:
                return self._start_streaming(length)
        return super().__next__()

    def _check_header_block(self, length: int) -> None:
        limit = self.max_header_block
        if limit is None:
            return
        size = self.header_block_size + length
        if size > limit:
            raise DenialOfServiceError(
                f"header block of at least {size} bytes exceeds the limit of {limit} bytes"
                " (SETTINGS_MAX_HEADER_LIST_SIZE)"
            )

    def unfinished(self) -> str | None:
        """What the peer started sending and has not finished, or None at a frame boundary
        (the preface is the handshake timeout's business)."""
        if self.in_header_block:
            return "a header block"
        if self._payload_left or (self.buffered and not self.in_preamble):
            return "an HTTP/2 frame"
        return None

    def _start_streaming(self, length: int) -> Frame:
        try:
            header, _ = Frame.parse_frame_header(memoryview(bytes(self.buffered[:9])))
        except (InvalidDataError, InvalidFrameError) as err:
            raise ProtocolError(f"Received frame with invalid header: {err!s}") from err
        self.validate_frame_length(length)
        if header.stream_id == 0:
            raise ProtocolError("DATA frame on stream 0")
        if self.in_header_block:
            raise ProtocolError("Invalid frame during header block.")
        self._payload_stream = header.stream_id
        self._payload_end_stream = bool(self.buffered[4] & _FLAG_END_STREAM)
        self._payload_left = length
        available = bytes(self.buffered[9:])  # the small part that arrived with the header
        del self.buffered[:]
        if available:
            self._piece(available)
        if self._ready:
            return self._ready.popleft()
        raise StopIteration


def install(h2_connection: Any, max_header_list_size: int | None = None) -> StreamingFrameBuffer:
    """Swap in the streaming buffer on a fresh h2 connection (before any data arrived). With
    `max_header_list_size`, header blocks are bounded while they arrive (the caller advertises
    the limit: tuning.advertise_settings)."""
    current = h2_connection.incoming_buffer
    fresh = StreamingFrameBuffer(
        server=not h2_connection.config.client_side,
        connection=h2_connection,
        max_header_block=max_header_list_size,
    )
    fresh.max_frame_size = current.max_frame_size
    h2_connection.incoming_buffer = fresh
    return fresh
