"""What a column takes on write (`tables/assign.py`): values of its own kind, through Arrow's
safe cast. Values a write converts come back as they were (or a float rounded to FLOAT); values
of another kind, or out of the column's range, are refused naming the column."""

from __future__ import annotations

import datetime
import decimal
import math
import re

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.tables.assign import assign

INTEGERS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
UNSIGNED = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
NOON = datetime.datetime(2020, 1, 1, 12, 30)
SCALE_18 = decimal.Decimal("1e-18")
WIDE = decimal.Context(prec=60)


def stored(values: pa.Array, target: pa.DataType) -> list[object]:
    converted: list[object] = assign(
        "c", str(target), target, pa.chunked_array([values])
    ).to_pylist()
    return converted


@pytest.mark.parametrize(
    ("values", "target", "expected"),
    [
        (pa.array([1, None, -3], pa.int8()), pa.int64(), [1, None, -3]),
        (pa.array([2**40]), pa.float64(), [float(2**40)]),
        (pa.array([1.5], pa.float32()), pa.float64(), [1.5]),
        (pa.array([0.1]), pa.float32(), [pa.scalar(0.1, pa.float32()).as_py()]),  # rounded
        (pa.array([math.inf, -math.inf]), pa.float32(), [math.inf, -math.inf]),
        (pa.array([decimal.Decimal("1.10")], pa.decimal128(5, 2)), pa.float64(), [1.1]),
        # Spark's decimal for Python's Decimals: 0.1 was refused ("would be stored as 0.1")
        (pa.array([decimal.Decimal("0.1")], pa.decimal128(38, 18)), pa.float64(), [0.1]),
        # (stored as 1.2340000000000002e-06 by Arrow's cast, and as 0.09999999999999999)
        (
            pa.array([decimal.Decimal("0.000001234")], pa.decimal128(38, 18)),
            pa.float64(),
            [1.234e-06],
        ),
        (pa.array([decimal.Decimal("0.1")], pa.decimal256(40, 20)), pa.float64(), [0.1]),
        (pa.array([decimal.Decimal(10) ** 70], pa.decimal256(76, 0)), pa.float64(), [1e70]),
        (
            pa.array([decimal.Decimal("0.1")], pa.decimal128(38, 18)),
            pa.float32(),
            [pa.scalar(0.1, pa.float32()).as_py()],  # (Arrow's cast: 0.09999999403953552)
        ),
        (pa.array(["a"], pa.large_string()), pa.string(), ["a"]),
        (pa.array(["a"]).dictionary_encode(), pa.string(), ["a"]),
        (pa.array([b"a"], pa.binary_view()), pa.binary(), [b"a"]),
        (pa.array([NOON], pa.timestamp("us", "UTC")), pa.timestamp("ms"), [NOON]),
        (pa.nulls(2), pa.bool_(), [None, None]),
    ],
)
def test_a_column_takes_values_of_its_kind_converted_exactly(
    values: pa.Array, target: pa.DataType, expected: list[object]
) -> None:
    assert stored(values, target) == expected


@pytest.mark.parametrize(
    ("values", "target", "message"),
    [
        (pa.array(["12"]), pa.int64(), "does not take string values"),
        (pa.array(["true"]), pa.bool_(), "does not take string values"),
        (pa.array(["2020-01-01"]), pa.timestamp("ms"), "does not take string values"),
        (pa.array(["a"]).dictionary_encode(), pa.int32(), "does not take string values"),
        (pa.array([1]), pa.bool_(), "does not take int64 values"),
        (pa.array([True]), pa.int64(), "does not take bool values"),
        (pa.array([1_000]), pa.timestamp("ms"), "does not take int64 values"),
        (pa.array([18_000], pa.int32()), pa.date32(), "does not take int32 values"),
        (pa.array([b"a"]), pa.int64(), "does not take binary values"),
        (pa.array([42]), pa.string(), "does not take int64 values"),
        (pa.array([True]), pa.string(), "does not take bool values"),
        (pa.array(["a"]), pa.binary(), "does not take string values"),
        (pa.array([b"a"]), pa.string(), "does not take binary values"),
        (pa.array([datetime.date(2020, 1, 1)]), pa.timestamp("ms"), "does not take date32"),
        (pa.array([NOON], pa.timestamp("ms")), pa.date32(), "does not take timestamp"),
        (pa.array([1.0e40]), pa.float32(), "value 1e\\+40 is out of the column.s range"),
        (pa.array([300]), pa.int8(), "cannot store int64 values .*300"),
        (pa.array([1.5]), pa.int64(), "cannot store double values .*truncated"),
        (pa.array([2**53 + 1]), pa.float64(), "cannot store int64 values"),
        (pa.array([1_500], pa.timestamp("us")), pa.timestamp("ms"), "cannot store"),
        (  # (it was stored as 9007199254740992.0: Arrow rounds a decimal into a float)
            pa.array([decimal.Decimal(2**53 + 1)], pa.decimal128(20, 0)),
            pa.float64(),
            "value 9007199254740993 is not exactly a float: it would be stored as 9007199254740992",
        ),
        (
            pa.array([decimal.Decimal("0.100000000000000001")], pa.decimal128(38, 18)),
            pa.float64(),
            "value 0.100000000000000001 is not exactly a float",
        ),
        (
            pa.array([decimal.Decimal(10**70 + 1)], pa.decimal256(76, 0)),
            pa.float64(),
            "is not exactly a float: it would be stored as 1e\\+70",
        ),
        (
            pa.array([decimal.Decimal(10) ** 50], pa.decimal256(76, 0)),
            pa.float32(),
            "value 1" + "0" * 50 + " is out of the column.s range",
        ),
    ],
)
def test_a_column_refuses_other_kinds_and_values_out_of_its_range(
    values: pa.Array, target: pa.DataType, message: str
) -> None:
    with pytest.raises(
        InvalidArgument, match=f"column 'c' is {re.escape(str(target))}: .*{message}"
    ):
        stored(values, target)


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.decimals(allow_nan=False, allow_infinity=False, places=18).filter(
                lambda d: abs(d) < 10**19
            ),
            st.floats(allow_nan=False, allow_infinity=False, min_value=-1e19, max_value=1e19).map(
                lambda f: decimal.Decimal(repr(f)).quantize(SCALE_18, context=WIDE)
            ),
        ),
        max_size=8,
    )
)
def test_a_decimal_is_stored_as_its_nearest_double_where_that_denotes_it(
    values: list[decimal.Decimal | None],
) -> None:
    """Python's float() of a Decimal is correctly rounded, and repr() is the shortest form
    that reads back: the reference. Spark's decimal(38, 18), half of them the shortest form
    of a double (which a user's Decimal("0.1") usually is)."""
    incoming = pa.array(values, pa.decimal128(38, 18))
    denotes = [v is None or decimal.Decimal(repr(float(v))) == v for v in values]
    if all(denotes):
        assert stored(incoming, pa.float64()) == [None if v is None else float(v) for v in values]
    else:
        with pytest.raises(InvalidArgument, match="is not exactly a float"):
            stored(incoming, pa.float64())


def integer_range(arrow: pa.DataType) -> range:
    bits = arrow.bit_width
    if pa.types.is_unsigned_integer(arrow):
        return range(2**bits)
    return range(-(2 ** (bits - 1)), 2 ** (bits - 1))


@given(
    st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=20),
    st.sampled_from(INTEGERS + UNSIGNED),
)
def test_an_integer_is_stored_exactly_or_refused(
    values: list[int | None], target: pa.DataType
) -> None:
    incoming = pa.array(values, pa.int64())
    if all(v is None or v in integer_range(target) for v in values):
        assert stored(incoming, target) == values
    else:
        with pytest.raises(InvalidArgument, match="not in range"):
            stored(incoming, target)
