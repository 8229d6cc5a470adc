"""Join sizes known before the join: the count of matches is exact, against the join itself,
with duplicate and null keys on both sides."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.plan.join_size import CHEAP_BOUND_BYTES, estimate_join_bytes, matched_rows

keys = st.lists(st.one_of(st.none(), st.integers(0, 6)), max_size=60)
JOIN_TYPES = ["inner", "left outer", "right outer", "full outer", "left semi", "left anti"]


def tables(left: list[int | None], right: list[int | None]) -> tuple[pa.Table, pa.Table]:
    return (
        pa.table({"a": pa.array(left, pa.int64()), "x": pa.array(range(len(left)), pa.int64())}),
        pa.table({"b": pa.array(right, pa.int64()), "y": pa.array(range(len(right)), pa.int64())}),
    )


@settings(max_examples=200, deadline=None)
@given(keys, keys)
def test_matched_rows_is_the_inner_join_size(
    left: list[int | None], right: list[int | None]
) -> None:
    lt, rt = tables(left, right)
    inner = lt.join(rt, "a", "b", join_type="inner")
    assert matched_rows(lt, rt, ["a"], ["b"]) == inner.num_rows


@settings(max_examples=100, deadline=None)
@given(keys, keys, st.sampled_from(JOIN_TYPES))
def test_the_estimate_covers_the_output(
    left: list[int | None], right: list[int | None], join_type: str
) -> None:
    lt, rt = tables(left, right)
    out = lt.join(rt, "a", "b", join_type=join_type, coalesce_keys=False)
    assert estimate_join_bytes(lt, rt, ["a"], ["b"], join_type) >= out.nbytes


def test_multi_column_keys_count_only_full_matches() -> None:
    lt = pa.table({"a": [1, 1, 2, None], "c": ["x", "y", "x", "x"]})
    rt = pa.table({"b": [1, 1, 1, 2], "d": ["x", "x", "y", "y"]})
    assert matched_rows(lt, rt, ["a", "c"], ["b", "d"]) == 3


def test_a_huge_join_is_counted_from_its_keys_not_its_worst_case() -> None:
    """20,000 x 20,000 rows with one key: 400 million rows, and nothing is joined to know it."""
    n = 20_000
    lt, rt = tables([7] * n, [7] * n)
    assert lt.num_rows * rt.num_rows * 32 > CHEAP_BOUND_BYTES
    assert matched_rows(lt, rt, ["a"], ["b"]) == n * n
    assert estimate_join_bytes(lt, rt, ["a"], ["b"], "inner") >= n * n * 32
    distinct = tables(list(range(n)), list(range(n)))
    assert estimate_join_bytes(*distinct, ["a"], ["b"], "inner") < 4 * (lt.nbytes + rt.nbytes)


def test_an_outer_join_with_an_empty_side_counts_the_null_columns_it_adds() -> None:
    """An empty side measures 0 bytes a row, yet the outer rows get its columns, null: 539
    estimated bytes for a 553-byte output (found by the property above)."""
    lt, rt = tables([None] * 17, [])
    for join_type in ("left outer", "full outer"):
        out = lt.join(rt, "a", "b", join_type=join_type, coalesce_keys=False)
        assert estimate_join_bytes(lt, rt, ["a"], ["b"], join_type) >= out.nbytes
    wide = pa.table({"b": pa.array([], pa.int64()), "s": pa.array([], pa.large_string())})
    out = lt.join(wide, "a", "b", join_type="left outer", coalesce_keys=False)
    assert estimate_join_bytes(lt, wide, ["a"], ["b"], "left outer") >= out.nbytes
