"""A command sent to the wrong kind of server is named as what it is. A coordinator's
TableQuery and a worker's TableCommand both carry a version in field 1 and something
length-delimited in field 2, so each parsed as far as that on the other's server: a worker
answered 'unsupported protobuf wire type 3', a coordinator 'no table '\\x1a\\x07metrics''."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.flightfeed.v1 import TableCommand, TableRef
from flightfeed.coordinator import table_command
from flightfeed.coordinator.table_query import parse_table_query
from flightfeed.errors import InvalidArgument
from flightfeed.flight import FlightDescriptor
from flightfeed.tables.flight import parse_command

names = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "Pc", "Pd"]), min_size=1, max_size=30
)


def worker_command(table: str, schema: str = "", catalog: str = "") -> bytes:
    return bytes(
        TableCommand(version=1, table=TableRef(catalog=catalog, schema=schema, table=table))
    )


@settings(max_examples=100, deadline=None)
@given(names, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
def test_a_worker_names_a_coordinators_query(table: str, arguments: list[int]) -> None:
    command = table_command(table, arguments, columns=["c"])
    with pytest.raises(InvalidArgument) as refused:
        parse_command(FlightDescriptor(cmd=command))
    assert f"a coordinator's TableQuery (of its catalog's table {table!r})" in str(refused.value)
    assert "send it to the coordinator" in str(refused.value)
    assert parse_table_query(FlightDescriptor(cmd=command)).table == table  # its own server


@settings(max_examples=100, deadline=None)
@given(names, st.sampled_from(["", "public"]))
def test_a_coordinator_names_a_workers_table_read(table: str, schema: str) -> None:
    command = worker_command(table, schema)
    with pytest.raises(InvalidArgument) as refused:
        parse_table_query(FlightDescriptor(cmd=command))
    named = f"{schema}.{table}" if schema else table
    assert f"a worker's TableCommand (a read of durable table {named!r})" in str(refused.value)
    assert parse_command(FlightDescriptor(cmd=command)).read.name.table == table  # its own server


def test_other_bytes_are_still_not_a_table_command() -> None:
    with pytest.raises(InvalidArgument, match="the descriptor's command is not a TableCommand"):
        parse_command(FlightDescriptor(cmd=b"\x08\x01\x12\x03abc\xff"))
