"""FlightData codec: random schemas and batches survive encode → decode bit for bit.

In memory, every message is checked three ways: its protobuf fields parse identically with
betterproto2's generated FlightData; the Arrow IPC messages it carries are byte-identical to
what Arrow's own stream writer produces; and the decoded batches equal the originals. The
same property then runs through a real server and both clients, on fewer examples.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from helpers.arrow_data import StreamCase, assert_stream_equal, random_batch, stream_cases
from helpers.flight import (
    Received,
    doget_both_clients,
    doput_both_clients,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed._generated.arrow.flight.protocol import FlightData
from flightfeed.errors import InvalidArgument
from flightfeed.flight import (
    FlightDataDecoder,
    FlightDataEncoder,
    command_descriptor,
    decode_flight_data,
    path_descriptor,
)
from flightfeed.flight.codec import (
    SMALL_MESSAGE_BYTES,
    EncodedMessage,
    encode_flight_data,
)
from flightfeed.flight.ipc import MessageKind, peek_message

CONTINUATION = b"\xff\xff\xff\xff"


def grpc_payloads(case: StreamCase, descriptor: bytes | None = None) -> list[bytes]:
    """Encode a case; return each gRPC message's payload after checking its 5-byte prefix."""
    encoder = FlightDataEncoder(case.schema, case.options)
    messages: list[EncodedMessage] = [encoder.schema_message(descriptor)]
    for batch, metadata in zip(case.batches, case.metadata, strict=True):
        messages += encoder.encode(batch, metadata)
    payloads = []
    for message in messages:
        raw = b"".join(message.parts)
        assert len(raw) == message.nbytes
        compressed, length = struct.unpack(">BI", raw[:5])
        assert (compressed, length) == (0, len(raw) - 5)
        payloads.append(raw[5:])
    return payloads


def reference_messages(case: StreamCase) -> list[tuple[bytes, bytes]]:
    """(header, body) of every message Arrow's own stream writer produces for the case."""
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, case.schema, options=case.options)
    for batch in case.batches:
        writer.write_batch(batch)
    writer.close()
    data: bytes = sink.getvalue().to_pybytes()
    messages: list[tuple[bytes, bytes]] = []
    pos = 0
    while True:
        assert data[pos : pos + 4] == CONTINUATION
        (length,) = struct.unpack_from("<i", data, pos + 4)
        pos += 8
        if length == 0:
            assert pos == len(data)
            return messages
        header = data[pos : pos + length]
        _, body_length = peek_message(header)
        messages.append((header, data[pos + length : pos + length + body_length]))
        pos += length + body_length


def assert_same_ipc(
    sent: list[tuple[bytes, bytes]], reference: list[tuple[bytes, bytes]], *, exact: bool
) -> None:
    """Headers are Arrow's, gaining at most zero padding (to align the body); bodies are
    Arrow's bytes, or (`exact` False) at least their size.

    Writing a sliced array, Arrow rebuilds its validity bitmap and offsets and leaves the bits
    past the last value (and, under list views, offsets it never reads) uninitialised, so two
    writes of one sliced batch may differ there (a bitmap's last byte, 0x21 vs 0x81, in 1 of ~8
    suite runs). What those bytes hold is checked decoded (`assert_stream_equal`)."""
    assert len(sent) == len(reference)
    for (header, body), (ref_header, ref_body) in zip(sent, reference, strict=True):
        if exact:
            assert body == ref_body
        else:
            assert len(body) == len(ref_body)
        assert header[: len(ref_header)] == ref_header
        assert header[len(ref_header) :] == bytes(len(header) - len(ref_header))
        assert len(header) - len(ref_header) < 16


def _sliced(case: StreamCase) -> bool:
    """Whether a batch of the case starts inside its arrays (or holds list views, whose
    offsets Arrow rebuilds however it is cut)."""
    return any(column.offset for batch in case.batches for column in batch.columns) or any(
        _has_list_view(field.type) for field in case.schema
    )


def _has_list_view(t: pa.DataType) -> bool:
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return True
    return any(_has_list_view(t.field(i).type) for i in range(t.num_fields))


Decoded = tuple[pa.Schema, Received, list[tuple[bytes, bytes]], list[bytes | None]]


def decode_all(payloads: list[bytes]) -> Decoded:
    """Decode payloads; also return the carried IPC messages and each message's descriptor."""
    decoder = FlightDataDecoder()
    received: Received = []
    ipc: list[tuple[bytes, bytes]] = []
    descriptors: list[bytes | None] = []
    for payload in payloads:
        view = decode_flight_data(payload)
        parsed = FlightData.parse(payload)  # the generated protobuf code agrees field by field
        assert parsed.data_header == bytes(view.header)
        assert parsed.data_body == bytes(view.body)
        assert parsed.app_metadata == (bytes(view.app_metadata) if view.app_metadata else b"")
        if view.descriptor is not None:
            assert bytes(parsed.flight_descriptor) == bytes(view.descriptor)
        descriptors.append(None if view.descriptor is None else bytes(view.descriptor))
        kind, _ = peek_message(view.header)
        if kind != MessageKind.RECORD_BATCH:
            assert view.app_metadata is None, "app_metadata must ride on record batches only"
        ipc.append((bytes(view.header), bytes(view.body)))
        batch = decoder.feed(view)
        assert (batch is not None) == (kind == MessageKind.RECORD_BATCH)
        received.append((batch, None if view.app_metadata is None else bytes(view.app_metadata)))
    assert decoder.schema is not None
    return decoder.schema, received, ipc, descriptors


def check_codec_roundtrip(case: StreamCase, descriptor: bytes | None = None) -> None:
    schema, received, ipc, descriptors = decode_all(grpc_payloads(case, descriptor))
    assert descriptors[0] == descriptor
    assert all(d is None for d in descriptors[1:])
    assert_same_ipc(ipc, reference_messages(case), exact=not _sliced(case))
    assert_stream_equal(case, schema, [item for item in received if item[0] is not None])


descriptors = st.one_of(
    st.none(),
    st.builds(lambda cmd: bytes(command_descriptor(cmd)), st.binary(min_size=1, max_size=20)),
    st.builds(
        lambda path: bytes(path_descriptor(*path)), st.lists(st.text(max_size=5), max_size=3)
    ),
)


@settings(max_examples=150, deadline=None)
@given(case=stream_cases(), descriptor=descriptors)
def test_codec_roundtrip_random_streams(case: StreamCase, descriptor: bytes | None) -> None:
    check_codec_roundtrip(case, descriptor)


@settings(max_examples=40, deadline=None)
@given(case=stream_cases(max_fields=2, depth=3, max_batches=4))
def test_codec_roundtrip_deeply_nested(case: StreamCase) -> None:
    check_codec_roundtrip(case)


@settings(max_examples=40, deadline=None)
@given(case=stream_cases(max_fields=3, depth=1, max_batches=4))
def test_codec_roundtrip_with_dictionary_deltas(case: StreamCase) -> None:
    case.options = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    check_codec_roundtrip(case)


def test_small_and_large_batches_in_one_stream_keep_arrows_bytes_and_order() -> None:
    """Small batches are serialized in one call, large ones go through the stream writer
    (made when the first large one comes): both give Arrow's own messages, in order."""
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])

    def batch(rows: int, start: int) -> pa.RecordBatch:
        numbers = np.arange(start, start + rows, dtype=np.int64)
        return pa.record_batch([pa.array(numbers), pa.array(numbers.astype(str))], schema=schema)

    batches = [batch(3, 0), batch(20_000, 3), batch(1, 20_003), batch(0, 0), batch(9_000, 7)]
    assert batches[1].get_total_buffer_size() > SMALL_MESSAGE_BYTES
    case = StreamCase("small and large", schema, batches, [b"a", None, b"c", None, b"e"])
    check_codec_roundtrip(case)


@pytest.mark.parametrize("shift", range(1, 8))
def test_a_large_body_at_any_offset_decodes_to_aligned_buffers(shift: int) -> None:
    """A large body is read where it arrived, at whatever offset its framing left it (pyarrow's
    client frames it so). Before, its buffers kept that offset, and Acero (DuckDB scans Arrow
    through it) printed "An input buffer was poorly aligned" for each large DoPut."""
    schema = pa.schema([("n", pa.int64()), ("x", pa.float64())])
    numbers = np.arange(40_000, dtype=np.int64)
    batch = pa.record_batch([pa.array(numbers), pa.array(numbers / 3)], schema=schema)
    encoder = FlightDataEncoder(schema)
    payloads = [b"".join(m.parts)[5:] for m in [encoder.schema_message(), *encoder.encode(batch)]]
    assert len(payloads[1]) > SMALL_MESSAGE_BYTES
    decoder = FlightDataDecoder()
    decoder.feed(decode_flight_data(payloads[0]))
    arrived = bytearray(shift) + payloads[1]  # (its body now `shift` bytes off alignment)
    view = decode_flight_data(memoryview(arrived)[shift:])
    assert pa.py_buffer(view.body).address % 8 != 0
    decoded = decoder.feed(view)
    assert decoded is not None
    assert decoded.equals(batch)
    assert all(b.address % 8 == 0 for column in decoded.columns for b in column.buffers() if b)


def test_encode_sends_schema_first_when_not_yet_sent() -> None:
    schema = pa.schema([("a", pa.int32())])
    batch = pa.record_batch([pa.array([1, 2], pa.int32())], schema=schema)
    encoder = FlightDataEncoder(schema)
    payloads = [b"".join(m.parts)[5:] for m in encoder.encode(batch, b"md")]
    assert [peek_message(decode_flight_data(p).header)[0] for p in payloads] == [
        MessageKind.SCHEMA,
        MessageKind.RECORD_BATCH,
    ]
    with pytest.raises(RuntimeError, match="schema already encoded"):
        encoder.schema_message()


def test_encode_rejects_a_batch_of_another_schema() -> None:
    encoder = FlightDataEncoder(pa.schema([("a", pa.int32())]))
    with pytest.raises(InvalidArgument, match="batch schema differs"):
        encoder.encode(pa.record_batch({"a": pa.array([1], pa.int64())}))


def test_decoder_rejects_a_second_schema() -> None:
    schema = pa.schema([("a", pa.int32())])
    message = b"".join(FlightDataEncoder(schema).schema_message().parts)[5:]
    decoder = FlightDataDecoder()
    decoder.feed(decode_flight_data(message))
    with pytest.raises(InvalidArgument, match="second schema"):
        decoder.feed(decode_flight_data(message))


def test_decoder_metadata_only_messages_yield_no_batch() -> None:
    decoder = FlightDataDecoder()
    payload = b"".join(encode_flight_data(app_metadata=b"hello").parts)[5:]
    view = decode_flight_data(payload)
    assert bytes(view.app_metadata or b"") == b"hello"
    assert decoder.feed(view) is None  # allowed even before the schema
    assert decoder.schema is None


def test_decoder_rejects_body_without_header() -> None:
    payload = b"".join(encode_flight_data(body=[b"12345678"], body_length=8).parts)[5:]
    with pytest.raises(InvalidArgument, match="body but no data_header"):
        FlightDataDecoder().feed(decode_flight_data(payload))


def test_decoder_rejects_a_batch_before_the_schema() -> None:
    schema = pa.schema([("a", pa.int32())])
    batch = random_batch(schema, 4, np.random.default_rng(0))
    payloads = [b"".join(m.parts)[5:] for m in FlightDataEncoder(schema).encode(batch)]
    with pytest.raises(InvalidArgument, match="must start with a schema"):
        FlightDataDecoder().feed(decode_flight_data(payloads[1]))


def test_decoder_rejects_a_dictionary_batch_where_the_schema_has_no_dictionary() -> None:
    dictionary_schema = pa.schema([("d", pa.dictionary(pa.int8(), pa.string()))])
    batch = pa.record_batch([pa.array(["x", "y"]).dictionary_encode()], schema=dictionary_schema)
    messages = FlightDataEncoder(dictionary_schema).encode(batch)
    dictionary = b"".join(messages[1].parts)[5:]
    assert peek_message(decode_flight_data(dictionary).header)[0] == MessageKind.DICTIONARY_BATCH
    plain = pa.schema([("d", pa.string())])
    decoder = FlightDataDecoder()
    decoder.feed(decode_flight_data(b"".join(FlightDataEncoder(plain).schema_message().parts)[5:]))
    with pytest.raises(InvalidArgument, match="its schema has no dictionary fields"):
        decoder.feed(decode_flight_data(dictionary))


# --- the same property through real gRPC ---------------------------------------------------

NETWORK = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.anyio
@NETWORK
@given(case=stream_cases(max_fields=3))
async def test_random_streams_doget_both_clients(case: StreamCase) -> None:
    await doget_both_clients(case)


@pytest.mark.anyio
@NETWORK
@given(case=stream_cases(max_fields=3))
async def test_random_streams_doput_both_clients(case: StreamCase) -> None:
    await doput_both_clients(case)
