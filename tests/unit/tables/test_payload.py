"""ArrowPayload: batches round trip whatever the compression, zstd only where it pays, and a
payload from the network checked before memory is spent on it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightfeed._generated.storage import ArrowPayload, ArrowPayloadCompression
from flightfeed.errors import InvalidArgument, ResourceExhausted
from flightfeed.tables.decode_budget import DecodeBudget
from flightfeed.tables.payload import (
    Compressor,
    decode_payload,
    encode_payload,
    ipc_stream,
    zstd_content_size,
)

zstandard = pytest.importorskip("zstandard")

LIMIT = 64 << 20
MAGIC = (0xFD2FB528).to_bytes(4, "little")


def compressible(rows: int = 20_000) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "n": pa.array(np.arange(rows) % 10, pa.int64()),
            "s": pa.array(["same text"] * rows),
        }
    )


def random_doubles(rows: int = 20_000, seed: int = 1) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(np.random.default_rng(seed).random(rows))})


def zstd_frame(data: bytes) -> bytes:
    return bytes(pa.Codec("zstd").compress(data, asbytes=True))


def over_the_wire(payload: ArrowPayload) -> ArrowPayload:
    return ArrowPayload.parse(bytes(payload))


# --- round trip ----------------------------------------------------------------------------

SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("t", pa.timestamp("ms")),
        ("b", pa.binary()),
    ]
)


@st.composite
def batches(draw: st.DrawFn) -> pa.RecordBatch:
    rows = draw(st.integers(0, 60))

    def values(strategy: st.SearchStrategy[object]) -> list[object]:
        return draw(st.lists(st.none() | strategy, min_size=rows, max_size=rows))

    return pa.record_batch(
        [
            pa.array(values(st.integers(-(2**63), 2**63 - 1)), pa.int64()),
            pa.array(values(st.floats(allow_nan=False)), pa.float64()),
            pa.array(values(st.text(max_size=20)), pa.string()),
            pa.array(values(st.integers(-(10**12), 10**12)), pa.timestamp("ms")),
            pa.array(values(st.binary(max_size=20)), pa.binary()),
        ],
        schema=SCHEMA,
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contents=st.lists(batches(), max_size=4),
    mode=st.sampled_from(["auto", "always", "never"]),
    min_bytes=st.sampled_from([0, 4096]),
)
def test_batches_round_trip_through_a_payload(
    contents: list[pa.RecordBatch], mode: str, min_bytes: int
) -> None:
    compressor = Compressor(mode=mode, min_bytes=min_bytes)  # type: ignore[arg-type]
    payload = over_the_wire(encode_payload(contents, compressor))
    assert len(payload.record_batches) == len(contents)
    if mode == "never" or not contents:
        assert payload.compression == ArrowPayloadCompression.NONE
    if mode == "always" and min_bytes == 0 and contents:
        assert payload.compression == ArrowPayloadCompression.ZSTD
    decoded = decode_payload(payload, budget=DecodeBudget(LIMIT))
    assert len(decoded) == len(contents)
    for got, sent in zip(decoded, contents, strict=True):
        assert got.schema == sent.schema
        assert got.equals(sent)


def test_each_element_is_a_standalone_ipc_stream() -> None:
    batch = compressible(100)
    payload = encode_payload([batch, batch.slice(10, 5)], Compressor(mode="never"))
    for element, expected in zip(payload.record_batches, [batch, batch.slice(10, 5)], strict=True):
        reader = pa.ipc.open_stream(element)
        assert reader.read_all().equals(pa.Table.from_batches([expected]))
    assert ipc_stream(batch).to_pybytes() == payload.record_batches[0]


def test_an_empty_payload_decodes_to_no_batches() -> None:
    payload = encode_payload([], Compressor())
    assert payload.record_batches == []
    assert payload.compression == ArrowPayloadCompression.NONE
    assert decode_payload(payload, budget=DecodeBudget(0)) == []
    zstd_empty = ArrowPayload(compression=ArrowPayloadCompression.ZSTD)
    assert decode_payload(zstd_empty, budget=DecodeBudget(0)) == []


# --- Compressor ----------------------------------------------------------------------------


def test_auto_compresses_what_shrinks() -> None:
    raw = ipc_stream(compressible())
    packed = Compressor().compress(raw)
    assert packed is not None
    assert len(packed) <= raw.size * 0.6
    assert bytes(pa.Codec("zstd").decompress(packed, decompressed_size=raw.size)) == raw


def test_auto_leaves_random_doubles_alone() -> None:
    raw = ipc_stream(random_doubles())
    assert Compressor().compress(raw) is None
    payload = encode_payload([random_doubles()], Compressor())
    assert payload.compression == ArrowPayloadCompression.NONE
    assert payload.record_batches == [raw.to_pybytes()]


def test_always_compresses_even_random_doubles_and_never_never_does() -> None:
    raw = ipc_stream(random_doubles())
    packed = Compressor(mode="always").compress(raw)
    assert packed is not None
    assert zstd_content_size(packed) == raw.size
    assert Compressor(mode="never").compress(ipc_stream(compressible())) is None
    payload = encode_payload([random_doubles(), random_doubles(seed=2)], Compressor("always"))
    assert payload.compression == ArrowPayloadCompression.ZSTD
    decoded = decode_payload(payload, budget=DecodeBudget(LIMIT))
    assert decoded[0].equals(random_doubles())
    assert decoded[1].equals(random_doubles(seed=2))


def test_small_elements_are_never_compressed() -> None:
    small = ipc_stream(compressible(10))
    assert small.size < 4096
    for mode in ("auto", "always", "never"):
        assert Compressor(mode=mode).compress(small) is None
    assert Compressor(mode="always", min_bytes=0).compress(small) is not None


def test_auto_probes_again_after_a_stream_stops_paying() -> None:
    good, bad = ipc_stream(compressible()), ipc_stream(random_doubles())
    compressor = Compressor(probe_every=2)
    assert compressor.compress(bad) is None  # probed: does not pay
    assert compressor.compress(good) is None  # not tried
    assert compressor.compress(good) is None  # not tried
    assert compressor.compress(good) is not None  # probed again: pays
    assert compressor.compress(good) is not None
    assert compressor.compress(bad) is None  # tried: does not pay any more
    assert compressor.compress(good) is None


def test_a_payload_is_zstd_only_if_every_element_paid() -> None:
    mixed = [compressible(), random_doubles()]
    payload = encode_payload(mixed, Compressor())
    assert payload.compression == ArrowPayloadCompression.NONE
    assert payload.record_batches == [ipc_stream(b).to_pybytes() for b in mixed]
    both = encode_payload([compressible(), compressible(30_000)], Compressor())
    assert both.compression == ArrowPayloadCompression.ZSTD
    assert all(zstd_content_size(e) is not None for e in both.record_batches)


# --- zstd_content_size ---------------------------------------------------------------------


def header(descriptor: int, *fields: bytes) -> bytes:
    return MAGIC + bytes([descriptor]) + b"".join(fields) + b"\x00" * 8


@pytest.mark.parametrize(
    ("frame", "size"),
    [
        # single segment (bit 5), FCS flag 0: a 1-byte size, no window descriptor
        (header(0b0010_0000, bytes([200])), 200),
        # FCS flag 1: 2 bytes, plus 256
        (header(0b0100_0000, b"\x77", (1000 - 256).to_bytes(2, "little")), 1000),
        (header(0b0110_0000, (0).to_bytes(2, "little")), 256),
        # FCS flag 2: 4 bytes, after a window descriptor
        (header(0b1000_0000, b"\x77", (123_456).to_bytes(4, "little")), 123_456),
        # FCS flag 3: 8 bytes, single segment
        (header(0b1110_0000, (2**40 + 3).to_bytes(8, "little")), 2**40 + 3),
        # dictionary ids of 1, 2 and 4 bytes come before the size
        (header(0b1010_0001, b"\x09", (77).to_bytes(4, "little")), 77),
        (header(0b1010_0010, b"\x09\x09", (78).to_bytes(4, "little")), 78),
        (header(0b1010_0011, b"\x09" * 4, (79).to_bytes(4, "little")), 79),
        (header(0b1000_0011, b"\x77", b"\x09" * 4, (80).to_bytes(4, "little")), 80),
        # FCS flag 0 and not single segment: no size
        (header(0b0000_0000, b"\x77"), None),
        (header(0b0000_0011, b"\x77", b"\x09" * 4), None),
    ],
)
def test_zstd_content_size_reads_the_frame_header(frame: bytes, size: int | None) -> None:
    assert zstd_content_size(frame) == size


@pytest.mark.parametrize("length", [0, 1, 1000, 70_000])
def test_zstd_content_size_of_real_frames(length: int) -> None:
    data = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
    assert zstd_content_size(zstd_frame(data)) == length
    assert zstd_content_size(zstandard.ZstdCompressor().compress(data)) == length
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert zstd_content_size(unsized) is None


@pytest.mark.parametrize(
    "frame",
    [b"", b"\x28\xb5\x2f", b"garbage frame", b"\x28\xb5\x2f\xfe\x00\x00\x00", MAGIC],
)
def test_zstd_content_size_refuses_what_is_not_a_frame(frame: bytes) -> None:
    with pytest.raises(InvalidArgument, match="not a zstd frame"):
        zstd_content_size(frame)


def test_zstd_content_size_refuses_a_cut_header() -> None:
    with pytest.raises(InvalidArgument, match="cut short"):
        zstd_content_size(MAGIC + bytes([0b1110_0000]) + b"\x01\x02\x03")


# --- decode refusals -----------------------------------------------------------------------


def zstd_payload(*elements: bytes) -> ArrowPayload:
    return ArrowPayload(record_batches=list(elements), compression=ArrowPayloadCompression.ZSTD)


def test_a_zstd_element_must_be_a_zstd_frame() -> None:
    raw = ipc_stream(compressible(100)).to_pybytes()
    with pytest.raises(InvalidArgument, match="not a zstd frame"):
        decode_payload(zstd_payload(raw), budget=DecodeBudget(LIMIT))


def test_a_zstd_frame_must_declare_its_size() -> None:
    raw = ipc_stream(compressible(100)).to_pybytes()
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    with pytest.raises(InvalidArgument, match="element 1: the zstd frame does not declare"):
        decode_payload(zstd_payload(zstd_frame(raw), unsized), budget=DecodeBudget(LIMIT))
    handmade = MAGIC + bytes([0b0000_0000, 0x77]) + b"\x00" * 16
    with pytest.raises(InvalidArgument, match="does not declare its size"):
        decode_payload(zstd_payload(handmade), budget=DecodeBudget(LIMIT))


def test_a_declared_size_over_the_limit_is_refused_before_decompressing() -> None:
    # garbage after the header: decompressing it would be an InvalidArgument instead
    huge = MAGIC + bytes([0b1110_0000]) + (2**40).to_bytes(8, "little") + b"\xff" * 32
    with pytest.raises(
        ResourceExhausted, match=f"{2**40} bytes: over the worker's limit of {LIMIT} bytes"
    ):
        decode_payload(zstd_payload(huge), budget=DecodeBudget(LIMIT))
    raw = ipc_stream(compressible()).to_pybytes()
    with pytest.raises(ResourceExhausted, match="element 0 decodes to"):
        decode_payload(zstd_payload(zstd_frame(raw)), budget=DecodeBudget(len(raw) - 1))
    assert len(decode_payload(zstd_payload(zstd_frame(raw)), budget=DecodeBudget(len(raw)))) == 1


def test_a_stream_decoding_over_the_limit_is_refused() -> None:
    raw = ipc_stream(compressible()).to_pybytes()
    payload = ArrowPayload(record_batches=[raw])
    with pytest.raises(ResourceExhausted, match="over the worker's limit of 1000 bytes"):
        decode_payload(payload, budget=DecodeBudget(1000))


@pytest.mark.parametrize("delta", [-1, 1, 100])
def test_a_frame_lying_about_its_size_is_invalid(delta: int) -> None:
    raw = ipc_stream(random_doubles()).to_pybytes()
    frame = zstd_frame(raw)
    assert frame[4] == 0b1010_0000  # single segment, a 4-byte size at offset 5
    lie = frame[:5] + (len(raw) + delta).to_bytes(4, "little") + frame[9:]
    with pytest.raises(InvalidArgument, match="element 0 is not valid zstd"):
        decode_payload(zstd_payload(lie), budget=DecodeBudget(LIMIT))


def test_a_corrupt_zstd_body_is_invalid() -> None:
    raw = ipc_stream(random_doubles(1000)).to_pybytes()
    frame = bytearray(zstd_frame(raw))
    frame[20:40] = b"\xff" * 20
    with pytest.raises(InvalidArgument):
        decode_payload(zstd_payload(bytes(frame)), budget=DecodeBudget(LIMIT))


@pytest.mark.parametrize(
    "element",
    [b"", b"not arrow at all", b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x00" * 16],
    ids=["empty", "text", "continuation"],
)
@pytest.mark.parametrize("zstd", [False, True])
def test_garbage_ipc_bytes_are_invalid(element: bytes, zstd: bool) -> None:
    if zstd:
        payload = zstd_payload(zstd_frame(element))
    else:
        payload = ArrowPayload(record_batches=[ipc_stream(compressible(5)).to_pybytes(), element])
    with pytest.raises(InvalidArgument, match="not valid Arrow IPC"):
        decode_payload(payload, budget=DecodeBudget(LIMIT))


def test_a_truncated_stream_is_invalid() -> None:
    raw = ipc_stream(compressible(100)).to_pybytes()
    with pytest.raises(InvalidArgument, match="ArrowPayload element 0"):
        decode_payload(
            ArrowPayload(record_batches=[raw[: len(raw) // 2]]), budget=DecodeBudget(LIMIT)
        )


@pytest.mark.parametrize("value", [2, 7, 127])
def test_an_unknown_compression_is_refused(value: int) -> None:
    raw = ipc_stream(compressible(5)).to_pybytes()
    wire = bytes(ArrowPayload(record_batches=[raw], compression=ArrowPayloadCompression.ZSTD))
    assert wire.endswith(b"\x10\x01")  # field 2 (varint): ZSTD
    payload = ArrowPayload.parse(wire[:-1] + bytes([value]))
    with pytest.raises(InvalidArgument, match="unknown ArrowPayload compression"):
        decode_payload(payload, budget=DecodeBudget(LIMIT))
