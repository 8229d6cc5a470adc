"""flightfeed's message encoder writes exactly the bytes betterproto2 writes, for every message
flightfeed sends, with any field values (hypothesis builds them from the classes' schemas)."""

from __future__ import annotations

import betterproto2
import pytest
from helpers.message_strategies import messages
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed._generated.arrow.flight.protocol import FlightData, FlightInfo, PutResult, Ticket
from flightfeed._generated.flightfeed.v1 import (
    CoordinatorToWorkerMsg,
    ErrorDetail,
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
    PlanNode,
    SetPlanRequest,
    TaskMetrics,
    WorkerToCoordinatorMsg,
    WorkUnitBatch,
)
from flightfeed.protoencode import encode_message

SENT = [
    WorkerToCoordinatorMsg,
    CoordinatorToWorkerMsg,
    TaskMetrics,
    SetPlanRequest,
    WorkUnitBatch,
    ExecuteTaskRequest,
    GetWorkerInfoResponse,
    ErrorDetail,
    PlanNode,
    FlightInfo,
    FlightData,
    PutResult,
    Ticket,
]


@pytest.mark.parametrize("cls", SENT, ids=lambda cls: cls.__name__)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_the_bytes_are_betterproto2s(cls: type[betterproto2.Message], data: st.DataObject) -> None:
    message = data.draw(messages(cls))
    assert encode_message(message) == bytes(message)


def test_unknown_fields_are_kept() -> None:
    parsed = Ticket.parse(bytes(Ticket(ticket=b"t")) + b"\x18\x07")  # field 3: unknown here
    assert encode_message(parsed) == bytes(parsed) == bytes(Ticket(ticket=b"t")) + b"\x18\x07"
