"""Flight locations as users write them: what is accepted, and a clear error for the rest."""

from __future__ import annotations

import re

import pytest

from flightfeed.errors import InvalidArgument
from flightfeed.flight.client import parse_location


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("grpc://worker-1:8000", ("worker-1", 8000)),
        ("grpc+tcp://10.0.0.2:1", ("10.0.0.2", 1)),
        ("grpc+tls://example.org:443", ("example.org", 443)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("grpc://[::1]:8815", ("::1", 8815)),
    ],
)
def test_a_location_gives_its_host_and_port(location: str, expected: tuple[str, int]) -> None:
    assert parse_location(location) == expected


@pytest.mark.parametrize(
    "location",
    [
        "nonsense",
        "http://host:80",
        "grpc://host",
        "grpc://:8000",
        "grpc://host:http",  # urllib raised ValueError for these two, not InvalidArgument
        "grpc://host:65536",
        "grpc://[::1",  # urllib's ValueError "Invalid IPv6 URL" (found by a probe)
        "grpc://[::1:8000",
        # Names a connection cannot encode: UnicodeError when the coordinator's health check
        # connected, in its own task group, which ended the coordinator (found by a probe).
        f"grpc://{'a' * 70}.example:8000",
        "grpc://x..y:8000",
    ],
)
def test_anything_else_is_invalid_argument_naming_it(location: str) -> None:
    with pytest.raises(
        InvalidArgument, match=f"unsupported Flight location '{re.escape(location)}'"
    ):
        parse_location(location)
