"""DataFusion's upper and lower in HoraeDB's read predicates (flightfeed.tables.datafusion_case),
with DataFusion itself as the reference: every character whose full case mapping is longer than
one character, inside words, read back with the predicate DataFusion plans. Arrow's one-to-one
mapping lost those rows ('straße' uppercased to 'STRAẞE', not 'STRASSE')."""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pytest
from datafusion import SessionContext

from flightfeed.errors import InvalidArgument
from flightfeed.tables.datafusion_case import _longer_mappings

from .datafusion_reference import read_ids

pytestmark = pytest.mark.anyio

ONE_LOOP = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio")]
)


def words(upper: bool) -> list[str]:
    """Each character with a longer mapping inside a word, plus plain words and a NULL."""
    mapped, _ = _longer_mappings(upper)
    return [f"a{char}b" for char in mapped] + ["plain", "Straße", "İstanbul", "ﬁsh"]


def table(values: list[str | None]) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(range(len(values)), pa.timestamp("ms")),
            "w": pa.array(values, pa.string()),
            "id": pa.array(range(len(values)), pa.int64()),
        }
    )


CASES: Final = {"upper": True, "lower": False}


@ONE_LOOP
@pytest.mark.parametrize("function", CASES)
async def test_full_case_mapping_reads_the_rows_datafusion_returns(function: str) -> None:
    values = words(CASES[function])
    ctx = SessionContext()
    ctx.register_record_batches("t", [table([*values, None]).to_batches()])
    mapped = ctx.sql(f"SELECT {function}(w) AS m FROM t").to_arrow_table().column("m")
    listed = ", ".join("'" + v.replace("'", "''") + "'" for v in mapped.to_pylist() if v)
    got, expected = await read_ids(table([*values, None]), f"{function}(w) IN ({listed})")
    assert expected == list(range(len(values)))  # every word but the NULL
    assert got == expected


@ONE_LOOP
async def test_a_single_row_test_as_a_user_writes_it() -> None:
    got, expected = await read_ids(table(["Straße", "strasse", "STRASSE"]), "upper(w) = 'STRASSE'")
    assert got == expected == [0, 1, 2]


@ONE_LOOP
async def test_lower_over_a_capital_sigma_is_refused_not_guessed() -> None:
    """DataFusion lowers it by its place in a word (a final sigma at a word's end)."""
    with pytest.raises(InvalidArgument, match=r"lower\(\) over a value holding 'Σ' is refused"):
        await read_ids(table(["ΟΔΟΣ", "plain"]), "lower(w) = 'plain'")
    got, expected = await read_ids(table(["ΟΔΟΣ", "plain"]), "upper(w) = 'ΟΔΟΣ'")
    assert got == expected == [0]
