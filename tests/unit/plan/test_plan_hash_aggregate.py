"""HashAggregate in SINGLE, PARTIAL→FINAL (over Coalesce and Repartition) against pyarrow."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.errors import ExecutionError, InvalidArgument, UnknownUdfError
from flightfeed.plan import (
    AggregateExpr,
    AggregateMode,
    AggregateUdf,
    Coalesce,
    ExecutionPlan,
    HashAggregate,
    MemoryScan,
    Partitioning,
    PlanNodeBase,
    Repartition,
    agg,
    call,
    col,
    lit,
    open_task_context,
)
from flightfeed.plan.codec import CodecRegistry, DecodeContext
from flightfeed.plan.execution import collect
from flightfeed.plan.functions import PlanSession
from flightfeed.plan.memory import MemoryPool
from flightfeed.plan.nodes import hash_aggregate as hash_aggregate_module
from flightfeed.plan.nodes.hash_aggregate import HashAggregateCodec
from flightfeed.session import Session, SessionStateBuilder

from .helpers import run, sample_table, sorted_rows

pytestmark = pytest.mark.anyio

AGGREGATES = [
    agg("sum", col("v"), name="sum_v"),
    agg("count", col("v"), name="count_v"),
    agg("count", name="rows"),
    agg("min", col("v"), name="min_v"),
    agg("max", col("n"), name="max_n"),
    agg("mean", col("v"), name="mean_v"),
    agg("min", col("g"), name="min_g"),
]


def expected(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    out = table.group_by(list(keys)).aggregate(
        [
            ("v", "sum"),
            ("v", "count"),
            ([], "count_all"),
            ("v", "min"),
            ("n", "max"),
            ("v", "mean"),
            ("g", "min"),
        ]
    )
    return out.rename_columns(
        [*keys, "sum_v", "count_v", "rows", "min_v", "max_n", "mean_v", "min_g"]
    ).select([*keys, "sum_v", "count_v", "rows", "min_v", "max_n", "mean_v", "min_g"])


def canonical(table: pa.Table, keys: Sequence[str]) -> list[dict[str, object]]:
    rows = sorted_rows(table, keys)
    for row in rows:
        for name, value in row.items():
            if isinstance(value, float):
                row[name] = round(value, 9)
    return rows


def two_phase(
    child: ExecutionPlan,
    keys: Sequence[str],
    aggregates: Sequence[AggregateExpr],
    exchange: str,
    functions: PlanSession,
) -> ExecutionPlan:
    group_by = [(col(k), k) for k in keys]
    partial = HashAggregate(
        child, group_by, aggregates, mode=AggregateMode.PARTIAL, functions=functions
    )
    middle: ExecutionPlan = (
        Coalesce(partial)
        if exchange == "coalesce" or not keys
        else Repartition(partial, Partitioning(tuple(col(k) for k in keys), 3))
    )
    return HashAggregate(
        middle, group_by, aggregates, mode=AggregateMode.FINAL, functions=functions
    )


@pytest.mark.parametrize("keys", [["k"], ["k", "g"], []], ids=["one-key", "two-keys", "global"])
async def test_single_mode_matches_pyarrow(keys: list[str]) -> None:
    table = sample_table(3000)
    scan = MemoryScan.from_table(table, 1, batch_rows=97)  # > MERGE_EVERY_BATCHES batches
    plan = HashAggregate(scan, [(col(k), k) for k in keys], AGGREGATES)
    got = await run(plan)
    assert got.schema.names == [*keys, *(a.name for a in AGGREGATES)]
    assert canonical(got, keys) == canonical(expected(table, keys), keys)


@pytest.mark.parametrize("exchange", ["coalesce", "repartition"])
@pytest.mark.parametrize("keys", [["k"], ["g", "k"], []], ids=["one-key", "two-keys", "global"])
async def test_partial_then_final_matches_pyarrow(keys: list[str], exchange: str) -> None:
    table = sample_table(3000)
    scan = MemoryScan.from_table(table, 4, batch_rows=41)
    plan = two_phase(scan, keys, AGGREGATES, exchange, Session())
    got = await run(plan, offload=0)
    assert canonical(got, keys) == canonical(expected(table, keys), keys)


async def test_partial_output_is_one_row_per_group_and_partition() -> None:
    table = sample_table(500)
    plan = HashAggregate(
        MemoryScan.from_table(table, 2, batch_rows=10),
        [(col("g"), "g")],
        [agg("mean", col("v"), name="m")],
        mode=AggregateMode.PARTIAL,
    )
    assert plan.schema.names == ["g", "m[sum]", "m[count]"]
    got = await run(plan)
    assert got.num_rows == 6


async def test_expressions_as_keys_and_arguments() -> None:
    table = sample_table(400)
    plan = HashAggregate(
        MemoryScan.from_table(table, 1, batch_rows=33),
        [(call("utf8_upper", col("g")), "G")],
        [agg("sum", call("multiply", col("n"), lit(2)), name="s")],
    )
    exp = (
        pa.table({"G": pc.utf8_upper(table["g"]), "x": pc.multiply(table["n"], 2)})
        .group_by("G")
        .aggregate([("x", "sum")])
        .rename_columns(["G", "s"])
    )
    assert sorted_rows(await run(plan)) == sorted_rows(exp)


async def test_empty_input() -> None:
    empty = sample_table(0)
    keyed = HashAggregate(MemoryScan.from_table(empty), [(col("k"), "k")], AGGREGATES)
    assert (await run(keyed)).num_rows == 0
    global_ = HashAggregate(MemoryScan.from_table(empty), [], AGGREGATES)
    row = (await run(global_)).to_pylist()
    assert row == [
        {
            "sum_v": None,
            "count_v": 0,
            "rows": 0,
            "min_v": None,
            "max_n": None,
            "mean_v": None,
            "min_g": None,
        }
    ]
    two = two_phase(MemoryScan.from_table(empty, 2), [], AGGREGATES, "coalesce", Session())
    assert (await run(two)).to_pylist() == row


def sum_of_squares() -> AggregateUdf:
    """A vectorized UDAF: bincount over group ids, no loop over rows or groups."""

    def update(args: Sequence[pa.Array], ids: pa.Array, groups: int) -> list[pa.Array]:
        values = pc.fill_null(pc.cast(args[0], pa.float64()), 0.0).to_numpy()
        weights = values * values
        return [pa.array(np.bincount(ids.to_numpy(), weights=weights, minlength=groups))]

    def merge(states: Sequence[pa.Array], ids: pa.Array, groups: int) -> list[pa.Array]:
        weights = states[0].to_numpy()
        return [pa.array(np.bincount(ids.to_numpy(), weights=weights, minlength=groups))]

    return AggregateUdf(
        name="sum_sq",
        return_type=pa.float64(),
        state_types=(pa.float64(),),
        update=update,
        merge=merge,
        finish=lambda states: states[0],
    )


@pytest.mark.parametrize("mode", ["single", "coalesce", "repartition"])
@pytest.mark.parametrize("keys", [["k"], []], ids=["keyed", "global"])
async def test_aggregate_udf(mode: str, keys: list[str]) -> None:
    session = SessionStateBuilder().with_aggregate_udf(sum_of_squares()).build()
    table = sample_table(2000)
    aggregates = [agg("sum_sq", col("v"), name="ss"), agg("count", name="rows")]
    scan = MemoryScan.from_table(table, 3, batch_rows=37)
    plan: ExecutionPlan
    if mode == "single":
        plan = HashAggregate(
            Coalesce(scan), [(col(k), k) for k in keys], aggregates, functions=session
        )
    else:
        plan = two_phase(scan, keys, aggregates, mode, session)
    got = await run(plan, session)
    squares = pc.multiply(table["v"], table["v"])
    exp = (
        pa.table({**{k: table[k] for k in keys}, "sq": squares})
        .group_by(keys)
        .aggregate([("sq", "sum", pc.ScalarAggregateOptions(min_count=0)), ([], "count_all")])
        .rename_columns([*keys, "ss", "rows"])
    )
    assert canonical(got, keys) == canonical(exp, keys)


@pytest.mark.parametrize("keys", [[], ["g"]], ids=["no key", "grouped"])
async def test_the_mean_of_integers_summing_past_2_53_is_their_mean(keys: list[str]) -> None:
    """The sum has no exact double there; a safe cast of it refused the query ('Integer value
    18014398509481986 not in range'), which DuckDB answers."""
    big = 2**53 + 1
    table = pa.table({"g": ["a", "a", "a"], "v": pa.array([big, big, big], pa.int64())})
    keys_exprs = [(col(k), k) for k in keys]
    aggregates = [agg("mean", col("v"), name="mean_v")]
    partial = HashAggregate(
        MemoryScan.from_table(table, 3), keys_exprs, aggregates, mode=AggregateMode.PARTIAL
    )
    plan = HashAggregate(Coalesce(partial), keys_exprs, aggregates, mode=AggregateMode.FINAL)
    got = await run(plan)
    assert got.column("mean_v").to_pylist() == [pytest.approx(big, rel=1e-15)]


@pytest.mark.parametrize(
    ("keys", "aggregate", "reason"),
    [
        ([], agg("sum", col("s"), name="x"), r"sum\(s\) AS x over s \(string\): Arrow's sum"),
        (["g"], agg("sum", col("s"), name="x"), r"sum\(s\) AS x over s \(string\): Arrow's sum"),
        ([], agg("max", col("st"), name="x"), r"max\(st\) AS x over st \(struct<q: int64>\)"),
        (["st"], agg("count", name="c"), "grouped by st AS st over columns .*Keys of type struct"),
    ],
    ids=["sum of strings", "grouped sum of strings", "max of a struct", "struct key"],
)
def test_what_arrow_cannot_aggregate_is_refused_naming_it(
    keys: list[str], aggregate: AggregateExpr, reason: str
) -> None:
    """pyarrow's ArrowNotImplementedError reached the caller as it was, naming no column; then
    as 'cannot group by (none)', with Acero's group id type among the argument types."""
    table = pa.table({"g": [1, 2], "s": ["x", "y"], "st": pa.array([{"q": 1}, {"q": 2}])})
    with pytest.raises(InvalidArgument, match=reason) as refused:
        HashAggregate(MemoryScan.from_table(table), [(col(k), k) for k in keys], [aggregate])
    assert str(aggregate) in str(refused.value)
    assert "uint32" not in str(refused.value)


def test_an_aggregate_of_a_missing_column_is_refused_when_built() -> None:
    """It raised ExecutionError, as if the plan had failed while running."""
    scan = MemoryScan.from_table(sample_table(5))
    with pytest.raises(InvalidArgument, match="column 'zz' not found"):
        HashAggregate(scan, [], [agg("sum", col("zz"), name="m")])


def test_unknown_aggregate_names_it() -> None:
    scan = MemoryScan.from_table(sample_table(5))
    with pytest.raises(UnknownUdfError, match="median_of_medians"):
        HashAggregate(scan, [], [agg("median_of_medians", col("v"), name="m")])
    with pytest.raises(InvalidArgument, match="takes 1 argument"):
        HashAggregate(scan, [], [agg("sum", col("v"), col("n"), name="m")])
    with pytest.raises(InvalidArgument, match="unique"):
        HashAggregate(scan, [(col("k"), "x")], [agg("sum", col("v"), name="x")])


def test_final_mode_needs_partial_columns() -> None:
    scan = MemoryScan.from_table(sample_table(5))
    with pytest.raises(InvalidArgument, match="partial columns"):
        HashAggregate(
            scan, [(col("k"), "k")], [agg("sum", col("v"), name="s")], mode=AggregateMode.FINAL
        )


async def test_failing_udaf_is_execution_error() -> None:
    def boom(args: Sequence[pa.Array], ids: pa.Array, groups: int) -> list[pa.Array]:
        raise RuntimeError("kaboom")

    udf = AggregateUdf("bad", pa.int64(), (pa.int64(),), boom, boom, lambda s: s[0])
    session = SessionStateBuilder().with_aggregate_udf(udf).build()
    plan = HashAggregate(
        MemoryScan.from_table(sample_table(10)),
        [],
        [agg("bad", col("n"), name="b")],
        functions=session,
    )
    with pytest.raises(ExecutionError, match="kaboom"):
        await run(plan, session)


async def test_small_batches_are_coalesced_into_one_acero_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A feed delivers a batch per work unit: 200 batches of 10 rows took 200 Acero calls and
    13 merges; a partition's rows now go to Acero in one call, and its one state needs no merge."""
    table = sample_table(2000)
    scan = MemoryScan.from_table(table, 1, batch_rows=10)
    plan = HashAggregate(scan, [(col("k"), "k")], AGGREGATES, mode=AggregateMode.PARTIAL)
    calls: list[int] = []
    real = getattr(hash_aggregate_module, "group_aggregate")  # noqa: B009 (not exported)

    def counted(table: pa.Table, *args: Any, **kwargs: Any) -> pa.Table:
        calls.append(table.num_rows)
        return real(table, *args, **kwargs)

    monkeypatch.setattr(hash_aggregate_module, "group_aggregate", counted)
    got = await run(plan)
    assert calls == [2000]
    final = HashAggregate(
        MemoryScan.from_table(got, 1), [(col("k"), "k")], AGGREGATES, mode=AggregateMode.FINAL
    )
    assert canonical(await run(final), ["k"]) == canonical(expected(table, ["k"]), ["k"])


def test_a_new_child_of_the_same_schema_reuses_the_inferred_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner rebuilds nodes over new children for every query: inference ran Acero twice
    each time."""
    table = sample_table(100)
    plan = HashAggregate(MemoryScan.from_table(table, 1), [(col("k"), "k")], AGGREGATES)
    monkeypatch.setattr(hash_aggregate_module, "group_aggregate", None)  # any call would fail
    rebuilt = plan.with_children([MemoryScan.from_table(table, 2)])
    assert isinstance(rebuilt, HashAggregate)
    assert rebuilt.schema.equals(plan.schema)
    assert rebuilt.children[0].output_partitions == 2
    assert plan.children[0].output_partitions == 1  # the original is untouched


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=0, max_size=30),
    coalesce_rows=st.integers(1, 200),
    merge_every=st.integers(1, 5),
    two_phase_plan=st.booleans(),
)
async def test_any_batching_gives_the_one_shot_result(
    sizes: list[int], coalesce_rows: int, merge_every: int, two_phase_plan: bool
) -> None:
    """Whatever the batch sizes, the runs and the merges, the result is pyarrow's own."""
    table = sample_table(sum(sizes)) if sizes else sample_table(0)
    batches, start = [], 0
    for size in sizes:
        batches.append(table.slice(start, size).combine_chunks().to_batches()[0])
        start += size
    scan = MemoryScan(table.schema, [batches])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hash_aggregate_module, "COALESCE_ROWS", coalesce_rows)
        patch.setattr(hash_aggregate_module, "MERGE_EVERY_BATCHES", merge_every)
        if two_phase_plan:
            plan = two_phase(scan, ["k"], AGGREGATES, "coalesce", Session())
        else:
            plan = HashAggregate(scan, [(col("k"), "k")], AGGREGATES)
        got = await run(plan)
    assert canonical(got, ["k"]) == canonical(expected(table, ["k"]), ["k"])


class Probe(PlanNodeBase):
    """Yields batches and notes what its task holds whenever it is asked for the next one."""

    name = "Probe"

    def __init__(self, batches: Sequence[pa.RecordBatch]) -> None:
        self.batches = batches
        self.held: list[int] = []

    @property
    def schema(self) -> pa.Schema:
        return self.batches[0].schema

    @property
    def output_partitions(self) -> int:
        return 1

    async def _execute(self, partition: int, ctx: Any) -> AsyncIterator[pa.RecordBatch]:
        for batch in self.batches:
            yield batch
            self.held.append(ctx.memory.reserved)


async def test_a_run_is_reserved_while_it_is_buffered_and_then_let_go() -> None:
    """Coalescing holds batches the child would have dropped: they are reserved before the
    next one is asked for, and a reduced run's bytes are returned (memory is bounded by one run
    and the states, not by the input)."""
    table = sample_table(20_000)
    batches = table.to_batches(max_chunksize=500)
    probe = Probe(batches)
    plan = HashAggregate(probe, [(col("k"), "k")], AGGREGATES, mode=AggregateMode.PARTIAL)
    pool = MemoryPool(None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hash_aggregate_module, "COALESCE_ROWS", 2000)  # runs of 4 batches
        patch.setattr(hash_aggregate_module, "MERGE_EVERY_BATCHES", 3)
        async with open_task_context(Session(), memory_pool=pool) as ctx:
            got = await collect(plan, ctx)
    assert len(probe.held) == len(batches)
    states = 16_384  # at most 3 states of 8 groups, and a merge of them: a few KiB
    for i, held in enumerate(probe.held):
        # The 4th batch of a run is reduced before the next is asked for: states only.
        buffered = sum(b.nbytes for b in batches[i - i % 4 : i + 1]) if i % 4 != 3 else 0
        assert buffered <= held < buffered + states, i
    assert pool.reserved == 0
    final = HashAggregate(
        MemoryScan.from_table(got, 1), [(col("k"), "k")], AGGREGATES, mode=AggregateMode.FINAL
    )
    assert canonical(await run(final), ["k"]) == canonical(expected(table, ["k"]), ["k"])


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=20),
    coalesce_rows=st.integers(1, 200),
    merge_every=st.integers(1, 4),
    mode=st.sampled_from(["single", "coalesce", "repartition"]),
)
async def test_a_udf_aggregate_gives_the_same_result_whatever_the_batching(
    sizes: list[int], coalesce_rows: int, merge_every: int, mode: str
) -> None:
    """A UDF sees one run's rows at a time (off the loop): coalescing must not change them."""
    session = SessionStateBuilder().with_aggregate_udf(sum_of_squares()).build()
    table = sample_table(sum(sizes))
    batches, start = [], 0
    for size in sizes:
        batches.append(table.slice(start, size).combine_chunks().to_batches()[0])
        start += size
    scan = MemoryScan(table.schema, [batches])
    aggregates = [agg("sum_sq", col("v"), name="ss"), agg("count", name="rows")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hash_aggregate_module, "COALESCE_ROWS", coalesce_rows)
        patch.setattr(hash_aggregate_module, "MERGE_EVERY_BATCHES", merge_every)
        plan = (
            HashAggregate(scan, [(col("k"), "k")], aggregates, functions=session)
            if mode == "single"
            else two_phase(scan, ["k"], aggregates, mode, session)
        )
        got = await run(plan, session)
    squares = pc.multiply(table["v"], table["v"])
    exp = (
        pa.table({"k": table["k"], "sq": squares})
        .group_by(["k"])
        .aggregate([("sq", "sum", pc.ScalarAggregateOptions(min_count=0)), ([], "count_all")])
        .rename_columns(["k", "ss", "rows"])
    )
    assert canonical(got, ["k"]) == canonical(exp, ["k"])


def test_decoding_the_same_aggregate_again_infers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers decode the same node for every task: inference ran Acero twice each time."""
    codec = HashAggregateCodec()
    table = sample_table(100)
    plan = HashAggregate(MemoryScan.from_table(table, 1), [(col("k"), "k")], AGGREGATES)
    payload = codec.encode(plan)
    child = MemoryScan.from_table(table, 3)
    context = DecodeContext(Session(), CodecRegistry.builtin())
    first = codec.decode(HashAggregate.name, payload, [child], context)
    monkeypatch.setattr(hash_aggregate_module, "group_aggregate", None)  # any call would fail
    again = codec.decode(HashAggregate.name, payload, [child], context)
    assert isinstance(again, HashAggregate)
    assert again.schema.equals(first.schema)
    assert again.children[0] is child


def test_building_the_same_aggregate_again_infers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients build a plan per query (the coordinator ran Acero twice per node each time)."""
    table = sample_table(100)
    first = HashAggregate(MemoryScan.from_table(table, 1), [(col("k"), "k")], AGGREGATES)
    monkeypatch.setattr(hash_aggregate_module, "group_aggregate", None)  # any call would fail
    again = HashAggregate(MemoryScan.from_table(table, 4), [(col("k"), "k")], AGGREGATES)
    assert again.schema.equals(first.schema)


def test_another_input_schema_is_inferred_again() -> None:
    """The output types follow the input's: a cached inference must not leak across schemas."""
    aggregates = [agg("sum", col("v"), name="s"), agg("min", col("k"), name="m")]
    ints = pa.table({"k": pa.array([1, 2], pa.int32()), "v": pa.array([1, 2], pa.int64())})
    floats = pa.table({"k": pa.array(["a", "b"]), "v": pa.array([1.5, 2.5])})
    plans = [
        HashAggregate(MemoryScan.from_table(t, 1), [], aggregates) for t in (ints, floats, ints)
    ]
    assert [p.schema.field("s").type for p in plans] == [pa.int64(), pa.float64(), pa.int64()]
    assert [p.schema.field("m").type for p in plans] == [pa.int32(), pa.string(), pa.int32()]
    rebuilt = plans[0].with_children([MemoryScan.from_table(floats, 1)])
    assert rebuilt.schema.field("s").type == pa.float64()


def test_the_inference_cache_is_bounded_and_minds_schema_metadata() -> None:
    cache = hash_aggregate_module._InferenceCache(2)
    schemas = [pa.schema([pa.field(f"c{i}", pa.int64())]) for i in range(3)]
    keys = [(AggregateMode.SINGLE, (), (), schema) for schema in schemas]
    for i, key in enumerate(keys):
        cache.put(key, (schemas[i], True))
    assert len(cache) == 2
    assert cache.get(keys[0]) is None  # the least recently used went
    assert cache.get(keys[2]) == (schemas[2], True)
    # Schemas compare equal whatever their metadata: the stored one is checked with it.
    tagged = (AggregateMode.SINGLE, (), (), schemas[2].with_metadata({"origin": "x"}))
    assert cache.get(tagged) is None


def test_an_aggregate_calling_user_code_is_inferred_every_time() -> None:
    """A session's UDF may shadow a builtin's name: such nodes are never cached, and a builtin
    cached under the same name is not used for them."""
    table = sample_table(100)
    builtin = HashAggregate(MemoryScan.from_table(table, 1), [], [agg("sum", col("v"), name="s")])
    assert builtin.schema.field("s").type == pa.float64()

    def step(args: Sequence[pa.Array], ids: pa.Array, groups: int) -> list[pa.Array]:
        return [pa.array([""] * groups)]

    shadow = AggregateUdf("sum", pa.string(), (pa.string(),), step, step, lambda s: s[0])
    session = SessionStateBuilder().with_aggregate_udf(shadow).build()
    size = len(hash_aggregate_module._INFERRED)
    udf = HashAggregate(
        MemoryScan.from_table(table, 1), [], [agg("sum", col("v"), name="s")], functions=session
    )
    assert udf.schema.field("s").type == pa.string()
    assert len(hash_aggregate_module._INFERRED) == size
    codec = HashAggregateCodec()
    decoded = codec.decode(
        HashAggregate.name,
        codec.encode(udf),
        [MemoryScan.from_table(table, 1)],
        DecodeContext(session, CodecRegistry.builtin()),
    )
    assert decoded.schema.field("s").type == pa.string()
