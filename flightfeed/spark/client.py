"""The Spark side's conversation with a flightfeed coordinator, with pyarrow's C++ Flight client
(synchronous, as Spark's data source methods are): a query's schema, its endpoints, a read.

Failures become FlightfeedErrors that say what to do: an unreachable coordinator, an unknown
table, bad arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from grpclib.const import Status

from ..errors import FlightfeedError, InvalidArgument, NotFound, RemoteError

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Endpoint:
    """Where to read one output partition of a query: its ticket and worker locations."""

    ticket: bytes
    locations: tuple[str, ...]


def _options(headers: Mapping[str, str], timeout: float) -> fl.FlightCallOptions:
    pairs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return fl.FlightCallOptions(headers=pairs, timeout=timeout)


def flight_error(uri: str, what: str, exc: Exception) -> FlightfeedError:
    """A Flight failure as an error that says what happened and where."""
    text = str(exc).split(". gRPC client debug context", 1)[0]
    text = text.replace("Flight returned ", "").strip()
    if isinstance(exc, fl.FlightUnavailableError) or "returned unavailable error" in str(exc):
        return RemoteError(
            f"cannot reach the flightfeed coordinator at {uri} ({what}): {text}",
            grpc_status=Status.UNAVAILABLE,
        )
    if isinstance(exc, KeyError | pa.ArrowKeyError):
        return NotFound(f"{what} at {uri}: {text}")
    if isinstance(exc, pa.ArrowInvalid):
        return InvalidArgument(f"{what} at {uri}: {text}")
    return FlightfeedError(f"{what} at {uri} failed: {text}")


def get_schema(
    uri: str, command: bytes, headers: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT
) -> pa.Schema:
    """The schema of a table query, without starting anything."""
    try:
        with fl.connect(uri) as client:
            descriptor = fl.FlightDescriptor.for_command(command)
            return client.get_schema(descriptor, _options(headers, timeout)).schema
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "GetSchema", exc) from None


def get_endpoints(
    uri: str, command: bytes, headers: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT
) -> tuple[bytes, list[Endpoint]]:
    """Start a table query; its id and one endpoint per output partition."""
    try:
        with fl.connect(uri) as client:
            descriptor = fl.FlightDescriptor.for_command(command)
            info = client.get_flight_info(descriptor, _options(headers, timeout))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "GetFlightInfo", exc) from None
    endpoints = [
        Endpoint(e.ticket.ticket, tuple(str(loc.uri.decode()) for loc in e.locations))
        for e in info.endpoints
    ]
    return bytes(info.app_metadata or b""), endpoints


def read_endpoint(
    endpoint: Endpoint, headers: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT
) -> Iterator[pa.RecordBatch]:
    """The batches of one endpoint, read from the first of its locations that answers."""
    errors: list[str] = []
    for location in endpoint.locations:
        yielded = False
        try:
            with fl.connect(location) as client:
                reader = client.do_get(fl.Ticket(endpoint.ticket), _options(headers, timeout))
                for chunk in reader:
                    yielded = True
                    yield chunk.data
            return
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            error = flight_error(location, "DoGet", exc)
            if yielded or not isinstance(error, RemoteError):
                raise error from None  # another location would repeat the rows already read
            errors.append(str(error))  # unreachable: try the next location
    raise RemoteError(
        "; ".join(errors) or "an endpoint with no location", grpc_status=Status.UNAVAILABLE
    )


def explain(uri: str, command: bytes, headers: Mapping[str, str]) -> str:
    """The distributed plan a table query would run, as the coordinator describes it."""
    try:
        with fl.connect(uri) as client:
            action = fl.Action("explain", command)
            results = list(client.do_action(action, _options(headers, DEFAULT_TIMEOUT)))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "explain", exc) from None
    return b"".join(r.body.to_pybytes() for r in results).decode()


def stream_action(
    uri: str, kind: str, body: bytes, headers: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """A stream action of the coordinator ("stream_open", "stream_latest", "stream_commit")."""
    try:
        with fl.connect(uri) as client:
            results = list(client.do_action(fl.Action(kind, body), _options(headers, timeout)))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, kind, exc) from None
    answer: dict[str, Any] = json.loads(b"".join(r.body.to_pybytes() for r in results))
    return answer


def release(uri: str, query_id: bytes, headers: Mapping[str, str]) -> None:
    """Tell the coordinator a query's readers are done (best effort)."""
    try:
        with fl.connect(uri) as client:
            list(client.do_action(fl.Action("release", query_id), _options(headers, 10.0)))
    except (fl.FlightError, pa.ArrowException):
        pass  # the query is released after its TTL anyway


__all__ = [
    "Endpoint",
    "explain",
    "flight_error",
    "get_endpoints",
    "get_schema",
    "read_endpoint",
    "release",
    "stream_action",
]
