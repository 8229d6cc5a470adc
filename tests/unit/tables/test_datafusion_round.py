"""DataFusion's round in HoraeDB's read predicates, with DataFusion itself as the reference:
`(x * 10.powi(d)).round() / 10.powi(d)`, so past a float's range it is infinity where Arrow's
round with digits failed the read ('overflow occurred during rounding'), and a negative `d`
multiplies by a power's inverse."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .datafusion_reference import read_ids

pytestmark = pytest.mark.anyio

ONE_LOOP = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio")]
)
EXTREMES = [1e300, -1e300, 1.7976931348623157e308, 2.5, -2.5, 0.125, 1234.5678, 5e-324, 0.0]


def rows(values: list[float], kind: pa.DataType | None = None) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(len(values)), pa.timestamp("ms")),
            "v": pa.array(values, kind or pa.float64()),
            "id": pa.array(range(len(values)), pa.int64()),
        }
    )


@ONE_LOOP
@pytest.mark.parametrize("kind", [pa.float64(), pa.float32()], ids=str)
@pytest.mark.parametrize("digits", [-30, -2, -1, 1, 2, 7, 23, 38])
async def test_round_to_digits_reads_the_rows_datafusion_returns(
    kind: pa.DataType, digits: int
) -> None:
    values = EXTREMES if kind == pa.float64() else [v for v in EXTREMES if abs(v) < 3e38]
    for where in (f"round(v, {digits}) = v", f"round(v, {digits}) > 1", f"round(v, {digits}) < 0"):
        got, expected = await read_ids(rows(values, kind), where)
        assert got == expected, where


@ONE_LOOP
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=8),
    st.integers(-38, 38),
    st.floats(allow_nan=False, allow_infinity=False),
)
async def test_generated_roundings_read_the_rows_datafusion_returns(
    values: list[float], digits: int, bound: float
) -> None:
    where = f"round(v, {digits}) >= {bound!r}" if math.isfinite(bound) else "true"
    got, expected = await read_ids(rows(values), where)
    assert got == expected
