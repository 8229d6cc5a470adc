"""Sort and top-k against pyarrow's sort_indices."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightfeed.errors import InvalidArgument, ResourceExhausted
from flightfeed.plan import Coalesce, MemoryScan, Sort, SortKey, call, col
from flightfeed.plan.nodes import sort as sort_module
from flightfeed.session import SessionStateBuilder

from .helpers import run, sample_table

pytestmark = pytest.mark.anyio


def reference(table: pa.Table, fetch: int | None = None) -> pa.Table:
    indices = pc.sort_indices(
        table,
        sort_keys=[
            ("k", "descending", "at_start"),
            ("v", "ascending", "at_end"),
            ("n", "ascending"),
        ],
    )
    ordered = table.take(indices)
    return ordered if fetch is None else ordered.slice(0, fetch)


KEYS = [
    SortKey(col("k"), descending=True, nulls_first=True),
    SortKey(col("v")),
    SortKey(col("n")),
]


@pytest.mark.parametrize("offload", [0, 1 << 40], ids=["thread", "inline"])
async def test_sort_matches_pyarrow(offload: int) -> None:
    table = sample_table(2000)
    got = await run(
        Sort(Coalesce(MemoryScan.from_table(table, 3, batch_rows=100)), KEYS), offload=offload
    )
    assert got.equals(reference(table))


@pytest.mark.parametrize("fetch", [0, 1, 10, 150, 5000])
async def test_top_k_matches_pyarrow(fetch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sort_module, "TOP_K_COMPACT_ROWS", 64)  # compact many times
    table = sample_table(3000)
    plan = Sort(Coalesce(MemoryScan.from_table(table, 4, batch_rows=50)), KEYS, fetch=fetch)
    assert (await run(plan)).equals(reference(table, fetch))


async def test_sort_is_per_partition() -> None:
    table = sample_table(100)
    plan = Sort(MemoryScan.from_table(table, 2), [SortKey(col("n"), descending=True)])
    got = (await run(plan)).column("n").to_pylist()
    assert got == list(range(49, -1, -1)) + list(range(99, 49, -1))


async def test_sort_by_expression() -> None:
    table = sample_table(300)
    plan = Sort(MemoryScan.from_table(table), [SortKey(call("negate", col("n")))])
    assert (await run(plan)).column("n").to_pylist() == list(range(299, -1, -1))


def test_sort_needs_keys() -> None:
    with pytest.raises(InvalidArgument):
        Sort(MemoryScan.from_table(sample_table(3)), [])


@pytest.mark.parametrize("fetch", [-1, 1 << 63, (1 << 64) - 1])
def test_a_fetch_arrow_cannot_count_is_refused(fetch: int) -> None:
    # (1 << 64) - 1 fits the wire's uint64 and failed later with OverflowError (INTERNAL).
    with pytest.raises(InvalidArgument, match="Sort fetch must be in"):
        Sort(MemoryScan.from_table(sample_table(3)), KEYS, fetch=fetch)


async def test_the_largest_fetch_sorts_everything() -> None:
    table = sample_table(300)
    plan = Sort(MemoryScan.from_table(table, 1), KEYS, fetch=sort_module.MAX_FETCH)
    assert (await run(plan)).equals(reference(table))


async def test_memory_budget_is_enforced() -> None:
    session = SessionStateBuilder().with_memory_budget(1000).build()
    plan = Sort(MemoryScan.from_table(sample_table(5000)), KEYS)
    with pytest.raises(ResourceExhausted, match="memory budget"):
        await run(plan, session)
