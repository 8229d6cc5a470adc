"""A table query's arguments on the wire: every int64, and nothing past it (the encoder wrapped
2**64 - 1 to -1 and 2**63 to -2**63, and the table was called with those)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.coordinator import table_command
from flightfeed.coordinator.table_query import parse_table_query
from flightfeed.errors import InvalidArgument
from flightfeed.flight import FlightDescriptor


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_every_64_bit_integer_arrives_as_sent(value: int) -> None:
    query = parse_table_query(FlightDescriptor(cmd=table_command("scan", [value])))
    assert query.arguments == (value,)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1)))
def test_an_integer_past_64_bits_is_refused_naming_the_argument(value: int) -> None:
    with pytest.raises(InvalidArgument, match=rf"argument 1 of scan\(\.\.\.\) is {value}, outside"):
        table_command("scan", ["x", value])
