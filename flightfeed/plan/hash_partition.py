"""Deterministic hash partitioning: equal keys land in the same partition in every process.

pyarrow.compute has no hash kernel (and Arrow's internal hashing is not a stable contract), so
row hashes are computed here with vectorized numpy over Arrow buffers, with fixed constants and
no seed: the same key values give the same partition on every machine, run and Python version.

How a row hashes, for key columns k1..km: `h = SEED; h = mix(h * K ^ hash(ki))` per column;
the partition is `h % n`. `mix` is the splitmix64 finalizer. Per column value:
- integers, booleans, dates, times, timestamps, durations: the value as int64 (so int32 and
  int64 keys of equal value hash alike), then mixed;
- floats: the float64 bits, with -0.0 folded into 0.0 and every NaN into one NaN;
- strings, binaries (any width and view), fixed-size binaries, decimals (via their text):
  a polynomial hash of the bytes mod 2**64 combined with the length;
- dictionaries and run-end encoded arrays hash their decoded values; nulls hash to a constant.
Other types (nested, intervals) are rejected with InvalidArgument.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from .expr import Expr, evaluate
from .functions import FunctionRegistry
from .layouts import take_rows

_SEED = np.uint64(0x243F6A8885A308D3)
_K = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x5851F42D4C957F2D)
_NAN_BITS = np.uint64(0x7FF8000000000000)
_BYTE_BASE = np.uint64(0x100000001B3)  # odd, so no information is lost to the modulus
_CHUNK_BYTES = 1 << 22  # bound the transient memory of string hashing (~24 bytes per byte)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, wrapping mod 2**64."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def _int_bits(array: pa.Array) -> np.ndarray:
    t = array.type
    if pa.types.is_temporal(t):
        array = array.view(pa.int32() if t.bit_width == 32 else pa.int64())
    values = pc.cast(array, pa.int64(), safe=False).fill_null(0)
    bits: np.ndarray = values.to_numpy().view(np.uint64)
    return bits


def _float_bits(array: pa.Array) -> np.ndarray:
    values: np.ndarray = pc.cast(array, pa.float64()).fill_null(0.0).to_numpy() + 0.0  # -0.0 -> 0.0
    bits: np.ndarray = values.view(np.uint64).copy()
    bits[np.isnan(values)] = _NAN_BITS
    return bits


def _bytes_hash(array: pa.Array) -> np.ndarray:
    """Polynomial hash of every value's bytes, combined with its length (large_binary input)."""
    n = len(array)
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=n + 1, offset=array.offset * 8)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0)
    lengths = np.diff(offsets)
    sums = np.zeros(n, dtype=np.uint64)
    longest = int(lengths.max()) if n else 0
    powers = np.ones(max(longest, 1), dtype=np.uint64)  # powers[j] = BASE**j mod 2**64
    powers[1:] = np.cumprod(np.full(len(powers) - 1, _BYTE_BASE, dtype=np.uint64))
    row = 0
    while row < n:
        # Rows [row, stop) hold about _CHUNK_BYTES of data (at least one row).
        stop = int(np.searchsorted(offsets, offsets[row] + _CHUNK_BYTES, side="right")) - 1
        stop = min(max(stop, row + 1), n)
        starts = offsets[row:stop]
        lens = lengths[row:stop]
        chunk = data[offsets[row] : offsets[stop]].astype(np.uint64)
        if len(chunk):
            local = np.arange(len(chunk), dtype=np.int64) - np.repeat(starts - starts[0], lens)
            contributions = chunk * powers[local]
            nonempty = lens > 0
            sums[row:stop][nonempty] = np.add.reduceat(
                contributions, (starts - starts[0])[nonempty]
            )
        row = stop
    return _mix(sums ^ _mix(lengths.astype(np.uint64)))


def column_hash(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A uint64 hash per value, stable across processes (see the module docstring)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_run_end_encoded(t):
        array = pc.run_end_decode(array)
        t = array.type
    if pa.types.is_dictionary(t):
        array = array.dictionary_decode()
        t = array.type
    if pa.types.is_null(t):
        return np.full(len(array), _NULL, dtype=np.uint64)
    if pa.types.is_interval(t):  # (temporal, but 16 bytes: months, days, nanoseconds)
        hashed = _bytes_hash(pc.cast(array.view(pa.binary(16)), pa.large_binary()))
    elif pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t):
        hashed = _mix(_int_bits(array))
    elif pa.types.is_floating(t):
        hashed = _mix(_float_bits(array))
    elif pa.types.is_decimal(t):
        hashed = _bytes_hash(pc.cast(pc.cast(array, pa.string()), pa.large_binary()))
    elif (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary_view(t)
    ):
        hashed = _bytes_hash(pc.cast(array, pa.large_binary()))
    else:
        raise InvalidArgument(f"cannot hash-partition on a key of type {t}")
    if array.null_count:
        hashed[array.is_null().to_numpy(zero_copy_only=False)] = _NULL
    return hashed


def hash_rows(arrays: Sequence[pa.Array | pa.ChunkedArray], num_rows: int) -> np.ndarray:
    """One uint64 hash per row over the key columns, stable across processes."""
    hashed = np.full(num_rows, _SEED, dtype=np.uint64)
    for array in arrays:
        hashed = _mix((hashed * _K) ^ column_hash(array))
    return hashed


def partition_ids(
    batch: pa.RecordBatch, key_exprs: Sequence[Expr], n: int, session: FunctionRegistry
) -> np.ndarray:
    """The output partition of every row: hash of the key values mod `n`."""
    if n < 1:
        raise InvalidArgument(f"partition count must be at least 1, got {n}")
    if not key_exprs:
        raise InvalidArgument("hash partitioning needs at least one key expression")
    keys = [evaluate(expr, batch, session) for expr in key_exprs]
    return hash_rows(keys, batch.num_rows) % np.uint64(n)


def hash_partition(
    batch: pa.RecordBatch, key_exprs: Sequence[Expr], n: int, session: FunctionRegistry
) -> list[pa.RecordBatch]:
    """Split `batch` into `n` batches by key hash; rows keep their relative order.

    Every row lands in exactly one output; outputs may be empty. One `take` reorders the batch
    by partition, then each output is a zero-copy slice of it.
    """
    ids = partition_ids(batch, key_exprs, n, session)
    if n == 1:
        return [batch]
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids.astype(np.int64), minlength=n)
    ordered = take_rows(batch, pa.array(order))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return [ordered.slice(int(s), int(c)) for s, c in zip(starts, counts, strict=True)]
