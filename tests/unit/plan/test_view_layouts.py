"""Plans over string and binary view columns give what the same plans give over the plain
layouts: Arrow C++ has no filter, take or sort kernel for views (a Filter failed with INTERNAL
"array_take has no kernel matching input types (string_view, uint16)") and Acero's join takes
none (refused), so flightfeed.plan.view_layouts takes such batches through the plain layouts
and back."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest

from flightfeed.plan import (
    AggregateMode,
    ExecutionPlan,
    Filter,
    HashAggregate,
    HashJoin,
    MemoryScan,
    Partitioning,
    Repartition,
    Sort,
    SortKey,
    agg,
    call,
    col,
    lit,
)
from flightfeed.plan.view_layouts import filter_rows, sort_indices, take_rows

from .helpers import run, sorted_rows

pytestmark = pytest.mark.anyio

PLAIN = pa.table(
    {
        "s": pa.array(
            [None if i % 11 == 0 else f"key-{i % 7}-with-a-long-tail" for i in range(300)]
        ),
        "b": pa.array([bytes([i % 5]) * (i % 20) for i in range(300)]),
        "inner": pa.array(
            [{"t": f"t{i % 3}"} for i in range(300)], pa.struct([("t", pa.string())])
        ),
        "n": pa.array(range(300), pa.int64()),
    }
)
VIEWS = PLAIN.cast(
    pa.schema(
        [
            ("s", pa.string_view()),
            ("b", pa.binary_view()),
            ("inner", pa.struct([("t", pa.string_view())])),
            ("n", pa.int64()),
        ]
    )
)

Plan = Callable[[pa.Table], ExecutionPlan]
PLANS: dict[str, Plan] = {
    "filter": lambda t: Filter(
        MemoryScan.from_table(t, 2, batch_rows=64),
        call("and", call("greater", col("n"), lit(20)), call("is_valid", col("s"))),
    ),
    "sort by a view": lambda t: Sort(
        MemoryScan.from_table(t, 1, batch_rows=64),
        [SortKey(col("s"), descending=True), SortKey(col("n"))],
    ),
    "top-k": lambda t: Sort(
        MemoryScan.from_table(t, 1, batch_rows=64), [SortKey(col("b")), SortKey(col("n"))], fetch=9
    ),
    "repartition by a view": lambda t: Repartition(
        MemoryScan.from_table(t, 2, batch_rows=50), Partitioning((col("s"),), 3)
    ),
    "aggregate by a view": lambda t: HashAggregate(
        MemoryScan.from_table(t, 2, batch_rows=64),
        [(col("s"), "s")],
        [agg("count", col("n"), name="rows"), agg("sum", col("n"), name="total")],
        mode=AggregateMode.SINGLE,
    ),
    "join on a view key": lambda t: HashJoin(
        MemoryScan.from_table(t.drop_columns(["inner"]), 1, batch_rows=64),  # (Acero: no structs)
        MemoryScan.from_table(right_keys(t), 1),
        [("s", "rs")],
        "inner",
    ),
    "outer join with view payloads": lambda t: HashJoin(
        MemoryScan.from_table(t.drop_columns(["inner"]), 1, batch_rows=64),  # (Acero: no structs)
        MemoryScan.from_table(right_keys(t), 1),
        [("n", "rn")],
        "full outer",
    ),
    "semi join on a view key": lambda t: HashJoin(
        MemoryScan.from_table(t.drop_columns(["inner"]), 1, batch_rows=64),  # (Acero: no structs)
        MemoryScan.from_table(right_keys(t), 1),
        [("s", "rs")],
        "left semi",
    ),
}


def right_keys(side: pa.Table) -> pa.Table:
    """Three of the keys, in `side`'s layout."""
    keys = pa.table(
        {
            "rs": [f"key-{i}-with-a-long-tail" for i in (1, 3, 9)],
            "rn": pa.array([1, 3, 900], pa.int64()),
        }
    )
    return keys.cast(pa.schema([("rs", side.schema.field("s").type), ("rn", pa.int64())]))


def plain(table: pa.Table) -> pa.Table:
    """The table in the plain layouts, to compare."""
    return table.cast(
        pa.schema(
            [
                f.with_type(
                    {
                        pa.string_view(): pa.string(),
                        pa.binary_view(): pa.binary(),
                        pa.struct([("t", pa.string_view())]): pa.struct([("t", pa.string())]),
                    }.get(f.type, f.type)
                )
                for f in table.schema
            ]
        )
    )


@pytest.mark.parametrize("name", PLANS)
async def test_a_plan_over_views_gives_what_it_gives_over_plain_strings(name: str) -> None:
    got = await run(PLANS[name](VIEWS), offload=0)
    want = await run(PLANS[name](PLAIN), offload=0)
    assert got.schema == PLANS[name](VIEWS).schema  # the layouts it declares, views kept
    ordered = name.startswith(("sort", "top"))
    if ordered:
        assert plain(got).to_pylist() == want.to_pylist()
    else:
        assert sorted_rows(plain(got)) == sorted_rows(want)
    assert got.num_rows > 0


def test_batches_without_views_take_the_fast_path_and_errors_stay() -> None:
    batch = pa.record_batch({"n": [3, 1, 2]})
    assert filter_rows(batch, pa.array([True, False, True])).column("n").to_pylist() == [3, 2]
    assert take_rows(batch, pa.array([2, 0])).column("n").to_pylist() == [2, 3]
    assert sort_indices(batch, [("n", "ascending", "at_end")]).to_pylist() == [1, 2, 0]
    odd = pa.record_batch({"m": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64()))})
    with pytest.raises(pa.ArrowNotImplementedError):  # not a view: Arrow's own refusal stands
        sort_indices(odd, [("m", "ascending", "at_end")])
