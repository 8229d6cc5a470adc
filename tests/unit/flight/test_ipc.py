"""Arrow IPC framing: peek_message, the zero-copy splitter and the read-side message feed."""

from __future__ import annotations

import contextlib
import itertools
import struct

import numpy as np
import pyarrow as pa
import pytest
from helpers.arrow_data import dictionary_replacement_case, random_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.flight.ipc import (
    CONTINUATION,
    IpcMessageFeed,
    IpcMessageSplitter,
    MessageKind,
    peek_message,
)

KINDS = {
    "schema": MessageKind.SCHEMA,
    "dictionary": MessageKind.DICTIONARY_BATCH,
    "record batch": MessageKind.RECORD_BATCH,
}


def ipc_stream(options: pa.ipc.IpcWriteOptions | None = None) -> bytes:
    """A real IPC stream: schema, dictionaries (replaced), several batches, end marker."""
    case = dictionary_replacement_case()
    rng = np.random.default_rng(3)
    extra = random_batch(pa.schema([("i", pa.int64()), ("s", pa.string())]), 50, rng)
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, case.schema, options=options)
    for batch in case.batches:
        writer.write_batch(batch)
    writer.close()
    sink2 = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink2, extra.schema, options=options) as second:
        second.write_batch(extra)
        second.write_batch(extra.slice(10, 20))
    first: bytes = sink.getvalue().to_pybytes()
    second_stream: bytes = sink2.getvalue().to_pybytes()
    return (
        first[:-8] + second_stream
    )  # two streams' messages, one end marker  # two streams' messages, one end marker


def split_messages(stream: bytes) -> list[tuple[bytes, bytes]]:
    """(header, body) of each message, framed by hand with pyarrow's own message reader."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(stream))
    out = []
    pos = 0
    for message in reader:
        assert stream[pos : pos + 4] == CONTINUATION
        (length,) = struct.unpack_from("<i", stream, pos + 4)
        header = stream[pos + 8 : pos + 8 + length]
        body = message.body.to_pybytes() if message.body is not None else b""
        out.append((header, body))
        pos += 8 + length + len(body)
    assert stream[pos:] == CONTINUATION + bytes(4)
    return out


STREAM = ipc_stream()
MESSAGES = split_messages(STREAM)


def test_peek_message_on_real_headers() -> None:
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(STREAM))
    kinds = []
    for (header, body), message in zip(MESSAGES, reader, strict=True):
        kind, body_length = peek_message(header)
        assert kind == KINDS[message.type]
        assert body_length == len(body) == (message.body.size if message.body else 0)
        kinds.append(kind)
    assert kinds.count(MessageKind.DICTIONARY_BATCH) >= 4
    assert kinds.count(MessageKind.RECORD_BATCH) == 6


def test_peek_message_accepts_memoryviews_and_trailing_padding() -> None:
    header, body = MESSAGES[-1]
    assert peek_message(memoryview(header + bytes(5))) == (MessageKind.RECORD_BATCH, len(body))


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x04\x00\x00", b"\xff\xff\xff\x7f" + bytes(8)])
def test_peek_message_rejects_short_or_out_of_bounds_roots(data: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed IPC message header"):
        peek_message(data)


def test_peek_message_field_offset_beyond_the_buffer_is_invalid_argument() -> None:
    """A vtable whose field offset points past the end must not escape as IndexError."""
    buf = bytearray(24)
    struct.pack_into("<I", buf, 0, 16)  # root table at 16
    struct.pack_into("<HHHH", buf, 4, 10, 4, 0, 200)  # vtable: header-type field at +200
    struct.pack_into("<i", buf, 16, 12)  # table → vtable at 16 - 12 = 4
    with pytest.raises(InvalidArgument, match="malformed IPC message header"):
        peek_message(bytes(buf))


@settings(max_examples=300)
@given(
    index=st.integers(0, len(MESSAGES) - 1),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10**6),
)
def test_peek_message_on_corrupted_headers_only_raises_invalid_argument(
    index: int, flips: list[tuple[int, int]], cut: int
) -> None:
    """Truncated or bit-flipped real headers: a clear InvalidArgument, never another error."""
    header = bytearray(MESSAGES[index][0])
    for position, value in flips:
        header[position % len(header)] = value
    data = bytes(header[: cut % (len(header) + 1)])
    try:
        kind, body_length = peek_message(data)
    except InvalidArgument:
        return
    assert body_length >= 0
    assert 0 <= kind <= 255


@given(st.binary(max_size=64))
def test_peek_message_on_garbage_only_raises_invalid_argument(data: bytes) -> None:
    with contextlib.suppress(InvalidArgument):
        peek_message(data)


# --- IpcMessageSplitter ----------------------------------------------------------------


def chunks(data: bytes, cuts: list[int], kinds: list[int]) -> list[bytes | memoryview | pa.Buffer]:
    """`data` cut at the given points, each piece as bytes, memoryview or pa.Buffer."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    out: list[bytes | memoryview | pa.Buffer] = []
    for i, (start, end) in enumerate(itertools.pairwise(points)):
        piece = data[start:end]
        kind = kinds[i % len(kinds)] if kinds else 0
        out.append([piece, memoryview(piece), pa.py_buffer(piece)][kind])
    return out


def assert_split_like(splitter: IpcMessageSplitter, expected: list[tuple[bytes, bytes]]) -> None:
    messages = splitter.take()
    assert splitter.take() == []
    assert len(messages) == len(expected)
    for message, (header, body) in zip(messages, expected, strict=True):
        assert message.header == header
        assert message.body_length == len(body)
        assert b"".join(bytes(memoryview(part)) for part in message.body) == body


@settings(max_examples=200)
@given(
    cuts=st.lists(st.integers(0, 10**7), max_size=40),
    kinds=st.lists(st.integers(0, 2), max_size=5),
)
def test_splitter_any_write_chunking(cuts: list[int], kinds: list[int]) -> None:
    splitter = IpcMessageSplitter()
    for piece in chunks(STREAM, cuts, kinds):
        assert splitter.write(piece) == len(memoryview(piece))
    assert_split_like(splitter, MESSAGES)


def test_splitter_one_byte_writes() -> None:
    splitter = IpcMessageSplitter()
    for i in range(len(STREAM)):
        splitter.write(STREAM[i : i + 1])
    assert_split_like(splitter, MESSAGES)


def test_splitter_take_returns_only_completed_messages() -> None:
    splitter = IpcMessageSplitter()
    header, body = MESSAGES[-1]
    total = sum(8 + len(h) + len(b) for h, b in MESSAGES)
    splitter.write(STREAM[: total - 1])
    assert len(splitter.take()) == len(MESSAGES) - 1
    splitter.write(STREAM[total - 1 : total])
    [last] = splitter.take()
    assert (last.header, last.body_length) == (header, len(body))


def test_splitter_keeps_arrow_body_buffers_without_copying() -> None:
    values = pa.array(np.arange(100_000, dtype=np.int64))
    batch = pa.record_batch([values], names=["v"])
    splitter = IpcMessageSplitter()
    with pa.ipc.new_stream(splitter, batch.schema) as writer:
        writer.write_batch(batch)
    _schema_message, batch_message = splitter.take()
    addresses = [part.address for part in batch_message.body if isinstance(part, pa.Buffer)]
    assert values.buffers()[1].address in addresses


def test_splitter_rejects_legacy_messages_without_continuation() -> None:
    batch = pa.record_batch({"a": pa.array([1], pa.int8())})

    def write_legacy() -> None:
        legacy = pa.ipc.IpcWriteOptions(use_legacy_format=True)
        with pa.ipc.new_stream(IpcMessageSplitter(), batch.schema, options=legacy) as writer:
            writer.write_batch(batch)

    with pytest.raises((ValueError, pa.ArrowException), match="continuation"):
        write_legacy()


# --- IpcMessageFeed ----------------------------------------------------------------------


def encapsulated(header: bytes, body: bytes) -> bytes:
    padding = -len(header) % 8
    return CONTINUATION + struct.pack("<i", len(header) + padding) + header + bytes(padding) + body


@settings(max_examples=200)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=60),
    header_padding=st.lists(st.integers(0, 7), min_size=1, max_size=4),
)
def test_feed_any_read_chunking(sizes: list[int], header_padding: list[int]) -> None:
    """Reads of any sizes see exactly the encapsulated messages that were pushed."""
    feed = IpcMessageFeed()
    expected = b""
    for i, (header, body) in enumerate(MESSAGES):
        header = header + bytes(header_padding[i % len(header_padding)])  # unaligned header
        feed.push(memoryview(header), memoryview(body))
        expected += encapsulated(header, body)
    assert feed.pending == len(expected)
    got = b""
    i = 0
    while feed.pending:
        size = sizes[i % len(sizes)] or 1
        i += 1
        before = feed.pending
        piece = bytes(feed.read(size))
        assert len(piece) == min(size, before)
        assert feed.pending == before - len(piece)
        got += piece
    assert got == expected
    assert feed.read(10) == b""


def test_feed_serves_pyarrow_stream_reader() -> None:
    kinds = [peek_message(header)[0] for header, _ in MESSAGES]
    second_schema = kinds.index(MessageKind.SCHEMA, 1)
    feed = IpcMessageFeed()
    for header, body in MESSAGES[:second_schema]:  # the first stream, without its end marker
        feed.push(memoryview(header), memoryview(body))
    reader = pa.ipc.open_stream(feed)
    batches = [reader.read_next_batch() for _ in range(4)]
    expected = dictionary_replacement_case().batches
    assert all(b.equals(e) for b, e in zip(batches, expected, strict=True))
    assert feed.pending == 0


def test_feed_only_serves_sized_reads() -> None:
    with pytest.raises(ValueError, match="sized reads"):
        IpcMessageFeed().read()
