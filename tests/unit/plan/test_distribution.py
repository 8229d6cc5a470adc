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
    output_hash_keys,
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


def exchange_by_hash(child: ExecutionPlan, need: HashPartitioned, width: int) -> ExecutionPlan:
    """The distributed planner's kind of exchange: a hash Repartition into `width`."""
    return Repartition(child, Partitioning(need.keys, width))


def no_exchange(child: ExecutionPlan, need: HashPartitioned, width: int) -> None:
    """An exchange that cannot be made: a Coalesce stands in."""
    return None


def test_an_aggregate_keeps_its_inputs_hash_keys_as_its_own_columns() -> None:
    assert output_hash_keys(by_k(hashed(scan(2), "k"))) == (col("k"),)
    partial = by_k(hashed(scan(2), "k"), AggregateMode.PARTIAL)
    assert output_hash_keys(by_k(partial, AggregateMode.FINAL)) == (col("k"),)
    renamed = HashAggregate(hashed(scan(2), "k"), [(col("k"), "key")], AGGS)
    assert output_hash_keys(renamed) == (col("key"),)
    assert output_hash_keys(by_k(hashed(scan(2), "n"))) is None  # split on a non-key
    assert output_hash_keys(HashAggregate(hashed(scan(2), "k"), [], AGGS)) is None
    assert output_hash_keys(by_k(scan(2))) is None


def test_a_side_split_on_its_keys_keeps_its_split_and_the_other_side_is_exchanged() -> None:
    """A final aggregate's shuffle serves the join above it: only the other side moves."""
    left = hashed(scan(2, LEFT), "lk", 4)
    plan = partitioned_join(left, scan(4, RIGHT))
    fixed = enforce_distribution(plan, hash_exchange=exchange_by_hash)
    assert unwrap(fixed.children[0]) is left
    moved = unwrap(fixed.children[1])
    assert isinstance(moved, Repartition)
    assert moved.partitioning.hash_keys == (col("rk"),)
    assert moved.partitioning.partition_count == 4
    assert sorted_rows(anyio.run(run, fixed)) == joined_reference()
    # In one process (no hash exchange) both sides are coalesced, as before.
    alone = enforce_distribution(plan)
    assert kinds(alone)[:2] == ["HashJoin", "Coalesce"]
    assert sorted_rows(anyio.run(run, alone)) == joined_reference()


def test_an_exchange_that_cannot_be_made_coalesces_every_side() -> None:
    plan = partitioned_join(hashed(scan(2, LEFT), "lk", 4), scan(4, RIGHT))
    fixed = enforce_distribution(plan, hash_exchange=no_exchange)
    assert kinds(fixed)[:2] == ["HashJoin", "Coalesce"]
    assert {unwrap(side).output_partitions for side in fixed.children} == {1}
    assert sorted_rows(anyio.run(run, fixed)) == joined_reference()


SIDES = st.sampled_from(["scan", "hashed", "aggregated"])


def side(kind: str, table: pa.Table, key: str, below: int, partitions: int) -> ExecutionPlan:
    """One join input of `partitions` partitions: as read, split on its key, or grouped by
    its key over such a split (the payload summed); a split reads `below` partitions."""
    if kind == "scan":
        return scan(partitions, table)
    split = hashed(scan(below, table), key, partitions)
    if kind == "hashed":
        return split
    payload = "a" if key == "lk" else "b"
    return HashAggregate(split, [(col(key), key)], [agg("sum", col(payload), name=payload)])


@settings(max_examples=60, deadline=None)
@given(
    left_kind=SIDES,
    right_kind=SIDES,
    below=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    partitions=st.integers(1, 5),
    exchange=st.sampled_from([exchange_by_hash, no_exchange, None]),
)
def test_an_enforced_partitioned_join_answers_as_over_one_partition(
    left_kind: str,
    right_kind: str,
    below: tuple[int, int],
    partitions: int,
    exchange: object,
) -> None:
    def build(splits: tuple[int, int], width: int) -> ExecutionPlan:
        left = side(left_kind, LEFT, "lk", splits[0], width)
        right = side(right_kind, RIGHT, "rk", splits[1], width)
        return partitioned_join(left, right)

    fixed = enforce_distribution(build(below, partitions), hash_exchange=exchange)  # type: ignore[arg-type]
    expected = sorted_rows(reference(build((1, 1), 1)))
    assert sorted_rows(anyio.run(run, fixed)) == expected
