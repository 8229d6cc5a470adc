"""The request-header rules: a grpc-timeout as the gRPC spec writes it is served, anything else
is INVALID_ARGUMENT, and a deadline too short to run in is DEADLINE_EXCEEDED."""

from __future__ import annotations

import pytest
from grpclib.const import Status
from grpclib.metadata import encode_metadata
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.flight.request_headers import (
    MIN_TIMEOUT,
    call_headers,
    call_metadata,
    refusal,
    timeout_seconds,
)

PSEUDO = [(":method", "POST"), (":path", "/s/M")]
"""What every request has."""

UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


@given(st.integers(0, 99_999_999), st.sampled_from(sorted(UNITS)))
def test_spec_timeouts_parse_to_their_seconds(amount: int, unit: str) -> None:
    value = f"{amount}{unit}"
    assert timeout_seconds(value) == amount * UNITS[unit]
    refused = refusal([*PSEUDO, ("grpc-timeout", value)])
    if amount * UNITS[unit] >= MIN_TIMEOUT:
        assert refused is None
    else:
        assert refused is not None
        assert refused.status == Status.DEADLINE_EXCEEDED


@given(st.text(max_size=20).filter(lambda v: not v[:-1].isascii() or not v[:-1].isdigit()))
def test_anything_else_is_an_invalid_argument(value: str) -> None:
    refused = refusal([*PSEUDO, ("grpc-timeout", value)])
    if refused is not None and refused.status == Status.INVALID_ARGUMENT:
        assert "invalid grpc-timeout header" in refused.message
        return
    pytest.fail(f"{value!r} was not refused as invalid: {refused}")


@pytest.mark.parametrize(
    "value", ["123456789S", "-1S", "1.5S", "1s", "1", "S", " 1S", "\u0663S", "1S\n"]
)
def test_malformed_timeouts_are_named_in_the_refusal(value: str) -> None:
    refused = refusal([*PSEUDO, ("grpc-timeout", value)])
    assert refused is not None
    assert refused.status == Status.INVALID_ARGUMENT
    assert repr(value) in refused.message


def test_calls_without_a_timeout_are_served() -> None:
    assert refusal([*PSEUDO, ("content-type", "application/grpc"), ("te", "trailers")]) is None


@pytest.mark.parametrize("value", ["a", "abcde", "ab=c", "\u00e9"])
def test_binary_headers_must_be_base64(value: str) -> None:
    # grpclib logged a traceback for each such call and never answered it.
    refused = refusal([*PSEUDO, ("x-key-bin", value)])
    assert refused is not None
    assert refused.status == Status.INVALID_ARGUMENT
    assert "'x-key-bin' is not valid base64" in refused.message


@pytest.mark.parametrize("value", ["", "YQ", "YWJj", "YWJjZA=="])
def test_base64_binary_headers_are_served(value: str) -> None:
    assert refusal([*PSEUDO, ("x-key-bin", value)]) is None


@pytest.mark.parametrize("missing", [":method", ":path"])
def test_a_request_without_a_required_pseudo_header_is_refused(missing: str) -> None:
    headers = [(":method", "POST"), (":path", "/s/M"), ("te", "trailers")]
    found = refusal([h for h in headers if h[0] != missing])
    assert found is not None
    assert found.status is Status.INVALID_ARGUMENT
    assert found.message == f"the request has no {missing} header"


def test_call_metadata_names_are_made_lowercase() -> None:
    assert call_metadata({"X-Scale": "2", "Trace-Bin": b"\x00"}) == {
        "x-scale": "2",
        "trace-bin": b"\x00",
    }


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"bad header": "v"}, "a name is letters, digits"),
        ({":path": "/evil"}, "a name is letters, digits"),
        ({"": "v"}, "a name is letters, digits"),
        ({"grpc-timeout": "1n"}, "is gRPC's own"),
        ({"Content-Type": "text/plain"}, "is gRPC's own"),
        ({"x-ok": "line\nbreak"}, "a value is printable ASCII text"),
        ({"x-ok": "é"}, "a value is printable ASCII text"),
        ({"x-ok": ""}, "not empty"),
        ({"x-key-bin": "text"}, "a -bin header's value is bytes"),
    ],
)
def test_call_metadata_gRPC_cannot_carry_is_refused_before_the_call(
    headers: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        call_metadata(headers)


def test_a_querys_headers_are_text() -> None:
    assert call_headers({"X-Tag": "a"}) == {"x-tag": "a"}
    with pytest.raises(InvalidArgument, match="a query's headers are text"):
        call_headers({"x-key-bin": b"\x01"})  # type: ignore[dict-item]


_names = st.text(st.characters(codec="ascii"), min_size=1, max_size=12)
_values = st.one_of(st.text(max_size=12), st.binary(max_size=12))


@given(st.dictionaries(_names, _values, max_size=4))
def test_what_call_metadata_accepts_grpclib_sends(headers: dict[str, str | bytes]) -> None:
    """Property: whatever passes the check, grpclib encodes without an error (it raised
    ValueError or TypeError from inside the call)."""
    try:
        checked = call_metadata(headers)
    except InvalidArgument:
        return
    encode_metadata(checked)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("Bearer sëcret-token", "a value of 19 characters, a non-ASCII character at position 8"),
        ("Bearer secret\ttoken", "a value of 19 characters, a control character at position 13"),
    ],
)
def test_a_refused_value_is_described_never_shown(value: str, said: str) -> None:
    """It may be a credential: a bearer token with a typo reached the server's log and the
    client's error whole."""
    with pytest.raises(InvalidArgument) as refused:
        call_metadata({"authorization": value})
    assert said in str(refused.value)
    assert "ecret" not in str(refused.value)
