"""Shared helpers of the plan tests: run plans, compare tables regardless of row order."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flightfeed.plan import ExecutionPlan, collect, open_task_context
from flightfeed.plan.functions import PlanSession
from flightfeed.session import Session


async def run(
    plan: ExecutionPlan, session: PlanSession | None = None, *, offload: int = 1 << 20
) -> pa.Table:
    """All partitions of `plan` in a fresh task context, as one table."""
    async with open_task_context(session or Session(), offload_threshold_bytes=offload) as ctx:
        return await collect(plan, ctx)


def sorted_rows(table: pa.Table, keys: Sequence[str] | None = None) -> list[dict[str, object]]:
    """Rows as dicts, in a canonical order, for order-insensitive comparison."""
    rows: list[dict[str, object]] = table.to_pylist()
    names = list(keys) if keys is not None else table.column_names
    return sorted(rows, key=lambda r: tuple((r[k] is None, repr(r[k])) for k in names))


def sample_table(rows: int = 1000) -> pa.Table:
    """Keys with repeats and nulls, floats with nulls, strings: enough to exercise every node."""
    return pa.table(
        {
            "k": pa.array([None if i % 17 == 0 else i % 7 for i in range(rows)], pa.int32()),
            "g": pa.array([f"g{i % 3}" for i in range(rows)]),
            "v": pa.array([None if i % 11 == 0 else float(i % 13) - 4.5 for i in range(rows)]),
            "n": pa.array(list(range(rows)), pa.int64()),
        }
    )
