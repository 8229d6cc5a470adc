"""When a failed query attempt is run again, and the error of one that is not.

A query is retried as a whole: every task runs again as a new attempt (the attempt number is in
each TaskKey, so nothing of the failed attempt is ever read by the new one), on the workers
still reachable, its feed partitions replaying exactly the units the failed attempt was given
(feeds/replay.py), then going on. Restarting every stage is the simple way to keep a result
exact: a stage's tasks consume their inputs once, so restarting only the failed task would
need every reader of it (and every reader of those) to start over anyway.

The one thing a retry cannot take back is a row the caller already has. So an attempt is
retried only while no batch of it has reached the caller's stream; after that, a failure is
final. Most plans emit their rows at the end (aggregations, sorts, joins' probe after build),
and there a lost worker costs a retry; a plan that streams rows out as units arrive fails
instead of passing a row twice. A result is exact and complete, or an error.

An attempt is retried when it lost a worker (one stopped answering: `WorkerHealth.lost`) or its
error is the kind a retry may cure (UNAVAILABLE: a lost connection, a worker shutting down). An
error of the query itself (a UDF's, a provider's, a bad plan) fails it at once: it would fail
again. Attempts are bounded; the final error names every attempt, its workers and its cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from grpclib.const import Status

from ..errors import FlightfeedError, RemoteError, Unavailable

DEFAULT_MAX_ATTEMPTS: Final = 3
"""Attempts of a query (the first included) before its failure is final."""


@dataclass(frozen=True)
class AttemptFailure:
    """How one attempt of a query failed: its error, and the workers it lost (URL → why)."""

    attempt: int
    workers: tuple[str, ...]
    error: FlightfeedError
    lost: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        where = ", ".join(self.workers) or "the coordinator"
        lost = "".join(f"; lost {url} ({why})" for url, why in self.lost.items())
        return f"attempt {self.attempt} on {where}: {self.error.described}{lost}"


def may_cure(failure: AttemptFailure) -> bool:
    """Whether running the query again may succeed: a worker was lost, or the error says the
    peer was unavailable (a lost connection, a worker draining)."""
    if failure.lost:
        return True
    error = failure.error
    if isinstance(error, Unavailable):
        return True
    return isinstance(error, RemoteError) and error.grpc_status is Status.UNAVAILABLE


def why_final(
    failure: AttemptFailure,
    *,
    max_attempts: int,
    batches_delivered: int,
    unreplayable: list[str],
) -> str | None:
    """Why this failure ends the query (None: run it again; "": the error speaks for itself)."""
    if not may_cure(failure) or max_attempts == 1:
        return ""  # the query's own error, or retries are off
    if failure.attempt + 1 >= max_attempts:
        return f"no attempts left (at most {max_attempts})"
    if batches_delivered:
        return (
            f"{batches_delivered} result batch(es) had reached the caller already; a retry"
            " could pass their rows twice"
        )
    if unreplayable:
        return "feed partitions cannot be replayed: " + "; ".join(unreplayable)
    return None


def final_error(query_id: bytes, failures: list[AttemptFailure], why: str) -> FlightfeedError:
    """The error the caller gets: the last attempt's, its message naming every attempt."""
    last = failures[-1].error
    if len(failures) == 1 and not why:
        return last
    attempts = "; ".join(str(f) for f in failures)
    reason = f" ({why})" if why else ""
    message = f"query {query_id.hex()} failed after {len(failures)} attempt(s){reason}: {attempts}"
    error: FlightfeedError
    if isinstance(last, RemoteError):
        error = RemoteError(
            message, grpc_status=last.grpc_status, origin=last.origin, error_type=last.error_type
        )
    else:
        error = type(last)(message, origin=last.origin, error_type=last.error_type)
    error.__cause__ = last
    return error


__all__ = ["DEFAULT_MAX_ATTEMPTS", "AttemptFailure", "final_error", "may_cure", "why_final"]
