"""A chainable plan builder: `plan_from(leaf).filter(...).aggregate(...).sort(...).limit(...)`.

Each step means what it says over the whole input, however many partitions it has: `sort` is
a total order, `limit` keeps the first rows of the result, `aggregate` gives one row per group.
The builder makes the per-partition nodes mean that: a sort or limit over several partitions
runs per partition first (top-k, local limit) and again over their Coalesce, so the early part
runs where the data is. Each step's plan gets the input partitioning its nodes need
(plan/distribution.py): a grouped aggregate over several partitions becomes PARTIAL, a
Repartition on its keys and FINAL, a global one PARTIAL, Coalesce, FINAL. So a built plan runs
right in one process as well as distributed, where the Repartition is a shuffle between the
workers' tasks. A join broadcasts its build side (this side) by default, or shuffles both sides
by key (`strategy="shuffle"`, for two large inputs). UDFs come from one registry given at the
start (`functions=`, a session's), not from every node.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ..errors import InvalidArgument
from .aggregate import AggregateExpr, agg
from .base import ExecutionPlan
from .distribution import HashPartitioned, enforce_distribution, output_hash_keys
from .expr import Expr, col
from .functions import BUILTINS, FunctionRegistry
from .nodes import (
    Coalesce,
    Filter,
    HashAggregate,
    HashJoin,
    Limit,
    MemoryScan,
    Projection,
    Repartition,
    Sort,
    SortKey,
    Union,
)
from .nodes.hash_join import JOIN_TYPES, needs_all_right_rows
from .partitioning import Partitioning

Named = str | tuple[Expr, str]
"""A column by name, or an expression with its output name."""


def plan_from(node: ExecutionPlan, *, functions: FunctionRegistry = BUILTINS) -> PlanBuilder:
    """Start building over `node` (a leaf, or any plan)."""
    return PlanBuilder(node, functions)


def from_table(
    table: pa.Table,
    partitions: int = 1,
    *,
    batch_rows: int | None = None,
    functions: FunctionRegistry = BUILTINS,
) -> PlanBuilder:
    """Start building over an in-memory table split into `partitions`."""
    return PlanBuilder(MemoryScan.from_table(table, partitions, batch_rows=batch_rows), functions)


def desc(name: str | Expr, *, nulls_first: bool = False) -> SortKey:
    """A descending sort key."""
    return SortKey(col(name) if isinstance(name, str) else name, True, nulls_first)


class PlanBuilder:
    """An immutable step of a plan being built; every method returns a new builder."""

    def __init__(self, plan: ExecutionPlan, functions: FunctionRegistry = BUILTINS) -> None:
        self.plan = plan
        self.functions = functions

    @property
    def schema(self) -> pa.Schema:
        return self.plan.schema

    def _then(self, plan: ExecutionPlan) -> PlanBuilder:
        # Every step's plan meets its nodes' needs, so it runs right in one process too, and
        # the next step sees the partitions there will be.
        return PlanBuilder(enforce_distribution(plan, hash_exchange=self._shuffle), self.functions)

    def _shuffle(self, child: ExecutionPlan, need: HashPartitioned, width: int) -> ExecutionPlan:
        return Repartition(child, Partitioning(need.keys, width), functions=self.functions)

    def filter(self, predicate: Expr) -> PlanBuilder:
        return self._then(Filter(self.plan, predicate, functions=self.functions))

    def select(self, *columns: Named) -> PlanBuilder:
        """Columns by name, or `(expression, name)` pairs, in this order."""
        if not columns:
            raise InvalidArgument("select needs at least one column")
        pairs = [_named(column) for column in columns]
        exprs, names = [e for e, _ in pairs], [n for _, n in pairs]
        return self._then(Projection(self.plan, exprs, names, functions=self.functions))

    def aggregate(
        self, group_by: Sequence[Named] = (), aggregates: Sequence[AggregateExpr] = ()
    ) -> PlanBuilder:
        """One row per group (one row in all without `group_by`). `count_distinct(x)` counts
        the distinct non-null values of x (see `_count_distinct`)."""
        if not group_by and not aggregates:
            raise InvalidArgument("aggregate needs group keys or aggregates")
        keys = [_named(key) for key in group_by]
        if any(a.function == COUNT_DISTINCT for a in aggregates):
            return self._count_distinct(keys, aggregates)
        node = HashAggregate(self.plan, keys, list(aggregates), functions=self.functions)
        return self._then(node)

    def _count_distinct(
        self, keys: list[tuple[Expr, str]], aggregates: Sequence[AggregateExpr]
    ) -> PlanBuilder:
        """count(DISTINCT x) per group as two aggregations: group by the keys and x (the
        distinct pairs, partial and final across a shuffle like any grouping), then count the
        non-null x per group. No state holds a group's distinct values, so nothing grows with
        them but the rows of the first aggregation, which distribute."""
        args = {a.args for a in aggregates}
        if any(a.function != COUNT_DISTINCT for a in aggregates) or len(args) != 1:
            raise InvalidArgument(
                "count_distinct is computed by grouping on its argument: every aggregate of the"
                " step must be count_distinct of the same one expression (aggregate again for"
                " the others and join)"
            )
        (found,) = args
        if len(found) != 1:
            raise InvalidArgument(f"count_distinct takes one argument, got {len(found)}")
        arg = found[0]
        names = [name for _, name in keys]
        value = _fresh_name("distinct_value", names)
        pairs = self.aggregate([*keys, (arg, value)])
        counts = [agg("count", col(value), name=a.name) for a in aggregates]
        return pairs.aggregate(names, counts)

    def join(
        self,
        right: PlanBuilder | ExecutionPlan,
        on: Sequence[tuple[str, str]] | str,
        how: str = "inner",
        *,
        strategy: str = "broadcast",
    ) -> PlanBuilder:
        """An equi-join. `on` is a column both sides share the name of, or (left, right) name
        pairs. `strategy`: "broadcast" collects this side whole in every task that joins (keep
        it the small side); "shuffle" hash-partitions both sides by their keys, so partition i
        of one meets partition i of the other (two large sides; every join type)."""
        other = right.plan if isinstance(right, PlanBuilder) else right
        pairs = [(on, on)] if isinstance(on, str) else list(on)
        if how not in JOIN_TYPES:
            raise InvalidArgument(f"unknown join type {how!r}; one of {list(JOIN_TYPES)}")
        if strategy == "shuffle":
            width = max(self.plan.output_partitions, other.output_partitions)
            left = self._hashed(self.plan, [key for key, _ in pairs], width)
            right_side = self._hashed(other, [key for _, key in pairs], width)
            return self._then(HashJoin(left, right_side, pairs, how, collect_left=False))
        if strategy != "broadcast":
            raise InvalidArgument(f"unknown join strategy {strategy!r}: broadcast or shuffle")
        if needs_all_right_rows(how) and other.output_partitions > 1:
            other = Coalesce(other)  # each left row must meet every right row in one place
        return self._then(HashJoin(self.plan, other, pairs, how))

    def _hashed(self, plan: ExecutionPlan, keys: list[str], width: int) -> ExecutionPlan:
        """`plan` hash-partitioned on `keys` into `width` partitions (as it is if it already is)."""
        exprs = tuple(col(key) for key in keys)
        if width == 1 or (output_hash_keys(plan) == exprs and plan.output_partitions == width):
            return plan
        return self._shuffle(plan, HashPartitioned(exprs, co_partitioned=True), width)

    def sort(self, *keys: str | SortKey, fetch: int | None = None) -> PlanBuilder:
        """A total order by `keys` (names sort ascending); `fetch` keeps the first rows only,
        each partition's first `fetch` chosen before they are merged."""
        if not keys:
            raise InvalidArgument("sort needs at least one key")
        sort_keys = [SortKey(col(key)) if isinstance(key, str) else key for key in keys]
        child = self.plan
        if child.output_partitions > 1:
            if fetch is not None:
                child = Sort(child, sort_keys, fetch=fetch, functions=self.functions)
            child = Coalesce(child)
        return self._then(Sort(child, sort_keys, fetch=fetch, functions=self.functions))

    def limit(self, fetch: int | None, skip: int = 0) -> PlanBuilder:
        """The first `fetch` rows after `skip` (of the partitions in order of arrival unless
        sorted first); each partition stops after `skip + fetch`."""
        child = self.plan
        if child.output_partitions > 1:
            if fetch is not None:
                child = Limit(child, skip + fetch)
            child = Coalesce(child)
        return self._then(Limit(child, fetch, skip))

    def union(self, *others: PlanBuilder | ExecutionPlan) -> PlanBuilder:
        """The rows of this and every other input (their partitions side by side)."""
        plans = [o.plan if isinstance(o, PlanBuilder) else o for o in others]
        return self._then(Union([self.plan, *plans]))

    def repartition(self, *keys: str | Expr, partitions: int) -> PlanBuilder:
        """Hash-partition by `keys` into `partitions`."""
        exprs = tuple(col(key) if isinstance(key, str) else key for key in keys)
        node = Repartition(self.plan, Partitioning(exprs, partitions), functions=self.functions)
        return self._then(node)

    def coalesce(self) -> PlanBuilder:
        """All partitions as one."""
        if self.plan.output_partitions == 1:
            return self
        return self._then(Coalesce(self.plan))

    def __repr__(self) -> str:
        return f"PlanBuilder({self.plan!r})"


COUNT_DISTINCT = "count_distinct"


def _fresh_name(base: str, taken: Sequence[str]) -> str:
    name = f"__{base}"
    while name in taken:
        name += "_"
    return name


def _named(column: Named) -> tuple[Expr, str]:
    if isinstance(column, str):
        return col(column), column
    return column


__all__ = ["PlanBuilder", "desc", "from_table", "plan_from"]
