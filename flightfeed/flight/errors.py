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
from typing import Any, Final, Protocol

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


MAX_STATUS_MESSAGE_BYTES: Final = 2048
"""Of UTF-8 in a status message: messages echo what a request named, and a request can name
anything. A 1 MB action body echoed in its error froze a coordinator for 20 s (grpclib's
percent-encoding and HPACK's Huffman code are Python loops over every byte), and no gRPC client
would have taken the reply: gRPC C++ refuses a header block over 16 KiB. Percent-encoded (three
bytes at most for one) and repeated in a typed error's trailer, this stays well under that."""


def bounded_message(message: str) -> str:
    """`message`, its end cut (saying how much) past MAX_STATUS_MESSAGE_BYTES."""
    encoded = message.encode("utf-8", "replace")
    if len(encoded) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    kept = encoded[: MAX_STATUS_MESSAGE_BYTES - 48].decode("utf-8", "ignore")
    return f"{kept}... ({len(encoded) - len(kept.encode('utf-8', 'replace'))} bytes more, cut)"


def header_safe(message: str) -> str:
    """`message` as a grpc-message header can carry it: bounded (`bounded_message`), and with no
    space at either end. HTTP/2 makes a field value with a space at either end malformed
    (RFC 9113, 8.2.1), and grpclib's percent-encoding leaves spaces as they are: a message
    ending in one (a name from the request, echoed) made a strict client (h2 with its checks
    on) fail the connection."""
    return bounded_message(message).strip(" ")


class PlainErrors:
    """Statuses and messages only: what every gRPC client understands."""

    def reply(self, exc: BaseException, /) -> StatusReply:
        if isinstance(exc, GRPCError):
            return StatusReply(exc.status, bounded_message(exc.message or exc.status.name))
        error = as_flightfeed_error(exc)
        return StatusReply(error.status, bounded_message(error.described))

    def error(
        self, status: Status, message: str | None, trailers: Mapping[str, Any] | None, /
    ) -> FlightfeedError:
        return RemoteError(message or status.name, grpc_status=status)


PLAIN_ERRORS = PlainErrors()
