"""GetTableInfo: a table's identity, HoraeDB schema (column ids, version), engine, options
and partition info."""

from __future__ import annotations

from ..._generated.cluster import PartitionInfo
from ..._generated.remote_engine import GetTableInfoRequest, GetTableInfoResponse, TableInfo
from ..engine import TableEngine
from ..headers import OK_HEADER, error_header
from ..requests import table_name
from ..store import ENGINE, TableEntry


def table_info(entry: TableEntry) -> TableInfo:
    partition = PartitionInfo.parse(entry.partition_info) if entry.partition_info else None
    return TableInfo(
        catalog_name=entry.name.catalog,
        schema_name=entry.name.schema,
        schema_id=0,
        table_name=entry.name.table,
        table_id=entry.id,
        table_schema=entry.schema.to_proto(),
        engine=ENGINE,
        options=entry.options.as_strings(),
        partition_info=partition,
    )


def get_table_info(engine: TableEngine, request: GetTableInfoRequest) -> GetTableInfoResponse:
    try:
        entry = engine.entry(table_name(request.table))
    except Exception as exc:
        return GetTableInfoResponse(header=error_header(exc, "GetTableInfo"))
    return GetTableInfoResponse(header=OK_HEADER, table_info=table_info(entry))


__all__ = ["get_table_info", "table_info"]
