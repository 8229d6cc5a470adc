"""How a failure that is not a flightfeed error reaches the caller (query.query_error): a lost
connection is UNAVAILABLE and names the worker, so that the attempt may be retried and the
worker checked; anything else is an error on the coordinator, which neither is retried nor
leaves a worker out."""

from __future__ import annotations

import asyncio

import anyio
import h2.exceptions
import pytest
from grpclib.const import Status
from grpclib.exceptions import StreamTerminatedError

from flightfeed.coordinator.query import query_error
from flightfeed.coordinator.retries import AttemptFailure, may_cure
from flightfeed.errors import ErrorOrigin, ExecutionError, InvalidArgument, RemoteError

WORKER = "grpc://127.0.0.1:7001"
TASK = ErrorOrigin(WORKER, query_id=bytes(range(16)), stage_id=1, task_number=2)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError("Connection reset by peer"),
        BrokenPipeError(),
        TimeoutError(),
        asyncio.IncompleteReadError(b"", 5),
        h2.exceptions.ProtocolError("Invalid input ConnectionInputs.RECV_HEADERS"),
        StreamTerminatedError("Connection lost"),
        anyio.BrokenResourceError(),
        anyio.EndOfStream(),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_lost_connection_is_unavailable_and_names_the_worker(exc: Exception) -> None:
    error = query_error(exc, TASK)
    assert isinstance(error, RemoteError)
    assert error.grpc_status is Status.UNAVAILABLE
    assert error.origin == TASK
    assert f"connection to worker {WORKER} failed" in error.message
    assert error.error_type == type(exc).__name__
    assert error.__cause__ is exc
    assert may_cure(AttemptFailure(0, (WORKER,), error))


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("a bug"), TypeError("unsupported operand"), KeyError("x"), ZeroDivisionError()],
    ids=lambda exc: type(exc).__name__,
)
def test_a_local_error_in_a_task_is_the_coordinators_and_is_not_retried(exc: Exception) -> None:
    error = query_error(exc, TASK)
    assert isinstance(error, ExecutionError)
    assert error.status is Status.INTERNAL
    assert error.message.startswith(
        f"the coordinator, running task {TASK.task} on {WORKER} failed: {type(exc).__name__}"
    )
    assert "connection" not in error.message
    assert error.origin is not None
    assert error.origin.worker_url == ""  # the coordinator
    assert error.origin.task == TASK.task
    assert error.error_type == type(exc).__name__
    assert error.__cause__ is exc
    assert not may_cure(AttemptFailure(0, (WORKER,), error))


def test_a_local_error_in_the_coordinators_part_of_the_plan() -> None:
    exc = ValueError("negative count")
    error = query_error(exc, None)
    assert isinstance(error, ExecutionError)
    assert error.message == "the coordinator's part of the plan failed: ValueError: negative count"
    assert error.origin == ErrorOrigin()
    assert not may_cure(AttemptFailure(0, (), error))


def test_a_flightfeed_error_is_kept_and_located() -> None:
    exc = InvalidArgument("no such column 'y'")
    error = query_error(exc, TASK)
    assert error is exc
    assert error.origin == TASK
