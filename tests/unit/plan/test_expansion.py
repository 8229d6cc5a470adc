"""Functions whose output can dwarf their input are sized before they run, against the
session's memory budget; below it they run as before."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightfeed.errors import ResourceExhausted
from flightfeed.plan import MemoryScan, Projection, call, col, lit
from flightfeed.plan.execution import collect, open_task_context
from flightfeed.plan.expansion import check_expansion
from flightfeed.plan.expr import Expr, evaluate
from flightfeed.session import SessionStateBuilder

BUDGET = 1 << 20
session = SessionStateBuilder().with_memory_budget(BUDGET).build()
batch = pa.record_batch({"s": ["ab", "c", None], "n": [1 << 20, 3, 5]})


def test_a_repeat_over_the_budget_is_refused_before_it_runs() -> None:
    with pytest.raises(ResourceExhausted, match="'binary_repeat' would produce about 20971"):
        evaluate(call("binary_repeat", col("s"), col("n")), batch, session)


def test_a_repeat_of_a_constant_counts_every_row() -> None:
    expr = call("binary_repeat", lit(b"x" * 1024), lit(512))  # 512 KiB per row, 3 rows
    with pytest.raises(ResourceExhausted, match="1572864 bytes"):
        evaluate(expr, batch, session)


def test_within_the_budget_nothing_changes() -> None:
    small = pa.record_batch({"s": ["ab", "c", None], "n": [2, 3, 5]})
    out = evaluate(call("binary_repeat", col("s"), col("n")), small, session)
    assert out.to_pylist() == ["abab", "ccc", None]


def test_padding_is_sized_by_its_width() -> None:
    wide = pc.PadOptions(width=1 << 20)
    with pytest.raises(ResourceExhausted, match="utf8_lpad"):
        evaluate(call("utf8_lpad", col("s"), options=wide), batch, session)
    narrow = evaluate(call("utf8_lpad", col("s"), options=pc.PadOptions(width=3)), batch, session)
    assert narrow.to_pylist() == [" ab", "  c", None]


def test_without_a_budget_nothing_is_checked() -> None:
    check_expansion("binary_repeat", [pa.scalar(b"x"), pa.scalar(1 << 40)], None, 1, None)


def test_planning_a_huge_constant_computes_nothing() -> None:
    """Type inference used to evaluate calls over literals: a 1 GiB value while planning."""
    scan = MemoryScan.from_table(pa.table({"k": [1]}))
    plan = Projection(scan, [call("binary_repeat", lit(b"x" * 1024), lit(1 << 20))], ["big"])
    assert plan.schema.field("big").type == pa.binary()


@pytest.mark.anyio
async def test_a_task_fails_with_the_function_named() -> None:
    scan = MemoryScan.from_table(pa.table({"k": [1]}))
    plan = Projection(scan, [call("binary_repeat", lit(b"x" * 1024), lit(1 << 20))], ["big"])
    async with open_task_context(session) as ctx:
        with pytest.raises(ResourceExhausted, match="binary_repeat"):
            await collect(plan, ctx)


@pytest.mark.parametrize(
    "expr",
    [
        call("binary_join_element_wise", col("s"), lit("y" * (1 << 19)), lit("")),
        call("coalesce", col("s"), lit("z" * (1 << 19))),
        call("if_else", call("is_null", col("s")), lit("w" * (1 << 19)), col("s")),
    ],
    ids=["join", "coalesce", "if_else"],
)
def test_a_large_literal_written_into_every_row_counts_every_row(expr: Expr) -> None:
    """512 KiB of literal, 3 rows: 1.5 MiB over the 1 MiB budget, though the literal fits."""
    with pytest.raises(ResourceExhausted, match=r"would produce about 15\d{5} bytes"):
        evaluate(expr, batch, session)
    one_row = batch.slice(0, 1)
    assert len(evaluate(expr, one_row, session)) == 1  # 0.5 MiB: within it, as before
