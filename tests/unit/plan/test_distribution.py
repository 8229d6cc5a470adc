"""enforce_distribution: every node gets the input partitioning it needs, so a hand-built plan
without its Coalesce gives the same answer as the plan over one partition; plans that already
meet their needs are left as they are (the same object)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.plan import (
    AggregateMode,
    Coalesce,
    ExecutionPlan,
    Filter,
    HashAggregate,
    HashJoin,
    MemoryScan,
    Partitioning,
    Repartition,
    agg,
    call,
    col,
    lit,
)
from flightfeed.plan.distribution import (
    HashPartitioned,
    SinglePartition,
    enforce_distribution,
    required_input_distribution,
    satisfies,
)
from flightfeed.plan.metrics import unwrap

from .helpers import run, sample_table, sorted_rows

TABLE = sample_table(300)
AGGS = [agg("sum", col("v"), name="sum_v"), agg("count", name="rows")]


def scan(partitions: int, table: pa.Table = TABLE) -> MemoryScan:
    return MemoryScan.from_table(table, partitions, batch_rows=16)


def by_k(child: ExecutionPlan, mode: AggregateMode = AggregateMode.SINGLE) -> HashAggregate:
    return HashAggregate(child, [(col("k"), "k")], AGGS, mode=mode)


def hashed(child: ExecutionPlan, key: str, partitions: int = 3) -> Repartition:
    return Repartition(child, Partitioning((col(key),), partitions))


def reference(plan: ExecutionPlan) -> pa.Table:
    """The plan's answer computed over all rows in one partition (no enforcement needed)."""
    return anyio.run(run, plan)


def kinds(plan: ExecutionPlan) -> list[str]:
    """Node names in pre-order."""
    node = unwrap(plan)
    return [node.name] + [name for child in node.children for name in kinds(child)]


TWO_PHASE = ["HashAggregate", "Coalesce", "HashAggregate", "MemoryScan"]


def modes(plan: ExecutionPlan) -> list[AggregateMode]:
    node = unwrap(plan)
    own = [node.mode] if isinstance(node, HashAggregate) else []
    return own + [mode for child in node.children for mode in modes(child)]


def test_a_grouped_aggregate_over_unsplit_partitions_goes_partial_then_final() -> None:
    plan = by_k(scan(4))
    fixed = enforce_distribution(plan)
    assert kinds(fixed) == TWO_PHASE  # only states cross the Coalesce
    assert modes(fixed) == [AggregateMode.FINAL, AggregateMode.PARTIAL]
    got = anyio.run(run, fixed)
    assert sorted_rows(got) == sorted_rows(reference(by_k(scan(1))))
    wrong = anyio.run(run, plan)  # what it gave before: a group per partition it appears in
    assert wrong.num_rows > got.num_rows


def test_a_global_aggregate_needs_one_partition() -> None:
    plan = HashAggregate(scan(3), [], AGGS)
    assert required_input_distribution(plan) == [SinglePartition()]
    fixed = enforce_distribution(plan)
    assert kinds(fixed) == TWO_PHASE
    got = anyio.run(run, fixed)
    assert got.num_rows == 1
    assert got.to_pylist() == reference(HashAggregate(scan(1), [], AGGS)).to_pylist()


def test_input_hash_partitioned_on_the_keys_is_left_as_it_is() -> None:
    # a filter keeps its input's partitions, so their hash partitioning too
    plan = by_k(Filter(hashed(scan(4), "k"), call("greater", col("n"), lit(10))))
    assert enforce_distribution(plan) is plan
    expected = by_k(Filter(scan(1), call("greater", col("n"), lit(10))))
    assert sorted_rows(anyio.run(run, plan)) == sorted_rows(reference(expected))


def test_partitioned_on_other_keys_is_not_enough() -> None:
    plan = by_k(hashed(scan(4), "g"))
    assert kinds(enforce_distribution(plan))[:3] == TWO_PHASE[:3]


def test_partitioned_on_a_subset_of_the_group_keys_is_enough() -> None:
    keys = [(col("k"), "k"), (col("g"), "g")]
    plan = HashAggregate(hashed(scan(4), "g"), keys, AGGS)
    assert enforce_distribution(plan) is plan
    expected = HashAggregate(scan(1), keys, AGGS)
    assert sorted_rows(anyio.run(run, plan)) == sorted_rows(reference(expected))


def test_a_final_aggregate_needs_its_partial_states_split_by_key_names() -> None:
    partial = by_k(scan(4), AggregateMode.PARTIAL)
    over_partials = by_k(partial, AggregateMode.FINAL)
    assert required_input_distribution(partial) == [None]
    assert required_input_distribution(over_partials) == [HashPartitioned((col("k"),))]
    fixed = enforce_distribution(over_partials)
    assert kinds(fixed) == TWO_PHASE  # a FINAL over partials just gets its Coalesce
    assert modes(fixed) == [AggregateMode.FINAL, AggregateMode.PARTIAL]
    shuffled = by_k(hashed(partial, "k"), AggregateMode.FINAL)
    assert enforce_distribution(shuffled) is shuffled
    expected = sorted_rows(reference(by_k(scan(1))))
    assert sorted_rows(anyio.run(run, fixed)) == expected
    assert sorted_rows(anyio.run(run, shuffled)) == expected


LEFT = pa.table({"lk": pa.array([i % 9 for i in range(60)], pa.int64()), "a": range(60)})
RIGHT = pa.table({"rk": pa.array([i % 7 for i in range(40)], pa.int64()), "b": range(40)})
ON = [("lk", "rk")]


def partitioned_join(left: ExecutionPlan, right: ExecutionPlan) -> HashJoin:
    return HashJoin(left, right, ON, "inner", collect_left=False)


def joined_reference() -> list[dict[str, object]]:
    return sorted_rows(reference(HashJoin(scan(1, LEFT), scan(1, RIGHT), ON, "inner")))


def test_a_partitioned_join_over_unsplit_sides_coalesces_both() -> None:
    plan = partitioned_join(scan(3, LEFT), scan(3, RIGHT))
    fixed = enforce_distribution(plan)
    assert kinds(fixed) == ["HashJoin", "Coalesce", "MemoryScan", "Coalesce", "MemoryScan"]
    assert sorted_rows(anyio.run(run, fixed)) == joined_reference()


def test_a_partitioned_join_with_one_side_split_right_coalesces_both() -> None:
    plan = partitioned_join(hashed(scan(2, LEFT), "lk"), scan(3, RIGHT))
    fixed = enforce_distribution(plan)
    assert kinds(fixed)[:2] == ["HashJoin", "Coalesce"]
    assert "Coalesce" in kinds(fixed)[3:]
    assert sorted_rows(anyio.run(run, fixed)) == joined_reference()


def test_a_partitioned_join_over_sides_split_on_their_keys_is_left_as_it_is() -> None:
    plan = partitioned_join(hashed(scan(2, LEFT), "lk"), hashed(scan(3, RIGHT), "rk"))
    assert enforce_distribution(plan) is plan
    assert sorted_rows(anyio.run(run, plan)) == joined_reference()


def test_one_partition_meets_every_need() -> None:
    one = scan(1)
    assert satisfies(one, SinglePartition())
    assert satisfies(one, HashPartitioned((col("x"),)))
    plan = by_k(Coalesce(scan(4)))
    assert enforce_distribution(plan) is plan


class Needy(MemoryScan):
    """A user node whose needs are declared wrongly: one entry for no children."""

    def required_input_distribution(self) -> Sequence[object]:
        return [SinglePartition()]


def test_a_node_declaring_needs_for_children_it_does_not_have_is_an_error() -> None:
    node = Needy(TABLE.schema, [[]])
    with pytest.raises(ValueError, match="1 entries for 0 children"):
        enforce_distribution(node)


@settings(max_examples=40, deadline=None)
@given(
    keys=st.lists(st.integers(0, 5) | st.none(), min_size=0, max_size=80),
    partitions=st.integers(1, 6),
    batch_rows=st.integers(1, 20),
    mode=st.sampled_from(["single", "partial-final", "global"]),
)
def test_an_enforced_aggregate_answers_as_over_one_partition(
    keys: list[int | None], partitions: int, batch_rows: int, mode: str
) -> None:
    table = pa.table(
        {"k": pa.array(keys, pa.int64()), "v": pa.array(range(len(keys)), pa.float64())}
    )

    def build(source: ExecutionPlan) -> ExecutionPlan:
        if mode == "global":
            return HashAggregate(source, [], AGGS)
        if mode == "single":
            return by_k(source)
        return by_k(by_k(source, AggregateMode.PARTIAL), AggregateMode.FINAL)

    split = MemoryScan.from_table(table, partitions, batch_rows=batch_rows)
    got = anyio.run(run, enforce_distribution(build(split)))
    whole = MemoryScan.from_table(table, 1, batch_rows=batch_rows)
    assert sorted_rows(got) == sorted_rows(reference(build(whole)))
