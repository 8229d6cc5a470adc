"""flightfeed's exception hierarchy: one root, a few meaningful kinds, each with a gRPC status.

The classes are the one table of error kinds: each names its `status` (what any gRPC or Flight
client sees) and its `code` (what a flightfeed peer uses to rebuild the same class; the
`ErrorCode` enum of the wire protocol has a member of the same name). An error keeps the class
name of the exception it stands for (`error_type`) and where it happened (`origin`: the
component, the worker and the task).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from grpclib.const import Status


@dataclass(frozen=True)
class ErrorOrigin:
    """Where an error happened. An empty `worker_url` means the coordinator (or this process);
    `component` names the part that failed (session builder, feed provider, plan decode, ...)."""

    worker_url: str = ""
    query_id: bytes = b""
    stage_id: int = 0
    task_number: int = 0
    attempt: int = 0
    component: str = ""

    @property
    def task(self) -> str:
        """The task as `query/stage/task#attempt`, or "" when the error is not a task's."""
        if not self.query_id:
            return ""
        return f"{self.query_id.hex()}/{self.stage_id}/{self.task_number}#{self.attempt}"

    def with_component(self, component: str) -> ErrorOrigin:
        return replace(self, component=component)

    def __str__(self) -> str:
        """The place (the component is in the error's message already)."""
        where = self.worker_url or "the coordinator"
        return f"{where} task {self.task}" if self.query_id else where


class FlightfeedError(Exception):
    """Root of every error flightfeed raises on purpose."""

    status: ClassVar[Status] = Status.INTERNAL
    code: ClassVar[str] = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        origin: ErrorOrigin | None = None,
        error_type: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.origin = origin
        self.error_type = error_type or type(self).__name__

    def __str__(self) -> str:
        if self.origin is not None and (self.origin.worker_url or self.origin.query_id):
            return f"{self.message} (at {self.origin})"
        return self.message

    def locate(self, origin: ErrorOrigin) -> FlightfeedError:
        """Say where the error happened, unless a place closer to its cause already did (an
        origin naming a worker or a task); a component named earlier is kept."""
        found = self.origin
        if found is None:
            self.origin = origin
        elif not (found.worker_url or found.query_id):
            self.origin = replace(origin, component=found.component or origin.component)
        return self

    @property
    def described(self) -> str:
        """The message with the original exception's class when it is not this class:
        `KeyError: 'x'` (what a gRPC status message carries to clients of any language)."""
        text = str(self)
        if self.error_type not in (type(self).__name__, ""):
            return f"{self.error_type}: {text}"
        return text


class InvalidArgument(FlightfeedError):
    """The request is malformed: bad ticket, bad frame, out-of-range partitions."""

    status = Status.INVALID_ARGUMENT
    code = "INVALID_ARGUMENT"


class PlanDecodeError(InvalidArgument):
    """Plan bytes could not be decoded into an execution plan."""

    code = "PLAN_DECODE"


class UnknownUdfError(InvalidArgument):
    """A plan names a function the session does not provide (register it in the session)."""

    code = "UNKNOWN_UDF"


class NotFound(FlightfeedError):
    """The request names something the server does not have (task, flight, action)."""

    status = Status.NOT_FOUND
    code = "NOT_FOUND"


class ExecutionError(FlightfeedError):
    """User code or a plan node failed while running; `error_type` is the original class."""

    code = "EXECUTION"


class DataError(ExecutionError):
    """Arrow refused the values a plan computed on (a division by zero, a value a cast cannot
    hold, an overflow): the query's own doing, not the worker's, so INVALID_ARGUMENT and no
    traceback in the worker's log."""

    status = Status.INVALID_ARGUMENT
    code = "DATA"


class FeedError(FlightfeedError):
    """A work-unit feed failed or ended abnormally."""

    status = Status.ABORTED
    code = "FEED"


class VersionMismatch(FlightfeedError):
    """A peer is not a flightfeed worker of this version, so it cannot be given plans."""

    status = Status.FAILED_PRECONDITION
    code = "VERSION_MISMATCH"


class Cancelled(FlightfeedError):
    """The query or task was cancelled."""

    status = Status.CANCELLED
    code = "CANCELLED"


class ResourceExhausted(FlightfeedError):
    """A limit was hit: message size, concurrent tasks, memory budget."""

    status = Status.RESOURCE_EXHAUSTED
    code = "RESOURCE_EXHAUSTED"


class Unimplemented(FlightfeedError):
    """The server does not implement this RPC or action."""

    status = Status.UNIMPLEMENTED
    code = "UNIMPLEMENTED"


class Unauthenticated(FlightfeedError):
    """The call carries no valid credentials (a bearer token) for this server."""

    status = Status.UNAUTHENTICATED
    code = "UNAUTHENTICATED"


class Unavailable(FlightfeedError):
    """The server cannot take the request now (it is shutting down): try another."""

    status = Status.UNAVAILABLE
    code = "UNAVAILABLE"


class AlreadyExists(FlightfeedError):
    """The request would create something that exists already (a table of that name)."""

    status = Status.ALREADY_EXISTS
    code = "ALREADY_EXISTS"


class Conflict(FlightfeedError):
    """The request was made against a state that has changed since (a stale schema version):
    read the state again and retry."""

    status = Status.FAILED_PRECONDITION
    code = "CONFLICT"


class CredentialsRefused(FlightfeedError):
    """A server this one calls (a worker) refused its credentials: a deployment's tokens do not
    match, which the caller's own request cannot change."""

    status = Status.FAILED_PRECONDITION
    code = "CREDENTIALS_REFUSED"


class RemoteError(FlightfeedError):
    """A failed call that carried no flightfeed error: a foreign server's status, or a lost
    connection (UNAVAILABLE)."""

    code = "REMOTE"

    def __init__(
        self,
        message: str,
        *,
        grpc_status: Status,
        origin: ErrorOrigin | None = None,
        error_type: str = "",
    ) -> None:
        super().__init__(message, origin=origin, error_type=error_type)
        self.grpc_status = grpc_status


ERROR_KINDS: dict[str, type[FlightfeedError]] = {
    cls.code: cls
    for cls in (
        FlightfeedError,
        InvalidArgument,
        PlanDecodeError,
        UnknownUdfError,
        NotFound,
        ExecutionError,
        DataError,
        FeedError,
        VersionMismatch,
        Cancelled,
        ResourceExhausted,
        Unimplemented,
        AlreadyExists,
        Conflict,
        CredentialsRefused,
        Unauthenticated,
        Unavailable,
    )
}
"""Error class by `code`: how a peer's error is rebuilt as the same class."""


def as_flightfeed_error(exc: BaseException, component: str = "") -> FlightfeedError:
    """Any exception as a FlightfeedError; a foreign one becomes an ExecutionError keeping its
    class name. With `component` (e.g. "session builder"), the error says which part failed:
    in its origin, and in its message for clients that only see a gRPC status message."""
    if isinstance(exc, FlightfeedError):
        error = exc
    else:
        error = ExecutionError(str(exc) or type(exc).__name__, error_type=type(exc).__name__)
        error.__cause__ = exc
    if component and not (error.origin and error.origin.component):
        error.origin = (error.origin or ErrorOrigin()).with_component(component)
        error.message = f"{component} failed: {error.message}"
        error.args = (error.message,)
    return error
