"""HashJoin against one pyarrow Table.join over the whole inputs, for every join type and mode."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightfeed.errors import InvalidArgument
from flightfeed.plan import (
    Coalesce,
    ExecutionPlan,
    HashJoin,
    MemoryScan,
    Partitioning,
    Repartition,
    col,
)

from .helpers import run, sorted_rows

pytestmark = pytest.mark.anyio

LEFT = pa.table(
    {
        "lk": pa.array([i % 13 if i % 9 else None for i in range(200)], pa.int64()),
        "lg": [f"g{i % 2}" for i in range(200)],
        "lv": list(range(200)),
    }
)
RIGHT = pa.table(
    {
        "rk": pa.array([i % 17 for i in range(150)], pa.int64()),
        "rg": [f"g{i % 3}" for i in range(150)],
        "rv": [float(i) for i in range(150)],
    }
)
ON = [("lk", "rk"), ("lg", "rg")]
JOIN_TYPES = [
    "inner",
    "left outer",
    "right outer",
    "full outer",
    "left semi",
    "left anti",
    "right semi",
    "right anti",
]


def expected(join_type: str) -> pa.Table:
    return LEFT.join(
        RIGHT, keys=["lk", "lg"], right_keys=["rk", "rg"], join_type=join_type, coalesce_keys=False
    )


@pytest.mark.parametrize("join_type", JOIN_TYPES)
async def test_collect_left(join_type: str) -> None:
    needs_single = join_type in {"left outer", "full outer", "left semi", "left anti"}
    right: ExecutionPlan = MemoryScan.from_table(RIGHT, 3, batch_rows=20)
    if needs_single:
        right = Coalesce(right)
    plan = HashJoin(MemoryScan.from_table(LEFT, 2, batch_rows=30), right, ON, join_type)
    got = await run(plan, offload=0)
    assert got.schema == expected(join_type).schema
    assert sorted_rows(got) == sorted_rows(expected(join_type))


@pytest.mark.parametrize("join_type", JOIN_TYPES)
async def test_partitioned(join_type: str) -> None:
    def shuffled(table: pa.Table, keys: tuple[str, str]) -> ExecutionPlan:
        scan = MemoryScan.from_table(table, 2, batch_rows=25)
        return Repartition(scan, Partitioning((col(keys[0]), col(keys[1])), 4))

    plan = HashJoin(
        shuffled(LEFT, ("lk", "lg")),
        shuffled(RIGHT, ("rk", "rg")),
        ON,
        join_type,
        collect_left=False,
    )
    assert plan.output_partitions == 4
    assert sorted_rows(await run(plan)) == sorted_rows(expected(join_type))


def test_invalid_joins() -> None:
    left = MemoryScan.from_table(LEFT, 2)
    right = MemoryScan.from_table(RIGHT, 3)
    with pytest.raises(InvalidArgument, match="one right partition"):
        HashJoin(left, right, ON, "left outer")
    with pytest.raises(InvalidArgument, match="as many left as right"):
        HashJoin(left, right, ON, collect_left=False)
    with pytest.raises(InvalidArgument, match="share column names"):
        HashJoin(left, MemoryScan.from_table(LEFT), [("lk", "lk")])
    with pytest.raises(InvalidArgument, match="unknown join type"):
        HashJoin(left, right, ON, "sideways")
    with pytest.raises(InvalidArgument, match="not in the inputs"):
        HashJoin(left, right, [("nope", "rk")])


def test_keys_of_different_types_are_refused_naming_both() -> None:
    """pyarrow's ArrowInvalid ('Incompatible data types for corresponding join field keys')
    reached the caller as it was."""
    left = MemoryScan.from_table(pa.table({"a": pa.array([1, 2], pa.int64())}))
    right = MemoryScan.from_table(pa.table({"b": pa.array([1, 2], pa.int32())}))
    with pytest.raises(InvalidArgument, match=r"a \(int64\) = b \(int32\).*cast one side's key"):
        HashJoin(left, right, [("a", "b")])
