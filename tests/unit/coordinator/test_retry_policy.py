"""When a failed attempt runs again (retries.py): only for a lost worker or an unavailable one,
never after a batch reached the caller or past the attempts; the final error keeps the last
attempt's class and names every attempt."""

from __future__ import annotations

from grpclib.const import Status

from flightfeed.coordinator.retries import AttemptFailure, final_error, may_cure, why_final
from flightfeed.errors import (
    ErrorOrigin,
    ExecutionError,
    FeedError,
    RemoteError,
    Unavailable,
)

QUERY = bytes(range(16))
LOST = RemoteError(
    "Connection lost", grpc_status=Status.UNAVAILABLE, origin=ErrorOrigin("grpc://b:1")
)


def failure(
    error: Exception, attempt: int = 0, lost: dict[str, str] | None = None
) -> AttemptFailure:
    assert isinstance(error, RemoteError | Unavailable | ExecutionError | FeedError)
    return AttemptFailure(attempt, ("grpc://a:1", "grpc://b:1"), error, lost or {})


def final(f: AttemptFailure, *, max_attempts: int = 3, delivered: int = 0) -> str | None:
    return why_final(f, max_attempts=max_attempts, batches_delivered=delivered, unreplayable=[])


def test_a_lost_worker_or_an_unavailable_one_may_be_cured() -> None:
    assert may_cure(failure(LOST))
    assert may_cure(failure(Unavailable("the worker is shutting down")))
    assert may_cure(failure(ExecutionError("boom"), lost={"grpc://b:1": "refused"}))
    assert not may_cure(failure(ExecutionError("division by zero")))
    assert not may_cure(failure(FeedError("the source is corrupt")))
    internal = RemoteError("bad", grpc_status=Status.INTERNAL)
    assert not may_cure(failure(internal))


def test_a_curable_failure_runs_again_while_nothing_was_delivered() -> None:
    assert final(failure(LOST)) is None
    assert final(failure(LOST, attempt=1)) is None


def test_no_retry_after_a_batch_reached_the_caller() -> None:
    why = final(failure(LOST), delivered=2)
    assert why is not None
    assert "2 result batch(es) had reached the caller" in why


def test_attempts_are_bounded() -> None:
    why = final(failure(LOST, attempt=2))
    assert why == "no attempts left (at most 3)"


def test_unreplayable_feeds_end_the_query() -> None:
    why = why_final(
        failure(LOST), max_attempts=3, batches_delivered=0, unreplayable=["feed ab partition 3"]
    )
    assert why == "feed partitions cannot be replayed: feed ab partition 3"


def test_the_querys_own_error_or_retries_off_give_the_error_as_it_is() -> None:
    own = failure(ExecutionError("division by zero"))
    assert final(own) == ""
    assert final_error(QUERY, [own], "") is own.error
    assert final(failure(LOST), max_attempts=1) == ""
    assert final_error(QUERY, [failure(LOST)], "") is LOST


def test_the_final_error_names_every_attempt_and_keeps_the_last_class() -> None:
    first = failure(LOST, attempt=0, lost={"grpc://b:1": "connection refused"})
    second = failure(Unavailable("the worker is shutting down"), attempt=1)
    error = final_error(QUERY, [first, second], "no attempts left (at most 2)")
    assert isinstance(error, Unavailable)
    assert error.__cause__ is second.error
    text = str(error)
    assert text.startswith(f"query {QUERY.hex()} failed after 2 attempt(s) (no attempts left")
    assert "attempt 0 on grpc://a:1, grpc://b:1: Connection lost" in text
    assert "lost grpc://b:1 (connection refused)" in text
    assert "attempt 1 on grpc://a:1, grpc://b:1: the worker is shutting down" in text


def test_a_remote_error_stays_one_with_its_status() -> None:
    error = final_error(QUERY, [failure(LOST), failure(LOST, attempt=1)], "no attempts left")
    assert isinstance(error, RemoteError)
    assert error.grpc_status is Status.UNAVAILABLE
