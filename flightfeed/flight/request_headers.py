"""Request headers: those a server refuses before any handler runs, and those a client may
send (`call_metadata`).

grpclib answers a malformed `grpc-timeout` with UNKNOWN, accepts more than the 8 digits the
gRPC spec allows, and answers a deadline that passed before the call started with UNKNOWN and a
logged traceback; a `-bin` header that is not base64 gets no answer at all, only a traceback in
the log: log floods any client can cause. These rules decide instead; the server's handler
(internals.RefusingHandler) answers with the status they give.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from grpclib.const import Status
from grpclib.metadata import decode_bin_value

from ..errors import InvalidArgument

_TIMEOUT: Final = re.compile(r"([0-9]{1,8})([HMSmun])")
_UNIT_SECONDS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
MIN_TIMEOUT: Final = 1e-3
"""A call whose timeout is shorter than this has no time to run: DEADLINE_EXCEEDED at once."""


@dataclass(frozen=True)
class Refusal:
    status: Status
    message: str


def timeout_seconds(value: str) -> float:
    """A `grpc-timeout` value in seconds; ValueError naming what the spec wants."""
    found = _TIMEOUT.fullmatch(value)
    if found is None:
        raise ValueError(
            f"invalid grpc-timeout header {value[:32]!r}: expected 1 to 8 digits and a unit"
            " (H, M, S, m, u or n)"
        )
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)]


REQUIRED_PSEUDO_HEADERS: Final = (":method", ":path")
"""What grpclib reads of every request before it looks at anything else."""


def refusal(headers: Iterable[tuple[str, str]]) -> Refusal | None:
    """Why a call with these request headers is refused, or None to serve it."""
    headers = list(headers)
    present = {name for name, _ in headers}
    for required in REQUIRED_PSEUDO_HEADERS:
        if required not in present:  # h2 lets some through; grpclib failed with a KeyError
            return Refusal(Status.INVALID_ARGUMENT, f"the request has no {required} header")
    for name, value in headers:
        if name.endswith("-bin") and not name.startswith(":"):
            try:
                decode_bin_value(value.encode("ascii"))  # as grpclib will decode it
            except (ValueError, UnicodeEncodeError):  # binascii.Error is a ValueError
                return Refusal(Status.INVALID_ARGUMENT, f"header {name[:64]!r} is not valid base64")
            continue
        if name != "grpc-timeout":
            continue
        try:
            seconds = timeout_seconds(value)
        except ValueError as exc:
            return Refusal(Status.INVALID_ARGUMENT, str(exc))
        if seconds < MIN_TIMEOUT:
            return Refusal(
                Status.DEADLINE_EXCEEDED,
                f"the call's deadline (grpc-timeout {value}) passed before it could start",
            )
    return None


_METADATA_KEY: Final = re.compile(r"[0-9a-z_.\-]+")
_TEXT_VALUE: Final = re.compile(r"[ -~]+")  # printable ASCII, as HTTP/2 carries it unencoded
_TRANSPORT_KEYS: Final = frozenset({"te", "content-type", "user-agent"})


def call_metadata(metadata: Mapping[str, str | bytes]) -> dict[str, str | bytes]:
    """Headers for a call, checked before anything is sent: InvalidArgument naming one that
    gRPC cannot carry. Names are made lowercase (gRPC's metadata names are case-insensitive,
    and HTTP/2 sends them lowercase); grpclib refused `X-Scale` only once the call started,
    which a coordinator took for a worker it could not reach."""
    checked: dict[str, str | bytes] = {}
    for name, value in metadata.items():
        key = name.lower() if isinstance(name, str) else name
        if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
            raise InvalidArgument(f"header {name!r}: a name is letters, digits, '-', '_' and '.'")
        if key.startswith("grpc-") or key in _TRANSPORT_KEYS:
            raise InvalidArgument(f"header {name!r} is gRPC's own: it cannot be set per call")
        if key in checked:
            raise InvalidArgument(f"header {name!r} is given twice (names are case-insensitive)")
        if key.endswith("-bin"):
            if not isinstance(value, bytes):
                raise InvalidArgument(f"header {name!r}: a -bin header's value is bytes")
        elif not isinstance(value, str) or not _TEXT_VALUE.fullmatch(value):
            raise InvalidArgument(
                f"header {name!r}: a value is printable ASCII text, not empty (bytes under a"
                f" -bin name), got {_without_content(value)}"
            )
        checked[key] = value
    return checked


def _without_content(value: object) -> str:
    """What is wrong with a header value, never the value: it may be a credential (a bearer
    token with a typo once reached the server's log and the client's error this way)."""
    if not isinstance(value, str):
        return type(value).__name__
    if not value:
        return "an empty value"
    at = next(i for i, c in enumerate(value) if not " " <= c <= "~")
    kind = (
        "a control character" if value[at] < " " or value[at] == "\x7f" else "a non-ASCII character"
    )
    return f"a value of {len(value)} characters, {kind} at position {at}"


MAX_QUERY_HEADER_BYTES: Final = 16 * 1024
"""What a query's headers may take of a header block, counted as HTTP/2 does (name, value and
32 bytes each). A coordinator sends them to the workers with its own on a connection that
other queries share, and a worker answers a block past its limit (64 KiB by default) by closing
the connection: every query on it failed, not only the one with the headers."""
_HEADER_OVERHEAD: Final = 32


def call_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`call_metadata` for text headers only (a query's headers for session builders), at most
    MAX_QUERY_HEADER_BYTES of them."""
    checked: dict[str, str] = {}
    size = 0
    for key, value in call_metadata(headers).items():
        if not isinstance(value, str):
            raise InvalidArgument(f"header {key!r}: a query's headers are text, not -bin")
        checked[key] = value
        size += len(key) + len(value) + _HEADER_OVERHEAD
    if size > MAX_QUERY_HEADER_BYTES:
        largest = max(checked, key=lambda k: len(checked[k]))
        raise InvalidArgument(
            f"a query's headers take {size} bytes of a header block (the largest,"
            f" {largest!r}, {len(checked[largest])}), at most {MAX_QUERY_HEADER_BYTES}: the"
            " workers get them on connections other queries share"
        )
    return checked


__all__ = [
    "MAX_QUERY_HEADER_BYTES",
    "MIN_TIMEOUT",
    "REQUIRED_PSEUDO_HEADERS",
    "Refusal",
    "call_headers",
    "call_metadata",
    "refusal",
    "timeout_seconds",
]
