"""Table queries on the wire: what a Flight client asks a coordinator for (catalog.proto).

A client builds the FlightDescriptor command with `table_command`; the coordinator parses it
with `parse_table_query` (from untrusted bytes: strict wire check, known version only) and
turns it into a plan with `query_plan`: the table's plan, the pushed filters on top of it (so
they run on the workers), then the projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import betterproto2

from ..errors import InvalidArgument
from ..flight import FlightDescriptor
from ..messages import parse_strict
from ..plan import ExecutionPlan, Expr, Filter, Projection, call, col
from ..plan.expr_proto import expr_from_proto, expr_to_proto
from ..protocol import StreamRange, TableArgument, TableCommand, TableQuery
from .catalog import Catalog

TABLE_QUERY_VERSION: Final = 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
Argument = int | float | str | bool


@dataclass(frozen=True)
class UnitRange:
    """Work units [start, end) of each partition of an open stream (a micro-batch)."""

    stream: str
    start: dict[str, int]
    end: dict[str, int]
    incarnation: str = ""
    """The stream's opening these offsets were taken in (streams.py); empty: unchecked."""


@dataclass(frozen=True)
class ParsedTableQuery:
    table: str
    arguments: tuple[Argument, ...] = ()
    columns: tuple[str, ...] = ()
    filters: tuple[Expr, ...] = ()
    units: UnitRange | None = None


def table_command(
    table: str,
    arguments: Sequence[Argument] = (),
    *,
    columns: Sequence[str] = (),
    filters: Sequence[Expr] = (),
    units: UnitRange | None = None,
) -> bytes:
    """The `cmd` of a FlightDescriptor that queries `table(*arguments)` of a catalog (`units`:
    only those work units of an open stream of it)."""
    return bytes(
        TableQuery(
            version=TABLE_QUERY_VERSION,
            table=table,
            arguments=[_argument(table, i, value) for i, value in enumerate(arguments)],
            columns=list(columns),
            filters=[expr_to_proto(f) for f in filters],
            stream_range=StreamRange(
                stream=units.stream,
                start=units.start,
                end=units.end,
                incarnation=units.incarnation,
            )
            if units is not None
            else None,
        )
    )


def _argument(table: str, index: int, value: Argument) -> TableArgument:
    if isinstance(value, bool):  # before int: a bool is an int
        return TableArgument(boolean=value)
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:  # (it would wrap: 2**64 - 1 arrived as -1)
            raise InvalidArgument(
                f"argument {index} of {table}(...) is {value}, outside the 64-bit integers a"
                f" table argument holds ({INT64_MIN} to {INT64_MAX})"
            )
        return TableArgument(integer=value)
    if isinstance(value, float):
        return TableArgument(real=value)
    if isinstance(value, str):
        return TableArgument(text=value)
    raise InvalidArgument(
        f"argument {index} of {table}(...) must be an int, float, str or bool, got {value!r}"
    )


def parse_table_query(descriptor: FlightDescriptor) -> ParsedTableQuery:
    """The query a descriptor asks for: a TableQuery command, or a path naming a table."""
    if descriptor.path:
        if len(descriptor.path) != 1:
            raise InvalidArgument(f"a table path has one element, got {list(descriptor.path)}")
        return ParsedTableQuery(descriptor.path[0])
    try:
        query = parse_strict(TableQuery, descriptor.cmd)
    except InvalidArgument as exc:
        raise InvalidArgument(f"the descriptor's command is not a TableQuery: {exc}") from None
    if query.version != TABLE_QUERY_VERSION:
        raise InvalidArgument(
            f"TableQuery version {query.version} is not supported (this coordinator reads"
            f" version {TABLE_QUERY_VERSION})"
        )
    if not query.table:
        raise InvalidArgument("the TableQuery names no table")
    if not query.table.isprintable():
        durable = _durable_table(descriptor.cmd)
        if durable is not None:
            raise InvalidArgument(
                f"the command is a worker's TableCommand (a read of durable table {durable!r}),"
                " and this is a coordinator: send it to the worker that holds the table (in"
                " Spark, option source=table with that worker's uri)"
            )
    arguments: list[Argument] = []
    for i, argument in enumerate(query.arguments):
        kind, value = betterproto2.which_one_of(argument, "value")
        if not kind or value is None:
            raise InvalidArgument(f"argument {i} of the TableQuery has no value")
        arguments.append(value)
    units = None
    if query.stream_range is not None:
        found = query.stream_range
        units = UnitRange(found.stream, dict(found.start), dict(found.end), found.incarnation)
    return ParsedTableQuery(
        query.table,
        tuple(arguments),
        tuple(query.columns),
        tuple(expr_from_proto(f) for f in query.filters),
        units,
    )


def _durable_table(command: bytes) -> str | None:
    """The table a worker's TableCommand reads, if `command` is one (a TableQuery's field 2, its
    table's name, is the TableCommand's TableRef there: it parses, as a name no catalog has)."""
    try:
        found = parse_strict(TableCommand, command)
    except InvalidArgument:
        return None
    if found.version != 1 or found.table is None or not found.table.table:
        return None
    return ".".join(
        part for part in (found.table.catalog, found.table.schema, found.table.table) if part
    )


def query_plan(catalog: Catalog, query: ParsedTableQuery) -> ExecutionPlan:
    """The plan a query runs: the table's, filtered, then projected."""
    plan = catalog.plan(query.table, query.arguments)
    if query.filters:
        predicate = query.filters[0]
        for more in query.filters[1:]:
            predicate = call("and_kleene", predicate, more)
        plan = Filter(plan, predicate, functions=catalog.session())
    if query.columns:
        missing = [c for c in query.columns if c not in plan.schema.names]
        if missing:
            raise InvalidArgument(
                f"table {query.table!r} has no columns {missing} (it has {plan.schema.names})"
            )
        plan = Projection(plan, [col(c) for c in query.columns], list(query.columns))
    return plan
