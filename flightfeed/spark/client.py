"""The Spark side's conversation with a flightfeed coordinator or worker, with pyarrow's C++
Flight client (synchronous, as Spark's data source methods are): a query's schema, its
endpoints, a read; a worker's table actions and DoPut streams.

Failures become FlightfeedErrors that say what to do: an unreachable coordinator or worker, an
unknown table, bad arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from grpclib.const import Status

from ..errors import FlightfeedError, InvalidArgument, NotFound, RemoteError

DEFAULT_TIMEOUT = 60.0
COORDINATOR = "flightfeed coordinator"
WORKER = "flightfeed worker"


@dataclass(frozen=True)
class Endpoint:
    """Where to read one output partition of a query: its ticket and worker locations."""

    ticket: bytes
    locations: tuple[str, ...]


def _options(headers: Mapping[str, str], timeout: float) -> fl.FlightCallOptions:
    pairs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return fl.FlightCallOptions(headers=pairs, timeout=timeout)


def flight_error(uri: str, what: str, exc: Exception, peer: str = COORDINATOR) -> FlightfeedError:
    """A Flight failure as an error that says what happened and where (`peer`: what `uri` is)."""
    text = str(exc).split(". gRPC client debug context", 1)[0]
    text = text.replace("Flight returned ", "").strip()
    if isinstance(exc, fl.FlightUnavailableError) or "returned unavailable error" in str(exc):
        return RemoteError(
            f"cannot reach the {peer} at {uri} ({what}): {text}",
            grpc_status=Status.UNAVAILABLE,
        )
    if isinstance(exc, KeyError | pa.ArrowKeyError):
        return NotFound(f"{what} at {uri}: {text}")
    if isinstance(exc, pa.ArrowInvalid):
        return InvalidArgument(f"{what} at {uri}: {text}")
    return FlightfeedError(f"{what} at {uri} failed: {text}")


def get_schema(
    uri: str,
    command: bytes,
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    peer: str = COORDINATOR,
) -> pa.Schema:
    """The schema of a table query (or of a worker's table), without starting anything."""
    try:
        with fl.connect(uri) as client:
            descriptor = fl.FlightDescriptor.for_command(command)
            return client.get_schema(descriptor, _options(headers, timeout)).schema
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "GetSchema", exc, peer) from None


def get_endpoints(
    uri: str,
    command: bytes,
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    peer: str = COORDINATOR,
) -> tuple[bytes, list[Endpoint]]:
    """Start a table query (or plan a worker's table read); its id (if any) and one endpoint
    per output partition."""
    try:
        with fl.connect(uri) as client:
            descriptor = fl.FlightDescriptor.for_command(command)
            info = client.get_flight_info(descriptor, _options(headers, timeout))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "GetFlightInfo", exc, peer) from None
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
            error = flight_error(location, "DoGet", exc, WORKER)
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


def do_action(
    uri: str,
    kind: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    peer: str = WORKER,
) -> bytes:
    """Run an action (a worker's "commit_staged", "count_rows", ...); its results, joined."""
    try:
        with fl.connect(uri) as client:
            results = list(client.do_action(fl.Action(kind, body), _options(headers, timeout)))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, kind, exc, peer) from None
    return b"".join(r.body.to_pybytes() for r in results)


def put_batches(
    uri: str,
    command: bytes,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    peer: str = WORKER,
) -> tuple[int, bytes]:
    """DoPut `batches` (of `schema`) under a descriptor with `command`: (rows sent, the
    server's last PutResult metadata). An error raised by `batches` themselves propagates as it
    is. pyarrow cannot cancel a DoPut: closing the client ends the stream as if complete, so
    the server may keep the rows sent before the error. Use it where that is harmless, as for
    a staged task attempt, which only a commit naming it publishes."""
    sent = 0
    answer = b""
    try:
        flight = fl.connect(uri)
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "DoPut", exc, peer) from None
    with flight:
        try:
            descriptor = fl.FlightDescriptor.for_command(command)
            writer, reader = flight.do_put(descriptor, schema, _options(headers, timeout))
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            raise flight_error(uri, "DoPut", exc, peer) from None
        for batch in batches:  # outside the try: the caller's errors are not the server's
            if batch.num_rows:
                try:
                    writer.write_batch(batch)
                except (fl.FlightError, pa.ArrowException, OSError) as exc:
                    raise flight_error(uri, "DoPut", exc, peer) from None
                sent += batch.num_rows
        try:
            writer.done_writing()
            while (metadata := reader.read()) is not None:
                answer = metadata.to_pybytes()
            writer.close()
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            raise flight_error(uri, "DoPut", exc, peer) from None
    return sent, answer


def release(uri: str, query_id: bytes, headers: Mapping[str, str]) -> None:
    """Tell the coordinator a query's readers are done (best effort)."""
    try:
        with fl.connect(uri) as client:
            list(client.do_action(fl.Action("release", query_id), _options(headers, 10.0)))
    except (fl.FlightError, pa.ArrowException):
        pass  # the query is released after its TTL anyway


__all__ = [
    "COORDINATOR",
    "WORKER",
    "Endpoint",
    "do_action",
    "explain",
    "flight_error",
    "get_endpoints",
    "get_schema",
    "put_batches",
    "read_endpoint",
    "release",
    "stream_action",
]
