"""Sizes read from IPC headers: what a compressed body decodes to is known before Arrow
allocates it, and no header, however mangled, gets anything but InvalidArgument."""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument, PlanDecodeError, ResourceExhausted
from flightfeed.ipcwire import decoded_body_bytes
from flightfeed.plan.arrow_ipc import decoded_stream_bytes, read_ipc_stream


def stream(batch: pa.RecordBatch, compression: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def zeros(rows: int) -> pa.RecordBatch:
    data = pa.py_buffer(bytes(8 * rows))
    return pa.RecordBatch.from_arrays(
        [pa.Array.from_buffers(pa.int64(), rows, [None, data])], names=["k"]
    )


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_compressed_body_declares_its_decoded_size(compression: str) -> None:
    data = stream(zeros(1 << 20), compression)
    assert len(data) < 64 << 10
    assert decoded_stream_bytes(data, "test") == 8 << 20


def test_an_uncompressed_body_is_its_own_size() -> None:
    batch = pa.record_batch({"s": ["a", None, "ccc"], "n": [1, 2, 3]})
    data = stream(batch, None)
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
    sizes = [
        (decoded_body_bytes(m.metadata, m.body or b""), m.body.size if m.body else 0)
        for m in reader
    ]
    assert all(decoded == size for decoded, size in sizes)


def test_compressed_dictionaries_are_counted() -> None:
    values = pa.array(["x" * 1000] * 1000).dictionary_encode()
    batch = pa.record_batch({"d": values})
    assert decoded_stream_bytes(stream(batch, "zstd"), "test") >= 1000


def test_reading_refuses_before_decompressing() -> None:
    data = stream(zeros(1 << 20), "zstd")
    with pytest.raises(ResourceExhausted, match="decodes to 8388608 bytes, over the limit of"):
        read_ipc_stream(data, "MemoryScan partition", max_decoded_bytes=1 << 20)
    _, batches = read_ipc_stream(data, "MemoryScan partition", max_decoded_bytes=8 << 20)
    assert batches[0].num_rows == 1 << 20


SAMPLE = stream(pa.record_batch({"s": ["a", None, "ccc"], "n": [1, 2, 3]}), "zstd")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mangled_streams_are_decode_errors(data: st.DataObject) -> None:
    raw = bytearray(SAMPLE)
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(PlanDecodeError):
        decoded_stream_bytes(bytes(raw), "mangled")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=64))
def test_any_header_is_sized_or_invalid(header: bytes, body: bytes) -> None:
    with contextlib.suppress(InvalidArgument):
        assert decoded_body_bytes(header, body) >= 0
