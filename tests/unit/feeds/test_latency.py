"""Feed latency percentiles in bounded memory: within 3.2% of the exact values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.feeds import LatencyHistogram, Percentiles

RELATIVE_ERROR = 1 / 32  # 32 buckets per power of two

samples = st.lists(st.integers(0, 2**62), min_size=1, max_size=500)


def exact(values: list[int], q: float) -> int:
    ordered = sorted(values)
    rank = min(len(ordered), max(1, int(np.ceil(q * len(ordered)))))
    return ordered[rank - 1]


@settings(max_examples=200)
@given(values=samples, q=st.sampled_from([0.0, 0.01, 0.5, 0.95, 0.99, 1.0]))
def test_quantiles_are_within_the_bucket_error(values: list[int], q: float) -> None:
    histogram = LatencyHistogram()
    histogram.add_many(values)
    (found,) = histogram.quantiles([q])
    expected = exact(values, q)
    if expected < 32:
        assert found == expected  # small values are exact
    else:
        assert abs(found - expected) <= expected * RELATIVE_ERROR


@given(values=samples)
def test_every_way_of_adding_gives_the_same_histogram(values: list[int]) -> None:
    one_by_one, batched, appended, since = (LatencyHistogram() for _ in range(4))
    for value in values:
        one_by_one.add(value)
        appended.appender(value)
    appended.settle()
    batched.add_many(values)
    now = 2**62
    since.add_since([now - v for v in values], now)
    qs = [0.0, 0.25, 0.5, 0.9, 1.0]
    expected = batched.quantiles(qs)
    for histogram in (one_by_one, appended, since):
        assert histogram.count == len(values)
        assert histogram.quantiles(qs) == expected


def test_negative_samples_count_as_zero_and_empty_is_zeros() -> None:
    histogram = LatencyHistogram()
    assert histogram.percentiles() == Percentiles()
    assert histogram.sketch() == b""
    histogram.add_many([-5, -1])
    assert histogram.percentiles() == Percentiles(2, 0, 0, 0)


def test_memory_stays_bounded_with_many_samples() -> None:
    histogram = LatencyHistogram()
    for start in range(0, 1_000_000, 10_000):
        histogram.add_since(list(range(start, start + 10_000)), 2_000_000)
    assert histogram.count == 1_000_000
    assert len(histogram._stage) < 4096  # staged samples are folded in as they come
    p50 = histogram.percentiles().p50_ns
    assert abs(p50 - 1_500_000) <= 1_500_000 * RELATIVE_ERROR


def test_the_sketch_is_sorted_and_one_quantile_step_per_point() -> None:
    histogram = LatencyHistogram()
    histogram.add_many(list(range(1, 10_001)))
    sketch = np.frombuffer(histogram.sketch(101), dtype="<u8")
    assert len(sketch) == 101
    assert (np.diff(sketch.astype(np.int64)) >= 0).all()
    assert abs(int(sketch[50]) - 5000) <= 5000 * RELATIVE_ERROR


@settings(max_examples=200)
@given(values=st.lists(st.integers(-(2**40), 2**63 - 1), min_size=1, max_size=300))
def test_a_small_histogram_reads_its_staged_samples_as_the_folded_one_does(
    values: list[int],
) -> None:
    """Few samples are read without numpy: same buckets, so the same sketch and quantiles."""
    staged, folded = LatencyHistogram(), LatencyHistogram()
    for value in values:
        staged.add(value)
    folded.add_many(values)
    assert staged.count == folded.count == len(values)
    assert staged.sketch() == folded.sketch()
    assert staged.sketch(7) == folded.sketch(7)
    assert staged.percentiles() == folded.percentiles()


@settings(max_examples=100)
@given(values=st.lists(st.integers(0, 2**40), min_size=1, max_size=101), fold=st.booleans())
def test_a_sketch_of_few_samples_is_every_sample_bucketed(values: list[int], fold: bool) -> None:
    """A partition of a few dozen units sends its samples, not 101 quantiles of them."""
    histogram = LatencyHistogram()
    if fold:
        histogram.add_many(values)
    else:
        for value in values:
            histogram.add(value)
    sketch = np.frombuffer(histogram.sketch(101), dtype="<u8").tolist()
    assert len(sketch) == len(values)
    assert sketch == sorted(sketch)
    for got, value in zip(sketch, sorted(values), strict=True):
        assert abs(got - value) <= value * RELATIVE_ERROR
