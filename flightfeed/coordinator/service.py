"""The coordinator as an Arrow Flight service: any Flight client queries its catalog's tables
and reads the results in parallel, straight from the workers.

- ListFlights: the catalog, one FlightInfo per table (its schema when it takes no arguments,
  its signature and description in app_metadata).
- GetSchema: a query's schema, without starting anything.
- GetFlightInfo: plans the query, starts its tasks and feeds on the workers (a held query,
  see held.py) and answers one FlightEndpoint per output partition: a DoGet ticket and the
  location of the worker that serves it. Its app_metadata is the query id.
- DoAction "release" (body: the query id): the reader is done; release the query now.
- DoAction "relocate" (body: {"ticket": hex, "failed": location}): a reader could not reach an
  endpoint's worker; once the coordinator found it lost and ran the task elsewhere (held.py),
  answers the endpoint where it runs now, {"location", "ticket": hex} (after RELOCATE_WAIT
  seconds, where it runs then). For a query released already, the same partition of a new
  run of it (reruns.py: Spark reads a DataFrame's endpoints again in its later queries).
- DoAction "explain" (body: a TableQuery): the distributed plan it would run (stages, tasks
  and the workers they would run on), as text, without starting anything.
- Streams (streams.py), for readers such as Spark's Structured Streaming, with JSON bodies:
  "stream_open" (body: a TableQuery) starts the table's providers and answers {"stream": id,
  "offsets": {...}}, the units discovered so far per partition; "stream_latest" ({"stream"})
  answers the offsets now; "stream_commit" ({"stream", "offsets"}) drops the units below them;
  "stream_wait" ({"stream", "timeout"}) waits until every provider of a finite feed ended, or
  with "at_least" (offsets) until every partition discovered that many units; "stream_open"
  says "opened": true when it started the stream (it has discovered nothing yet). Every
  answer names the stream's "incarnation" (this opening of it); a commit, an "at_least", a
  "position" and a `stream_range` may carry the incarnation their offsets were taken in, and
  are refused when the stream was reopened since and its providers are not deterministic.
  "stream_latest" and "stream_commit" with a "reader" (a name) keep that reader's position
  ("position" sets it; the answer's "position" is where it is): units are dropped once every
  named reader committed past them.
  A TableQuery with a `stream_range` reads exactly those units (a micro-batch).

The caller's own headers (not gRPC's or HTTP/2's) go to the workers' session builders with
the query's tasks.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import anyio
import pyarrow as pa

from ..errors import InvalidArgument, NotFound, Unavailable
from ..flight import (
    Action,
    ActionType,
    CallContext,
    FlightDescriptor,
    FlightEndpoint,
    FlightHandler,
    FlightInfo,
    Location,
    Ticket,
    path_descriptor,
    schema_to_ipc,
)
from ..flight.json_object import json_object
from ..plan import ExecutionPlan
from ..protocol import task_id
from ..protocol.tickets import parse_ticket
from .catalog import Catalog
from .coordinator import Coordinator
from .held import DEFAULT_GRACE, DEFAULT_TTL, Endpoint, HeldQuery
from .reruns import Reruns
from .streams import FeedStream, stream_id, stream_key
from .table_query import ParsedTableQuery, parse_table_query, query_plan

RELEASE_ACTION: Final = "release"
RELOCATE_ACTION: Final = "relocate"
QUERY_ID_BYTES: Final = 16
"""A query id (a UUID's bytes): what `release` takes."""
RELOCATE_WAIT: Final = 30.0
"""How long "relocate" waits for a lost worker's task to run elsewhere (a frozen worker is
noticed within 8 s: flight/keepalive.py)."""
EXPLAIN_ACTION: Final = "explain"
STREAM_ACTIONS: Final = ("stream_open", "stream_latest", "stream_commit", "stream_wait")
STREAM_IDLE_TTL: Final = 600.0
MAX_READER_NAME: Final = 128
"""Seconds a stream nobody asked about keeps running its providers."""
DEFAULT_STREAM_WAIT: Final = 60.0
"""Seconds a stream_wait without a 'timeout' waits for its stream's feeds to end."""
_TRANSPORT_HEADERS: Final = frozenset(
    {"user-agent", "te", "content-type", "authorization", "grpc-timeout", "grpc-encoding"}
)

log = logging.getLogger(__name__)


def query_headers(ctx: CallContext) -> dict[str, str]:
    """The caller's own text headers (not those of gRPC, HTTP/2 or auth). A query carries one
    value per header to its session builders: a repeated one is refused, not cut to a value."""
    out: dict[str, str] = {}
    for name, value in ctx.headers.items() if hasattr(ctx.headers, "items") else ():
        if not isinstance(value, str) or name.startswith((":", "grpc-")):
            continue
        if name in _TRANSPORT_HEADERS:
            continue
        if name in out:
            raise InvalidArgument(
                f"header {name!r} is repeated: a query passes one value per header to the"
                " workers' session builders"
            )
        out[name] = value
    return out


class CoordinatorService(FlightHandler):
    """Flight RPCs over a Coordinator and its Catalog."""

    def __init__(
        self,
        coordinator: Coordinator,
        catalog: Catalog,
        *,
        ttl: float = DEFAULT_TTL,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        self.coordinator = coordinator
        self.catalog = catalog
        self.ttl = ttl
        self.grace = grace
        self._held: dict[bytes, HeldQuery] = {}
        self.reruns = Reruns()
        """The queries handed out, so that a reader of a released one runs it again."""

    @property
    def held(self) -> Mapping[bytes, HeldQuery]:
        """The queries being read now, by id."""
        self._forget_released()
        return dict(self._held)

    async def list_flights(self, ctx: CallContext, criteria: bytes) -> AsyncIterator[FlightInfo]:
        for name in sorted(self.catalog.tables):
            table = self.catalog.tables[name]
            about = {"signature": table.signature, "description": table.description}
            try:
                schema = self.catalog.plan(name).schema
            except InvalidArgument:  # it takes arguments: no schema without them
                schema = pa.schema([])
            except Exception as exc:  # (one table's failure lists it so, never fails the rest:
                schema = pa.schema([])  # sql() finds every table through this listing)
                about["error"] = f"{type(exc).__name__}: {exc}"
                log.warning("listing table %r: its plan failed: %s", name, about["error"])
            yield FlightInfo(
                schema=schema_to_ipc(schema),
                flight_descriptor=path_descriptor(name),
                total_records=-1,
                total_bytes=-1,
                app_metadata=json.dumps(about).encode(),
            )

    async def get_schema(self, ctx: CallContext, descriptor: FlightDescriptor) -> pa.Schema:
        return query_plan(self.catalog, parse_table_query(descriptor)).schema

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        headers = query_headers(ctx)
        query = parse_table_query(descriptor)
        held = await self._hold(query, headers)
        if query.units is None:  # (Spark plans a stream's micro-batch anew every time)
            self.reruns.remember(held, descriptor, headers)
        return FlightInfo(
            schema=schema_to_ipc(held.schema),
            flight_descriptor=descriptor,
            endpoint=_endpoints(held),
            total_records=-1,
            total_bytes=-1,
            ordered=False,
            app_metadata=held.query_id,
        )

    async def _hold(self, query: ParsedTableQuery, headers: Mapping[str, str]) -> HeldQuery:
        """Start `query` as a held query, with its caller's `headers`."""
        plan = query_plan(self.catalog, query)
        providers = self._micro_batch(query, plan) if query.units is not None else None
        held = await self.coordinator.hold(
            plan, headers=headers, ttl=self.ttl, grace=self.grace, providers=providers
        )
        self._forget_released()
        self._held[held.query_id] = held
        return held

    async def _hold_again(
        self, descriptor: FlightDescriptor, headers: Mapping[str, str]
    ) -> HeldQuery:
        """A released query's new run (reruns.py)."""
        return await self._hold(parse_table_query(descriptor), headers)

    def _micro_batch(self, query: ParsedTableQuery, plan: ExecutionPlan) -> dict[bytes, Any]:
        """The plan's feeds served from its stream's log: exactly the units in range."""
        assert query.units is not None
        stream = self.coordinator.streams.get(query.units.stream)
        if stream.stream_id != stream_id(query.table, query.arguments):
            raise InvalidArgument(
                f"the stream {stream.stream_id} was opened for another table or other arguments"
                f" than this query's ({query.table}): read a stream with the table and"
                " arguments it was opened for"
            )
        stream.check_incarnation(query.units.incarnation or None, "the micro-batch's offsets")
        feeds = self.coordinator.planner.feeds_in(plan)
        slices = stream.providers(query.units.start, query.units.end)
        if len(feeds) != len(slices):
            raise InvalidArgument(
                f"the stream {stream.stream_id} has {len(slices)} feeds, this query's plan"
                f" {len(feeds)}: read a stream with the table and arguments it was opened for"
            )
        return {feed.id: provider for feed, provider in zip(feeds, slices, strict=True)}

    async def _wait_ended(self, body: bytes) -> dict[str, Any]:
        request = _stream_request("stream_wait", body)
        stream = self.coordinator.streams.get(request["stream"])
        at_least = _offsets(request, "at_least") if "at_least" in request else None
        if at_least is not None:
            stream.check_incarnation(_incarnation(request), "the 'at_least' offsets")
        with anyio.move_on_after(_wait_seconds(request)):
            if at_least is None:
                await stream.wait_ended()
            else:
                await stream.wait_reached(at_least)
        return _stream_answer(stream)

    def _stream_action(self, kind: str, body: bytes) -> dict[str, Any]:
        streams = self.coordinator.streams
        streams.close_idle(STREAM_IDLE_TTL)
        if kind == "stream_open":
            query = parse_table_query(FlightDescriptor(cmd=body))
            plan = self.catalog.plan(query.table, query.arguments)
            stream = self.coordinator.open_stream(stream_key(query.table, query.arguments), plan)
            return {**_stream_answer(stream), "start": stream.start(), "opened": stream.fresh}
        request = _stream_request(kind, body)
        stream = streams.get(request["stream"])
        reader = _reader(request)
        if kind == "stream_commit":
            offsets = _offsets(request)
            stream.check_incarnation(_incarnation(request), "the committed offsets")
            stream.commit(offsets, reader)
        answer = _stream_answer(stream)
        if reader is not None:
            position = _offsets(request, "position") if "position" in request else None
            if position is not None:
                stream.check_incarnation(_incarnation(request), "the reader's position")
            answer["position"] = stream.read_by(reader, position)
        return answer

    async def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        if action.type == "stream_wait":
            yield json.dumps(await self._wait_ended(action.body)).encode()
            return
        if action.type == RELOCATE_ACTION:
            yield json.dumps(await self._relocate(action.body)).encode()
            return
        if action.type in STREAM_ACTIONS:
            yield json.dumps(self._stream_action(action.type, action.body)).encode()
            return
        if action.type == EXPLAIN_ACTION:
            descriptor = FlightDescriptor(cmd=action.body)
            plan = query_plan(self.catalog, parse_table_query(descriptor))
            yield (await self.coordinator.explain(plan, on_workers=True)).encode()
            return
        if action.type != RELEASE_ACTION:
            known = ", ".join([RELEASE_ACTION, RELOCATE_ACTION, EXPLAIN_ACTION, *STREAM_ACTIONS])
            raise InvalidArgument(f"unknown action {action.type!r}; this coordinator knows {known}")
        if len(action.body) != QUERY_ID_BYTES:
            raise InvalidArgument(
                f"release needs a query id, the {QUERY_ID_BYTES} bytes of a FlightInfo's"
                f" app_metadata: got {len(action.body)} bytes"
            )
        held = self._held.pop(action.body, None)
        if held is None:
            raise NotFound(f"no query {action.body.hex()} is held here (released already?)")
        held.release()
        yield b""

    async def list_actions(self, ctx: CallContext) -> Sequence[ActionType]:
        return [
            ActionType(type=RELEASE_ACTION, description="release a query: body = query id"),
            ActionType(
                type=RELOCATE_ACTION,
                description='where an endpoint runs now: {"ticket": hex, "failed": location}',
            ),
            ActionType(type=EXPLAIN_ACTION, description="a query's plan: body = TableQuery"),
            ActionType(type="stream_open", description="open a table's stream: body = TableQuery"),
            ActionType(type="stream_latest", description='offsets now: {"stream": id}'),
            ActionType(type="stream_commit", description='drop units: {"stream", "offsets"}'),
            ActionType(type="stream_wait", description='until a finite feed ended: {"stream"}'),
        ]

    async def _relocate(self, body: bytes) -> dict[str, str]:
        shape = "an object with 'ticket' (a hex string) and 'failed' (the location tried)"
        request = _json_object(RELOCATE_ACTION, body, shape)
        ticket_hex, failed = request.get("ticket"), request.get("failed")
        if not isinstance(ticket_hex, str) or not isinstance(failed, str):
            raise InvalidArgument(f"relocate needs a JSON body, {shape}")
        try:
            ticket = bytes.fromhex(ticket_hex)
        except ValueError as exc:
            raise InvalidArgument(f"relocate's 'ticket' is not hex: {exc}") from None
        task = parse_ticket(ticket)
        key = task_id(task.task_key)  # (checked: a ticket off the network)
        query_id = key.query_id
        number, partition = key.task_number, task.target_partition_start
        remembered = query_id in self.reruns
        held = self.reruns.latest(query_id) if remembered else self._held.get(query_id)
        if remembered and (
            held is None  # (its latest run ended and is gone)
            or (held.runtime.failure is None and (held.released or held.query_id != query_id))
        ):  # a reader of a planned read (Spark's DataFrame) whose query was released
            rerun = await self.reruns.rerun(query_id, self._hold_again)
            if rerun is not None:
                with anyio.move_on_after(RELOCATE_WAIT):
                    await rerun.ready(number)
                return _answer(rerun.endpoint(number, partition))
        if held is None:
            raise NotFound(
                f"no query {query_id.hex()} is held here (released already, and no longer"
                " remembered to run again?)"
            )
        failure = held.runtime.failure
        if failure is not None:  # (its tasks are gone: no place to send a reader)
            raise NotFound(
                f"the query ended in a failure, so nothing serves it: {failure}: run it again"
            )
        if held.released:
            raise NotFound(
                f"query {query_id.hex()} is not held here: it was released (read to its end"
                f" and not read again for {self.grace:g} s, not read for {self.ttl:g} s, or"
                " released by a reader): run it again"
            )
        endpoint = held.endpoint(number, partition)
        same_attempt = held.run(number).key.attempt == key.attempt  # (a new one may run there)
        if (
            same_attempt
            and endpoint.location == failed
            and await self.coordinator.health.serving(failed)
        ):
            # Nothing will move: waiting would only delay the reader's failure.
            raise Unavailable(
                f"the worker at {failed} serves this query's task {number} and answers this"
                " coordinator, but the reader could not reach it there: can readers reach the"
                " address the workers advertise (a worker's --advertise URL, a coordinator's"
                " --advertise-host for its local workers), and is the worker at its"
                " --max-connections?"
            )
        with anyio.move_on_after(RELOCATE_WAIT):
            endpoint = await held.relocate(number, partition, failed, key.attempt)
        return _answer(endpoint)

    def _forget_released(self) -> None:
        for query_id in [q for q, held in self._held.items() if held.released]:
            del self._held[query_id]


def _answer(endpoint: Endpoint) -> dict[str, str]:
    """relocate's answer: where to read the endpoint now, and with which ticket."""
    return {"location": endpoint.location, "ticket": endpoint.ticket.hex()}


def _json_object(kind: str, body: bytes, shape: str) -> dict[str, Any]:
    """An action's JSON object (the body comes off the network: anything else is
    InvalidArgument saying what `kind` needs, `shape`)."""
    try:
        return json_object(body)
    except ValueError as exc:
        raise InvalidArgument(f"{kind} needs a JSON body, {shape}: it {exc}") from None


def _stream_request(kind: str, body: bytes) -> dict[str, Any]:
    """A stream action's JSON object, with its string 'stream'."""
    request = _json_object(kind, body, "an object with a string 'stream'")
    if not isinstance(request.get("stream"), str):
        raise InvalidArgument(f"{kind} needs a JSON body, an object with a string 'stream'")
    return request


def _stream_answer(stream: FeedStream) -> dict[str, Any]:
    """What every stream action answers: the offsets now, in which incarnation."""
    return {
        "stream": stream.stream_id,
        "incarnation": stream.incarnation,
        "offsets": stream.latest(),
        "ended": stream.ended,
    }


def _incarnation(request: dict[str, Any]) -> str | None:
    """The request's 'incarnation' (the stream's opening its offsets were taken in), if any."""
    value = request.get("incarnation")
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"'incarnation' must be a string, got {repr(value)[:100]}")
    return value


def _reader(request: dict[str, Any]) -> str | None:
    """The request's 'reader': the name of a reader with a position of its own, if any."""
    value = request.get("reader")
    if value is None:
        return None
    if isinstance(value, str) and 0 < len(value) <= MAX_READER_NAME and value.isprintable():
        return value
    raise InvalidArgument(
        f"'reader' must be a printable string of 1 to {MAX_READER_NAME} characters,"
        f" got {repr(value)[:100]}"
    )


def _wait_seconds(request: dict[str, Any]) -> float:
    """stream_wait's 'timeout': seconds, finite and not negative (60 when absent)."""
    value = request.get("timeout", DEFAULT_STREAM_WAIT)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"stream_wait's 'timeout' must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # (a JSON integer past a float's range)
        seconds = math.inf
    if not 0 <= seconds < math.inf:  # (NaN too)
        raise InvalidArgument(
            f"stream_wait's 'timeout' must be 0 or more and finite, got {_shown(value)}"
        )
    return seconds


def _shown(number: float) -> str:
    """A number for a message: a JSON integer of 400 digits is not repeated whole."""
    text = str(number)
    return text if len(text) <= 32 else f"{text[:16]}... ({len(text)} digits)"


def _offsets(request: dict[str, Any], field: str = "offsets") -> dict[str, int]:
    """A request's offsets (stream_commit's 'offsets', stream_wait's 'at_least'): partition
    keys to unit counts, whole numbers 0 or more."""
    offsets = request.get(field, {})
    if not isinstance(offsets, dict) or not all(
        type(offset) is int and offset >= 0 for offset in offsets.values()
    ):
        shown = repr(offsets)[:200]  # (the peer's, and as long as it likes)
        raise InvalidArgument(
            f"'{field}' must map partition keys to whole numbers 0 or more, got {shown}"
        )
    return offsets


def _endpoints(held: HeldQuery) -> list[FlightEndpoint]:
    return [
        FlightEndpoint(ticket=Ticket(ticket=e.ticket), location=[Location(uri=e.location)])
        for e in held.endpoints
    ]
