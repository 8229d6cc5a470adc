"""flightfeed's exception hierarchy: one root, a few meaningful kinds, each with a gRPC status.

Errors keep a typed code, message and origin (worker URL, task key) across the wire: the server
puts an ErrorDetail in the `flightfeed-error-bin` trailer and the client rebuilds the same class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from grpclib.const import Status


@dataclass(frozen=True)
class ErrorOrigin:
    """Where an error happened: the worker and the task, when known."""

    worker_url: str = ""
    query_id: bytes = b""
    stage_id: int = 0
    task_number: int = 0
    attempt: int = 0

    def __str__(self) -> str:
        where = self.worker_url or "local"
        if self.query_id:
            task = f"{self.query_id.hex()}/{self.stage_id}/{self.task_number}#{self.attempt}"
            return f"{where} task {task}"
        return where


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
        if self.origin is not None:
            return f"{self.message} (at {self.origin})"
        return self.message


class InvalidArgument(FlightfeedError):
    """The request is malformed: bad ticket, bad frame, out-of-range partitions."""

    status = Status.INVALID_ARGUMENT
    code = "INVALID_ARGUMENT"


class NotFound(FlightfeedError):
    """The request names something the server does not have (task, flight, action)."""

    status = Status.NOT_FOUND
    code = "NOT_FOUND"


class PlanDecodeError(InvalidArgument):
    """Plan bytes could not be decoded into an execution plan."""

    code = "PLAN_DECODE"


class UnknownUdfError(InvalidArgument):
    """A plan names a UDF the session does not provide."""

    code = "UNKNOWN_UDF"


class ExecutionError(FlightfeedError):
    """A plan node failed while running; the message is the original one."""

    status = Status.INTERNAL
    code = "EXECUTION"


class FeedError(FlightfeedError):
    """A work-unit feed failed or ended abnormally."""

    status = Status.ABORTED
    code = "FEED"


class VersionMismatch(FlightfeedError):
    """A worker runs a flightfeed version the coordinator refuses to talk to."""

    status = Status.FAILED_PRECONDITION
    code = "VERSION_MISMATCH"


class Cancelled(FlightfeedError):
    """The query or task was cancelled."""

    status = Status.CANCELLED
    code = "CANCELLED"


class TimeoutError_(FlightfeedError):
    """Something did not happen within its bound (a plan that never arrived, a deadline)."""

    status = Status.DEADLINE_EXCEEDED
    code = "TIMEOUT"


class ResourceExhausted(FlightfeedError):
    """A limit was hit: message size, concurrent tasks, memory budget."""

    status = Status.RESOURCE_EXHAUSTED
    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(FlightfeedError):
    """Missing or wrong credentials."""

    status = Status.UNAUTHENTICATED
    code = "UNAUTHENTICATED"


class Unimplemented(FlightfeedError):
    """The server does not implement this RPC or action."""

    status = Status.UNIMPLEMENTED
    code = "UNIMPLEMENTED"


class RemoteError(FlightfeedError):
    """A gRPC error from a peer that carried no flightfeed error detail."""

    code = "REMOTE"

    def __init__(self, message: str, *, grpc_status: Status, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.grpc_status = grpc_status


ERROR_CLASSES: dict[str, type[FlightfeedError]] = {
    cls.code: cls
    for cls in (
        FlightfeedError,
        InvalidArgument,
        NotFound,
        PlanDecodeError,
        UnknownUdfError,
        ExecutionError,
        FeedError,
        VersionMismatch,
        Cancelled,
        TimeoutError_,
        ResourceExhausted,
        Unauthenticated,
        Unimplemented,
    )
}
