"""How a Flight server turns an exception into a gRPC status, and a client a status into one.

`PlainErrors`, the default, needs nothing beyond gRPC: a FlightfeedError leaves with its own
status, anything else as INTERNAL, the message naming the original exception's class (so
clients in any language read `KeyError: 'x'`); a client raises RemoteError with the status.
A mapping with more to say, such as `flightfeed.protocol.TYPED_ERRORS` (used by workers and
their clients), adds trailers from which a flightfeed peer rebuilds the exact error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ..errors import FlightfeedError, RemoteError, as_flightfeed_error


@dataclass(frozen=True)
class StatusReply:
    """What a server sends for a failed call."""

    status: Status
    message: str
    trailers: Mapping[str, str | bytes] = field(default_factory=dict)


class ErrorMapping(Protocol):
    """Exceptions ⇄ gRPC statuses, one instance shared by a server or a client."""

    def reply(self, exc: BaseException, /) -> StatusReply:
        """The status, message and trailing metadata a server sends for `exc`."""
        ...

    def error(
        self, status: Status, message: str | None, trailers: Mapping[str, Any] | None, /
    ) -> FlightfeedError:
        """The error a client raises for a call that ended with `status`."""
        ...


def header_safe(message: str) -> str:
    """`message` as a grpc-message header can carry it. HTTP/2 makes a field value with a space
    at either end malformed (RFC 9113, 8.2.1), and grpclib's percent-encoding leaves spaces as
    they are: a message ending in one (a name from the request, echoed) made a strict client
    (h2 with its checks on) fail the connection. Spaces at the ends are dropped."""
    return message.strip(" ")


class PlainErrors:
    """Statuses and messages only: what every gRPC client understands."""

    def reply(self, exc: BaseException, /) -> StatusReply:
        if isinstance(exc, GRPCError):
            return StatusReply(exc.status, exc.message or exc.status.name)
        error = as_flightfeed_error(exc)
        return StatusReply(error.status, error.described)

    def error(
        self, status: Status, message: str | None, trailers: Mapping[str, Any] | None, /
    ) -> FlightfeedError:
        return RemoteError(message or status.name, grpc_status=status)


PLAIN_ERRORS = PlainErrors()
