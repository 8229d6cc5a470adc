"""PlainErrors: what any gRPC client understands, with nothing flightfeed-specific; every
status message bounded."""

from __future__ import annotations

import re

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument, NotFound, RemoteError
from flightfeed.flight import PLAIN_ERRORS
from flightfeed.flight.errors import MAX_STATUS_MESSAGE_BYTES, header_safe
from flightfeed.protocol import TYPED_ERRORS


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


@given(st.text(max_size=3000))
def test_a_status_message_is_bounded_and_says_what_was_cut(message: str) -> None:
    """Messages echo requests: a 1 MB action body echoed in a reply froze a coordinator for 20 s
    and no gRPC client would have taken the reply (gRPC C++ refuses headers over 16 KiB)."""
    reply = PLAIN_ERRORS.reply(NotFound(message))
    size = len(message.encode("utf-8", "replace"))
    if size <= MAX_STATUS_MESSAGE_BYTES:
        assert reply.message == message
    else:
        assert len(reply.message.encode("utf-8", "replace")) <= MAX_STATUS_MESSAGE_BYTES
        found = re.fullmatch(r"(.*)\.\.\. \((\d+) bytes more, cut\)", reply.message, re.S)
        assert found is not None
        kept, cut = found.groups()
        assert message.startswith(kept)
        assert len(kept.encode("utf-8", "replace")) + int(cut) == size
    assert len(header_safe(message).encode("utf-8", "replace")) <= MAX_STATUS_MESSAGE_BYTES


def test_a_typed_errors_detail_is_bounded_as_its_message() -> None:
    reply = TYPED_ERRORS.reply(InvalidArgument("x" * 1_000_000))
    (detail,) = reply.trailers.values()
    assert isinstance(detail, bytes)
    assert len(detail) < 2 * MAX_STATUS_MESSAGE_BYTES
    assert len(reply.message) <= MAX_STATUS_MESSAGE_BYTES
