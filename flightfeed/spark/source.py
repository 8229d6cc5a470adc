"""The `flightfeed` Spark data source: a table of a flightfeed coordinator as a DataFrame.

    spark.read.format("flightfeed")
        .option("uri", "grpc://coordinator:8815")
        .option("table", "scan")
        .option("args", '[2, "3,1", "2", "4", "1,1"]')
        .load()

Options: `uri` (the coordinator), `table`, `args` (a JSON list of the table's arguments),
`columns` (comma-separated, to read fewer), `timeout` (seconds per call), and `header.NAME`
(a header sent with the query, which the workers' session builders see).

Spark calls `schema()`, `pushFilters()` and `partitions()` in separate Python processes and
pickles the reader in between, so the reader holds only plain data; clients are opened in the
call that uses them. `partitions()` starts the query on the coordinator and gets one endpoint
per output partition; each Spark task reads its endpoint straight from its worker. A retried
task reads the same rows again (the worker replays its work units).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from ..coordinator.table_query import table_command
from ..errors import InvalidArgument
from ..plan import decode_expr, encode_expr
from . import client
from .filters import split_filters

SOURCE_NAME = "flightfeed"
HEADER_PREFIX = "header."


@dataclass(frozen=True)
class TableOptions:
    """A table query as the data source's options describe it."""

    uri: str
    table: str
    arguments: tuple[Any, ...] = ()
    columns: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = client.DEFAULT_TIMEOUT

    @classmethod
    def of(cls, options: Any) -> TableOptions:
        """From Spark's (case-insensitive) options; InvalidArgument naming what is wrong."""
        found = {str(k).lower(): str(v) for k, v in dict(options).items()}
        uri = found.get("uri") or found.get("location")
        if not uri:
            raise InvalidArgument(
                "the flightfeed data source needs option 'uri' (the coordinator, grpc://host:port)"
            )
        table = found.get("table")
        if not table:
            raise InvalidArgument("the flightfeed data source needs option 'table'")
        try:
            arguments = json.loads(found.get("args", "[]"))
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"option 'args' must be a JSON list: {exc}") from None
        if not isinstance(arguments, list):
            raise InvalidArgument(f"option 'args' must be a JSON list, got {arguments!r}")
        columns = tuple(c.strip() for c in found.get("columns", "").split(",") if c.strip())
        headers = {
            k[len(HEADER_PREFIX) :]: v for k, v in found.items() if k.startswith(HEADER_PREFIX)
        }
        try:
            timeout = float(found.get("timeout", client.DEFAULT_TIMEOUT))
        except ValueError:
            raise InvalidArgument(
                f"option 'timeout' must be seconds, got {found['timeout']!r}"
            ) from None
        return cls(uri, table, tuple(arguments), columns, headers, timeout)

    def command(self, filters: Sequence[bytes] = ()) -> bytes:
        pushed = [decode_expr(f) for f in filters]
        return table_command(self.table, self.arguments, columns=self.columns, filters=pushed)


class FlightfeedDataSource(DataSource):
    """`spark.read.format("flightfeed")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        table = TableOptions.of(self.options)
        arrow = client.get_schema(table.uri, table.command(), table.headers, table.timeout)
        spark_schema: StructType = from_arrow_schema(arrow)
        return spark_schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return FlightfeedReader(TableOptions.of(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream import FlightfeedStreamReader

        return FlightfeedStreamReader(TableOptions.of(self.options), schema, self.options)


class FlightfeedReader(DataSourceReader):
    """Pushes filters into the query, starts it, and reads one endpoint per Spark partition."""

    def __init__(self, table: TableOptions, schema: StructType) -> None:
        self.table = table
        self.schema = schema
        self.filters: list[bytes] = []  # pushed, as Expr protos: plain data for pickling

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        pushed, kept = split_filters(list(filters), arrow_schema(self.schema))
        self.filters = [encode_expr(expr) for expr in pushed]
        yield from kept

    def partitions(self) -> Sequence[InputPartition]:
        table = self.table
        _, endpoints = client.get_endpoints(
            table.uri, table.command(self.filters), table.headers, table.timeout
        )
        return [InputPartition(endpoint) for endpoint in endpoints]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.table, self.schema)


def read_partition(
    partition: InputPartition, table: TableOptions, schema: StructType
) -> Iterator[pa.RecordBatch]:
    """The batches of a partition's endpoint, exactly as Spark declared the columns."""
    endpoint: client.Endpoint = partition.value
    target = arrow_schema(schema)
    for batch in client.read_endpoint(endpoint, table.headers, table.timeout):
        yield conform(batch, target)


def arrow_schema(schema: StructType) -> pa.Schema:
    arrow: pa.Schema = to_arrow_schema(schema)
    return arrow


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` exactly as Spark declared the columns (types and nullability); a clear error
    when the table no longer matches what Spark was told."""
    if batch.schema.names != target.names:
        raise InvalidArgument(
            f"schema mismatch: the table's columns are now {batch.schema.names}, Spark expects"
            f" {target.names} (did the table change since the DataFrame was created?)"
        )
    for column, declared in zip(batch.columns, target, strict=True):
        if not declared.nullable and column.null_count:  # pyarrow would not check: Spark would
            raise InvalidArgument(
                f"schema mismatch: column {declared.name!r} holds {column.null_count} null(s), but"
                " Spark was told it has none (did the table change since the DataFrame was"
                " created?)"
            )
    if batch.schema.equals(target):
        return batch
    try:
        return pa.RecordBatch.from_arrays(
            [column.cast(f.type) for column, f in zip(batch.columns, target, strict=True)],
            schema=target,
        )
    except (pa.ArrowException, ValueError) as exc:
        raise InvalidArgument(
            f"schema mismatch: the table's schema is now {batch.schema}, Spark expects {target}:"
            f" {exc}"
        ) from None
