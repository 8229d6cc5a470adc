"""The remote engine's request messages as the tables layer's own terms, checked: a table
identifier, a read (projection by index, predicates as flightfeed expressions, time range,
order, batch size, parallelism) and a deadline."""

from __future__ import annotations

import math
from typing import Final

import pyarrow as pa

from .._generated.remote_engine import (
    ReadOrder,
    TableIdentifier,
    TableReadRequest,
)
from .._generated.schema import ProjectedSchema
from ..errors import InvalidArgument, PlanDecodeError
from ..plan.expr import Expr
from ..plan.expr_proto import decode_expr
from ..protowire import decode_varint
from .datafusion_expr import predicate_from_datafusion
from .engine import DEFAULT_BATCH_ROWS, TableRead
from .schema import TableSchema
from .store import Order, TableName

MAX_PREDICATES: Final = 1024
_FLIGHTFEED_EXPR_FIELDS: Final = 3
"""flightfeed.v1.Expr's members are fields 1-3; a predicate starting with a higher field is
DataFusion's (a binary expression is 4, NOT 8, IN 14, ...)."""
_ORDERS: Final[dict[ReadOrder, Order]] = {
    ReadOrder.None_: "none",
    ReadOrder.Asc: "asc",
    ReadOrder.Desc: "desc",
}


def table_name(identifier: TableIdentifier | None) -> TableName:
    if identifier is None:
        raise InvalidArgument("the request names no table")
    return TableName.of(identifier.table, identifier.catalog, identifier.schema)


def deadline_seconds(timeout_ms: int) -> float:
    """HoraeDB's `timeout_ms` (the time left; -1 none) in seconds for anyio.fail_after. Zero is
    what a client that never set the field sends: no deadline either."""
    return math.inf if timeout_ms <= 0 else timeout_ms / 1000


def projected_columns(
    projected: ProjectedSchema | None, table: TableSchema
) -> tuple[str, ...] | None:
    """Column names of a projection: indexes into the request's schema (the table's own when the
    request carries none); None projects every column."""
    if projected is None or projected.projection is None:
        return None
    if projected.table_schema is not None and projected.table_schema.columns:
        names = [c.name for c in projected.table_schema.columns]
    else:
        names = table.names
    columns = []
    for index in projected.projection.idx:
        if index >= len(names):
            raise InvalidArgument(
                f"projection index {index} is out of range ({len(names)} columns)"
            )
        columns.append(names[index])
    for name in columns:
        table.column(name)  # the request's schema may name a column the table lacks
    return tuple(columns)


def predicate_bytes(request: TableReadRequest | None) -> int:
    """The size of a read's predicates on the wire: what decoding them costs."""
    if request is None or request.predicate is None:
        return 0
    return sum(len(expr) for expr in request.predicate.exprs)


def table_read(name: TableName, request: TableReadRequest | None, table: TableSchema) -> TableRead:
    if request is None:
        return TableRead(name)
    predicate = request.predicate
    exprs = predicate.exprs if predicate is not None else []
    if len(exprs) > MAX_PREDICATES:
        raise InvalidArgument(f"at most {MAX_PREDICATES} predicate expressions, got {len(exprs)}")
    time_range = None
    if predicate is not None and predicate.time_range is not None:
        time_range = (predicate.time_range.start, predicate.time_range.end)
    options = request.opts
    order = _ORDERS.get(request.order)
    if order is None:
        raise InvalidArgument(f"unknown read order {request.order!r}")
    return TableRead(
        name,
        columns=projected_columns(request.projected_schema, table),
        predicates=tuple(_predicate(bytes(e), i, table.arrow) for i, e in enumerate(exprs)),
        time_range=time_range,
        order=order,
        batch_size=(options.batch_size if options and options.batch_size else DEFAULT_BATCH_ROWS),
        parallelism=(options.read_parallelism if options and options.read_parallelism else 1),
    ).checked()


def decode_predicate(data: bytes, schema: pa.Schema | None = None) -> Expr:
    """A predicate as flightfeed's clients send it (a flightfeed.v1.Expr) or as HoraeDB does
    (DataFusion's LogicalExprNode). The two share field numbers 1-3, and a column (1) means
    the same in both; bytes that are not a valid flightfeed expression are tried as
    DataFusion's."""
    if _first_field(data) > _FLIGHTFEED_EXPR_FIELDS:
        return predicate_from_datafusion(data, schema)
    try:
        return decode_expr(data)
    except PlanDecodeError as ours:
        try:
            return predicate_from_datafusion(data, schema)
        except InvalidArgument as theirs:
            raise InvalidArgument(
                f"neither a flightfeed.v1.Expr ({ours.message}) nor a DataFusion expression"
                f" ({theirs.message})"
            ) from None


def _predicate(data: bytes, index: int, schema: pa.Schema) -> Expr:
    try:
        return decode_predicate(data, schema)
    except InvalidArgument as exc:
        raise type(exc)(f"predicate {index}: {exc.message}") from None


def _first_field(data: bytes) -> int:
    try:
        key, _ = decode_varint(memoryview(data), 0)
    except InvalidArgument:
        return 0
    return key >> 3


__all__ = [
    "decode_predicate",
    "deadline_seconds",
    "predicate_bytes",
    "projected_columns",
    "table_name",
    "table_read",
]
