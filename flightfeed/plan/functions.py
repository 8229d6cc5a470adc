"""What a plan needs from a session: UDFs by name, configuration and a memory budget.

The plan layer cannot import the session layer, so it states its needs as protocols here and
`flightfeed.session.Session` satisfies them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import pyarrow as pa

ScalarFunction = Callable[..., "pa.Array | pa.ChunkedArray"]
"""Vectorized: one array per argument (all of the batch's length) in, one array out."""

GroupedStateFunction = Callable[[Sequence["pa.Array"], "pa.Array", int], Sequence["pa.Array"]]
"""(inputs, group_ids, num_groups) -> one array of length num_groups per state column."""

FinishFunction = Callable[[Sequence["pa.Array"]], "pa.Array"]
"""(states) -> the final value of every group."""


@dataclass(frozen=True)
class ScalarUdf:
    """A session scalar function, vectorized over Arrow arrays.

    `func` receives one array per argument (literal arguments are broadcast) and returns an
    array of the same length; the result is cast to `return_type` if it differs.
    """

    name: str
    func: ScalarFunction
    return_type: pa.DataType


@dataclass(frozen=True)
class AggregateUdf:
    """A session aggregate function, split into mergeable states for partial/final execution.

    All three callables are vectorized over groups (the GroupsAccumulator contract):
    `update(args, group_ids, num_groups)` turns input rows into per-group states,
    `merge(states, group_ids, num_groups)` combines rows of states (from several partials) per
    group, and `finish(states)` turns states into results. `group_ids` is an int64 array mapping
    each input row to a group in `[0, num_groups)`; use numpy (`np.bincount`, `np.add.at`) or a
    pyarrow group-by over it rather than a Python loop.
    """

    name: str
    return_type: pa.DataType
    state_types: tuple[pa.DataType, ...]
    update: GroupedStateFunction
    merge: GroupedStateFunction
    finish: FinishFunction


class FunctionRegistry(Protocol):
    """Resolves function names of a plan to session UDFs (None: not a UDF)."""

    def scalar_udf(self, name: str, /) -> ScalarUdf | None: ...

    def aggregate_udf(self, name: str, /) -> AggregateUdf | None: ...


class PlanSession(FunctionRegistry, Protocol):
    """The session a task runs in, as the plan layer sees it."""

    @property
    def config(self) -> Mapping[str, str]: ...

    @property
    def memory_budget_bytes(self) -> int | None: ...


class BuiltinFunctions:
    """A session with no UDFs: only pyarrow.compute functions and built-in aggregates."""

    config: Mapping[str, str] = MappingProxyType({})
    memory_budget_bytes: int | None = None

    def scalar_udf(self, name: str, /) -> ScalarUdf | None:
        return None

    def aggregate_udf(self, name: str, /) -> AggregateUdf | None:
        return None


BUILTINS = BuiltinFunctions()
"""Function resolution for plans built without a session (no UDFs)."""
