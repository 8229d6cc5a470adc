"""PlainErrors: what any gRPC client understands, with nothing flightfeed-specific."""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from flightfeed.errors import NotFound, RemoteError
from flightfeed.flight import PLAIN_ERRORS


def test_a_flightfeed_error_leaves_with_its_status_and_message() -> None:
    reply = PLAIN_ERRORS.reply(NotFound("no flight 'x'"))
    assert (reply.status, reply.message, dict(reply.trailers)) == (
        Status.NOT_FOUND,
        "no flight 'x'",
        {},
    )


def test_a_foreign_exception_is_internal_and_named() -> None:
    reply = PLAIN_ERRORS.reply(ZeroDivisionError("division by zero"))
    assert (reply.status, reply.message) == (Status.INTERNAL, "ZeroDivisionError: division by zero")


def test_a_grpc_error_passes_through() -> None:
    reply = PLAIN_ERRORS.reply(GRPCError(Status.PERMISSION_DENIED, "no"))
    assert (reply.status, reply.message) == (Status.PERMISSION_DENIED, "no")


def test_a_client_gets_remote_error_with_the_status() -> None:
    error = PLAIN_ERRORS.error(Status.NOT_FOUND, "no flight 'x'", {"x-other": "1"})
    assert isinstance(error, RemoteError)
    assert (error.grpc_status, error.message) == (Status.NOT_FOUND, "no flight 'x'")
    assert PLAIN_ERRORS.error(Status.UNAVAILABLE, None, None).message == "UNAVAILABLE"
