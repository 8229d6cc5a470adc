"""StreamingFrameBuffer: large DATA frames as zero-copy pieces, otherwise h2's FrameBuffer.

Real HTTP/2 client byte streams (preamble, SETTINGS, HEADERS/CONTINUATION, interleaved DATA
of every size, padded or not, PING, WINDOW_UPDATE, PRIORITY) are cut at arbitrary points and
fed to the streaming buffer; the result must match h2's stock FrameBuffer fed in one piece:
same frames and payload bytes, END_STREAM on the right piece, same flow-control accounting.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import hpack
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, StreamEnded
from h2.exceptions import DenialOfServiceError, FrameTooLargeError, ProtocolError
from h2.frame_buffer import FrameBuffer
from h2.settings import SettingCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.flight.h2buffer import STREAMING_THRESHOLD, StreamingFrameBuffer, install

PREAMBLE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_FRAME = 4 * 1024 * 1024
MAX_WINDOW = 2**31 - 1
REQUEST_HEADERS = [
    hpack.NeverIndexedHeaderTuple(name, value)  # no dynamic table: blocks are order-free
    for name, value in (
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/arrow.flight.protocol.FlightService/DoPut"),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    )
]


def header_frames(stream_id: int, split: bool) -> list[Frame]:
    block = hpack.Encoder().encode(REQUEST_HEADERS)
    if not split:
        frame = HeadersFrame(stream_id, block)
        frame.flags.add("END_HEADERS")
        return [frame]
    cut = len(block) // 2
    last = ContinuationFrame(stream_id, block[cut:])
    last.flags.add("END_HEADERS")
    return [HeadersFrame(stream_id, block[:cut]), last]


def data_frame(stream_id: int, size: int, pad: int | None, end: bool, seed: int) -> DataFrame:
    frame = DataFrame(stream_id, bytes((seed + i) % 251 for i in range(size)))
    if pad is not None:
        frame.flags.add("PADDED")
        frame.pad_length = pad
    if end:
        frame.flags.add("END_STREAM")
    return frame


data_sizes = st.one_of(
    st.integers(0, 64),
    st.integers(STREAMING_THRESHOLD - 2, STREAMING_THRESHOLD + 2),
    st.integers(STREAMING_THRESHOLD, 80_000),
)
control_frames = st.one_of(
    st.builds(lambda d: PingFrame(0, d), st.binary(min_size=8, max_size=8)),
    st.builds(lambda n: WindowUpdateFrame(0, n), st.integers(1, 1000)),
    st.builds(lambda w: PriorityFrame(1, depends_on=0, stream_weight=w), st.integers(0, 255)),
)


@dataclass
class Wire:
    """A client→server HTTP/2 byte stream and the frames in it, after the connection setup
    (preamble, SETTINGS, ACKs), which h2 must see in an earlier read: it applies an ACKed
    max frame size only from the next `receive_data`."""

    setup: bytes
    frames: list[Frame]

    @property
    def body(self) -> bytes:
        return b"".join(f.serialize() for f in self.frames)

    @property
    def data(self) -> bytes:
        return self.setup + self.body


@st.composite
def client_streams(draw: st.DrawFn, max_streams: int = 3) -> Wire:
    """Preamble, settings, then 1..max_streams requests with interleaved DATA frames."""
    stream_count = draw(st.integers(1, max_streams))
    per_stream: list[list[Frame]] = []
    for index in range(stream_count):
        stream_id = 2 * index + 1
        request = header_frames(stream_id, draw(st.booleans()))
        sizes = draw(st.lists(data_sizes, min_size=1, max_size=4))
        ends = draw(st.booleans())
        for n, size in enumerate(sizes):
            pad = draw(st.one_of(st.none(), st.integers(0, 255)))
            last = n == len(sizes) - 1
            request.append(data_frame(stream_id, size, pad, ends and last, seed=n + index))
        per_stream.append(request)
    ack = SettingsFrame(0)
    ack.flags.add("ACK")
    setup = [SettingsFrame(0, {SettingCodes.ENABLE_PUSH: 0}), ack, SettingsFrame(0, flags=["ACK"])]
    frames: list[Frame] = []
    pending = [0] * stream_count
    opened = 0
    while any(pending[i] < len(s) for i, s in enumerate(per_stream)):
        if draw(st.integers(0, 5)) == 0:
            frames.append(draw(control_frames))
        choices = [i for i in range(opened) if pending[i] < len(per_stream[i])]
        if opened < stream_count:
            choices.append(opened)  # streams open in id order, as HTTP/2 requires
        pick = choices[draw(st.integers(0, len(choices) - 1))]
        opened = max(opened, pick + 1)
        stream_frames = per_stream[pick]
        frame = stream_frames[pending[pick]]
        pending[pick] += 1
        frames.append(frame)
        if isinstance(frame, HeadersFrame) and "END_HEADERS" not in frame.flags:
            frames.append(stream_frames[pending[pick]])  # CONTINUATION follows at once
            pending[pick] += 1
    return Wire(PREAMBLE + b"".join(f.serialize() for f in setup), frames)


def cut(data: bytes, points: Iterable[int]) -> list[bytes]:
    edges = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


# --- frame level ---------------------------------------------------------------------------


def stock_frames(data: bytes) -> list[Frame]:
    buffer = FrameBuffer(server=True)
    buffer.max_frame_size = MAX_FRAME
    buffer.add_data(data)
    return list(buffer)


def streaming_frames(chunks: Sequence[bytes]) -> list[Frame]:
    buffer = StreamingFrameBuffer(server=True)
    buffer.max_frame_size = MAX_FRAME
    frames: list[Frame] = []
    for chunk in chunks:
        buffer.add_data(chunk)
        frames.extend(buffer)
    assert buffer._payload_left == 0
    return frames


def assert_same_frames(expected: list[Frame], actual: list[Frame]) -> None:
    """DATA frames may arrive as several pieces; everything else arrives identical."""
    pieces = iter(actual)
    for frame in expected:
        if not isinstance(frame, DataFrame):
            got = next(pieces)
            assert type(got) is type(frame)
            assert got.serialize() == frame.serialize()
            continue
        payload = b""
        flow = 0
        while True:
            piece = next(pieces)
            assert isinstance(piece, DataFrame)
            assert piece.stream_id == frame.stream_id
            payload += bytes(piece.data)
            flow += piece.flow_controlled_length
            done = len(payload) == len(frame.data)
            assert ("END_STREAM" in piece.flags) == (done and "END_STREAM" in frame.flags)
            if "PADDED" in piece.flags:
                assert piece.serialize() == frame.serialize()  # padded frames are never cut
            if done:
                break
        assert payload == bytes(frame.data)
        assert flow == frame.flow_controlled_length
    assert next(pieces, None) is None


@settings(max_examples=150, deadline=None)
@given(wire=client_streams(), points=st.lists(st.integers(0, 10**7), max_size=30))
def test_frames_match_stock_buffer_for_any_chunking(wire: Wire, points: list[int]) -> None:
    expected = stock_frames(wire.data)
    assert_same_frames(expected, streaming_frames(cut(wire.data, points)))


def test_one_byte_at_a_time() -> None:
    frames = [
        SettingsFrame(0),
        *header_frames(1, split=True),
        data_frame(1, 3 * STREAMING_THRESHOLD, None, False, 1),
        data_frame(1, 40_000, 7, False, 2),
        PingFrame(0, b"12345678"),
        data_frame(1, STREAMING_THRESHOLD, None, True, 3),
    ]
    data = PREAMBLE + b"".join(f.serialize() for f in frames)
    actual = streaming_frames([data[i : i + 1] for i in range(len(data))])
    assert_same_frames(stock_frames(data), actual)
    assert sum(isinstance(f, DataFrame) for f in actual) > 4 * STREAMING_THRESHOLD  # streamed


def test_large_frames_stream_as_views_of_the_received_chunks() -> None:
    frame = data_frame(1, 100_000, None, True, 0)
    raw = frame.serialize()
    chunks = [raw[:5000], raw[5000:60_000], raw[60_000:]]
    buffer = StreamingFrameBuffer(server=False)
    buffer.max_frame_size = MAX_FRAME
    received: list[DataFrame] = []
    for chunk in chunks:
        buffer.add_data(chunk)
        received.extend(f for f in buffer if isinstance(f, DataFrame))
    assert [len(p.data) for p in received] == [5000 - 9, 55_000, 40_009]
    assert isinstance(received[1].data, memoryview)
    assert received[1].data.obj is chunks[1]  # no copy of what the transport delivered
    assert ["END_STREAM" in p.flags for p in received] == [False, False, True]


def test_streaming_path_rejects_oversized_frames_like_stock() -> None:
    raw = data_frame(1, 70_000, None, False, 0).serialize()[:1000]
    for buffer in (FrameBuffer(), StreamingFrameBuffer()):
        buffer.max_frame_size = 65_536
        buffer.add_data(raw + bytes(69_009))  # complete: stock's check
        with pytest.raises(FrameTooLargeError):
            next(buffer)
    streaming = StreamingFrameBuffer()
    streaming.max_frame_size = 65_536
    streaming.add_data(raw)  # incomplete: the streaming path checks before buffering
    with pytest.raises(FrameTooLargeError):
        next(streaming)


def test_streaming_path_rejects_data_on_stream_zero() -> None:
    header = (20_000).to_bytes(3, "big") + b"\x00\x00" + bytes(4)  # DATA, stream 0
    buffer = StreamingFrameBuffer()
    buffer.max_frame_size = MAX_FRAME
    buffer.add_data(header + bytes(100))
    with pytest.raises(ProtocolError):
        next(buffer)


def test_streaming_path_rejects_data_inside_a_header_block() -> None:
    open_block = HeadersFrame(1, hpack.Encoder().encode(REQUEST_HEADERS))  # no END_HEADERS
    raw = open_block.serialize() + data_frame(1, 30_000, None, False, 0).serialize()[:100]
    buffer = StreamingFrameBuffer()
    buffer.max_frame_size = MAX_FRAME
    buffer.add_data(raw)
    with pytest.raises(ProtocolError, match="header block"):
        list(buffer)


# --- through a real h2 connection ------------------------------------------------------------


def server_connection(streaming: bool) -> H2Connection:
    connection = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
    if streaming:
        install(connection)
        assert isinstance(connection.incoming_buffer, StreamingFrameBuffer)
    connection.initiate_connection()
    connection.update_settings(
        {SettingCodes.MAX_FRAME_SIZE: MAX_FRAME, SettingCodes.INITIAL_WINDOW_SIZE: MAX_WINDOW}
    )
    connection.increment_flow_control_window(MAX_WINDOW - 65_535)
    connection.data_to_send()
    return connection


def normalized(events: list[Any]) -> list[tuple[Any, ...]]:
    """Events with consecutive DataReceived of one stream merged (pieces of one frame)."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        if isinstance(event, DataReceived):
            ended = event.stream_ended is not None
            if out and out[-1][0] == "data" and out[-1][1] == event.stream_id:
                _, sid, data, flow, was_ended = out.pop()
                assert not was_ended, "END_STREAM before the end of the data"
                out.append(
                    (
                        "data",
                        sid,
                        data + bytes(event.data),
                        flow + event.flow_controlled_length,
                        ended,
                    )
                )
            else:
                out.append(
                    (
                        "data",
                        event.stream_id,
                        bytes(event.data),
                        event.flow_controlled_length,
                        ended,
                    )
                )
        elif isinstance(event, StreamEnded):
            out.append(("ended", event.stream_id))
        else:
            out.append((type(event).__name__, repr(event)))
    return out


def run_connection(connection: H2Connection, chunks: Sequence[bytes]) -> list[Any]:
    events: list[Any] = []
    for chunk in chunks:
        events += connection.receive_data(chunk)
    return events


@settings(max_examples=60, deadline=None)
@given(wire=client_streams(), points=st.lists(st.integers(0, 10**7), max_size=30))
def test_h2_sees_the_same_connection(wire: Wire, points: list[int]) -> None:
    stock = server_connection(streaming=False)
    streaming = server_connection(streaming=True)
    assert normalized(run_connection(stock, [wire.setup])) == normalized(
        run_connection(streaming, [wire.setup])
    )
    stock_events = run_connection(stock, [wire.body])
    streaming_events = run_connection(streaming, cut(wire.body, points))

    assert normalized(streaming_events) == normalized(stock_events)
    assert streaming.inbound_flow_control_window == stock.inbound_flow_control_window
    assert set(streaming.streams) == set(stock.streams)
    for stream_id, stream in stock.streams.items():
        other = streaming.streams[stream_id]
        assert other.inbound_flow_control_window == stream.inbound_flow_control_window
        assert other.state_machine.state == stream.state_machine.state
    assert streaming.data_to_send() == stock.data_to_send()  # same acks, pings, settings
    sent = sum(f.flow_controlled_length for f in wire.frames if isinstance(f, DataFrame))
    received = sum(
        e.flow_controlled_length for e in streaming_events if isinstance(e, DataReceived)
    )
    assert received == sent


def test_install_keeps_the_frame_size_limit() -> None:
    connection = H2Connection(H2Configuration(client_side=True))
    connection.incoming_buffer.max_frame_size = 12_345
    install(connection)
    assert isinstance(connection.incoming_buffer, StreamingFrameBuffer)
    assert connection.incoming_buffer.max_frame_size == 12_345
    assert connection.incoming_buffer._preamble == b""  # a client expects no preamble


def limited_buffer(limit: int) -> StreamingFrameBuffer:
    buffer = StreamingFrameBuffer(server=True, max_header_block=limit)
    buffer.max_frame_size = MAX_FRAME
    buffer.add_data(PREAMBLE)
    return buffer


def test_a_header_block_within_the_limit_passes() -> None:
    buffer = limited_buffer(1024)
    (headers,) = header_frames(1, split=False)
    buffer.add_data(headers.serialize())
    assert [type(frame) for frame in buffer] == [HeadersFrame]


def test_a_header_block_is_refused_on_the_frame_header_that_crosses_the_limit() -> None:
    """Not once the frame, or the block, is whole: its first 9 bytes are enough."""
    buffer = limited_buffer(1024)
    buffer.add_data(HeadersFrame(1, bytes(1000)).serialize())  # no END_HEADERS: a block begins
    assert list(buffer) == []
    crossing = ContinuationFrame(1, bytes(MAX_FRAME)).serialize()
    buffer.add_data(crossing[:9])
    with pytest.raises(DenialOfServiceError, match="header block of at least 4195304 bytes"):
        list(buffer)


def test_unfinished_names_what_the_peer_left_halfway() -> None:
    buffer = limited_buffer(1 << 20)
    assert buffer.unfinished() is None
    block = HeadersFrame(1, bytes(10)).serialize()
    buffer.add_data(block[:5])
    assert list(buffer) == []
    assert buffer.unfinished() == "an HTTP/2 frame"
    buffer.add_data(block[5:])
    assert list(buffer) == []
    assert buffer.unfinished() == "a header block"
    last = ContinuationFrame(1, bytes(10))
    last.flags.add("END_HEADERS")
    buffer.add_data(last.serialize())
    assert [type(frame) for frame in buffer] == [HeadersFrame]
    assert buffer.unfinished() is None
    large = data_frame(1, 2 * STREAMING_THRESHOLD, None, end=True, seed=0).serialize()
    buffer.add_data(large[:STREAMING_THRESHOLD])
    assert [type(frame) for frame in buffer] == [DataFrame]  # a piece, streamed
    assert buffer.unfinished() == "an HTTP/2 frame"
