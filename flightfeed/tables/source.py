"""A worker's tables as the TableSource its tasks' TableScans read (plan/table_source.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pyarrow as pa

from ..plan.table_source import TableReadSpec
from .engine import TableEngine, TableRead
from .store import TableName


class EngineTableSource:
    """Reads through the worker's TableEngine; an empty catalog or schema in a scan is this
    source's default (ExecContext.default_catalog and default_schema, for a pushed-down plan)."""

    def __init__(self, engine: TableEngine, *, catalog: str = "", schema: str = "") -> None:
        self.engine = engine
        self.catalog = catalog
        self.schema = schema

    def _read(self, spec: TableReadSpec) -> TableRead:
        name = TableName.of(spec.table, spec.catalog or self.catalog, spec.schema or self.schema)
        return TableRead(
            name,
            columns=spec.columns or None,
            predicates=spec.predicates,
            time_range=spec.time_range,
            parallelism=spec.parallelism,
        ).checked()

    def table_schema(self, spec: TableReadSpec) -> pa.Schema:
        return self.engine.read_schema(self._read(spec))

    def read_table(self, spec: TableReadSpec) -> AsyncIterator[pa.RecordBatch]:
        return self.engine.read(self._read(spec))


__all__ = ["EngineTableSource"]
