"""Errors ⇄ gRPC status at the boundary, with the typed detail kept in a trailer.

A server turns any exception into a gRPC status and message that every Flight client
understands, plus an ErrorDetail in `flightfeed-error-bin` so flightfeed clients rebuild the
same error class with its origin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from .._generated.flightfeed.v1 import ErrorCode, ErrorDetail, TaskKey
from ..errors import (
    ERROR_CLASSES,
    ErrorOrigin,
    ExecutionError,
    FlightfeedError,
    RemoteError,
)

ERROR_TRAILER: Final = "flightfeed-error-bin"

_CODE_TO_PROTO: Final = {
    "INVALID_ARGUMENT": ErrorCode.INVALID_ARGUMENT,
    "NOT_FOUND": ErrorCode.NOT_FOUND,
    "PLAN_DECODE": ErrorCode.PLAN_DECODE,
    "UNKNOWN_UDF": ErrorCode.UNKNOWN_UDF,
    "EXECUTION": ErrorCode.EXECUTION,
    "FEED": ErrorCode.FEED,
    "VERSION_MISMATCH": ErrorCode.VERSION_MISMATCH,
    "CANCELLED": ErrorCode.CANCELLED,
    "TIMEOUT": ErrorCode.TIMEOUT,
    "RESOURCE_EXHAUSTED": ErrorCode.RESOURCE_EXHAUSTED,
    "INTERNAL": ErrorCode.INTERNAL,
    "UNAUTHENTICATED": ErrorCode.UNAUTHENTICATED,
    "UNIMPLEMENTED": ErrorCode.UNIMPLEMENTED,
}
_PROTO_TO_CODE: Final = {v: k for k, v in _CODE_TO_PROTO.items()}


def as_flightfeed_error(exc: BaseException) -> FlightfeedError:
    """Any exception as a FlightfeedError; foreign ones become ExecutionError, type kept."""
    if isinstance(exc, FlightfeedError):
        return exc
    return ExecutionError(str(exc) or type(exc).__name__, error_type=type(exc).__name__)


def to_detail(error: FlightfeedError) -> ErrorDetail:
    origin = error.origin or ErrorOrigin()
    return ErrorDetail(
        code=_CODE_TO_PROTO.get(error.code, ErrorCode.UNSPECIFIED),
        message=error.message,
        error_type=error.error_type,
        worker_url=origin.worker_url,
        task_key=TaskKey(
            query_id=origin.query_id,
            stage_id=origin.stage_id,
            task_number=origin.task_number,
            attempt=origin.attempt,
        )
        if origin.query_id
        else None,
    )


def from_detail(detail: ErrorDetail) -> FlightfeedError:
    """Rebuild the error a peer raised, with its class, type name and origin."""
    code = _PROTO_TO_CODE.get(detail.code, "INTERNAL")
    cls = ERROR_CLASSES.get(code, FlightfeedError)
    key = detail.task_key
    origin = ErrorOrigin(
        worker_url=detail.worker_url,
        query_id=key.query_id if key else b"",
        stage_id=key.stage_id if key else 0,
        task_number=key.task_number if key else 0,
        attempt=key.attempt if key else 0,
    )
    has_origin = bool(origin.worker_url or origin.query_id)
    return cls(detail.message, origin=origin if has_origin else None, error_type=detail.error_type)


def status_and_trailers(exc: BaseException) -> tuple[Status, str, dict[str, Any]]:
    """What a server sends for an exception: status, message, trailing metadata."""
    if isinstance(exc, GRPCError):
        return exc.status, exc.message or exc.status.name, {}
    error = as_flightfeed_error(exc)
    message = str(error)
    if error.error_type not in (type(error).__name__, ""):
        message = f"{error.error_type}: {message}"
    return error.status, message, {ERROR_TRAILER: bytes(to_detail(error))}


def from_grpc_error(exc: GRPCError, trailers: Mapping[str, Any] | None) -> FlightfeedError:
    """The error a flightfeed client raises for a failed call."""
    raw = trailers.get(ERROR_TRAILER) if trailers else None
    if isinstance(raw, bytes):
        try:
            return from_detail(ErrorDetail.parse(raw))
        except Exception:
            pass
    return RemoteError(exc.message or exc.status.name, grpc_status=exc.status)
