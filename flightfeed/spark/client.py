"""The Spark side's conversation with a flightfeed coordinator or worker, with pyarrow's C++
Flight client (synchronous, as Spark's data source methods are): a query's schema, its
endpoints, a read; a worker's table actions and DoPut streams.

Every call goes through a `Connection`: the bearer token it sends and the TLS files it reaches
`grpc+tls://` servers with (paths, read where the call is made: on Spark's executors too).

Failures become FlightfeedErrors that say what to do: an unreachable coordinator or worker, a
refused token, an unknown table, bad arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import pyarrow as pa
import pyarrow.flight as fl
from grpclib.const import Status

from ..errors import (
    Conflict,
    FlightfeedError,
    InvalidArgument,
    NotFound,
    RemoteError,
    Unauthenticated,
)
from ..flight.auth import AUTHORIZATION, TOKEN_CHARACTERS, is_token, read_tokens
from .idle_watch import IdleWatch
from .shared_read import on_this_host, read_ticket

DEFAULT_TIMEOUT = 60.0
COORDINATOR = "flightfeed coordinator"
WORKER = "flightfeed worker"
TOKEN: Final = "token"
TOKEN_FILE: Final = "tokenFile"
TLS_ROOT_CERTS: Final = "tlsRootCerts"
TLS_CERT_CHAIN: Final = "tlsCertChain"
TLS_PRIVATE_KEY: Final = "tlsPrivateKey"
"""The data source's options a Connection comes from (case-insensitive, as all of them)."""
HIDDEN: Final = "<hidden>"


@dataclass(frozen=True)
class Connection:
    """How to reach the servers: the bearer token to send (`token`, or the first of the token
    file `token_file`'s), and for `grpc+tls://` locations the PEM root CA to check them against
    (`root_certs`; the system's roots without one) and the client certificate and key to present
    to servers that require mutual TLS. Files are read by each call, where it runs; the token
    never shows in a repr or an error message. Plain data: it pickles to Spark's executors."""

    token: str | None = None
    token_file: str | None = None
    root_certs: str | None = None
    cert_chain: str | None = None
    private_key: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and self.token_file is not None:
            raise InvalidArgument(f"give option {TOKEN!r} or {TOKEN_FILE!r}, not both")
        if self.token is not None and not self.token.strip():
            raise InvalidArgument(f"option {TOKEN!r} is empty")
        if self.token is not None and not is_token(self.token.strip()):
            raise InvalidArgument(  # (gRPC refused it only once sent: INTERNAL, "Invalid
                f"option {TOKEN!r}: a token is {TOKEN_CHARACTERS}"  # metadata")
            )
        if (self.cert_chain is None) != (self.private_key is None):
            raise InvalidArgument(
                f"options {TLS_CERT_CHAIN!r} and {TLS_PRIVATE_KEY!r} go together: the client"
                " certificate (PEM) for mutual TLS and its private key"
            )

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Connection:
        """From the data source's options, their names in lower case."""

        def option(name: str) -> str | None:
            value = options.get(name.lower())
            return None if value is None else str(value)

        return cls(
            token=option(TOKEN),
            token_file=option(TOKEN_FILE),
            root_certs=option(TLS_ROOT_CERTS),
            cert_chain=option(TLS_CERT_CHAIN),
            private_key=option(TLS_PRIVATE_KEY),
        )

    @property
    def has_token(self) -> bool:
        return self.token is not None or self.token_file is not None

    def __repr__(self) -> str:
        shown = [
            f"{name}={value!r}"
            for name, value in (
                ("token_file", self.token_file),
                ("root_certs", self.root_certs),
                ("cert_chain", self.cert_chain),
                ("private_key", self.private_key),
            )
            if value is not None
        ]
        if self.token is not None:
            shown.insert(0, f"token={HIDDEN}")
        return f"Connection({', '.join(shown)})"

    def bearer_token(self) -> str | None:
        """The token to send: option `token`'s, or the token file's first (read now)."""
        if self.token is not None:
            return self.token.strip()
        if self.token_file is None:
            return None
        try:
            tokens = read_tokens(self.token_file)
        except InvalidArgument as exc:
            raise InvalidArgument(f"option {TOKEN_FILE!r}: {exc.message}{_WHERE}") from None
        if not tokens:
            raise InvalidArgument(
                f"option {TOKEN_FILE!r}: {self.token_file!r} holds no token (one a line; blank"
                " lines and lines starting with # are skipped)"
            )
        return tokens[0]

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The `authorization` header every call carries, if there is a token."""
        token = self.bearer_token()
        if token is None:
            return []
        return [(AUTHORIZATION.encode(), f"Bearer {token}".encode())]

    def connect(self, uri: str) -> fl.FlightClient:
        """pyarrow's client for `uri`, with the TLS files (read now) if there are any."""
        files = self.tls_files()
        tls = {file.argument: _read(file.path, file.option) for file in files}
        for file in files:
            what, marker = file.holds
            if marker not in tls[file.argument]:  # (gRPC took a key or a token file for the
                raise InvalidArgument(  # CA's certificate, and said "empty address list")
                    f"option {file.option!r}: {file.path!r} holds no {what} in PEM form"
                )
        return fl.connect(uri, **tls)

    def tls_files(self) -> list[TlsFile]:
        """The TLS files given (a client certificate only with its key: `of` checks that)."""
        files = []
        if self.root_certs is not None:
            files.append(TlsFile("tls_root_certs", self.root_certs, TLS_ROOT_CERTS, _CERTIFICATE))
        if self.cert_chain is not None and self.private_key is not None:
            files.append(TlsFile("cert_chain", self.cert_chain, TLS_CERT_CHAIN, _CERTIFICATE))
            files.append(TlsFile("private_key", self.private_key, TLS_PRIVATE_KEY, _PRIVATE_KEY))
        return files


class TlsFile(NamedTuple):
    argument: str
    """pyarrow's name for it (`flight.connect`)."""
    path: str
    option: str
    holds: tuple[str, bytes]
    """What it must hold, and the PEM text that shows it does."""


PLAIN: Final = Connection()
"""No token, no TLS files (a grpc+tls:// server is then checked against the system's roots)."""


_WHERE: Final = "; the file must exist where the connection is made (on Spark's executors too)"


_CERTIFICATE: Final = ("certificates", b"-----BEGIN CERTIFICATE-----")
_PRIVATE_KEY: Final = ("private key", b"PRIVATE KEY-----")


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidArgument(
            f"option {option!r}: cannot read {path!r} ({exc.strerror or exc}){_WHERE}"
        ) from None


def redacted(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` with the value of `authorization` hidden (for a repr)."""
    return {k: HIDDEN if k.lower() == AUTHORIZATION else v for k, v in headers.items()}


@dataclass(frozen=True)
class Endpoint:
    """Where to read one output partition of a query: its ticket and worker locations."""

    ticket: bytes
    locations: tuple[str, ...]


def _options(
    headers: Mapping[str, str], timeout: float | None, connection: Connection
) -> fl.FlightCallOptions:
    pairs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return fl.FlightCallOptions(headers=pairs + connection.headers(), timeout=timeout)


def _said(exc: Exception) -> str:
    """What a pyarrow Flight error says, without gRPC's debug context."""
    return str(exc).split(". gRPC client debug context", 1)[0]


_TRANSPORT_FAILURES: Final = (
    "failed to connect",
    "connection refused",
    "connection reset",
    "connection timed out",
    "socket closed",
    "stream removed",
    "broken pipe",
    "dns resolution failed",
    "empty address list",
    "connections to all backends failing",
    "no route to host",
    "network is unreachable",
    "handshake",
    "ssl",
    "tls",
    "certificate",
    "goaway",
    "keepalive",
    "endpoint read failed",
    "transport closed",
)
"""How gRPC's own status message starts when no server answered (its connection failed), as
opposed to a server's that answered UNAVAILABLE itself (a coordinator that cannot reach its
workers, whose message may name a refused connection further on): the first "cannot reach"
the server, the second must not say so (found by a probe)."""


def flight_error(uri: str, what: str, exc: Exception, peer: str = COORDINATOR) -> FlightfeedError:
    """A Flight failure as an error that says what happened and where (`peer`: what `uri` is)."""
    full = str(exc)  # pyarrow raises a plain OSError for some statuses: the text says which
    text = _said(exc).replace("Flight returned ", "").strip()
    unavailable = isinstance(exc, fl.FlightUnavailableError) or "returned unavailable error" in full
    status_message = full.partition("with message: ")[2] or full
    if unavailable and not status_message.lower().startswith(_TRANSPORT_FAILURES):
        # (it answered: the coordinator could not reach its workers, a worker is stopping)
        return RemoteError(
            f"the {peer} at {uri} answered {what} UNAVAILABLE: {text}",
            grpc_status=Status.UNAVAILABLE,
        )
    if unavailable:
        hint = ""
        if uri.startswith("grpc+tls://"):
            hint = (
                f" (over TLS: option {TLS_ROOT_CERTS!r} is the CA that signed its certificate; a"
                f" server requiring mutual TLS needs {TLS_CERT_CHAIN!r} and {TLS_PRIVATE_KEY!r})"
            )
        return RemoteError(
            f"cannot reach the {peer} at {uri} ({what}): {text}{hint}",
            grpc_status=Status.UNAVAILABLE,
        )
    if isinstance(exc, fl.FlightUnauthenticatedError) or "returned unauthenticated error" in full:
        return Unauthenticated(
            f"the {peer} at {uri} refused {what}: the bearer token is missing or wrong (give"
            f" option {TOKEN!r} or {TOKEN_FILE!r} a token it accepts)"
        )
    if isinstance(exc, KeyError | pa.ArrowKeyError):
        return NotFound(f"{what} at {uri}: {text}")
    if "returned precondition failed error" in full:  # (pyarrow raises it as ArrowInvalid)
        return Conflict(f"{what} at {uri}: {text}")
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
    connection: Connection = PLAIN,
) -> pa.Schema:
    """The schema of a table query (or of a worker's table), without starting anything."""
    try:
        with connection.connect(uri) as client:
            descriptor = fl.FlightDescriptor.for_command(command)
            call = _options(headers, timeout, connection)
            return client.get_schema(descriptor, call).schema
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "GetSchema", exc, peer) from None


def get_endpoints(
    uri: str,
    command: bytes,
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    peer: str = COORDINATOR,
    connection: Connection = PLAIN,
) -> tuple[bytes, list[Endpoint]]:
    """Start a table query (or plan a worker's table read); its id (if any) and one endpoint
    per output partition."""
    try:
        with connection.connect(uri) as client:
            descriptor = fl.FlightDescriptor.for_command(command)
            info = client.get_flight_info(descriptor, _options(headers, timeout, connection))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "GetFlightInfo", exc, peer) from None
    endpoints = [
        Endpoint(e.ticket.ticket, tuple(str(loc.uri.decode()) for loc in e.locations))
        for e in info.endpoints
    ]
    return bytes(info.app_metadata or b""), endpoints


def read_endpoint(
    endpoint: Endpoint,
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    connection: Connection = PLAIN,
    coordinator: str | None = None,
    shared_memory: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The batches of one endpoint, read from the first of its locations that answers. When
    none does, or the one that answers no longer has its task (NOT_FOUND before any row: the
    worker was paused or restarted meanwhile), and the endpoint is a `coordinator`'s held
    query, the coordinator is asked where its task runs now (it moves a lost worker's tasks),
    and the read goes there. With `shared_memory`, a worker on this host hands its batches
    over in shared memory (shared_read.py) instead of through the socket."""
    try:
        yield from _read_locations(
            endpoint, headers, timeout, connection, shared_memory=shared_memory
        )
    except _Unreachable as unreachable:
        if coordinator is None:
            raise unreachable.error from None
        moved = relocate(coordinator, endpoint, unreachable.failed, headers, connection=connection)
        if moved.locations == endpoint.locations and moved.ticket == endpoint.ticket:
            raise unreachable.error from None
        yield from _read_locations(
            moved, headers, timeout, connection, fallback=False, shared_memory=shared_memory
        )


class _Unreachable(Exception):
    """No location of an endpoint served it: none answered, or the last one that answered
    did not have its task (nothing was read)."""

    def __init__(self, error: FlightfeedError, failed: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.failed = failed


def relocate(
    uri: str,
    endpoint: Endpoint,
    failed: str,
    headers: Mapping[str, str],
    *,
    connection: Connection = PLAIN,
) -> Endpoint:
    """Where a coordinator's held query serves `endpoint` now that `failed` did not answer."""
    body = json.dumps({"ticket": endpoint.ticket.hex(), "failed": failed}).encode()
    try:
        with connection.connect(uri) as client:
            call = _options(headers, DEFAULT_TIMEOUT, connection)
            results = list(client.do_action(fl.Action("relocate", body), call))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "relocate", exc) from None
    answer = json.loads(b"".join(r.body.to_pybytes() for r in results))
    return Endpoint(bytes.fromhex(answer["ticket"]), (str(answer["location"]),))


def _read_locations(
    endpoint: Endpoint,
    headers: Mapping[str, str],
    timeout: float,
    connection: Connection,
    *,
    fallback: bool = True,
    shared_memory: bool = True,
) -> Iterator[pa.RecordBatch]:
    errors: list[str] = []
    for location in endpoint.locations:
        yielded = False
        watch = IdleWatch(timeout)  # (`timeout` bounds each wait for a batch, not the read)
        try:
            with connection.connect(location) as client, watch:
                call = _options(headers, None, connection)
                if shared_memory and on_this_host(location):
                    batches = read_ticket(
                        client, location, endpoint.ticket, call, reading=watch.reading
                    )
                else:
                    reader = client.do_get(fl.Ticket(endpoint.ticket), call)
                    watch.reading(reader)
                    batches = (chunk.data for chunk in reader)
                while True:
                    with watch.waiting():
                        batch = next(batches, None)
                    if batch is None:
                        break
                    yielded = True
                    yield batch
            return
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            if watch.expired:
                raise RemoteError(
                    f"DoGet at {location}: the {WORKER} sent no batch for {timeout:g}s (option"
                    " 'timeout': the longest wait for each batch of a read)",
                    grpc_status=Status.DEADLINE_EXCEEDED,
                ) from None
            error = flight_error(location, "DoGet", exc, WORKER)
            if yielded and isinstance(error, RemoteError):
                raise RemoteError(
                    f"the {WORKER} at {location} was lost in the middle of a DoGet"
                    f" ({_said(exc)}): read the"
                    " partition again from its start",
                    grpc_status=error.grpc_status,
                ) from None  # another location would repeat the rows already read
            if fallback and not yielded and isinstance(error, NotFound):
                raise _Unreachable(error, location) from None  # the task is not there (now)
            if yielded or not isinstance(error, RemoteError):
                raise error from None
            errors.append(str(error))  # unreachable: try the next location
    error = RemoteError(
        "; ".join(errors) or "an endpoint with no location", grpc_status=Status.UNAVAILABLE
    )
    if fallback and endpoint.locations:
        raise _Unreachable(error, endpoint.locations[-1])
    raise error


def explain(
    uri: str, command: bytes, headers: Mapping[str, str], *, connection: Connection = PLAIN
) -> str:
    """The distributed plan a table query would run, as the coordinator describes it."""
    try:
        with connection.connect(uri) as client:
            action = fl.Action("explain", command)
            call = _options(headers, DEFAULT_TIMEOUT, connection)
            results = list(client.do_action(action, call))
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "explain", exc) from None
    return b"".join(r.body.to_pybytes() for r in results).decode()


def stream_action(
    uri: str,
    kind: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    connection: Connection = PLAIN,
) -> dict[str, Any]:
    """A stream action of the coordinator ("stream_open", "stream_latest", "stream_commit")."""
    try:
        with connection.connect(uri) as client:
            call = _options(headers, timeout, connection)
            results = list(client.do_action(fl.Action(kind, body), call))
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
    connection: Connection = PLAIN,
) -> bytes:
    """Run an action (a worker's "commit_staged", "count_rows", ...); its results, joined."""
    try:
        with connection.connect(uri) as client:
            call = _options(headers, timeout, connection)
            results = list(client.do_action(fl.Action(kind, body), call))
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
    connection: Connection = PLAIN,
) -> tuple[int, bytes]:
    """DoPut `batches` (of `schema`) under a descriptor with `command`: (rows sent, the
    server's last PutResult metadata). An error raised by `batches` themselves propagates as it
    is. pyarrow cannot cancel a DoPut: closing the client ends the stream as if complete, so
    the server may keep the rows sent before the error. Use it where that is harmless, as for
    a staged task attempt, which only a commit naming it publishes."""
    sent = 0
    answer = b""
    try:
        flight = connection.connect(uri)
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        raise flight_error(uri, "DoPut", exc, peer) from None
    with flight:
        try:
            descriptor = fl.FlightDescriptor.for_command(command)
            call = _options(headers, timeout, connection)
            writer, reader = flight.do_put(descriptor, schema, call)
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


def release(
    uri: str, query_id: bytes, headers: Mapping[str, str], *, connection: Connection = PLAIN
) -> None:
    """Tell the coordinator a query's readers are done (best effort)."""
    try:
        with connection.connect(uri) as client:
            call = _options(headers, 10.0, connection)
            list(client.do_action(fl.Action("release", query_id), call))
    except (fl.FlightError, pa.ArrowException, OSError, FlightfeedError):
        pass  # the query is released after its TTL anyway


__all__ = [
    "COORDINATOR",
    "PLAIN",
    "TLS_CERT_CHAIN",
    "TLS_PRIVATE_KEY",
    "TLS_ROOT_CERTS",
    "TOKEN",
    "TOKEN_FILE",
    "WORKER",
    "Connection",
    "Endpoint",
    "do_action",
    "explain",
    "flight_error",
    "get_endpoints",
    "get_schema",
    "put_batches",
    "read_endpoint",
    "redacted",
    "release",
    "relocate",
    "stream_action",
]
