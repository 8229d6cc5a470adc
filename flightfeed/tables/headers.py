"""Errors as HoraeDB's remote engine reports them: in the `ResponseHeader` of the response,
with its codes (0 ok, 401 bad request, 404 not found, 500 internal), not as a gRPC status.
A gRPC status is kept for what is not the protocol's business: a malformed or oversized
message, a cancelled call.
"""

from __future__ import annotations

import logging
from typing import Final

from grpclib.const import Status

from .._generated.common import ResponseHeader
from ..errors import FlightfeedError, NotFound
from .store import TableWriteError

OK: Final = 0
BAD_REQUEST: Final = 401
NOT_FOUND: Final = 404
INTERNAL: Final = 500

OK_HEADER: Final = ResponseHeader(code=OK)
log = logging.getLogger("flightfeed.tables")


_REQUEST_ERRORS: Final = frozenset(
    {
        Status.ALREADY_EXISTS,
        Status.FAILED_PRECONDITION,
        Status.INVALID_ARGUMENT,
        Status.OUT_OF_RANGE,
        Status.RESOURCE_EXHAUSTED,
    }
)
"""Refusals of a request's content (bad data, exists already, stale version, over a limit):
the caller's to fix."""


def error_code(exc: BaseException) -> int:
    cause = exc.cause if isinstance(exc, TableWriteError) else exc
    if isinstance(cause, NotFound):
        return NOT_FOUND
    if isinstance(cause, FlightfeedError) and cause.status in _REQUEST_ERRORS:
        return BAD_REQUEST
    return INTERNAL


def error_header(exc: BaseException, what: str) -> ResponseHeader:
    """The header of a failed request; a failure that is not the request's is logged."""
    code = error_code(exc)
    known = isinstance(exc, FlightfeedError)
    message = exc.message if known else f"{type(exc).__name__}: {exc}"  # type: ignore[attr-defined]
    if code == INTERNAL:
        log.warning("%s failed: %s", what, message, exc_info=exc)
    return ResponseHeader(code=code, error=f"{what} failed: {message}")


__all__ = ["BAD_REQUEST", "INTERNAL", "NOT_FOUND", "OK", "OK_HEADER", "error_code", "error_header"]
