"""AlterTableSchema (add columns, against the version the caller read) and AlterTableOptions
(a TTL takes effect at once: expired rows are no longer read, and are purged)."""

from __future__ import annotations

import anyio

from ..._generated.remote_engine import (
    AlterTableOptionsRequest,
    AlterTableOptionsResponse,
    AlterTableSchemaRequest,
    AlterTableSchemaResponse,
)
from ...errors import InvalidArgument
from ..engine import TableEngine
from ..headers import OK_HEADER, error_header
from ..requests import table_name
from ..schema import TableSchema


async def alter_table_schema(
    engine: TableEngine, request: AlterTableSchemaRequest
) -> AlterTableSchemaResponse:
    try:
        schema = _new_schema(request)
        await engine.alter_schema(table_name(request.table), schema, request.pre_schema_version)
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        return AlterTableSchemaResponse(header=error_header(exc, "AlterTableSchema"))
    return AlterTableSchemaResponse(header=OK_HEADER)


def _new_schema(request: AlterTableSchemaRequest) -> TableSchema:
    if request.table_schema is None:
        raise InvalidArgument("AlterTableSchema needs the table's new schema")
    return TableSchema.from_proto(request.table_schema)


async def alter_table_options(
    engine: TableEngine, request: AlterTableOptionsRequest
) -> AlterTableOptionsResponse:
    try:
        await engine.alter_options(table_name(request.table), dict(request.options))
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        return AlterTableOptionsResponse(header=error_header(exc, "AlterTableOptions"))
    return AlterTableOptionsResponse(header=OK_HEADER)


__all__ = ["alter_table_options", "alter_table_schema"]
