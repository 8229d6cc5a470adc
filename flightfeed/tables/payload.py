"""HoraeDB's `ArrowPayload`: each element of `record_batches` a standalone Arrow IPC stream,
the whole element zstd-compressed when the payload says ZSTD.

Reading checks everything before memory is spent: a zstd frame must declare its content size
(one-shot frames do), and that size, like the IPC stream's own declared body sizes, is spent
from the write's budget (decode_budget.py: one for all the elements of all the requests of a
call); then every batch is fully validated. Writing compresses only when
it pays (`Compressor`): HoraeDB compresses everything from 80 KiB up, so random doubles cost
CPU on both ends and save nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import pyarrow as pa

from .._generated.storage import ArrowPayload, ArrowPayloadCompression
from ..errors import InvalidArgument
from ..flight.ipc import Buffer, WriteOnlyFile
from ..plan.arrow_ipc import decoded_stream_bytes, read_ipc_stream
from .decode_budget import DecodeBudget, dictionary_expansion

_ZSTD_MAGIC: Final = 0xFD2FB528
_CODEC: Final = pa.Codec("zstd", compression_level=1)
_VIEW_MIN_BYTES: Final = 4096
"""Written pieces at least this big are kept as views; smaller ones are copied."""

CompressionMode = Literal["auto", "always", "never"]


def ipc_stream(batch: pa.RecordBatch) -> pa.Buffer:
    """One batch as a standalone IPC stream (schema, batch, end of stream), contiguous."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


class _Pieces(WriteOnlyFile):
    """A write-only file for `pa.ipc.new_stream` keeping what Arrow writes as pieces: body
    buffers as the `pa.Buffer`s Arrow passes (views of the batch's memory), the small pieces
    (headers, padding: Arrow may reuse their memory) copied."""

    def __init__(self) -> None:
        self.pieces: list[Buffer] = []
        self.size = 0

    def write(self, data: Buffer) -> int:
        size = memoryview(data).nbytes
        if isinstance(data, pa.Buffer) and size >= _VIEW_MIN_BYTES:
            self.pieces.append(data)
        else:
            self.pieces.append(bytes(data))
        self.size += size
        return size


def ipc_stream_pieces(batch: pa.RecordBatch) -> tuple[list[Buffer], int]:
    """One batch as a standalone IPC stream, as pieces whose large ones are views of the
    batch's buffers (no copy of the data), and their total size."""
    sink = _Pieces()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.pieces, sink.size


@dataclass
class Compressor:
    """Decides per element whether zstd pays: it does while it shrinks the bytes to at most
    `max_ratio` of their size. The first element tells; a stream that did not pay is tried
    again every `probe_every` elements, so a read whose data changes character adapts."""

    mode: CompressionMode = "auto"
    max_ratio: float = 0.6
    probe_every: int = 32
    min_bytes: int = 4096
    _paying: bool | None = field(default=None, init=False)
    _since_probe: int = field(default=0, init=False)

    def compress(self, raw: pa.Buffer) -> bytes | None:
        """The compressed element, or None to send it as it is."""
        return self._compress(raw) if self.tries(raw.size) else None

    def compress_tried(self, pieces: Sequence[Buffer]) -> bytes | None:
        """The compressed element held as `pieces`, or None if it did not pay; for an element
        `tries` said yes to (the CPU-heavy half, for a worker thread)."""
        return self._compress(pa.py_buffer(b"".join(memoryview(p) for p in pieces)))

    def tries(self, size: int) -> bool:
        """Whether an element of `size` bytes is to be compressed (counted towards the next
        probe when not)."""
        if self.mode == "never" or size < self.min_bytes:
            return False
        if self.mode == "always" or self._paying:
            return True
        if self._paying is None or self._since_probe >= self.probe_every:
            return True  # the first element, or time to probe again
        self._since_probe += 1
        return False

    def _compress(self, raw: pa.Buffer) -> bytes | None:
        packed = bytes(_CODEC.compress(raw, asbytes=True))
        if self.mode == "always":
            return packed
        self._paying = len(packed) <= raw.size * self.max_ratio
        self._since_probe = 0
        return packed if self._paying else None


def encode_payload(batches: Sequence[pa.RecordBatch], compressor: Compressor) -> ArrowPayload:
    """An ArrowPayload of one IPC stream per batch; ZSTD only if every element paid."""
    raw = [ipc_stream(batch) for batch in batches]
    packed = [compressor.compress(buffer) for buffer in raw]
    if raw and all(p is not None for p in packed):
        return ArrowPayload(
            record_batches=[p for p in packed if p is not None],
            compression=ArrowPayloadCompression.ZSTD,
        )
    return ArrowPayload(record_batches=[r.to_pybytes() for r in raw])


def decode_payload(payload: ArrowPayload, *, budget: DecodeBudget) -> list[pa.RecordBatch]:
    """The batches of a payload from the network, every element's decompressed and decoded
    size spent from `budget` before the memory is taken."""
    zstd = payload.compression == ArrowPayloadCompression.ZSTD
    if not zstd and payload.compression != ArrowPayloadCompression.NONE:
        raise InvalidArgument(f"unknown ArrowPayload compression {payload.compression!r}")
    batches: list[pa.RecordBatch] = []
    for i, element in enumerate(payload.record_batches):
        what = f"ArrowPayload element {i}"
        data = _decompress(element, budget, what) if zstd else element
        # An element counts what its batches take, or what it decompressed to if more (the
        # batches are views of it, but for buffers the IPC stream compresses itself).
        spent = len(data) if zstd else 0
        budget.spend(max(0, decoded_stream_bytes(data, what) - spent), what)
        _, found = read_ipc_stream(data, what, max_decoded_bytes=None)
        for batch in found:  # (a table stores a dictionary's values, each time it is used)
            budget.spend(dictionary_expansion(batch), f"{what} (its dictionaries as values)")
        batches.extend(found)
    return batches


def declared_bytes(payload: ArrowPayload) -> int:
    """What a payload's zstd elements declare they decompress to, together (an element that
    declares nothing, or is no zstd frame, counts 0 here: decoding refuses it, naming it)."""
    if payload.compression != ArrowPayloadCompression.ZSTD:
        return 0
    total = 0
    for element in payload.record_batches:
        with contextlib.suppress(InvalidArgument):
            total += zstd_content_size(element) or 0
    return total


def zstd_content_size(frame: bytes) -> int | None:
    """The decompressed size a zstd frame's header declares, None if it declares none."""
    if len(frame) < 6 or int.from_bytes(frame[:4], "little") != _ZSTD_MAGIC:
        raise InvalidArgument("a ZSTD ArrowPayload element is not a zstd frame")
    descriptor = frame[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0:
        return None
    if len(frame) < position + width:
        raise InvalidArgument("a zstd frame header is cut short")
    value = int.from_bytes(frame[position : position + width], "little")
    return value + 256 if width == 2 else value


def _decompress(element: bytes, budget: DecodeBudget, what: str) -> pa.Buffer:
    size = zstd_content_size(element)
    if size is None:
        raise InvalidArgument(f"{what}: the zstd frame does not declare its size")
    budget.spend(size, what)
    try:
        return _CODEC.decompress(element, decompressed_size=size)
    except (pa.ArrowException, OSError) as exc:
        raise InvalidArgument(f"{what} is not valid zstd: {exc}") from exc


__all__ = [
    "CompressionMode",
    "Compressor",
    "declared_bytes",
    "decode_payload",
    "encode_payload",
    "ipc_stream",
    "ipc_stream_pieces",
    "zstd_content_size",
]
