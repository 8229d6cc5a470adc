"""Feed latency percentiles in bounded memory: a log-linear histogram of nanosecond samples.

Feeds may run for millions of units, so samples are never kept: each lands in one of 1,920
buckets (32 per power of two, under 3.2% relative error), added a whole batch at a time with
numpy. Single samples are staged in an array and folded in when it fills. Most histograms
never fill it (a partition of a few dozen units): their quantiles are read from the sorted
staged samples in plain Python, bucketed the same way, as numpy's per-call overhead would
cost more than the work.
"""

from __future__ import annotations

import functools
import math
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_SUB_BITS = 5
_SUB = 1 << _SUB_BITS
_BUCKETS = (64 - _SUB_BITS + 1) * _SUB
_STAGE = 4096


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Latency percentiles in nanoseconds (0 when there were no samples)."""

    count: int = 0
    p50_ns: int = 0
    p95_ns: int = 0
    p99_ns: int = 0


def _bucket_indexes(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Bucket of each non-negative value: exact below 32, else 32 sub-buckets per octave."""
    v = values.astype(np.uint64)
    exp = np.zeros(v.shape, dtype=np.int64)
    big = v >= _SUB
    if big.any():
        # floor(log2) through float64 can be off by one near powers of two: corrected below.
        e = np.floor(np.log2(v[big].astype(np.float64))).astype(np.int64)
        e -= (v[big] >> e.astype(np.uint64)) == 0
        e += (v[big] >> e.astype(np.uint64)) >= 2
        exp[big] = e
    shift = np.maximum(exp - _SUB_BITS, 0).astype(np.uint64)
    mantissa = (v >> shift).astype(np.int64)
    return np.where(big, (exp - _SUB_BITS + 1) * _SUB + (mantissa - _SUB), mantissa)


def _bucket_index(value: int) -> int:
    """`_bucket_indexes` for one value, exactly (integer arithmetic, no log2)."""
    if value < _SUB:
        return max(value, 0)
    exp = value.bit_length() - 1
    return (exp - _SUB_BITS + 1) * _SUB + ((value >> (exp - _SUB_BITS)) - _SUB)


def _bucketed(value: int) -> int:
    """`_bucket_value(_bucket_index(value))` in one step (a sketch bucket's every sample)."""
    if value < _SUB:
        return max(value, 0)
    shift = value.bit_length() - 1 - _SUB_BITS
    return ((value >> shift) << shift) + ((1 << shift) >> 1)


def _bucket_value(index: int) -> int:
    """A representative value (the middle) of a bucket."""
    if index < _SUB:
        return index
    octave, sub = divmod(index, _SUB)
    shift = octave - 1
    low = (_SUB + sub) << shift
    return low + ((1 << shift) >> 1)


class LatencyHistogram:
    """Counts of latency samples; negative samples (clock skew between hosts) count as 0."""

    __slots__ = ("_counts", "_stage")

    def __init__(self) -> None:
        # Buckets are allocated with the first sample: a task declares a histogram or two per
        # feed partition, most of which may never see a unit.
        self._counts: npt.NDArray[np.int64] | None = None
        self._stage = array("q")

    def add(self, nanos: int) -> None:
        """One sample; cheap (an append), folded in batches."""
        self._stage.append(nanos)
        if len(self._stage) >= _STAGE:
            self._fold()

    @property
    def appender(self) -> Callable[[int], None]:
        """`append` of the staging array, for hot loops; call `settle()` now and then."""
        return self._stage.append

    def settle(self) -> None:
        """Fold staged samples once enough have accumulated (bounds the staging memory)."""
        if len(self._stage) >= _STAGE:
            self._fold()

    def add_since(self, created_ns: Sequence[int], now_ns: int) -> None:
        """The latencies from each creation time to `now_ns` (one C-level pass)."""
        self._stage.extend(map(now_ns.__sub__, created_ns))
        if len(self._stage) >= _STAGE:
            self._fold()

    def add_many(self, nanos: npt.ArrayLike) -> None:
        """Many samples at once."""
        values = np.maximum(np.asarray(nanos, dtype=np.int64), 0)
        if values.size:
            if self._counts is None:
                self._counts = np.zeros(_BUCKETS, dtype=np.int64)
            np.add.at(self._counts, _bucket_indexes(values), 1)

    def _fold(self) -> None:
        if self._stage:
            self.add_many(np.frombuffer(self._stage, dtype=np.int64).copy())
            del self._stage[:]

    @property
    def count(self) -> int:
        folded = 0 if self._counts is None else int(self._counts.sum())
        return folded + len(self._stage)

    def quantiles(self, qs: Sequence[float]) -> list[int]:
        """The value at each quantile q in [0, 1] (bucket midpoints); zeros when empty."""
        if self._counts is None:
            return self._staged_quantiles(qs)
        self._fold()
        total = int(self._counts.sum())
        if not total:
            return [0] * len(qs)
        cumulative = np.cumsum(self._counts)
        ranks = np.ceil(np.asarray(qs, dtype=np.float64) * total)
        ranks = np.minimum(total, np.maximum(1, ranks)).astype(np.int64)
        return [_bucket_value(int(i)) for i in np.searchsorted(cumulative, ranks)]

    def _staged_quantiles(self, qs: Sequence[float]) -> list[int]:
        """Quantiles of the staged samples alone: the same buckets as the folded path (the
        rank-th sample's bucket is where the cumulative count reaches the rank)."""
        total = len(self._stage)
        if not total:
            return [0] * len(qs)
        ordered = sorted(self._stage)
        ranks = _ranks(total, tuple(qs))
        return [_bucketed(ordered[rank - 1]) for rank in ranks]

    def _every_sample(self) -> list[int]:
        """Every sample, sorted, as its bucket's value."""
        if self._counts is None:
            return [*map(_bucketed, sorted(self._stage))]
        self._fold()
        assert self._counts is not None
        buckets = np.flatnonzero(self._counts)
        return [_bucket_value(int(i)) for i in np.repeat(buckets, self._counts[buckets])]

    def percentiles(self) -> Percentiles:
        p50, p95, p99 = self.quantiles((0.5, 0.95, 0.99))
        return Percentiles(self.count, p50, p95, p99)

    def sketch(self, points: int = 101) -> bytes:
        """Sorted samples, packed little-endian uint64 (PercentileLatency.sketch_bytes): every
        sample when there are at most `points`, else the samples at `points` evenly spaced
        quantiles. Either way a percentile read from it matches the histogram's to within one
        quantile step. Most partitions see a few dozen units: sent whole, they cost neither
        101 quantiles to compute nor 101 values to send.
        """
        count = self.count
        if not count:
            return b""
        values = self._every_sample() if count <= points else self.quantiles(_spaced(points))
        return struct.pack(f"<{len(values)}Q", *values)


@functools.lru_cache(maxsize=64)
def _spaced(points: int) -> tuple[float, ...]:
    """`points` evenly spaced quantiles from 0 to 1."""
    return tuple(i / (points - 1) for i in range(points)) if points > 1 else (1.0,)


@functools.lru_cache(maxsize=4096)
def _ranks(total: int, qs: tuple[float, ...]) -> tuple[int, ...]:
    """The 1-based rank of the sample at each quantile of `total` (as the folded path ranks)."""
    return tuple(min(total, max(1, math.ceil(q * total))) for q in qs)
