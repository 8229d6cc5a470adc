"""Typed errors across the wire: a flightfeed peer gets back the very error that was raised.

On top of the plain status and message, a server sends an ErrorDetail (the error's code,
message, original class name, component and origin) in the `flightfeed-error-bin` trailer; a
client that reads one rebuilds the same FlightfeedError class. The same ErrorDetail carries
task and feed errors on the CoordinatorChannel. Workers and their clients use TYPED_ERRORS.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from .._generated.flightfeed.v1 import ErrorCode, ErrorDetail
from ..errors import (
    ERROR_KINDS,
    ErrorOrigin,
    FlightfeedError,
    RemoteError,
    as_flightfeed_error,
)
from ..flight.errors import PlainErrors, StatusReply, bounded_message
from ..messages import parse_strict
from .keys import TaskId, origin_key

log = logging.getLogger(__name__)

ERROR_TRAILER: Final = "flightfeed-error-bin"


def to_detail(error: FlightfeedError) -> ErrorDetail:
    """The wire form of an error."""
    origin = error.origin or ErrorOrigin()
    code = ErrorCode.__members__.get(error.code, ErrorCode.UNSPECIFIED)
    return ErrorDetail(
        code=code,
        message=error.message,
        error_type=error.error_type,
        worker_url=origin.worker_url,
        task_key=origin_key(origin),
        component=origin.component,
    )


def from_detail(detail: ErrorDetail) -> FlightfeedError:
    """Rebuild the error a peer raised: its class (by code), message, type name and origin.
    A code this version does not know gives the root class, message kept."""
    try:
        code = ErrorCode(detail.code).name
    except ValueError:
        code = ""
    cls = ERROR_KINDS.get(code, FlightfeedError)
    origin: ErrorOrigin | None = None
    if detail.worker_url or detail.task_key is not None or detail.component:
        key = TaskId.of(detail.task_key) if detail.task_key is not None else None
        origin = (
            key.origin(detail.worker_url, detail.component)
            if key is not None
            else ErrorOrigin(worker_url=detail.worker_url, component=detail.component)
        )
    return cls(detail.message, origin=origin, error_type=detail.error_type)


def parse_detail(raw: object) -> ErrorDetail:
    """An ErrorDetail from untrusted bytes (strict wire check first: betterproto2 is lenient)."""
    if not isinstance(raw, bytes):
        raise TypeError(f"an error detail is bytes, got {type(raw).__name__}")
    return parse_strict(ErrorDetail, raw)


class TypedErrors(PlainErrors):
    """Statuses with the typed error in a trailer, for flightfeed peers."""

    def reply(self, exc: BaseException, /) -> StatusReply:
        plain = super().reply(exc)
        if isinstance(exc, GRPCError):
            return plain
        detail = to_detail(as_flightfeed_error(exc))
        detail.message = bounded_message(detail.message)  # (as the status message is)
        return StatusReply(plain.status, plain.message, {ERROR_TRAILER: bytes(detail)})

    def error(
        self, status: Status, message: str | None, trailers: Mapping[str, Any] | None, /
    ) -> FlightfeedError:
        raw = trailers.get(ERROR_TRAILER) if trailers else None
        if raw is None:
            return super().error(status, message, trailers)
        try:
            return from_detail(parse_detail(raw))
        except Exception as exc:  # a broken detail must not hide the status itself
            log.debug("undecodable %s trailer: %r", ERROR_TRAILER, exc)
            return RemoteError(
                f"{message or status.name} (its {ERROR_TRAILER} trailer is undecodable: {exc})",
                grpc_status=status,
            )


TYPED_ERRORS: Final = TypedErrors()
