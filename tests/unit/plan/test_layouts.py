"""Plans over layouts some Arrow kernels lack give what the same plans give over plain columns
(flightfeed.plan.layouts): string and binary views (no filter, take or sort kernel: a Filter
failed with INTERNAL "array_take has no kernel matching input types (string_view, uint16)"),
also nested in lists, fixed-size lists, maps and structs; run-end encoded columns (no take);
dictionaries that differ from batch to batch (Acero's join takes one per column); a dictionary
among several sort keys, and a half float key; runs as group and partitioning keys, and min
and max of views, dictionaries and runs ("Keys of type run_end_encoded" and "hash_min_max has
no kernel matching input types (string_view, uint32)" before), and comparisons, is_in and
casts of runs, as in a filter Spark pushes ("'greater' has no kernel"). What Arrow cannot do
at all is refused when the plan is built, by name. Python values do not depend on the layout:
rows compare as they are."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightfeed.errors import InvalidArgument
from flightfeed.plan import (
    AggregateMode,
    CodecRegistry,
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
    collect_partition,
    decode_plan,
    encode_plan,
    from_table,
    lit,
    open_task_context,
)
from flightfeed.plan.layouts import filter_rows, sort_indices, take_rows
from flightfeed.session import Session

from .helpers import run, sorted_rows

pytestmark = pytest.mark.anyio

ROWS = 300
KEYS = [None if i % 11 == 0 else f"key-{i % 7}-with-a-long-tail" for i in range(ROWS)]


def dictionaries(values: Sequence[str | None], index: pa.DataType) -> pa.ChunkedArray:
    """`values` in two chunks, each with a dictionary of its own."""
    half = len(values) // 2
    return pa.chunked_array(
        [pa.array(part).dictionary_encode().cast(pa.dictionary(index, pa.string()))
         for part in (values[:half], values[half:])]
    )  # fmt: skip


PLAIN = pa.table(
    {
        "s": KEYS,
        "b": [bytes([i % 5]) * (i % 20) for i in range(ROWS)],
        "inner": pa.array([{"t": f"t{i % 3}"} for i in range(ROWS)]),
        "pair": pa.array([[f"p{i % 4}", None] for i in range(ROWS)], pa.list_(pa.string(), 2)),
        "tags": pa.array(
            [[(f"k{i % 2}", f"v{i % 5}")] for i in range(ROWS)], pa.map_(pa.string(), pa.string())
        ),
        "run": pa.array([i // 50 for i in range(ROWS)], pa.int64()),
        "d": KEYS,
        "h": pa.array([(i % 9) / 4 - 1 for i in range(ROWS)], pa.float32()),
        "n": pa.array(range(ROWS), pa.int64()),
    }
)
EXOTIC = pa.table(
    {
        "s": PLAIN["s"].cast(pa.string_view()),
        "b": PLAIN["b"].cast(pa.binary_view()),
        "inner": PLAIN["inner"].cast(pa.struct([("t", pa.string_view())])),
        "pair": PLAIN["pair"].cast(pa.list_(pa.string_view(), 2)),
        "tags": PLAIN["tags"].cast(pa.map_(pa.string_view(), pa.string_view())),
        "run": pc.run_end_encode(PLAIN["run"].combine_chunks()),
        "d": dictionaries(KEYS, pa.int32()),
        "h": PLAIN["h"].cast(pa.float16()),
        "n": PLAIN["n"],
    }
)
RIGHT = pa.table(
    {
        "rs": [f"key-{i}-with-a-long-tail" for i in (1, 3, 9)],
        "rn": pa.array([1, 3, 900], pa.int64()),
    }
)


def scan(table: pa.Table, partitions: int = 1) -> MemoryScan:
    return MemoryScan.from_table(table, partitions, batch_rows=64)


def right(table: pa.Table, like: str = "s") -> MemoryScan:
    """RIGHT, its key in the layout of `table`'s column `like`."""
    layout = pa.schema([("rs", table.schema.field(like).type), ("rn", pa.int64())])
    return MemoryScan.from_table(RIGHT.cast(layout), 1)


def joinable(table: pa.Table) -> pa.Table:
    return table.drop_columns(["inner", "pair", "tags"])  # (Acero joins no nested column)


EXTREMES = [
    agg("min", col("s"), name="s"),
    agg("max", col("b"), name="b"),
    agg("min", col("d"), name="d"),
    agg("max", col("run"), name="top"),
    agg("sum", col("run"), name="total"),
    agg("count", col("d"), name="named"),
]
"""Arrow's min and max take no view, dictionary or runs, nor its sum runs: given their plain
values, a min or max of a view is a view again."""

Plan = Callable[[pa.Table], ExecutionPlan]
PLANS: dict[str, Plan] = {
    "filter": lambda t: Filter(
        scan(t, 2), call("and", call("greater", col("n"), lit(20)), call("is_valid", col("s")))
    ),
    "filter on runs": lambda t: Filter(  # (what a filter Spark pushes does: found by a probe)
        scan(t, 2),
        call(
            "or",
            call("greater", col("run"), lit(4)),
            call("is_in", col("run"), options=pc.SetLookupOptions(pa.array([1, 3]))),
        ),
    ),
    "filter on runs cast to text": lambda t: Filter(
        scan(t),
        call("equal", call("cast", col("run"), options=pc.CastOptions(pa.string())), lit("2")),
    ),
    "sort by a view": lambda t: Sort(
        scan(t), [SortKey(col("s"), descending=True), SortKey(col("n"))]
    ),
    "sort by a dictionary among keys": lambda t: Sort(
        scan(t), [SortKey(col("d")), SortKey(col("n"), descending=True)]
    ),
    "sort by a half float": lambda t: Sort(scan(t), [SortKey(col("h")), SortKey(col("n"))]),
    "top-k by a binary view": lambda t: Sort(
        scan(t), [SortKey(col("b")), SortKey(col("n"))], fetch=9
    ),
    "repartition by a view": lambda t: Repartition(scan(t, 2), Partitioning((col("s"),), 3)),
    "aggregate by a view": lambda t: HashAggregate(
        scan(t, 2),
        [(col("s"), "s")],
        [agg("count", col("n"), name="rows"), agg("sum", col("n"), name="total")],
        mode=AggregateMode.SINGLE,
    ),
    "repartition by runs": lambda t: Repartition(scan(t, 2), Partitioning((col("run"),), 3)),
    "aggregate by runs, min and max of every layout": lambda t: HashAggregate(
        scan(t, 2), [(col("run"), "run")], EXTREMES, mode=AggregateMode.SINGLE
    ),
    "two-step aggregate by runs": lambda t: HashAggregate(
        Repartition(
            HashAggregate(scan(t, 2), [(col("run"), "run")], EXTREMES, mode=AggregateMode.PARTIAL),
            Partitioning((col("run"),), 3),
        ),
        [(col("run"), "run")],
        EXTREMES,
        mode=AggregateMode.FINAL,
    ),
    "global min and max of every layout": lambda t: HashAggregate(
        scan(t, 2), [], EXTREMES, mode=AggregateMode.SINGLE
    ),
    "distinct runs": lambda t: from_table(t, 2).aggregate(["run"]).plan,
    "count of distinct runs": lambda t: (
        from_table(t, 2).aggregate([], [agg("count_distinct", col("run"), name="runs")]).plan
    ),
    "join on a view key": lambda t: HashJoin(scan(joinable(t)), right(t), [("s", "rs")], "inner"),
    "join on a dictionary key": lambda t: HashJoin(
        scan(joinable(t)), right(t, like="d"), [("d", "rs")], "inner"
    ),
    "outer join with views and runs": lambda t: HashJoin(
        scan(joinable(t)), right(t), [("n", "rn")], "full outer"
    ),
    "semi join on a view key": lambda t: HashJoin(
        scan(joinable(t)), right(t), [("s", "rs")], "left semi"
    ),
}


@pytest.mark.parametrize("name", PLANS)
async def test_a_plan_over_these_layouts_gives_what_it_gives_over_plain_ones(name: str) -> None:
    plan = PLANS[name](EXOTIC)
    got = await run(plan, offload=0)
    want = await run(PLANS[name](PLAIN), offload=0)
    assert got.schema == plan.schema  # the layouts it declares, kept
    if name.startswith(("sort", "top")):
        assert got.to_pylist() == want.to_pylist()
    else:
        assert sorted_rows(got) == sorted_rows(want)
    assert got.num_rows > 0


@pytest.mark.parametrize(
    "key",
    [
        pa.array([[1]], pa.list_(pa.int64())),
        pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
        pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval()),
    ],
    ids=lambda a: str(a.type),
)
def test_a_sort_key_arrow_cannot_order_is_refused_when_the_plan_is_built(key: pa.Array) -> None:
    """It was built, then failed once rows came (a worker answered INTERNAL)."""
    table = pa.table({"k": key, "n": [1]})
    with pytest.raises(InvalidArgument, match=rf"Sort cannot sort by k \({key.type}\)"):
        Sort(scan(table), [SortKey(col("n")), SortKey(col("k"))])


async def test_dictionaries_outgrowing_their_index_together_are_refused_by_name() -> None:
    """Two int8 dictionaries of 100 values each cannot be one: Sort said 'These dictionaries
    cannot be combined'; an aggregate that does not read the column is not concerned."""
    words = [f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)]
    table = pa.table({"d": dictionaries(words, pa.int8()), "n": range(200)})
    with pytest.raises(InvalidArgument, match=r"Sort: the dictionaries of d \(dictionary<"):
        await run(Sort(MemoryScan.from_table(table, 1), [SortKey(col("n"))]))
    counted = HashAggregate(
        MemoryScan.from_table(table, 1),
        [(call("bit_wise_and", col("n"), lit(1)), "odd")],
        [agg("count", name="rows")],
    )
    assert sorted_rows(await run(counted)) == [{"odd": 0, "rows": 100}, {"odd": 1, "rows": 100}]


async def test_a_union_column_rides_along_and_survives_the_codec() -> None:
    """A zero-row union could not be made with pa.array([]): every plan over one failed at
    build with 'sparse_union', and its MemoryScan at decode."""
    union = pa.UnionArray.from_sparse(
        pa.array([0, 1, 0], pa.int8()), [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])]
    )
    table = pa.table({"u": union, "n": [1, 2, 3]})
    plan = Filter(MemoryScan.from_table(table, 1), call("greater", col("n"), lit(1)))
    registry = CodecRegistry.builtin()
    again = decode_plan(encode_plan(plan, registry), registry, Session())
    assert (await run(again)).to_pylist() == [{"u": "b", "n": 2}, {"u": 3, "n": 3}]


async def test_an_interval_key_hash_partitions_by_its_value() -> None:
    """It failed at build: 'Can't view array of type month_day_nano_interval as int64'."""
    spans = [pa.MonthDayNano([i % 3, 1, 0]) for i in range(30)]
    table = pa.table({"i": pa.array(spans, pa.month_day_nano_interval()), "n": range(30)})
    plan = Repartition(MemoryScan.from_table(table, 2), Partitioning((col("i"),), 4))
    async with open_task_context(Session()) as ctx:
        outputs = [
            pa.Table.from_batches(await collect_partition(plan, p, ctx), plan.schema)
            for p in range(4)
        ]
    assert sum(out.num_rows for out in outputs) == 30
    owners: dict[object, int] = {}
    for index, out in enumerate(outputs):
        for value in out.column("i").to_pylist():
            assert owners.setdefault(value, index) == index  # one value, one partition


async def test_a_duration_key_whose_ends_are_equal_groups() -> None:
    """[5s, 0s, 5s]: the one-group check ran Arrow's min_max, which has no duration kernel."""
    table = pa.table({"k": pa.array([5, 0, 5], pa.duration("s")), "n": [1, 2, 3]})
    plan = HashAggregate(MemoryScan.from_table(table), [(col("k"), "k")], [agg("count", name="c")])
    got = sorted_rows(await run(plan))
    assert got == [
        {"k": datetime.timedelta(0), "c": 1},
        {"k": datetime.timedelta(seconds=5), "c": 2},
    ]


def test_batches_arrow_takes_as_they_are_take_the_fast_path_and_errors_stay() -> None:
    batch = pa.record_batch({"n": [3, 1, 2]})
    assert filter_rows(batch, pa.array([True, False, True])).column("n").to_pylist() == [3, 2]
    assert take_rows(batch, pa.array([2, 0])).column("n").to_pylist() == [2, 3]
    assert sort_indices(batch, [("n", "ascending", "at_end")]).to_pylist() == [1, 2, 0]
    odd = pa.record_batch({"m": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64()))})
    with pytest.raises(pa.ArrowNotImplementedError):  # no other layout: Arrow's refusal stands
        sort_indices(odd, [("m", "ascending", "at_end")])
