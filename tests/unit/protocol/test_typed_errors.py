"""TypedErrors: a flightfeed peer rebuilds the very error a server raised."""

from __future__ import annotations

import pytest
from grpclib.const import Status
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import (
    ERROR_KINDS,
    ErrorOrigin,
    ExecutionError,
    FlightfeedError,
    RemoteError,
)
from flightfeed.protocol import (
    ERROR_TRAILER,
    TYPED_ERRORS,
    ErrorCode,
    ErrorDetail,
    from_detail,
    to_detail,
)

origins = st.one_of(
    st.none(),
    st.builds(
        ErrorOrigin,
        worker_url=st.sampled_from(["", "grpc://w1:8000", "inproc://abc"]),
        query_id=st.binary(max_size=16),
        stage_id=st.integers(0, 2**32),
        task_number=st.integers(0, 2**32),
        attempt=st.integers(0, 100),
        component=st.sampled_from(["", "session builder", "feed provider"]),
    ),
)


def _same_origin(found: ErrorOrigin | None, sent: ErrorOrigin | None) -> bool:
    if sent is None or not (sent.worker_url or sent.query_id or sent.component):
        return found is None
    if not sent.query_id:  # no task: the task fields do not travel
        sent = ErrorOrigin(worker_url=sent.worker_url, component=sent.component)
    return found == sent


@given(
    cls=st.sampled_from(sorted(ERROR_KINDS.values(), key=lambda c: c.code)),
    message=st.text(max_size=200),
    error_type=st.sampled_from(["", "KeyError", "ValueError"]),
    origin=origins,
)
def test_round_trip_through_the_trailer(
    cls: type[FlightfeedError], message: str, error_type: str, origin: ErrorOrigin | None
) -> None:
    sent = cls(message, origin=origin, error_type=error_type)
    reply = TYPED_ERRORS.reply(sent)
    assert reply.status == cls.status
    found = TYPED_ERRORS.error(reply.status, reply.message, reply.trailers)
    assert type(found) is cls
    assert found.message == message
    assert found.error_type == (error_type or cls.__name__)
    assert _same_origin(found.origin, origin)


def test_a_foreign_exception_arrives_as_execution_error_with_its_class_name() -> None:
    reply = TYPED_ERRORS.reply(KeyError("k"))
    assert reply.message == "KeyError: 'k'"
    found = TYPED_ERRORS.error(reply.status, reply.message, reply.trailers)
    assert isinstance(found, ExecutionError)
    assert (found.error_type, found.message) == ("KeyError", "'k'")


def test_an_unknown_code_gives_the_root_class_with_the_message() -> None:
    found = from_detail(ErrorDetail(code=ErrorCode.TIMEOUT, message="late"))
    assert type(found) is FlightfeedError
    assert found.message == "late"


@pytest.mark.parametrize("raw", [b"\xff\xff\xff", "text, not bytes"])
def test_an_undecodable_trailer_still_gives_the_status_and_says_so(raw: object) -> None:
    found = TYPED_ERRORS.error(Status.INTERNAL, "boom", {ERROR_TRAILER: raw})
    assert isinstance(found, RemoteError)
    assert found.grpc_status == Status.INTERNAL
    assert found.message.startswith(f"boom (its {ERROR_TRAILER} trailer is undecodable")


def test_without_a_trailer_it_is_a_plain_status() -> None:
    found = TYPED_ERRORS.error(Status.UNAVAILABLE, "Connection lost", {})
    assert isinstance(found, RemoteError)
    assert found.grpc_status == Status.UNAVAILABLE


def test_detail_fields_follow_the_origin() -> None:
    origin = ErrorOrigin("grpc://w:1", b"\x01\x02", 3, 4, 5, "plan decode")
    detail = to_detail(FlightfeedError("x", origin=origin))
    assert (detail.worker_url, detail.component) == ("grpc://w:1", "plan decode")
    assert detail.task_key is not None
    assert (detail.task_key.query_id, detail.task_key.attempt) == (b"\x01\x02", 5)
    assert to_detail(FlightfeedError("x")).task_key is None
