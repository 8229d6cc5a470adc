"""The error kinds: one table of classes, statuses and wire codes; origins; components."""

from __future__ import annotations

import pytest
from grpclib.const import Status

from flightfeed.errors import (
    ERROR_KINDS,
    AlreadyExists,
    Cancelled,
    Conflict,
    ErrorOrigin,
    ExecutionError,
    FeedError,
    FlightfeedError,
    InvalidArgument,
    NotFound,
    PlanDecodeError,
    ResourceExhausted,
    Unauthenticated,
    Unimplemented,
    UnknownUdfError,
    VersionMismatch,
    as_flightfeed_error,
)
from flightfeed.protocol import ErrorCode


def test_every_kind_has_a_wire_code_and_a_distinct_code() -> None:
    assert set(ERROR_KINDS) <= set(ErrorCode.__members__)
    assert len({cls.code for cls in ERROR_KINDS.values()}) == len(ERROR_KINDS)
    for code, cls in ERROR_KINDS.items():
        assert cls.code == code


@pytest.mark.parametrize(
    ("cls", "status"),
    [
        (FlightfeedError, Status.INTERNAL),
        (InvalidArgument, Status.INVALID_ARGUMENT),
        (PlanDecodeError, Status.INVALID_ARGUMENT),
        (UnknownUdfError, Status.INVALID_ARGUMENT),
        (NotFound, Status.NOT_FOUND),
        (ExecutionError, Status.INTERNAL),
        (FeedError, Status.ABORTED),
        (VersionMismatch, Status.FAILED_PRECONDITION),
        (Cancelled, Status.CANCELLED),
        (ResourceExhausted, Status.RESOURCE_EXHAUSTED),
        (Unimplemented, Status.UNIMPLEMENTED),
        (Unauthenticated, Status.UNAUTHENTICATED),
        (AlreadyExists, Status.ALREADY_EXISTS),
        (Conflict, Status.FAILED_PRECONDITION),
    ],
)
def test_each_kind_maps_to_its_status(cls: type[FlightfeedError], status: Status) -> None:
    assert cls.status == status
    assert ERROR_KINDS[cls.code] is cls


def test_a_foreign_exception_keeps_its_class_name_and_says_which_part_failed() -> None:
    error = as_flightfeed_error(KeyError("XYZ"), "session builder")
    assert isinstance(error, ExecutionError)
    assert error.error_type == "KeyError"
    assert error.message == "session builder failed: 'XYZ'"
    assert error.described == "KeyError: session builder failed: 'XYZ'"
    assert error.origin is not None
    assert error.origin.component == "session builder"
    assert isinstance(error.__cause__, KeyError)


def test_a_flightfeed_error_keeps_its_class_and_gains_the_component_once() -> None:
    original = InvalidArgument("bad x-scale header")
    error = as_flightfeed_error(original, "session builder")
    assert error is original
    assert error.message == "session builder failed: bad x-scale header"
    again = as_flightfeed_error(error, "plan decode")  # the first component named wins
    assert again.message == "session builder failed: bad x-scale header"
    assert again.origin is not None
    assert again.origin.component == "session builder"


def test_locate_fills_in_the_place_unless_one_closer_to_the_cause_did() -> None:
    worker = ErrorOrigin("grpc://w:1", b"\x01", 2, 3, 0)
    error = as_flightfeed_error(RuntimeError("boom"), "session builder").locate(worker)
    assert error.origin == ErrorOrigin("grpc://w:1", b"\x01", 2, 3, 0, "session builder")
    provider = ErrorOrigin(query_id=b"\x01", task_number=1, component="feed provider")
    located = FeedError("page expired", origin=provider).locate(worker)
    assert located.origin == provider  # it happened on the coordinator, not on the worker


def test_origins_name_the_place_and_the_task() -> None:
    assert str(ErrorOrigin("grpc://w:1", b"\xab", 2, 3, 1)) == "grpc://w:1 task ab/2/3#1"
    assert str(ErrorOrigin(query_id=b"\xab")) == "the coordinator task ab/0/0#0"
    assert str(InvalidArgument("x", origin=ErrorOrigin("grpc://w:1"))) == "x (at grpc://w:1)"
    assert str(InvalidArgument("x", origin=ErrorOrigin(component="plan decode"))) == "x"
