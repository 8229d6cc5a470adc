"""The worker's Flight face: DoGet whose ticket is a serialized ExecuteTaskRequest (any Flight
client runs a task), DoExchange reading such a ticket through shared memory (a reader on the
worker's host), and the worker's tables."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from ..._generated.arrow.flight.protocol import (
    Action,
    ActionType,
    FlightDescriptor,
    FlightInfo,
)
from ...concurrency import closing
from ...flight.server import CallContext, FlightHandler, PutResultWriter
from ...flight.shared_memory import is_loopback_peer
from ...flight.streams import FlightDataReader, FlightDataWriter
from ...protocol.tickets import parse_ticket
from ...tables.flight import ACTIONS as TABLE_ACTIONS
from ...tables.flight import TableFlight, is_table_ticket
from ..state import WorkerState
from .execute_task import execute_task
from .flight_sink import FlightSink
from .shared_memory_read import shared_memory_read


class WorkerFlightHandler(FlightHandler):
    """The worker's Flight face: DoGet of task partitions (ExecuteTask tickets), and its
    tables (flightfeed.tables.flight: descriptors, table tickets, DoPut, actions)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.tables = TableFlight(state.table_engine, lambda: state.location)

    async def do_get(self, ctx: CallContext, ticket: bytes, writer: FlightDataWriter) -> None:
        if is_table_ticket(ticket):
            with self.state.call_under_way():
                await self.tables.do_get(ticket, writer)
            return
        await execute_task(self.state, parse_ticket(ticket), FlightSink(writer))

    async def do_exchange(
        self, ctx: CallContext, reader: FlightDataReader, writer: FlightDataWriter
    ) -> None:
        local = is_loopback_peer(ctx.peer)
        await shared_memory_read(self.state, self.tables, reader, writer, local=local)

    async def get_flight_info(self, ctx: CallContext, descriptor: FlightDescriptor) -> FlightInfo:
        # (the host, not the port: a client's connections share its fair share of snapshots)
        holder = ctx.peer[0] if ctx.peer else ""
        with self.state.call_under_way():
            return await self.tables.flight_info(descriptor, holder=holder)

    async def get_schema(self, ctx: CallContext, descriptor: FlightDescriptor) -> pa.Schema:
        return self.tables.schema(descriptor)

    async def do_put(
        self, ctx: CallContext, reader: FlightDataReader, results: PutResultWriter
    ) -> None:
        with self.state.call_under_way():
            await self.tables.do_put(reader, results)

    async def do_action(self, ctx: CallContext, action: Action) -> AsyncIterator[bytes]:
        with self.state.call_under_way():
            async with closing(self.tables.do_action(action)) as results:
                async for result in results:
                    yield result

    async def list_actions(self, ctx: CallContext) -> Sequence[ActionType]:
        return TABLE_ACTIONS

    async def list_flights(self, ctx: CallContext, criteria: bytes) -> AsyncIterator[FlightInfo]:
        if self.state.tables is None:
            return
        async with closing(self.tables.list_flights()) as infos:
            async for info in infos:
                yield info
