"""The coordinator as an Arrow Flight service: any Flight client queries its catalog's tables
and reads the results in parallel, straight from the workers.

- ListFlights: the catalog, one FlightInfo per table (its schema when it takes no arguments,
  its signature and description in app_metadata).
- GetSchema: a query's schema, without starting anything.
- GetFlightInfo: plans the query, starts its tasks and feeds on the workers (a held query,
  see held.py) and answers one FlightEndpoint per output partition: a DoGet ticket and the
  location of the worker that serves it. Its app_metadata is the query id.
- DoAction "release" (body: the query id): the reader is done; release the query now.
- DoAction "explain" (body: a TableQuery): the distributed plan it would run (stages, tasks
  and the workers they would run on), as text, without starting anything.

The caller's own headers (not gRPC's or HTTP/2's) go to the workers' session builders with
the query's tasks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Final

import pyarrow as pa

from ..errors import InvalidArgument, NotFound
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
from .catalog import Catalog
from .coordinator import Coordinator
from .held import DEFAULT_GRACE, DEFAULT_TTL, HeldQuery
from .table_query import parse_table_query, query_plan

RELEASE_ACTION: Final = "release"
EXPLAIN_ACTION: Final = "explain"
_TRANSPORT_HEADERS: Final = frozenset(
    {"user-agent", "te", "content-type", "authorization", "grpc-timeout", "grpc-encoding"}
)


def query_headers(ctx: CallContext) -> dict[str, str]:
    """The caller's own text headers (not those of gRPC, HTTP/2 or auth)."""
    out: dict[str, str] = {}
    for name, value in ctx.headers.items() if hasattr(ctx.headers, "items") else ():
        if not isinstance(value, str) or name.startswith((":", "grpc-")):
            continue
        if name not in _TRANSPORT_HEADERS:
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

    @property
    def held(self) -> Mapping[bytes, HeldQuery]:
        """The queries being read now, by id."""
        self._forget_released()
        return dict(self._held)

    async def list_flights(self, ctx: CallContext, criteria: bytes) -> AsyncIterator[FlightInfo]:
        for name in sorted(self.catalog.tables):
            table = self.catalog.tables[name]
            try:
                schema = self.catalog.plan(name).schema
            except InvalidArgument:  # it takes arguments: no schema without them
                schema = pa.schema([])
            about = {"signature": table.signature, "description": table.description}
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
        plan = query_plan(self.catalog, parse_table_query(descriptor))
        held = await self.coordinator.hold(
            plan, headers=query_headers(ctx), ttl=self.ttl, grace=self.grace
        )
        self._forget_released()
        self._held[held.query_id] = held
        return FlightInfo(
            schema=schema_to_ipc(held.schema),
            flight_descriptor=descriptor,
            endpoint=_endpoints(held),
            total_records=-1,
            total_bytes=-1,
            ordered=False,
            app_metadata=held.query_id,
        )

    async def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        if action.type == EXPLAIN_ACTION:
            descriptor = FlightDescriptor(cmd=action.body)
            plan = query_plan(self.catalog, parse_table_query(descriptor))
            yield (await self.coordinator.explain(plan, on_workers=True)).encode()
            return
        if action.type != RELEASE_ACTION:
            raise InvalidArgument(
                f"unknown action {action.type!r}; this coordinator knows"
                f" {RELEASE_ACTION!r} and {EXPLAIN_ACTION!r}"
            )
        held = self._held.pop(action.body, None)
        if held is None:
            raise NotFound(f"no query {action.body.hex()} is held here (released already?)")
        held.release()
        yield b""

    async def list_actions(self, ctx: CallContext) -> Sequence[ActionType]:
        return [
            ActionType(type=RELEASE_ACTION, description="release a query: body = query id"),
            ActionType(type=EXPLAIN_ACTION, description="a query's plan: body = TableQuery"),
        ]

    def _forget_released(self) -> None:
        for query_id in [q for q, held in self._held.items() if held.released]:
            del self._held[query_id]


def _endpoints(held: HeldQuery) -> list[FlightEndpoint]:
    return [
        FlightEndpoint(ticket=Ticket(ticket=e.ticket), location=[Location(uri=e.location)])
        for e in held.endpoints
    ]
