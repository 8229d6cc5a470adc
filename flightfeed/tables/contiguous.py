"""HoraeDB's contiguous rows (`remote_engine.ContiguousRows`) decoded into an Arrow table.

A HoraeDB node encodes every remote write this way (since its remote engine's August 2023
protocol), never as an ArrowPayload, so a worker that takes HoraeDB's writes must read it. The
format is HoraeDB's (common_types/src/row/contiguous.rs), one byte string per row, in the
byte order of the writing machine (little-endian on every platform HoraeDB builds for):

- a u32 `num_bits`: 0 when no column of the row is null; otherwise the number of columns,
  followed by a bit set of that many bits (least significant first), set for each column that
  is *not* null;
- the fixed part: each non-null column's value in the table's column order, as wide as its type
  (a u32 for a string or binary: the offset of its bytes from the start of the row);
- the variable part: each string or binary as a varint length and its bytes.

Every row is decoded at once with numpy (gathers over the joined rows), never a Python loop over
rows, and every offset and length is checked against the row it is read from before use: a
malformed row is an InvalidArgument naming the row and column, never an out-of-bounds read.
`column_descs` must match the table's columns, id and type, one for one (HoraeDB checks the
same): rows encoded for another version of the schema are refused, not misread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._generated.remote_engine import ContiguousRows
from .._generated.schema import DataType
from ..errors import InvalidArgument
from .decode_budget import DecodeBudget
from .schema import Column, TableSchema


@dataclass(frozen=True)
class _Layout:
    """How a column of one type sits in the fixed part, and the Arrow array it decodes to."""

    width: int
    numpy: str  # the fixed part's value, as numpy reads it (little-endian)
    arrow: pa.DataType


_VARIABLE: Final = frozenset({DataType.STRING, DataType.VARBINARY})
LAYOUTS: Final[dict[DataType, _Layout]] = {
    DataType.TIMESTAMP: _Layout(8, "<i8", pa.timestamp("ms")),
    DataType.DOUBLE: _Layout(8, "<f8", pa.float64()),
    DataType.FLOAT: _Layout(4, "<f4", pa.float32()),
    DataType.VARBINARY: _Layout(4, "<u4", pa.large_binary()),
    DataType.STRING: _Layout(4, "<u4", pa.large_string()),
    DataType.UINT64: _Layout(8, "<u8", pa.uint64()),
    DataType.UINT32: _Layout(4, "<u4", pa.uint32()),
    DataType.UINT16: _Layout(2, "<u2", pa.uint16()),
    DataType.UINT8: _Layout(1, "u1", pa.uint8()),
    DataType.INT64: _Layout(8, "<i8", pa.int64()),
    DataType.INT32: _Layout(4, "<i4", pa.int32()),
    DataType.INT16: _Layout(2, "<i2", pa.int16()),
    DataType.INT8: _Layout(1, "i1", pa.int8()),
    DataType.BOOL: _Layout(1, "u1", pa.bool_()),
    DataType.DATE: _Layout(4, "<i4", pa.date32()),
    DataType.TIME: _Layout(8, "<i8", pa.time64("ns")),  # HoraeDB's time is Time64(ns)
}
"""By HoraeDB data type. Strings and binaries decode to large types: `conform_rows` narrows
them, refusing what does not fit."""

HEADER_BYTES: Final = 4
CHUNK_ROWS: Final = 65_536
MAX_VARINT_BYTES: Final = 5  # a u32 length


def check_column_descs(rows: ContiguousRows, schema: TableSchema) -> None:
    """The rows were encoded for exactly the table's columns (ids and types, in order)."""
    descs = [(d.id, DataType(d.typ)) for d in rows.column_descs]
    columns = [(c.id, c.type.data_type) for c in schema.columns]
    if descs == columns:
        return
    if len(descs) != len(columns):
        raise InvalidArgument(
            f"contiguous rows: the request describes {len(descs)} columns, the table has"
            f" {len(columns)} (schema version {schema.version}): read the table info again"
        )
    index = next(i for i, (d, c) in enumerate(zip(descs, columns, strict=True)) if d != c)
    (got_id, got_type), (want_id, want_type) = descs[index], columns[index]
    raise InvalidArgument(
        f"contiguous rows: column {index} is id {got_id} of type {_named(got_type)} in the"
        f" request, id {want_id} of type {_named(want_type)} ({schema.columns[index].name!r}) in"
        f" the table (schema version {schema.version}): read the table info again"
    )


def _named(data_type: DataType) -> str:
    return data_type.name or str(int(data_type))  # (an unknown number has no name)


def decode_contiguous_rows(
    rows: ContiguousRows,
    schema: TableSchema,
    *,
    budget: DecodeBudget,
    chunk_rows: int = CHUNK_ROWS,
) -> pa.Table:
    """`rows` as a table of the table's columns (strings and binaries as large types), decoded
    `chunk_rows` at a time so that the decoder's own arrays stay small."""
    check_column_descs(rows, schema)
    encoded = rows.encoded_rows
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    columns = schema.columns
    # What the decoded columns take, at most: each value's width (and a string's 8-byte
    # offset) in every row, and every byte of the rows again (the strings' bytes).
    per_row = sum(LAYOUTS[c.type.data_type].width + 8 for c in columns)
    decoded = len(encoded) * per_row + int(lengths.sum())
    what = f"contiguous rows: {len(encoded)} rows of {len(columns)} columns"
    budget.spend(decoded, what, ": send fewer rows per write")
    batches = [
        _Decoder(
            encoded[first : first + chunk_rows], lengths[first : first + chunk_rows], columns, first
        ).batch()
        for first in range(0, len(encoded), chunk_rows)
    ]
    arrow = pa.schema([pa.field(c.name, LAYOUTS[c.type.data_type].arrow) for c in columns])
    return pa.Table.from_batches(batches, schema=arrow)


class _Decoder:
    """The joined rows and, per row, where it starts and ends and which columns are null."""

    def __init__(
        self,
        encoded: Sequence[bytes],
        lengths: npt.NDArray[np.int64],
        columns: Sequence[Column],
        first: int,
    ) -> None:
        self.columns = columns
        self.first = first  # the index of the first row, for messages
        self.n = len(encoded)
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        # A pad after the last row: reads that are masked out may run past a row's end.
        self.buf = np.frombuffer(b"".join([*encoded, bytes(16)]), dtype=np.uint8)
        self._windows: dict[int, npt.NDArray[np.uint8]] = {}
        self._check(lengths >= HEADER_BYTES, "shorter than its 4-byte header")
        num_bits = self._gather(self.starts, "<u4").astype(np.int64)
        with_nulls = num_bits != 0
        count = len(columns)
        self._check(
            ~with_nulls | (num_bits == count),
            f"a null bit set of other than the table's {count} columns",
        )
        bitset_bytes = (count + 7) // 8
        header = np.where(with_nulls, HEADER_BYTES + bitset_bytes, HEADER_BYTES)
        self._check(lengths >= header, f"shorter than its header and {bitset_bytes}-byte bit set")
        self.plain = np.flatnonzero(~with_nulls)
        self.sparse = np.flatnonzero(with_nulls)
        self.valid = self._valid(count)
        widths = np.array([LAYOUTS[c.type.data_type].width for c in columns], dtype=np.int64)
        # Where each column starts in the rows with nulls (a null takes no room: the columns
        # after it move up); the rows without are all laid out alike (`_plain_block`).
        taken = self.valid[self.sparse] * widths
        fixed_ends = header[self.sparse, None] + np.cumsum(taken, axis=1)
        self.offsets = fixed_ends - taken  # from the start of the row, a row of `sparse` each
        self.fixed_end = np.full(self.n, HEADER_BYTES + int(widths.sum()), dtype=np.int64)
        self.fixed_end[self.sparse] = fixed_ends[:, -1]
        self._check(lengths >= self.fixed_end, "shorter than its fixed part")
        self.block = self._plain_block()

    def _check(self, ok: npt.NDArray[np.bool_], what: str, column: int | None = None) -> None:
        if ok.all():
            return
        row = self.first + int(np.argmin(ok))
        where = f", column {self.columns[column].name!r}" if column is not None else ""
        raise InvalidArgument(f"contiguous rows: row {row}{where}: {what}")

    def _gather(self, at: npt.NDArray[np.int64], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        """The value of `dtype` at each byte position `at` of the joined rows."""
        width = np.dtype(dtype).itemsize
        if not len(at):
            return np.empty(0, dtype=dtype)
        # Every `width` bytes starting at each position, as rows of a read-only strided view:
        # indexing it copies `width` bytes a value, with no index array `width` times as long.
        windows = self._windows.get(width)
        if windows is None:
            windows = self._windows[width] = np.lib.stride_tricks.as_strided(
                self.buf, shape=(len(self.buf) - width + 1, width), strides=(1, 1), writeable=False
            )
        return np.ascontiguousarray(windows[at]).view(dtype).reshape(len(at))

    def _plain_block(self) -> npt.NDArray[np.void]:
        """The fixed parts of the rows without nulls (the usual case) in one copy, each a record
        of the same layout: a column's values are a field of it, not a gather of their own."""
        layouts = [LAYOUTS[c.type.data_type] for c in self.columns]
        widths = [layout.width for layout in layouts]
        record = np.dtype(
            {
                "names": [f"c{i}" for i in range(len(layouts))],
                "formats": [layout.numpy for layout in layouts],
                "offsets": np.cumsum([0, *widths[:-1]]).tolist(),
                "itemsize": sum(widths),
            }
        )
        return self._gather(self.starts[self.plain] + HEADER_BYTES, record)

    def _valid(self, count: int) -> npt.NDArray[np.bool_]:
        """Which columns of each row are not null."""
        valid = np.ones((self.n, count), dtype=bool)
        if len(self.sparse):
            rows = self.sparse
            index = np.arange(count)
            at = self.starts[rows, None] + HEADER_BYTES + index // 8
            valid[rows] = (self.buf[at] >> (index % 8)) & 1 == 1
        return valid

    def batch(self) -> pa.RecordBatch:
        arrays = [self._column(i, c) for i, c in enumerate(self.columns)]
        return pa.RecordBatch.from_arrays(arrays, names=[c.name for c in self.columns])

    def _column(self, index: int, column: Column) -> pa.Array:
        layout = LAYOUTS[column.type.data_type]
        valid = self.valid[:, index]
        values = self.block[f"c{index}"]
        if len(self.sparse):  # rows with a null bit set: the columns after a null move up
            sparse = self.sparse
            present = valid[sparse]
            # (A null's position is masked out, but stays inside the joined rows.)
            at = np.where(present, self.starts[sparse] + self.offsets[:, index], 0)
            every = np.empty(self.n, dtype=values.dtype)
            every[self.plain] = values
            every[sparse] = self._gather(at, layout.numpy)
            values = every
        if column.type.data_type in _VARIABLE:
            return self._variable(index, values.astype(np.int64), valid, layout.arrow)
        if column.type.data_type == DataType.BOOL:
            values = values != 0
        return pa.array(values, type=layout.arrow, mask=~valid if len(self.sparse) else None)

    def _varints(
        self,
        at: npt.NDArray[np.int64],
        end: npt.NDArray[np.int64],
        valid: npt.NDArray[np.bool_],
        index: int,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The varint at each position `at` (before `end`): its value and its length in bytes."""
        size = np.zeros(self.n, dtype=np.int64)
        used = np.zeros(self.n, dtype=np.int64)
        done = ~valid
        for k in range(MAX_VARINT_BYTES):
            inside = at + k < end
            byte = self.buf[np.where(inside, at + k, 0)].astype(np.int64)
            take = ~done & inside
            size |= np.where(take, (byte & 0x7F) << (7 * k), 0)
            used += take
            done |= take & (byte < 0x80)
        self._check(done, "a malformed string length", index)
        return size, used

    def _variable(
        self,
        index: int,
        offsets: npt.NDArray[np.int64],
        valid: npt.NDArray[np.bool_],
        arrow: pa.DataType,
    ) -> pa.Array:
        """Strings or binaries: a varint length and the bytes, where each row's offset says."""
        lengths = self.ends - self.starts
        self._check(
            ~valid | ((offsets >= self.fixed_end) & (offsets < lengths)),
            "a string offset outside the row's variable part",
            index,
        )
        at = np.where(valid, self.starts + offsets, 0)
        end = np.where(valid, self.ends, 1)
        size = self.buf[at].astype(np.int64)  # a length under 128 is its one byte
        if ((size < 0x80) | ~valid).all():
            first = at + 1
        else:
            size, used = self._varints(at, end, valid, index)
            first = at + used
        self._check(~valid | (first + size <= end), "a string running past the row's end", index)
        # The values lie in row order, one inside each row, so their ends and the gaps between
        # them make the offsets of one binary array over the joined rows (no copy); taking its
        # even elements copies out just the values, in Arrow.
        first = np.where(valid, first, self.starts)
        bounds = np.empty(2 * self.n + 1, dtype=np.int64)
        bounds[0:-1:2] = first
        bounds[1:-1:2] = first + np.where(valid, size, 0)
        bounds[-1] = bounds[-2]
        spans = pa.Array.from_buffers(
            pa.large_binary(), 2 * self.n, [None, pa.py_buffer(bounds), pa.py_buffer(self.buf)]
        )
        picks = pa.array(np.arange(0, 2 * self.n, 2), mask=~valid)
        values = spans.take(picks)
        if arrow == values.type:
            return values
        try:
            return values.cast(arrow)
        except pa.ArrowInvalid as exc:
            name = self.columns[index].name
            raise InvalidArgument(
                f"contiguous rows: column {name!r}: a string that is not UTF-8 ({exc})"
            ) from None


__all__ = ["LAYOUTS", "check_column_descs", "decode_contiguous_rows"]
