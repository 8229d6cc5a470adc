"""Sums fail on overflow instead of wrapping (Arrow's own kernels wrap: four 2^62 sum to 0).

The reference is Python's exact arithmetic: a sum is returned exactly when every group's exact
sum fits the sum's type, and equals it; otherwise the query fails with a DataError."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import DataError
from flightfeed.plan import AggregateMode, Coalesce, HashAggregate, MemoryScan, agg, col
from flightfeed.plan.checked_sum import widen_for_sum

from .helpers import run

pytestmark = pytest.mark.anyio

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
DECIMAL38_MAX = 10**38 - 1


def _exact_sums(keys: list[int], values: list[int | None]) -> dict[int, int | None]:
    sums: dict[int, int | None] = defaultdict(lambda: None)
    for key, value in zip(keys, values, strict=True):
        if value is not None:
            sums[key] = (sums[key] or 0) + value
        else:
            sums.setdefault(key, None)
    return dict(sums)


def _grouped_sum(table: pa.Table, partitions: int = 1, *, two_steps: bool = False) -> HashAggregate:
    source = MemoryScan.from_table(table, partitions)
    keys, sums = [(col("k"), "k")], [agg("sum", col("v"), name="s")]
    if not two_steps:  # (over one partition: a SINGLE aggregate sums each partition apart)
        return HashAggregate(Coalesce(source), keys, sums)
    partial = HashAggregate(source, keys, sums, mode=AggregateMode.PARTIAL)
    return HashAggregate(Coalesce(partial), keys, sums, mode=AggregateMode.FINAL)


def _as_dict(table: pa.Table) -> dict[int, object]:
    return dict(zip(table.column("k").to_pylist(), table.column("s").to_pylist(), strict=True))


async def test_arrows_own_sum_wraps_so_a_query_must_not_use_it_unchecked() -> None:
    # The finding: four values of 2^62 summed to 0, and no error.
    table = pa.table({"k": [1] * 4, "v": pa.array([1 << 62] * 4, pa.int64())})
    assert table.group_by("k").aggregate([("v", "sum")]).column("v_sum").to_pylist() == [0]
    with pytest.raises(DataError, match=r"sum 's\[sum\]' overflows int64"):
        await run(_grouped_sum(table))


async def test_a_38_digit_decimal_sum_that_overflows_fails_and_one_that_fits_is_exact() -> None:
    big = Decimal("9" * 38)
    overflowing = pa.table({"k": [1, 1, 1], "v": pa.array([big] * 3, pa.decimal128(38, 0))})
    with pytest.raises(DataError, match=r"overflows decimal128\(38, 0\)"):
        await run(_grouped_sum(overflowing))
    # Large values that cancel: the widened sum is exact and fits.
    values = [big, big.copy_negate(), big]  # (exact: unary minus rounds to 28 digits)
    cancelling = pa.table({"k": [1, 1, 2], "v": pa.array(values, pa.decimal128(38, 0))})
    got = await run(_grouped_sum(cancelling))
    assert got.schema.field("s").type == pa.decimal128(38, 0)
    assert _as_dict(got) == {1: Decimal(0), 2: big}


async def test_a_global_sum_of_one_constant_group_is_checked_too() -> None:
    """The one-group shortcut (scalar kernels, no Acero) goes through the same check."""
    table = pa.table({"k": [7] * 3, "v": pa.array([INT64_MAX, INT64_MAX, -5], pa.int64())})
    with pytest.raises(DataError, match="overflows int64"):
        await run(_grouped_sum(table))


async def test_partial_sums_that_fit_but_whose_total_does_not_fail_in_the_final_step() -> None:
    # Four partitions of two rows: each partial sum is 2^62, their total 2^64.
    table = pa.table({"k": [1] * 8, "v": pa.array([1 << 61] * 8, pa.int64())})
    with pytest.raises(DataError, match=r"overflows int64"):
        await run(_grouped_sum(table, 4, two_steps=True))


signed_values = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([INT64_MIN, INT64_MAX, 1 << 62, -(1 << 62), 0]),
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 3), st.one_of(st.none(), signed_values)), min_size=1, max_size=12
    ),
    partitions=st.integers(1, 3),
    two_steps=st.booleans(),
)
async def test_int64_sums_are_exact_or_fail(
    rows: list[tuple[int, int | None]], partitions: int, two_steps: bool
) -> None:
    keys, values = [k for k, _ in rows], [v for _, v in rows]
    table = pa.table({"k": keys, "v": pa.array(values, pa.int64())})
    exact = _exact_sums(keys, values)
    fits = all(s is None or INT64_MIN <= s <= INT64_MAX for s in exact.values())
    plan = _grouped_sum(table, partitions, two_steps=two_steps)
    if not fits:
        with pytest.raises(DataError, match="overflows int64"):
            await run(plan)
        return
    try:
        got = await run(plan)
    except DataError:
        # Only a partial sum of one partition may overflow where the total does not.
        assert partitions > 1
        return
    assert got.schema.field("s").type == pa.int64()
    assert _as_dict(got) == exact


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(0, UINT64_MAX)), min_size=1, max_size=8),
)
async def test_uint64_sums_are_exact_or_fail(values: list[int | None]) -> None:
    table = pa.table({"k": [0] * len(values), "v": pa.array(values, pa.uint64())})
    exact = _exact_sums([0] * len(values), values)[0]
    if exact is not None and exact > UINT64_MAX:
        with pytest.raises(DataError, match="overflows uint64"):
            await run(_grouped_sum(table))
        return
    got = await run(_grouped_sum(table))
    assert got.schema.field("s").type == pa.uint64()
    assert _as_dict(got) == {0: exact}


decimal_digits = st.integers(-DECIMAL38_MAX, DECIMAL38_MAX) | st.sampled_from(
    [DECIMAL38_MAX, -DECIMAL38_MAX, 10**37]
)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 2), decimal_digits), min_size=1, max_size=8),
    scale=st.sampled_from([0, 2, 10]),
)
async def test_decimal128_sums_are_exact_or_fail(rows: list[tuple[int, int]], scale: int) -> None:
    keys = [k for k, _ in rows]
    unscaled = [v for _, v in rows]
    values = [Decimal(f"{v}E-{scale}") for v in unscaled]  # exact (scaleb rounds to 28 digits)
    table = pa.table({"k": keys, "v": pa.array(values, pa.decimal128(38, scale))})
    exact = _exact_sums(keys, list(unscaled))
    if any(s is not None and abs(s) > DECIMAL38_MAX for s in exact.values()):
        with pytest.raises(DataError, match="overflows decimal128"):
            await run(_grouped_sum(table))
        return
    got = await run(_grouped_sum(table))
    assert got.schema.field("s").type == pa.decimal128(38, scale)
    want = {k: None if s is None else Decimal(f"{s}E-{scale}") for k, s in exact.items()}
    assert _as_dict(got) == want


def test_columns_whose_sums_cannot_overflow_are_summed_as_they_are() -> None:
    """The check converts nothing in the common case: small values, narrow decimals."""
    assert widen_for_sum(pa.array(list(range(1000)), pa.int64())) is None
    assert widen_for_sum(pa.array([Decimal("1.5")] * 10, pa.decimal128(18, 1))) is None
    assert widen_for_sum(pa.array([1.0e308] * 3)) is None  # floats overflow to inf, as IEEE says
    widened = widen_for_sum(pa.array([1 << 62] * 3, pa.int64()))
    assert widened is not None
    assert widened.sum_type == pa.int64()


async def test_a_mean_of_integers_whose_sum_passes_int64_is_right() -> None:
    """Six epoch-nanosecond values sum past int64: their mean is summed in doubles."""
    nanos = [1_700_000_000_000_000_000 + i for i in range(6)]
    table = pa.table({"k": [0] * 6, "v": pa.array(nanos, pa.int64())})
    plan = HashAggregate(
        Coalesce(MemoryScan.from_table(table, 3)),
        [(col("k"), "k")],
        [agg("mean", col("v"), name="m")],
    )
    got = (await run(plan)).column("m").to_pylist()
    assert got == [pytest.approx(sum(nanos) / 6, rel=1e-15)]
