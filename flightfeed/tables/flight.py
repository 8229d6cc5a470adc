"""The Flight face of a worker's tables: what pyarrow, any Flight client and the Spark data
source use.

- GetFlightInfo / GetSchema of a PATH descriptor (`[table]` or `[catalog, schema, table]`) or a
  `TableCommand`: one endpoint per slice of the table's row ids (`partitions`), each ticket
  redeemed with DoGet on this worker.
- DoPut appends a stream's rows as one atomic write: batches are staged as they arrive (memory
  stays bounded whatever the stream's length) and published in one transaction at its end; a
  stream that fails or is cancelled publishes nothing. With `TableCommand.staged`, the rows stay
  staged as a Spark task attempt until its job commits (`commit_staged`) or aborts.
- Actions: create_table, drop_table, count_rows, commit_staged, abort_staged.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Final

import anyio
import pyarrow as pa

from .._generated.arrow.flight.protocol import (
    Action,
    ActionType,
    FlightDescriptor,
    FlightEndpoint,
    FlightInfo,
    Location,
    Ticket,
)
from .._generated.flightfeed.v1 import (
    AbortStaged,
    CommitStaged,
    CreateTable,
    RowCount,
    StagedWrite,
    TableCommand,
    TableQuery,
    TableRef,
    TableTicket,
)
from ..errors import InvalidArgument, ResourceExhausted, Unimplemented
from ..flight.client import path_descriptor
from ..flight.schema import schema_to_ipc
from ..flight.server import PutResultWriter
from ..flight.streams import FlightDataReader, FlightDataWriter
from ..messages import parse_strict
from ..plan.base import closing
from ..plan.expr_proto import expr_from_proto
from ..table_names import TABLE_ID_METADATA
from .decode_budget import dictionary_expansion
from .engine import TableEngine, TableRead
from .predicate import split_predicates
from .schema import TableSchema
from .snapshots import SNAPSHOT_ID_BYTES, SnapshotRef
from .store import PUT_JOB_PREFIX, STORE_VERSION_BYTES, TableName

TABLE_TICKET_PREFIX: Final = b"flightfeed-table:"
"""Starts every table ticket. An ExecuteTask ticket never does: 'f' is not a protobuf key."""
TABLE_COMMAND_VERSION: Final = 1
MAX_PARTITIONS: Final = 1024
OPEN_END: Final = 1 << 62
STAGE_ROWS: Final = 65_536
"""DoPut stages rows in chunks of at least this many (one transaction each)..."""
STAGE_BYTES: Final = 256 << 20
"""...or of this many bytes, dictionaries counted as their values."""
MAX_STAGE_EXPANSION: Final = 2 << 30
"""Bytes one DoPut batch's dictionary columns may decode to (as much as a batch may take
decoded, `max_decoded_size`)."""

CREATE_TABLE: Final = "create_table"
DROP_TABLE: Final = "drop_table"
COUNT_ROWS: Final = "count_rows"
COMMIT_STAGED: Final = "commit_staged"
ABORT_STAGED: Final = "abort_staged"
ACTIONS: Final = (
    ActionType(type=CREATE_TABLE, description="create a table: body = CreateTable"),
    ActionType(type=DROP_TABLE, description="drop a table: body = TableRef"),
    ActionType(type=COUNT_ROWS, description="a table's live rows: body = TableRef → RowCount"),
    ActionType(type=COMMIT_STAGED, description="publish a job's attempts: CommitStaged"),
    ActionType(type=ABORT_STAGED, description="discard a job's staged rows: AbortStaged"),
)


def table_name(ref: TableRef | None) -> TableName:
    if ref is None:
        raise InvalidArgument("the request names no table")
    return TableName.of(ref.table, ref.catalog, ref.schema)


def table_ref(name: TableName) -> TableRef:
    return TableRef(catalog=name.catalog, schema=name.schema, table=name.table)


@dataclass(frozen=True)
class ParsedCommand:
    read: TableRead
    partitions: int
    staged: StagedWrite | None


def parse_command(descriptor: FlightDescriptor) -> ParsedCommand:
    """The table read or write a descriptor names (a path, or a TableCommand)."""
    if descriptor.path:
        path = list(descriptor.path)
        if len(path) == 1:
            return ParsedCommand(TableRead(TableName.of(path[0])), 1, None)
        if len(path) == 3:
            return ParsedCommand(TableRead(TableName.of(path[2], path[0], path[1])), 1, None)
        raise InvalidArgument(f"a table path is [table] or [catalog, schema, table], got {path}")
    try:
        command = parse_strict(TableCommand, descriptor.cmd)
    except InvalidArgument as exc:
        query = _catalog_query(descriptor.cmd)
        if query is not None:
            raise InvalidArgument(
                f"the command is a coordinator's TableQuery (of its catalog's table {query!r}),"
                " and this worker serves durable tables: send it to the coordinator (in Spark,"
                " leave out option source=table)"
            ) from None
        raise InvalidArgument(f"the descriptor's command is not a TableCommand: {exc}") from None
    return parsed(command)


def _catalog_query(command: bytes) -> str | None:
    """The table a coordinator's TableQuery names, if `command` is one: both messages carry
    their version in field 1 and something length-delimited in field 2, so a command sent to
    the wrong kind of server parses as far as that."""
    try:
        query = parse_strict(TableQuery, command)
    except InvalidArgument:
        return None
    return query.table if query.version == 1 and query.table.isprintable() else None


def parsed(command: TableCommand) -> ParsedCommand:
    if command.version != TABLE_COMMAND_VERSION:
        raise InvalidArgument(
            f"TableCommand version {command.version} is not supported (this worker reads"
            f" version {TABLE_COMMAND_VERSION})"
        )
    time_range = None
    if command.start_ms is not None or command.end_ms is not None:
        time_range = (
            command.start_ms if command.start_ms is not None else -(1 << 62),
            command.end_ms if command.end_ms is not None else 1 << 62,
        )
    partitions = command.partitions or 1
    if partitions > MAX_PARTITIONS:
        raise InvalidArgument(f"at most {MAX_PARTITIONS} partitions, got {partitions}")
    if command.no_columns and command.columns:
        raise InvalidArgument(
            f"a TableCommand with no_columns names no columns, got {list(command.columns)}"
        )
    read = TableRead(
        table_name(command.table),
        columns=() if command.no_columns else tuple(command.columns) or None,
        predicates=tuple(expr_from_proto(f) for f in command.filters),
        time_range=time_range,
    ).checked()
    return ParsedCommand(read, partitions, command.staged)


def _ticket(
    command: TableCommand, start: int, end: int, table_id: int, snapshot: SnapshotRef | None
) -> bytes:
    ticket = TableTicket(
        command=command,
        rowid_start=start,
        rowid_end=end,
        table_id=table_id,
        snapshot=b"" if snapshot is None else snapshot.id,
        snapshot_version=b"" if snapshot is None else snapshot.version,
    )
    return TABLE_TICKET_PREFIX + bytes(ticket)


def _snapshot_of(ticket: TableTicket) -> SnapshotRef | None:
    if not ticket.snapshot:
        if ticket.snapshot_version:
            raise InvalidArgument("a table ticket's snapshot_version goes with its snapshot")
        return None
    if ticket.table_id is None or len(ticket.snapshot) != SNAPSHOT_ID_BYTES:
        raise InvalidArgument(
            f"a table ticket's snapshot is {SNAPSHOT_ID_BYTES} bytes, with its table id"
        )
    if ticket.snapshot_version and len(ticket.snapshot_version) != STORE_VERSION_BYTES:
        raise InvalidArgument(
            f"a table ticket's snapshot_version is {STORE_VERSION_BYTES} bytes, got"
            f" {len(ticket.snapshot_version)}"
        )
    return SnapshotRef(ticket.snapshot, ticket.snapshot_version)


def is_table_ticket(ticket: bytes) -> bool:
    return ticket.startswith(TABLE_TICKET_PREFIX)


class TableFlight:
    """The worker's Flight handler delegates table descriptors, tickets and actions here."""

    def __init__(self, engine: Callable[[], TableEngine], location: Callable[[], str]) -> None:
        self.engine = engine
        self.location = location

    def schema(self, descriptor: FlightDescriptor) -> pa.Schema:
        """The read's schema, naming the table's id in its metadata (TABLE_ID_METADATA)."""
        command = parse_command(descriptor)
        engine = self.engine()
        schema = engine.read_schema(command.read)
        table_id = str(engine.entry(command.read.name).id).encode()
        return schema.with_metadata({**(schema.metadata or {}), TABLE_ID_METADATA: table_id})

    async def flight_info(self, descriptor: FlightDescriptor, *, holder: str = "") -> FlightInfo:
        """The read's endpoints; planned in several, a snapshot held for `holder` (the
        caller's host: snapshots.py)."""
        engine = self.engine()
        command = parse_command(descriptor)
        entry = engine.entry(command.read.name)
        read = replace(command.read, table_id=entry.id)  # (every step below of that table)
        schema = engine.read_schema(read)  # also: the columns exist
        split_predicates(read.predicates, entry.schema.arrow)
        # The columns announced, named: a column added before a ticket is read is not streamed.
        as_command = _as_command(descriptor, command)
        as_command.columns = list(schema.names)
        as_command.no_columns = not schema.names
        snapshot: SnapshotRef | None = None
        slices = [(0, -1)]  # (one ticket, one transaction: no snapshot to hold)
        if command.partitions > 1:  # (the slices' reads see the table as it is now)
            planned = await engine.plan_slices(read, command.partitions, holder=holder)
            snapshot, slices = planned.ref, planned.slices
        location = [Location(uri=self.location())]
        endpoints = [
            FlightEndpoint(
                ticket=Ticket(ticket=_ticket(as_command, lo, hi, entry.id, snapshot)),
                location=location,
            )
            for lo, hi in slices
        ]
        return FlightInfo(
            schema=schema_to_ipc(schema),
            flight_descriptor=descriptor,
            endpoint=endpoints,
            total_records=-1,
            total_bytes=-1,
            ordered=False,
        )

    async def do_get(self, ticket: bytes, writer: FlightDataWriter) -> None:
        engine = self.engine()
        try:
            found = parse_strict(TableTicket, ticket[len(TABLE_TICKET_PREFIX) :])
        except InvalidArgument as exc:
            raise InvalidArgument(f"malformed table ticket: {exc}") from None
        if found.command is None:
            raise InvalidArgument("the table ticket holds no command")
        read = parsed(found.command).read
        end = OPEN_END if found.rowid_end < 0 else found.rowid_end
        if found.rowid_start < 0 or end < found.rowid_start:
            raise InvalidArgument(f"bad row id range [{found.rowid_start}, {found.rowid_end})")
        read = replace(read, rowid_range=(found.rowid_start, end), table_id=found.table_id)
        snapshot = _snapshot_of(found)
        await writer.begin(engine.read_schema(read))
        # (closed here, by this task, when the client leaves midway: left to the garbage
        # collector, its scan's cancel scopes were exited in another task, and the worker
        # logged "Attempted to exit cancel scope in a different task")
        async with closing(engine.read(read, snapshot=snapshot)) as batches:
            async for batch in batches:
                await writer.write(batch)

    async def do_put(self, reader: FlightDataReader, results: PutResultWriter) -> None:
        engine = self.engine()
        await reader.read_schema()
        if reader.descriptor is None:
            raise InvalidArgument("DoPut needs a descriptor naming the table")
        command = parse_command(reader.descriptor)
        name = command.read.name
        staged = command.staged
        table_id = engine.entry(name).id  # (every chunk goes to this table, or none)
        if staged is not None:
            job = _job(staged.job)
            rows = await _stage_stream(
                engine, name, reader, job, staged.partition, staged.attempt, table_id
            )
        else:
            job = f"{PUT_JOB_PREFIX}{uuid.uuid4().hex}"
            try:
                await _stage_stream(engine, name, reader, job, 0, 0, table_id)
                rows = await engine.commit_staged(name, job, [(0, 0)], table_id=table_id)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await engine.abort_staged(name, job)
                raise
        await results.write(bytes(RowCount(rows=rows, table_id=table_id)))

    async def do_action(self, action: Action) -> AsyncIterator[bytes]:
        engine = self.engine()
        kind, body = action.type, action.body
        if kind == CREATE_TABLE:
            request = parse_strict(CreateTable, body)
            if request.table_schema is None:
                raise InvalidArgument("create_table needs the table's schema")
            partition = bytes(request.partition_info) if request.partition_info else b""
            await engine.create(
                table_name(request.table),
                TableSchema.from_proto(request.table_schema),
                dict(request.options),
                partition_info=partition,
                if_not_exists=request.if_not_exists,
            )
            yield b""
        elif kind == DROP_TABLE:
            await engine.drop(table_name(parse_strict(TableRef, body)))
            yield b""
        elif kind == COUNT_ROWS:
            rows = await engine.row_count(table_name(parse_strict(TableRef, body)))
            yield bytes(RowCount(rows=rows))
        elif kind == COMMIT_STAGED:
            commit = parse_strict(CommitStaged, body)
            attempts = [(a.partition, a.attempt) for a in commit.attempts]
            rows = await engine.commit_staged(
                table_name(commit.table),
                _job(commit.job),
                attempts,
                overwrite=commit.overwrite,
                table_id=commit.table_id,
                series=_series(commit),
            )
            yield bytes(RowCount(rows=rows))
        elif kind == ABORT_STAGED:
            abort = parse_strict(AbortStaged, body)
            rows = await engine.abort_staged(table_name(abort.table), _job(abort.job))
            yield bytes(RowCount(rows=rows))
        else:
            known = ", ".join(a.type for a in ACTIONS)
            raise Unimplemented(f"unknown action {kind!r}; this worker knows {known}")

    async def list_flights(self) -> AsyncIterator[FlightInfo]:
        for entry in self.engine().tables():
            name = entry.name
            yield FlightInfo(
                schema=schema_to_ipc(entry.schema.arrow),
                flight_descriptor=path_descriptor(name.catalog, name.schema, name.table),
                total_records=-1,
                total_bytes=-1,
            )


def _as_command(descriptor: FlightDescriptor, command: ParsedCommand) -> TableCommand:
    if not descriptor.path:
        return parse_strict(TableCommand, descriptor.cmd)
    return TableCommand(version=TABLE_COMMAND_VERSION, table=table_ref(command.read.name))


def _job(job: str) -> str:
    if not job or len(job) > 256 or job.startswith(PUT_JOB_PREFIX):
        raise InvalidArgument(
            f"bad job id {job!r}: 1 to 256 characters, not starting {PUT_JOB_PREFIX!r}"
        )
    return job


def _series(commit: CommitStaged) -> tuple[str, int] | None:
    if commit.series is None:
        return None
    if not commit.series or len(commit.series) > 256:
        raise InvalidArgument(f"bad series {commit.series!r}: 1 to 256 characters")
    if commit.sequence >= 1 << 63:
        raise InvalidArgument(f"bad sequence {commit.sequence}: at most 2^63 - 1")
    return commit.series, commit.sequence


async def _stage_stream(
    engine: TableEngine,
    name: TableName,
    reader: FlightDataReader,
    job: str,
    partition: int,
    attempt: int,
    table_id: int,
) -> int:
    """Stages every batch of the stream, in chunks, into table `table_id` (refused if `name`
    names another table now); returns the rows staged."""
    pending: list[pa.RecordBatch] = []
    pending_rows = pending_bytes = 0
    total = 0

    async def flush() -> None:
        nonlocal pending, pending_rows, pending_bytes, total
        if pending:
            total += await engine.stage(
                name, job, partition, attempt, pa.Table.from_batches(pending), table_id=table_id
            )
            pending, pending_rows, pending_bytes = [], 0, 0

    async for batch in reader:
        expansion = dictionary_expansion(batch)  # (what staging decodes it to, besides)
        if expansion > MAX_STAGE_EXPANSION:
            raise ResourceExhausted(
                f"a DoPut batch's dictionary columns decode to {expansion} bytes as the table"
                f" stores them, over the limit of {MAX_STAGE_EXPANSION}: send their values, or"
                " smaller batches"
            )
        pending.append(batch)
        pending_rows += batch.num_rows
        pending_bytes += batch.nbytes + expansion
        if pending_rows >= STAGE_ROWS or pending_bytes >= STAGE_BYTES:
            await flush()
    await flush()
    return total


__all__ = [
    "ACTIONS",
    "TABLE_TICKET_PREFIX",
    "TableFlight",
    "is_table_ticket",
    "parse_command",
    "table_name",
    "table_ref",
]
