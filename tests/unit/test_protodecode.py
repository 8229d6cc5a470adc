"""flightfeed's message decoder builds exactly what betterproto2's parse builds, for every
message flightfeed receives, from well-formed bytes of any values and from damaged ones: the
same message, or the same refusal."""

from __future__ import annotations

import betterproto2
import pytest
from helpers.message_strategies import messages
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.arrow.flight.protocol import (
    Action,
    Criteria,
    FlightDescriptor,
    HandshakeRequest,
    Ticket,
)
from flightfeed._generated.flightfeed.v1 import (
    ColumnRef,
    CoordinatorToWorkerMsg,
    ExecuteTaskRequest,
    Expr,
    LiteralValue,
    PlanNode,
    SetPlanRequest,
    TaskMetrics,
    WorkerToCoordinatorMsg,
    WorkUnitBatch,
)
from flightfeed._generated.remote_engine import ContiguousRows, WriteBatchRequest, WriteRequest
from flightfeed.errors import InvalidArgument
from flightfeed.messages import parse_strict
from flightfeed.protodecode import decode_message

RECEIVED = [
    WorkerToCoordinatorMsg,
    CoordinatorToWorkerMsg,
    TaskMetrics,
    SetPlanRequest,
    WorkUnitBatch,
    ExecuteTaskRequest,
    PlanNode,
    Ticket,
    Action,
    Criteria,
    FlightDescriptor,
    HandshakeRequest,
    WriteBatchRequest,  # HoraeDB's writes: runs of repeated bytes, one element a row
    WriteRequest,
    ContiguousRows,
]


@pytest.mark.parametrize("cls", RECEIVED, ids=lambda cls: cls.__name__)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_the_messages_are_betterproto2s(
    cls: type[betterproto2.Message], data: st.DataObject
) -> None:
    wire = bytes(data.draw(messages(cls)))
    assert decode_message(cls, wire) == cls.parse(wire)
    assert parse_strict(cls, wire) == cls.parse(wire)


def _reference(cls: type[betterproto2.Message], wire: bytes) -> object:
    """What betterproto2 makes of bytes the strict check let through: a message or an error."""
    try:
        return cls.parse(wire)
    except Exception:
        return "refused"


@pytest.mark.parametrize(
    "cls", [WorkerToCoordinatorMsg, CoordinatorToWorkerMsg, PlanNode, ContiguousRows]
)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_bytes_give_the_same_message_or_a_refusal(
    cls: type[betterproto2.Message], data: st.DataObject
) -> None:
    wire = bytearray(bytes(data.draw(messages(cls))))
    for _ in range(data.draw(st.integers(1, 3))):
        if wire and data.draw(st.booleans()):
            wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
        else:
            wire[data.draw(st.integers(0, len(wire))) :] = data.draw(st.binary(max_size=8))
    try:
        ours: object = parse_strict(cls, bytes(wire))
    except InvalidArgument:
        return  # refused with a clear error: fine whatever betterproto2 would have made of it
    assert ours == _reference(cls, bytes(wire))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.binary(max_size=300), max_size=40))
def test_runs_of_repeated_bytes_with_other_fields_between(rows: list[bytes]) -> None:
    """A run of one repeated bytes field (read in a loop of its own), broken by another field,
    then resumed: the elements in order, 1- and 2-byte lengths alike."""
    cut = len(rows) // 2
    first = ContiguousRows(schema_version=1, encoded_rows=rows[:cut])
    second = ContiguousRows(encoded_rows=rows[cut:])
    middle = ContiguousRows(schema_version=7)
    wire = bytes(first) + bytes(middle) + bytes(second)
    assert decode_message(ContiguousRows, wire) == ContiguousRows.parse(wire)
    assert parse_strict(ContiguousRows, wire).encoded_rows == rows


def test_a_second_member_of_a_oneof_is_refused() -> None:
    """Protobuf keeps the last member of a oneof; betterproto2 keeps both, and its
    `which_one_of` raises a RuntimeError wherever the message is read: refused as it arrives."""
    both = bytes(Expr(column=ColumnRef("host"))) + bytes(Expr(literal=LiteralValue(b"")))
    with pytest.raises(RuntimeError, match="more than one field set in oneof"):
        betterproto2.which_one_of(Expr.parse(both), "expr")
    with pytest.raises(InvalidArgument, match=r"^Expr sets both column and literal of a oneof$"):
        parse_strict(Expr, both)
    twice = bytes(Expr(column=ColumnRef("a"))) + bytes(Expr(column=ColumnRef("b")))
    assert parse_strict(Expr, twice) == Expr.parse(twice)  # one member twice: the last one
